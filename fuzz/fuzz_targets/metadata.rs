//! Fuzzes the decoder of the agent-to-agent control protocol (the metadata a peer sends:
//! handshake, region lists with packed rkeys, withdrawals, notifications, packed writes and their
//! acknowledgements). It must never panic,
//! never allocate beyond the message, and whatever it accepts must encode back to the same bytes.
//!
//! Run: `scripts/fuzz.sh SECONDS` (stable Rust; CI runs it for 30 s), or with AddressSanitizer
//! `cargo +nightly fuzz run metadata -- -max_total_time=60` (from the repository root).
#![no_main]

use gdpath::net::codec::{decode, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode(data) {
        let again = encode(&m).expect("a decoded message is within the limits");
        assert_eq!(again, data, "decode/encode is not a bijection");
    }
});
