//! The loop's I/O below the connections: the poll and its sockets, the
//! one place `WouldBlock` is sorted from errors, a connection's output
//! queue of shared frames, the pool of input buffers, and the channel a
//! handover moves connections on.

pub(crate) mod channel;
pub(crate) mod nonblocking;
pub(crate) mod pool;
pub(crate) mod queue;
pub(crate) mod sockets;
