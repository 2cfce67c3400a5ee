//! The actors of the model: whole requests and background jobs built from the steps in
//! `steps.rs`, as the request protocol (`crates/volume/src/request.rs`) drives them for the
//! ublk target (`crates/ublk/src/volume_target`) and for `Volume::read`/`write`.

use std::collections::VecDeque;

use loom::sync::{Condvar, Mutex};

use glidefs_cache::loom_api::{Gate, NO_FILL};

use super::cache::{Block, Cache, LockMode, Prep, Source, Span, Ticket};

/// `glidefs_volume::MAX_ATTEMPTS` (the request protocol's one bound) is 16; 5 keeps the model small. A flush
/// completion or an eviction can refuse one fill (epoch bump, NO_FILL) and an eviction can
/// also take a block filled by an earlier attempt away, so each costs a write at most two
/// attempts; the scenarios run one of each, so 5 attempts must settle (the liveness test,
/// `eio_is_failure`). A request that runs out fails with -EIO having landed nothing, which
/// the safety invariants allow.
const MAX_ATTEMPTS: usize = 5;

/// `volume/src/volume.rs::Volume::fetch_block` → `fetch.rs::Fetcher::fetch_once`: the fill
/// token first, then the object store read, then `fill_clean` (no gate held throughout).
pub(crate) fn fetch_block(c: &Cache, b: usize) -> Block {
    let token = c.fill_token();
    let data = c.fetch(b);
    c.fill_clean(token, b, data);
    data
}

/// A WRITE off the loop thread: `volume_target/write.rs::Inner::write_blocking` /
/// `write_slow` (and `volume.rs::Volume::write` → `Cache::write_with`, the same order of
/// steps): `enter`,
/// `prepare_write(.., Wait)`, the data lands, `commit_write` under the same gate. A partial
/// write of a remote-only block drops the gate, fetches (the fill makes it Clean), waits
/// while an eviction of the block is still punching its hole (`volume.rs::
/// Volume::fetch_for_write`: such a fill is refused, NO_FILL), retries.
/// Returns whether it completed: after `MAX_ATTEMPTS` the request fails with -EIO
/// (`Inner::unsettled`), none of its data having landed.
pub(crate) fn write(c: &Cache, b: usize, span: Span, v: u8) -> bool {
    for _ in 0..MAX_ATTEMPTS {
        let gate = c.core.enter();
        match c.prepare_write(&gate, b, span, LockMode::Wait) {
            Prep::Ready(ticket) => {
                c.land(&gate, b, span, v);
                c.commit_write(&gate, ticket);
                drop(gate);
                c.completed(b, span, v);
                return true;
            }
            Prep::NeedsFetch => {
                drop(gate);
                fetch_block(c, b);
                while !c.v.retry_at_once && c.raw(b) & NO_FILL != 0 {
                    loom::thread::yield_now();
                }
            }
            Prep::WouldBlock => unreachable!("LockMode::Wait"),
        }
    }
    assert!(
        !c.v.eio_is_failure,
        "write did not settle: block {b} still needs a fetch after {MAX_ATTEMPTS} attempts"
    );
    false
}

/// A WRITE dispatched inline on the ublk loop thread and still in flight: its gate and
/// ticket (`target/write.rs::WriteKeep`) live until the completion is committed.
#[derive(Debug)]
pub(crate) struct InFlight {
    gate: Gate,
    ticket: Ticket,
    block: usize,
    span: Span,
    v: u8,
}

/// `volume_target/write.rs::write` (loop thread, never waits): `try_enter` +
/// `prepare_write(.., Try)`; the data lands (the kernel's WRITE_FIXED). `None`: deferred.
pub(crate) fn dispatch_write(c: &Cache, b: usize, span: Span, v: u8) -> Option<InFlight> {
    let gate = c.core.try_enter()?;
    match c.prepare_write(&gate, b, span, LockMode::Try) {
        Prep::Ready(ticket) => {
            c.land(&gate, b, span, v);
            Some(InFlight {
                gate,
                ticket,
                block: b,
                span,
                v,
            })
        }
        Prep::NeedsFetch | Prep::WouldBlock => None,
    }
}

