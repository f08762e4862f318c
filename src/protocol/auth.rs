//! Access control for the upgrade: allowed `Origin` values and bearer
//! tokens. Pure code over byte slices, like the rest of the handshake.
//!
//! Tokens are kept only as SHA-1 digests and compared digest against
//! digest in constant time, so neither a token's content nor its length
//! shows in the time a check takes, and a `Debug` print or a log line can
//! never contain one.

use std::fmt;

use sha1::{Digest, Sha1};

use crate::protocol::names::{ClientId, Pattern};

/// Longest token a token file may hold, in bytes.
pub const MAX_TOKEN_LEN: usize = 256;

/// Longest token a request may present (a signed token is longer than a
/// listed one: an RS256 token with an 8192-bit key and a few dozen
/// channel patterns fits), in bytes.
pub const MAX_PRESENTED_LEN: usize = 4096;

/// The query parameter a browser client passes its token in (browsers
/// cannot set an `Authorization` header on a WebSocket).
pub const TOKEN_PARAM: &str = "token";

/// The cookie a token may come in, for a page whose server set it
/// (`EventSource` can send neither a header nor, without the page's
/// script, a query). Read only where origins are checked: a browser
/// sends cookies on any site's behalf.
pub const TOKEN_COOKIE: &str = "wspush_token";

/// The set of tokens clients may present, each with what it grants.
#[derive(Clone, PartialEq, Eq)]
pub struct Tokens {
    digests: Vec<[u8; 20]>,
    grants: Vec<Grant>,
}

/// What a token allows beyond the upgrade itself: a token file line
/// `TOKEN channels=news.*,chat id=alice` grants those channels only, and
/// binds its bearer to client id `alice`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// The channels its bearer may subscribe to; `None`: whatever the
    /// server allows anyone.
    pub channels: Option<Vec<Pattern>>,
    /// The client id its bearer must use (and gets when it names none).
    pub id: Option<ClientId>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tokens({} tokens)", self.digests.len())
    }
}

/// Why a token list was refused; it never contains a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenError {
    /// A token is not acceptable; `line` is its 1-based line in a token
    /// file's text, or its position in a list given in code.
    Invalid {
        /// Where it is.
        line: usize,
        /// What is wrong with it.
        why: &'static str,
    },
    /// There is no token at all.
    Empty,
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenError::Invalid { line, why } => write!(f, "line {line}: {why}"),
            TokenError::Empty => f.write_str("no tokens"),
        }
    }
}

impl std::error::Error for TokenError {}

impl Tokens {
    /// Parses a token file's text: one token per line, optionally
    /// followed by `channels=PATTERN,...` (the channels its bearer may
    /// subscribe to) and `id=ID` (the client id its bearer must use);
    /// blank lines and lines starting with `#` are skipped; surrounding
    /// whitespace is trimmed. (Reading the file is the caller's.)
    pub fn parse(text: &[u8]) -> Result<Tokens, TokenError> {
        let mut digests = Vec::new();
        let mut grants = Vec::new();
        let lines = text
            .split(|&b| b == b'\n')
            .map(<[u8]>::trim_ascii)
            .enumerate()
            .filter(|(_, line)| !line.is_empty() && !line.starts_with(b"#"));
        for (index, line) in lines {
            let invalid = |why| TokenError::Invalid {
                line: index + 1,
                why,
            };
            let mut words = line
                .split(u8::is_ascii_whitespace)
                .filter(|w| !w.is_empty());
            let token = words.next().expect("a line that is not blank has a word");
            check_token(token).map_err(invalid)?;
            let mut grant = Grant::default();
            for word in words {
                let word = std::str::from_utf8(word).map_err(|_| invalid("not UTF-8"))?;
                match word.split_once('=') {
                    Some(("channels", list)) if grant.channels.is_none() => {
                        let patterns: Result<Vec<Pattern>, _> =
                            list.split(',').map(Pattern::parse).collect();
                        grant.channels =
                            Some(patterns.map_err(|_| invalid("a channel pattern is not valid"))?);
                    }
                    Some(("id", id)) if grant.id.is_none() => {
                        let id = ClientId::new(id).map_err(|_| invalid("the id is not valid"))?;
                        grant.id = Some(id);
                    }
                    _ => {
                        return Err(invalid(
                            "after the token: channels=PATTERN,... and id=ID, once each",
                        ))
                    }
                }
            }
            digests.push(digest(token));
            grants.push(grant);
        }
        Tokens::from_parts(digests, grants)
    }

