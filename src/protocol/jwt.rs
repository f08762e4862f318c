//! Signed tokens (JWT, RFC 7519, in the JWS compact form of RFC 7515)
//! that bind a client to its id and channels: checked against keys the
//! server holds, with no database shared with the application that signs
//! them. Pure code: the time is given, nothing is read or logged.
//!
//! What is taken, and nothing else:
//! - one algorithm, pinned by the server ([`Algorithm`]): a token whose
//!   header names another (`none` included) is refused before any key is
//!   used, so an HS256 token "signed" with an RSA public key never meets
//!   an HMAC check;
//! - a header with `crit` is refused (no extension is understood);
//! - claims of the right JSON types only: `exp` (required) and `nbf` are
//!   numbers, `sub`, `iss` strings, `aud` a string or a list of them,
//!   `channels` a list of channel patterns; a claim of another type,
//!   `null`, or given twice makes the token malformed, never absent (a
//!   signer that writes a missing value as `null` would otherwise hand
//!   out tokens bound to no id and no channel).
//!
//! The signature is checked before the claims are read. The cryptography
//! is `ring`'s (constant-time HMAC compare; RSA PKCS#1 v1.5 with SHA-256
//! and 2048 to 8192 bit keys; ECDSA P-256 with SHA-256).

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::signature::{self, UnparsedPublicKey};
use serde::Deserialize;

use crate::protocol::auth::{Grant, MAX_PRESENTED_LEN};
use crate::protocol::names::{ClientId, Pattern};

/// The longest token taken, in bytes.
pub const MAX_JWT_LEN: usize = MAX_PRESENTED_LEN;

/// The shortest HS256 secret taken: the hash's size (RFC 7518 §3.2).
pub const MIN_SECRET_LEN: usize = 32;

/// The signing algorithm a server takes (one; the token's header must
/// name it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Algorithm {
    /// HMAC with SHA-256 over a shared secret.
    #[cfg_attr(feature = "cli", value(name = "HS256"))]
    HS256,
    /// RSASSA-PKCS1-v1_5 with SHA-256; the server holds the public key.
    #[cfg_attr(feature = "cli", value(name = "RS256"))]
    RS256,
    /// ECDSA on P-256 with SHA-256; the server holds the public key.
    #[cfg_attr(feature = "cli", value(name = "ES256"))]
    ES256,
}

impl Algorithm {
    /// Its name in a token's header.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::HS256 => "HS256",
            Algorithm::RS256 => "RS256",
            Algorithm::ES256 => "ES256",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One key a token may be signed with.
#[derive(Clone)]
enum Key {
    Hmac(ring::hmac::Key),
    /// A public key as `ring` takes it: an RSAPublicKey (PKCS#1) or an
    /// uncompressed P-256 point.
    Public(Box<[u8]>),
}

/// Why a key file was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError(pub String);

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KeyError {}

/// What a server checks a signed token against: its algorithm, one or
/// more keys (two while keys roll: a token signed with either is good),
/// and the audience and issuer it requires, if any.
#[derive(Clone)]
pub struct Verifier {
    algorithm: Algorithm,
    keys: Vec<Key>,
    audience: Option<String>,
    issuer: Option<String>,
    leeway: u64,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the keys.
        f.debug_struct("Verifier")
            .field("algorithm", &self.algorithm)
            .field("keys", &self.keys.len())
            .field("audience", &self.audience)
            .field("issuer", &self.issuer)
            .field("leeway", &self.leeway)
            .finish()
    }
}

/// Why a token was refused; each is a 401 whose body says which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRefusal {
    /// Not a token of the form taken; says what is wrong.
    Malformed(&'static str),
    /// The header names another algorithm than the server's.
    WrongAlgorithm,
    /// No key the server holds signed it.
    BadSignature,
    /// Its `exp` (with the leeway) has passed.
    Expired,
    /// Its `nbf` (less the leeway) has not come yet.
    NotYetValid,
    /// It names no audience the server is, or none while the server
    /// requires one, or one while the server is configured with none.
    WrongAudience,
    /// Its issuer is not the one the server requires.
    WrongIssuer,
}

impl TokenRefusal {
    /// The one line a refusal's body gives.
    pub fn reason(self) -> &'static str {
        match self {
            TokenRefusal::Malformed(why) => why,
            TokenRefusal::WrongAlgorithm => "token refused: wrong algorithm",
            TokenRefusal::BadSignature => "token refused: bad signature",
            TokenRefusal::Expired => "token refused: expired",
            TokenRefusal::NotYetValid => "token refused: not yet valid (nbf)",
            TokenRefusal::WrongAudience => "token refused: wrong audience",
            TokenRefusal::WrongIssuer => "token refused: wrong issuer",
        }
    }
}

