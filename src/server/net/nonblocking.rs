//! The one place where the loop's socket calls sort `WouldBlock` and
//! `Interrupted` from real I/O errors: reads, writes and accepts go
//! through these helpers. (The poll's own `EINTR` is an empty wake-up,
//! which the loop handles where it polls.)
//!
//! The edge-triggered rule itself is kept by the callers: writes and
//! accepts go on until the socket would block (or a per-wake-up budget is
//! spent, and the loop comes back); reads stop at a short read when the
//! read answers an edge, because Linux reports every later arrival as a
//! new edge (see `Conn::on_readable`).

use std::io::{self, IoSlice, Read, Write};

/// What a non-blocking operation came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// This many bytes were transferred and more may follow.
    Done(usize),
    /// The peer closed its side (a read of zero bytes).
    Eof,
    /// The socket would block: wait for the next readiness event.
    WouldBlock,
}

/// Runs `op` until it does not fail with `EINTR`; `Ok(None)` when the
/// socket would block.
pub fn attempt<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<Option<T>> {
    loop {
        match op() {
            Ok(value) => return Ok(Some(value)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        }
    }
}

/// Reads once into `buf`, retrying on `EINTR`.
pub fn read_some(r: &mut impl Read, buf: &mut [u8]) -> io::Result<Progress> {
    Ok(match attempt(|| r.read(buf))? {
        Some(0) => Progress::Eof,
        Some(n) => Progress::Done(n),
        None => Progress::WouldBlock,
    })
}

/// Writes `parts` in order until all are written or the socket would
/// block; returns the number of bytes written. One part is one `write`,
/// several are one `writev` (up to [`MAX_IOV`] parts).
pub fn write_until_blocked(w: &mut impl Write, parts: &[&[u8]]) -> io::Result<usize> {
    if let [part] = parts {
        let mut rest = *part;
        return write_loop(
            || {
                let n = w.write(rest)?;
                rest = &rest[n..];
                Ok(n)
            },
            part.len(),
        );
    }
    let mut slices = [IoSlice::new(&[]); MAX_IOV];
    let count = parts.len().min(MAX_IOV);
    for (slice, part) in slices.iter_mut().zip(parts) {
        *slice = IoSlice::new(part);
    }
    let total: usize = parts[..count].iter().map(|p| p.len()).sum();
    let mut remaining = &mut slices[..count];
    write_loop(
        || {
            let n = w.write_vectored(remaining)?;
            IoSlice::advance_slices(&mut remaining, n);
            Ok(n)
        },
        total,
    )
}

/// Calls `write` (which advances its own cursor) until `total` bytes are
/// written or the socket would block, retrying on `EINTR`.
fn write_loop(mut write: impl FnMut() -> io::Result<usize>, total: usize) -> io::Result<usize> {
    let mut written = 0;
    while written < total {
        match attempt(&mut write)? {
            Some(0) => return Err(io::ErrorKind::WriteZero.into()),
            Some(n) => written += n,
            None => break,
        }
    }
    Ok(written)
}

/// The most slices handed to one `writev`.
pub const MAX_IOV: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ThrottledWriter;

    #[test]
    fn writes_parts_in_order_until_blocked() {
        let mut w = ThrottledWriter {
            budget: 5,
            ..Default::default()
        };
        assert_eq!(write_until_blocked(&mut w, &[b"abc", b"defg"]).unwrap(), 5);
        assert_eq!(w.written, b"abcde");
        w.budget = 100;
        assert_eq!(write_until_blocked(&mut w, &[b"fg", b"", b"h"]).unwrap(), 3);
        assert_eq!(w.written, b"abcdefgh");
    }
}
