//! Fault descriptions for [`FaultyStore`](crate::FaultyStore): which calls a rule matches, when
//! it fires, what it does, and the error an injected fault produces.
//!
//! Injected errors are ordinary `object_store::Error::Generic` values whose source is a
//! `std::io::Error` with a telling kind, wrapping an [`InjectedFault`]:
//! - [`Fault::Transient`], [`Fault::LostAck`], [`Fault::FailAfterBytes`]: `ConnectionReset`
//!   (a caller should classify this as retryable),
//! - [`Fault::Timeout`]: `TimedOut` (retryable), after the stall,
//! - [`Fault::Late`]: `TimedOut` (retryable) at once; a put or delete still lands later,
//! - [`Fault::Outage`]: `ConnectionRefused` (retryable),
//! - [`Fault::Permanent`]: `PermissionDenied` (a caller must not retry).
//!
//! [`is_injected`] tells an injected error from a real one.
//!
//! [`FaultPlan`] holds the rules, the outage switch and the held calls; the
//! [`FaultyStore`](crate::FaultyStore) consults one per call, and so does the test S3 server
//! ([`S3Listener::serve_with_faults`](crate::S3Listener::serve_with_faults)) per HTTP request.
//!
//! Time: stalls, timeouts and timed outages use tokio's clock, so a test on a runtime with
//! paused time (`start_paused`) passes hours of outage in no wall-clock time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::watch;
use tokio::time::Instant;

const STORE_NAME: &str = "FaultyStore";

/// The kind of object store call a rule or counter refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `put_opts` (single-shot upload).
    Put,
    /// `put_multipart_opts` (start of a multipart upload).
    PutMultipart,
    /// `get_opts` without `head` (includes ranged gets).
    Get,
    /// `get_opts` with `head` set (`ObjectStoreExt::head`).
    Head,
    /// `list`, `list_with_offset`, `list_with_delimiter`.
    List,
    /// One path of `delete_stream` (`ObjectStoreExt::delete`).
    Delete,
    /// `copy_opts` (and renames, which copy then delete).
    Copy,
}

impl Op {
    pub(crate) const ALL: [Op; 7] = [
        Op::Put,
        Op::PutMultipart,
        Op::Get,
        Op::Head,
        Op::List,
        Op::Delete,
        Op::Copy,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// What an injected fault does to the call it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fail without touching the inner store; retryable (`io::ErrorKind::ConnectionReset`).
    Transient,
    /// Fail without touching the inner store; not retryable (`io::ErrorKind::PermissionDenied`).
    Permanent,
    /// Perform the call on the inner store, then report a retryable error anyway (the
    /// acknowledgement was lost on the way back).
    LostAck,
    /// The transfer breaks after this many bytes: a put fails without creating the object; a get
    /// yields this many bytes and then a retryable error.
    FailAfterBytes(usize),
    /// A get returns the real data with one bit flipped at `byte % len` (silent corruption);
    /// on other operations it behaves like a pass-through.
    FlipBit {
        /// Byte offset (modulo the returned length) whose lowest bit is flipped.
        byte: usize,
    },
    /// The call hangs this long (tokio time), then goes through normally (a slow store).
    Stall(Duration),
    /// The call hangs this long (tokio time), then fails with `TimedOut` without reaching the
    /// store (a client's request timeout); retryable.
    Timeout(Duration),
    /// The call hangs until [`FaultPlan::release_held`], then goes through normally. Tests
    /// use it to run something else while a call is known to be in flight
    /// ([`FaultPlan::wait_held`]).
    Hold,
    /// A listing finds nothing, as one that ran just before another writer's objects landed
    /// (a stale listing): a list call answers an empty listing without reaching the store;
    /// other operations go through.
    EmptyList,
    /// The store is unreachable ([`FaultPlan::set_outage`], [`FaultPlan::outage_for`]): the
    /// call fails with `ConnectionRefused` without reaching the store; retryable. Not meant
    /// for rules: the outage switch produces it.
    Outage,
    /// A request that outlives its client's timeout: a put or a delete fails at once with
    /// `TimedOut` (retryable) but is parked, and reaches the store only when the test calls
    /// [`FaultyStore::land_late`](crate::FaultyStore::land_late), after whatever ran
    /// meanwhile (its own retry, other hosts' calls): a delayed and reordered call. Other
    /// operations (and the test S3 server, which cannot park a request) fail with `TimedOut`
    /// without reaching the store.
    Late,
}

impl Fault {
    /// True when the call fails without reaching the store now (the caller sees an error and
    /// nothing happened; except a [`Fault::Late`] put or delete of a `FaultyStore`, which it
    /// parks before asking this, and which lands later).
    pub fn fails_early(self) -> bool {
        matches!(
            self,
            Fault::Transient | Fault::Permanent | Fault::Outage | Fault::Timeout(_) | Fault::Late
        )
    }
}

/// When a rule fires.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Trigger {
    Next(u64),
    Always,
    Probability(f64),
}

