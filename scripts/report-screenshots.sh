#!/usr/bin/env bash
# Makes the screenshots of `gdpath report` in docs/ (README.md links them): the report of four
# vendored machines — AWS p4d.24xlarge (PCIe switches, EFA NICs), a two-socket server, the
# one-GPU H200 VM, and the two H200s joined by NVLink (the embedded snapshot) with the one
# recorded bench document charted, the whole page — and the drawing of the 8-GPU, 32-NIC,
# 9-NVMe machine the report's tests derive from the p4d, rendered by headless chromium
# (scripts/setup.sh installs it), cut below the page (scripts/png_cut_below.py) and shrunk with
# pngquant when that is installed.
#
# No --path is passed: a replay then checks GDS in no directory, rather than judging the
# directory this script runs in as if it were on the replayed machine.
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
ln -s "$root/assets" "$tmp/assets"
browse() { # file.html|file.svg out.png width height
  chromium --headless --no-sandbox --disable-gpu --disable-background-networking \
    --disable-component-update --disable-sync --no-first-run --hide-scrollbars \
    --user-data-dir="$tmp/profile" --screenshot="$2" --window-size="$3,$4" "file://$1" \
    >/dev/null 2>&1
}
cut_below() { # png: drops the white below the page's content (keeps a margin)
  python3 "$root/scripts/png_cut_below.py" "$1" 24
}
keep() { # png name
  if command -v pngquant >/dev/null; then
    pngquant --quality 70-90 --speed 1 -f -o "$root/docs/$2" "$1"
  else
    cp "$1" "$root/docs/$2"
  fi
  echo "docs/$2 ($(($(stat -c %s "$root/docs/$2") / 1024)) KiB)"
}
shot() { # name width height report-args...
  local name=$1 w=$2 h=$3
  shift 3
  (cd "$tmp" && "$bin" report -o "$name.html" "$@" >/dev/null)
  browse "$tmp/$name.html" "$tmp/$name.png" "$w" "$h"
  cut_below "$tmp/$name.png"
  keep "$tmp/$name.png" "report-$name.png"
}
shot p4d 1600 1250 --nccl-xml fixtures/nccl-xml/nccl-aws-p4d-24xl-topo.xml
shot two-socket 1600 1000 --hwloc-xml fixtures/hwloc-xml/hwloc-xml-32em64t-2n8c2t-pci-normalio.xml
shot h200x1 1300 1250 --snapshot fixtures/device/h200x1-capture-2026-12-01.tar.gz
# The whole page, down to the chart: the storage bench recorded on the development machine
# (fixtures/README.md), the one bench document in the repository.
shot h200x2 1400 4000 --snapshot assets/snapshots/h200x2.tar.gz \
  --from fixtures/bench/storage-var-tmp-2026-12-01.json
mkdir "$tmp/dump"
GDPATH_REPORT_DUMP="$tmp/dump" cargo test -q -p gdpath-report --test large >/dev/null
svg="$tmp/dump/switches.svg"
w=$(grep -o 'width="[0-9.]*"' "$svg" | head -1 | tr -dc '0-9.')
h=$(grep -o 'height="[0-9.]*"' "$svg" | head -1 | tr -dc '0-9.')
browse "$svg" "$tmp/cloud.png" "${w%.*}" "${h%.*}"
keep "$tmp/cloud.png" "report-8gpu-32nic-9nvme.png"
