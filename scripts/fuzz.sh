#!/usr/bin/env bash
# Runs the fuzz targets of fuzz/ for a bounded time, on stable Rust: `metadata` (the decoder of
# everything a peer sends, untrusted network input) and `protocol` (the protocol state machine
# driven by arbitrary message sequences, the clock and local requests), half of the time each.
# The targets are built with the coverage instrumentation cargo-fuzz uses (SanitizerCoverage:
# inline 8-bit counters, PC table, compare tracing) but without a sanitizer, which needs
# nightly. libFuzzer itself comes from the libfuzzer-sys crate (needs a C++ compiler). With
# nightly and cargo-fuzz installed, `cargo +nightly fuzz run metadata` (or `protocol`) adds
# AddressSanitizer.
#
# Usage: scripts/fuzz.sh [SECONDS]   (default 30, split between the targets). Exit status 0: no
# crash, hang or failed assertion within the time. A failing input is kept under
# target/fuzz/artifacts/.
set -euo pipefail
secs=${1:-30}
cd "$(dirname "$0")/../fuzz"
host=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
targets=(metadata protocol)
# --target keeps RUSTFLAGS off build scripts and proc macros (as cargo-fuzz does).
cargo build --locked --release "${targets[@]/#/--bin=}" --target "$host" --target-dir ../target/fuzz
art=../target/fuzz/artifacts
mkdir -p "$art"
each=$(( secs / ${#targets[@]} ))
(( each > 0 )) || each=1
for t in "${targets[@]}"; do
  work=$(mktemp -d)
  # New inputs go to a scratch corpus; the committed seeds in corpus/$t are read only.
  ../target/fuzz/"$host"/release/"$t" -max_total_time="$each" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$art/$t-" -print_final_stats=1 "$work" corpus/"$t"
  rm -rf "$work"
done
