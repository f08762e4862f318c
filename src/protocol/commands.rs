//! The command language of `--input commands`: one command per line, a
//! verb and its arguments separated by single spaces, the payload last so
//! that it is the rest of the line, whatever it holds.
//!
//! ```text
//! all TEXT                    every open connection
//! pub CHANNELS TEXT           the subscribers of any of CHANNELS (a,b,c), once each
//! id ID TEXT                  every connection of client ID
//! conn KEY TEXT               one connection (KEY as upstream lines give it)
//! sub ID CHANNELS             subscribe client ID's connections
//! unsub ID CHANNELS           unsubscribe them
//! close id ID [CODE [REASON]] close client ID's connections (1000 by default)
//! close conn KEY [CODE [REASON]]
//! ```
//!
//! `all`, `pub`, `id` and `conn` send a text message; as `all:b64`,
//! `pub:b64`, `id:b64` and `conn:b64` they send a binary one, given in
//! base64. A payload may be empty (`all` alone sends an empty message).
//! Pure code: a line in, a [`Command`] or a [`CommandError`] out.

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use crate::protocol::names::{ChannelName, ClientId, NameError};
use crate::protocol::ws::CloseCode;

/// The longest close reason, in bytes: a close frame's payload is at
/// most 125 bytes, two of them the code.
pub const MAX_REASON_LEN: usize = 123;

/// The most bytes a list of channels a message is for may take, its
/// names joined by commas: the history keeps a message's audience with a
/// 16-bit length.
pub const MAX_CHANNEL_LIST_LEN: usize = u16::MAX as usize;

/// One connection of one server, as upstream lines name it and `conn`
/// and `close conn` address it: `INSTANCE.SLOT.SERIAL`. The serial tells
/// apart the connections that held the same slot one after the other, so
/// a key outlives its connection without reaching the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnRef {
    /// The instance under `--processes` (1 to N), or 0 for a lone server.
    pub instance: u32,
    /// The connection's slot in that instance.
    pub slot: u32,
    /// Which of the slot's connections.
    pub serial: u32,
}

impl ConnRef {
    /// Parses `INSTANCE.SLOT.SERIAL` (three decimal numbers).
    pub fn parse(text: &str) -> Option<ConnRef> {
        let mut parts = text.split('.').map(|p| {
            (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .then(|| p.parse::<u32>().ok())
                .flatten()
        });
        let conn = ConnRef {
            instance: parts.next()??,
            slot: parts.next()??,
            serial: parts.next()??,
        };
        parts.next().is_none().then_some(conn)
    }
}

impl fmt::Display for ConnRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.instance, self.slot, self.serial)
    }
}

/// Who a message (or a close) is for, its names checked as they were
/// made. It is queued with every targeted message, so it is small: 24
/// bytes beside its names (one allocation each, and one more for a list
/// of channels).
///
/// ```
/// use wspush::{ChannelName, ClientId, Command, Payload, Recipients};
///
/// // Made from checked names ...
/// let news = Recipients::Channels(Box::new([ChannelName::new("news")?]));
/// let alice = Recipients::Id(ClientId::new("alice")?);
/// // ... or parsed from a line of the command language.
/// match Command::parse("pub news hello")? {
///     Command::Send { to, payload: Payload::Text(text) } => {
///         assert_eq!(to, news);
///         assert_eq!(text, "hello");
///     }
///     other => panic!("not a send: {other:?}"),
/// }
/// assert_ne!(news, alice);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recipients {
    /// Every open connection.
    All,
    /// The subscribers of any of these channels, each once.
    Channels(Box<[ChannelName]>),
    /// Every connection of this client id.
    Id(ClientId),
    /// One connection.
    Conn(ConnRef),
}

impl Recipients {
    /// The bytes of the names it holds (what a queued command is charged
    /// for them).
    pub(crate) fn names_len(&self) -> usize {
        match self {
            Recipients::All | Recipients::Conn(_) => 0,
            Recipients::Channels(names) => names_len(names),
            Recipients::Id(id) => id.as_str().len(),
        }
    }
}

