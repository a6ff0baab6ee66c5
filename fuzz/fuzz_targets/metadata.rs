//! Fuzzes the decoder of the agent-to-agent control protocol (the metadata a peer sends:
//! handshake, region lists with packed rkeys, withdrawals, notifications, packed writes and their
//! acknowledgements). It must never panic,
//! never allocate beyond the message, whatever it accepts must encode back to the same bytes, and
//! decoding in place (`decode_owned`, the receive path) must agree with decoding a copy.
//!
//! Run: `scripts/fuzz.sh SECONDS` (stable Rust; CI runs it for 30 s), or with AddressSanitizer
//! `cargo +nightly fuzz run metadata -- -max_total_time=60` (from the repository root).
#![no_main]

use gdpath_wire::codec::{decode, decode_owned, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let copied = decode(data);
    assert_eq!(decode_owned(data.to_vec()), copied, "in-place decode disagrees");
    if let Ok(m) = copied {
        let again = encode(&m).expect("a decoded message is within the limits");
        assert_eq!(again, data, "decode/encode is not a bijection");
    }
});
