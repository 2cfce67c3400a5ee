//! A target that completes every request at once without moving data (reads return
//! whatever the kernel's buffer held). Measures the transport's own cost.

use crate::target::{Dispatch, IoDesc, Target};
use crate::DispatchCtx;

/// Completes every request immediately with success.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullTarget;

impl Target for NullTarget {
    type Keepalive = ();

    fn dispatch(&self, io: &IoDesc, _ctx: &mut DispatchCtx<'_>) -> Dispatch {
        Dispatch::complete(io.success_result())
    }
}