/// What a good token says: the grant it carries (`sub` as the client id,
/// `channels` as the channels allowed) and the second its validity ends
/// (its `exp` plus the leeway), after which the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// The id and channels it binds its bearer to.
    pub grant: Grant,
    /// Unix seconds; it is good while the time is before this.
    pub valid_until: i64,
}

/// The header fields read; any other is ignored, `crit` refused.
#[derive(Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    alg: Cow<'a, str>,
    #[serde(default)]
    crit: Claim<serde::de::IgnoredAny>,
}

/// The claims read, with their JSON types; any other is ignored.
#[derive(Deserialize)]
struct RawClaims<'a> {
    #[serde(default, borrow)]
    sub: Claim<Cow<'a, str>>,
    #[serde(default)]
    exp: Claim<serde_json::Number>,
    #[serde(default)]
    nbf: Claim<serde_json::Number>,
    #[serde(default, borrow)]
    iss: Claim<Cow<'a, str>>,
    #[serde(default)]
    aud: Claim<Audience>,
    #[serde(default, borrow)]
    channels: Claim<Vec<Cow<'a, str>>>,
}

/// A field as the JSON has it: absent, `null`, or a value of its type.
/// (`Option` would read `null` as absent.)
#[derive(Default)]
enum Claim<T> {
    #[default]
    Absent,
    Null,
    Given(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Claim<T> {
    fn deserialize<D: serde::Deserializer<'de>>(json: D) -> Result<Self, D::Error> {
        Ok(Option::<T>::deserialize(json)?.map_or(Claim::Null, Claim::Given))
    }
}

impl<T> Claim<T> {
    /// The value, if given; `null` is malformed, `why` saying so.
    fn given(&self, why: &'static str) -> Result<Option<&T>, TokenRefusal> {
        match self {
            Claim::Absent => Ok(None),
            Claim::Null => Err(TokenRefusal::Malformed(why)),
            Claim::Given(value) => Ok(Some(value)),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Audience {
    fn names(&self, name: &str) -> bool {
        match self {
            Audience::One(one) => one == name,
            Audience::Many(many) => many.iter().any(|one| one == name),
        }
    }
}

impl Verifier {
    /// The leeway, in seconds, that the binary's `--jwt-leeway` takes
    /// unless told otherwise.
    pub const DEFAULT_LEEWAY: u64 = 5;

    /// A verifier for `algorithm` with no key yet (add one or more with
    /// [`Verifier::add_key`]), `leeway` seconds of tolerance for clocks
    /// on `exp` and `nbf`, and no audience or issuer required.
    pub fn new(algorithm: Algorithm, leeway: u64) -> Verifier {
        Verifier {
            algorithm,
            keys: Vec::new(),
            audience: None,
            issuer: None,
            leeway,
        }
    }

    /// Adds a key from a key file's bytes: for HS256 the secret (the
    /// file less its trailing line end, at least 32
    /// bytes, and not a PEM key), else a PEM public key (`PUBLIC KEY`,
    /// or `RSA PUBLIC KEY` for RS256) of the algorithm's kind.
    pub fn add_key(&mut self, file: &[u8]) -> Result<(), KeyError> {
        let key = match self.algorithm {
            Algorithm::HS256 => {
                let secret = file
                    .strip_suffix(b"\n")
                    .map_or(file, |s| s.strip_suffix(b"\r").unwrap_or(s));
                if secret.starts_with(b"-----BEGIN") {
                    return Err(KeyError(
                        "HS256 takes a shared secret, and this is a PEM key".into(),
                    ));
                }
                if secret.len() < MIN_SECRET_LEN {
                    return Err(KeyError(format!(
                        "an HS256 secret must be at least {MIN_SECRET_LEN} bytes"
                    )));
                }
                Key::Hmac(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret))
            }
            Algorithm::RS256 => Key::Public(rsa_public_key(file)?),
            Algorithm::ES256 => Key::Public(p256_public_key(file)?),
        };
        self.keys.push(key);
        Ok(())
    }

    /// Requires tokens to name `audience` in their `aud`.
    pub fn require_audience(&mut self, audience: impl Into<String>) {
        self.audience = Some(audience.into());
    }

    /// Requires tokens to name `issuer` as their `iss`.
    pub fn require_issuer(&mut self, issuer: impl Into<String>) {
        self.issuer = Some(issuer.into());
    }

    /// Its algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// How many keys it holds.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Checks `token` at `now` (Unix seconds): its form, its algorithm,
    /// its signature by one of the keys, then its claims.
    pub fn verify(&self, token: &[u8], now: i64) -> Result<Claims, TokenRefusal> {
        use TokenRefusal::Malformed;
        if token.len() > MAX_JWT_LEN {
            return Err(Malformed("malformed token: longer than 4096 bytes"));
        }
        let mut parts = token.split(|&b| b == b'.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Malformed("malformed token: not three parts"));
        };
        let mut buf = [0u8; MAX_JWT_LEN];
        let header = decode(header, &mut buf, "malformed token: header is not base64url")?;
        // UTF-8 first: serde_json would skip the bytes of a field it ignores.
        let header: Header<'_> = std::str::from_utf8(header)
            .ok()
            .and_then(|header| serde_json::from_str(header).ok())
            .ok_or(Malformed("malformed token: header is not JSON with alg"))?;
        if header.alg != self.algorithm.name() {
            return Err(TokenRefusal::WrongAlgorithm);
        }
        if !matches!(header.crit, Claim::Absent) {
            return Err(Malformed("malformed token: crit is not supported"));
        }
        let signed = &token[..token.len() - signature.len() - 1];
        let signature = decode(
            signature,
            &mut buf,
            "malformed token: signature is not base64url",
        )?;
        if !self
            .keys
            .iter()
            .any(|key| self.signed(key, signed, signature))
        {
            return Err(TokenRefusal::BadSignature);
        }
        let payload = decode(
            payload,
            &mut buf,
            "malformed token: claims are not base64url",
        )?;
        let claims: RawClaims<'_> = std::str::from_utf8(payload)
            .ok()
            .and_then(|claims| serde_json::from_str(claims).ok())
            .ok_or(Malformed(
                "malformed token: claims are not JSON of the types taken (exp and nbf numbers; sub, iss strings; aud a string or list; channels a list; none null)",
            ))?;
        self.check(&claims, now)
    }

    fn signed(&self, key: &Key, message: &[u8], signature: &[u8]) -> bool {
        match key {
            Key::Hmac(key) => ring::hmac::verify(key, message, signature).is_ok(),
            Key::Public(key) => {
                let algorithm: &dyn signature::VerificationAlgorithm = match self.algorithm {
                    Algorithm::RS256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                    Algorithm::ES256 => &signature::ECDSA_P256_SHA256_FIXED,
                    Algorithm::HS256 => return false,
                };
                UnparsedPublicKey::new(algorithm, key)
                    .verify(message, signature)
                    .is_ok()
            }
        }
    }

    fn check(&self, claims: &RawClaims<'_>, now: i64) -> Result<Claims, TokenRefusal> {
        use TokenRefusal::Malformed;
        // The form first: a null claim is malformed, whatever else holds.
        let exp = claims.exp.given("malformed token: exp is null")?;
        let nbf = claims.nbf.given("malformed token: nbf is null")?;
        let aud = claims.aud.given("malformed token: aud is null")?;
        let iss = claims.iss.given("malformed token: iss is null")?;
        let sub = claims.sub.given("malformed token: sub is null")?;
        let channels = claims.channels.given("malformed token: channels is null")?;
        let leeway = self.leeway as i64;
        let exp = exp.ok_or(Malformed("malformed token: exp is required"))?;
        let valid_until = seconds(exp).saturating_add(leeway);
        if now >= valid_until {
            return Err(TokenRefusal::Expired);
        }
        if let Some(nbf) = nbf {
            if now.saturating_add(leeway) < seconds(nbf) {
                return Err(TokenRefusal::NotYetValid);
            }
        }
        match (&self.audience, aud) {
            (Some(ours), Some(theirs)) if theirs.names(ours) => {}
            (None, None) => {}
            _ => return Err(TokenRefusal::WrongAudience),
        }
        if let Some(ours) = &self.issuer {
            if iss.map(|iss| iss.as_ref()) != Some(ours.as_str()) {
                return Err(TokenRefusal::WrongIssuer);
            }
        }
        let id = match sub {
            Some(sub) => Some(ClientId::new(sub).map_err(|_| {
                Malformed("malformed token: sub is not a client id (1-64 bytes of letters, digits and - _ . : @)")
            })?),
            None => None,
        };
        let channels = match channels {
            Some(list) => Some(
                list.iter()
                    .map(|p| Pattern::parse(p))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| Malformed("malformed token: a channels pattern is not valid"))?,
            ),
            None => None,
        };
        Ok(Claims {
            grant: Grant { channels, id },
            valid_until,
        })
    }
}

/// The most of a token's remaining life by which its connection's close
/// is brought forward, so that the clients of tokens signed together
/// (that expire in the same second) do not all come back at once.
pub const MAX_CLOSE_SPREAD: Duration = Duration::from_secs(60);

/// A token good for longer than this is never closed for its expiry (it
/// would outlive any process).
pub const LONGEST_WAIT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How long before a token's end its connection's close is placed at the
/// latest: time for the loop to reach it and for the frame to travel, so
/// that the close arrives before the end.
pub const CLOSE_MARGIN: Duration = Duration::from_millis(100);

/// How long after `now` (since the Unix epoch) a connection whose token is
/// good until `valid_until` is closed: [`CLOSE_MARGIN`] before that
/// second, brought forward by `spread` (0 to 1, a value of its own for
/// each connection) times a tenth of the time left, at most
/// [`MAX_CLOSE_SPREAD`]. `None`: beyond [`LONGEST_WAIT`], never. The
/// caller closes it at that point or before, never after.
pub fn close_after(valid_until: i64, now: Duration, spread: f64) -> Option<Duration> {
    let end = Duration::from_secs(valid_until.max(0) as u64).saturating_sub(CLOSE_MARGIN);
    let left = end.saturating_sub(now);
    if left > LONGEST_WAIT {
        return None;
    }
    let early = (left / 10)
        .min(MAX_CLOSE_SPREAD)
        .mul_f64(spread.clamp(0.0, 1.0));
    Some(left - early)
}

/// A JSON number as whole Unix seconds: fractions are cut off, and
/// numbers past what an `i64` holds (a million years is not) stand at
/// its ends.
fn seconds(number: &serde_json::Number) -> i64 {
    if let Some(n) = number.as_i64() {
        return n;
    }
    if number.as_u64().is_some() {
        return i64::MAX;
    }
    // `as` saturates, and JSON has no NaN.
    number.as_f64().map_or(0, |f| f.floor() as i64)
}

/// Decodes base64url without padding (RFC 7515 §2) into `buf`.
fn decode<'b>(
    part: &[u8],
    buf: &'b mut [u8; MAX_JWT_LEN],
    why: &'static str,
) -> Result<&'b [u8], TokenRefusal> {
    let len = URL_SAFE_NO_PAD
        .decode_slice(part, buf)
        .map_err(|_| TokenRefusal::Malformed(why))?;
    Ok(&buf[..len])
}

