//! What an upgrade's query asks for besides the upgrade: a client id
//! (`?id=alice`) and channels (`?channel=news&channel=chat`), checked
//! against what the token grants and what the server allows anyone, and
//! positions (`?positions=1`, or `?since=POSITION` to resume).
//! Names are not percent-decoded: none of their bytes needs escaping, so
//! a `%` is simply not valid.

use crate::protocol::auth::Grant;
use crate::protocol::http::Rejection;
use crate::protocol::names::{self, ChannelNameRef, ClientId, ClientIdRef, Pattern};
use crate::protocol::position::Position;

/// The query parameter naming the client id.
pub const ID_PARAM: &str = "id";
/// The query parameter naming a channel (repeatable).
pub const CHANNEL_PARAM: &str = "channel";
/// The query parameter asking for positions (`1`) or not (`0`).
pub const POSITIONS_PARAM: &str = "positions";
/// The query parameter naming the position to resume after.
pub const SINCE_PARAM: &str = "since";

/// Whether a connection asks for positions, and from where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// No positions: messages as they are published.
    Off,
    /// Positions, from now on.
    Positions,
    /// Positions, and every message after this one (`None`: what was
    /// given is not a position, and the loop answers it as unknown).
    Since(Option<Position>),
}

impl Resume {
    /// Resuming after `since` as given (a query's `since`, an event
    /// stream's `Last-Event-ID`): parsed here, once.
    pub fn since(since: &str) -> Resume {
        Resume::Since(Position::parse(since.as_bytes()))
    }
}

/// What the server allows.
#[derive(Debug, Clone, Copy)]
pub struct UpgradeLimits<'a> {
    /// The most channels one connection may ask for.
    pub max_channels: usize,
    /// The channels anyone may subscribe to (empty: any); a token with
    /// channels of its own is held to those instead.
    pub allowed: &'a [Pattern],
    /// An `?id=` is refused unless the token binds it.
    pub require_token_id: bool,
}

/// A request's id and channels, valid and allowed: names checked here,
/// borrowed from the request's target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked<'a> {
    /// The client id: the query's, or the token's when the query has none.
    pub id: Option<ClientIdRef<'a>>,
    /// The channels asked for, in order (a name given twice comes twice).
    pub channels: Vec<ChannelNameRef<'a>>,
    /// Positions, and from where.
    pub resume: Resume,
}

