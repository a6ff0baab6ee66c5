#!/usr/bin/env bash
# Issue 6's small-message target: host -> host 4 KiB puts over tcp loopback, `gdpath bench net
# --completion local --qd 64 --batch B` against `ucx_perftest -t ucp_put_bw` (Debian's
# ucx-utils) in the same rounds. Each round runs perftest and then every gdpath binary given,
# each against a fresh `gdpath serve` of its own; the server is pinned to CPU 0 and the client
# to CPU 1 (`taskset`), UCX_TLS=tcp UCX_NET_DEVICES=lo, 200 000 puts per run. The figure is
# engine GB/s / perftest GB/s of the same round (perftest's overall bandwidth, MB = 2^20
# converted to 1e9 B); a round's figure moved by ±0.3 (before packed writes, with the stream's
# two TCP modes under BBR: git history of docs/benchmarks.md), so the script ends with the
# median and quartiles of every binary over all rounds. Sets of 20 rounds of one build have had
# medians 0.07 apart: compare builds in the same run, over 40 rounds or more.
# Each run also shows, in brackets, the TCP segments the host sent during it (`nstat`
# TcpOutSegs, both directions of the loopback connection): under BBR a stream of 200 000 puts
# runs either coalesced in ≈ 180-250 k segments (fast) or in ≈ 280-400 k (slow), and that mode
# decided a run's figure more than the program did before packed writes (git history of
# docs/benchmarks.md); the summary also gives the median over the rounds where both ran
# coalesced, and for each program how many of its runs were coalesced and its median GB/s in
# each mode.
# CC=cubic (root) runs the rounds under that congestion control and restores the host's at exit.
# Usage: bench/net-4k-target.sh ROUNDS GDPATH [GDPATH...]   (BATCH=16, N=200000, CC unset)
set -uo pipefail
export LC_ALL=C  # sort -n and awk read "0.63" alike in every locale
rounds=${1:?usage: net-4k-target.sh ROUNDS GDPATH [GDPATH...]}
shift
[ $# -ge 1 ] || { echo "usage: net-4k-target.sh ROUNDS GDPATH [GDPATH...]" >&2; exit 2; }
batch=${BATCH:-16}; n=${N:-200000}; size=4096
export UCX_TLS=tcp UCX_NET_DEVICES=lo
port=$((20000 + RANDOM % 20000))
results=$(mktemp)
pt_results=$(mktemp)
cc_was=$(sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null || echo "?")
restore() {
  rm -f "$results" "$pt_results"
  if [ -n "${CC:-}" ]; then sysctl -qw net.ipv4.tcp_congestion_control="$cc_was"; fi
}
trap restore EXIT
if [ -n "${CC:-}" ]; then
  sysctl -qw net.ipv4.tcp_congestion_control="$CC" || { echo "cannot set congestion control $CC" >&2; exit 2; }
fi
# Thousands of TCP segments this host sent since the previous call (nstat keeps the last count).
segs() { nstat TcpOutSegs 2>/dev/null | awk '/TcpOutSegs/ {printf "%dk", $2 / 1000}'; }
# Below this many thousand segments per 200 000 puts a run counts as coalesced (the fast mode);
# the modes' ranges measured so far: 176-261 k and 266-414 k. Scaled with N.
coalesced_max=$((265 * n / 200000))
# Reads "SEGMENTS(k) GB/s" lines; prints how many runs were coalesced and the median GB/s of
# each mode, for the program named $1.
modes() {
  awk -v m="$coalesced_max" '$1 > 0 {print ($1 < m ? "fast" : "slow"), $2}' | sort -k1,1 -k2,2n \
    | awk -v name="$1" '
    {n[$1]++; v[$1, n[$1]] = $2}
    function med(mode,  c) {
      c = n[mode]; if (c == 0) return "-"
      return sprintf("%.3f", (c % 2) ? v[mode, (c + 1) / 2] : (v[mode, c / 2] + v[mode, c / 2 + 1]) / 2)
    }
    END {
      printf "  %s: coalesced in %d of %d runs; median GB/s coalesced %s, uncoalesced %s\n",
        name, n["fast"], n["fast"] + n["slow"], med("fast"), med("slow")
    }'
}
date -u +"start %Y-%m-%dT%H:%M:%SZ"; uname -srm; nproc
echo "congestion control: $(sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null || echo '?')"
for r in $(seq "$rounds"); do
  port=$((port + 1 + $#))
  taskset -c 0 ucx_perftest -p "$port" >/dev/null 2>&1 & srv=$!
  sleep 0.3
  segs >/dev/null
  pt=$(taskset -c 1 ucx_perftest 127.0.0.1 -p "$port" -t ucp_put_bw -s "$size" -n "$n" 2>/dev/null \
    | awk '/Final/ {printf "%.4f", $7 * 1048576 / 1e9}')
  seg=$(segs); pt_seg=${seg%k}; pt_seg=${pt_seg:-0}
  wait "$srv" 2>/dev/null
  [ -n "${pt:-}" ] && echo "$pt_seg $pt" >> "$pt_results"
  line="round $r: ucx_perftest ${pt:-?} GB/s [$seg]"
  k=0
  for g in "$@"; do
    k=$((k + 1))
    taskset -c 0 "$g" serve --listen "127.0.0.1:$((port + k))" --export host:256MiB >/dev/null 2>&1 & s=$!
    sleep 0.5
    segs >/dev/null
    gb=$(taskset -c 1 "$g" bench net --peer "127.0.0.1:$((port + k))" --op put --size "$size" \
      --qd 64 --batch "$batch" --completion local --runs 1 --bytes-per-run $((size * n)) \
      --lat-iters 5 --json 2>/dev/null | awk -F': ' '/"gbps_median"/ {gsub(/,/, "", $2); print $2; exit}')
    seg=$(segs); g_seg=${seg%k}; g_seg=${g_seg:-0}
    kill "$s" 2>/dev/null; wait "$s" 2>/dev/null
    if [ -n "${pt:-}" ] && [ -n "${gb:-}" ]; then
      ratio=$(awk -v a="$gb" -v b="$pt" 'BEGIN {printf "%.3f", a / b}')
      echo "$k $ratio $pt_seg $g_seg $pt $gb" >> "$results"
      line="$line | $g $(printf '%.4f' "$gb") GB/s ($ratio x) [$seg]"
    else
      line="$line | $g FAILED"
    fi
  done
  echo "$line"
done
k=0
for g in "$@"; do
  k=$((k + 1))
  awk -v k="$k" '$1 == k {print $2}' "$results" | sort -n | awk -v g="$g" '
    {v[NR] = $1}
    END {
      if (NR == 0) { print g ": no round completed"; exit }
      med = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      q1 = v[int((NR + 3) / 4)]; q3 = v[int((3 * NR + 3) / 4)]
      ok = 0; for (i = 1; i <= NR; i++) if (v[i] >= 0.9) ok++
      printf "%s: median %.3fx of ucx_perftest over %d rounds (quartiles %.3f / %.3f), %d rounds >= 0.9x\n", g, med, NR, q1, q3, ok
    }'
  # The same, over the rounds in which both programs ran coalesced: the engine's own cost
  # with the kernel's mode taken out (a heuristic split by segment count, see coalesced_max).
  awk -v k="$k" -v m="$coalesced_max" '$1 == k && $3 > 0 && $3 < m && $4 < m {print $2}' "$results" \
    | sort -n | awk -v g="$g" '
    {v[NR] = $1}
    END {
      if (NR == 0) { print g ": no round with both runs coalesced"; exit }
      med = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "%s: both runs coalesced in %d rounds, median %.3fx there\n", g, NR, med
    }'
  # The binary on its own, split by mode: how often it ran coalesced, and its median GB/s in
  # each mode (whether the engine falls into the slow mode more often, or trails within the
  # fast one). perftest's line follows the binaries'.
  awk -v k="$k" '$1 == k && $4 > 0 {print $4, $6}' "$results" | modes "$g"
done
modes ucx_perftest < "$pt_results"
date -u +"end %Y-%m-%dT%H:%M:%SZ"
