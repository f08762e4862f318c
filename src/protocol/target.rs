//! The request target (path and query) a connection keeps from its upgrade
//! request, stored without a heap allocation when it is short.

/// Longest target stored inline, e.g. `/ws?id=0123456789ab` fits.
const INLINE: usize = 22;

/// A request target such as `/ws?id=01`: inline up to 22 bytes, boxed
/// when longer; 24 bytes either way.
#[derive(Debug, Clone)]
pub enum RequestTarget {
    /// A short target, in place.
    Inline {
        /// Bytes used in `bytes`.
        len: u8,
        /// UTF-8 bytes of the target.
        bytes: [u8; INLINE],
    },
    /// A longer target on the heap.
    Boxed(Box<str>),
}

impl Default for RequestTarget {
    fn default() -> RequestTarget {
        RequestTarget::Inline {
            len: 0,
            bytes: [0; INLINE],
        }
    }
}

impl RequestTarget {
    /// Stores the target that is `parts` joined, copying it once.
    pub fn from_parts(parts: [&str; 2]) -> RequestTarget {
        let len = parts[0].len() + parts[1].len();
        if len > INLINE {
            return RequestTarget::Boxed(parts.concat().into());
        }
        let mut bytes = [0; INLINE];
        bytes[..parts[0].len()].copy_from_slice(parts[0].as_bytes());
        bytes[parts[0].len()..len].copy_from_slice(parts[1].as_bytes());
        RequestTarget::Inline {
            len: len as u8,
            bytes,
        }
    }

    /// The whole target, path and query.
    pub fn as_str(&self) -> &str {
        match self {
            RequestTarget::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)])
                    .expect("bug: stored from a str that fits")
            }
            RequestTarget::Boxed(target) => target,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_targets_are_inline_and_long_ones_boxed() {
        assert_eq!(std::mem::size_of::<RequestTarget>(), 24);
        for target in [
            "",
            "/",
            "/ws?id=01",
            "/ws?id=0123456789abcde",
            "/a/much/longer/path?with=a&query=string",
        ] {
            let stored = RequestTarget::from_parts([target, ""]);
            assert_eq!(stored.as_str(), target);
            assert_eq!(
                matches!(stored, RequestTarget::Inline { .. }),
                target.len() <= INLINE,
                "{target}"
            );
        }
        let (head, tail) = ("/ws?a=1&", "b=2");
        assert_eq!(
            RequestTarget::from_parts([head, tail]).as_str(),
            "/ws?a=1&b=2"
        );
        let long = ["/a/much/longer/path?", "with=a&query=string"];
        assert_eq!(RequestTarget::from_parts(long).as_str(), long.concat());
    }
}
