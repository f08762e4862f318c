//! The memory the loop lends its connection handlers: the read buffer,
//! the gathered replies and frames, the deflate work space, what
//! connections hold aside (output not taken yet, input not consumed
//! yet, messages being assembled), what a delivery visit left, and the pool of input buffers with its trim schedule.
//! All allocated once, their capacities kept.

use std::time::{Duration, Instant};

use crate::config::Config;
use crate::ops::sys;
use crate::server::conn::{Aside, DeflateScratch};
use crate::server::frames::SharedFrames;
use crate::server::net::pool::BufferPool;

/// Size of the loop's one read buffer; every connection reads into it.
const SCRATCH_BYTES: usize = 64 * 1024;
/// Input buffers allocated at start, and kept idle at most.
const POOL_PREALLOCATED: usize = 64;
const POOL_MAX_IDLE: usize = 1024;
/// How often free pool buffers unused for that long are given back.
const POOL_TRIM_PERIOD: Duration = Duration::from_secs(1);
/// Buffers freed (2 MiB worth) before the allocator is asked to hand the
/// memory back to the kernel (see [`sys`]).
const RELEASE_AFTER_BUFFERS: u64 = 256;

/// The buffers every connection handler borrows (see
/// [`Ctx`](crate::server::conn::Ctx)), owned by the loop.
#[derive(Debug)]
pub(super) struct Buffers {
    /// The one read buffer.
    pub(super) scratch: Box<[u8]>,
    /// See [`Ctx::replies`](crate::server::conn::Ctx::replies).
    pub(super) replies: Vec<u8>,
    /// See [`Ctx::deflate`](crate::server::conn::Ctx::deflate).
    pub(super) deflate: DeflateScratch,
    /// See [`Ctx::gathered`](crate::server::conn::Ctx::gathered).
    pub(super) gathered: Vec<SharedFrames>,
    /// See [`Ctx::aside`](crate::server::conn::Ctx::aside).
    pub(super) aside: Aside,
    /// Where bytes not consumed yet wait.
    pub(super) pool: BufferPool,
    /// When the pool next gives back buffers that sat unused (only while
    /// it has surplus, or freed buffers the allocator still holds).
    next_trim: Option<Instant>,
    /// The pool's count of freed buffers when the allocator last returned memory.
    released_at_last_return: u64,
}

impl Buffers {
    /// The buffers for `config`'s limits.
    pub(super) fn new(config: &Config) -> Buffers {
        Buffers {
            scratch: vec![0; SCRATCH_BYTES.max(config.max_head_bytes)].into_boxed_slice(),
            replies: Vec::with_capacity(SCRATCH_BYTES),
            deflate: DeflateScratch::default(),
            gathered: Vec::new(),
            aside: Aside::default(),
            pool: BufferPool::new(config.max_head_bytes, POOL_PREALLOCATED, POOL_MAX_IDLE),
            next_trim: None,
            released_at_last_return: 0,
        }
    }

    /// When the pool is next trimmed, if it is to be.
    pub(super) fn next_trim(&self) -> Option<Instant> {
        self.next_trim
    }

    /// Once a second while the pool has surplus: frees the buffers unused
    /// for that long, and asks the allocator to return freed memory to the
    /// kernel once enough was freed.
    pub(super) fn trim_pool(&mut self, now: Instant) {
        if self.next_trim.is_some_and(|at| now >= at) {
            self.pool.trim();
            self.next_trim = None;
            if self.unreturned_buffers() >= RELEASE_AFTER_BUFFERS {
                sys::release_free_memory();
                self.released_at_last_return = self.pool.released();
            }
        }
        if self.next_trim.is_none()
            && (self.pool.has_surplus() || self.unreturned_buffers() >= RELEASE_AFTER_BUFFERS)
        {
            self.next_trim = Some(now + POOL_TRIM_PERIOD);
        }
    }

    /// Buffers freed since the allocator last returned memory.
    fn unreturned_buffers(&self) -> u64 {
        self.pool.released() - self.released_at_last_return
    }
}
