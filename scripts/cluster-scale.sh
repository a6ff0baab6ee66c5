#!/usr/bin/env bash
# Scale measurement of gdpath-cluster (docs/cluster.md, "Scale"): one etcd on loopback ports
# with a temporary data directory, N agents (default 200) in one process, lease TTL (default
# 5 s). Usage: scripts/cluster-scale.sh [N] [TTL_S]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200}
ttl=${2:-5}
dir=$(mktemp -d)
cport=$((20000 + RANDOM % 20000)); pport=$((cport + 1))
etcd --name scale --data-dir "$dir/data" \
  --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
  --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
  --initial-cluster "scale=http://127.0.0.1:$pport" >"$dir/etcd.log" 2>&1 &
etcd_pid=$!
trap 'kill $etcd_pid 2>/dev/null; wait $etcd_pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$cport" endpoint health >/dev/null 2>&1 && break
  sleep 0.1
done
cargo run -q -p gdpath-cluster --example scale -- "etcd://127.0.0.1:$cport/scale" "$n" "$ttl" "$etcd_pid"
