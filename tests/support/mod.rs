//! Helpers shared by the daemon kernel tests (`ublk_*` targets of this directory):
//! [`daemon`] runs `glidefs serve` and drives it through its CLI; [`logwrites`] reads and
//! replays a `dm-log-writes` log for the power-loss test.

pub mod daemon;
pub mod logwrites;