#[cfg(test)]
impl Recipients {
    /// The subscribers of `names` (valid names).
    pub(crate) fn channels(names: &[&str]) -> Recipients {
        Recipients::Channels(names.iter().map(|n| ChannelName::new(n).unwrap()).collect())
    }

    /// The connections of client `id` (a valid id).
    pub(crate) fn id(id: &str) -> Recipients {
        Recipients::Id(ClientId::new(id).unwrap())
    }
}

/// The bytes of `names`.
pub(crate) fn names_len(names: &[ChannelName]) -> usize {
    names.iter().map(|n| n.as_str().len()).sum()
}

/// Whether `names`, joined by commas, fit [`MAX_CHANNEL_LIST_LEN`].
pub fn channel_list_fits(names: &[ChannelName]) -> bool {
    names_len(names) + names.len().saturating_sub(1) <= MAX_CHANNEL_LIST_LEN
}

/// A message's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload<'a> {
    /// A text message: the rest of the line.
    Text(&'a str),
    /// A binary message, decoded from base64.
    Binary(Vec<u8>),
}

/// One parsed line: what it asks for, its names already checked, its
/// payload and reason borrowed from the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    /// Send a message.
    Send {
        /// Who gets it.
        to: Recipients,
        /// What it holds.
        payload: Payload<'a>,
    },
    /// Subscribe a client's connections to channels.
    Subscribe {
        /// The client id.
        id: ClientId,
        /// The channels.
        channels: Box<[ChannelName]>,
    },
    /// Unsubscribe a client's connections from channels.
    Unsubscribe {
        /// The client id.
        id: ClientId,
        /// The channels.
        channels: Box<[ChannelName]>,
    },
    /// Close connections with a close frame.
    Close {
        /// Whose: a client id's connections or one connection.
        who: Recipients,
        /// The close code (1000 unless given).
        code: CloseCode,
        /// The reason (may be empty), at most [`MAX_REASON_LEN`] bytes.
        reason: &'a str,
    },
}

/// Why a line is not a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandError {
    /// The line is empty.
    Empty,
    /// The first word is none of the verbs.
    UnknownVerb,
    /// An argument is missing; it names which.
    Missing(&'static str),
    /// A channel name or client id is not valid; it names which.
    BadName(&'static str, NameError),
    /// A connection key is not `INSTANCE.SLOT.SERIAL`.
    BadKey,
    /// A `:b64` payload is not base64.
    BadBase64,
    /// A close code is not one a server may send (1000–1003, 1007–1011,
    /// 3000–4999).
    BadCode,
    /// A close reason is longer than [`MAX_REASON_LEN`] bytes.
    ReasonTooLong,
    /// A list of channels is longer than [`MAX_CHANNEL_LIST_LEN`] bytes.
    ChannelListTooLong,
    /// `sub`, `unsub` or `close` has more arguments than it takes.
    TrailingWords,
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandError::Empty => f.write_str("an empty line is not a command"),
            CommandError::UnknownVerb => f.write_str(
                "unknown command: expected all, pub, id, conn (each also as :b64), sub, unsub or close",
            ),
            CommandError::Missing(what) => write!(f, "missing {what}"),
            CommandError::BadName(what, why) => write!(f, "{what} {why}"),
            CommandError::BadKey => {
                f.write_str("a connection key is INSTANCE.SLOT.SERIAL, three numbers")
            }
            CommandError::BadBase64 => f.write_str("the payload is not base64"),
            CommandError::BadCode => f.write_str(
                "a close code is 1000-1003, 1007-1011 or 3000-4999",
            ),
            CommandError::ReasonTooLong => {
                write!(f, "a close reason is at most {MAX_REASON_LEN} bytes")
            }
            CommandError::ChannelListTooLong => {
                write!(f, "a list of channels is at most {MAX_CHANNEL_LIST_LEN} bytes")
            }
            CommandError::TrailingWords => f.write_str("more words than the command takes"),
        }
    }
}

impl std::error::Error for CommandError {}

