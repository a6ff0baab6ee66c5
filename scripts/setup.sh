#!/usr/bin/env bash
# Installs what gdpath's build, tests and benchmarks need on a Debian/Ubuntu machine.
# Idempotent; uses sudo only when not root. The GPU libraries (libcuda, libnvidia-ml, libcufile)
# are NOT installed here: gdpath loads them at run time and reports their absence.
set -euo pipefail
pkgs=(
  libucx0 ucx-utils   # UCX (libucp.so.0) for the network path tests; ucx_perftest for comparisons
  iproute2            # ip netns / veth: two-host network tests on one machine
  fio                 # storage benchmark baseline
  pkg-config
  g++                 # libFuzzer, built by the libfuzzer-sys crate (scripts/fuzz.sh, CI)
  chromium            # gdpath-report's browser test renders the report headless (tests/browser.rs)
  fonts-dejavu-core   # DejaVu Sans Mono: the face the report's label widths are measured for
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
