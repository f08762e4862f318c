//! The WebSocket wire protocol, server role (RFC 6455): pure code over byte
//! slices, no sockets. One concern per file: codes, frame header, masking,
//! UTF-8 validation and the incremental decoder that ties them together.

pub mod codes;
pub mod compress;
pub mod decoder;
pub mod header;
pub mod inflate;
pub mod mask;
pub mod utf8;

pub use codes::{CloseCode, MessageKind, OpCode};
#[cfg(feature = "internals")]
pub use decoder::CloseFrame;
pub use decoder::{Decoder, Event, ProtocolError};
pub use header::FrameHeader;
