//! The request target (path and query) a connection keeps from its upgrade
//! request, stored without a heap allocation when it is short.

use crate::protocol::auth::TOKEN_PARAM;
use crate::protocol::names::ClientIdRef;
use crate::protocol::query::{params, CHANNEL_PARAM, ID_PARAM, POSITIONS_PARAM, SINCE_PARAM};

/// Longest target stored inline, e.g. `/ws?id=12345678` fits.
const INLINE: usize = 15;

/// The length of an inline target, as an enum of its 16 values: the
/// other 240 of its byte are free for [`RequestTarget`]'s own tag, so
/// that a target takes 16 bytes, not 24.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
#[rustfmt::skip]
enum InlineLen {
    L0, L1, L2, L3, L4, L5, L6, L7, L8, L9, L10, L11, L12, L13, L14, L15,
}

impl InlineLen {
    /// Every length, by its value.
    #[rustfmt::skip]
    const ALL: [InlineLen; INLINE + 1] = {
        use InlineLen::*;
        [L0, L1, L2, L3, L4, L5, L6, L7, L8, L9, L10, L11, L12, L13, L14, L15]
    };

    fn of(len: usize) -> InlineLen {
        InlineLen::ALL[len]
    }

    fn get(self) -> usize {
        usize::from(self as u8)
    }
}

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
            Some(target) => RequestTarget(Stored::Boxed(Box::new(target.into()))),
            None => RequestTarget(Stored::Inline {
                len: InlineLen::of(self.len),
                bytes: self.inline,
            }),
        }
    }
}

/// A request target such as `/ws?id=01`: inline up to 15 bytes, boxed
/// when longer; 16 bytes either way.
#[derive(Debug, Clone, Default)]
pub struct RequestTarget(Stored);

/// Where a [`RequestTarget`] keeps its bytes.
#[derive(Debug, Clone)]
enum Stored {
    /// A short target, in place.
    Inline {
        /// Bytes used in `bytes`.
        len: InlineLen,
        /// UTF-8 bytes of the target.
        bytes: [u8; INLINE],
    },
    /// A longer target on the heap, behind one thin pointer (8 bytes
    /// beside the inline form's length).
    Boxed(Box<Box<str>>),
}

impl Default for Stored {
    fn default() -> Stored {
        Stored::Inline {
            len: InlineLen::L0,
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
    /// query. Copied once, onto the heap only when longer than 15 bytes.
    pub fn kept(target: &str, added_id: Option<ClientIdRef<'_>>) -> RequestTarget {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let pairs = query.split('&').filter(|pair| {
            let key = pair.split_once('=').map_or(*pair, |(key, _)| key);
            !pair.is_empty()
                && ![TOKEN_PARAM, CHANNEL_PARAM, POSITIONS_PARAM, SINCE_PARAM].contains(&key)
        });
        let added = added_id.map(|id| ["id=", id.as_str()]);
        let mut out = Builder::default();
        out.push(path);
        for (i, pair) in pairs.map(|p| ["", p]).chain(added).enumerate() {
            out.push(if i == 0 { "?" } else { "&" });
            pair.iter().for_each(|piece| out.push(piece));
        }
        out.finish()
    }

    /// The client id (the `id` parameter), if any: a connection's target
    /// holds only an id checked as its upgrade was taken (an `id` that is
    /// not a valid one, in a target kept some other way, is none).
    pub fn id(&self) -> Option<ClientIdRef<'_>> {
        let (_, query) = self.as_str().split_once('?')?;
        params(query)
            .find(|(key, _)| *key == ID_PARAM)
            .and_then(|(_, id)| ClientIdRef::new(id).ok())
    }

    /// The whole target, path and query.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Stored::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..len.get()]).expect("bug: stored from a str that fits")
            }
            Stored::Boxed(target) => target,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_targets_are_inline_and_long_ones_boxed() {
        assert_eq!(std::mem::size_of::<RequestTarget>(), 16);
        for target in [
            "",
            "/",
            "/ws?id=01",
            "/ws?id=12345678",
            "/ws?id=123456789",
            "/ws?id=0123456789abcde",
            "/a/much/longer/path?with=a&query=string",
        ] {
            let stored = RequestTarget::kept(target, None);
            assert_eq!(stored.as_str(), target);
            assert_eq!(
                matches!(stored.0, Stored::Inline { .. }),
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
            let added = added.map(|id| ClientIdRef::new(id).unwrap());
            let kept = RequestTarget::kept(target, added);
            assert_eq!(kept.as_str(), want, "{target}");
        }
        let id = |target| {
            RequestTarget::kept(target, None)
                .id()
                .map(|id| id.as_str().to_owned())
        };
        assert_eq!(id("/ws?x=1&id=7"), Some("7".to_owned()));
        assert_eq!(id("/ws?x=1"), None);
        assert_eq!(id("/ws?id=a%20b"), None, "not an id");
        let resumed = RequestTarget::kept("/ws?id=1234567&since=00c0ffee1234abcd.99999", None);
        assert!(matches!(resumed.0, Stored::Inline { .. }), "{resumed:?}");
    }
}