    /// A token set from tokens given in code, granting what the server
    /// allows anyone.
    pub fn new<T: AsRef<[u8]>>(tokens: impl IntoIterator<Item = T>) -> Result<Tokens, TokenError> {
        let mut digests = Vec::new();
        for (i, token) in tokens.into_iter().enumerate() {
            let token = token.as_ref();
            check_token(token).map_err(|why| TokenError::Invalid { line: i + 1, why })?;
            digests.push(digest(token));
        }
        let grants = vec![Grant::default(); digests.len()];
        Tokens::from_parts(digests, grants)
    }

    fn from_parts(digests: Vec<[u8; 20]>, grants: Vec<Grant>) -> Result<Tokens, TokenError> {
        if digests.is_empty() {
            return Err(TokenError::Empty);
        }
        Ok(Tokens { digests, grants })
    }

    /// The position of `presented` among the tokens. Every stored digest
    /// is compared in full whatever matches, so the time depends only on
    /// how many tokens there are.
    pub(crate) fn find(&self, presented: &[u8]) -> Option<usize> {
        let presented = digest(presented);
        let mut found = usize::MAX;
        for (index, stored) in self.digests.iter().enumerate() {
            let diff = stored
                .iter()
                .zip(&presented)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            // All ones when equal, else zero: no branch on the digest.
            let mask = usize::from(diff == 0).wrapping_neg();
            found = (found & !mask) | (index & mask);
        }
        // Keep the compiler from turning the fold into an early exit.
        let found = std::hint::black_box(found);
        (found != usize::MAX).then_some(found)
    }

    /// What the token at `index` (a listed credential's) grants.
    pub fn grant(&self, index: usize) -> &Grant {
        &self.grants[index]
    }
}

/// Tokens are visible ASCII (no spaces), so they survive a header and a query unchanged.
fn check_token(token: &[u8]) -> Result<(), &'static str> {
    if token.len() > MAX_TOKEN_LEN {
        return Err("token longer than 256 bytes");
    }
    if !token.iter().all(|b| b.is_ascii_graphic()) {
        return Err("a token must be visible ASCII without spaces");
    }
    Ok(())
}

fn digest(token: &[u8]) -> [u8; 20] {
    Sha1::digest(token).into()
}

/// The token of a request: the `Authorization: Bearer` header first, else
/// the `token` query parameter (percent-decoded into `scratch`), else the
/// [`TOKEN_COOKIE`] in `cookie` (the `Cookie` header, if it is to be
/// read). `None` when none is there or the token is too long to be one.
pub fn presented_token<'a>(
    authorization: Option<&'a [u8]>,
    target: &'a str,
    cookie: Option<&'a [u8]>,
    scratch: &'a mut [u8; MAX_PRESENTED_LEN],
) -> Option<&'a [u8]> {
    if let Some(value) = authorization {
        let value = value.trim_ascii();
        let (scheme, token) = value.split_at(value.len().min(7));
        return scheme
            .eq_ignore_ascii_case(b"bearer ")
            .then(|| token.trim_ascii());
    }
    if let Some(encoded) = query_param(target, TOKEN_PARAM) {
        return percent_decode(encoded.as_bytes(), scratch);
    }
    cookie_value(cookie?, TOKEN_COOKIE).filter(|token| token.len() <= MAX_PRESENTED_LEN)
}

/// The value of the cookie `name` in a `Cookie` header (`a=1; b=2`,
/// RFC 6265 §4.2.1), without the quotes it may have.
fn cookie_value<'a>(header: &'a [u8], name: &str) -> Option<&'a [u8]> {
    let value = header
        .split(|&b| b == b';')
        .filter_map(|pair| {
            let pair = pair.trim_ascii();
            let at = pair.iter().position(|&b| b == b'=')?;
            Some((&pair[..at], &pair[at + 1..]))
        })
        .find(|(key, _)| *key == name.as_bytes())?
        .1;
    Some(
        value
            .strip_prefix(b"\"")
            .and_then(|v| v.strip_suffix(b"\""))
            .unwrap_or(value),
    )
}

