"""Shared fixtures of gdpath's pytest suite (CPU; GPU tests are in test_gpu.py and skip with
their reason where no GPU is usable).

The suite runs with the package installed in the venv that ``scripts/setup.sh`` makes, after
``cargo test --workspace`` (which builds the ``gdpath`` binary the document tests compare
with): ``.venv/bin/python -m pytest crates/gdpath-py/tests``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import gdpath

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "fixtures"


def disk_dir() -> str:
    """A directory on a disk file system (O_DIRECT works there, unlike tmpfs): under the
    repository's target folder, like the Rust tests' scratch directories."""
    base = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "pytest-scratch"
    base.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(dir=base)


@pytest.fixture
def scratch():
    d = disk_dir()
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def agent() -> gdpath.Agent:
    return gdpath.Agent(name="pytest")


def gdpath_bin() -> Path:
    """The ``gdpath`` binary: ``$GDPATH_BIN``, else the workspace's debug build (built here
    when missing, so the suite also runs on its own)."""
    if os.environ.get("GDPATH_BIN"):
        return Path(os.environ["GDPATH_BIN"])
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    b = target / "debug" / "gdpath"
    if not b.exists():
        subprocess.run(
            ["cargo", "build", "-q", "--locked", "-p", "gdpath-cli"], cwd=REPO, check=True
        )
    return b


def minilm() -> Path | None:
    """The real MiniLM checkpoint (scripts/fetch-minilm.sh), or None with the reason printed;
    ``GDPATH_REQUIRE_MINILM=1`` (CI) makes its absence a failure."""
    if os.environ.get("GDPATH_MINILM"):
        return Path(os.environ["GDPATH_MINILM"])
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "fetch-minilm.sh")], capture_output=True, text=True
    )
    if out.returncode == 0:
        return Path(out.stdout.strip())
    why = f"fetch-minilm.sh failed ({out.returncode}): {out.stderr.strip()}"
    if os.environ.get("GDPATH_REQUIRE_MINILM") == "1":
        pytest.fail(f"GDPATH_REQUIRE_MINILM=1 but {why}")
    print(f"SKIPPED: the MiniLM checkpoint is not available: {why}", file=sys.stderr)
    return None


def net_agent(name: str) -> gdpath.Agent:
    """An agent whose UCX traffic stays on the loopback interface, as the Rust network tests'."""
    a = gdpath.Agent(name=name)
    a.enable_net(devices="lo")
    return a


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU with its driver (skips with the reason otherwise)")


class Serving:
    """A serving agent exporting one zeroed host region of `size` bytes on an ephemeral
    loopback port, and a client connected to it."""

    def __init__(self, size: int, token=None):
        import numpy as np

        self.server = net_agent("srv")
        self.buf = np.zeros(size, dtype=np.uint8)
        self.exported = self.server.register(self.buf)
        self.rid = self.server.export(self.exported)
        self.srv = self.server.serve("127.0.0.1:0", token=token)
        self.client = net_agent("cli")
        self.peer = self.client.connect(self.srv.address, token=token)

    def close(self):
        self.peer.close()
        self.srv.close()


def wait_event(srv, name: str, seconds: float = 10.0) -> list:
    """The server's events until one named `name` (or `seconds` pass): their names."""
    import time

    seen = []
    end = time.monotonic() + seconds
    while name not in seen and time.monotonic() < end:
        ev = srv.next_event(0.2)
        if ev:
            seen.append(ev[0])
    return seen


# Where GDPATH_REQUIRE_TORCH is set (CI installs PyTorch), a test that skips because PyTorch is
# missing fails instead: the torch half of the drop-in tests must not pass by skipping.
_TORCH_MISSING = (
    "PyTorch is not installed",
    "imports PyTorch, which is not installed",
    "PyTorch and transformers are not both installed",
)


def _require_torch(report) -> None:
    """Turns ``report`` (a test's or a module's collection) into a failure where it skipped for
    want of PyTorch and ``GDPATH_REQUIRE_TORCH`` is set."""
    if report.skipped and os.environ.get("GDPATH_REQUIRE_TORCH"):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if any(m in reason for m in _TORCH_MISSING):
            report.outcome = "failed"
            report.longrepr = f"GDPATH_REQUIRE_TORCH is set but the test skipped: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _require_torch(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # A module that skips at import (`allow_module_level=True`) is reported at collection.
    outcome = yield
    _require_torch(outcome.get_result())
