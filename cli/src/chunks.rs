//! Chunks of whole input lines, as the readers of the sources hand them
//! over ([`WholeLines`]), and the **control lines** among them: a line
//! that begins with [`CONTROL`] (0xFF, which no UTF-8 text holds, so no
//! line an instance would act on) says what a feed's reader knows that is
//! not a line of input: a feed lost or restored, a stream entry's
//! position, a gap. A data line that begins with that byte has it
//! replaced with 0xFE on the way (it is still not UTF-8, and is skipped
//! and counted as before), so only the readers write control lines.

use std::ops::ControlFlow;
use std::time::Duration;

use wspush::protocol::lines::Splitter;
use wspush::protocol::presence::Query;

/// The first byte of a control line.
pub const CONTROL: u8 = 0xFF;
/// The longest control line, without its end: a reader knows one however
/// short its line limit.
pub const CONTROL_MAX_LEN: usize = 256;
/// What a data line's leading [`CONTROL`] byte becomes.
const ESCAPED: u8 = 0xFE;

/// What a control line tells an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// A feed is lost.
    FeedLost,
    /// The feed is back after this outage.
    FeedRestored(Duration),
    /// The next `lines` lines are a stream entry's, numbered from `seq`;
    /// with `keep`, they are for the history only (a host filling it from
    /// the stream's tail), not for the connections.
    Entry {
        /// The first line's number (position).
        seq: u64,
        /// How many lines follow.
        lines: u32,
        /// For the history only.
        keep: bool,
    },
    /// Nothing up to this position is held (the history begins after it).
    Forget(u64),
    /// The stream no longer held the entries at positions `from..=to`.
    Gap {
        /// The first position missing.
        from: u64,
        /// The last position missing.
        to: u64,
    },
    /// The entries read are this far behind the stream's last.
    Lag(Duration),
    /// The next `lines` lines are commands whatever the input's mode (a
    /// publish request's).
    Commands {
        /// How many lines follow.
        lines: u32,
    },
    /// A stream entry skipped (its id: milliseconds and sequence).
    Skipped {
        /// Its id's milliseconds.
        ms: u64,
        /// Its id's sequence number.
        seq: u64,
        /// Why.
        why: Skip,
    },
    /// A presence query to answer, with the answer's number (see
    /// [`crate::asks`]).
    Ask {
        /// The answer's number.
        id: u64,
        /// What is asked.
        query: Query,
    },
}

/// Why a stream entry is skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// It has no `line` field.
    NoLine,
    /// It holds more lines than an entry's positions number.
    TooManyLines,
    /// Its id is past what a position holds.
    IdTooLarge,
}

impl Skip {
    const ALL: [Skip; 3] = [Skip::NoLine, Skip::TooManyLines, Skip::IdTooLarge];

    /// Its word in a control line.
    fn word(self) -> &'static str {
        match self {
            Skip::NoLine => "no-line",
            Skip::TooManyLines => "too-many-lines",
            Skip::IdTooLarge => "id-too-large",
        }
    }

    /// What it means, for a log line.
    pub fn describe(self) -> &'static str {
        match self {
            Skip::NoLine => "it has no `line` field",
            Skip::TooManyLines => "it holds more than 128 lines",
            Skip::IdTooLarge => "its id is past 4398046511103-32767",
        }
    }
}

impl Control {
    /// The line, with its end.
    pub fn line(&self) -> Vec<u8> {
        let text = match *self {
            Control::FeedLost => "feed lost".to_string(),
            Control::FeedRestored(outage) => format!("feed restored {}", outage.as_millis()),
            Control::Entry { seq, lines, keep } => {
                format!("{} {seq} {lines}", if keep { "keep" } else { "at" })
            }
            Control::Forget(seq) => format!("forget {seq}"),
            Control::Gap { from, to } => format!("gap {from} {to}"),
            Control::Lag(lag) => format!("lag {}", lag.as_millis()),
            Control::Commands { lines } => format!("commands {lines}"),
            Control::Skipped { ms, seq, why } => format!("skip {ms}-{seq} {}", why.word()),
            Control::Ask { id, ref query } => format!("ask {id} {}", query.line()),
        };
        let mut line = vec![CONTROL];
        line.extend_from_slice(text.as_bytes());
        line.push(b'\n');
        line
    }

