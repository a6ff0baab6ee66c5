#!/usr/bin/env bash
# Fault suite (issue 21): faults and bad input end cleanly, destroy nothing and hang nowhere.
# CI runs it (.ci/run) as root; without root the checks that need it (a loop device, a tmpfs)
# print why they skip. Every step runs under `timeout`, and the whole suite under
# FAULT_SUITE_LIMIT seconds (default 900), so a hang fails CI instead of stalling it.
#
# Blocks, each self-contained (a helper adding a block keeps to this shape):
#   files   devices, FIFOs, full file systems, interrupts, closed/full stdout, arguments,
#           checkpoint saves (resave: kills, a full tmpfs, an existing file), symbolic links
#           another user planted in a sticky directory (at the end of the path or as one of its
#           directories), another user's file there, magic links of /proc, names swapped and
#           directories renamed mid-write (the debug build's GDPATH_TEST_HOOK pause point),
#           owners and group bits kept by a replacement (cargo test --test faults, then the
#           issue's own command lines in a shell)
#   network serve and bench net against raw sockets, floods, kills and signals, and where UCX's
#           own port listens; a connect's phases and bounds, a reconnect after closing a peer
#           whose regions are alive (cargo test --test net_faults, gdpath's net_garbage and
#           net_loopback's reconnect, then the issues' command lines in a shell: a loopback
#           serve listens on loopback only, a garbage flood leaves serve's stdout small, a
#           tokenless serve says who can read and write its memory)
#   inputs  hostile topology input: deep and huge XML, /dev/zero, FIFOs, device-count bounds,
#           many flat GPUs, repeated bus ids (gdpath-topo's input_limits, gdpath-cli's
#           topo_scale, then the same through `gdpath topo`, `doctor`, `report` and `p2p`);
#           terminal escapes in tensor names (`load --tensors`), a snapshot's osrelease
#           (`doctor --verbose`) and an index's weight_map (the error): printed escaped
#   nccl    hostile NCCL logs (gdpath-nccl's fixtures test, then `gdpath nccl` and
#           `report --nccl-log`): 10^6 lines, a 1 GiB sparse file over the 256 MiB cap, binary,
#           a FIFO, /dev/zero, a directory, a loop of links, an unreadable file: bounded time,
#           a clear error or a truncation finding, no panic
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

  say "files: a link nobody planted in a sticky directory is not followed; a replaced file keeps its owner"
  if [[ $(id -u) == 0 ]] && command -v setpriv >/dev/null; then
    chmod o+x "$work" # nobody reaches the sticky directory through it
    mkdir -m 755 "$work/links"
    mkdir -m 1777 "$work/links/S"
    printf 'root secret\n' >"$work/links/P"
    chmod 600 "$work/links/P"
    cp -p "$work/links/P" "$work/links/P.ref"
    setpriv --reuid=65534 --regid=65534 --clear-groups ln -s "$work/links/P" "$work/links/S/model.safetensors" ||
      fail "nobody could not plant a link in $work/links/S"
    ln -s "$work/links/P" "$work/links/S/report.html"
    chown -h 65534:65534 "$work/links/S/report.html" # planted by nobody, as the issue's report
    ln -s "$work/links/P" "$work/links/S/own.html"     # root's own: followed
    head -c $((1 << 20)) /dev/urandom >"$work/links/src"
    for line in \
      "copy $work/links/src $work/links/S/model.safetensors --overwrite" \
      "resave $work/ck.safetensors $work/links/S/model.safetensors --host --overwrite" \
      "report -o $work/links/S/report.html --overwrite --snapshot assets/snapshots/h200x2.tar.gz" \
      "topo capture -o $work/links/S/model.safetensors --overwrite"; do
      cp -p "$work/links/P.ref" "$work/links/P"
      rc=0
      # shellcheck disable=SC2086 # the line is split into its words on purpose
      bounded 60 "$gdpath" $line >"$work/out" 2>"$work/err" || rc=$?
      [[ $rc == 1 ]] || fail "gdpath $line: status $rc (0: it wrote through nobody's link)"
      grep -q "protected_symlinks" "$work/err" || fail "gdpath $line says: $(cat "$work/err")"
      cmp -s "$work/links/P" "$work/links/P.ref" || fail "gdpath $line changed root's file"
    done
    if ls -A "$work/links/S" | grep -q gdpath-tmp; then fail "temporaries left: $(ls -A "$work/links/S")"; fi
    rc=0
    bounded 60 "$gdpath" report -o "$work/links/S/own.html" --overwrite \
      --snapshot assets/snapshots/h200x2.tar.gz >"$work/out" 2>"$work/err" || rc=$?
    [[ $rc == 0 ]] || fail "report -o through root's own link: status $rc: $(cat "$work/err")"
    grep -q "(the file $work/links/P it links to)" "$work/out" || fail "report -o own link says: $(cat "$work/out")"
    head -c 100 /dev/urandom >"$work/links/theirs"
    chown 65534:65534 "$work/links/theirs"
    chmod 640 "$work/links/theirs"
    rc=0
    bounded 60 "$gdpath" copy "$work/links/src" "$work/links/theirs" --overwrite >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 0 ]] || fail "copy --overwrite onto nobody's file: status $rc: $(cat "$work/err")"
    [[ $(stat -c %u:%g:%a "$work/links/theirs") == 65534:65534:640 ]] ||
      fail "copy --overwrite onto nobody:nogroup 640 left $(stat -c %U:%G:%a "$work/links/theirs")"
    cmp -s "$work/links/src" "$work/links/theirs" || fail "copy --overwrite: wrong content"

    say "files: the hostile tester's second round (links in directories, swaps mid-write, others' files, /proc)"
    nobody="setpriv --reuid=65534 --regid=65534 --clear-groups"
    L=$work/links
    # 3: nobody's link as a directory of the path, and root's link whose text goes through it.
    $nobody ln -s "$L" "$L/S/sub"
    ln -s sub/P "$L/S/rl2"
    for t in "$L/S/sub/P" "$L/S/rl2"; do
      cp -p "$L/P.ref" "$L/P"
      rc=0
      bounded 60 "$gdpath" copy "$L/src" "$t" --overwrite >/dev/null 2>"$work/err" || rc=$?
      [[ $rc == 1 ]] || fail "copy src $t --overwrite: status $rc (0: it wrote through nobody's directory link)"
      grep -q "$L/S/sub: a symbolic link owned by uid 65534" "$work/err" || fail "copy src $t says: $(cat "$work/err")"
      cmp -s "$L/P" "$L/P.ref" || fail "copy src $t changed root's file"
    done
    # 4: nobody's file in the sticky directory is not replaced with --overwrite.
    $nobody sh -c "echo x > $L/S/rep.html; chmod 666 $L/S/rep.html"
    rc=0
    bounded 60 "$gdpath" copy "$L/src" "$L/S/rep.html" --overwrite >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 1 ]] || fail "copy onto nobody's S/rep.html --overwrite: status $rc"
    grep -q "protected_regular" "$work/err" || fail "copy onto nobody's file says: $(cat "$work/err")"
    [[ $(cat "$L/S/rep.html") == x ]] || fail "nobody's S/rep.html was replaced"
    # 4: an existing empty file needs --overwrite for a write bench.
    : >"$work/empty"
    rc=0
    bounded 60 "$gdpath" bench storage --file "$work/empty" --write --size 1MiB >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 1 && ! -s $work/empty ]] || fail "bench storage --write on an empty file without --overwrite: status $rc"
    # 1: the bench's file in nobody's directory swapped for a link to root's file once it is
    # open (the debug build's pause point): root's file stays.
    mkdir "$L/nd" && chown 65534:65534 "$L/nd"
    $nobody sh -c "head -c 1048576 /dev/urandom > $L/nd/bench.dat"
    cp -p "$L/P.ref" "$L/P"
    rc=0
    GDPATH_TEST_HOOK="[ \"\$1\" = in-place ] || exit 0; $nobody sh -c 'ln -s $L/P $L/nd/evil && mv -T $L/nd/evil $L/nd/bench.dat'" \
      bounded 60 "$gdpath" bench storage --file "$L/nd/bench.dat" --write --overwrite --size 1MiB \
      --block 256KiB,512KiB --runs 2 --buffered >/dev/null 2>"$work/err" || rc=$?
    [[ -L $L/nd/bench.dat ]] || fail "bench storage in place: the pause point did not run (a release build?)"
    [[ $rc == 0 ]] || fail "bench storage in place, name swapped: status $rc: $(cat "$work/err")"
    cmp -s "$L/P" "$L/P.ref" || fail "bench storage in place wrote root's file through the swapped name"
    # 2: no /proc (named temporaries), the target's directory swapped once the temporary exists.
    if unshare -m sh -c 'umount -l /proc' 2>/dev/null; then
      mkdir "$L/d2" && chown 65534:65534 "$L/d2" && mkdir "$L/d2/e"
      rc=0
      GDPATH_TEST_HOOK="[ \"\$1\" = created ] || exit 0; n=\$(ls -A $L/d2/e | grep gdpath-tmp) || exit 0; $nobody sh -c \"mv $L/d2/e $L/d2/e.old && mkdir $L/d2/e && ln -s $L/P $L/d2/e/\$n\"" \
        bounded 60 unshare -m sh -c 'umount -l /proc && exec "$0" "$@"' "$gdpath" bench storage \
        --file "$L/d2/e/bench.dat" --write --size 1MiB --block 256KiB --runs 1 >/dev/null 2>"$work/err" || rc=$?
      [[ $rc == 0 ]] || fail "bench storage without /proc, directory swapped: status $rc: $(cat "$work/err")"
      cmp -s "$L/P" "$L/P.ref" || fail "bench storage without /proc wrote root's file through the swapped directory"
      [[ -s $L/d2/e.old/bench.dat ]] || fail "bench storage without /proc: no file in the directory it checked"
    else
      say "skipped: cannot unmount /proc in a mount namespace here"
    fi
    # 5: magic links of /proc.
    echo KEEP >"$work/k2"
    rc=0
    bounded 60 "$gdpath" copy "$L/src" /dev/stdout --overwrite >>"$work/k2" 2>"$work/err" || rc=$?
    [[ $rc == 1 && $(cat "$work/k2") == KEEP ]] || fail "copy src /dev/stdout --overwrite >> k2: status $rc, k2: $(head -c 40 "$work/k2")"
    grep -q "magic link of /proc" "$work/err" || fail "copy src /dev/stdout says: $(cat "$work/err")"
    ln -s /proc/self/cwd/t2 "$work/through-cwd"
    rc=0
    bounded 60 "$gdpath" copy "$L/src" "$work/through-cwd" --overwrite >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 1 ]] && grep -q "magic link of /proc" "$work/err" && ! grep -q "Too many levels" "$work/err" ||
      fail "copy src through-cwd (-> /proc/self/cwd/t2): status $rc: $(cat "$work/err")"
    # 6: a hostile link name is printed escaped.
    hostile=$(printf '%s/S/ev\033[31mRED\nfake: ok\r' "$L")
    $nobody ln -s "$L/P" "$hostile"
    rc=0
    bounded 60 "$gdpath" copy "$L/src" "$hostile" --overwrite >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 1 ]] || fail "copy onto a hostile link name: status $rc"
    if grep -q $'\033' "$work/err" || grep -q $'\r' "$work/err"; then fail "a raw ESC or CR in: $(cat -v "$work/err")"; fi
    grep -qF 'ev\u{1b}[31mRED\nfake: ok\r' "$work/err" || fail "the hostile name is not escaped: $(cat -v "$work/err")"
    # 7: nobody replacing root's 0664 file in nobody's directory keeps no group bits.
    printf old >"$L/nd/roots"
    chmod 664 "$L/nd/roots"
    cp "$L/src" "$L/nd/src2"
    rc=0
    $nobody "$gdpath" copy "$L/nd/src2" "$L/nd/roots" --overwrite >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 0 && $(stat -c %u:%g:%a "$L/nd/roots") == 65534:65534:604 ]] ||
      fail "nobody's copy over root's 0664 file: status $rc, $(stat -c %u:%g:%a "$L/nd/roots")"
    # 7: a directory raced in at the target's name: the error names the target.
    printf old >"$work/race"
    rc=0
    GDPATH_TEST_HOOK="[ \"\$1\" = created ] && rm $work/race && mkdir $work/race" \
      bounded 60 "$gdpath" copy "$L/src" "$work/race" --overwrite >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 1 ]] && grep -q "rename $work/race at offset 0" "$work/err" ||
      fail "a directory raced in: status $rc: $(cat "$work/err")"
  else
    say "skipped: planting a link as another user needs root and setpriv"
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

