#!/usr/bin/env bash
# The packed-write prototype (`put_stream amput`) against UCX 1.13's emulated puts: per round,
# `ucx_perftest -t ucp_put_bw -s 4096 -n 200000`, then with gdpath-ucx's `put_stream` example
# (a fresh target per run) 200 000 emulated 4 KiB puts with 64 in flight,
# and the same writes sent as active messages of 16 (`amput`, acknowledged and checked at the
# target) with 64 and 256 unacknowledged. Server on CPU 0, client on CPU 1, UCX_TLS=tcp
# UCX_NET_DEVICES=lo. Prints GB/s and the ratio to perftest of the same round.
# Build first: cargo build --release -p gdpath-ucx --example put_stream
# Usage: bench/net-4k-amput.sh ROUNDS [path/to/put_stream]
set -uo pipefail
export LC_ALL=C UCX_TLS=tcp UCX_NET_DEVICES=lo
rounds=${1:?usage: net-4k-amput.sh ROUNDS [put_stream]}
ps=${2:-target/release/examples/put_stream}
[ -x "$ps" ] || { echo "$ps not found: cargo build --release -p gdpath-ucx --example put_stream" >&2; exit 2; }
port=$((20000 + RANDOM % 20000))
date -u +"start %Y-%m-%dT%H:%M:%SZ"
for r in $(seq "$rounds"); do
  port=$((port + 10))
  taskset -c 0 ucx_perftest -p "$port" >/dev/null 2>&1 & srv=$!
  sleep 0.3
  pt=$(taskset -c 1 ucx_perftest 127.0.0.1 -p "$port" -t ucp_put_bw -s 4096 -n 200000 2>/dev/null \
    | awk '/Final/ {printf "%.4f", $7 * 1048576 / 1e9}')
  wait "$srv" 2>/dev/null
  line="round $r: ucx_perftest ${pt:-?} GB/s"
  for mode in "put @ sockaddr 4096 200000 64" "amput @ 4096 200000 64 16" "amput @ 4096 200000 256 16"; do
    port=$((port + 2))
    taskset -c 0 "$ps" serve "$port" >/dev/null 2>&1 & srv=$!
    sleep 0.4
    # shellcheck disable=SC2086 # the mode is a word list
    gb=$(taskset -c 1 "$ps" ${mode/@/127.0.0.1:$port} 2>&1 | grep -o "[0-9.]* GB/s" | awk '{print $1}')
    kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null
    name=$(echo "$mode" | awk '{print $1 " W=" $(($1 == "put") ? NF : NF - 1)}')
    if [ -n "${gb:-}" ] && [ -n "${pt:-}" ]; then
      line="$line | $name $gb GB/s ($(awk -v a="$gb" -v b="$pt" 'BEGIN {printf "%.2f", a / b}')x)"
    else
      line="$line | $name FAILED"
    fi
  done
  echo "$line"
done
date -u +"end %Y-%m-%dT%H:%M:%SZ"
