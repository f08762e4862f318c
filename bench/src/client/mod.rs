//! The client: dialing and upgrading a connection, the connection's state
//! machine with its checks (in order, receipts, echo), the one mio loop
//! that drives a process's connections, the pacing of what it sends, and
//! the blocking probes. Built on [`crate::wire`],
//! recording into [`crate::observe`].

pub mod clients;
pub mod conn;
pub mod dial;
pub mod echoer;
pub mod pacing;
pub mod probe;
pub mod receipts;
