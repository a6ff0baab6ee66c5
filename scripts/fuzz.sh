#!/usr/bin/env bash
# Runs the fuzz target of fuzz/ (the decoder of peer metadata, untrusted network input) for a
# bounded time, on stable Rust: the target is built with the coverage instrumentation cargo-fuzz
# uses (SanitizerCoverage: inline 8-bit counters, PC table, compare tracing) but without a
# sanitizer, which needs nightly. libFuzzer itself comes from the libfuzzer-sys crate (needs a
# C++ compiler). With nightly and cargo-fuzz installed, `cargo +nightly fuzz run metadata` adds
# AddressSanitizer.
#
# Usage: scripts/fuzz.sh [SECONDS]   (default 30). Exit status 0: no crash, hang or failed
# assertion within the time. A failing input is kept under target/fuzz/artifacts/.
set -euo pipefail
secs=${1:-30}
cd "$(dirname "$0")/../fuzz"
host=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
# --target keeps RUSTFLAGS off build scripts and proc macros (as cargo-fuzz does).
cargo build --locked --release --bin metadata --target "$host" --target-dir ../target/fuzz
art=../target/fuzz/artifacts
mkdir -p "$art"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# New inputs go to a scratch corpus; the committed seeds in corpus/metadata are read only.
../target/fuzz/"$host"/release/metadata -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$art/" -print_final_stats=1 "$work" corpus/metadata
