"""Many independent jobs on Dask (``dask.distributed``): cluster, submission, progress.

The engine for :mod:`fieldhmc.sweep`. By default a ``LocalCluster`` of worker
*processes* -- one TensorFlow per process, ``workers x threads = cores``, each
worker's TensorFlow limited to its share of the cores -- or an existing scheduler by
address, e.g. one that ``dask-jobqueue`` started on SLURM/PBS (see the README).

Jobs are idempotent (each writes its own directory and marks it finished last), so
Dask's own recovery is all that is needed: a task whose worker process dies is
rescheduled on another worker and starts its realisation afresh. Failures (an
exception in the job, or a task whose workers keep dying) are returned with their
one-line error, never dropped.

Needs the optional extra ``distributed`` (``pip install 'fieldhmc[distributed]'``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JobFailure", "JobOutcome", "open_client", "run_jobs", "worker_environment"]

_log = logging.getLogger(__name__)

_EXTRA_HINT = "pip install 'fieldhmc[distributed]'"


def _distributed():
    try:
        import distributed
    except ImportError as exc:
        raise ValueError(
            f"sbc and sweep run on Dask, which is not installed: {_EXTRA_HINT}"
        ) from exc
    return distributed


def worker_environment(threads: int) -> dict[str, str]:
    """Environment for a worker process: TensorFlow and BLAS use ``threads`` threads."""
    return {
        "TF_NUM_INTRAOP_THREADS": str(threads),
        "TF_NUM_INTEROP_THREADS": "1",
        "OMP_NUM_THREADS": str(threads),
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        # freed buffers go back to the system, as in the CLI (cli.tf_environment)
        "TF_ONEDNN_USE_SYSTEM_ALLOCATOR": os.environ.get("TF_ONEDNN_USE_SYSTEM_ALLOCATOR", "1"),
    }


@contextlib.contextmanager
def open_client(
    num_workers: int | None = None,
    threads_per_worker: int | None = None,
    scheduler: str | None = None,
) -> Iterator[Any]:
    """A ``distributed.Client``: to ``scheduler`` if given, else to a new LocalCluster.

    Parameters
    ----------
    num_workers : int, optional
        Worker processes of the local cluster (default: one per core).
    threads_per_worker : int, optional
        Dask threads (concurrent jobs) per worker; default ``max(1, cores //
        num_workers)``. Each worker's TensorFlow gets ``cores // num_workers``
        threads whatever this is.
    scheduler : str, optional
        Address of a running scheduler (``tcp://host:8786``); the local-cluster
        options must then be left out.
    """
    distributed = _distributed()
    # Dask logs every worker and client event at INFO, which would bury the progress
    # bar; keep its warnings (and everything at fieldhmc's -vv, DEBUG).
    dask_logger = logging.getLogger("distributed")
    old_level = dask_logger.level
    if not _log.isEnabledFor(logging.DEBUG):
        dask_logger.setLevel(logging.WARNING)
    try:
        with _client(distributed, num_workers, threads_per_worker, scheduler) as client:
            yield client
    finally:
        dask_logger.setLevel(old_level)


@contextlib.contextmanager
def _client(distributed, num_workers, threads_per_worker, scheduler) -> Iterator[Any]:
    if scheduler is not None:
        if num_workers is not None or threads_per_worker is not None:
            raise ValueError("--workers/--threads-per-worker apply to the local cluster only")
        try:
            client = distributed.Client(scheduler, timeout="30s")
        except OSError as exc:
            raise ValueError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
        try:
            yield client
        finally:
            client.close()
        return
    cores = os.cpu_count() or 1
    workers = num_workers or cores
    threads = threads_per_worker or max(1, cores // workers)
    if workers < 1 or threads < 1:
        raise ValueError(f"need >= 1 worker and thread (got {workers} x {threads})")
    cluster = distributed.LocalCluster(
        n_workers=workers,
        threads_per_worker=threads,
        processes=True,
        dashboard_address=None,
        memory_limit=0,  # TensorFlow's arenas would trip Dask's memory nanny
        env=worker_environment(max(1, cores // workers)),  # TF: the worker's cores
        silence_logs=logging.WARNING,
    )
    try:
        with distributed.Client(cluster) as client:
            yield client
    finally:
        with _quiet_worker_kill():
            cluster.close()


class _WorkerKillAtShutdown(logging.Filter):
    """Demote the nanny's "Worker process still alive after 4.0 seconds, killing".

    At cluster shutdown every result is already written; a worker whose TensorFlow
    takes longer than the nanny's 4 s to exit on a loaded machine is killed, which is
    harmless, so the line is logged at DEBUG instead of alarming the user.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.getMessage().startswith(
            "Worker process still alive after"
        ):
            _log.debug("at shutdown: %s", record.getMessage())
            return False
        return True


@contextlib.contextmanager
def _quiet_worker_kill() -> Iterator[None]:
    nanny_logger = logging.getLogger("distributed.nanny")
    flt = _WorkerKillAtShutdown()
    nanny_logger.addFilter(flt)
    try:
        yield
    finally:
        nanny_logger.removeFilter(flt)


@dataclass(frozen=True)
class JobFailure:
    """One job that did not finish: its label and the last line of its error."""

    label: str
    error: str


@dataclass
class JobOutcome:
    """Results of :func:`run_jobs`, by job label; failures are kept, in order."""

    results: dict[str, Any] = field(default_factory=dict)
    failures: list[JobFailure] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _error_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def run_jobs(
    client: Any,
    job_fn: Callable[[Any], Any],
    jobs: Sequence[Any],
    labels: Sequence[str],
    *,
    progress: bool = True,
    description: str = "jobs",
    skipped: Sequence[str] = (),
) -> JobOutcome:
    """Run ``job_fn(job)`` for every job on the cluster; one progress bar.

    Parameters
    ----------
    client : distributed.Client
    job_fn : callable
        Importable top-level function (workers import it by name).
    jobs : sequence
        Picklable job descriptions.
    labels : sequence of str
        One unique label per job (task keys, progress, failures).
    progress : bool
        Show a ``tqdm`` bar: done / running / failed.
    skipped : sequence of str
        Labels already finished (counted as done in the bar and outcome).

    Returns
    -------
    JobOutcome
    """
    distributed = _distributed()
    outcome = JobOutcome(skipped=list(skipped))
    token = uuid.uuid4().hex[:8]
    keys = [f"{label}-{token}" for label in labels]
    label_of = dict(zip(keys, labels, strict=True))
    futures = client.map(job_fn, list(jobs), key=keys, pure=False, retries=0)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs) + len(skipped), initial=len(skipped), desc=description)
    done = len(skipped)
    failed = 0

    def running() -> int:
        try:
            processing = client.processing()
        except Exception:  # noqa: BLE001 - the bar is cosmetic
            return -1
        keyset = set(keys)
        return sum(len(keyset.intersection(map(str, v))) for v in processing.values())

    try:
        for future in distributed.as_completed(futures):
            label = label_of[future.key]
            if future.status == "finished":
                outcome.results[label] = future.result()
                done += 1
            else:
                try:
                    exc = future.exception()
                except Exception as err:  # noqa: BLE001 - e.g. a cancelled future
                    exc = err
                outcome.failures.append(JobFailure(label, _error_line(exc)))
                failed += 1
                _log.warning("%s failed: %s", label, outcome.failures[-1].error)
            if bar is not None:
                bar.set_postfix(done=done, running=running(), failed=failed)
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        for future in futures:
            future.release()
    return outcome
