"""Command-line interface: parse arguments, load the config, call the library.

The CLI is deliberately thin. For ``simulate`` and ``run`` it validates the
configuration and its input files first (no TensorFlow import, nothing written),
estimates the peak memory, checks and locks the output directory, and only then
imports :mod:`fieldhmc.workflow`, which does the work. ``resume``, ``diagnose`` and
``plot`` lock the run directory too (and ``resume`` checks its checkpoint) before
TensorFlow starts. User errors (invalid config or data file, a run directory that is
locked, not writable or not resumable, refused overwrite, a ``ValueError``,
``OSError`` or ``FileNotFoundError`` from the library) are printed as one line on
stderr and give exit status 2; anything else is an internal error: one line and exit
status 1. ``--debug`` (or ``-v``) adds the traceback.

A clean console: by default only fieldhmc's own lines reach the terminal. The CLI (never
the library) sets ``TF_CPP_MIN_LOG_LEVEL=3`` before TensorFlow is imported, drops the
INFO/WARNING lines that TensorFlow's C++ code writes to file descriptor 2 before its
logging is initialised (which no environment variable silences: tensorflow#100442,
abseil-cpp#1957), and ignores known third-party Python warnings. ``-v`` shows all of it.

Examples
--------
>>> from fieldhmc.cli import main
>>> main(["validate", "configs/quickstart.yaml"])  # doctest: +SKIP
ok: configs/quickstart.yaml: 32x32x32 grid, ...
0
"""

import argparse
import contextlib
import logging
import os
import re
import subprocess
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fieldhmc import config as config_module
from fieldhmc import io
from fieldhmc.config import Config, ConfigError

__all__ = ["build_parser", "main"]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2

# OSError covers FileNotFoundError, FileExistsError, PermissionError, a full disk.
_LIBRARY_ERRORS = (ValueError, OSError, MemoryError)

_EXAMPLES = {
    "fieldhmc": """\
examples:
  fieldhmc validate configs/quickstart.yaml
  fieldhmc run configs/quickstart.yaml --out runs/quickstart --overwrite
  fieldhmc run configs/gaussian_64.yaml --set sampler.num_results=1000 --set sampler.seed=1
  fieldhmc resume runs/quickstart --num-results 500
  fieldhmc diagnose runs/quickstart
  fieldhmc plot runs/quickstart
  fieldhmc config-schema
""",
    "simulate": """\
examples:
  fieldhmc simulate configs/quickstart.yaml --out data/quickstart
  fieldhmc simulate configs/masked_64.yaml --out data/masked --set data.seed=7 --overwrite

Refused, like run, when the run's estimated peak memory exceeds what is available.
""",
    "run": """\
examples:
  fieldhmc run configs/quickstart.yaml
  fieldhmc run configs/quickstart.yaml --out runs/qs_seed1 --set sampler.seed=1
  fieldhmc run configs/masked_64.yaml --set sampler.kind=fieldnuts --set sampler.max_tree_depth=8
  fieldhmc run configs/gaussian_64.yaml --set grid.shape=[32,32,32] --overwrite
""",
    "resume": """\
examples:
  fieldhmc resume runs/quickstart                    # finish an interrupted run
  fieldhmc resume runs/quickstart --num-results 1000 # extend a finished run
""",
    "diagnose": """\
examples:
  fieldhmc diagnose runs/quickstart
""",
    "plot": """\
examples:
  fieldhmc plot runs/quickstart
""",
    "sbc": """\
examples:
  fieldhmc sbc configs/hierarchical_64.yaml --realisations 100 --out sbc/h64 \\
      --set grid.shape=[16,16,16] --set sampler.num_results=200
  fieldhmc sbc configs/hierarchical_64.yaml --realisations 200 --out sbc/h64 \\
      --scheduler tcp://head-node:8786               # an existing Dask cluster
  fieldhmc sbc configs/quickstart.yaml --realisations 50 --out sbc/off \\
      --simulate-set model.likelihood.sigma=2.6      # a deliberately wrong posterior
""",
    "sweep": """\
examples:
  fieldhmc sweep configs/quickstart.yaml --set sampler.kind=hmc,fieldnuts --seeds 4 --out sw/qs
  fieldhmc sweep configs/masked_64.yaml --set sampler.preconditioner=prior,diagonal \\
      --set sampler.num_results=500 --seeds 3 --out sw/masked --workers 2
""",
    "config-schema": """\
examples:
  fieldhmc config-schema
  fieldhmc config-schema --json > schema.json
""",
    "validate": """\
examples:
  fieldhmc validate configs/quickstart.yaml
  fieldhmc validate configs/masked_64.yaml --set model.likelihood.sigma=0.5
""",
}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer (got {value})")
    return value