/// One programmable fault: where it applies, when it fires, what it does.
#[derive(Debug, Clone)]
pub struct FaultRule {
    pub(crate) fault: Fault,
    ops: Option<Vec<Op>>,
    path_contains: Option<String>,
    pub(crate) trigger: Trigger,
    then_outage: bool,
    /// Matching calls still to let through before the trigger is asked ([`FaultRule::after`]).
    skip: u64,
}

impl FaultRule {
    /// A rule that fires on every call (narrow it with [`ops`](Self::ops), [`times`](Self::times),
    /// [`probability`](Self::probability), [`path_contains`](Self::path_contains)).
    pub fn new(fault: Fault) -> Self {
        Self {
            fault,
            ops: None,
            path_contains: None,
            trigger: Trigger::Always,
            then_outage: false,
            skip: 0,
        }
    }

    /// Lets the first `k` matching calls through untouched; the trigger applies from the
    /// next one on (e.g. `.after(3).times(1)`: the 4th matching call, and only it).
    pub fn after(mut self, k: u64) -> Self {
        self.skip = k;
        self
    }

    /// Once this rule fires, the store goes down (as [`FaultPlan::set_outage`]`(true)`)
    /// until switched back on: e.g. a put lands, its reply is lost, and the retries find the
    /// store gone.
    pub fn then_outage(mut self) -> Self {
        self.then_outage = true;
        self
    }

    /// Only calls of these operations match.
    pub fn ops(mut self, ops: &[Op]) -> Self {
        self.ops = Some(ops.to_vec());
        self
    }

    /// Only calls whose path (or list prefix) contains `needle` match.
    pub fn path_contains(mut self, needle: &str) -> Self {
        self.path_contains = Some(needle.to_string());
        self
    }

    /// Fire on the next `n` matching calls, then never again.
    pub fn times(mut self, n: u64) -> Self {
        self.trigger = Trigger::Next(n);
        self
    }

    /// Fire on each matching call with probability `p` (clamped to 0..=1), drawn from the store's
    /// seeded RNG so a run is reproducible.
    pub fn probability(mut self, p: f64) -> Self {
        self.trigger = Trigger::Probability(p.clamp(0.0, 1.0));
        self
    }

    pub(crate) fn matches(&self, op: Op, path: &str) -> bool {
        self.ops.as_ref().is_none_or(|ops| ops.contains(&op))
            && self
                .path_contains
                .as_ref()
                .is_none_or(|needle| path.contains(needle.as_str()))
    }
}

/// The payload of every injected error, reachable through the error's source chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("injected {fault:?} fault: op={op:?} path=`{path}`")]
pub struct InjectedFault {
    /// The operation that was hit.
    pub op: Op,
    /// The path (or list prefix) of the call.
    pub path: String,
    /// The fault that fired.
    pub fault: Fault,
}

/// True when `err` was produced by a [`FaultyStore`](crate::FaultyStore).
pub fn is_injected(err: &object_store::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(e) = source {
        if e.is::<InjectedFault>() {
            return true;
        }
        // `io::Error::source` skips the custom payload itself; look at it explicitly.
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<InjectedFault>())
            {
                return true;
            }
        }
        source = e.source();
    }
    false
}

pub(crate) fn injected_error(op: Op, path: &str, fault: Fault) -> object_store::Error {
    let kind = match fault {
        Fault::Permanent => std::io::ErrorKind::PermissionDenied,
        Fault::Timeout(_) | Fault::Late => std::io::ErrorKind::TimedOut,
        Fault::Outage => std::io::ErrorKind::ConnectionRefused,
        _ => std::io::ErrorKind::ConnectionReset,
    };
    let payload = InjectedFault {
        op,
        path: path.to_string(),
        fault,
    };
    object_store::Error::Generic {
        store: STORE_NAME,
        source: Box::new(std::io::Error::new(kind, payload)),
    }
}

#[derive(Debug)]
struct Rules {
    rules: Vec<FaultRule>,
    rng: StdRng,
}

/// When the store is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outage {
    Up,
    /// Down until switched back on.
    Down,
    /// Down until this instant (tokio time).
    Until(Instant),
}

/// The faults of one store: rules (checked in the order they were added; the first that
/// matches and fires decides a call), an outage switch, and the calls held by [`Fault::Hold`].
/// Shared by a [`FaultyStore`](crate::FaultyStore) and the streams it hands out, or by the
/// test S3 server's connections.
#[derive(Debug)]
pub struct FaultPlan {
    rules: Mutex<Rules>,
    outage: Mutex<Outage>,
    /// Bumped by `release_held`; a held call waits for a value above the one it saw.
    release: watch::Sender<u64>,
    /// Calls waiting in a hold now.
    held: watch::Sender<usize>,
    fired: AtomicU64,
    calls: [AtomicU64; Op::ALL.len()],
}

