#!/usr/bin/env bash
# Makes the screenshots of `gdpath report` in docs/ (README.md links them): the report of three
# vendored machines — AWS p4d.24xlarge (PCIe switches, EFA NICs), a two-socket server, the
# one-GPU H200 VM with the recorded storage bench — and the drawing of the 8-GPU, 32-NIC,
# 9-NVMe machine the report's tests derive from the p4d, rendered by headless chromium
# (scripts/setup.sh installs it) and shrunk with pngquant when that is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
command -v chromium >/dev/null || { echo "chromium not found: run scripts/setup.sh" >&2; exit 1; }
cargo build -q -p gdpath-cli
bin=$root/target/debug/gdpath
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Relative paths, so the command line the report shows reads as a user would type it.
ln -s "$root/fixtures" "$tmp/fixtures"
browse() { # file.html|file.svg out.png width height
  chromium --headless --no-sandbox --disable-gpu --disable-background-networking \
    --disable-component-update --disable-sync --no-first-run --hide-scrollbars \
    --user-data-dir="$tmp/profile" --screenshot="$2" --window-size="$3,$4" "file://$1" \
    >/dev/null 2>&1
}
keep() { # png name
  if command -v pngquant >/dev/null; then
    pngquant --quality 70-90 --speed 1 -f -o "$root/docs/$2" "$1"
  else
    cp "$1" "$root/docs/$2"
  fi
  echo "docs/$2"
}
shot() { # name width height report-args...
  local name=$1 w=$2 h=$3
  shift 3
  (cd "$tmp" && "$bin" report -o "$name.html" --path . "$@" >/dev/null)
  browse "$tmp/$name.html" "$tmp/$name.png" "$w" "$h"
  keep "$tmp/$name.png" "report-$name.png"
}
shot p4d 1600 1250 --nccl-xml fixtures/nccl-xml/nccl-aws-p4d-24xl-topo.xml
shot two-socket 1600 1000 --hwloc-xml fixtures/hwloc-xml/hwloc-xml-32em64t-2n8c2t-pci-normalio.xml
shot h200x1 1300 1400 --snapshot fixtures/device/h200x1-capture-2026-12-01.tar.gz \
  --from fixtures/bench/storage-var-tmp-2026-12-01.json
mkdir "$tmp/dump"
GDPATH_REPORT_DUMP="$tmp/dump" cargo test -q -p gdpath-report --test large >/dev/null
svg="$tmp/dump/switches.svg"
w=$(grep -o 'width="[0-9.]*"' "$svg" | head -1 | tr -dc '0-9.')
h=$(grep -o 'height="[0-9.]*"' "$svg" | head -1 | tr -dc '0-9.')
browse "$svg" "$tmp/cloud.png" "${w%.*}" "${h%.*}"
keep "$tmp/cloud.png" "report-8gpu-32nic-9nvme.png"
