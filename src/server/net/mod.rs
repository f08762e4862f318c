//! The loop's I/O below the connections: the poll and its sockets, the
//! one place `WouldBlock` is sorted from errors, a connection's output
//! queue of shared frames, and the pool of input buffers.

pub(crate) mod nonblocking;
pub(crate) mod pool;
pub(crate) mod queue;
pub(crate) mod sockets;
