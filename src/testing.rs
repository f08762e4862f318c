//! Stand-ins for unit tests: a throttled socket and a tiny seeded
//! random number generator.

use std::io::{self, Write};

/// Accepts up to `budget` bytes in total, then reports `WouldBlock`.
#[derive(Debug, Default)]
pub struct ThrottledWriter {
    /// Everything written so far.
    pub written: Vec<u8>,
    /// Bytes it will still accept.
    pub budget: usize,
}

impl Write for ThrottledWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.budget == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(self.budget);
        self.budget -= n;
        self.written.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// xorshift64: a deterministic stream of pseudo-random numbers for
/// randomized tests (same seed, same inputs, every run).
#[derive(Debug, Clone)]
pub struct XorShift(pub u64);

impl XorShift {
    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
