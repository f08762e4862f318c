//! Channel names and client ids, and the patterns that allow channels:
//! what they may hold, checked once where they come in (an upgrade's
//! query, a token file, a command, a flag).
//!
//! A name is 1 to [`MAX_NAME_LEN`] bytes of ASCII letters, digits and
//! `- _ . : @`: nothing that needs escaping in a URL query, a shell word
//! or a line of the command language, and no `,` or space, which separate
//! names there.

use std::fmt;

/// The longest channel name or client id, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// Why a name or a pattern was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameError {
    /// Nothing at all.
    Empty,
    /// Longer than [`MAX_NAME_LEN`] bytes.
    TooLong,
    /// A byte that names may not hold.
    BadByte(u8),
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::Empty => f.write_str("empty"),
            NameError::TooLong => write!(f, "longer than {MAX_NAME_LEN} bytes"),
            NameError::BadByte(b) => write!(
                f,
                "holds {:?}: only letters, digits and - _ . : @ are allowed",
                char::from(*b)
            ),
        }
    }
}

impl std::error::Error for NameError {}

/// Whether a name may hold `b`.
fn name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@')
}

/// Checks that `name` is a valid channel name or client id.
pub fn check(name: &str) -> Result<(), NameError> {
    check_with(name, name_byte)
}

fn check_with(name: &str, allowed: impl Fn(u8) -> bool) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong);
    }
    match name.bytes().find(|&b| !allowed(b)) {
        Some(b) => Err(NameError::BadByte(b)),
        None => Ok(()),
    }
}

/// Declares a name type: a `Box<str>` checked by [`check`] when it is
/// made, so that code which takes one never checks it again; and its
/// borrowed twin, a name checked where it was read (a request's query)
/// that stays in the text it came in.
macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $(#[$borrowed_doc:meta])* $borrowed:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub struct $name(Box<str>);

        impl $name {
            /// Checks `name` and keeps it, or says why it is not valid.
            pub fn new(name: &str) -> Result<$name, NameError> {
                check(name)?;
                Ok($name(name.into()))
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The name, borrowed.
            pub fn borrowed(&self) -> $borrowed<'_> {
                $borrowed(&self.0)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = NameError;

            fn try_from(name: &str) -> Result<$name, NameError> {
                $name::new(name)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        $(#[$borrowed_doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $borrowed<'a>(&'a str);

        impl<'a> $borrowed<'a> {
            /// Checks `name` and borrows it, or says why it is not valid.
            pub fn new(name: &'a str) -> Result<$borrowed<'a>, NameError> {
                check(name)?;
                Ok($borrowed(name))
            }

            /// The name as text.
            pub fn as_str(self) -> &'a str {
                self.0
            }

            /// The name, kept.
            pub fn owned(self) -> $name {
                $name(self.0.into())
            }
        }

        impl fmt::Display for $borrowed<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.0)
            }
        }
    };
}

name_type!(
    /// A channel name: 1 to [`MAX_NAME_LEN`] bytes of ASCII letters, digits
    /// and `- _ . : @`, checked once where it is made ([`ChannelName::new`],
    /// or a command's parse) and never again.
    ChannelName,
    /// A channel name checked where it was read, borrowed from that text
    /// ([`ChannelNameRef::new`], or [`ChannelName::borrowed`]).
    ChannelNameRef
);

name_type!(
    /// A client id: 1 to [`MAX_NAME_LEN`] bytes of ASCII letters, digits
    /// and `- _ . : @`, checked once where it is made ([`ClientId::new`],
    /// or a command's parse) and never again.
    ClientId,
    /// A client id checked where it was read, borrowed from that text
    /// ([`ClientIdRef::new`], or [`ClientId::borrowed`]).
    ClientIdRef
);

/// A pattern over channel names: a name in which `*` stands for any run
/// of bytes, so `news.*` allows `news.eu` and `news.`, and `*` allows
/// every channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern(Box<str>);