# Starts `gdpath serve ARGS` with stdout into $1 (the rest: its arguments) and waits up to 30 s
# for it to listen: sets serve_pid and serve_addr, or fails and returns 1.
start_serve() {
  local out=$1
  shift
  "$gdpath" serve "$@" >"$out" 2>"$out.err" &
  serve_pid=$!
  cleanup+=("kill $serve_pid 2>/dev/null")
  serve_addr=
  local i
  for ((i = 0; i < 300; i++)); do
    serve_addr=$(sed -n 's/^gdpath serve: listening on \([^ ]*\) .*/\1/p' "$out" 2>/dev/null)
    [[ -n $serve_addr ]] && return 0
    kill -0 "$serve_pid" 2>/dev/null || break
    sleep 0.1
  done
  fail "serve $* did not listen: $(cat "$out.err")"
  return 1
}

# The local addresses process $1 listens on over TCP (`ss`), one a line.
listening_of() {
  ss -Htlnp 2>/dev/null | awk -v pid="pid=$1," 'index($0, pid) { print $4 }'
}

block_network() {
  say "network: cargo test --test net_faults (gdpath-cli) and --test net_garbage (gdpath)"
  bounded 600 cargo test --locked -p gdpath-cli --test net_faults --quiet ||
    fail "crates/gdpath-cli/tests/net_faults.rs"
  bounded 300 cargo test --locked -p gdpath --test net_garbage --quiet ||
    fail "crates/gdpath/tests/net_garbage.rs"
  say "network: a reconnect after closing a peer whose regions are alive (gdpath net_loopback)"
  bounded 300 cargo test --locked -p gdpath --test net_loopback --quiet \
    a_closed_peer_with_a_live_region_holds_up_no_reconnect ||
    fail "net_loopback a_closed_peer_with_a_live_region_holds_up_no_reconnect"

  # The issue's command lines, as a user types them.
  say "network: serve on 127.0.0.1 without --devices listens on loopback only (ss)"
  if ! command -v ss >/dev/null || ! command -v ip >/dev/null; then
    say "skipped: ss or ip (iproute2) is missing"
  elif [[ -z $(ip -4 -o addr show scope global 2>/dev/null) ]]; then
    say "skipped: no non-loopback IPv4 interface here, so nothing to leave out"
  elif start_serve "$work/lo.out" --listen 127.0.0.1:0 --export host:16MiB --duration 60; then
    local ports
    ports=$(listening_of "$serve_pid")
    (($(wc -l <<<"$ports") >= 2)) || fail "no UCX port found beside gdpath's: $ports"
    if grep -Ev '^(127\.|\[::1\]:)' <<<"$ports"; then
      fail "serve on $serve_addr listens beyond loopback: $(tr '\n' ' ' <<<"$ports")"
    fi
    kill -INT "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
  fi

  say "network: a tokenless serve says that any local user can read and write its memory"
  bounded 30 env -u GDPATH_TOKEN "$gdpath" serve --listen 127.0.0.1:0 --devices lo \
    --export host:1MiB --duration 0.2 >"$work/notoken.out" 2>"$work/err" ||
    fail "serve without a token: $(cat "$work/err")"
  grep -q '^gdpath serve: listening on .*no token: any local user can connect and read and write the exported memory; .*--token-file' \
    "$work/notoken.out" || fail "the tokenless start line says no more than: $(head -1 "$work/notoken.out")"

  say "network: a garbage flood leaves serve's stdout small, and a client verifies after"
  if start_serve "$work/flood.out" --listen 127.0.0.1:0 --devices lo --export host:16MiB \
    --duration 120; then
    local host=${serve_addr%:*} port=${serve_addr##*:} n=0 end=$((SECONDS + 3))
    while ((SECONDS < end)); do
      if exec {c}<>"/dev/tcp/$host/$port"; then
        printf '\xff%.0s' {1..16} >&"$c" 2>/dev/null || true
        exec {c}<&-
        n=$((n + 1))
      fi
    done 2>/dev/null
    say "$n garbage connections"
    bounded 60 "$gdpath" bench net --peer "$serve_addr" --devices lo --size 4KiB --runs 1 \
      --bytes-per-run 1MiB --json >"$work/bench.json" 2>"$work/err" ||
      fail "bench net after the flood: $(cat "$work/err")"
    grep -q '"verified": true' "$work/bench.json" || fail "bench net after the flood: not verified"
    kill -INT "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
    local bytes errbytes
    bytes=$(wc -c <"$work/flood.out")
    errbytes=$(wc -c <"$work/flood.out.err")
    ((n >= 100)) || fail "only $n connections: no flood to speak of"
    ((bytes < 4096)) || fail "serve wrote $bytes bytes of stdout for $n garbage connections"
    ((errbytes < 4096)) || fail "serve wrote $errbytes bytes of stderr for $n garbage connections"
    grep -q '^refused: .*more connection(s) refused' "$work/flood.out" ||
      fail "no count of the refusals left out: $(head -c 2000 "$work/flood.out")"
  fi
}

block_inputs() {
  say "inputs: cargo test --test input_limits (gdpath-topo)"
  bounded 300 cargo test --locked -p gdpath-topo --test input_limits --quiet ||
    fail "crates/gdpath-topo/tests/input_limits.rs"

  # The issue's command lines, as a user types them.
  say "inputs: deep NCCL XML to topo and doctor, /dev/zero to every reader"
  {
    echo '<system version="1"><cpu numaid="0" affinity="ff">'
    for ((i = 0; i < 10000; i++)); do printf '<pci busid="%04x:%02x:00.0" class="0x060400">' $((i / 256)) $((i % 256)); done
    printf '<pci busid="ffff:00:00.0"><gpu dev="0"/></pci>'
    for ((i = 0; i < 10000; i++)); do printf '</pci>'; done
    echo '</cpu></system>'
  } >"$work/deep.xml"
  local rc=0
  bounded 60 "$gdpath" topo --nccl-xml "$work/deep.xml" >/dev/null 2>"$work/err" || rc=$?
  [[ $rc == 1 ]] || fail "topo --nccl-xml (10,000 levels): status $rc (134: the stack overflowed)"
  grep -q "nested deeper than" "$work/err" || fail "deep XML to topo says: $(cat "$work/err")"
  rc=0
  bounded 60 "$gdpath" doctor --nccl-xml "$work/deep.xml" >/dev/null 2>"$work/err" || rc=$?
  [[ $rc == 3 ]] || fail "doctor --nccl-xml (10,000 levels): status $rc"
  local flag
  for flag in --nccl-xml --hwloc-xml --smi-topo --snapshot; do
    rc=0
    bounded 30 "$gdpath" topo "$flag" /dev/zero >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 1 ]] || fail "topo $flag /dev/zero: status $rc (124: it read without end)"
    grep -q "character device, not a regular file" "$work/err" ||
      fail "topo $flag /dev/zero says: $(cat "$work/err")"
  done

  say "inputs: terminal escapes in tensor names, a snapshot's osrelease and an index's weight_map"
  # A checkpoint whose tensor names clear the screen, hold a NUL and forge a line.
  python3 - "$work/hostile.safetensors" <<'PY'
