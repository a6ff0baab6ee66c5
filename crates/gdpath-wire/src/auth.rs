//! Mutual authentication with a shared secret (token) that never crosses the wire.
//!
//! The serving agent sends a random 32-byte nonce; the connecting agent answers with its own
//! nonce and `HMAC-SHA256(token, "gdpath-net/3 client" ‖ server_nonce ‖ client_nonce ‖
//! len32(bound) ‖ bound)`, where `bound` is what the server will act on once it believes the
//! client (its routing id and UCX worker address, [`binding`]); the server checks it
//! (constant-time) and proves it knows the token too with `HMAC-SHA256(token, "gdpath-net/3
//! server" ‖ client_nonce ‖ server_nonce ‖ len32(bound) ‖ bound)` over its own routing id and
//! worker address in its welcome, which the client checks before it trusts any metadata or
//! connects to that address. Someone relaying the handshake cannot swap either address. Fresh nonces on both sides make a
//! recorded answer useless for another connection; the labels keep a client MAC from being
//! replayed as a server MAC. Without a token both sides use the empty key, so the exchange is
//! the same and only proves both sides run the protocol (allowed on loopback only).
//!
//! This authenticates the peers at connection time. It does not encrypt or integrity-protect
//! the data that UCX moves afterwards (UCX has no such layer): use it on networks you trust.

use crate::codec::NONCE_LEN;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;

type HmacSha256 = Hmac<Sha256>;

const CLIENT_LABEL: &[u8] = b"gdpath-net/3 client";
const SERVER_LABEL: &[u8] = b"gdpath-net/3 server";

/// What a MAC binds besides the nonces: a side's routing id and UCX worker address, as the
/// `Auth` or `Welcome` that carries them lists them.
pub fn binding(session: u64, worker_address: &[u8]) -> Vec<u8> {
    let mut b = session.to_le_bytes().to_vec();
    b.extend_from_slice(worker_address);
    b
}

/// Shortest token [`Token::new`] accepts, bytes: 128 bits if random.
pub const MIN_TOKEN_LEN: usize = 16;

/// A shared secret. Its `Debug` output is redacted.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Token(Vec<u8>);

impl Token {
    /// A token of at least [`MIN_TOKEN_LEN`] bytes (e.g. 32 random bytes as hex). Errors with
    /// [`crate::Error::Config`] when shorter.
    pub fn new(secret: impl Into<Vec<u8>>) -> crate::Result<Token> {
        let s = secret.into();
        if s.len() < MIN_TOKEN_LEN {
            return Err(crate::Error::Config(format!(
                "token of {} bytes is too short: use at least {MIN_TOKEN_LEN} (e.g. `openssl rand -hex 16`)",
                s.len()
            )));
        }
        Ok(Token(s))
    }

    /// No token (empty key): only for loopback.
    pub fn none() -> Token {
        Token(Vec::new())
    }

    /// True for [`Token::none`].
    pub fn is_none(&self) -> bool {
        self.0.is_empty()
    }

    fn mac(
        &self,
        label: &[u8],
        a: &[u8; NONCE_LEN],
        b: &[u8; NONCE_LEN],
        bound: &[u8],
    ) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC accepts keys of any length");
        m.update(label);
        m.update(a);
        m.update(b);
        // Length-prefixed, so that no split of nonces and bound bytes gives the same input.
        m.update(&(bound.len() as u32).to_le_bytes());
        m.update(bound);
        m
    }

    /// The client's answer to a challenge, binding `bound` ([`binding`] of its routing id and
    /// worker address).
    pub fn client_mac(
        &self,
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
        bound: &[u8],
    ) -> [u8; NONCE_LEN] {
        self.mac(CLIENT_LABEL, server_nonce, client_nonce, bound)
            .finalize()
            .into_bytes()
            .into()
    }

    /// The server's proof, binding `bound` (its own routing id and worker address).
    pub fn server_mac(
        &self,
        client_nonce: &[u8; NONCE_LEN],
        server_nonce: &[u8; NONCE_LEN],
        bound: &[u8],
    ) -> [u8; NONCE_LEN] {
        self.mac(SERVER_LABEL, client_nonce, server_nonce, bound)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Checks a client's answer in constant time.
    pub fn verify_client(
        &self,
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
        bound: &[u8],
        mac: &[u8; NONCE_LEN],
    ) -> bool {
        self.mac(CLIENT_LABEL, server_nonce, client_nonce, bound)
            .verify_slice(mac)
            .is_ok()
    }

    /// Checks a server's proof in constant time.
    pub fn verify_server(
        &self,
        client_nonce: &[u8; NONCE_LEN],
        server_nonce: &[u8; NONCE_LEN],
        bound: &[u8],
        mac: &[u8; NONCE_LEN],
    ) -> bool {
        self.mac(SERVER_LABEL, client_nonce, server_nonce, bound)
            .verify_slice(mac)
            .is_ok()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("Token(none)")
        } else {
            f.write_str("Token(<redacted>)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_bind_token_nonces_and_direction() {
        let t = Token::new("0123456789abcdef").unwrap();
        let (s, c) = ([1; NONCE_LEN], [2; NONCE_LEN]);
        let bound = binding(7, b"worker");
        let cm = t.client_mac(&s, &c, &bound);
        assert!(t.verify_client(&s, &c, &bound, &cm));
        assert!(!t.verify_client(&c, &s, &bound, &cm), "nonce order");
        assert!(
            !t.verify_server(&c, &s, &bound, &cm),
            "a client MAC is no server MAC"
        );
        // Another routing id or worker address is another MAC.
        assert!(!t.verify_client(&s, &c, &binding(8, b"worker"), &cm));
        assert!(!t.verify_client(&s, &c, &binding(7, b"workes"), &cm));
        let other = Token::new("0123456789abcdeX").unwrap();
        assert!(!other.verify_client(&s, &c, &bound, &cm));
        assert!(!Token::none().verify_client(&s, &c, &bound, &cm));
        let sm = t.server_mac(&c, &s, &bound);
        assert!(t.verify_server(&c, &s, &bound, &sm));
        assert!(Token::new("short").is_err());
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
    }

    #[test]
    fn hmac_sha256_matches_rfc4231_case_2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let mut m = HmacSha256::new_from_slice(b"Jefe").unwrap();
        m.update(b"what do ya want for nothing?");
        let hex: String = m
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