impl Pattern {
    /// Parses a pattern: a name that may also hold `*`.
    pub fn parse(text: &str) -> Result<Pattern, NameError> {
        check_with(text, |b| b == b'*' || name_byte(b))?;
        Ok(Pattern(text.into()))
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `name` matches: each `*` takes any run of bytes, the rest
    /// must be equal. The usual greedy match that comes back only to the
    /// last `*`: no recursion, at most pattern × name steps (64 × 64).
    pub fn matches(&self, name: &str) -> bool {
        let (p, n) = (self.0.as_bytes(), name.as_bytes());
        let (mut i, mut j) = (0, 0);
        // After the last `*`: where the pattern resumes, and where in the
        // name that `*`'s run ends so far.
        let mut star: Option<(usize, usize)> = None;
        while j < n.len() {
            if i < p.len() && p[i] == b'*' {
                star = Some((i + 1, j));
                i += 1;
            } else if i < p.len() && p[i] == n[j] {
                i += 1;
                j += 1;
            } else if let Some((resume, end)) = star {
                // Let the last `*` take one more byte and try again.
                star = Some((resume, end + 1));
                i = resume;
                j = end + 1;
            } else {
                return false;
            }
        }
        p[i..].iter().all(|&b| b == b'*')
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether some pattern in `patterns` matches `name`.
pub fn allowed(patterns: &[Pattern], name: &str) -> bool {
    patterns.iter().any(|p| p.matches(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_and_plain() {
        for good in [
            "a",
            "news.eu",
            "user@example.com",
            "A-b_c:1",
            &"x".repeat(64),
        ] {
            assert_eq!(check(good), Ok(()), "{good}");
        }
        assert_eq!(check(""), Err(NameError::Empty));
        assert_eq!(check(&"x".repeat(65)), Err(NameError::TooLong));
        for (bad, byte) in [
            ("a b", b' '),
            ("a,b", b','),
            ("a%20", b'%'),
            ("é", 0xC3),
            ("a*", b'*'),
        ] {
            assert_eq!(check(bad), Err(NameError::BadByte(byte)), "{bad}");
        }
        assert_eq!(
            NameError::BadByte(b',').to_string(),
            "holds ',': only letters, digits and - _ . : @ are allowed"
        );
    }

    #[test]
    fn channel_names_and_ids_are_checked_as_they_are_made() {
        for good in ["news.eu", "user@example.com", &"x".repeat(64)] {
            assert_eq!(ChannelName::new(good).unwrap().as_str(), good);
            assert_eq!(ClientId::try_from(good).unwrap().as_str(), good);
            let borrowed = ClientIdRef::new(good).unwrap();
            assert_eq!(borrowed.as_str(), good);
            assert_eq!(borrowed.owned().borrowed(), borrowed);
            assert_eq!(ChannelNameRef::new(good).unwrap().owned().as_str(), good);
        }
        let bad: [(&str, NameError); 4] = [
            ("", NameError::Empty),
            (&"x".repeat(65), NameError::TooLong),
            ("a,b", NameError::BadByte(b',')),
            ("news.*", NameError::BadByte(b'*')),
        ];
        for (name, why) in bad {
            assert_eq!(ChannelName::try_from(name), Err(why), "{name:?}");
            assert_eq!(ClientId::new(name), Err(why), "{name:?}");
            assert_eq!(ClientIdRef::new(name), Err(why), "{name:?}");
            assert_eq!(ChannelNameRef::new(name), Err(why), "{name:?}");
        }
        assert_eq!(ClientId::new("alice").unwrap().to_string(), "alice");
    }

    #[test]
    fn patterns_match_runs_at_each_star() {
        let cases: &[(&str, &str, bool)] = &[
            ("*", "anything", true),
            ("news.*", "news.eu", true),
            ("news.*", "news.", true),
            ("news.*", "news", false),
            ("news.*", "sports.eu", false),
            ("*.eu", "news.eu", true),
            ("*.eu", "news.us", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "a-b-b-c", true),
            ("a*b*c", "a-b-b-d", false),
            ("a**", "a", true),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            (
                "*a*a*a*b",
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                false,
            ),
        ];
        for &(pattern, name, want) in cases {
            assert_eq!(
                Pattern::parse(pattern).unwrap().matches(name),
                want,
                "{pattern} ~ {name}"
            );
        }
        assert_eq!(Pattern::parse("a b"), Err(NameError::BadByte(b' ')));
        assert!(allowed(
            &[Pattern::parse("x").unwrap(), Pattern::parse("n*").unwrap()],
            "news"
        ));
        assert!(!allowed(&[], "news"));
    }
}