def _verbosity_parser(*, is_top_level: bool) -> argparse.ArgumentParser:
    """``-v/-q`` options, accepted before or after the subcommand."""
    parser = argparse.ArgumentParser(add_help=False)
    default = 0 if is_top_level else argparse.SUPPRESS
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default,
        help="more logging (-vv: debug); show tracebacks on errors",
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=False if is_top_level else argparse.SUPPRESS,
        help="only warnings and errors",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=False if is_top_level else argparse.SUPPRESS,
        help="show the traceback of any error",
    )
    return parser


def _add_memory_check(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-memory-check",
        dest="memory_check",
        action="store_false",
        help="do not refuse a config whose estimated peak memory exceeds what is available",
    )


def _check_memory(args: argparse.Namespace, config: Config) -> str:
    """Refuse (exit 2) a config that cannot fit in memory; return the estimate."""
    from fieldhmc import memory

    if not args.memory_check:
        return memory.estimate_peak_bytes(config).describe()
    try:
        return memory.check_memory(config).describe()
    except MemoryError as exc:
        raise _UsageError(str(exc)) from None


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override a config key, e.g. --set sampler.num_results=500 "
        "(value parsed as YAML; repeatable)",
    )


def _add_dask_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers",
        type=_positive_int,
        metavar="W",
        help="worker processes of the local Dask cluster (default: one per core)",
    )
    parser.add_argument(
        "--threads-per-worker",
        type=_positive_int,
        metavar="T",
        help="threads per local worker (default: cores / workers)",
    )
    parser.add_argument(
        "--scheduler",
        metavar="ADDR",
        help="use a running Dask scheduler (tcp://host:8786) instead of a local cluster",
    )
    parser.add_argument(
        "--plots",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write plots (default: sbc yes, sweep runs no)",
    )


def build_parser() -> argparse.ArgumentParser:
    """Build the ``fieldhmc`` argument parser.

    Returns
    -------
    argparse.ArgumentParser
        Parser with one subparser per command; each sets ``args.handler``.
    """
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="fieldhmc",
        description="Hamiltonian Monte Carlo over the Fourier modes of a real 3D field.",
        epilog=_EXAMPLES["fieldhmc"],
        formatter_class=formatter,
        parents=[_verbosity_parser(is_top_level=True)],
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    verbosity = _verbosity_parser(is_top_level=False)

    def add(name: str, handler: Callable[[argparse.Namespace], int], help_text: str) -> Any:
        sub = commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=_EXAMPLES[name],
            formatter_class=formatter,
            parents=[verbosity],
        )
        sub.set_defaults(handler=handler)
        return sub

    sub = add("simulate", _cmd_simulate, "Simulate a field and data from a config.")
    sub.add_argument("config", type=Path, metavar="CONFIG", help="YAML config file")
    _add_memory_check(sub)
    sub.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    _add_overrides(sub)
    sub.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty DIR, replacing only fieldhmc's own files",
    )

    sub = add("run", _cmd_run, "Run inference from a config (simulating data if asked).")
    sub.add_argument("config", type=Path, metavar="CONFIG", help="YAML config file")
    _add_memory_check(sub)
    sub.add_argument(
        "--out", type=Path, metavar="DIR", help="run directory (default: outputs.directory)"
    )
    _add_overrides(sub)
    sub.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty DIR, replacing only fieldhmc's own files",
    )

    sub = add("resume", _cmd_resume, "Resume an interrupted run or extend a finished one.")
    sub.add_argument("run_dir", type=Path, metavar="DIR", help="run directory")
    sub.add_argument(
        "--num-results",
        type=_positive_int,
        metavar="N",
        help="total results per chain to reach (default: the configured num_results)",
    )

    sub = add("diagnose", _cmd_diagnose, "Compute convergence diagnostics of a run.")
    sub.add_argument("run_dir", type=Path, metavar="DIR", help="run directory")

    sub = add("plot", _cmd_plot, "Make the standard plots of a run.")
    sub.add_argument("run_dir", type=Path, metavar="DIR", help="run directory")

    sub = add(
        "sbc",
        _cmd_sbc,
        "Simulation-based calibration: N simulate-and-fit realisations on Dask, rank tests.",
    )
    sub.add_argument("config", type=Path, metavar="CONFIG", help="YAML config file")
    sub.add_argument(
        "--realisations", type=_positive_int, required=True, metavar="N", help="realisations"
    )
    sub.add_argument("--out", type=Path, required=True, metavar="DIR", help="sweep directory")
    _add_overrides(sub)
    sub.add_argument(
        "--simulate-set",
        dest="simulate_overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override a key for the simulation only (a miscalibration check; repeatable)",
    )
    _add_dask_options(sub)

    sub = add("sweep", _cmd_sweep, "Run a grid of overrides x seeds on Dask, gather summaries.")
    sub.add_argument("config", type=Path, metavar="CONFIG", help="YAML config file")
    sub.add_argument(
        "--set",
        dest="grid",
        metavar="KEY=V1,V2,...",
        action="append",
        default=[],
        help="a grid axis: one run per value (values parsed as YAML; repeatable)",
    )
    sub.add_argument(
        "--seeds", type=_positive_int, default=1, metavar="K", help="sampler seeds per point"
    )
    sub.add_argument("--out", type=Path, required=True, metavar="DIR", help="sweep directory")
    _add_dask_options(sub)

    sub = add("config-schema", _cmd_schema, "Print every config key with type and default.")
    sub.add_argument("--json", action="store_true", help="print the JSON schema instead")

    sub = add("validate", _cmd_validate, "Check a config file without running anything.")
    sub.add_argument("config", type=Path, metavar="CONFIG", help="YAML config file")
    _add_memory_check(sub)
    _add_overrides(sub)
    return parser