/// The DER inside a PEM block labelled `label`.
fn pem(file: &[u8], label: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(file).ok()?;
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let (_, rest) = text.split_once(&begin)?;
    let (body, _) = rest.split_once(&end)?;
    let body: String = body.split_ascii_whitespace().collect();
    STANDARD.decode(body).ok()
}

/// The public key of an RS256 key file: a `PUBLIC KEY` (SubjectPublicKeyInfo
/// with rsaEncryption) or an `RSA PUBLIC KEY` (PKCS#1), as PKCS#1 DER,
/// with a modulus of 2048 to 8192 bits.
fn rsa_public_key(file: &[u8]) -> Result<Box<[u8]>, KeyError> {
    let pkcs1 = match (pem(file, "PUBLIC KEY"), pem(file, "RSA PUBLIC KEY")) {
        (Some(spki), _) => spki_key(&spki, RSA_ENCRYPTION, None)
            .ok_or_else(|| KeyError("the PUBLIC KEY is not an RSA key".into()))?,
        (None, Some(pkcs1)) => pkcs1,
        (None, None) => {
            return Err(KeyError(
                "RS256 takes a PEM public key (-----BEGIN PUBLIC KEY-----)".into(),
            ))
        }
    };
    let bits = rsa_modulus_bits(&pkcs1)
        .ok_or_else(|| KeyError("the RSA public key is not valid DER".into()))?;
    if !(2048..=8192).contains(&bits) {
        return Err(KeyError(format!(
            "the RSA key has {bits} bits; 2048 to 8192 are taken"
        )));
    }
    Ok(pkcs1.into())
}

