#!/usr/bin/env bash
# Everything the GPU machine is needed for, in one device call of under 10 minutes (run E in
# docs/benchmarks.md): the GPU suite, the Python suite with the wheel, `gdpath report --measure`,
# the Python checkpoint loaders (issue 23), storage parts a, c and d (issue 24), then, when
# their binaries are there, experiments: `bench h2d/d2h` of EXP/gdpath-* beside the suite's
# gdpath (a constant changed, two interleaved rounds), a tmpfs -> GPU threads x chunk sweep,
# and `kv_copy` launch-shape sweeps. Every step gets a timeout that keeps the whole under 560 s;
# results go to /tmp/res, packed as $OUT/res.tgz (the device returns at most 8 files).
#
# Here (carry the .devbin paths named):
#   scripts/build-gpu-suite.sh .devbin/suite                      # the suite and gdpath
#   maturin build --release --zig --compatibility manylinux_2_28 -m crates/gdpath-py/Cargo.toml \
#       --out .devbin/pywheel                                      # docs/python.md
#   .devbin/ucx: libucx-cu13's lib/ (libucp, libuct, libucs, libucm, ucx/*.so.0, stripped)
#   .devbin/wheels: the peers' wheels (bench/device-storage.sh says which)
#   .devbin/exp (optional): gdpath-NAME (a build with one constant changed), kv_copy
#   tar cf - suite exp | xz > .devbin/bin.tar.xz                   # from .devbin: 24 MB -> 7 MB
# There:  bench/device-all.sh .devbin
set -u -o pipefail
D=$(cd "${1:?usage: device-all.sh DEVBIN}" && pwd); R=/tmp/res; mkdir -p $R
OUT=${OUT:-$R}
S=$(date +%s)
step() { echo "[$(( $(date +%s) - S )) s] ### $*"; }
# Seconds a step may take: at most $1, and never past 560 s from the start.
lim() { local l=$(( 560 - ($(date +%s) - S) )); [ $l -lt $1 ] && echo $l || echo $1; }
ok() { [ "$(lim 999)" -gt "${1:-20}" ]; }
[ -f $D/bin.tar.xz ] && tar xJf $D/bin.tar.xz -C $D
export GDPATH_UCX_LIB=$D/ucx/libucx/lib/libucp.so.0 GDPATH_BIN=$D/suite/gdpath PYTHONUNBUFFERED=1
PY=${PY:-/opt/torch/.venv/bin/python}
date -u; nvidia-smi -L
step suite
timeout "$(lim 200)" scripts/gpu-suite.sh $D/suite > $R/suite.log 2>&1; echo "suite rc=$?"
grep -E '^(===|test result|gpu-suite)|FAILED|panicked' $R/suite.log
$PY -m pip install -q --no-index --no-deps --target /tmp/site $D/wheels/*.whl $D/pywheel*/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
step pytest
(cd crates/gdpath-py && timeout "$(lim 110)" $PY -m pytest -q -p no:cacheprovider tests > $R/pytest.log 2>&1; echo "pytest rc=$?"); tail -2 $R/pytest.log
step report
timeout "$(lim 60)" $GDPATH_BIN report --measure -o $OUT/report-h200.html --path /dev/shm > $R/report.log 2>&1; echo "report rc=$?"
if ok 60; then step python loaders
  timeout "$(lim 150)" $PY bench/python_load.py --runs-tmpfs 3 --runs-disk 0 --gdpath-bin $GDPATH_BIN --json $R/python_load.json > $R/pyload.log 2>&1; echo "pyload rc=$?"
  grep -E '^tmpfs|pinned|setup' $R/pyload.log | cut -c1-220
fi
if ok 60; then step storage a, c, d
  SKIP=tests,b OUT=$R timeout "$(lim 150)" bench/device-storage.sh $D/suite > $R/storage.log 2>&1; echo "storage rc=$?"
  grep -E '^ +\(|^\(' $R/storage.log | cut -c1-200
fi
shopt -s nullglob
exp=($D/exp/gdpath-*)
if [ ${#exp[@]} -gt 0 ] && ok 40; then step "pageable copies: suite's gdpath beside ${exp[*]##*/}"
  for round in 1 2; do for b in $D/suite/gdpath "${exp[@]}"; do for dir in h2d d2h; do
    ok 10 && timeout "$(lim 30)" $b bench $dir --gpus 0 --sizes 256KiB,512KiB,1MiB,2MiB,4MiB,16MiB --runs 20 --json > $R/pg-$round-$(basename $b)-$dir.json 2>>$R/pg.err || echo "pg failed: $round $b $dir"
  done; done; done
fi
if ok 40; then step tmpfs to GPU sweep
  timeout "$(lim 80)" $D/suite/gdpath bench storage --gpu 0 --file /dev/shm/f4g --size 4GiB --path staged --threads 12,16,24 --block 2MiB,4MiB,8MiB --runs 3 --json > $R/sweep.json 2> $R/sweep.err; echo "sweep rc=$?"
  ok 20 && timeout "$(lim 40)" $D/suite/gdpath bench storage --gpu 0 --file /dev/shm/f4g --size 4GiB --json > $R/sweep-default.json 2>> $R/sweep.err
  rm -f /dev/shm/f4g
fi
if [ -x $D/exp/kv_copy ] && ok 30; then step kv_copy launch shapes
  for a in "--blocks-per-sm 1" "--blocks-per-sm 2" "--blocks-per-sm 3" "--blocks-per-sm 4" "--threads 512" "--threads 128"; do
    ok 10 && timeout "$(lim 30)" $D/exp/kv_copy --shapes d2h,h2d --methods kernel --runs 5 $a > "$R/kvc-${a// /_}.txt" 2>&1
  done
fi
if ok 15; then step cudaMalloc of the checkpoint size
  timeout "$(lim 30)" $PY - > $R/malloc.txt 2>&1 <<'EOF'
import cupy, time
cupy.cuda.runtime.deviceSynchronize()
for i in range(4):
    t = time.perf_counter(); m = cupy.cuda.Memory(9080955552); cupy.cuda.runtime.deviceSynchronize(); a = time.perf_counter() - t
    t = time.perf_counter(); del m; cupy.cuda.runtime.deviceSynchronize(); b = time.perf_counter() - t
    print(f"cudaMalloc 9.08 GB {a*1e3:.1f} ms, cudaFree {b*1e3:.1f} ms")
EOF
  cat $R/malloc.txt
fi
step done
[ "$OUT" != "$R" ] && tar czf $OUT/res.tgz -C /tmp res
exit 0
