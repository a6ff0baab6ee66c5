#!/usr/bin/env bash
# Installs what gdpath's build, tests and benchmarks need on a Debian/Ubuntu machine, and builds
# the Python module into a virtual environment under the repository (.venv, git-ignored).
# Idempotent; uses sudo only when not root. The GPU libraries (libcuda, libnvidia-ml, libcufile)
# are NOT installed here: gdpath loads them at run time and reports their absence.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(
  libucx0 ucx-utils   # UCX (libucp.so.0) for the network path tests; ucx_perftest for comparisons
  iproute2            # ip netns / veth: two-host network tests on one machine
  fio                 # storage benchmark baseline
  pkg-config
  g++                 # libFuzzer (scripts/fuzz.sh, CI); its gcc builds net_faults.rs's fault shim
  chromium            # gdpath-report's browser test renders the report headless (tests/browser.rs)
  fonts-dejavu-core   # DejaVu Sans Mono: the face the report's label widths are measured for
  etcd-server etcd-client  # gdpath-cluster's tests start a real etcd on loopback ports
  protobuf-compiler libprotobuf-dev  # protoc and the well-known .proto files (google/protobuf/*.proto) that etcd-client's build compiles etcd's API against
  prometheus          # the metrics tests: a real Prometheus scrapes `gdpath serve --metrics`; promtool
)
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust with rustup" >&2; exit 1; }

# The Python module `gdpath` (crates/gdpath-py, built by maturin): a venv with maturin, the
# packages the Python tests compare with (pytest, numpy, safetensors) and mypy (its stubtest checks
# the native module's type stubs, tests/test_stubs.py; held to one minor release, since a newer
# stubtest may add checks: raise the bound on purpose) from PyPI, and gdpath
# built (debug, as `cargo test` builds) and installed into it. A release wheel for another
# machine (manylinux_2_28, linked by zig against glibc 2.28): docs/python.md. Users install it
# with `pip install crates/gdpath-py`.
py="${PYTHON:-python3}"
command -v "$py" >/dev/null || { echo "setup: $py not found (the Python module needs Python 3.9+)" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv || { echo "setup: '$py -m venv' failed: install python3-venv" >&2; exit 1; }
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "maturin>=1.9.4,<2" pytest numpy safetensors "mypy>=2.4.1,<2.5" prometheus_client
# GDPATH_SETUP_TORCH=1 (CI sets it) adds PyTorch and transformers, so that safetensors' own
# PyTorch tests and transformers' loading run against gdpath.safetensors on the CPU: PyPI's torch
# is its CUDA build (5.4 GB installed, about 90 s here), which imports and computes without a GPU.
if [ "${GDPATH_SETUP_TORCH:-0}" = 1 ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check "torch>=2.9,<3" "transformers>=5,<6"
fi
VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop -q -m crates/gdpath-py/Cargo.toml
