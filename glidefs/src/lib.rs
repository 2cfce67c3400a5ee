//! glidefs: the daemon and CLI that join the ublk transport (`ublk-core`) and the storage
//! engine (`crates/`). This is the only crate where both meet.

pub mod cli;
