//! Operations: the counters every layer reports to, and the OS calls.

pub mod board;
pub(crate) mod exposition;
pub(crate) mod metrics;
pub mod sys;