# TensorFlow/absl C++ log lines below ERROR: "I0000 00:00:1796.2 6012 port.cc:153] ..." and
# the older "2025-09-17 14:44:05.157831: I external/.../cudart_stub.cc:32] ..." form.
_NATIVE_LOG_LINE = re.compile(
    rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    rb"STDERR|[IW]\d{4} [\d:.]+\s+\d+ \S+:\d+\] |\d{4}-\d\d-\d\d [\d:.]+: [IW] \S+:\d+\] )"
)
# Third-party Python warnings that say nothing about the user's run.
_THIRD_PARTY_WARNINGS = ((FutureWarning, r"\s*ArviZ is undergoing a major refactor"),)


# The filter runs in its own small process (no imports beyond os/re/signal), so a line
# TensorFlow writes just before it aborts (a C++ "F... Check failed") is still read and
# shown: a thread of the dying process would die with it before forwarding the line.
_FILTER_PROGRAM = """
import os, re, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the CLI's to handle
drop = re.compile(sys.argv[1].encode("latin-1"))
pending = b""
while chunk := os.read(0, 65536):
    *lines, pending = (pending + chunk).split(b"\\n")
    kept = [line + b"\\n" for line in lines if not drop.match(line)]
    if kept:
        os.write(2, b"".join(kept))
if pending and not drop.match(pending):
    os.write(2, pending)
"""


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Route file descriptor 2 through a filter process dropping TensorFlow's C++ chatter.

    Python's own ``sys.stderr`` (logging, the progress bar) keeps writing to the original
    stream directly, so it stays a terminal when it was one.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    filter_proc = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            _FILTER_PROGRAM,
            _NATIVE_LOG_LINE.pattern.decode("latin-1"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=saved,
    )
    os.dup2(filter_proc.stdin.fileno(), 2)
    filter_proc.stdin.close()
    swapped = sys.stderr is sys.__stderr__ and sys.__stderr__ is not None
    if swapped:
        sys.stderr = open(  # noqa: SIM115 -- closed below
            os.dup(saved), "w", buffering=1, encoding=sys.__stderr__.encoding, errors="replace"
        )
    try:
        yield
    finally:
        if swapped:
            sys.stderr.flush()
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
                    handler.setStream(sys.__stderr__)
            sys.stderr.close()
            sys.stderr = sys.__stderr__
        os.dup2(saved, 2)  # closes the pipe's last write end: the filter sees EOF
        try:
            filter_proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # a worker process still holds the pipe
            filter_proc.kill()
        os.close(saved)


