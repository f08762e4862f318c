//! The fleet: worker processes (or threads) that each run the client's
//! loop, the one protocol between them and the coordinator, and the one
//! coordinator that spreads a plan over them and merges what they saw (a
//! push run's tallies, or a `channels` run's receipts).

pub mod coordinator;
pub mod protocol;
pub mod worker;
