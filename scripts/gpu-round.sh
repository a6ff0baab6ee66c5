#!/usr/bin/env bash
# Everything a GPU machine checks, in one device call: the GPU test suite, the Python tests that
# need torch or a GPU (the safetensors drop-in, its upstream suite, transformers, gdpath.nixl over
# a CUDA-enabled UCX, the metrics collector) and the two drop-in benchmarks with their peers.
# Device calls are few and their starts slow, so this runs it all and keeps going past a failure;
# each part's output goes to $OUT/<part>.log and a summary line per part to stdout.
#
# Build and stage here (docs/benchmarks.md, "How to run on the GPU machine", says what each is):
#   scripts/build-gpu-suite.sh .devbin/suite            # test binaries and gdpath
#   maturin build --release ... --out .whl              # the wheel (docs/python.md)
#   .carry/ucx/ucx-cu13-slim.tar.xz                     # libucx-cu13's libraries, for gdpath.nixl
#   .carry/safetensors-sdist (scripts/fetch-safetensors-tests.sh), .carry/peers-it (peers' wheels)
# Run there, from the repository root:
#   scripts/gpu-round.sh SUITE_DIR [--rounds N]
# Env: OUT (results; default /tmp/gpu-round), GDPATH_MINILM (the MiniLM checkpoint, if carried).
# Exit status: 0 when every part passed.
set -u -o pipefail
suite=${1:?usage: gpu-round.sh SUITE_DIR [--rounds N]}
shift
rounds=3
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=${2:?--rounds N}; shift 2 ;;
        *) echo "gpu-round: unknown argument $1" >&2; exit 2 ;;
    esac
done
out=${OUT:-/tmp/gpu-round}
mkdir -p "$out"
export GDPATH_BIN="$PWD/$suite/gdpath"
[ -x "$GDPATH_BIN" ] || GDPATH_BIN="$suite/gdpath"
fail=0
part() {
    local name=$1
    shift
    local t0=$SECONDS
    if "$@" >"$out/$name.log" 2>&1; then
        echo "gpu-round: $name passed ($((SECONDS - t0)) s)"
    else
        echo "gpu-round: $name FAILED ($((SECONDS - t0)) s): $(tail -n 3 "$out/$name.log" | tr '\n' ' ')"
        fail=1
    fi
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu-round: /'

# The CUDA-enabled UCX for gdpath.nixl between processes (the machine's UCX has no CUDA).
if [ -f .carry/ucx/ucx-cu13-slim.tar.xz ]; then
    mkdir -p /tmp/ucx && tar -xJf .carry/ucx/ucx-cu13-slim.tar.xz -C /tmp/ucx
    # Its libraries find each other and libucx_cu13.libs/ through their RPATH ($ORIGIN).
    export GDPATH_UCX_LIB=/tmp/ucx/libucx/lib/libucp.so.0
fi
# The wheel and the peers' wheels, each in a folder of its own for PYTHONPATH.
site=/tmp/gpu-round-site peers=/tmp/gpu-round-peers
rm -rf "$site" "$peers"
part install-wheel python3 -m pip install -q --no-deps --target "$site" .whl/*.whl
if ls .carry/peers-it/*.whl >/dev/null 2>&1; then
    part install-peers python3 -m pip install -q --no-deps --target "$peers" .carry/peers-it/*.whl
fi

part suite scripts/gpu-suite.sh "$suite"
part pytest env PYTHONPATH="$site" python3 -m pytest -q -rs -p no:cacheprovider crates/gdpath-py/tests
part safetensors-dropin env PYTHONPATH="$site:$peers" \
    python3 bench/safetensors_dropin.py --rounds "$rounds" --out "$out/safetensors_dropin.json"
part nixl-api sh -c "PYTHONPATH='$site' python3 bench/nixl_api.py --runs '$rounds' > '$out/nixl_api.jsonl'"
if [ $fail -ne 0 ]; then echo "gpu-round: FAILED (logs in $out)" >&2; else echo "gpu-round: all passed"; fi
exit $fail
