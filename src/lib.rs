//! wspush
#![deny(missing_docs)]
pub mod ws;
