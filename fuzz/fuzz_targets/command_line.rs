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
use wspush::protocol::commands::{
    self, Audience, Closing, Command, ConnRef, Payload, MAX_REASON_LEN,
};
use wspush::protocol::names;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(command) = commands::parse(line) else {
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
                Audience::All => format!("all{suffix}"),
                Audience::Channels(list) => {
                    list.iter().for_each(|c| names::check(c).unwrap());
                    format!("pub{suffix} {}", list.iter().collect::<Vec<_>>().join(","))
                }
                Audience::Id(id) => {
                    names::check(id).unwrap();
                    format!("id{suffix} {id}")
                }
                Audience::Conn(key) => {
                    check_key(*key);
                    format!("conn{suffix} {key}")
                }
            };
            format!("{to} {body}")
        }
        Command::Subscribe { id, channels } | Command::Unsubscribe { id, channels } => {
            names::check(id).unwrap();
            channels.iter().for_each(|c| names::check(c).unwrap());
            let verb = if matches!(command, Command::Subscribe { .. }) {
                "sub"
            } else {
                "unsub"
            };
            format!(
                "{verb} {id} {}",
                channels.iter().collect::<Vec<_>>().join(",")
            )
        }
        Command::Close { who, code, reason } => {
            assert!(commands::may_send(*code) && reason.len() <= MAX_REASON_LEN);
            let who = match who {
                Closing::Id(id) => format!("id {id}"),
                Closing::Conn(key) => {
                    check_key(*key);
                    format!("conn {key}")
                }
            };
            format!("close {who} {} {reason}", code.0)
        }
    };
    let again = commands::parse(&canonical).expect("the canonical form parses");
    assert_eq!(command, again, "{line:?} → {canonical:?}");
});

fn check_key(key: ConnRef) {
    assert_eq!(ConnRef::parse(&key.to_string()), Some(key));
}