    /// The control a line (without its end) holds, if it is one.
    pub fn parse(line: &[u8]) -> Option<Control> {
        let text = std::str::from_utf8(line.strip_prefix(&[CONTROL])?).ok()?;
        if let Some(ask) = text.strip_prefix("ask ") {
            let (id, query) = ask.split_once(' ')?;
            return Some(Control::Ask {
                id: decimal(id)?,
                query: Query::parse_line(query)?,
            });
        }
        let mut words = text.split(' ');
        let verb = words.next()?;
        let args: Vec<&str> = words.collect();
        let number = |i: usize| decimal(args.get(i)?);
        let control = match (verb, args.len()) {
            ("feed", 1) if args[0] == "lost" => Control::FeedLost,
            ("feed", 2) if args[0] == "restored" => {
                Control::FeedRestored(Duration::from_millis(number(1)?))
            }
            ("at" | "keep", 2) => Control::Entry {
                seq: number(0)?,
                lines: number(1)?.try_into().ok()?,
                keep: verb == "keep",
            },
            ("forget", 1) => Control::Forget(number(0)?),
            ("gap", 2) => Control::Gap {
                from: number(0)?,
                to: number(1)?,
            },
            ("lag", 1) => Control::Lag(Duration::from_millis(number(0)?)),
            ("commands", 1) => Control::Commands {
                lines: number(0)?.try_into().ok()?,
            },
            ("skip", 2) => {
                let (ms, seq) = args[0].split_once('-')?;
                Control::Skipped {
                    ms: decimal(ms)?,
                    seq: decimal(seq)?,
                    why: *Skip::ALL.iter().find(|w| w.word() == args[1])?,
                }
            }
            _ => return None,
        };
        Some(control)
    }
}

/// A number written in decimal digits only (no sign, no space), if it
/// fits 64 bits.
pub fn decimal(word: &str) -> Option<u64> {
    if word.is_empty() || !word.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    word.parse().ok()
}

/// Cuts a byte stream into whole lines, each ended with `\n`, holding at
/// most one line's beginning: up to two bytes past the limit, where a
/// longer line is cut and the rest of it dropped (the instance still
/// skips it as too long, even if it ends with a `\r` it strips).
#[derive(Debug)]
pub struct WholeLines(Splitter);

impl WholeLines {
    /// Lines of at most `max_line` bytes pass whole.
    pub fn new(max_line: usize) -> WholeLines {
        WholeLines(Splitter::new(max_line))
    }

    /// Takes `bytes` and appends the lines they end to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        let _ = self.0.split(bytes, |piece| put_line(piece.bytes, out));
    }

    /// Takes what was read of the line begun and not ended, if any (for
    /// whoever reads on where this stops).
    pub fn take_unfinished(&mut self) -> Vec<u8> {
        self.0.take_unfinished()
    }

    /// Ends the line begun, if any (at the end of the input).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let _ = self.0.finish(|piece| put_line(piece.bytes, out));
    }

    /// Appends one message's lines to `out`: its bytes, then a line end
    /// unless it ends with one.
    pub fn push_message(&mut self, message: &[u8], out: &mut Vec<u8>) {
        self.push(message, out);
        if !message.ends_with(b"\n") {
            self.push(b"\n", out);
        }
    }
}

