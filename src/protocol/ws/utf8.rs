//! Incremental UTF-8 validation: a text message is checked piece by piece as
//! its bytes arrive, so an invalid sequence fails at once (RFC 6455 §8.1),
//! not when the message ends.

/// Bytes that can never be part of valid UTF-8 at this point of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidUtf8;

/// Validation state carried between pieces: the bytes of a code point whose
/// first bytes arrived but whose last have not (at most 3), in 3 bytes.
/// The unused ones are 0, which no byte of an unfinished code point is
/// (a lead byte is at least `C2`, a continuation byte at least `80`), so
/// the first 0 marks where the pending bytes end.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Utf8Validator {
    pending: [u8; 3],
}

impl Utf8Validator {
    /// Its state as bytes (see [`Utf8Validator::from_bytes`]).
    pub fn to_bytes(self) -> [u8; 3] {
        self.pending
    }

    /// The state [`Utf8Validator::to_bytes`] gave; bytes no validator
    /// could hold are refused.
    pub fn from_bytes(pending: [u8; 3]) -> Option<Utf8Validator> {
        let used = pending.iter().position(|&b| b == 0).unwrap_or(3);
        let valid = pending[used..].iter().all(|&b| b == 0)
            && pending[..used].first().is_none_or(|&b| b >= 0xC2)
            && pending[..used]
                .iter()
                .skip(1)
                .all(|&b| (0x80..0xC0).contains(&b));
        valid.then_some(Utf8Validator { pending })
    }

    /// Validates the next piece of the stream. Fails as soon as the bytes
    /// seen so far cannot be the start of valid UTF-8.
    ///
    /// Relies on `std::str::from_utf8`'s contract that `error_len() == None`
    /// only when the input ends inside a sequence that is still a valid
    /// prefix (the standard validator checks each continuation byte's range
    /// against the lead byte, e.g. `F4 90` is rejected at once).
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), InvalidUtf8> {
        if self.pending_len() > 0 {
            bytes = self.complete_pending(bytes)?;
            if self.pending_len() > 0 {
                return Ok(());
            }
        }
        match std::str::from_utf8(bytes) {
            Ok(_) => Ok(()),
            Err(e) if e.error_len().is_some() => Err(InvalidUtf8),
            Err(e) => {
                let tail = &bytes[e.valid_up_to()..];
                self.pending = [0; 3];
                self.pending[..tail.len()].copy_from_slice(tail);
                Ok(())
            }
        }
    }

    /// Checks that the stream did not end inside a code point, and resets
    /// the validator for the next message.
    pub fn finish(&mut self) -> Result<(), InvalidUtf8> {
        let complete = self.pending_len() == 0;
        *self = Utf8Validator::default();
        if complete {
            Ok(())
        } else {
            Err(InvalidUtf8)
        }
    }

    /// How many bytes of an unfinished code point are pending.
    fn pending_len(&self) -> usize {
        self.pending.iter().position(|&b| b == 0).unwrap_or(3)
    }

    /// Moves bytes from `bytes` into the pending code point until it is
    /// complete or `bytes` runs out; returns the bytes not used.
    fn complete_pending<'a>(&mut self, bytes: &'a [u8]) -> Result<&'a [u8], InvalidUtf8> {
        let held = self.pending_len();
        let width = sequence_width(self.pending[0]);
        let take = bytes.len().min(width - held);
        let mut candidate = [0u8; 4];
        candidate[..held].copy_from_slice(&self.pending[..held]);
        candidate[held..held + take].copy_from_slice(&bytes[..take]);
        match std::str::from_utf8(&candidate[..held + take]) {
            Ok(_) => {
                self.pending = [0; 3];
                Ok(&bytes[take..])
            }
            Err(e) if e.error_len().is_none() => {
                // Still a valid prefix (so no byte of it is 0), and the
                // input is used up.
                self.pending[held..held + take].copy_from_slice(&bytes[..take]);
                Ok(&[])
            }
            Err(_) => Err(InvalidUtf8),
        }
    }
}

/// The length of the sequence a valid lead byte starts.
fn sequence_width(lead: u8) -> usize {
    match lead {
        0xF0..=0xF7 => 4,
        0xE0..=0xEF => 3,
        _ => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate_in_pieces(pieces: &[&[u8]]) -> Result<(), InvalidUtf8> {
        let mut v = Utf8Validator::default();
        for piece in pieces {
            v.feed(piece)?;
        }
        v.finish()
    }

    const VALID: &[&str] = &[
        "",
        "hello",
        "κόσμε",
        "€",
        "𝄞 music",
        "a\u{10FFFF}b",
        "\u{FEFF}x",
        "日本語テキスト",
    ];
    const INVALID: &[&[u8]] = &[
        b"\xff",
        b"\xc0\xaf",
        b"\xed\xa0\x80",     // surrogate
        b"\xf4\x90\x80\x80", // above U+10FFFF
        b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80edited",
        b"\xe2\x82", // truncated at the end
        b"a\x80b",
    ];

    #[test]
    fn agrees_with_std_at_every_split_point() {
        let mut inputs: Vec<&[u8]> = VALID.iter().map(|s| s.as_bytes()).collect();
        inputs.extend_from_slice(INVALID);
        for input in inputs {
            let expected = std::str::from_utf8(input).is_ok();
            for a in 0..=input.len() {
                for b in a..=input.len() {
                    let pieces = [&input[..a], &input[a..b], &input[b..]];
                    assert_eq!(
                        validate_in_pieces(&pieces).is_ok(),
                        expected,
                        "{input:x?} split {a}/{b}"
                    );
                }
            }
        }
    }

    /// Autobahn 6.4.x: the error must be reported by the piece that holds the
    /// first invalid byte, not at the end of the message.
    #[test]
    fn fails_on_the_piece_with_the_first_impossible_byte() {
        let mut v = Utf8Validator::default();
        assert_eq!(v.feed("κόσμε".as_bytes()), Ok(()));
        assert_eq!(v.feed(b"\xf4"), Ok(()), "F4 may still start U+10xxxx");
        assert_eq!(v.feed(b"\x90"), Err(InvalidUtf8), "F4 90 is above U+10FFFF");

        let mut v = Utf8Validator::default();
        assert_eq!(v.feed(b"ok\xed"), Ok(()));
        assert_eq!(
            v.feed(b"\xa0"),
            Err(InvalidUtf8),
            "ED A0 starts a surrogate"
        );
    }

    #[test]
    fn a_message_ending_inside_a_code_point_is_invalid_and_resets() {
        let mut v = Utf8Validator::default();
        v.feed(b"\xe2\x82").unwrap();
        assert_eq!(v.finish(), Err(InvalidUtf8));
        assert_eq!(v.feed(b"fresh"), Ok(()));
        assert_eq!(v.finish(), Ok(()));
    }
}
