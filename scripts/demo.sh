#!/usr/bin/env bash
# The main job on any machine, no GPU needed: builds gdpath, then shows
#  1. this machine: topology, readiness (doctor), a storage benchmark and a copy;
#  2. the embedded snapshot of a real two-GPU H200 machine (assets/snapshots/): its topology,
#     P2P matrix and readiness, replayed exactly as captured there, and its report page
#     (gdpath-report-h200x2.html in the current directory).
set -uo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p gdpath-cli || exit 1
g=target/release/gdpath
work=$(mktemp -d "${TMPDIR:-/var/tmp}/gdpath-demo.XXXXXX")
trap 'rm -rf "$work"' EXIT
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "gdpath topo (this machine)"
$g topo
step "gdpath doctor (this machine; exit status 0 ok, 1 degraded, 2 unavailable, 3 doctor failed)"
$g doctor --path "$work"; echo "doctor exit status: $?"
step "gdpath bench storage (256 MiB file, O_DIRECT + io_uring from the disk, beside a plain read(2) loop that the page cache serves)"
$g bench storage --file "$work/bench.bin" --size 256MiB --block 1MiB,4MiB --compare
step "gdpath copy (file -> registered host memory -> file)"
$g copy "$work/bench.bin" "$work/copy.bin" && cmp "$work/bench.bin" "$work/copy.bin" && echo "copy verified (cmp)"

snap=assets/snapshots/h200x2.tar.gz
if [ -f "$snap" ]; then
  step "gdpath topo --snapshot $snap (2x NVIDIA H200, NV18)"
  $g topo --snapshot "$snap"
  step "gdpath p2p --snapshot $snap"
  $g p2p --snapshot "$snap"
  step "gdpath doctor --snapshot $snap"
  $g doctor --snapshot "$snap"; echo "doctor exit status: $?"
  step "gdpath report --snapshot $snap (the machine, its paths and findings as one page)"
  $g report -o gdpath-report-h200x2.html --overwrite --snapshot "$snap" --path "$work" &&
    echo "open gdpath-report-h200x2.html in a browser (it loads nothing, from disk)"
fi
exit 0