/// The public key of an ES256 key file: a `PUBLIC KEY` on P-256, as the
/// uncompressed point.
fn p256_public_key(file: &[u8]) -> Result<Box<[u8]>, KeyError> {
    let spki = pem(file, "PUBLIC KEY").ok_or_else(|| {
        KeyError("ES256 takes a PEM public key (-----BEGIN PUBLIC KEY-----)".into())
    })?;
    let point = spki_key(&spki, EC_PUBLIC_KEY, Some(PRIME256V1))
        .ok_or_else(|| KeyError("the PUBLIC KEY is not a P-256 key".into()))?;
    if point.len() != 65 || point[0] != 4 {
        return Err(KeyError(
            "the P-256 key is not an uncompressed point".into(),
        ));
    }
    Ok(point.into())
}

/// OID 1.2.840.113549.1.1.1, rsaEncryption, as DER content.
const RSA_ENCRYPTION: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
/// OID 1.2.840.10045.2.1, id-ecPublicKey.
const EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
/// OID 1.2.840.10045.3.1.7, prime256v1 (P-256).
const PRIME256V1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];

/// The key bits of a SubjectPublicKeyInfo (RFC 5280 §4.1) whose algorithm
/// is `algorithm` and, if given, whose parameters are the OID `curve`.
fn spki_key(der: &[u8], algorithm: &[u8], curve: Option<&[u8]>) -> Option<Vec<u8>> {
    let (info, rest) = der_take(der, 0x30)?;
    if !rest.is_empty() {
        return None;
    }
    let (identifier, info) = der_take(info, 0x30)?;
    let (oid, parameters) = der_take(identifier, 0x06)?;
    if oid != algorithm {
        return None;
    }
    if let Some(curve) = curve {
        let (named, rest) = der_take(parameters, 0x06)?;
        if named != curve || !rest.is_empty() {
            return None;
        }
    }
    let (bits, rest) = der_take(info, 0x03)?;
    match (bits.split_first(), rest.is_empty()) {
        (Some((0, key)), true) => Some(key.to_vec()),
        _ => None,
    }
}

