#!/usr/bin/env bash
# Host->host put over TCP loopback: `gdpath bench net` against `ucx_perftest` (Debian's
# ucx-utils), same sizes, interleaved in one run, both with UCX_TLS=tcp UCX_NET_DEVICES=lo.
# gdpath runs twice per size: every message its own transfer (qd 16, batch 1) and 16 messages
# per transfer (qd 64, batch 16: one flush confirms 16 puts, as a NIXL descriptor list does).
# Also 8-byte latency: gdpath put (post -> in the peer's memory, one round trip) and get
# against ucx_perftest ucp_put_lat (half a ping-pong round trip) and ucp_get (one round trip).
# Usage: bench/bench-net-vs-perftest.sh [path/to/gdpath] [rounds]
set -euo pipefail
GDPATH=${1:-target/release/gdpath}
ROUNDS=${2:-3}
SIZES=(8 4096 65536 1048576 16777216)
export UCX_TLS=tcp UCX_NET_DEVICES=lo
PORT=13377
date -u +"date: %Y-%m-%dT%H:%MZ"; uname -srm; nproc; uptime
perftest() { # test size iters -> prints the "Final" line
  ucx_perftest -p $PORT >/dev/null 2>&1 & local srv=$!
  sleep 0.3
  ucx_perftest 127.0.0.1 -p $PORT -t "$1" -s "$2" -n "$3" 2>/dev/null | grep Final || true
  wait $srv || true
}
"$GDPATH" serve --listen 127.0.0.1:$((PORT+1)) --export host:256MiB --devices lo --transports tcp >/dev/null &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
sleep 0.5
for r in $(seq 1 "$ROUNDS"); do
  for s in "${SIZES[@]}"; do
    n=$(( s >= 1048576 ? 256 : (s >= 65536 ? 4096 : 20000) ))
    # perftest Final columns: iters, typical lat, avg lat, overall lat, avg BW MB/s, overall BW MB/s (MB = 2^20), ...
    p=$(perftest ucp_put_bw "$s" "$n" | awk '{printf "%.4f", $7*1048576/1e9}')
    gd() { # qd batch -> "GB/s transport"
      "$GDPATH" bench net --peer 127.0.0.1:$((PORT+1)) --devices lo --transports tcp --op put \
        --size "$s" --qd "$1" --batch "$2" --runs 1 --bytes-per-run $(( s * n )) --lat-iters 5 --json \
        | python3 -c 'import json,sys; r=json.load(sys.stdin)["rows"][0]; print("%.4f|%s" % (r["gbps_median"], r["transport"]))'
    }
    g=$(gd 16 1); gb=$(gd 64 16)
    echo "round $r size $s: ucx_perftest put_bw ${p} GB/s; gdpath put qd16 batch1 ${g%%|*} GB/s (${g#*|}), ratio $(python3 -c "print('%.2f' % (${g%%|*}/${p}))"); qd64 batch16 ${gb%%|*} GB/s (${gb#*|}), ratio $(python3 -c "print('%.2f' % (${gb%%|*}/${p}))")"
  done
  pl=$(perftest ucp_put_lat 8 20000 | awk '{print $4}')
  gl=$(perftest ucp_get 8 20000 | awk '{print $4}')
  ours=$("$GDPATH" bench net --peer 127.0.0.1:$((PORT+1)) --devices lo --transports tcp --op put --size 8 --runs 1 --bytes-per-run 8 --lat-iters 5000 --json | python3 -c 'import json,sys; r=json.load(sys.stdin)["rows"][0]; print(r["latency_us_median"])')
  oursg=$("$GDPATH" bench net --peer 127.0.0.1:$((PORT+1)) --devices lo --transports tcp --op get --size 8 --runs 1 --bytes-per-run 8 --lat-iters 5000 --json | python3 -c 'import json,sys; r=json.load(sys.stdin)["rows"][0]; print(r["latency_us_median"])')
  echo "round $r latency 8 B: ucx_perftest put_lat ${pl} us (half round trip), get ${gl} us; gdpath put ${ours} us (round trip), get ${oursg} us"
done
