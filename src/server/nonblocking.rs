//! The only place that sorts `WouldBlock` and `Interrupted` from real I/O
//! errors, following mio's edge-triggered contract: operate until the socket
//! would block.

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

/// Reads once into `buf`, retrying on `EINTR`.
pub fn read_some(r: &mut impl Read, buf: &mut [u8]) -> io::Result<Progress> {
    loop {
        match r.read(buf) {
            Ok(0) => return Ok(Progress::Eof),
            Ok(n) => return Ok(Progress::Done(n)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Progress::WouldBlock),
            Err(e) => return Err(e),
        }
    }
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
        match write() {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
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
