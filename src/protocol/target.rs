//! The request target (path and query) a connection keeps from its upgrade
//! request, stored without a heap allocation when it is short.

use crate::protocol::auth::TOKEN_PARAM;
use crate::protocol::query::{params, CHANNEL_PARAM, ID_PARAM, POSITIONS_PARAM, SINCE_PARAM};

/// Longest target stored inline, e.g. `/ws?id=0123456789ab` fits.
const INLINE: usize = 22;

/// Builds a target piece by piece: in place while it fits, then on the heap.
#[derive(Default)]
struct Builder {
    len: usize,
    inline: [u8; INLINE],
    spilled: Option<String>,
}

impl Builder {
    fn push(&mut self, piece: &str) {
        if let Some(spilled) = &mut self.spilled {
            spilled.push_str(piece);
        } else if self.len + piece.len() <= INLINE {
            self.inline[self.len..self.len + piece.len()].copy_from_slice(piece.as_bytes());
            self.len += piece.len();
        } else {
            let mut spilled = String::with_capacity(self.len + piece.len() + 16);
            spilled
                .push_str(std::str::from_utf8(&self.inline[..self.len]).expect("pieces are str"));
            spilled.push_str(piece);
            self.spilled = Some(spilled);
        }
    }

    fn finish(self) -> RequestTarget {
        match self.spilled {
            Some(target) => RequestTarget::Boxed(target.into()),
            None => RequestTarget::Inline {
                len: self.len as u8,
                bytes: self.inline,
            },
        }
    }
}

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
    /// The target a connection keeps of the one it asked for: without its
    /// `token` parameter (a token is never kept), its `channel`
    /// parameters (channels live in the loop's routes, and change) and its
    /// `positions` and `since` (acted on at the upgrade, and kept as one
    /// flag), with
    /// `id=ADDED` appended when the id came from a token rather than the
    /// query. Copied once, onto the heap only when longer than 22 bytes.
    pub fn kept(target: &str, added_id: Option<&str>) -> RequestTarget {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let pairs = query.split('&').filter(|pair| {
            let key = pair.split_once('=').map_or(*pair, |(key, _)| key);
            !pair.is_empty()
                && ![TOKEN_PARAM, CHANNEL_PARAM, POSITIONS_PARAM, SINCE_PARAM].contains(&key)
        });
        let added = added_id.map(|id| ["id=", id]);
        let mut out = Builder::default();
        out.push(path);
        for (i, pair) in pairs.map(|p| ["", p]).chain(added).enumerate() {
            out.push(if i == 0 { "?" } else { "&" });
            pair.iter().for_each(|piece| out.push(piece));
        }
        out.finish()
    }

    /// The client id (the `id` parameter), if any.
    pub fn id(&self) -> Option<&str> {
        let (_, query) = self.as_str().split_once('?')?;
        params(query)
            .find(|(key, _)| *key == ID_PARAM)
            .map(|(_, id)| id)
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
            let stored = RequestTarget::kept(target, None);
            assert_eq!(stored.as_str(), target);
            assert_eq!(
                matches!(stored, RequestTarget::Inline { .. }),
                target.len() <= INLINE,
                "{target}"
            );
        }
    }

    #[test]
    fn the_token_channels_and_positions_are_not_kept() {
        let cases = [
            ("/ws?id=1234567&positions=1", None, "/ws?id=1234567"),
            ("/ws?since=00c0ffee1234abcd.9&id=1", None, "/ws?id=1"),
            ("/ws?token=s3cret", None, "/ws"),
            ("/ws?id=1&token=x", None, "/ws?id=1"),
            ("/ws?token=x&id=1", None, "/ws?id=1"),
            ("/ws?tokens=x", None, "/ws?tokens=x"),
            ("/ws?a=1&token=x&b=2", None, "/ws?a=1&b=2"),
            ("/ws?channel=a&id=7&channel=b&token=t", None, "/ws?id=7"),
            ("/ws?channel=a", Some("alice"), "/ws?id=alice"),
            ("/ws?x=1&&y", Some("bob"), "/ws?x=1&y&id=bob"),
            (
                "/a/long/path?keep=this&token=no&and=this-too",
                None,
                "/a/long/path?keep=this&and=this-too",
            ),
        ];
        for (target, added, want) in cases {
            let kept = RequestTarget::kept(target, added);
            assert_eq!(kept.as_str(), want, "{target}");
        }
        assert_eq!(RequestTarget::kept("/ws?x=1&id=7", None).id(), Some("7"));
        assert_eq!(RequestTarget::kept("/ws?x=1", None).id(), None);
        let resumed = RequestTarget::kept("/ws?id=123456789&since=00c0ffee1234abcd.99999", None);
        assert!(
            matches!(resumed, RequestTarget::Inline { .. }),
            "{resumed:?}"
        );
    }
}
