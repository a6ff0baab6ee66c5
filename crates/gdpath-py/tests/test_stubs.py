"""The hand-written type stubs of the native module (``python/gdpath/_native.pyi``) match the
compiled module: mypy's stubtest imports ``gdpath._native`` and compares every class, function,
method and property of it with the stub (names, parameter names and kinds, defaults, ``@final``,
``__all__``), so a stub that drifts from the Rust side fails here.

Deliberate differences go in ``stubtest-allowlist.txt`` beside this file, one stubtest name a
line with the reason in a comment above it; stubtest also fails on an entry that no longer
matches anything. mypy comes from ``scripts/setup.sh`` (the ``test`` extra); without it the test
skips and says so, unless ``GDPATH_REQUIRE_STUBTEST=1`` (CI) makes that a failure."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ALLOWLIST = Path(__file__).resolve().parent / "stubtest-allowlist.txt"


def test_native_stub_matches_the_compiled_module(tmp_path):
    if importlib.util.find_spec("mypy") is None:
        why = "mypy is not installed (scripts/setup.sh installs it): the stubs are not checked"
        if os.environ.get("GDPATH_REQUIRE_STUBTEST") == "1":
            pytest.fail(f"GDPATH_REQUIRE_STUBTEST=1 but {why}")
        pytest.skip(why)
    # Run where no stray stub or mypy cache of the checkout can stand in for the installed
    # package's: mypy finds gdpath where Python imports it from.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy.stubtest",
            "gdpath._native",
            "--allowlist",
            str(ALLOWLIST),
            "--mypy-config-file",
            os.devnull,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, f"stubtest found differences:\n{out.stdout}{out.stderr}"
