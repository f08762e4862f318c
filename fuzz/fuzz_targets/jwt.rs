//! Signed tokens: the verifier on any bytes, on tokens whose header and
//! claims are any bytes but whose signature is good, and on good
//! signatures over claims of every JSON type.
//!
//! Input: `[mode, rest ..]`. Mode bit 0 clear: `rest` is a token for the
//! HS256, RS256 and ES256 verifiers (test keys), and a key file for each
//! algorithm. Set, bit 1 clear: `rest` is `header 0xff claims`, signed
//! here with the HS256 secret, so the claims' parsing and checks are
//! reached. Bits 0 and 1 set: `rest` picks, for each registered claim and
//! `channels`, absence or one JSON value of a table holding every type
//! (`null`, booleans, numbers, strings, lists, objects), and whether one
//! claim is given twice; the claims are signed here.
//!
//! Checked: nothing panics; a token taken is good at the time given and
//! its grant holds a valid id and patterns; a token whose header does not
//! name HS256 is never taken by the HS256 verifier; a forged token (bytes
//! not signed here) is never taken; a key file that is taken verifies
//! nothing it did not sign. For the claims picked from the table, the
//! verdict (and its reason) of a verifier with and one without an
//! audience and issuer required is the one a model of the rules gives:
//! a claim of another type or given twice makes the token malformed, a
//! `null` claim malformed by its name, never absent.

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
    if mode & 2 != 0 {
        claims_of_every_type(rest);
        return;
    }
    let (header, claims) = match rest.iter().position(|&b| b == 0xff) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (&br#"{"alg":"HS256"}"#[..], rest),
    };
    let token = signed(header, claims);
    if let Ok(taken) = hs256.verify(token.as_bytes(), NOW) {
        assert!(taken.valid_until > NOW);
        let header = std::str::from_utf8(header).expect("a header taken is JSON");
        assert!(header.contains("HS256"), "{header}");
        if let Some(id) = &taken.grant.id {
            assert!(names::check(id.as_str()).is_ok(), "{id}");
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

/// `header.claims.signature`, signed with the HS256 secret.
fn signed(header: &[u8], claims: &[u8]) -> String {
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET);
    let tag = ring::hmac::sign(&key, input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// A JSON value a claim may be given, and what it is.
struct Value {
    json: &'static str,
    is: Is,
}

/// What a [`Value`] is, as the rules read it.
#[derive(Clone, Copy, PartialEq)]
enum Is {
    Null,
    /// A number, and the whole seconds it stands for.
    Number(i64),
    /// A string, and whether it is a valid client id and channel pattern.
    Text {
        id: bool,
        pattern: bool,
    },
    /// A list of strings, and whether each is a valid channel pattern.
    Texts {
        patterns: bool,
        len: usize,
    },
    /// Of no type any claim takes (a boolean, an object, another list).
    Other,
}

const VALUES: &[Value] = &[
    Value {
        json: "null",
        is: Is::Null,
    },
    Value {
        json: "true",
        is: Is::Other,
    },
    Value {
        json: "false",
        is: Is::Other,
    },
    Value {
        json: "{}",
        is: Is::Other,
    },
    Value {
        json: r#"{"exp":1900000000}"#,
        is: Is::Other,
    },
    Value {
        json: "[1]",
        is: Is::Other,
    },
    Value {
        json: "[null]",
        is: Is::Other,
    },
    Value {
        json: "[[]]",
        is: Is::Other,
    },
    Value {
        json: "0",
        is: Is::Number(0),
    },
    Value {
        json: "-1",
        is: Is::Number(-1),
    },
    Value {
        json: "1.5",
        is: Is::Number(1),
    },
    Value {
        json: "1799999994",
        is: Is::Number(NOW - 6),
    },
    Value {
        json: "1800000003",
        is: Is::Number(NOW + 3),
    },
    Value {
        json: "1900000000",
        is: Is::Number(1_900_000_000),
    },
    Value {
        json: "1900000000.9",
        is: Is::Number(1_900_000_000),
    },
    Value {
        json: "18446744073709551615",
        is: Is::Number(i64::MAX),
    },
    Value {
        json: "1e300",
        is: Is::Number(i64::MAX),
    },
    Value {
        json: "-1e300",
        is: Is::Number(i64::MIN),
    },
    Value {
        json: r#""""#,
        is: Is::Text {
            id: false,
            pattern: false,
        },
    },
    Value {
        json: r#""alice""#,
        is: Is::Text {
            id: true,
            pattern: true,
        },
    },
    Value {
        json: r#""push""#,
        is: Is::Text {
            id: true,
            pattern: true,
        },
    },
    Value {
        json: r#""app""#,
        is: Is::Text {
            id: true,
            pattern: true,
        },
    },
    Value {
        json: r#""news.*""#,
        is: Is::Text {
            id: false,
            pattern: true,
        },
    },
    Value {
        json: r#""a b""#,
        is: Is::Text {
            id: false,
            pattern: false,
        },
    },
    Value {
        json: r#""1900000000""#,
        is: Is::Text {
            id: true,
            pattern: true,
        },
    },
    Value {
        json: "[]",
        is: Is::Texts {
            patterns: true,
            len: 0,
        },
    },
    Value {
        json: r#"["push"]"#,
        is: Is::Texts {
            patterns: true,
            len: 1,
        },
    },
    Value {
        json: r#"["web","app"]"#,
        is: Is::Texts {
            patterns: true,
            len: 2,
        },
    },
    Value {
        json: r#"["news.*","a,,b"]"#,
        is: Is::Texts {
            patterns: false,
            len: 2,
        },
    },
];

/// The claims read, in the order the checks meet their nulls.
const CLAIMS: [&str; 6] = ["exp", "nbf", "aud", "iss", "sub", "channels"];

/// Claims picked from [`VALUES`] by `picks`, signed, and verified by a
/// verifier without and one with an audience (`push`) and issuer (`app`)
/// required: each verdict must be the model's.
fn claims_of_every_type(picks: &[u8]) {
    let mut given: [Option<&Value>; 6] = [None; 6];
    for (claim, &pick) in given.iter_mut().zip(picks) {
        // 0: absent; k: the k-th value.
        *claim = match usize::from(pick) % (VALUES.len() + 1) {
            0 => None,
            k => Some(&VALUES[k - 1]),
        };
    }
    let twice = picks.get(6).map(|&pick| usize::from(pick) % 8);
    let mut fields = Vec::new();
    for (name, value) in CLAIMS.iter().zip(&given) {
        if let Some(value) = value {
            fields.push(format!(r#""{name}":{}"#, value.json));
        }
    }
    let twice = twice.filter(|&at| at < fields.len());
    if let Some(at) = twice {
        fields.push(fields[at].clone());
    }
    // An unknown claim is ignored, whatever its type.
    fields.push(r#""jti":null"#.to_string());
    let claims = format!("{{{}}}", fields.join(","));
    let token = signed(br#"{"alg":"HS256","typ":"JWT"}"#, claims.as_bytes());
    let [hs256, ..] = verifiers();
    let mut strict = Verifier::new(Algorithm::HS256, 5);
    strict.add_key(SECRET).expect("a test key");
    strict.require_audience("push");
    strict.require_issuer("app");
    for (verifier, required) in [(hs256, None), (&strict, Some(("push", "app")))] {
        let got = match verifier.verify(token.as_bytes(), NOW) {
            Ok(claims) => Ok((
                claims.grant.id.as_ref().map(|id| id.as_str().to_owned()),
                claims.grant.channels.as_ref().map(Vec::len),
            )),
            Err(refusal) => Err(refusal.reason()),
        };
        let want = model(&given, twice.is_some(), required);
        let agrees = match (&got, &want) {
            (Ok(got), Ok(want)) => got == want,
            (Err(got), Err(want)) => got.starts_with(want),
            _ => false,
        };
        assert!(agrees, "{claims}: got {got:?}, the model {want:?}");
    }
}

/// What the rules make of claims `given` (in [`CLAIMS`]' order), one of
/// them `twice`, with `required` audience and issuer: the id and the
/// number of patterns taken, or the refusal's reason (its beginning).
#[allow(clippy::type_complexity)]
fn model(
    given: &[Option<&Value>; 6],
    twice: bool,
    required: Option<(&str, &str)>,
) -> Result<(Option<String>, Option<usize>), &'static str> {
    const TYPES: &str = "malformed token: claims are not JSON of the types taken";
    let [exp, nbf, aud, iss, sub, channels] = given.map(|value| value.map(|v| (v.json, v.is)));
    let typed = |value: Option<(&str, Is)>, takes: fn(Is) -> bool| {
        value.is_none_or(|(_, is)| is == Is::Null || takes(is))
    };
    let number = |is| matches!(is, Is::Number(_));
    let text = |is| matches!(is, Is::Text { .. });
    if twice
        || !typed(exp, number)
        || !typed(nbf, number)
        || !typed(aud, |is| matches!(is, Is::Text { .. } | Is::Texts { .. }))
        || !typed(iss, text)
        || !typed(sub, text)
        || !typed(channels, |is| matches!(is, Is::Texts { .. }))
    {
        return Err(TYPES);
    }
    const NULL: [&str; 6] = [
        "malformed token: exp is null",
        "malformed token: nbf is null",
        "malformed token: aud is null",
        "malformed token: iss is null",
        "malformed token: sub is null",
        "malformed token: channels is null",
    ];
    if let Some(at) = given
        .iter()
        .position(|v| v.is_some_and(|v| v.is == Is::Null))
    {
        return Err(NULL[at]);
    }
    let Some((_, Is::Number(exp))) = exp else {
        return Err("malformed token: exp is required");
    };
    if NOW >= exp.saturating_add(5) {
        return Err("token refused: expired");
    }
    if let Some((_, Is::Number(nbf))) = nbf {
        if NOW + 5 < nbf {
            return Err("token refused: not yet valid (nbf)");
        }
    }
    let unquoted = |json: &str| json.trim_matches('"').to_owned();
    let audience = aud.map(|(json, is)| match is {
        Is::Texts { .. } => json.contains(r#""push""#),
        _ => unquoted(json) == "push",
    });
    match (required, audience) {
        (Some(_), Some(true)) | (None, None) => {}
        _ => return Err("token refused: wrong audience"),
    }
    if required.is_some() && iss.map(|(json, _)| unquoted(json)).as_deref() != Some("app") {
        return Err("token refused: wrong issuer");
    }
    let id = match sub {
        Some((_, Is::Text { id: false, .. })) => {
            return Err("malformed token: sub is not a client id")
        }
        Some((json, _)) => Some(unquoted(json)),
        None => None,
    };
    let patterns = match channels {
        Some((
            _,
            Is::Texts {
                patterns: false, ..
            },
        )) => return Err("malformed token: a channels pattern is not valid"),
        Some((_, Is::Texts { len, .. })) => Some(len),
        _ => None,
    };
    Ok((id, patterns))
}
