"""A clean console: TensorFlow's C++ chatter and known third-party warnings are dropped
by the CLI (not by the library), and ``-v`` shows them."""

import os
import subprocess
import sys
import textwrap

import pytest

NATIVE_LINES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796291208.056847    6012 port.cc:153] oneDNN custom operations are on.",
    "I0000 00:00:1796291208.057795    6012 cudart_stub.cc:31] Could not find cuda drivers",
    "2025-09-17 14:44:05.157831: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] Could",
]
KEPT_LINES = [
    "E0000 00:00:1796291214.298026    6012 some_op.cc:52] a real error stays visible",
    "INFO fieldhmc.cli: our own line",
]


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))  # ArviZ warns once a day per cache
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )


FAKE = """
    import os, sys, warnings
    from fieldhmc import cli
    with cli._clean_console({verbose}):
        for line in {lines!r}:
            os.write(2, (line + "\\n").encode())  # as C++ code writes: straight to fd 2
        print("python stderr line", file=sys.stderr)
        warnings.warn("\\nArviZ is undergoing a major refactor to improve ...", FutureWarning)
        os.write(2, b"partial line without newline")
"""


def test_native_lines_and_known_warnings_are_dropped(tmp_path):
    err = _run(FAKE.format(verbose=0, lines=NATIVE_LINES + KEPT_LINES), tmp_path).stderr
    for line in NATIVE_LINES:
        assert line not in err
    for line in KEPT_LINES + ["python stderr line", "partial line without newline"]:
        assert line in err
    assert "ArviZ" not in err


def test_verbose_shows_everything(tmp_path):
    err = _run(FAKE.format(verbose=1, lines=NATIVE_LINES), tmp_path).stderr
    for line in NATIVE_LINES:
        assert line in err
    assert "ArviZ is undergoing a major refactor" in err


def test_a_fatal_line_before_an_abort_is_shown(tmp_path):
    """TensorFlow's C++ CHECK failures write one "F..." line and abort(): the filter
    must forward it although the process dies at once (a thread of the dying process
    lost it in 7 of 8 tries; three tries in a row would all pass by luck < 1%)."""
    fatal = "F0000 00:00:1796291214.298026    6012 some_op.cc:52] Check failed: n > 0"
    code = f"""
        import os
        from fieldhmc import cli
        with cli._clean_console(0):
            os.write(2, {(fatal + chr(10)).encode()!r})
            os.abort()
    """
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    for _ in range(3):
        res = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert res.returncode != 0
        assert fatal in res.stderr


@pytest.mark.slow
def test_real_tensorflow_import_prints_nothing(tmp_path):
    """TensorFlow 2.21 on a CPU machine prints oneDNN/CUDA lines and a cuInit error."""
    code = """
        from fieldhmc import cli
        with cli._clean_console(0):
            import tensorflow as tf
            import arviz
            tf.function(lambda x: x + 1, jit_compile=True)(tf.constant(1.0))
    """
    assert _run(code, tmp_path).stderr == ""
    loud = _run(code.replace("_clean_console(0)", "_clean_console(1)"), tmp_path).stderr
    assert "cuda" in loud.lower() or "oneDNN" in loud  # the control: TF does print here


@pytest.mark.slow
def test_progress_bar_only_on_a_terminal(monkeypatch):
    from fieldhmc.samplers import driver

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert driver._progress_bar(True, 10, 0) is None
