//! Positions and `?since=`: the position parser and an upgrade's query,
//! on any bytes.
//!
//! Input: the bytes of a position, and (if UTF-8) of a query. Parsing
//! never panics; a position parses only in its one printed form (it
//! prints back as the same bytes), and a query that asks for `since`
//! hands the value on as written, for the server to place or answer
//! `unknown`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use wspush::protocol::position::{Position, Status, MAX_LEN};
use wspush::protocol::query::{self, Limits, Resume};

fuzz_target!(|data: &[u8]| {
    if let Some(position) = Position::parse(data) {
        assert_eq!(position.to_string().as_bytes(), data);
        assert!(data.len() <= MAX_LEN);
        let status = Status::Unknown { current: position }.message();
        assert!(status.starts_with('{') && Position::parse(status.as_bytes()).is_none());
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let target = format!("/?{text}");
    let limits = Limits {
        max_channels: 16,
        allowed: &[],
        require_token_id: false,
    };
    if let Ok(asked) = query::asked(&target, None, &limits) {
        if let Resume::Since(since) = asked.resume {
            assert!(query::params(&target[2..]).any(|(k, v)| k == "since" && v == since));
            // Whatever it is, the server parses it or answers unknown.
            let _ = Position::parse(since.as_bytes());
        }
    }
});
