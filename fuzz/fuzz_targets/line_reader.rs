//! The broadcast input's line reader, read in chunks of any size.
//!
//! Input: `[limit, n, size_1 .. size_n, stream ..]`. The stream is read
//! through a `BufRead` that hands out `size_i + 1` bytes at a time,
//! cycling (all at once when `n % 8` is 0); a size of 255 is a read
//! interrupted by a signal instead. The lines must be the stream split on
//! `\n` (no line after a last `\n`), each without one `\r` before its end,
//! judged too long (over `limit` bytes), not UTF-8, or text; and reading
//! holds no more than the limit of any line: no allocation while reading
//! is larger than a buffer grown to `limit + 1` bytes.

#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{self, BufRead, Read};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use libfuzzer_sys::fuzz_target;
use wspush::protocol::lines::{Line, Lines};

/// The system allocator, noting the largest allocation while `WATCHING`.
struct Watched;

static WATCHING: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn note(size: usize) {
    if WATCHING.load(Ordering::Relaxed) {
        LARGEST.fetch_max(size, Ordering::Relaxed);
    }
}

unsafe impl GlobalAlloc for Watched {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Watched = Watched;

/// A `BufRead` over `data` whose reads return the given sizes.
struct Chunked<'a> {
    data: &'a [u8],
    sizes: std::iter::Cycle<std::slice::Iter<'a, u8>>,
    current: &'a [u8],
    interrupted: bool,
}

impl<'a> Chunked<'a> {
    fn new(data: &'a [u8], sizes: &'a [u8]) -> Chunked<'a> {
        Chunked {
            data,
            sizes: sizes.iter().cycle(),
            current: &[],
            interrupted: false,
        }
    }
}

impl Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for Chunked<'_> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.current.is_empty() && !self.data.is_empty() {
            let size = match self.sizes.next() {
                None => self.data.len(),
                // Interrupted at most once in a row, so reading goes on.
                Some(255) if !self.interrupted => {
                    self.interrupted = true;
                    return Err(io::ErrorKind::Interrupted.into());
                }
                Some(&size) => usize::from(size) + 1,
            };
            self.interrupted = false;
            let (chunk, rest) = self.data.split_at(size.min(self.data.len()));
            self.current = chunk;
            self.data = rest;
        }
        Ok(self.current)
    }

    fn consume(&mut self, amount: usize) {
        self.current = &self.current[amount..];
    }
}

/// The lines of `stream` by the rules, straight from their statement.
fn expected(stream: &[u8], limit: usize) -> Vec<Line> {
    if stream.is_empty() {
        return Vec::new();
    }
    let body = stream.strip_suffix(b"\n").unwrap_or(stream);
    body.split(|&b| b == b'\n')
        .map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.len() > limit {
                Line::TooLong
            } else {
                match std::str::from_utf8(line) {
                    Ok(text) => Line::Text(text.to_string()),
                    Err(_) => Line::NotUtf8,
                }
            }
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&[limit, count], rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let limit = usize::from(limit);
    let count = usize::from(count % 8);
    if rest.len() < count {
        return;
    }
    let (sizes, stream) = rest.split_at(count);
    let want = expected(stream, limit);
    let mut lines = Lines::new(Chunked::new(stream, sizes), limit);
    LARGEST.store(0, Ordering::Relaxed);
    WATCHING.store(true, Ordering::Relaxed);
    let mut count = 0;
    while let Some(line) = lines.next_line().expect("reads never fail") {
        assert!(count < want.len(), "an extra line: {line:?}");
        assert_eq!(line, want[count], "line {}", count + 1);
        count += 1;
        assert_eq!(lines.number(), count as u64);
    }
    WATCHING.store(false, Ordering::Relaxed);
    assert_eq!(count, want.len(), "lines missing");
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest <= (2 * (limit + 1)).max(8),
        "an allocation of {largest} bytes for a limit of {limit}"
    );
});
