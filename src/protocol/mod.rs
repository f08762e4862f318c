//! The protocol layer: pure code over byte slices, no I/O. Parsers return
//! a status (incomplete input is not an error) and small error enums that
//! map to one HTTP status or one close code.

pub mod auth;
pub mod commands;
pub mod deflate;
pub(crate) mod handover;
pub mod http;
pub mod jwt;
// The binary's input; the library has none.
#[cfg(feature = "internals")]
pub mod lines;
pub mod names;
pub mod position;
pub mod presence;
// The binary's publish listener; the library has none.
#[cfg(feature = "internals")]
pub mod publish;
pub mod query;
pub mod sse;
pub(crate) mod target;
pub mod ws;
