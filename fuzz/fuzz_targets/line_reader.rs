//! The input's line splitter and judge, handed a stream in chunks of any
//! size.
//!
//! Input: `[limit, n, size_1 .. size_n, stream ..]`. The stream is handed
//! over `size_i + 1` bytes at a time, cycling (all at once when `n % 8` is
//! 0). The lines must be the stream split on `\n` (no line after a last
//! `\n`), each without one `\r` before its end, judged too long (over
//! `limit` bytes), not UTF-8 (with its bytes), or text, numbered from 1;
//! and splitting holds no more than the limit of any line: no allocation
//! while splitting is larger than a buffer grown to `limit + 2` bytes.

#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::ops::ControlFlow;
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

/// A line as judged, owned.
#[derive(Debug, PartialEq, Eq)]
enum Judged {
    Text(String),
    TooLong,
    NotUtf8(Vec<u8>),
}

impl From<Line<'_>> for Judged {
    fn from(line: Line<'_>) -> Judged {
        match line {
            Line::Text(text) => Judged::Text(text.to_string()),
            Line::TooLong => Judged::TooLong,
            Line::NotUtf8(bytes) => Judged::NotUtf8(bytes.to_vec()),
        }
    }
}

/// The lines of `stream` by the rules, straight from their statement.
fn expected(stream: &[u8], limit: usize) -> Vec<Judged> {
    if stream.is_empty() {
        return Vec::new();
    }
    let body = stream.strip_suffix(b"\n").unwrap_or(stream);
    body.split(|&b| b == b'\n')
        .map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.len() > limit {
                Judged::TooLong
            } else {
                match std::str::from_utf8(line) {
                    Ok(text) => Judged::Text(text.to_string()),
                    Err(_) => Judged::NotUtf8(line.to_vec()),
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
    let mut got = Vec::with_capacity(want.len() + 1);
    let mut lines = Lines::new(limit);
    let mut record = |number: u64, line: Line<'_>| {
        assert_eq!(number, got.len() as u64 + 1, "numbered in order from 1");
        got.push(Judged::from(line));
        ControlFlow::<()>::Continue(())
    };
    LARGEST.store(0, Ordering::Relaxed);
    WATCHING.store(true, Ordering::Relaxed);
    let mut rest = stream;
    let mut sizes = sizes.iter().cycle();
    while !rest.is_empty() {
        let size = sizes
            .next()
            .map_or(rest.len(), |&size| usize::from(size) + 1);
        let (chunk, after) = rest.split_at(size.min(rest.len()));
        let _ = lines.push(chunk, &mut record);
        rest = after;
    }
    let _ = lines.finish(&mut record);
    WATCHING.store(false, Ordering::Relaxed);
    let largest = LARGEST.load(Ordering::Relaxed);
    // What `got` itself grew to is not the splitter's: its room was made
    // before watching, for every line there is and one more.
    assert_eq!(got, want);
    assert!(
        largest <= (2 * (limit + 2)).max(8),
        "an allocation of {largest} bytes for a limit of {limit}"
    );
});
