#!/bin/bash
# Pinned comparison at one size: `ucx_perftest -t ucp_put_bw -s SIZE -n N` (server CPU 0, client
# CPU 1, UCX_TLS=tcp UCX_NET_DEVICES=lo) against two gdpath binaries, `bench net --qd 64 --batch
# 16 --completion local`, fresh servers, ROUNDS rounds. Usage: SIZE N ROUNDS (binaries: G1, G2).
export UCX_TLS=tcp UCX_NET_DEVICES=lo LC_ALL=C
size=$1; n=$2; rounds=$3; P=34000
for r in $(seq $rounds); do
  P=$((P+5))
  taskset -c 0 ucx_perftest -p $P >/dev/null 2>&1 & s=$!; sleep 0.3
  pt=$(taskset -c 1 ucx_perftest 127.0.0.1 -p $P -t ucp_put_bw -s $size -n $n 2>/dev/null | awk '/Final/ {printf "%.4f", $7*1048576/1e9}'); wait $s
  line="round $r size $size: perftest $pt"
  for g in "${G1:?set G1 and G2 to gdpath binaries}" "${G2:?}"; do
    P=$((P+1))
    taskset -c 0 $g serve --listen 127.0.0.1:$P --export host:256MiB >/dev/null 2>&1 & s=$!; sleep 0.5
    gb=$(taskset -c 1 $g bench net --peer 127.0.0.1:$P --size $size --qd 64 --batch 16 --completion local --runs 1 --bytes-per-run $((size*n)) --lat-iters 5 --json 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin)['rows'][0]; print(round(r['gbps_median'],4))")
    kill $s; wait $s 2>/dev/null
    line="$line | $(basename $g) $gb ($(awk -v a=$gb -v b=$pt 'BEGIN{printf "%.2f", a/b}')x)"
  done
  echo "$line"
done
