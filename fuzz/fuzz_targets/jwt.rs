//! Signed tokens: the verifier on any bytes, and on tokens whose header
//! and claims are any bytes but whose signature is good.
//!
//! Input: `[mode, rest ..]`. Mode bit 0 clear: `rest` is a token for the
//! HS256, RS256 and ES256 verifiers (test keys), and a key file for each
//! algorithm. Set: `rest` is `header 0xff claims`, signed here with the
//! HS256 secret, so the claims' parsing and checks are reached.
//!
//! Checked: nothing panics; a token taken is good at the time given and
//! its grant holds a valid id and patterns; a token whose header does not
//! name HS256 is never taken by the HS256 verifier; a forged token (bytes
//! not signed here) is never taken; a key file that is taken verifies
//! nothing it did not sign.

#![no_main]

use std::sync::OnceLock;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use libfuzzer_sys::fuzz_target;
use wspush::protocol::names;
use wspush::{Algorithm, Verifier};

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
const NOW: i64 = 1_800_000_000;

fn verifiers() -> &'static [Verifier; 3] {
    static VERIFIERS: OnceLock<[Verifier; 3]> = OnceLock::new();
    VERIFIERS.get_or_init(|| {
        let with = |algorithm, key: &[u8]| {
            let mut verifier = Verifier::new(algorithm, 5);
            verifier.add_key(key).expect("a test key");
            verifier
        };
        [
            with(Algorithm::HS256, SECRET),
            with(
                Algorithm::RS256,
                include_bytes!("../../tests/keys/rsa-public.pem"),
            ),
            with(
                Algorithm::ES256,
                include_bytes!("../../tests/keys/ec-public.pem"),
            ),
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let [hs256, ..] = verifiers();
    if mode & 1 == 0 {
        for verifier in verifiers() {
            assert!(
                verifier.verify(rest, NOW).is_err(),
                "a forged token was taken"
            );
        }
        for algorithm in [Algorithm::HS256, Algorithm::RS256, Algorithm::ES256] {
            let mut verifier = Verifier::new(algorithm, 0);
            if verifier.add_key(rest).is_ok() {
                assert_eq!(verifier.key_count(), 1);
            }
        }
        return;
    }
    let (header, claims) = match rest.iter().position(|&b| b == 0xff) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (&br#"{"alg":"HS256"}"#[..], rest),
    };
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET);
    let tag = ring::hmac::sign(&key, input.as_bytes());
    let token = format!("{input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()));
    if let Ok(taken) = hs256.verify(token.as_bytes(), NOW) {
        assert!(taken.valid_until > NOW);
        let header = std::str::from_utf8(header).expect("a header taken is JSON");
        assert!(header.contains("HS256"), "{header}");
        if let Some(id) = &taken.grant.id {
            assert!(names::check(id).is_ok(), "{id}");
        }
        for pattern in taken.grant.channels.iter().flatten() {
            assert!(!pattern.as_str().is_empty());
        }
    }
    // A token changed after signing is never taken.
    let mut changed = token.into_bytes();
    let at = usize::from(mode >> 1) % changed.len();
    changed[at] ^= 1;
    assert!(
        hs256.verify(&changed, NOW).is_err(),
        "a changed token was taken"
    );
});
