"""The switches for programs that cannot be edited, each in a fresh interpreter (a subprocess):
``GDPATH_SAFETENSORS=1`` read at interpreter start by ``gdpath_safetensors.pth`` (shipped at
the top of site-packages by the wheel), and ``python -m gdpath.safetensors.run``. Without the
variable the ``.pth`` imports nothing of gdpath."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy as snp

import gdpath

# Beside the package: site-packages/ from a wheel, crates/gdpath-py/python/ in a checkout.
PTH = Path(gdpath.__file__).resolve().parents[1] / "gdpath_safetensors.pth"

# What the child prints: where safetensors' entry points come from, whether gdpath was
# imported, and whether a file loaded through `safetensors.numpy.load_file` is right.
PROBE = """
import sys, numpy as np, safetensors, safetensors.numpy as n
got = n.load_file(sys.argv[1])
print(safetensors.safe_open.__module__, n.load_file.__module__, "gdpath" in sys.modules,
      bool(np.array_equal(got["a"], np.arange(12, dtype=np.float32).reshape(3, 4))))
"""


def child(code: str, env_value, *args: str) -> list:
    """The words the probe printed in a new interpreter, with GDPATH_SAFETENSORS set to
    ``env_value`` (unset for ``None``). Where the ``.pth`` is not in a site-packages directory
    (an editable install), the child first reads it with ``site.addsitedir``, the function the
    interpreter's start runs on site-packages."""
    env = {k: v for k, v in os.environ.items() if k != "GDPATH_SAFETENSORS"}
    if env_value is not None:
        env["GDPATH_SAFETENSORS"] = env_value
    installed = str(PTH.parent) in {os.path.realpath(p) for p in site.getsitepackages()}
    if not installed:
        code = f"import site; site.addsitedir({str(PTH.parent)!r})\n" + code
    r = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return Words(r.stdout.split(), r.stderr)


class Words(list):
    """The probe's words, with the child's stderr kept so that a failed comparison shows why
    (``install()`` says on stderr when it could not route safetensors)."""

    def __init__(self, words: list, stderr: str):
        super().__init__(words)
        self.stderr = stderr

    def __repr__(self) -> str:
        return f"{list(self)!r} (child's stderr: {self.stderr[-3000:]!r})"


@pytest.fixture
def ckpt(scratch):
    p = scratch / "a.safetensors"
    snp.save_file({"a": np.arange(12, dtype=np.float32).reshape(3, 4)}, str(p))
    return str(p)


def test_pth_is_shipped_beside_the_package():
    assert PTH.is_file(), f"{PTH} missing: the wheel ships it (pyproject [tool.maturin] include)"
    assert "GDPATH_SAFETENSORS" in PTH.read_text()


def test_env_var_routes_safetensors_at_start(ckpt):
    words = child(PROBE, "1", ckpt)
    assert words == ["gdpath.safetensors", "gdpath.safetensors.numpy", "True", "True"], repr(words)


@pytest.mark.parametrize("value", [None, "0", ""])
def test_without_env_var_nothing_of_gdpath_is_imported(ckpt, value):
    words = child(PROBE, value, ckpt)
    assert words[0] != "gdpath.safetensors" and words[1] == "safetensors.numpy", words
    assert words[2:] == ["False", "True"], words


def test_run_routes_a_script(ckpt, scratch):
    script = scratch / "prog.py"
    script.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "GDPATH_SAFETENSORS"}
    r = subprocess.run([sys.executable, "-m", "gdpath.safetensors.run", str(script), ckpt], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["gdpath.safetensors", "gdpath.safetensors.numpy", "True", "True"]


def test_garbage_env_value_says_so_and_imports_nothing(ckpt):
    """A value other than 1, 0 or empty is one clear line on stderr (escaped: the environment is
    untrusted), the program runs on safetensors itself, nothing of gdpath is imported."""
    env = {k: v for k, v in os.environ.items() if k != "GDPATH_SAFETENSORS"}
    env["GDPATH_SAFETENSORS"] = "yes\x1b[31m"
    code = PROBE
    if str(PTH.parent) not in {os.path.realpath(p) for p in site.getsitepackages()}:
        code = f"import site; site.addsitedir({str(PTH.parent)!r})\n" + code
    r = subprocess.run([sys.executable, "-c", code, ckpt], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[1:] == ["safetensors.numpy", "False", "True"], r.stdout
    assert "GDPATH_SAFETENSORS='yes\\x1b[31m' is neither 1" in r.stderr, r.stderr
    assert "\x1b" not in r.stderr


def test_install_and_uninstall_twice_or_alone_are_harmless():
    import safetensors
    import safetensors.numpy as real_np

    import gdpath.safetensors as gst

    original = real_np.load_file
    gst.uninstall()  # without install: nothing to put back, no error
    assert real_np.load_file is original
    gst.install()
    gst.install()
    assert real_np.load_file.__module__ == "gdpath.safetensors.numpy"
    gst.uninstall()
    gst.uninstall()
    assert real_np.load_file is original and safetensors.safe_open.__module__ != "gdpath.safetensors"
