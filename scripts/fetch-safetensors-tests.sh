#!/usr/bin/env bash
# Fetches safetensors' own Python test suite (bindings/python/tests of the safetensors 0.8.0
# source distribution on PyPI), which crates/gdpath-py/tests/test_st_upstream.py runs against
# gdpath.safetensors. The tests are not copied into this repository: they are downloaded here.
#
# Usage: scripts/fetch-safetensors-tests.sh [DEST]
#   prints the path of the extracted tests directory on stdout.
#   DEST (default .carry/safetensors-sdist, git-ignored): where the sdist's tests are extracted;
#   the lead carries this folder to the GPU machine, which has no network.
# Cache: ${GDPATH_CACHE:-$HOME/.cache/gdpath}/safetensors-0.8.0.tar.gz, checked by SHA-256
#        (nothing is downloaded when it is there with the expected digest).
# Needs: python3 with pip and access to PyPI. Exit status: 0 with the path printed; non-zero
# with the reason on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

version="0.8.0"
want_sha="fabaf3e0f18a6618d9b36560682562157f77c2b71fcffc7b432be2baed9d753d"
cache="${GDPATH_CACHE:-$HOME/.cache/gdpath}"
sdist="$cache/safetensors-$version.tar.gz"
dest="${1:-.carry/safetensors-sdist}"
py="${PYTHON:-python3}"
command -v "$py" >/dev/null || { echo "fetch-safetensors-tests: $py not found" >&2; exit 2; }

sha_of() { "$py" -c 'import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }

if [[ ! -f "$sdist" ]] || [[ "$(sha_of "$sdist")" != "$want_sha" ]]; then
    mkdir -p "$cache"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    "$py" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
        -d "$tmp" "safetensors==$version" >&2
    got="$(sha_of "$tmp/safetensors-$version.tar.gz")"
    if [[ "$got" != "$want_sha" ]]; then
        echo "fetch-safetensors-tests: safetensors-$version.tar.gz has SHA-256 $got, expected $want_sha" >&2
        exit 1
    fi
    mv "$tmp/safetensors-$version.tar.gz" "$sdist"
fi
rm -rf "$dest/tests"
mkdir -p "$dest"
tar -xzf "$sdist" -C "$dest" --strip-components=3 "safetensors-$version/bindings/python/tests"
(cd "$dest/tests" && pwd)
