//! What the bench observes and how it writes it: the clients' receipts and
//! latency, the processes' and the machine's CPU and memory from `/proc`,
//! the connection ramp, a server's own counts (`/metrics`), the few raw OS
//! calls, and the number formats. It
//! imports nothing from the crate's other layers (only its `Error`).

pub mod cpu;
pub mod format;
pub mod latency;
pub mod procfs;
pub mod ramp;
pub mod scrape;
pub mod server_latency;
pub mod stats;
pub mod sys;