/// The `key=value` pairs of a query (a pair without `=` has an empty value).
pub fn params(query: &str) -> impl Iterator<Item = (&str, &str)> + Clone {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

/// The id and channels `target` asks for: 400 for a name that is not
/// valid, a second id or more channels than [`UpgradeLimits::max_channels`];
/// 403 for an id other than the token's or a channel neither the token
/// nor the server allows.
pub fn asked<'a>(
    target: &'a str,
    grant: Option<&'a Grant>,
    limits: &UpgradeLimits<'_>,
) -> Result<Asked<'a>, Rejection> {
    let query = target.split_once('?').map_or("", |(_, query)| query);
    let mut id = None;
    let mut channels = Vec::new();
    let mut positions = None;
    let mut since = None;
    for (key, value) in params(query) {
        match key {
            POSITIONS_PARAM if positions.is_some() => {
                return Err(Rejection::BadRequest("more than one positions"))
            }
            POSITIONS_PARAM => match value {
                "0" | "1" => positions = Some(value == "1"),
                _ => return Err(Rejection::BadRequest("positions is 0 or 1")),
            },
            SINCE_PARAM if since.is_some() => {
                return Err(Rejection::BadRequest("more than one since"))
            }
            SINCE_PARAM => since = Some(value),
            ID_PARAM if id.is_some() => return Err(Rejection::BadRequest("more than one id")),
            ID_PARAM => {
                id = Some(ClientIdRef::new(value).map_err(|_| {
                    Rejection::BadRequest(
                        "the id is not 1-64 bytes of letters, digits and - _ . : @",
                    )
                })?);
            }
            CHANNEL_PARAM => {
                let channel = ChannelNameRef::new(value).map_err(|_| {
                    Rejection::BadRequest(
                        "a channel is not 1-64 bytes of letters, digits and - _ . : @",
                    )
                })?;
                if channels.len() == limits.max_channels {
                    return Err(Rejection::TooManyChannels(limits.max_channels));
                }
                let allowed = match grant.and_then(|g| g.channels.as_deref()) {
                    Some(granted) => names::allowed(granted, value),
                    None => limits.allowed.is_empty() || names::allowed(limits.allowed, value),
                };
                if !allowed {
                    return Err(Rejection::Forbidden("channel not allowed"));
                }
                channels.push(channel);
            }
            _ => {}
        }
    }
    let id = match (
        id,
        grant.and_then(|g| g.id.as_ref()).map(ClientId::borrowed),
    ) {
        (Some(asked), Some(bound)) if asked != bound => {
            return Err(Rejection::Forbidden("id not allowed for this token"))
        }
        (Some(_), None) if limits.require_token_id => {
            return Err(Rejection::Forbidden("id not bound by a token"))
        }
        (None, bound) => bound,
        (asked, _) => asked,
    };
    let resume = match (since, positions) {
        (Some(_), Some(false)) => return Err(Rejection::BadRequest("since asks for positions")),
        (Some(since), _) => Resume::since(since),
        (None, Some(true)) => Resume::Positions,
        (None, _) => Resume::Off,
    };
    Ok(Asked {
        id,
        channels,
        resume,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id an answer took, as text.
    fn id_of(asked: Result<Asked<'_>, Rejection>) -> Option<&str> {
        asked.unwrap().id.map(ClientIdRef::as_str)
    }

    fn patterns(list: &[&str]) -> Vec<Pattern> {
        list.iter().map(|p| Pattern::parse(p).unwrap()).collect()
    }

    #[test]
    fn ids_and_channels_are_read_checked_and_allowed() {
        let anyone = UpgradeLimits {
            max_channels: 3,
            allowed: &[],
            require_token_id: false,
        };
        let ok = asked("/ws?id=alice&x=1&channel=news&channel=chat", None, &anyone).unwrap();
        assert_eq!(ok.id.map(ClientIdRef::as_str), Some("alice"));
        let channels: Vec<&str> = ok.channels.iter().map(|c| c.as_str()).collect();
        assert_eq!(channels, ["news", "chat"]);
        let none = asked("/ws", None, &anyone).unwrap();
        assert_eq!((none.id, none.channels.len()), (None, 0));
        assert_eq!(none.resume, Resume::Off);

        let bad = |target: &str| asked(target, None, &anyone).map(|_| ()).unwrap_err();
        assert_eq!(bad("/?id=a&id=b").status(), 400);
        assert_eq!(bad("/?id=").status(), 400);
        assert_eq!(bad("/?id=al%20ice").status(), 400);
        assert_eq!(bad("/?channel=a,b").status(), 400);
        assert_eq!(bad("/?channel").status(), 400);
        assert_eq!(
            bad("/?channel=a&channel=b&channel=c&channel=d"),
            Rejection::TooManyChannels(3)
        );

        let server = patterns(&["news.*"]);
        let restricted = UpgradeLimits {
            max_channels: 3,
            allowed: &server,
            require_token_id: false,
        };
        assert!(asked("/?channel=news.eu", None, &restricted).is_ok());
        assert_eq!(
            asked("/?channel=chat", None, &restricted),
            Err(Rejection::Forbidden("channel not allowed"))
        );
    }

    #[test]
    fn positions_and_since_are_read_and_a_since_is_parsed_once() {
        let anyone = UpgradeLimits {
            max_channels: 3,
            allowed: &[],
            require_token_id: false,
        };
        let resume = |target: &str| asked(target, None, &anyone).map(|a| a.resume);
        assert_eq!(resume("/?positions=1"), Ok(Resume::Positions));
        assert_eq!(resume("/?positions=0"), Ok(Resume::Off));
        let position = Position {
            epoch: crate::protocol::position::Epoch(0xabc),
            seq: 7,
        };
        assert_eq!(
            resume("/?since=0000000000000abc.7&id=x"),
            Ok(Resume::Since(Some(position)))
        );
        // Not a position: resumed as unknown, never refused.
        assert_eq!(resume("/?since=abc.1"), Ok(Resume::Since(None)));
        assert_eq!(resume("/?since=&positions=1"), Ok(Resume::Since(None)));
        assert_eq!(resume("/?since=%ff%00"), Ok(Resume::Since(None)));
        for bad in [
            "/?positions=yes",
            "/?positions",
            "/?positions=1&positions=1",
            "/?since=a&since=b",
            "/?since=a&positions=0",
        ] {
            assert_eq!(resume(bad).unwrap_err().status(), 400, "{bad}");
        }
    }

    #[test]
    fn a_token_holds_its_bearer_to_its_channels_and_id() {
        let server = patterns(&["public"]);
        let limits = UpgradeLimits {
            max_channels: 8,
            allowed: &server,
            require_token_id: false,
        };
        let grant = Grant {
            channels: Some(patterns(&["chat.*"])),
            id: Some(ClientId::new("alice").unwrap()),
        };
        let ok = asked("/?channel=chat.1", Some(&grant), &limits).unwrap();
        assert_eq!(
            ok.id.map(ClientIdRef::as_str),
            Some("alice"),
            "the token's id when the query names none"
        );
        assert!(asked("/?id=alice&channel=chat.2", Some(&grant), &limits).is_ok());
        assert_eq!(
            asked("/?id=bob", Some(&grant), &limits),
            Err(Rejection::Forbidden("id not allowed for this token"))
        );
        assert_eq!(
            asked("/?channel=public", Some(&grant), &limits),
            Err(Rejection::Forbidden("channel not allowed")),
            "the token's channels, not the server's"
        );
        let plain = Grant::default();
        assert!(asked("/?id=bob&channel=public", Some(&plain), &limits).is_ok());
    }

    #[test]
    fn with_ids_required_from_tokens_only_a_bound_id_is_taken() {
        let limits = UpgradeLimits {
            max_channels: 8,
            allowed: &[],
            require_token_id: true,
        };
        let alice = Grant {
            channels: None,
            id: Some(ClientId::new("alice").unwrap()),
        };
        let unbound = Grant::default();
        let refused = Err(Rejection::Forbidden("id not bound by a token"));
        assert_eq!(asked("/?id=alice", None, &limits), refused);
        assert_eq!(asked("/?id=alice", Some(&unbound), &limits), refused);
        assert_eq!(
            id_of(asked("/?id=alice", Some(&alice), &limits)),
            Some("alice")
        );
        assert_eq!(id_of(asked("/", Some(&alice), &limits)), Some("alice"));
        assert_eq!(id_of(asked("/?channel=a", None, &limits)), None);
        assert_eq!(
            asked("/?id=bob", Some(&alice), &limits),
            Err(Rejection::Forbidden("id not allowed for this token"))
        );
    }
}
