//! The wire: what travels between the bench and a server, as pure
//! functions over bytes. Frames, the upgrade handshake, permessage-deflate, event streams (SSE),
//! the payloads the bench sends and checks, and the JSON feed they are
//! padded with. Nothing here touches a socket or imports the rest of the
//! crate.

pub mod compression;
pub mod events;
pub mod feed;
pub mod frame;
pub mod handshake;
pub mod message;
