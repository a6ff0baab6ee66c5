#!/usr/bin/env bash
# The cost of the engine's metrics on the posting path: `gdpath bench kv` host → host with
# 100,000 blocks, run in interleaved pairs with the metrics on and off (`GDPATH_METRICS=0`), the
# order alternating per pair so that drift (page cache, other load, frequency) falls on both.
# Prints min/median/max of the bench's posting cost per descriptor (its median over --runs) for
# each setting and the ratio of the medians, on/off. A ratio, not a timed test: the target is
# within 2 % (issue 43), and the figure goes to docs/benchmarks.md with the machine it ran on.
#
# Host → host posts run the copy inline (the bench says "posted inline"), so the cost per
# descriptor includes the 4 KiB memcpy; the metrics add a fixed cost per post and per pair
# (a block list is one pair), which is what the ratio bounds.
#
# Environment: GDPATH_BIN (default target/release/gdpath, built if missing), ROUNDS (pairs of
# runs, default 10), BLOCKS (default 100000), BLOCK_SIZE (default 4KiB), RUNS (timed runs per
# bench, default 5).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${GDPATH_BIN:-target/release/gdpath}
rounds=${ROUNDS:-10}
blocks=${BLOCKS:-100000}
block_size=${BLOCK_SIZE:-4KiB}
runs=${RUNS:-5}
if [ ! -x "$bin" ]; then
  cargo build --release --locked -q -p gdpath-cli
fi
one() { # $1: GDPATH_METRICS value; prints "on|off NS"
  local label=on
  [ "$1" = 0 ] && label=off
  GDPATH_METRICS=$1 "$bin" bench kv --src host --dst host --blocks "$blocks" \
    --block-size "$block_size" --runs "$runs" --json |
    python3 -c 'import json, sys
d = json.load(sys.stdin)
row = next(r for r in d["rows"] if r["op"] == "blocks")
print(sys.argv[1], row["post_ns_per_descriptor"])' "$label"
}
for i in $(seq "$rounds"); do
  if [ $((i % 2)) = 1 ]; then one 1; one 0; else one 0; one 1; fi
done | python3 -c 'import statistics, sys
v = {"on": [], "off": []}
for line in sys.stdin:
    k, x = line.split()
    v[k].append(float(x))
for k in ("on", "off"):
    x = v[k]
    print(f"metrics {k:3}: posting ns/descriptor min {min(x):.1f} median {statistics.median(x):.1f} max {max(x):.1f} ({len(x)} runs)")
r = statistics.median(v["on"]) / statistics.median(v["off"])
print(f"on/off (medians): {r:.4f} ({(r - 1) * 100:+.2f} %)")'