impl FaultPlan {
    /// No rules, store up; probability rules draw from an RNG seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            rules: Mutex::new(Rules {
                rules: Vec::new(),
                rng: StdRng::seed_from_u64(seed),
            }),
            outage: Mutex::new(Outage::Up),
            release: watch::Sender::new(0),
            held: watch::Sender::new(0),
            fired: AtomicU64::new(0),
            calls: Default::default(),
        }
    }

    /// Calls of `op` this plan decided on (faulted ones included).
    pub fn calls(&self, op: Op) -> u64 {
        self.calls[op.index()].load(Ordering::Relaxed)
    }

    /// Adds a rule after the existing ones.
    pub fn inject(&self, rule: FaultRule) {
        self.rules.lock().rules.push(rule);
    }

    /// Removes every rule (an outage and held calls stay: see `set_outage`, `release_held`).
    pub fn clear_faults(&self) {
        self.rules.lock().rules.clear();
    }

    /// Takes the store down (`true`: every call fails with [`Fault::Outage`]) or brings it
    /// back (`false`).
    pub fn set_outage(&self, down: bool) {
        *self.outage.lock() = if down { Outage::Down } else { Outage::Up };
    }

    /// Takes the store down for `duration` of tokio time from now.
    pub fn outage_for(&self, duration: Duration) {
        *self.outage.lock() = Outage::Until(Instant::now() + duration);
    }

    /// True while the store is down.
    pub fn in_outage(&self) -> bool {
        let mut outage = self.outage.lock();
        match *outage {
            Outage::Up => false,
            Outage::Down => true,
            Outage::Until(t) if Instant::now() < t => true,
            Outage::Until(_) => {
                *outage = Outage::Up;
                false
            }
        }
    }

    /// How many calls a fault fired on (outage refusals included).
    pub fn faults_fired(&self) -> u64 {
        self.fired.load(Ordering::Relaxed)
    }

    /// Decides the fault of one call of `op` on `path`: the outage first, then the rules.
    pub fn decide(&self, op: Op, path: &str) -> Option<Fault> {
        self.calls[op.index()].fetch_add(1, Ordering::Relaxed);
        let fired = if self.in_outage() {
            Some(Fault::Outage)
        } else {
            let mut guard = self.rules.lock();
            let Rules { rules, rng } = &mut *guard;
            let mut fired = None;
            for rule in rules.iter_mut() {
                if !rule.matches(op, path) {
                    continue;
                }
                if rule.skip > 0 {
                    rule.skip -= 1;
                    continue;
                }
                let fires = match &mut rule.trigger {
                    Trigger::Always => true,
                    Trigger::Next(0) => false,
                    Trigger::Next(n) => {
                        *n -= 1;
                        true
                    }
                    Trigger::Probability(p) => rng.random_bool(*p),
                };
                if fires {
                    fired = Some(rule.fault);
                    if rule.then_outage {
                        *self.outage.lock() = Outage::Down;
                    }
                    break;
                }
            }
            rules.retain(|r| r.trigger != Trigger::Next(0));
            fired
        };
        if fired.is_some() {
            self.fired.fetch_add(1, Ordering::Relaxed);
        }
        fired
    }

    /// Waits out the delay part of `fault` (a stall, a timeout, a hold); returns at once for
    /// every other fault.
    pub async fn delay(&self, fault: Option<Fault>) {
        match fault {
            Some(Fault::Stall(d) | Fault::Timeout(d)) => tokio::time::sleep(d).await,
            Some(Fault::Hold) => self.hold().await,
            _ => {}
        }
    }

    async fn hold(&self) {
        let mut release = self.release.subscribe();
        let seen = *release.borrow_and_update();
        // Counted while it waits, and no longer once it ends or is dropped (a caller aborted
        // while held must not leave a held call behind for the next `wait_held`).
        let _held = HeldCall::new(&self.held);
        // The sender lives in `self`, so `wait_for` only ends by a release.
        let _ = release.wait_for(|v| *v > seen).await;
    }

    /// Calls waiting in a [`Fault::Hold`] now.
    pub fn held(&self) -> usize {
        *self.held.borrow()
    }

    /// Waits until at least `n` calls are held.
    pub async fn wait_held(&self, n: usize) {
        let mut held = self.held.subscribe();
        let _ = held.wait_for(|h| *h >= n).await;
    }

    /// Lets every call held now go on (calls that hit a hold rule later are held again).
    pub fn release_held(&self) {
        self.release.send_modify(|v| *v += 1);
    }
}

/// One call counted in [`FaultPlan::held`] for as long as it lives.
struct HeldCall<'a>(&'a watch::Sender<usize>);

impl<'a> HeldCall<'a> {
    fn new(held: &'a watch::Sender<usize>) -> Self {
        held.send_modify(|n| *n += 1);
        Self(held)
    }
}

impl Drop for HeldCall<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}