/// The bit length of an RSAPublicKey's modulus (RFC 8017 §A.1.1).
fn rsa_modulus_bits(der: &[u8]) -> Option<usize> {
    let (key, rest) = der_take(der, 0x30)?;
    let (modulus, key) = der_take(key, 0x02)?;
    let (_exponent, key) = der_take(key, 0x02)?;
    if !rest.is_empty() || !key.is_empty() {
        return None;
    }
    let modulus = match modulus {
        [0, rest @ ..] => rest,
        all => all,
    };
    let first = *modulus.first()?;
    Some(modulus.len() * 8 - first.leading_zeros() as usize)
}

/// Takes one DER element with tag `tag` from the front of `der`: its
/// content and what follows it.
fn der_take(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, der) = der.split_first()?;
    if first != tag {
        return None;
    }
    let (&len, der) = der.split_first()?;
    let (len, der) = match len {
        0..=0x7f => (len as usize, der),
        0x81..=0x84 => {
            let count = (len & 0x7f) as usize;
            let (bytes, der) = (der.get(..count)?, &der[count..]);
            let len = bytes.iter().fold(0usize, |n, &b| n << 8 | b as usize);
            (len, der)
        }
        _ => return None,
    };
    (der.len() >= len).then(|| der.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NOW: i64 = 1_800_000_000;

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn hs256(header: impl AsRef<[u8]>, claims: impl AsRef<[u8]>, secret: &[u8]) -> String {
        let signed = format!("{}.{}", b64(header.as_ref()), b64(claims.as_ref()));
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
        let tag = ring::hmac::sign(&key, signed.as_bytes());
        format!("{signed}.{}", b64(tag.as_ref()))
    }

    fn token(claims: &str) -> String {
        hs256(r#"{"alg":"HS256","typ":"JWT"}"#, claims, SECRET)
    }

    fn verifier() -> Verifier {
        let mut v = Verifier::new(Algorithm::HS256, 0);
        v.add_key(SECRET).unwrap();
        v
    }

    #[test]
    fn a_good_token_binds_its_id_and_channels_until_exp() {
        let claims = verifier()
            .verify(
                token(r#"{"sub":"alice","exp":1800000060,"channels":["news.*","dm.alice"]}"#)
                    .as_bytes(),
                NOW,
            )
            .unwrap();
        assert_eq!(
            claims.grant.id.as_ref().map(ClientId::as_str),
            Some("alice")
        );
        let channels: Vec<&str> = claims
            .grant
            .channels
            .iter()
            .flatten()
            .map(Pattern::as_str)
            .collect();
        assert_eq!(channels, ["news.*", "dm.alice"]);
        assert_eq!(claims.valid_until, 1_800_000_060);
        let bare = verifier()
            .verify(token(r#"{"exp":1800000060}"#).as_bytes(), NOW)
            .unwrap();
        assert_eq!(bare.grant, Grant::default());
    }

    #[test]
    fn exp_is_required_a_number_and_checked_with_the_leeway() {
        let refused = |claims: &str, leeway| {
            let mut v = Verifier::new(Algorithm::HS256, leeway);
            v.add_key(SECRET).unwrap();
            v.verify(token(claims).as_bytes(), NOW).err()
        };
        assert!(matches!(
            refused(r#"{"sub":"a"}"#, 0),
            Some(TokenRefusal::Malformed(_))
        ));
        assert!(matches!(
            refused(r#"{"exp":"1900000000"}"#, 0),
            Some(TokenRefusal::Malformed(_))
        ));
        assert!(matches!(
            refused(r#"{"exp":1,"exp":1900000000}"#, 0),
            Some(TokenRefusal::Malformed(_))
        ));
        assert_eq!(
            refused(r#"{"exp":1800000000}"#, 0),
            Some(TokenRefusal::Expired)
        );
        assert_eq!(refused(r#"{"exp":1799999995}"#, 10), None);
        assert_eq!(
            refused(r#"{"exp":1799999990}"#, 10),
            Some(TokenRefusal::Expired)
        );
        assert_eq!(refused(r#"{"exp":-5}"#, 0), Some(TokenRefusal::Expired));
        assert_eq!(
            refused(r#"{"exp":-9.9e300}"#, 0),
            Some(TokenRefusal::Expired)
        );
        // A million years, and beyond what any integer type holds.
        let v = verifier();
        for far in ["31557600000000", "1e300", "99999999999999999999"] {
            let claims = v
                .verify(token(&format!(r#"{{"exp":{far}}}"#)).as_bytes(), NOW)
                .unwrap();
            assert!(claims.valid_until >= 31_557_600_000_000, "{far}");
        }
        let fraction = v.verify(token(r#"{"exp":1800000000.9}"#).as_bytes(), NOW);
        assert_eq!(fraction, Err(TokenRefusal::Expired));
    }

    #[test]
    fn connections_close_before_their_token_ends_spread_over_a_tenth_of_its_life() {
        let now = Duration::from_secs(NOW as u64);
        let secs = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(
            close_after(NOW + 100, now, 0.0),
            Some(secs(100) - CLOSE_MARGIN)
        );
        assert_eq!(close_after(NOW + 100, now, 0.5), Some(ms(94_905)));
        assert_eq!(close_after(NOW + 100, now, 1.0), Some(ms(89_910)));
        // A long-lived token is spread over a minute at most.
        assert_eq!(
            close_after(NOW + 3600, now, 1.0),
            Some(secs(3540) - CLOSE_MARGIN)
        );
        // Good only within the leeway: closed at once.
        assert_eq!(close_after(NOW - 5, now, 0.3), Some(Duration::ZERO));
        assert_eq!(close_after(i64::MIN, now, 0.3), Some(Duration::ZERO));
        let half = now + ms(500);
        assert_eq!(close_after(NOW + 1, half, 0.0), Some(ms(400)));
        // Within the margin of its end: closed at once.
        assert_eq!(
            close_after(NOW + 1, now + ms(950), 0.0),
            Some(Duration::ZERO)
        );
        assert_eq!(close_after(i64::MAX, now, 0.5), None);
        assert_eq!(close_after(31_557_600_000_000, now, 0.5), None);
    }

    #[test]
    fn nbf_is_checked_when_present() {
        let v = verifier();
        let at = |nbf: &str| {
            v.verify(
                token(&format!(r#"{{"exp":1900000000,"nbf":{nbf}}}"#)).as_bytes(),
                NOW,
            )
            .err()
        };
        assert_eq!(at("1800000000"), None);
        assert_eq!(at("1800000001"), Some(TokenRefusal::NotYetValid));
        assert!(matches!(at("\"0\""), Some(TokenRefusal::Malformed(_))));
        let mut lenient = Verifier::new(Algorithm::HS256, 5);
        lenient.add_key(SECRET).unwrap();
        let early = token(r#"{"exp":1900000000,"nbf":1800000005}"#);
        assert!(lenient.verify(early.as_bytes(), NOW).is_ok());
    }

    #[test]
    fn aud_and_iss_are_checked_when_configured() {
        let mut v = verifier();
        let check = |v: &Verifier, claims: &str| v.verify(token(claims).as_bytes(), NOW).err();
        // Unconfigured: a token naming an audience is not for this server.
        assert_eq!(check(&v, r#"{"exp":1900000000,"iss":"x"}"#), None);
        assert_eq!(
            check(&v, r#"{"exp":1900000000,"aud":"push"}"#),
            Some(TokenRefusal::WrongAudience)
        );
        v.require_audience("push");
        v.require_issuer("https://app.example");
        let both = r#""iss":"https://app.example""#;
        for good in [
            format!(r#"{{"exp":1900000000,"aud":"push",{both}}}"#),
            format!(r#"{{"exp":1900000000,"aud":["web","push"],{both}}}"#),
        ] {
            assert_eq!(check(&v, &good), None, "{good}");
        }
        for (claims, refusal) in [
            (
                format!(r#"{{"exp":1900000000,{both}}}"#),
                TokenRefusal::WrongAudience,
            ),
            (
                format!(r#"{{"exp":1900000000,"aud":"web",{both}}}"#),
                TokenRefusal::WrongAudience,
            ),
            (
                format!(r#"{{"exp":1900000000,"aud":["web"],{both}}}"#),
                TokenRefusal::WrongAudience,
            ),
            (
                r#"{"exp":1900000000,"aud":"push"}"#.to_string(),
                TokenRefusal::WrongIssuer,
            ),
            (
                r#"{"exp":1900000000,"aud":"push","iss":"https://evil.example"}"#.to_string(),
                TokenRefusal::WrongIssuer,
            ),
        ] {
            assert_eq!(check(&v, &claims), Some(refusal), "{claims}");
        }
    }

    #[test]
    fn the_algorithm_is_the_servers_whatever_the_header_says() {
        let v = verifier();
        let claims = r#"{"exp":1900000000}"#;
        for header in [
            r#"{"alg":"none"}"#,
            r#"{"alg":"HS512"}"#,
            r#"{"alg":"RS256"}"#,
            r#"{"alg":"hs256"}"#,
        ] {
            assert_eq!(
                v.verify(hs256(header, claims, SECRET).as_bytes(), NOW),
                Err(TokenRefusal::WrongAlgorithm),
                "{header}"
            );
        }
        let unsigned = format!("{}.{}.", b64(br#"{"alg":"none"}"#), b64(claims.as_bytes()));
        assert_eq!(
            v.verify(unsigned.as_bytes(), NOW),
            Err(TokenRefusal::WrongAlgorithm)
        );
        let crit = hs256(r#"{"alg":"HS256","crit":["exp"]}"#, claims, SECRET);
        assert!(matches!(
            v.verify(crit.as_bytes(), NOW),
            Err(TokenRefusal::Malformed(_))
        ));
        let other = hs256(
            r#"{"alg":"HS256"}"#,
            claims,
            b"another-secret-another-secret-!!",
        );
        assert_eq!(
            v.verify(other.as_bytes(), NOW),
            Err(TokenRefusal::BadSignature)
        );
    }

    #[test]
    fn the_confusion_attack_meets_the_pinned_algorithm() {
        // An ES256 server's public key, used by an attacker as an HS256
        // secret: the header must name ES256, and then the HMAC is not an
        // ECDSA signature.
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let pem = public_pem(pair.public_key().as_ref());
        let mut v = Verifier::new(Algorithm::ES256, 0);
        v.add_key(pem.as_bytes()).unwrap();
        let claims = r#"{"exp":1900000000}"#;
        for header in [r#"{"alg":"HS256"}"#, r#"{"alg":"ES256"}"#] {
            let forged = hs256(header, claims, pem.as_bytes());
            assert!(
                matches!(
                    v.verify(forged.as_bytes(), NOW),
                    Err(TokenRefusal::WrongAlgorithm | TokenRefusal::BadSignature)
                ),
                "{header}"
            );
        }
        let signed = format!("{}.{}", b64(br#"{"alg":"ES256"}"#), b64(claims.as_bytes()));
        let sig = pair.sign(&rng, signed.as_bytes()).unwrap();
        let good = format!("{signed}.{}", b64(sig.as_ref()));
        assert!(v.verify(good.as_bytes(), NOW).is_ok());
        // And an HS256 server refuses a PEM key as its secret.
        let mut hs = Verifier::new(Algorithm::HS256, 0);
        assert!(hs.add_key(pem.as_bytes()).is_err());
    }

    /// A P-256 point as a PEM SubjectPublicKeyInfo.
    fn public_pem(point: &[u8]) -> String {
        let mut der = vec![0x30, 0x59, 0x30, 0x13, 0x06, 0x07];
        der.extend_from_slice(EC_PUBLIC_KEY);
        der.extend_from_slice(&[0x06, 0x08]);
        der.extend_from_slice(PRIME256V1);
        der.extend_from_slice(&[0x03, 0x42, 0x00]);
        der.extend_from_slice(point);
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            STANDARD.encode(der)
        )
    }

    #[test]
    fn two_keys_take_tokens_signed_by_either() {
        let second = b"a-second-secret-for-the-rotation";
        let mut v = verifier();
        v.add_key(second).unwrap();
        let claims = r#"{"exp":1900000000}"#;
        for secret in [SECRET, second] {
            let t = hs256(r#"{"alg":"HS256"}"#, claims, secret);
            assert!(v.verify(t.as_bytes(), NOW).is_ok());
        }
        let third = hs256(
            r#"{"alg":"HS256"}"#,
            claims,
            b"a-third-secret-nobody-configured",
        );
        assert_eq!(
            v.verify(third.as_bytes(), NOW),
            Err(TokenRefusal::BadSignature)
        );
    }

    #[test]
    fn a_null_claim_or_crit_is_malformed_before_any_other_check() {
        let mut v = verifier();
        v.require_audience("push");
        v.require_issuer("app");
        let good = serde_json::json!({"exp": 1_900_000_000, "aud": "push", "iss": "app"});
        assert!(v.verify(token(&good.to_string()).as_bytes(), NOW).is_ok());
        let mut expired = good.clone();
        expired["exp"] = 1.into();
        for claim in ["sub", "channels", "nbf", "exp", "aud", "iss"] {
            // Null, and the token otherwise good or expired alike.
            for claims in [&good, &expired] {
                let mut claims = claims.clone();
                claims[claim] = serde_json::Value::Null;
                let refusal = v.verify(token(&claims.to_string()).as_bytes(), NOW);
                let null = format!("malformed token: {claim} is null");
                assert_eq!(refusal.unwrap_err().reason(), null, "{claims}");
            }
        }
        let crit = hs256(r#"{"alg":"HS256","crit":null}"#, good.to_string(), SECRET);
        assert_eq!(
            v.verify(crit.as_bytes(), NOW).unwrap_err().reason(),
            "malformed token: crit is not supported"
        );
    }

    #[test]
    fn malformed_tokens_say_what_is_wrong() {
        let v = verifier();
        let good = token(r#"{"exp":1900000000}"#);
        let (signed, sig) = good.rsplit_once('.').unwrap();
        let cases = [
            String::new(),
            "a.b".into(),
            format!("{good}.x"),
            format!("{signed}.{sig}="),
            format!("!{good}"),
            format!("{}.{}.{sig}", b64(b"[]"), b64(b"{}")),
            "x".repeat(MAX_JWT_LEN + 1),
            token(r#"{"exp":1900000000,"sub":"a b"}"#),
            token(r#"{"exp":1900000000,"channels":"news"}"#),
            token(r#"{"exp":1900000000,"channels":["a,,b"]}"#),
            token(r#"[1900000000]"#),
            // JSON but for a byte that is not UTF-8, in a field not read.
            hs256(
                b"{\"alg\":\"HS256\",\"x\":\"\xe5\"}",
                b"{\"exp\":1900000000}",
                SECRET,
            ),
            hs256(
                b"{\"alg\":\"HS256\"}",
                b"{\"exp\":1900000000,\"x\":\"\xe5\"}",
                SECRET,
            ),
        ];
        for case in cases {
            let refusal = v.verify(case.as_bytes(), NOW).unwrap_err();
            assert!(
                matches!(
                    refusal,
                    TokenRefusal::Malformed(_) | TokenRefusal::BadSignature
                ),
                "{case}: {refusal:?}"
            );
            assert!(
                refusal.reason().starts_with("malformed token")
                    || refusal == TokenRefusal::BadSignature
            );
        }
    }

    #[test]
    fn key_files_are_checked_when_read() {
        let mut hs = Verifier::new(Algorithm::HS256, 0);
        assert!(hs.add_key(b"short\n").is_err());
        hs.add_key(b"0123456789abcdef0123456789abcdef\r\n").unwrap();
        let t = token(r#"{"exp":1900000000}"#);
        assert!(
            hs.verify(t.as_bytes(), NOW).is_ok(),
            "the line end is not the secret's"
        );
        let mut rs = Verifier::new(Algorithm::RS256, 0);
        assert!(rs.add_key(SECRET).is_err());
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let ec = public_pem(pair.public_key().as_ref());
        assert_eq!(
            rs.add_key(ec.as_bytes()),
            Err(KeyError("the PUBLIC KEY is not an RSA key".into()))
        );
        let mut es = Verifier::new(Algorithm::ES256, 0);
        assert!(es
            .add_key(b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----")
            .is_err());
        assert_eq!(es.key_count(), 0);
    }

    #[test]
    fn der_lengths_are_read_in_both_forms_and_never_past_the_end() {
        assert_eq!(
            der_take(&[0x02, 0x01, 0x05, 0xff], 0x02),
            Some((&[5u8][..], &[0xffu8][..]))
        );
        let long = [&[0x04, 0x81, 0x80][..], &[7; 0x80]].concat();
        assert_eq!(
            der_take(&long, 0x04).map(|(c, r)| (c.len(), r.len())),
            Some((128, 0))
        );
        assert_eq!(der_take(&[0x04, 0x81], 0x04), None);
        assert_eq!(der_take(&[0x04, 0x05, 1], 0x04), None);
        assert_eq!(der_take(&[0x04, 0x80], 0x04), None);
        assert_eq!(der_take(&[0x02, 0x00], 0x04), None);
        // A 2048-bit modulus with its sign byte, and exponent 65537.
        let mut modulus = vec![0x00, 0xc0];
        modulus.extend_from_slice(&[1; 255]);
        let mut key = vec![0x02, 0x82, 0x01, 0x01];
        key.extend_from_slice(&modulus);
        key.extend_from_slice(&[0x02, 0x03, 0x01, 0x00, 0x01]);
        let der = [
            &[0x30, 0x82, (key.len() >> 8) as u8, key.len() as u8][..],
            &key,
        ]
        .concat();
        assert_eq!(rsa_modulus_bits(&der), Some(2048));
    }
}
