#!/usr/bin/env bash
# Fault suite (issue 21): faults and bad input end cleanly, destroy nothing and hang nowhere.
# CI runs it (.ci/run) as root; without root the checks that need it (a loop device, a tmpfs)
# print why they skip. Every step runs under `timeout`, and the whole suite under
# FAULT_SUITE_LIMIT seconds (default 900), so a hang fails CI instead of stalling it.
#
# Blocks, each self-contained (a helper adding a block keeps to this shape):
#   files   devices, FIFOs, full file systems, interrupts, closed/full stdout, arguments,
#           checkpoint saves (resave: kills, a full tmpfs, an existing file)
#           (cargo test --test faults, then the issue's own command lines in a shell)
#   network added by the network helper: serve and bench net against raw sockets and kills
#
# Usage: scripts/fault-suite.sh [BLOCK...]   (default: all blocks). Exit status 0: all passed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
limit=${FAULT_SUITE_LIMIT:-900}
started=$SECONDS
failures=0

say() { printf 'fault-suite: %s\n' "$*"; }
fail() {
  say "FAIL: $*"
  failures=$((failures + 1))
}
# Runs "$@" with the time left of the suite's bound (at most $1 seconds).
bounded() {
  local most=$1
  shift
  local left=$((limit - (SECONDS - started)))
  ((left > 0)) || { fail "out of time (FAULT_SUITE_LIMIT=$limit s)"; return 124; }
  ((left < most)) && most=$left
  timeout --kill-after=10 "$most" "$@"
}

cargo build --locked -p gdpath-cli --quiet
# GDPATH_BIN: another build to check (as the tests take it), e.g. main's, to see these fail.
gdpath=${GDPATH_BIN:-$root/target/debug/gdpath}
work=$(mktemp -d)
cleanup=()
trap 'for c in "${cleanup[@]}"; do eval "$c" || true; done; rm -rf "$work"' EXIT