def tf_environment() -> None:
    """Set what TensorFlow reads when it starts (call before anything imports it).

    The x86 pip wheels of TensorFlow are oneDNN builds: every buffer above 256 KiB comes
    from a BFC pool ("mklcpu") that grows by doubling regions and never gives freed
    memory back: freed fields stayed resident through diagnose and plot (measured in
    ``benchmarks/README.md``, ``memory.py``: "The system allocator").
    ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1`` (tensorflow/tensorflow#54169) hands them to
    malloc, which returns them (the pool itself is still created: #92483). A value the
    user set is kept (``0`` restores the pool).
    """
    os.environ.setdefault("TF_ONEDNN_USE_SYSTEM_ALLOCATOR", "1")


@contextlib.contextmanager
def _clean_console(verbose: int) -> Iterator[None]:
    """Silence TensorFlow's C++ logging and known third-party warnings unless ``-v``."""
    if verbose > 0:
        yield
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before anything imports TensorFlow
    with warnings.catch_warnings(), _quiet_native_stderr():
        for category, message in _THIRD_PARTY_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield


def _configure_logging(verbose: int, quiet: bool) -> None:
    if quiet:
        level = logging.WARNING
    elif verbose >= 1:
        level = logging.DEBUG
    else:
        level = logging.INFO
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("fieldhmc").setLevel(level)
    if verbose >= 2:
        logging.getLogger().setLevel(logging.DEBUG)


class _UsageError(Exception):
    """A one-line user error detected by the CLI itself (exit status 2)."""


