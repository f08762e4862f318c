//! Inflating a client's compressed message (RFC 7692 §7.2.2): the payload,
//! the 4-byte tail its sync flush dropped put back, inflated with a fresh
//! window (the server asks every client for no context takeover), and
//! never more than the message limit: a payload that would inflate past
//! it is refused as soon as it has, not after.

use flate2::{Decompress, FlushDecompress, Status};

/// The tail a sync flush ends with, which permessage-deflate drops.
pub const SYNC_TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// Output grown per step while inflating.
const STEP: usize = 16 * 1024;

/// Why a compressed message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflateError {
    /// It inflates to more than the limit (close 1009).
    TooBig,
    /// It is not valid DEFLATE data (close 1007).
    Corrupt,
}

/// One inflater for every connection: each message starts afresh.
pub struct Inflater {
    inner: Decompress,
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater").finish_non_exhaustive()
    }
}

impl Default for Inflater {
    fn default() -> Self {
        Inflater {
            inner: Decompress::new(false),
        }
    }
}

impl Inflater {
    /// Inflates `payload` into `out` (cleared first; it grows to at most
    /// `limit` bytes and a step more).
    pub fn inflate(
        &mut self,
        payload: &[u8],
        limit: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), InflateError> {
        self.inner.reset(false);
        out.clear();
        for input in [payload, &SYNC_TAIL[..]] {
            let mut input = input;
            loop {
                if out.len() == out.capacity() {
                    if out.len() > limit {
                        return Err(InflateError::TooBig);
                    }
                    // Room for one byte past the limit at most.
                    let room = STEP.min(limit.saturating_add(1) - out.len());
                    out.reserve_exact(room);
                }
                let before = self.inner.total_in();
                let status = self
                    .inner
                    .decompress_vec(input, out, FlushDecompress::Sync)
                    .map_err(|_| InflateError::Corrupt)?;
                let used = (self.inner.total_in() - before) as usize;
                input = &input[used..];
                if out.len() > limit {
                    return Err(InflateError::TooBig);
                }
                match status {
                    // A final block: what follows it is not part of the message.
                    Status::StreamEnd => return Ok(()),
                    _ if input.is_empty() && out.len() < out.capacity() => break,
                    Status::BufError if used == 0 && out.len() < out.capacity() => {
                        return Err(InflateError::Corrupt)
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Compress, Compression, FlushCompress};

    /// What a browser sends: a sync-flushed raw stream, its tail dropped.
    fn compressed(message: &[u8]) -> Vec<u8> {
        let mut c = Compress::new(Compression::default(), false);
        let mut out = Vec::with_capacity(message.len() + 64);
        c.compress_vec(message, &mut out, FlushCompress::Sync)
            .unwrap();
        assert!(out.ends_with(&SYNC_TAIL));
        out.truncate(out.len() - 4);
        out
    }

    #[test]
    fn messages_come_back_whole_one_after_another() {
        let (mut inflater, mut out) = (Inflater::default(), Vec::new());
        for message in [&b"hello"[..], b"", &[7u8; 100_000], b"{\"a\":1}"] {
            let payload = compressed(message);
            inflater.inflate(&payload, 1 << 20, &mut out).unwrap();
            assert_eq!(out, message);
        }
    }

    #[test]
    fn a_bomb_is_refused_at_the_limit_not_after() {
        let bomb = compressed(&vec![0u8; 10 << 20]);
        assert!(bomb.len() < 100_000, "{} bytes", bomb.len());
        let (mut inflater, mut out) = (Inflater::default(), Vec::new());
        let got = inflater.inflate(&bomb, 1 << 20, &mut out);
        assert_eq!(got, Err(InflateError::TooBig));
        assert!(out.capacity() <= (1 << 20) + STEP, "grew to the limit only");
        let exactly = compressed(&[1u8; 1000]);
        inflater.inflate(&exactly, 1000, &mut out).unwrap();
        assert_eq!(out.len(), 1000);
        let got = inflater.inflate(&exactly, 999, &mut out);
        assert_eq!(got, Err(InflateError::TooBig));
    }

    #[test]
    fn garbage_is_refused_as_corrupt() {
        let (mut inflater, mut out) = (Inflater::default(), Vec::new());
        // BTYPE 11 is reserved.
        let got = inflater.inflate(&[0xff, 0xff, 0xff], 1000, &mut out);
        assert_eq!(got, Err(InflateError::Corrupt));
        let ok = compressed(b"still fine");
        inflater.inflate(&ok, 1000, &mut out).unwrap();
        assert_eq!(out, b"still fine");
    }
}