import json, struct, sys
names = ["evil\x1b[2J\x1b[31mred", "nul\x00name", "line\nforged: 0 tensors"]
hdr = {n: {"dtype": "U8", "shape": [4], "data_offsets": [4 * i, 4 * i + 4]} for i, n in enumerate(names)}
h = json.dumps(hdr).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(12))
PY
  has_controls() { LC_ALL=C tr -d '\n' <"$1" | LC_ALL=C grep -q '[[:cntrl:]]'; }
  bounded 60 "$gdpath" load "$work/hostile.safetensors" --host --tensors >"$work/out" 2>"$work/err" ||
    fail "load --tensors on hostile names: $(cat "$work/err")"
  has_controls "$work/out" && fail "load --tensors printed a control character raw: $(cat -v "$work/out")"
  grep -qF 'evil\u{1b}[2J' "$work/out" || fail "load --tensors shows no escaped name: $(cat -v "$work/out")"
  # The H200 snapshot with a hostile kernel release.
  mkdir -p "$work/snap"
  tar xzf assets/snapshots/h200x2.tar.gz -C "$work/snap"
  printf '6.8.0\033[2J\033[31mFORGED\000\n' >"$work/snap/fs/proc/sys/kernel/osrelease"
  tar czf "$work/hostile-snap.tar.gz" -C "$work/snap" manifest.json driver.json fs
  rc=0
  bounded 60 "$gdpath" doctor --verbose --snapshot "$work/hostile-snap.tar.gz" >"$work/out" 2>"$work/err" || rc=$?
  [[ $rc == 2 ]] || fail "doctor --verbose on the hostile snapshot: status $rc: $(cat "$work/err")"
  has_controls "$work/out" && fail "doctor --verbose printed a control character raw: $(cat -v "$work/out")"
  grep -qF 'kernel 6.8.0\u{1b}[2J' "$work/out" || fail "doctor --verbose shows no escaped release: $(cat -v "$work/out")"
  # A NUL (and ESC) in a shard name of an index.
  printf '{"weight_map": {"w": "a\\u0000.safetensors\\u001b[2J"}}' >"$work/model.safetensors.index.json"
  rc=0
  bounded 60 "$gdpath" load "$work/model.safetensors.index.json" --host >/dev/null 2>"$work/err" || rc=$?
  [[ $rc == 1 ]] || fail "load of an index with a NUL: status $rc"
  has_controls "$work/err" && fail "the index error holds a control character raw: $(cat -v "$work/err")"
  grep -qF 'a\0.safetensors\u{1b}[2J' "$work/err" || fail "the index error says: $(cat -v "$work/err")"

  say "inputs: cargo test --test topo_scale (gdpath-cli)"
  bounded 600 cargo test --locked -p gdpath-cli --test topo_scale --quiet ||
    fail "crates/gdpath-cli/tests/topo_scale.rs"

  # Each run below: at most 60 s and 1 GiB of address space; output that grows with the GPUs.
  local n f size mem=$((1 << 30))
  for n in 500 1000 4000; do
    say "inputs: $n flat GPUs (NCCL XML) to topo, topo --json, doctor, topo --svg, report"
    f="$work/flat-$n.xml"
    {
      echo '<system version="1"><cpu numaid="0" affinity="ff">'
      for ((i = 0; i < n; i++)); do
        printf '<pci busid="%04x:%02x:00.0" class="0x030200" vendor="0x10de" device="0x2330"><gpu dev="%d"/></pci>\n' \
          $((i / 256)) $((i % 256)) "$i"
      done
      echo '</cpu></system>'
    } >"$f"
    rc=0
    bounded 60 prlimit --as=$mem "$gdpath" topo --nccl-xml "$f" >"$work/out" 2>"$work/err" || rc=$?
    [[ $rc == 0 ]] || fail "topo ($n GPUs): status $rc (124: past 60 s; 134: out of memory)"
    size=$(stat -c %s "$work/out")
    ((size <= n * 2048 + 65536)) || fail "topo ($n GPUs): $size bytes of output"
    grep -q "Pairs per class, not a matrix ($n GPUs, NICs and NVMe, more than the 256" "$work/out" ||
      fail "topo ($n GPUs) does not count its pairs: $(head -c 300 "$work/out")"
    rc=0
    bounded 60 prlimit --as=$mem "$gdpath" topo --json --nccl-xml "$f" >"$work/out" 2>"$work/err" || rc=$?
    [[ $rc == 0 ]] || fail "topo --json ($n GPUs): status $rc"
    size=$(stat -c %s "$work/out")
    ((size <= n * 2048 + 65536)) || fail "topo --json ($n GPUs): $size bytes of output"
    grep -q '"pair_classes"' "$work/out" || fail "topo --json ($n GPUs): no pair_classes"
    rc=0
    bounded 60 prlimit --as=$mem "$gdpath" doctor --nccl-xml "$f" >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 4 ]] || fail "doctor ($n GPUs): status $rc (4: nothing decided)"
    rc=0
    bounded 60 prlimit --as=$mem "$gdpath" topo --nccl-xml "$f" --svg "$work/flat.svg" >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 1 && ! -e $work/flat.svg ]] || fail "topo --svg ($n GPUs): status $rc"
    grep -q "more than the 256 gdpath draws" "$work/err" || fail "topo --svg ($n GPUs) says: $(cat "$work/err")"
    rc=0
    bounded 60 prlimit --as=$mem "$gdpath" report --nccl-xml "$f" -o "$work/flat.html" --overwrite >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 0 ]] || fail "report ($n GPUs): status $rc (124: past 60 s): $(cat "$work/err")"
    size=$(stat -c %s "$work/flat.html" 2>/dev/null || echo 0)
    ((size > 0 && size <= n * 2048 + 65536)) || fail "report ($n GPUs): a page of $size bytes"
    grep -qs "more than the 256 GPUs, NICs and NVMe gdpath draws" "$work/flat.html" ||
      fail "report ($n GPUs) does not say why it has no drawing"
  done

  say "inputs: driver facts of 4,000 GPUs to p2p and p2p --json"
  {
    printf '{"driver_version": "580.159.04", "cuda_driver_version": 13000, "pairs": [], "gpus": ['
    for ((i = 0; i < 4000; i++)); do
      ((i == 0)) || printf ','
      printf '{"ordinal": %d, "pci": "%04x:%02x:00.0", "name": "NVIDIA H100", "memory_bytes": 0, "bar1_total_bytes": null, "bar1_used_bytes": null, "pcie": null, "nvlinks": [], "gdr_supported": null, "dma_buf_supported": null}' \
        "$i" $((i / 256)) $((i % 256))
    done
    printf ']}\n'
  } >"$work/facts.json"
  local json
  for json in "" --json; do
    rc=0
    bounded 60 prlimit --as=$mem "$gdpath" p2p $json --facts "$work/facts.json" >"$work/out" 2>"$work/err" || rc=$?
    [[ $rc == 0 ]] || fail "p2p $json (4,000 GPUs): status $rc (124: past 60 s; 134: out of memory)"
    size=$(stat -c %s "$work/out")
    ((size <= 4000 * 2048 + 65536)) || fail "p2p $json (4,000 GPUs): $size bytes of output"
    grep -q "pair_counts" "$work/out" || fail "p2p $json (4,000 GPUs) does not count its pairs"
  done

  say "inputs: a PCI bus id three times in NCCL XML"
  {
    echo '<system version="1"><cpu numaid="0" affinity="ff">'
    for i in 0 1 2; do
      echo "<pci busid=\"0000:01:00.0\" class=\"0x030200\" vendor=\"0x10de\"><gpu dev=\"$i\"/></pci>"
    done
    echo '</cpu></system>'
  } >"$work/dup.xml"
  rc=0
  bounded 30 "$gdpath" topo --nccl-xml "$work/dup.xml" >/dev/null 2>"$work/err" || rc=$?
  [[ $rc == 1 ]] || fail "topo --nccl-xml (a bus id three times): status $rc"
  grep -q "PCI bus id 0000:01:00.0 appears twice (line 2 and line 3)" "$work/err" ||
    fail "repeated bus id says: $(cat "$work/err")"
}

