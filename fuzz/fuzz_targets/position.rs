//! Positions and `?since=`: the position parser and an upgrade's query,
//! on any bytes.
//!
//! Input: the bytes of a position, and (if UTF-8) of a query. Parsing
//! never panics; a position parses only in its one printed form (it
//! prints back as the same bytes), and a query that asks for `since`
//! hands on the position its value parses as (or none, for the server
//! to answer `unknown`), and the channels it names, in order.

#![no_main]

use libfuzzer_sys::fuzz_target;
use wspush::protocol::position::{Position, Status, MAX_LEN};
use wspush::protocol::query::{self, Resume, UpgradeLimits};

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
    let limits = UpgradeLimits {
        max_channels: 16,
        allowed: &[],
        require_token_id: false,
    };
    if let Ok(asked) = query::asked(&target, None, &limits) {
        let params = || query::params(&target[2..]);
        if let Resume::Since(since) = asked.resume {
            let (_, given) = params().find(|(k, _)| *k == "since").expect("a since");
            assert_eq!(since, Position::parse(given.as_bytes()));
        }
        let channels = params().filter(|(k, _)| *k == "channel").map(|(_, v)| v);
        assert!(channels.eq(asked.channels.iter().map(|c| c.as_str())));
    }
});
