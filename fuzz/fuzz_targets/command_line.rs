//! The command language of `--input commands`, on any line.
//!
//! Input: the line's bytes (not UTF-8: skipped, as the line reader does).
//! Parsing never panics, and what it gives back holds: a text payload is
//! the end of the line, every channel name and id is valid, a connection
//! key prints as it was written (or parses back the same), a close reason
//! fits a close frame, and a binary payload re-encodes to base64 that
//! decodes to it. A parsed line written back in the language's canonical
//! form parses to the same command.

#![no_main]

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use libfuzzer_sys::fuzz_target;
use wspush::protocol::commands;
use wspush::{ChannelName, ClientId, Command, ConnRef, Payload, Recipients, MAX_REASON_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(command) = Command::parse(line) else {
        return;
    };
    let canonical = match &command {
        Command::Send { to, payload } => {
            let (suffix, body) = match payload {
                Payload::Text(text) => {
                    assert!(line.ends_with(text), "{line:?}");
                    ("", text.to_string())
                }
                Payload::Binary(bytes) => (":b64", BASE64.encode(bytes)),
            };
            let to = match to {
                Recipients::All => format!("all{suffix}"),
                Recipients::Channels(list) => format!("pub{suffix} {}", channel_list(list)),
                Recipients::Id(id) => format!("id{suffix} {}", client_id(id)),
                Recipients::Conn(key) => {
                    check_key(*key);
                    format!("conn{suffix} {key}")
                }
            };
            format!("{to} {body}")
        }
        Command::Subscribe { id, channels } | Command::Unsubscribe { id, channels } => {
            let verb = if matches!(command, Command::Subscribe { .. }) {
                "sub"
            } else {
                "unsub"
            };
            format!("{verb} {} {}", client_id(id), channel_list(channels))
        }
        Command::Close { who, code, reason } => {
            assert!(commands::may_send(*code) && reason.len() <= MAX_REASON_LEN);
            let who = match who {
                Recipients::Id(id) => format!("id {}", client_id(id)),
                Recipients::Conn(key) => {
                    check_key(*key);
                    format!("conn {key}")
                }
                other => panic!("a close is for an id or a connection: {other:?}"),
            };
            format!("close {who} {} {reason}", code.0)
        }
    };
    let again = Command::parse(&canonical).expect("the canonical form parses");
    assert_eq!(command, again, "{line:?} → {canonical:?}");
});

/// The names, comma-separated, each one a valid name as it stands.
fn channel_list(list: &[ChannelName]) -> String {
    let names: Vec<&str> = list.iter().map(ChannelName::as_str).collect();
    names
        .iter()
        .for_each(|n| assert!(ChannelName::new(n).is_ok(), "{n:?}"));
    names.join(",")
}

/// The id, a valid id as it stands.
fn client_id(id: &ClientId) -> &str {
    assert!(ClientId::new(id.as_str()).is_ok(), "{id:?}");
    id.as_str()
}

fn check_key(key: ConnRef) {
    assert_eq!(ConnRef::parse(&key.to_string()), Some(key));
}