block_files() {
  say "files: cargo test --test faults"
  bounded 600 cargo test --locked -p gdpath-cli --test faults --quiet || fail "crates/gdpath-cli/tests/faults"

  # The issue's command lines, as a user types them.
  say "files: bench storage on a block device (losetup)"
  truncate -s 32M "$work/disk.img"
  if dev=$(losetup -f --show "$work/disk.img" 2>/dev/null); then
    cleanup+=("losetup -d $dev")
    if bounded 60 "$gdpath" bench storage --file "$dev" --size 16MiB 2>"$work/err"; then
      fail "bench storage --file $dev succeeded"
    fi
    grep -q "is a block device" "$work/err" || fail "no 'is a block device' in: $(cat "$work/err")"
    cmp -s -n $((32 << 20)) "$dev" /dev/zero || fail "$dev was written"
  else
    say "skipped: losetup is not permitted here (needs root)"
  fi

  say "files: bench storage on a FIFO returns"
  mkfifo "$work/fifo"
  rc=0
  bounded 30 "$gdpath" bench storage --file "$work/fifo" --size 1MiB 2>/dev/null || rc=$?
  [[ $rc == 1 ]] || fail "bench storage --file FIFO: status $rc (124: it blocked)"

  say "files: topo --snapshot on a FIFO with a silent writer returns"
  exec {held}<>"$work/fifo"   # read and write: a writer that is there and never writes
  rc=0
  bounded 20 "$gdpath" topo --snapshot "$work/fifo" >/dev/null 2>"$work/err" || rc=$?
  exec {held}<&-
  [[ $rc == 1 ]] || fail "topo --snapshot FIFO: status $rc (124: it blocked)"
  grep -q "a FIFO, not a regular file" "$work/err" || fail "no 'a FIFO, not a regular file' in: $(cat "$work/err")"

  say "files: copy and topo capture on a full tmpfs"
  mkdir "$work/small"
  if mount -t tmpfs -o size=8m tmpfs "$work/small" 2>/dev/null; then
    cleanup+=("umount $work/small")
    head -c $((64 << 20)) /dev/urandom >"$work/src"
    head -c $((1 << 20)) /dev/urandom >"$work/small/old"
    cp "$work/small/old" "$work/old.ref"
    if bounded 60 "$gdpath" copy "$work/src" "$work/small/old" --overwrite 2>"$work/err"; then
      fail "copy onto an 8 MiB tmpfs succeeded"
    fi
    grep -q "no space left for $work/small/old: 67108864 bytes (64 MiB) needed" "$work/err" ||
      fail "ENOSPC message: $(cat "$work/err")"
    cmp -s "$work/small/old" "$work/old.ref" || fail "the old file changed"
    head -c $((16 << 20)) /dev/zero >"$work/small/fill" 2>/dev/null || true
    if bounded 60 "$gdpath" topo capture -o "$work/small/snap.tar.gz" >/dev/null 2>"$work/err"; then
      fail "topo capture into a full tmpfs succeeded"
    fi
    [[ ! -e $work/small/snap.tar.gz ]] || fail "topo capture left $(stat -c %s "$work/small/snap.tar.gz") bytes"
    if ls -A "$work/small" | grep -q gdpath-tmp; then fail "temporaries left: $(ls -A "$work/small")"; fi
  else
    say "skipped: cannot mount a tmpfs here (needs root)"
  fi

  say "files: resave (checkpoint save) over an existing file and onto a full tmpfs"
  python3 - "$work/ck.safetensors" <<'PY'
import json, struct, sys
data = bytes(i * 7 % 251 for i in range(6 << 20))
h = json.dumps({"w": {"dtype": "U8", "shape": [6 << 20], "data_offsets": [0, len(data)]}}).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
  echo keep >"$work/kept"
  rc=0
  bounded 60 "$gdpath" resave "$work/ck.safetensors" "$work/kept" --host 2>"$work/err" || rc=$?
  [[ $rc == 1 ]] || fail "resave onto an existing file without --overwrite: status $rc"
  [[ $(cat "$work/kept") == keep ]] || fail "resave without --overwrite changed the file"
  mkdir "$work/tiny"
  if mount -t tmpfs -o size=4m tmpfs "$work/tiny" 2>/dev/null; then
    cleanup+=("umount $work/tiny")
    echo old >"$work/tiny/model.safetensors"
    rc=0
    bounded 60 "$gdpath" resave "$work/ck.safetensors" "$work/tiny/model.safetensors" --host \
      --overwrite 2>"$work/err" || rc=$?
    [[ $rc == 1 ]] || fail "resave onto a 4 MiB tmpfs: status $rc"
    grep -q "no space left for $work/tiny/model.safetensors" "$work/err" ||
      fail "resave ENOSPC message: $(cat "$work/err")"
    [[ $(cat "$work/tiny/model.safetensors") == old ]] || fail "resave changed the old checkpoint"
    if ls -A "$work/tiny" | grep -q gdpath-tmp; then fail "temporaries left: $(ls -A "$work/tiny")"; fi
  else
    say "skipped: cannot mount a tmpfs here (needs root)"
  fi

  say "files: closed and full stdout"
  rc=0
  bounded 60 "$gdpath" topo | (exec 0<&-; sleep 1) || rc=$?
  [[ $rc == 0 ]] || fail "gdpath topo | (exec 0<&-; sleep 1): status $rc"
  rc=0
  bounded 60 "$gdpath" doctor --snapshot assets/snapshots/h200x2.tar.gz >/dev/null || rc=$?
  verdict=$rc
  rc=0
  bounded 60 "$gdpath" doctor --snapshot assets/snapshots/h200x2.tar.gz | (exec 0<&-; sleep 1) ||
    rc=$?
  [[ $rc == "$verdict" ]] || fail "doctor into a closed pipe: status $rc, its verdict is $verdict"
  rc=0
  bounded 60 "$gdpath" doctor >/dev/full 2>"$work/err" || rc=$?
  [[ $rc == 3 ]] || fail "gdpath doctor > /dev/full: status $rc"
  grep -q "cannot write to stdout" "$work/err" || fail "doctor > /dev/full says: $(cat "$work/err")"
  rc=0
  bounded 60 "$gdpath" p2p --json --snapshot assets/snapshots/h200x2.tar.gz 2>"$work/err" |
    head -c 800 >/dev/null || rc=$?
  [[ $rc == 0 ]] || fail "p2p --json | head -c 800: status $rc"
  if grep -q panicked "$work/err"; then fail "p2p --json | head -c 800 panicked"; fi
}

blocks=("$@")
((${#blocks[@]})) || blocks=(files)
for b in "${blocks[@]}"; do
  if ! declare -F "block_$b" >/dev/null; then
    say "no block '$b' (blocks: files)"
    exit 2
  fi
  "block_$b"
done
say "$failures failure(s) in $((SECONDS - started)) s"
((failures == 0))
