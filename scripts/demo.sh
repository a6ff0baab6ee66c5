#!/usr/bin/env bash
# The main job on any machine, no GPU needed: builds gdpath, then shows
#  1. this machine: topology, readiness (doctor), a storage benchmark and a copy;
#  2. the embedded snapshot of a real two-GPU H200 machine (assets/snapshots/): its topology,
#     P2P matrix and readiness, replayed exactly as captured there, and its report page
#     (target/gdpath-demo/report-h200x2.html, git-ignored).
# Exit status: 0 when every step ran (the doctors' verdicts are shown, not judged), else 1.
set -uo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p gdpath-cli || exit 1
# The binary cargo built (CARGO_TARGET_DIR moves it).
g="${CARGO_TARGET_DIR:-target}/release/gdpath"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/gdpath-demo.XXXXXX")
trap 'rm -rf "$work"' EXIT
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
failed=0
# A step that fails is said at once and fails the demo at the end.
must() { "$@" && return 0; echo "demo: FAILED: $*" >&2; failed=1; return 1; }

step "gdpath topo (this machine)"
must $g topo
step "gdpath doctor (this machine; exit status 0 ok, 1 degraded, 2 unavailable, 3 doctor failed)"
$g doctor --path "$work"; echo "doctor exit status: $?"
step "gdpath bench storage (256 MiB file, O_DIRECT + io_uring from the disk, beside a plain read(2) loop that the page cache serves)"
must $g bench storage --file "$work/bench.bin" --size 256MiB --block 1MiB,4MiB --compare
step "gdpath copy (file -> registered host memory -> file)"
must $g copy "$work/bench.bin" "$work/copy.bin" && must cmp "$work/bench.bin" "$work/copy.bin" &&
  echo "copy verified (cmp)"

snap=assets/snapshots/h200x2.tar.gz
if [ -f "$snap" ]; then
  step "gdpath topo --snapshot $snap (2x NVIDIA H200, NV18)"
  must $g topo --snapshot "$snap"
  step "gdpath p2p --snapshot $snap"
  must $g p2p --snapshot "$snap"
  step "gdpath doctor --snapshot $snap"
  $g doctor --snapshot "$snap"; echo "doctor exit status: $?"
  step "gdpath report --snapshot $snap (the machine, its paths and findings as one page)"
  # A replay judges no directory of this machine: no --path.
  mkdir -p target/gdpath-demo
  must $g report -o target/gdpath-demo/report-h200x2.html --overwrite --snapshot "$snap" &&
    echo "open target/gdpath-demo/report-h200x2.html in a browser (it loads nothing, from disk)"
fi
exit $failed
