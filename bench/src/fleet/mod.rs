//! The fleet: worker processes (or threads) that each run the client's
//! loop, the protocol between them and the coordinator, and the
//! coordinator that spreads a plan over them and merges what they saw.

pub mod coordinator;
pub mod protocol;
pub mod worker;
