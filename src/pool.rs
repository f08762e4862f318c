//! The loop's buffer pool: byte buffers lent to a connection only while it
//! holds bytes it cannot consume yet (a partial request head or frame, or an
//! echo message being assembled), so an idle connection owns no buffer.

/// A buffer lent by a [`BufferPool`]: empty when lent, with the pool's
/// standard capacity. Boxed so that a connection's slot for one costs 8 bytes.
pub type PooledBuf = Box<Vec<u8>>;

/// Free buffers ready to lend, allocated up front and reused.
#[derive(Debug)]
pub struct BufferPool {
    free: Vec<PooledBuf>,
    capacity: usize,
    max_idle: usize,
    lent: usize,
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
            max_idle: max_idle.max(preallocated),
            lent: 0,
        }
    }

    /// Lends an empty buffer with the standard capacity.
    pub fn lend(&mut self) -> PooledBuf {
        self.lent += 1;
        self.free
            .pop()
            .unwrap_or_else(|| Box::new(Vec::with_capacity(self.capacity)))
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
        }
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
    fn frees_grown_buffers_and_caps_idle_ones() {
        let mut pool = BufferPool::new(16, 0, 2);
        let mut grown = pool.lend();
        grown.extend_from_slice(&[0; 100]);
        pool.give_back(grown);
        assert_eq!(pool.idle(), 0, "a grown buffer is not kept");
        let bufs: Vec<_> = (0..5).map(|_| pool.lend()).collect();
        bufs.into_iter().for_each(|b| pool.give_back(b));
        assert_eq!((pool.lent(), pool.idle()), (0, 2));
    }
}
