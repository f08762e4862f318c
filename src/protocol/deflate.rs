//! permessage-deflate negotiation (RFC 7692 §5 and §7.1): which offer in a
//! request's `Sec-WebSocket-Extensions` headers the server accepts, and
//! what it answers.
//!
//! The server's answer always carries `server_no_context_takeover` (it
//! may add it unasked, §7.1.1.1): every compressed message then stands on
//! its own, so one compressed broadcast frame serves every connection.
//! It always carries `client_no_context_takeover` too (§7.1.1.2 lets the
//! server ask for it): the client starts each message afresh, so one
//! inflater the loop owns serves every connection, and no connection
//! keeps a 32 KiB window.
//!
//! An offer is declined, and the next one considered, when it has a
//! parameter RFC 7692 does not define, the same parameter twice, a value
//! where none belongs or an invalid one (§7: window bits are a decimal
//! 8 to 15 without leading zeros, possibly quoted). `server_max_window_bits`
//! is answered with the value offered (the server then compresses with no
//! larger window); `client_max_window_bits` needs no answer: the inflater's
//! window takes any.

/// The extension's name.
pub const NAME: &str = "permessage-deflate";

/// The largest LZ77 window, in bits (32 KiB).
pub const MAX_WINDOW_BITS: u8 = 15;

/// What the server agreed to, for a connection that negotiated deflate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    /// The window the server compresses with at most, in bits: the offer's
    /// `server_max_window_bits`, or 15.
    pub server_window_bits: u8,
    /// Whether the offer named `server_max_window_bits` (the answer then
    /// does, with the same value).
    pub server_window_asked: bool,
}

/// The first acceptable permessage-deflate offer among the values of a
/// request's `Sec-WebSocket-Extensions` headers (in their order), if any.
pub fn negotiate<'a>(headers: impl IntoIterator<Item = &'a [u8]>) -> Option<Agreed> {
    headers
        .into_iter()
        .filter_map(|value| std::str::from_utf8(value).ok())
        .flat_map(|value| value.split(','))
        .find_map(accept)
}

/// Whether one offer (`permessage-deflate; param; param=value`) is
/// acceptable, and on what terms.
fn accept(offer: &str) -> Option<Agreed> {
    let mut parts = offer.split(';').map(|p| p.trim_matches(is_space));
    if parts.next() != Some(NAME) {
        return None;
    }
    let mut seen = [false; 4];
    let mut agreed = Agreed {
        server_window_bits: MAX_WINDOW_BITS,
        server_window_asked: false,
    };
    for param in parts {
        let (name, value) = match param.split_once('=') {
            Some((name, value)) => (name.trim_matches(is_space), Some(unquote(value)?)),
            None => (param, None),
        };
        let index = match name {
            "server_no_context_takeover" => 0,
            "client_no_context_takeover" => 1,
            "server_max_window_bits" => 2,
            "client_max_window_bits" => 3,
            _ => return None,
        };
        if std::mem::replace(&mut seen[index], true) {
            return None;
        }
        match (index, value) {
            (0 | 1, None) | (3, None) => {}
            (2, Some(bits)) => {
                agreed.server_window_bits = window_bits(bits)?;
                agreed.server_window_asked = true;
            }
            (3, Some(bits)) => {
                window_bits(bits)?;
            }
            _ => return None,
        }
    }
    Some(agreed)
}

/// A parameter value: a token, or a quoted string holding one (RFC 6455
/// §9.1); `None` if it is neither.
fn unquote(value: &str) -> Option<&str> {
    let value = value.trim_matches(is_space);
    let inner = match value.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"')?,
        None => value,
    };
    let token = |c: char| c.is_ascii_graphic() && !"()<>@,;:\\\"/[]?={}".contains(c);
    (!inner.is_empty() && inner.chars().all(token)).then_some(inner)
}

/// Window bits: a decimal 8 to 15 without leading zeros.
fn window_bits(value: &str) -> Option<u8> {
    if value.starts_with('0') || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok().filter(|bits| (8..=15).contains(bits))
}

