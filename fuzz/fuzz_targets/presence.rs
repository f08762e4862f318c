//! Presence: a request's query and the lines questions and answers
//! travel in, on any bytes.
//!
//! Input: the bytes of a query string (if UTF-8), read as `/presence`'s
//! and as `/clients`'s, and as a question's line and an answer's lines.
//! Parsing never panics; a query taken travels as a line that reads back
//! the same, within a control line's bound; an answer read writes back
//! as lines that read the same; merging an answer with itself keeps the
//! query's limit.

#![no_main]

use libfuzzer_sys::fuzz_target;
use wspush::protocol::presence::{Answer, Query, MAX_LIMIT};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for path in ["/presence", "/clients"] {
        if let Ok(query) = Query::from_request(path, text) {
            let line = query.line();
            assert!(line.len() < 200, "{line}");
            assert_eq!(Query::parse_line(&line), Some(query.clone()));
            let merged = query.merge([query.empty_answer(), query.empty_answer()]);
            assert_eq!(merged, query.empty_answer());
        }
    }
    if let Some(query) = Query::parse_line(text) {
        assert_eq!(Query::parse_line(&query.line()), Some(query));
    }
    if let Some(answer) = Answer::parse(text) {
        assert_eq!(Answer::parse(&answer.lines()), Some(answer.clone()));
        let query = Query::Channels {
            after: None,
            limit: MAX_LIMIT,
        };
        if let Answer::Channels { channels, .. } = query.merge([answer]) {
            assert!(channels.len() <= MAX_LIMIT as usize);
            assert!(channels
                .windows(2)
                .all(|w| w[0].0.as_str() < w[1].0.as_str()));
        }
    }
});