/// The value of the first `name=value` pair in the target's query.
fn query_param<'a>(target: &'a str, name: &str) -> Option<&'a str> {
    let (_, query) = target.split_once('?')?;
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Decodes `%XX` escapes (and `+` as a space, as forms encode it) into
/// `out`; `None` if malformed or longer than `out`.
fn percent_decode<'a>(input: &[u8], out: &'a mut [u8; MAX_PRESENTED_LEN]) -> Option<&'a [u8]> {
    let mut len = 0;
    let mut i = 0;
    while i < input.len() {
        let byte = match input[i] {
            b'%' => {
                let hex = input.get(i + 1..i + 3)?;
                let value = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                i += 2;
                value
            }
            b'+' => b' ',
            other => other,
        };
        *out.get_mut(len)? = byte;
        len += 1;
        i += 1;
    }
    Some(&out[..len])
}

/// Whether an `Origin` header value is one of `allowed` (ASCII
/// case-insensitive, as scheme and host are). Every value is allowed when
/// the list is empty; a request without `Origin` is not from a browser and
/// is left to token checks.
pub fn origin_allowed(origin: Option<&[u8]>, allowed: &[String]) -> bool {
    match origin {
        _ if allowed.is_empty() => true,
        None => true,
        Some(origin) => allowed
            .iter()
            .any(|a| a.as_bytes().eq_ignore_ascii_case(origin.trim_ascii())),
    }
}

