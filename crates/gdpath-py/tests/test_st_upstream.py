"""safetensors' own Python test suite (bindings/python/tests of the safetensors 0.8.0 sdist,
fetched by scripts/fetch-safetensors-tests.sh, never copied here) run twice per file: with the
real ``safetensors`` and with its imports bound to ``gdpath.safetensors``. Every test that
passes with safetensors must pass with gdpath. Files that import PyTorch skip aloud without it
(the GPU suite has it). The tests are found at ``$GDPATH_SAFETENSORS_TESTS``, else
``.carry/safetensors-sdist/tests`` in the repository, else fetched there (needs PyPI)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# The files of the suite for the frameworks gdpath loads (numpy, PyTorch); the TensorFlow,
# Flax, MLX and Paddle ones test loaders gdpath does not have.
FILES = {
    "test_handle.py": False, "test_threadable.py": False, "test_simple.py": True,
    "test_pt_comparison.py": True, "test_pt_model.py": True, "test_pread_backend.py": True,
    "test_multithreaded.py": True,
}

# Binds `safetensors`, `safetensors.numpy` and `safetensors.torch` to gdpath's before the
# suite imports them (a pytest plugin loaded with -p).
ALIAS = '''
import sys
import gdpath.safetensors as g
import gdpath.safetensors.numpy as gn
sys.modules["safetensors"] = g
sys.modules["safetensors.numpy"] = gn
try:
    import gdpath.safetensors.torch as gt
    sys.modules["safetensors.torch"] = gt
except ImportError:
    pass
'''


def suite() -> Path:
    given = os.environ.get("GDPATH_SAFETENSORS_TESTS")
    if given:
        return Path(given)
    here = REPO / ".carry/safetensors-sdist/tests"
    if not (here / "test_simple.py").is_file():
        r = subprocess.run([str(REPO / "scripts/fetch-safetensors-tests.sh")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"safetensors' test suite is not here and could not be fetched: {r.stderr.strip()[-300:]}")
    return here


def outcomes(tests: Path, name: str, tmp: Path, alias: bool) -> dict:
    """Test id → ``passed`` / ``failed`` / ``skipped`` of one file, run in a copy of the suite
    (its tests write to ``./tests/data`` relative to the working directory)."""
    # Not named "gdpath": the child runs with this directory first on sys.path, where a folder
    # named like the package would shadow the real one.
    work = tmp / ("aliased" if alias else "real")
    shutil.copytree(tests, work / "tests")
    (work / "_gdpath_alias.py").write_text(ALIAS)
    xml = work / "out.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
           f"tests/{name}"]
    if alias:
        cmd[3:3] = ["-p", "_gdpath_alias"]
    env = dict(os.environ, PYTHONPATH=child_pythonpath(work))
    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert xml.is_file(), f"pytest did not run {name}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        tags = {c.tag for c in case}
        out[tid] = ("failed" if tags & {"failure", "error"} else
                    "skipped" if "skipped" in tags else "passed")
    if alias:
        out["_log"] = r.stdout[-6000:]
    return out


def child_pythonpath(work: Path) -> str:
    """``work`` (the alias plugin) first, then every directory this process imports ``gdpath``
    from and the caller's ``PYTHONPATH``, kept: gdpath may be importable only through
    ``PYTHONPATH`` (``pip install --target DIR`` + ``PYTHONPATH=DIR``, as the GPU machine runs the
    wheel), which the child must see too."""
    import gdpath

    parts = [str(work)]
    # The directory above the package directory (a namespace or a regular package).
    parts += [str(Path(p).parent) for p in gdpath.__path__]
    parts += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(parts))


@pytest.mark.parametrize("name", sorted(FILES))
def test_upstream_suite_passes_with_gdpath(name, tmp_path):
    if FILES[name] and importlib.util.find_spec("torch") is None:
        pytest.skip(f"{name} imports PyTorch, which is not installed here (the GPU suite runs it)")
    tests = suite()
    real = outcomes(tests, name, tmp_path, alias=False)
    ours = outcomes(tests, name, tmp_path, alias=True)
    log = ours.pop("_log")
    passed = sorted(t for t, o in real.items() if o == "passed")
    assert passed, f"no test of {name} passes with safetensors itself: nothing compared"
    lost = [t for t in passed if ours.get(t) != "passed"]
    print(f"{name}: {len(passed)} pass with safetensors; with gdpath "
          f"{sum(o == 'passed' for o in ours.values())} pass, lost {lost}")
    assert not lost, f"pass with safetensors, not with gdpath: {lost}\n{log}"
