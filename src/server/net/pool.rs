//! The loop's buffer pool: byte buffers lent to a connection only while it
//! holds bytes it cannot consume yet (a partial request head or frame, or an
//! echo message being assembled), so an idle connection owns no buffer.
//!
//! Memory comes back: [`BufferPool::trim`], called once a second, frees the
//! free buffers that were not needed during the whole last second, down
//! to the preallocated few, so a burst (thousands of half-sent requests)
//! leaves no lasting footprint.

/// A buffer lent by a [`BufferPool`]: empty when lent, with the pool's
/// standard capacity. Boxed so that a connection's slot for one costs 8 bytes.
pub type PooledBuf = Box<Vec<u8>>;

/// Free buffers ready to lend, allocated up front and reused.
#[derive(Debug)]
pub struct BufferPool {
    /// Free buffers, the most recently returned last (lent first).
    free: Vec<PooledBuf>,
    capacity: usize,
    /// Free buffers kept however long they sit idle.
    floor: usize,
    max_idle: usize,
    lent: usize,
    /// The fewest free buffers since the last trim: that many were not
    /// needed during the whole period.
    low_water: usize,
    /// Buffers freed so far (given back over the idle limit, grown, or trimmed).
    released: u64,
}

impl BufferPool {
    /// A pool of buffers of `capacity` bytes with `preallocated` of them
    /// allocated now, keeping at most `max_idle` free buffers afterwards.
    pub fn new(capacity: usize, preallocated: usize, max_idle: usize) -> BufferPool {
        BufferPool {
            free: (0..preallocated)
                .map(|_| Box::new(Vec::with_capacity(capacity)))
                .collect(),
            capacity,
            floor: preallocated,
            max_idle: max_idle.max(preallocated),
            lent: 0,
            low_water: preallocated,
            released: 0,
        }
    }

    /// Lends an empty buffer with the standard capacity.
    pub fn lend(&mut self) -> PooledBuf {
        self.lent += 1;
        let buf = self.free.pop();
        self.low_water = self.low_water.min(self.free.len());
        buf.unwrap_or_else(|| Box::new(Vec::with_capacity(self.capacity)))
    }

    /// Takes a buffer back. A buffer that grew past the standard capacity
    /// (an echo message) is freed rather than kept, as is any buffer beyond
    /// the idle limit, so the pool's own memory stays bounded.
    pub fn give_back(&mut self, mut buf: PooledBuf) {
        debug_assert!(self.lent > 0, "bug: returning a buffer the pool never lent");
        self.lent -= 1;
        if buf.capacity() == self.capacity && self.free.len() < self.max_idle {
            buf.clear();
            self.free.push(buf);
        } else {
            self.released += 1;
        }
    }

    /// Frees the free buffers that sat unused since the last trim, beyond
    /// the preallocated floor (the least recently used first); returns how
    /// many were freed.
    pub fn trim(&mut self) -> usize {
        let unused = self.low_water.min(self.free.len());
        let surplus = unused.saturating_sub(self.floor);
        self.free.drain(..surplus);
        if surplus > 0 && self.free.len() <= self.floor {
            self.free.shrink_to_fit();
        }
        self.low_water = self.free.len();
        self.released += surplus as u64;
        surplus
    }

    /// Buffers freed so far, by any of the ways above.
    pub fn released(&self) -> u64 {
        self.released
    }

    /// Whether there are free buffers beyond the floor for [`BufferPool::trim`] to look at.
    pub fn has_surplus(&self) -> bool {
        self.free.len() > self.floor
    }

    /// Buffers currently lent to connections.
    pub fn lent(&self) -> usize {
        self.lent
    }

    /// Free buffers held for reuse.
    pub fn idle(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lends_preallocated_buffers_and_reuses_them() {
        let mut pool = BufferPool::new(64, 2, 4);
        let a = pool.lend();
        let ptr = a.as_ptr();
        assert!(a.is_empty() && a.capacity() == 64);
        assert_eq!((pool.lent(), pool.idle()), (1, 1));
        pool.give_back(a);
        let again = pool.lend();
        assert_eq!(again.as_ptr(), ptr, "the same buffer comes back");
    }

    #[test]
    fn trimming_frees_only_what_a_whole_period_did_not_need() {
        let mut pool = BufferPool::new(16, 2, 100);
        let burst: Vec<_> = (0..10).map(|_| pool.lend()).collect();
        burst.into_iter().for_each(|b| pool.give_back(b));
        assert_eq!(pool.idle(), 10);
        assert_eq!(pool.trim(), 0, "all ten were in use during this period");
        let busy = [pool.lend(), pool.lend(), pool.lend()];
        assert_eq!(pool.trim(), 5, "seven stayed free; two are the floor");
        assert_eq!(pool.idle(), 2);
        busy.into_iter().for_each(|b| pool.give_back(b));
        assert_eq!(pool.trim(), 0, "the three came back during the period");
        assert_eq!(pool.trim(), 3);
        assert_eq!((pool.idle(), pool.trim()), (2, 0));
        assert!(!pool.has_surplus());
    }

    #[test]
    fn frees_grown_buffers_and_caps_idle_ones() {
        let mut pool = BufferPool::new(16, 0, 2);
        let mut grown = pool.lend();
        grown.extend_from_slice(&[0; 100]);
        pool.give_back(grown);
        assert_eq!(pool.idle(), 0, "a grown buffer is not kept");
        let bufs: Vec<_> = (0..5).map(|_| pool.lend()).collect();
        bufs.into_iter().for_each(|b| pool.give_back(b));
        assert_eq!((pool.lent(), pool.idle()), (0, 2));
        assert_eq!(
            pool.released(),
            1 + 3,
            "the grown one and three over the limit"
        );
    }
}