/// Checks a configured origin: `scheme://host[:port]`, nothing after.
pub fn check_origin(origin: &str) -> Result<(), String> {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return Err(format!(
            "origin {origin:?} must look like https://example.com"
        ));
    };
    if scheme.is_empty()
        || rest.is_empty()
        || rest.contains('/')
        || origin.contains(char::is_whitespace)
    {
        return Err(format!(
            "origin {origin:?} must be scheme://host[:port] with no path or trailing slash"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_exactly_and_print_nothing() {
        let tokens = Tokens::new(["s3cret", "other-token"]).unwrap();
        assert!(tokens.find(b"s3cret").is_some() && tokens.find(b"other-token").is_some());
        for wrong in [&b""[..], b"s3cre", b"s3cret ", b"S3CRET", b"s3cret\0"] {
            assert!(tokens.find(wrong).is_none(), "{wrong:?}");
        }
        let printed = format!("{tokens:?}");
        assert!(!printed.contains("s3cret"), "{printed}");
        assert!(Tokens::new(Vec::<&str>::new()).is_err());
        assert!(Tokens::new(["has space"]).is_err());
        assert!(Tokens::new(["x".repeat(MAX_TOKEN_LEN + 1)]).is_err());
    }

    #[test]
    fn token_files_skip_comments_and_name_bad_lines_without_the_token() {
        let tokens = Tokens::parse(b"# clients\n\n  alpha  \r\nbeta\n").unwrap();
        assert!(tokens.find(b"alpha").is_some() && tokens.find(b"beta").is_some());
        assert!(tokens.find(b"# clients").is_none());

        let error = Tokens::parse(b"alpha\nsecret with space\n").unwrap_err();
        assert_eq!(
            error,
            TokenError::Invalid {
                line: 2,
                why: "after the token: channels=PATTERN,... and id=ID, once each"
            }
        );
        assert!(!error.to_string().contains("secret"), "{error}");
        let error = Tokens::parse(b"s\x01cret\n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "line 1: a token must be visible ASCII without spaces"
        );
        assert_eq!(
            Tokens::parse(b"# nothing\n").unwrap_err(),
            TokenError::Empty
        );
    }

    #[test]
    fn token_lines_may_grant_channels_and_an_id() {
        let tokens = Tokens::parse(
            b"plain\nreader channels=news.*,chat\nalice-token id=alice channels=dm.alice\n",
        )
        .unwrap();
        let grant = |token: &[u8]| tokens.grant(tokens.find(token).unwrap()).clone();
        assert_eq!(grant(b"plain"), Grant::default());
        let reader = grant(b"reader");
        let patterns: Vec<&str> = reader
            .channels
            .iter()
            .flatten()
            .map(Pattern::as_str)
            .collect();
        assert_eq!((patterns, reader.id), (vec!["news.*", "chat"], None));
        let alice = grant(b"alice-token");
        assert_eq!(alice.id.as_ref().map(ClientId::as_str), Some("alice"));
        assert_eq!(tokens.find(b"nobody"), None);
        for (line, why) in [
            (
                &b"t channels=a channels=b"[..],
                "after the token: channels=PATTERN,... and id=ID, once each",
            ),
            (
                b"t id=a id=b",
                "after the token: channels=PATTERN,... and id=ID, once each",
            ),
            (
                b"t colour=blue",
                "after the token: channels=PATTERN,... and id=ID, once each",
            ),
            (b"t channels=a,,b", "a channel pattern is not valid"),
            (b"t id=a/b", "the id is not valid"),
        ] {
            assert_eq!(
                Tokens::parse(line),
                Err(TokenError::Invalid { line: 1, why }),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn the_header_wins_then_the_query_is_decoded_then_the_cookie() {
        let mut scratch = [0; MAX_PRESENTED_LEN];
        type Case = (
            Option<&'static [u8]>,
            &'static str,
            Option<&'static [u8]>,
            Option<&'static [u8]>,
        );
        let cookie = Some(&b"theme=dark; wspush_token=c00kie"[..]);
        let cases: [Case; 14] = [
            (Some(b"Bearer abc"), "/ws?token=zzz", cookie, Some(b"abc")),
            (Some(b"bearer   abc "), "/ws", None, Some(b"abc")),
            (Some(b"Basic abc"), "/ws?token=abc", cookie, None),
            (None, "/ws?id=1&token=a%2Bb%3D", cookie, Some(b"a+b=")),
            (None, "/ws?tokens=x&token=y", None, Some(b"y")),
            (None, "/ws?id=1", None, None),
            (None, "/ws?token=%zz", cookie, None),
            (None, "/ws", None, None),
            (None, "/ws", cookie, Some(b"c00kie")),
            (None, "/ws", Some(b"wspush_token=\"q\";x=1"), Some(b"q")),
            (None, "/ws", Some(b"a=1;wspush_token=b=c"), Some(b"b=c")),
            (None, "/ws", Some(b"xwspush_token=1; wspush_tokens=2"), None),
            (None, "/ws", Some(b"wspush_token"), None),
            (None, "/ws", Some(b""), None),
        ];
        for (header, target, cookie, want) in cases {
            assert_eq!(
                presented_token(header, target, cookie, &mut scratch),
                want,
                "{target} {cookie:?}"
            );
        }
        let long = format!("/ws?token={}", "a".repeat(MAX_PRESENTED_LEN + 1));
        assert_eq!(presented_token(None, &long, None, &mut scratch), None);
        let long = format!("wspush_token={}", "a".repeat(MAX_PRESENTED_LEN + 1));
        assert_eq!(
            presented_token(None, "/", Some(long.as_bytes()), &mut scratch),
            None
        );
    }

    #[test]
    fn origins_are_exact_apart_from_case() {
        let allowed = vec!["https://app.example.com".to_string()];
        assert!(origin_allowed(Some(b"https://app.example.com"), &allowed));
        assert!(origin_allowed(Some(b"HTTPS://App.Example.com"), &allowed));
        assert!(origin_allowed(None, &allowed));
        assert!(origin_allowed(Some(b"https://evil.example"), &[]));
        for other in [
            &b"https://app.example.com.evil"[..],
            b"http://app.example.com",
            b"https://app.example.com:8443",
            b"null",
        ] {
            assert!(!origin_allowed(Some(other), &allowed), "{other:?}");
        }
        assert!(check_origin("https://a.example:8443").is_ok());
        for bad in ["a.example", "https://a.example/", "https://", "https://a b"] {
            assert!(check_origin(bad).is_err(), "{bad}");
        }
    }
}