impl Command<'_> {
    /// Parses one line (without its line ending).
    pub fn parse(line: &str) -> Result<Command<'_>, CommandError> {
        if line.is_empty() {
            return Err(CommandError::Empty);
        }
        let (verb, rest) = split(line);
        let (verb, binary) = match verb.strip_suffix(":b64") {
            Some(verb) => (verb, true),
            None => (verb, false),
        };
        match verb {
            "all" => send(Recipients::All, rest, binary),
            "pub" => {
                let (channels, body) = split(rest.ok_or(CommandError::Missing("channels"))?);
                send(Recipients::Channels(channels_arg(channels)?), body, binary)
            }
            "id" => {
                let (id, body) = split(rest.ok_or(CommandError::Missing("id"))?);
                send(Recipients::Id(id_arg(id)?), body, binary)
            }
            "conn" => {
                let (key, body) = split(rest.ok_or(CommandError::Missing("connection key"))?);
                send(Recipients::Conn(key_arg(key)?), body, binary)
            }
            "sub" | "unsub" if !binary => {
                let (id, channels) = split(rest.ok_or(CommandError::Missing("id"))?);
                let id = id_arg(id)?;
                let (channels, extra) = split(channels.ok_or(CommandError::Missing("channels"))?);
                if extra.is_some() {
                    return Err(CommandError::TrailingWords);
                }
                let channels = channels_arg(channels)?;
                Ok(if verb == "sub" {
                    Command::Subscribe { id, channels }
                } else {
                    Command::Unsubscribe { id, channels }
                })
            }
            "close" if !binary => close(rest.ok_or(CommandError::Missing("id or conn"))?),
            _ => Err(CommandError::UnknownVerb),
        }
    }
}

/// A message to `to` with the rest of the line, `body`, as its payload.
fn send<'a>(
    to: Recipients,
    body: Option<&'a str>,
    binary: bool,
) -> Result<Command<'a>, CommandError> {
    let body = body.unwrap_or("");
    let payload = if binary {
        Payload::Binary(BASE64.decode(body).map_err(|_| CommandError::BadBase64)?)
    } else {
        Payload::Text(body)
    };
    Ok(Command::Send { to, payload })
}

/// `close id ID [CODE [REASON]]` or `close conn KEY [CODE [REASON]]`.
fn close(args: &str) -> Result<Command<'_>, CommandError> {
    let (kind, rest) = split(args);
    let missing = match kind {
        "id" => "id",
        "conn" => "connection key",
        _ => return Err(CommandError::Missing("id or conn")),
    };
    let (who, rest) = split(rest.ok_or(CommandError::Missing(missing))?);
    let who = match kind {
        "id" => Recipients::Id(id_arg(who)?),
        _ => Recipients::Conn(key_arg(who)?),
    };
    let (code, reason) = match rest {
        None => (CloseCode::NORMAL, ""),
        Some(rest) => {
            let (code, reason) = split(rest);
            (code_arg(code)?, reason.unwrap_or(""))
        }
    };
    if reason.len() > MAX_REASON_LEN {
        return Err(CommandError::ReasonTooLong);
    }
    Ok(Command::Close { who, code, reason })
}

/// The first word and, after one space, the rest (`None` without a space).
fn split(text: &str) -> (&str, Option<&str>) {
    match text.split_once(' ') {
        Some((word, rest)) => (word, Some(rest)),
        None => (text, None),
    }
}

fn id_arg(id: &str) -> Result<ClientId, CommandError> {
    ClientId::new(id).map_err(|why| CommandError::BadName("id", why))
}

/// A comma-separated list of channel names, in the order given (a name
/// given twice comes twice).
fn channels_arg(channels: &str) -> Result<Box<[ChannelName]>, CommandError> {
    if channels.len() > MAX_CHANNEL_LIST_LEN {
        return Err(CommandError::ChannelListTooLong);
    }
    channels
        .split(',')
        .map(ChannelName::new)
        .collect::<Result<_, _>>()
        .map_err(|why| CommandError::BadName("channel", why))
}

fn key_arg(key: &str) -> Result<ConnRef, CommandError> {
    ConnRef::parse(key).ok_or(CommandError::BadKey)
}