fn is_space(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// The `Sec-WebSocket-Extensions` header line (with its CRLF) that answers
/// `agreed`.
pub fn response_line(agreed: &Agreed) -> ResponseLine {
    let mut line = ResponseLine {
        bytes: [0; RESPONSE_LINE_MAX],
        len: 0,
    };
    line.push(b"Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover");
    if agreed.server_window_asked {
        line.push(b"; server_max_window_bits=");
        let bits = agreed.server_window_bits;
        if bits >= 10 {
            line.push(b"1");
        }
        line.push(&[b'0' + bits % 10]);
    }
    line.push(b"\r\n");
    line
}

/// The longest [`response_line`].
pub const RESPONSE_LINE_MAX: usize = 136;

/// A header line built on the stack.
#[derive(Debug, Clone, Copy)]
pub struct ResponseLine {
    bytes: [u8; RESPONSE_LINE_MAX],
    len: usize,
}

impl ResponseLine {
    fn push(&mut self, part: &[u8]) {
        self.bytes[self.len..self.len + part.len()].copy_from_slice(part);
        self.len += part.len();
    }

    /// The line's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHOLE: Agreed = Agreed {
        server_window_bits: 15,
        server_window_asked: false,
    };

    fn asked(bits: u8) -> Agreed {
        Agreed {
            server_window_bits: bits,
            server_window_asked: true,
        }
    }

    #[test]
    fn offers_and_their_answers() {
        let cases: &[(&[&str], Option<Agreed>)] = &[
            // What browsers send.
            (&["permessage-deflate; client_max_window_bits"], Some(WHOLE)),
            (&["permessage-deflate"], Some(WHOLE)),
            (&["permessage-deflate;client_no_context_takeover"], Some(WHOLE)),
            (&["permessage-deflate; server_no_context_takeover"], Some(WHOLE)),
            (&["permessage-deflate; client_max_window_bits=10"], Some(WHOLE)),
            (&["permessage-deflate; server_max_window_bits=10"], Some(asked(10))),
            (&["permessage-deflate; server_max_window_bits=8"], Some(asked(8))),
            (&["permessage-deflate; server_max_window_bits=15"], Some(asked(15))),
            (&["permessage-deflate; server_max_window_bits=\"12\""], Some(asked(12))),
            (
                &["permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=9; client_max_window_bits=9"],
                Some(asked(9)),
            ),
            (&["  permessage-deflate ;\tclient_max_window_bits  "], Some(WHOLE)),
            // Offers that must be declined.
            (&["permessage-deflate; server_max_window_bits"], None),
            (&["permessage-deflate; server_max_window_bits=7"], None),
            (&["permessage-deflate; server_max_window_bits=16"], None),
            (&["permessage-deflate; server_max_window_bits=010"], None),
            (&["permessage-deflate; server_max_window_bits=+9"], None),
            (&["permessage-deflate; server_max_window_bits=\"1\"0"], None),
            (&["permessage-deflate; server_max_window_bits=\"\""], None),
            (&["permessage-deflate; client_max_window_bits=0"], None),
            (&["permessage-deflate; client_max_window_bits=20"], None),
            (&["permessage-deflate; server_no_context_takeover=1"], None),
            (&["permessage-deflate; client_no_context_takeover=true"], None),
            (&["permessage-deflate; client_no_context_takeover; client_no_context_takeover"], None),
            (&["permessage-deflate; server_max_window_bits=10; server_max_window_bits=10"], None),
            (&["permessage-deflate; unknown_param"], None),
            (&["permessage-deflate; ;"], None),
            (&["permessage-deflate; ="], None),
            (&["x-webkit-deflate-frame"], None),
            (&["permessage-deflatex"], None),
            (&["Permessage-Deflate"], None),
            (&[""], None),
            (&[], None),
            // Several offers, in one header or in several: the first
            // acceptable one.
            (
                &["permessage-deflate; server_max_window_bits=7, permessage-deflate; server_max_window_bits=11"],
                Some(asked(11)),
            ),
            (
                &["x-webkit-deflate-frame, permessage-deflate; foo, permessage-deflate"],
                Some(WHOLE),
            ),
            (
                &["permessage-deflate; server_max_window_bits=9", "permessage-deflate"],
                Some(asked(9)),
            ),
            (&["foo", "permessage-deflate; client_max_window_bits"], Some(WHOLE)),
            (&["permessage-deflate; bar", "permessage-deflate; baz"], None),
        ];
        for (headers, expected) in cases {
            let got = negotiate(headers.iter().map(|h| h.as_bytes()));
            assert_eq!(got, *expected, "{headers:?}");
        }
        assert_eq!(
            negotiate([&b"permessage-deflate\xff"[..]]),
            None,
            "not UTF-8"
        );
    }

    #[test]
    fn the_answer_keeps_no_context_and_repeats_an_asked_window() {
        let text = |agreed| String::from_utf8(response_line(&agreed).as_bytes().to_vec()).unwrap();
        assert_eq!(
            text(WHOLE),
            "Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover\r\n"
        );
        for bits in 8..=15 {
            let line = text(asked(bits));
            assert!(
                line.ends_with(&format!("; server_max_window_bits={bits}\r\n")),
                "{line}"
            );
            assert!(line.len() <= RESPONSE_LINE_MAX);
        }
    }
}