/// Appends `line` and its end to `out`, a leading [`CONTROL`] escaped.
fn put_line(line: &[u8], out: &mut Vec<u8>) -> ControlFlow<()> {
    let start = out.len();
    out.extend_from_slice(line);
    out.push(b'\n');
    if line.first() == Some(&CONTROL) {
        out[start] = ESCAPED;
    }
    ControlFlow::Continue(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(max_line: usize, pieces: &[&[u8]]) -> Vec<u8> {
        let mut lines = WholeLines::new(max_line);
        let mut out = Vec::new();
        for piece in pieces {
            lines.push(piece, &mut out);
        }
        lines.finish(&mut out);
        out
    }

    #[test]
    fn only_whole_lines_pass_and_the_last_is_ended() {
        let mut lines = WholeLines::new(100);
        let mut out = Vec::new();
        lines.push(b"one\ntw", &mut out);
        assert_eq!(out, b"one\n");
        lines.push(b"o\nthr", &mut out);
        assert_eq!(out, b"one\ntwo\n");
        lines.push(b"ee", &mut out);
        assert_eq!(out, b"one\ntwo\n");
        lines.finish(&mut out);
        assert_eq!(out, b"one\ntwo\nthree\n");
        assert_eq!(cut(100, &[b"\n\n", b"x\r\n"]), b"\n\nx\r\n");
        assert_eq!(cut(100, &[b""]), b"");
    }

    #[test]
    fn a_line_over_the_limit_is_cut_two_bytes_past_it() {
        assert_eq!(cut(4, &[b"abcd\nabcdefgh\nok\n"]), b"abcd\nabcdef\nok\n");
        assert_eq!(cut(4, &[b"abc", b"defg", b"hij\nok"]), b"abcdef\nok\n");
        // Still too long once the reader strips a `\r`; whole lines pass.
        assert_eq!(cut(4, &[b"abcd\rxyz\nabcd\r\n"]), b"abcd\rx\nabcd\r\n");
        // However long, at most six bytes of it are held.
        let mut lines = WholeLines::new(4);
        let mut out = Vec::new();
        for _ in 0..1000 {
            lines.push(&[b'x'; 1000], &mut out);
        }
        assert!(out.is_empty() && lines.0.unfinished() == 6);
    }

    #[test]
    fn data_lines_never_begin_with_the_control_byte() {
        let out = cut(100, &[b"\xFFfeed lost\nok\n\xFF", b"x\n"]);
        assert_eq!(out, b"\xFEfeed lost\nok\n\xFEx\n");
        assert_eq!(cut(100, &[b"\xFF", b"feed lost\n"]), b"\xFEfeed lost\n");
        let mut lines = WholeLines::new(100);
        let mut out = Vec::new();
        lines.push_message(b"\xFFfeed lost", &mut out);
        assert_eq!(Control::parse(out.strip_suffix(b"\n").unwrap()), None);
    }

    #[test]
    fn a_message_is_its_lines() {
        let mut lines = WholeLines::new(100);
        let mut out = Vec::new();
        for message in [&b"one"[..], b"two\n", b"", b"a\nb"] {
            lines.push_message(message, &mut out);
        }
        assert_eq!(out, b"one\ntwo\n\na\nb\n");
    }

    #[test]
    fn control_lines_round_trip_and_nothing_else_is_one() {
        for control in [
            Control::FeedLost,
            Control::FeedRestored(Duration::from_millis(1234)),
            Control::FeedRestored(Duration::from_millis(u64::MAX)),
        ] {
            round_trips(control);
        }
        not_controls(&[
            b"feed lost",
            b"\xFFfeed",
            b"\xFFfeed lost ",
            b"\xFFfeed restored",
            b"\xFFfeed restored x",
            b"\xFFfeed restored +5",
            b"\xFEfeed lost",
        ]);
    }

    #[test]
    fn the_longest_presence_query_rides_a_control_line() {
        let longest = "x".repeat(wspush::protocol::names::MAX_NAME_LEN);
        let query = Query::Channel {
            channel: wspush::ChannelName::new(&longest).unwrap(),
            after: Some(wspush::ClientId::new(&longest).unwrap()),
            limit: wspush::protocol::presence::MAX_LIMIT,
        };
        round_trips(Control::Ask {
            id: u64::MAX,
            query,
        });
        not_controls(&[
            b"\xFFask 1",
            b"\xFFask x presence a - 1",
            b"\xFFask 1 presence a -",
        ]);
    }

    /// `control`'s line is whole, within [`CONTROL_MAX_LEN`], and parses
    /// back to it.
    fn round_trips(control: Control) {
        let line = control.line();
        assert!(line.len() - 1 <= CONTROL_MAX_LEN, "{line:?}");
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(Control::parse(&line[..line.len() - 1]), Some(control));
    }

    /// No line of `lines` parses as a control line.
    fn not_controls(lines: &[&[u8]]) {
        for line in lines {
            assert_eq!(Control::parse(line), None, "{line:?}");
        }
    }

    #[test]
    fn stream_controls_round_trip_within_the_longest_control_line() {
        for control in [
            Control::Entry {
                seq: u64::MAX,
                lines: 128,
                keep: true,
            },
            Control::Entry {
                seq: 7,
                lines: 1,
                keep: false,
            },
            Control::Forget(u64::MAX),
            Control::Gap {
                from: u64::MAX,
                to: u64::MAX,
            },
            Control::Lag(Duration::from_millis(u64::MAX)),
            Control::Skipped {
                ms: u64::MAX,
                seq: u64::MAX,
                why: Skip::TooManyLines,
            },
            Control::Skipped {
                ms: 1,
                seq: 0,
                why: Skip::NoLine,
            },
        ] {
            round_trips(control);
        }
        not_controls(&[
            b"\xFFat 1",
            b"\xFFat 1 2 3",
            b"\xFFkeep x 1",
            b"\xFFat 1 99999999999",
            b"\xFFgap 1",
            b"\xFFskip 1-2 what",
            b"\xFFskip 12 no-line",
            b"\xFFlag -1",
        ]);
    }
}