fn code_arg(code: &str) -> Result<CloseCode, CommandError> {
    let code: u16 = (code.len() == 4 && code.bytes().all(|b| b.is_ascii_digit()))
        .then(|| code.parse().ok())
        .flatten()
        .ok_or(CommandError::BadCode)?;
    Some(CloseCode(code))
        .filter(|&code| may_send(code))
        .ok_or(CommandError::BadCode)
}

/// Whether a server may close with `code` on a publisher's word: 1000–1003,
/// 1007–1011 or 3000–4999 (RFC 6455 §7.4; not the codes that must never
/// be sent, nor those only the server's own failures use).
pub fn may_send(code: CloseCode) -> bool {
    matches!(code.0, 1000..=1003 | 1007..=1011 | 3000..=4999)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(to: Recipients, body: &str) -> Command<'_> {
        Command::Send {
            to,
            payload: Payload::Text(body),
        }
    }

    fn chans(list: &str) -> Box<[ChannelName]> {
        list.split(',')
            .map(|n| ChannelName::new(n).unwrap())
            .collect()
    }

    fn id(name: &str) -> ClientId {
        ClientId::new(name).unwrap()
    }

    const KEY: ConnRef = ConnRef {
        instance: 2,
        slot: 17,
        serial: 5,
    };

    #[test]
    fn every_command_parses() {
        let cases: Vec<(&str, Command<'_>)> = vec![
            ("all hello world", text(Recipients::All, "hello world")),
            ("all", text(Recipients::All, "")),
            ("all ", text(Recipients::All, "")),
            (
                "all  two spaces kept ",
                text(Recipients::All, " two spaces kept "),
            ),
            (
                "pub news.eu breaking",
                text(Recipients::Channels(chans("news.eu")), "breaking"),
            ),
            (
                "pub a,b,c x y",
                text(Recipients::Channels(chans("a,b,c")), "x y"),
            ),
            ("pub news", text(Recipients::Channels(chans("news")), "")),
            (
                "id alice hi there",
                text(Recipients::Id(id("alice")), "hi there"),
            ),
            (
                "conn 2.17.5 just you",
                text(Recipients::Conn(KEY), "just you"),
            ),
            (
                "all:b64 AAEC/w==",
                Command::Send {
                    to: Recipients::All,
                    payload: Payload::Binary(vec![0, 1, 2, 255]),
                },
            ),
            (
                "pub:b64 a,b aGk=",
                Command::Send {
                    to: Recipients::Channels(chans("a,b")),
                    payload: Payload::Binary(b"hi".to_vec()),
                },
            ),
            (
                "id:b64 bob",
                Command::Send {
                    to: Recipients::Id(id("bob")),
                    payload: Payload::Binary(Vec::new()),
                },
            ),
            (
                "conn:b64 2.17.5 AA==",
                Command::Send {
                    to: Recipients::Conn(KEY),
                    payload: Payload::Binary(vec![0]),
                },
            ),
            (
                "sub alice news,chat",
                Command::Subscribe {
                    id: id("alice"),
                    channels: chans("news,chat"),
                },
            ),
            (
                "unsub alice chat",
                Command::Unsubscribe {
                    id: id("alice"),
                    channels: chans("chat"),
                },
            ),
            (
                "close id alice",
                Command::Close {
                    who: Recipients::Id(id("alice")),
                    code: CloseCode(1000),
                    reason: "",
                },
            ),
            (
                "close id alice 4001",
                Command::Close {
                    who: Recipients::Id(id("alice")),
                    code: CloseCode(4001),
                    reason: "",
                },
            ),
            (
                "close conn 2.17.5 1008 banned for spam",
                Command::Close {
                    who: Recipients::Conn(KEY),
                    code: CloseCode(1008),
                    reason: "banned for spam",
                },
            ),
        ];
        for (line, want) in cases {
            assert_eq!(Command::parse(line), Ok(want), "{line:?}");
        }
    }

    #[test]
    fn every_malformed_form_is_named() {
        use CommandError::*;
        let long_reason = format!("close id a 1000 {}", "r".repeat(124));
        let long_name = format!("id {} x", "n".repeat(65));
        let cases: Vec<(&str, CommandError)> = vec![
            ("", Empty),
            ("hello", UnknownVerb),
            ("ALL x", UnknownVerb),
            (" all x", UnknownVerb),
            ("sub:b64 a b", UnknownVerb),
            ("close:b64 id a", UnknownVerb),
            ("all:b64 not base64!", BadBase64),
            ("pub", Missing("channels")),
            ("pub ", BadName("channel", NameError::Empty)),
            ("pub a,,b x", BadName("channel", NameError::Empty)),
            ("pub a;b x", BadName("channel", NameError::BadByte(b';'))),
            ("id", Missing("id")),
            ("id al/ice x", BadName("id", NameError::BadByte(b'/'))),
            (&long_name, BadName("id", NameError::TooLong)),
            ("conn", Missing("connection key")),
            ("conn 1.2 x", BadKey),
            ("conn 1.2.3.4 x", BadKey),
            ("conn 1.-2.3 x", BadKey),
            ("conn 1.2.99999999999 x", BadKey),
            ("conn a.b.c x", BadKey),
            ("sub", Missing("id")),
            ("sub alice", Missing("channels")),
            ("sub alice news extra", TrailingWords),
            ("unsub alice a,b,", BadName("channel", NameError::Empty)),
            ("close", Missing("id or conn")),
            ("close user alice", Missing("id or conn")),
            ("close id", Missing("id")),
            ("close conn", Missing("connection key")),
            ("close conn x", BadKey),
            ("close id a 999", BadCode),
            ("close id a 1005", BadCode),
            ("close id a 1015", BadCode),
            ("close id a 5000", BadCode),
            ("close id a +100", BadCode),
            ("close id a code", BadCode),
            (&long_reason, ReasonTooLong),
        ];
        for (line, want) in cases {
            assert_eq!(Command::parse(line), Err(want), "{line:?}");
        }
        assert_eq!(
            BadName("channel", NameError::BadByte(b';')).to_string(),
            "channel holds ';': only letters, digits and - _ . : @ are allowed"
        );
    }

    #[test]
    fn keys_print_as_they_parse() {
        assert_eq!(KEY.to_string(), "2.17.5");
        assert_eq!(ConnRef::parse("2.17.5"), Some(KEY));
        assert_eq!(
            ConnRef::parse("0.0.0").map(|k| k.to_string()).as_deref(),
            Some("0.0.0")
        );
    }

    #[test]
    fn channel_lists_keep_their_order_and_repeats() {
        let Ok(Command::Send { to, .. }) = Command::parse("pub b,a,b x") else {
            panic!("a message");
        };
        let Recipients::Channels(names) = to else {
            panic!("channels");
        };
        let names: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
        assert_eq!(names, ["b", "a", "b"]);
    }

    #[test]
    fn a_channel_list_over_64_kib_is_refused_not_cut() {
        // 1,008 names of 64 bytes and their commas: 65,519 bytes.
        let name = "c".repeat(64);
        let fits = vec![name.as_str(); 1008].join(",");
        assert!(fits.len() <= MAX_CHANNEL_LIST_LEN);
        let Ok(Command::Send { to, .. }) = Command::parse(&format!("pub {fits} x")) else {
            panic!("a message");
        };
        let Recipients::Channels(names) = to else {
            panic!("channels");
        };
        assert_eq!(names.len(), 1008);
        assert!(channel_list_fits(&names));
        let over = format!("{fits},{name}");
        assert_eq!(
            Command::parse(&format!("pub {over} x")),
            Err(CommandError::ChannelListTooLong)
        );
        assert!(!channel_list_fits(&chans(&over)));
    }

    #[test]
    fn recipients_stay_small_as_they_are_queued() {
        assert_eq!(std::mem::size_of::<Recipients>(), 24);
        assert_eq!(
            Recipients::Channels(chans("news,eu")).names_len()
                + Recipients::Id(id("bob")).names_len(),
            9
        );
    }
}