def _check_output_dir(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise _UsageError(f"output path exists and is not a directory: {out_dir}")
    if out_dir.is_dir():
        io.check_not_locked(out_dir)  # a live run is named, even with --overwrite
        if not overwrite and not io.is_empty_run_directory(out_dir):
            raise _UsageError(
                f"output directory is not empty: {out_dir} (pass --overwrite to replace "
                "fieldhmc's files in it)"
            )


@contextlib.contextmanager
def _locked_output_dir(out_dir: Path, overwrite: bool) -> Iterator[None]:
    """Check ``out_dir`` (writing nothing), then lock it and check again under the lock.

    The first check refuses early and touches nothing; the lock is what keeps two
    processes apart (the second check sees what a concurrent winner has written).
    """
    _check_output_dir(out_dir, overwrite)
    with io.lock_run_directory(out_dir, create=True):
        _check_output_dir(out_dir, overwrite)
        yield


def _check_run_dir(run_dir: Path) -> Path:
    run_dir = Path(os.path.abspath(run_dir))
    if not run_dir.is_dir():
        raise _UsageError(f"run directory not found: {run_dir}")
    return run_dir


def _load(args: argparse.Namespace) -> Config:
    config = config_module.load_config(args.config, args.overrides)
    logger.debug("loaded %s: %s", args.config, config.summary())
    return config


def _workflow() -> Any:
    from fieldhmc import workflow  # imports TensorFlow: only after validation

    return workflow


def _cmd_simulate(args: argparse.Namespace) -> int:
    config = _load(args)
    out_dir = Path(os.path.abspath(args.out))
    estimate = _check_memory(args, config)  # the run's estimate: refused where run would be
    config = config.with_output_directory(out_dir)
    with _locked_output_dir(out_dir, args.overwrite):
        logger.debug("simulate: %s; peak memory of a run %s", config.summary(), estimate)
        _workflow().simulate(config, out_dir, overwrite=args.overwrite)
    logger.info("simulated data written to %s", out_dir)
    return EXIT_OK


def _make_mesh(config: Config) -> None:
    """Create the mesh's (virtual CPU) devices before TensorFlow initialises any."""
    if config.distribution is not None:
        _workflow().make_mesh(config)


def _cmd_run(args: argparse.Namespace) -> int:
    config = _load(args)
    _make_mesh(config)
    if args.out is not None:
        config = config.with_output_directory(args.out)
    out_dir = config.outputs.directory
    estimate = _check_memory(args, config)  # before anything is written
    with _locked_output_dir(out_dir, args.overwrite):
        logger.info("run: %s; peak memory %s", config.summary(), estimate)
        _workflow().run(config, out_dir, overwrite=args.overwrite)
    logger.info("run written to %s", out_dir)
    return EXIT_OK


def _cmd_resume(args: argparse.Namespace) -> int:
    run_dir = _check_run_dir(args.run_dir)
    io.check_not_locked(run_dir)  # a live run first: its checkpoint may not exist yet
    io.check_resumable(run_dir)  # before TensorFlow starts, writing nothing
    with io.lock_run_directory(run_dir):
        _workflow().resume(run_dir, num_results=args.num_results)  # checks again, locked
    logger.info("run in %s resumed", run_dir)
    return EXIT_OK


def _cmd_diagnose(args: argparse.Namespace) -> int:
    run_dir = _check_run_dir(args.run_dir)
    with io.lock_run_directory(run_dir):
        _workflow().diagnose(run_dir)
    return EXIT_OK


def _cmd_plot(args: argparse.Namespace) -> int:
    run_dir = _check_run_dir(args.run_dir)
    with io.lock_run_directory(run_dir):
        _workflow().plot(run_dir)
    return EXIT_OK


def _open_client(args: argparse.Namespace) -> Any:
    from fieldhmc import distributed

    return distributed.open_client(args.workers, args.threads_per_worker, args.scheduler)


def _report_failures(failures: Sequence[Any], what: str) -> int:
    if not failures:
        return EXIT_OK
    print(f"{len(failures)} {what} failed:", file=sys.stderr)
    for failure in failures:
        print(f"  {failure.label}: {failure.error}", file=sys.stderr)
    return 1


def _cmd_sbc(args: argparse.Namespace) -> int:
    config = _load(args)
    simulate = None
    if args.simulate_overrides:
        simulate = config_module.load_config(
            args.config, [*args.overrides, *args.simulate_overrides]
        )
    out_dir = Path(os.path.abspath(args.out))
    from fieldhmc import sweep

    sweep.check_sbc_config(config, simulate)  # before any cluster starts
    with _open_client(args) as client:
        result = sweep.run_sbc(
            config,
            out_dir,
            args.realisations,
            client,
            simulate_config=simulate,
            progress=logger.getEffectiveLevel() <= logging.INFO,
            plots=args.plots is not False,
        )
    if result.dataset is not None:
        print((out_dir / "sbc_report.txt").read_text(), end="")
    logger.info("sbc written to %s", out_dir)
    return _report_failures(result.failures, "realisation(s)")


def _cmd_sweep(args: argparse.Namespace) -> int:
    from fieldhmc import sweep

    points = sweep.sweep_points(args.config, args.grid, args.seeds)
    out_dir = Path(os.path.abspath(args.out))
    with _open_client(args) as client:
        result = sweep.run_sweep(
            points,
            out_dir,
            client,
            progress=logger.getEffectiveLevel() <= logging.INFO,
            plots=bool(args.plots),
        )
    logger.info("sweep of %d runs written to %s (sweep.csv, sweep.nc)", len(points), out_dir)
    return _report_failures(result.failures, "run(s)")


def _cmd_schema(args: argparse.Namespace) -> int:
    if args.json:
        import json

        print(json.dumps(Config.model_json_schema(), indent=2))
    else:
        print(config_module.schema_text(), end="")
    return EXIT_OK


def _cmd_validate(args: argparse.Namespace) -> int:
    config = _load(args)
    estimate = _check_memory(args, config)  # first, as run does
    checked = ""
    if config.model.forward is not None and config.model.forward.kind == "python":
        # imports TensorFlow and the user's module and checks it as run would
        checked = f"; forward {_workflow().check_forward(config)} checked"
    print(f"ok: {args.config}: {config.summary()}; peak memory {estimate}{checked}")
    return EXIT_OK


def _report(message: str, *, with_traceback: bool = False) -> int:
    if with_traceback:
        traceback.print_exc(file=sys.stderr)
    print(" ".join(message.split()), file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fieldhmc`` command line.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; ``sys.argv[1:]`` if ``None``.

    Returns
    -------
    int
        Exit status: 0 on success, 2 for usage, configuration, data and run-directory
        errors, 1 for internal errors (a bug: ``--debug`` shows the traceback).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed by argparse
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    tf_environment()
    with _clean_console(args.verbose):
        _configure_logging(args.verbose, args.quiet)
        return _dispatch(args)


def _dispatch(args: argparse.Namespace) -> int:
    debug = args.debug or args.verbose > 0
    try:
        return args.handler(args)
    except ConfigError as exc:  # already one line naming the key
        return _report(str(exc), with_traceback=args.debug)
    except (_UsageError, io.RunDirectoryError) as exc:
        return _report(f"error: {exc}", with_traceback=args.debug)
    except _LIBRARY_ERRORS as exc:
        return _report(f"error: {exc}", with_traceback=debug)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: one line, the traceback on request
        hint = "" if debug else " (run with --debug for the traceback)"
        _report(f"internal error: {type(exc).__name__}: {exc}{hint}", with_traceback=debug)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