block_nccl() {
  say "nccl: cargo test --test fixtures (gdpath-nccl: mangled, interleaved, 10^6-line logs)"
  bounded 300 cargo test --locked -p gdpath-nccl --test fixtures --quiet ||
    fail "crates/gdpath-nccl/tests/fixtures.rs"

  say "nccl: hostile logs through gdpath nccl (10^6 lines, 1 GiB sparse, FIFO, /dev/zero, binary, a directory, a link loop, an unreadable file)"
  local rc
  # 10^6 connection lines of 5000 ranks: read whole, within the caps, in bounded time.
  awk 'BEGIN { for (i = 0; i < 1000000; i++) printf "h%d:1:2 [0] NCCL INFO Channel %02d/0 : %d[0] -> %d[1] via NET/IB/0/GDRDMA\n", i % 7, i % 32, i % 5000, (i + 1) % 5000 }' >"$work/million.log"
  rc=0
  bounded 120 "$gdpath" nccl "$work/million.log" >"$work/out" 2>"$work/err" || rc=$?
  [[ $rc == 0 ]] || fail "nccl on 10^6 lines: status $rc: $(head -c 2000 "$work/err")"
  grep -q "1000000 lines" "$work/out" || fail "nccl on 10^6 lines says: $(head -5 "$work/out")"
  # A sparse 1 GiB file: the first 256 MiB are read, and the cut is a finding.
  truncate -s 1G "$work/sparse.log"
  rc=0
  bounded 60 "$gdpath" nccl "$work/sparse.log" >"$work/out" 2>"$work/err" || rc=$?
  [[ $rc == 0 ]] || fail "nccl on a 1 GiB sparse file: status $rc: $(cat "$work/err")"
  grep -q "nccl.log-truncated" "$work/out" || fail "nccl on 1 GiB says no truncation: $(cat "$work/out")"
  # Binary: read lossily, printed escaped.
  head -c $((4 << 20)) /dev/urandom >"$work/binary.log"
  rc=0
  bounded 60 "$gdpath" nccl "$work/binary.log" --verbose >"$work/out" 2>"$work/err" || rc=$?
  [[ $rc == 0 ]] || fail "nccl on binary: status $rc: $(cat "$work/err")"
  LC_ALL=C tr -d '\n' <"$work/out" | LC_ALL=C grep -q '[[:cntrl:]]' && fail "nccl printed a control character raw"
  # What is no regular file is refused before it is opened (a FIFO with no writer would block).
  mkfifo "$work/fifo.log"
  mkdir "$work/dir.log"
  ln -s loop-b "$work/loop-a"
  ln -s loop-a "$work/loop-b"
  local bad want
  for bad in "$work/fifo.log:a FIFO, not a regular file" "/dev/zero:a character device, not a regular file" \
    "$work/dir.log:a directory, not a regular file" "$work/loop-a:Too many levels of symbolic links"; do
    want=${bad#*:}
    rc=0
    bounded 30 "$gdpath" nccl "${bad%%:*}" >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 1 ]] || fail "nccl ${bad%%:*}: status $rc (124: it blocked)"
    grep -qF "$want" "$work/err" || fail "nccl ${bad%%:*} says: $(cat "$work/err")"
  done
  # The same refusal through the report.
  rc=0
  bounded 60 "$gdpath" report --smi-topo fixtures/nvidia-smi/topo-nccl-1617-4xh100-nv6-4nic.txt \
    --nccl-log "$work/fifo.log" -o "$work/nccl-report.html" >/dev/null 2>"$work/err" || rc=$?
  [[ $rc == 1 ]] || fail "report --nccl-log FIFO: status $rc"
  [[ -e "$work/nccl-report.html" ]] && fail "report --nccl-log FIFO wrote a page"
  # Unreadable: root reads every file, so this runs as another user where one can be taken.
  echo "NCCL INFO NCCL version 2.21.5" >"$work/secret.log"
  chmod 000 "$work/secret.log"
  if ((EUID != 0)); then
    rc=0
    bounded 30 "$gdpath" nccl "$work/secret.log" >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 1 ]] && grep -q "Permission denied" "$work/err" || fail "nccl on an unreadable file: status $rc: $(cat "$work/err")"
  elif command -v setpriv >/dev/null && cp "$gdpath" "$work/gdpath-copy" && chmod 755 "$work" "$work/gdpath-copy"; then
    rc=0
    bounded 30 setpriv --reuid=65534 --regid=65534 --clear-groups "$work/gdpath-copy" nccl "$work/secret.log" >/dev/null 2>"$work/err" || rc=$?
    [[ $rc == 1 ]] && grep -q "Permission denied" "$work/err" || fail "nccl on an unreadable file (as nobody): status $rc: $(cat "$work/err")"
  else
    say "nccl: SKIP the unreadable file: running as root without setpriv, and root reads any file"
  fi
}

blocks=("$@")
((${#blocks[@]})) || blocks=(files network inputs nccl)
for b in "${blocks[@]}"; do
  if ! declare -F "block_$b" >/dev/null; then
    say "no block '$b' (blocks: files network inputs nccl)"
    exit 2
  fi
  "block_$b"
done
say "$failures failure(s) in $((SECONDS - started)) s"
((failures == 0))
