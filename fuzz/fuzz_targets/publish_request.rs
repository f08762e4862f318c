//! The publish listener's requests (`protocol::publish::parse`), whole and
//! fed in pieces, back to back as on a keep-alive connection.
//!
//! Input: `[n, size_1 .. size_n, stream ..]`: the stream is fed in chunks
//! of `size_i + 1` bytes, cycling (whole when `n % 8` is 0); after each
//! request the rest goes on from where it ended.
//!
//! Checked: parsing never panics; fed in pieces it answers each request
//! as it does the request whole; a request taken used bytes within the
//! input and its lines each parse as a command and end in `\n`, as many as
//! it says; a refusal's status is one of those documented and its line
//! of text has no line end; a refusal that goes on took bytes, and one
//! that closes is the last thing read.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use wspush::protocol::publish::{self, Parsed, PublishLimits, Request};
use wspush::{Command, Tokens};

const LIMITS: PublishLimits = PublishLimits {
    max_body: 2048,
    max_line: 256,
};

fn keys() -> &'static Tokens {
    static KEYS: OnceLock<Tokens> = OnceLock::new();
    KEYS.get_or_init(|| Tokens::new(["k"]).expect("a valid key"))
}

/// The request at the start of `buf`, fed whole.
fn whole(buf: &[u8]) -> Parsed {
    publish::parse(buf, 0, keys(), &LIMITS)
}

fuzz_target!(|data: &[u8]| {
    let Some((&count, rest)) = data.split_first() else {
        return;
    };
    let count = usize::from(count % 8);
    if rest.len() < count {
        return;
    }
    let (sizes, stream) = rest.split_at(count);
    let mut chunks = sizes.iter().map(|&s| usize::from(s) + 1).cycle();
    let (mut start, mut end, mut seen) = (0, 0, 0);
    while start < stream.len() {
        end = match chunks.next() {
            Some(size) => (end + size).min(stream.len()),
            None => stream.len(),
        };
        let parsed = publish::parse(&stream[start..end], seen, keys(), &LIMITS);
        let used = match &parsed {
            Parsed::Partial { seen: now } => {
                assert!(*now <= end - start);
                seen = *now;
                if end == stream.len() {
                    return;
                }
                continue;
            }
            Parsed::Request { request, used, .. } => {
                check_request(request);
                Some(*used)
            }
            Parsed::Refused { refusal, used } => {
                assert!(
                    [400, 401, 404, 405, 411, 413, 431, 501].contains(&refusal.status),
                    "{refusal:?}"
                );
                assert!(!refusal.why.contains(['\r', '\n']), "{refusal:?}");
                *used
            }
        };
        // Whole, it is read the same (a refusal for the head alone may
        // differ once more bytes came: compare only what was taken).
        if let Some(used) = used {
            assert!(used > 0 && used <= end - start);
            assert_eq!(whole(&stream[start..start + used]), parsed);
        }
        match used {
            Some(used) => {
                start += used;
                end = end.max(start);
                seen = 0;
            }
            None => return,
        }
    }
});

fn check_request(request: &Request) {
    let Request::Publish { text, lines } = request else {
        return;
    };
    let text = std::str::from_utf8(text).expect("lines taken are UTF-8");
    assert_eq!(text.matches('\n').count(), *lines);
    assert!(text.is_empty() || text.ends_with('\n'));
    for line in text.lines() {
        assert!(line.len() <= LIMITS.max_line, "{line}");
        assert!(Command::parse(line).is_ok(), "{line}");
    }
}
