"""fieldhmc.forward_signature: a forward function's keywords, read from its source."""

from __future__ import annotations

import subprocess
import sys

from fieldhmc.forward_signature import accepted_keywords, find_module_file


def test_keywords_after_delta_from_the_source(tmp_path):
    path = tmp_path / "fwd.py"
    path.write_text(
        "def plain(delta, b, *, c=1):\n    return delta\n"
        "def posonly(delta, /, b):\n    return delta\n"
        "def open_ended(delta, **kw):\n    return delta\n"
        "def rebound(delta, a):\n    return delta\nrebound = plain\n"
        "@staticmethod\ndef decorated(delta, a):\n    return delta\n"
    )
    assert accepted_keywords(f"{path}:plain") == ("plain(delta, b, c)", {"b", "c"})
    assert accepted_keywords(f"{path}:posonly") == ("posonly(delta, b)", {"b"})
    for name in ("open_ended", "rebound", "decorated", "missing"):
        assert accepted_keywords(f"{path}:{name}") is None, name
    assert accepted_keywords(f"{tmp_path / 'absent.py'}:plain") is None


def test_module_found_without_importing_it(tmp_path):
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (pkg / "fwd.py").write_text("def f(delta, g):\n    return delta\n")
    code = (
        "import sys; from fieldhmc import forward_signature as fs; "
        f"sys.path.insert(0, {str(tmp_path)!r}); "
        "print(fs.find_module_file('userpkg.fwd').name, "
        "sorted(fs.accepted_keywords('userpkg.fwd:f')[1]), 'tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["fwd.py", "['g']", "False"]
    assert find_module_file("no_such_module_here") is None
