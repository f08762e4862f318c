//! Operations: the counters every layer reports to, and the OS calls.

pub(crate) mod metrics;
pub mod sys;
