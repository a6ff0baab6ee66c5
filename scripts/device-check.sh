#!/usr/bin/env bash
# On a GPU machine: gdpath topo / p2p / doctor beside nvidia-smi, a capture and its replay, and
# the GPU suite. Usage: device-check.sh DIR, where DIR holds the `gdpath` binary and bins/ with
# the GPU test binaries named gpu_* (see scripts/gpu-suite.sh); outputs go to $OUT (default .).
set -u
dir=${1:?usage: device-check.sh DIR}
out=${OUT:-.}
g="$dir/gdpath"
date -u
echo "### nvidia-smi topo -m"; nvidia-smi topo -m
for c in r w n a p; do echo "### nvidia-smi topo -p2p $c"; nvidia-smi topo -p2p $c; done
echo "### gdpath topo"; $g topo | tee "$out/topo.txt"
$g topo --json > "$out/topo.json"
echo "### gdpath p2p"; $g p2p | tee "$out/p2p.txt"
echo "### gdpath topo capture"; $g topo capture -o "$out/capture.tar.gz"
$g topo --snapshot "$out/capture.tar.gz" --json > "$out/topo-replay.json"
if diff <(grep -v '"source"' "$out/topo.json") <(grep -v '"source"' "$out/topo-replay.json") >/dev/null; then
  echo "replay JSON identical (except source)"
else
  echo "replay JSON DIFFERS"
fi
echo "### gdpath doctor --path /dev/shm --path /var/tmp"
$g doctor --path /dev/shm --path /var/tmp | tee "$out/doctor.txt"; echo "doctor exit status: ${PIPESTATUS[0]}"
echo "### GPU suite"
# The CLI's GPU tests (gpu_net, gpu_load) run this `gdpath`, not the one cargo built for them.
GDPATH_BIN=${GDPATH_BIN:-$(realpath "$g")} "$(dirname "$0")/gpu-suite.sh" "$dir/bins"
