//! The measurements the binary's subcommands run, one module each. They
//! use every other layer; no other layer uses them (the binary and the
//! tests do).

pub mod channels;
pub mod compare;
pub mod deflate;
pub mod echo;
pub mod hosts;
pub mod push;
pub mod trickle;
pub mod upstream;