impl InFlight {
    /// `target/write.rs::Inner::commit` (`after_write`, loop thread): `commit_write` under the
    /// request's own gate, then the gate is released and the request completes.
    pub(crate) fn complete(self, c: &Cache) {
        let InFlight {
            gate,
            ticket,
            block,
            span,
            v,
        } = self;
        c.commit_write(&gate, ticket);
        drop(gate);
        c.completed(block, span, v);
    }
}

/// A READ of block `b`, checked against the writes completed before it began.
/// `volume_target/read.rs::read` (inline: `try_enter`, `plan_read`, every piece local → the
/// chunks run under that same gate) and, when the gate is busy or the block is remote,
/// `read_cold` / `plan_cold`: a fresh gate, re-plan; a remote block is fetched with no gate
/// held (the fetch fills it Clean), then re-planned; a piece that is still remote is served
/// from the fetched bytes (the per-tag scratch memfd).
pub(crate) fn read(c: &Cache, b: usize) -> Block {
    let floor = c.floor(b);
    let got = read_block(c, b);
    c.check_read(b, floor, got);
    got
}

fn read_block(c: &Cache, b: usize) -> Block {
    if let Some(gate) = c.core.try_enter() {
        let src = c.plan_read(&gate, b);
        if src != Source::Remote {
            if c.v.stale_plan {
                // Broken: the plan's chunks are built from a gate taken after the planning
                // gate was dropped.
                drop(gate);
                let fresh = c.core.enter();
                return c.read_local(&fresh, b, src);
            }
            return c.read_local(&gate, b, src);
        }
        drop(gate); // remote: dropped before anything is fetched
    }
    let mut have: Option<Block> = None;
    for _ in 0..MAX_ATTEMPTS {
        let gate = c.core.enter();
        match (c.plan_read(&gate, b), have) {
            (Source::Remote, None) => {
                drop(gate);
                have = Some(fetch_block(c, b));
            }
            (Source::Remote, Some(data)) => {
                if c.v.stage_in_active {
                    // Broken: the fetched bytes are staged in the active file (at the block's
                    // offset) and the read is served from there.
                    c.active(&gate).pwrite(b, Span::Full, data);
                    return c.active(&gate).pread(b);
                }
                return data; // scratch
            }
            (src, _) => return c.read_local(&gate, b, src),
        }
    }
    panic!("model: read of block {b} did not settle");
}

/// `volume/src/sync.rs::Volume::sync_locked` / `flush_rotation`: rotate; read every rotated
/// block for the packs (`read_for_flush`); upload and publish the manifest (no gate);
/// `complete_flush`. Returns whether anything was flushed.
pub(crate) fn sync_to_store(c: &Cache) -> bool {
    let Some(rot) = c.rotate() else {
        return false;
    };
    let packed: Vec<(usize, Block)> = rot
        .blocks
        .iter()
        .map(|&b| (b, c.read_for_flush(b)))
        .collect();
    for (b, data) in packed {
        c.publish(b, data);
    }
    c.complete_flush(&rot);
    true
}

/// A request handed from the loop thread to the runtime (`target/mod.rs::Inner::defer`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Deferred {
    Write(usize, Span, u8),
    /// `IoOp::Flush` → `Volume::flush` → `Cache::flush`.
    Flush,
    /// The model's end of input.
    Stop,
}

/// The async runtime's blocking pool, as one thread that runs deferred requests in order.
#[derive(Debug)]
pub(crate) struct Runtime {
    queue: Mutex<VecDeque<Deferred>>,
    cv: Condvar,
}

impl Runtime {
    pub(crate) fn new() -> Self {
        Self {
            queue: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
        }
    }

    /// `target/mod.rs::Inner::defer`.
    pub(crate) fn defer(&self, r: Deferred) {
        self.queue.lock().unwrap().push_back(r);
        self.cv.notify_one();
    }

    pub(crate) fn run(&self, c: &Cache) {
        loop {
            let next = {
                let mut q = self.queue.lock().unwrap();
                loop {
                    match q.pop_front() {
                        Some(r) => break r,
                        None => q = self.cv.wait(q).unwrap(),
                    }
                }
            };
            match next {
                Deferred::Write(b, span, v) => {
                    write(c, b, span, v);
                }
                Deferred::Flush => {
                    c.flush();
                }
                Deferred::Stop => return,
            }
        }
    }
}
