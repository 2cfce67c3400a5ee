//! `FaultyStore`: an [`ObjectStore`] wrapper that injects programmable faults.
//!
//! Faults are described by [`FaultRule`]s: which operations and paths a rule applies to, when it
//! fires (the next N matching calls, always, or with probability p drawn from a seeded RNG) and
//! what happens ([`Fault`]): an error, a lost reply, a broken or corrupted transfer, a stall,
//! a held call, an empty (stale) listing. Rules are checked in the order they were added; the
//! first rule that matches and fires decides the call. An outage ([`FaultyStore::set_outage`],
//! [`FaultyStore::outage_for`]) fails every call before the rules are asked. A latency, if set,
//! is added to every call. Rules, outage and held calls live in a [`FaultPlan`]
//! ([`FaultyStore::plan`]).
//!
//! The faults themselves, and the errors they produce, are described in [`crate::fault`].
//!
//! Invariant: a fault that reports failure without `LostAck` semantics never lets the operation
//! reach the inner store, so "error" means "nothing happened" except for `LostAck`, where the
//! operation took full effect and only the reply was lost, and `Late` on a put or a delete,
//! which takes effect when the test lands it ([`FaultyStore::land_late`]). Stalls and holds
//! delay a call before it reaches the inner store.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::BytesMut;
use futures::stream::{self, BoxStream, StreamExt};
use futures::FutureExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use parking_lot::Mutex;

use crate::fault::{injected_error, Fault, FaultPlan, FaultRule, Op};

/// A snapshot of a [`FaultyStore`]'s counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Calls per operation, indexed like [`OpCounts::calls`]; includes calls that faulted.
    calls: [u64; Op::ALL.len()],
    /// Bytes the inner store accepted through `put_opts`.
    pub put_bytes: u64,
    /// Bytes handed back to callers by gets (after any truncation).
    pub get_bytes: u64,
    /// How many calls a fault fired on (outage refusals included).
    pub faults_injected: u64,
}

impl OpCounts {
    /// Calls of `op` seen so far (faulted ones included).
    pub fn calls(&self, op: Op) -> u64 {
        self.calls[op.index()]
    }
}

#[derive(Debug, Default)]
struct Counters {
    calls: [AtomicU64; Op::ALL.len()],
    put_bytes: AtomicU64,
    get_bytes: AtomicU64,
}

/// A put or delete that [`Fault::Late`] parked: it reaches the store in
/// [`FaultyStore::land_late`].
#[derive(Debug)]
enum LateCall {
    Put(Path, PutPayload, PutOptions),
    Delete(Path),
}

/// Faults, counters and latency, shared with the streams the store hands out.
#[derive(Debug)]
struct Shared {
    plan: Arc<FaultPlan>,
    latency: Mutex<Duration>,
    counters: Counters,
    /// Parked calls, in the order they were made.
    late: Mutex<Vec<LateCall>>,
}

impl Shared {
    /// Counts the call, decides whether a fault fires on it, and waits out its stall or
    /// hold.
    async fn decide(&self, op: Op, path: &str) -> Option<Fault> {
        self.counters.calls[op.index()].fetch_add(1, Ordering::Relaxed);
        let fault = self.plan.decide(op, path);
        self.plan.delay(fault).await;
        fault
    }

    fn latency(&self) -> Duration {
        *self.latency.lock()
    }
}

/// Runs `call` (one non-GET operation) under the fault `shared` picks for `(op, path)` (see
/// [`apply`]).
async fn with_fault<T, Fut>(
    shared: &Shared,
    op: Op,
    path: &str,
    call: impl FnOnce() -> Fut,
) -> object_store::Result<T>
where
    Fut: std::future::Future<Output = object_store::Result<T>>,
{
    apply(shared.decide(op, path).await, op, path, call).await
}

/// Runs `call` under `fault`: an early fault fails without calling it, `LostAck` calls it
/// and fails anyway, no fault (or `FlipBit` and `EmptyList`, which only shape GET bodies and
/// listings, or a stall or hold, already waited out) returns its result.
async fn apply<T, Fut>(
    fault: Option<Fault>,
    op: Op,
    path: &str,
    call: impl FnOnce() -> Fut,
) -> object_store::Result<T>
where
    Fut: std::future::Future<Output = object_store::Result<T>>,
{
    match fault {
        Some(f) if f.fails_early() || matches!(f, Fault::FailAfterBytes(_)) => {
            Err(injected_error(op, path, f))
        }
        Some(Fault::LostAck) => {
            let _ = call().await;
            Err(injected_error(op, path, Fault::LostAck))
        }
        _ => call().await,
    }
}

async fn sleep_for(latency: Duration) {
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
}

/// An object store that forwards to `inner` and injects faults per its rules.
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    shared: Arc<Shared>,
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner)
            .field("plan", &self.shared.plan)
            .field("latency", &self.shared.latency())
            .finish()
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

impl FaultyStore {
    /// Wraps `inner`; probability rules draw from an RNG seeded with 0.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self::with_seed(inner, 0)
    }

    /// Wraps `inner`; probability rules draw from an RNG seeded with `seed`.
    pub fn with_seed(inner: Arc<dyn ObjectStore>, seed: u64) -> Self {
        Self {
            inner,
            shared: Arc::new(Shared {
                plan: Arc::new(FaultPlan::new(seed)),
                latency: Mutex::new(Duration::ZERO),
                counters: Counters::default(),
                late: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The rules, outage switch and held calls this store consults.
    pub fn plan(&self) -> &Arc<FaultPlan> {
        &self.shared.plan
    }

    /// The wrapped store (calls on it bypass faults and counters).
    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    /// Adds a rule after the existing ones.
    pub fn inject(&self, rule: FaultRule) {
        self.shared.plan.inject(rule);
    }

    /// Removes every rule (latency, an outage and held calls stay).
    pub fn clear_faults(&self) {
        self.shared.plan.clear_faults();
    }

    /// Takes the store down (every call fails with [`Fault::Outage`], a retryable
    /// `ConnectionRefused`, without reaching the inner store) or brings it back.
    pub fn set_outage(&self, down: bool) {
        self.shared.plan.set_outage(down);
    }

    /// Takes the store down for `duration` of tokio time from now.
    pub fn outage_for(&self, duration: Duration) {
        self.shared.plan.outage_for(duration);
    }

    /// Waits until at least `n` calls hang in a [`Fault::Hold`].
    pub async fn wait_held(&self, n: usize) {
        self.shared.plan.wait_held(n).await;
    }

    /// Lets every call held now go on.
    pub fn release_held(&self) {
        self.shared.plan.release_held();
    }

    /// Adds `latency` before every call (zero disables).
    pub fn set_latency(&self, latency: Duration) {
        *self.shared.latency.lock() = latency;
    }

    /// Puts and deletes that [`Fault::Late`] parked and that have not landed yet.
    pub fn late_calls(&self) -> usize {
        self.shared.late.lock().len()
    }

    /// Lets every parked put and delete reach the store now, in the order they were made or,
    /// with `reversed`, the other way round; returns how many landed. Their results go
    /// nowhere: the caller gave up on them long ago (a conditional put may now be refused).
    pub async fn land_late(&self, reversed: bool) -> usize {
        let mut calls = std::mem::take(&mut *self.shared.late.lock());
        if reversed {
            calls.reverse();
        }
        let n = calls.len();
        for call in calls {
            let _ = match call {
                LateCall::Put(path, payload, opts) => {
                    self.inner.put_opts(&path, payload, opts).await.map(|_| ())
                }
                LateCall::Delete(path) => self.inner.delete(&path).await,
            };
        }
        n
    }

    /// A snapshot of the counters.
    pub fn counts(&self) -> OpCounts {
        let c = &self.shared.counters;
        OpCounts {
            calls: c.calls.each_ref().map(|n| n.load(Ordering::Relaxed)),
            put_bytes: c.put_bytes.load(Ordering::Relaxed),
            get_bytes: c.get_bytes.load(Ordering::Relaxed),
            faults_injected: self.shared.plan.faults_fired(),
        }
    }

    async fn decide(&self, op: Op, path: &str) -> Option<Fault> {
        self.shared.decide(op, path).await
    }

    async fn delay(&self) {
        sleep_for(self.shared.latency()).await;
    }

    /// Applies a get-side fault (or none) to a successful inner result.
    async fn shape_get(
        &self,
        path: &Path,
        result: GetResult,
        fault: Option<Fault>,
    ) -> object_store::Result<GetResult> {
        let shared = Arc::clone(&self.shared);
        let meta = result.meta.clone();
        let range = result.range.clone();
        let attributes = result.attributes.clone();
        let extensions = result.extensions.clone();
        let stream = match fault {
            Some(Fault::FailAfterBytes(n)) => {
                let full = result.bytes().await?;
                let cut = n.min(full.len());
                shared
                    .counters
                    .get_bytes
                    .fetch_add(cut as u64, Ordering::Relaxed);
                let err = injected_error(Op::Get, path.as_ref(), Fault::FailAfterBytes(n));
                stream::iter(vec![Ok(full.slice(..cut)), Err(err)]).boxed()
            }
            Some(Fault::FlipBit { byte }) => {
                let mut data = BytesMut::from(&result.bytes().await?[..]);
                if !data.is_empty() {
                    let at = byte % data.len();
                    data[at] ^= 1;
                }
                shared
                    .counters
                    .get_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                stream::iter(vec![Ok(data.freeze())]).boxed()
            }
            _ => result
                .into_stream()
                .inspect(move |chunk| {
                    if let Ok(b) = chunk {
                        shared
                            .counters
                            .get_bytes
                            .fetch_add(b.len() as u64, Ordering::Relaxed);
                    }
                })
                .boxed(),
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream),
            meta,
            range,
            attributes,
            extensions,
        })
    }

    fn list_inner(
        &self,
        prefix: Option<&Path>,
        offset: Option<&Path>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let key = prefix.map(|p| p.to_string()).unwrap_or_default();
        let latency = self.shared.latency();
        let shared = Arc::clone(&self.shared);
        let store = Arc::clone(&self.inner);
        let (prefix, offset) = (prefix.cloned(), offset.cloned());
        async move {
            sleep_for(latency).await;
            let fault = shared.decide(Op::List, &key).await;
            // Created only now, after any stall or hold: some stores (`InMemory`) take their
            // snapshot when the stream is created, and a delayed call must list the store as
            // it is when the call goes on.
            let inner = match &offset {
                Some(offset) => store.list_with_offset(prefix.as_ref(), offset),
                None => store.list(prefix.as_ref()),
            };
            match fault {
                Some(f) if f.fails_early() || matches!(f, Fault::FailAfterBytes(_)) => {
                    stream::iter(vec![Err(injected_error(Op::List, &key, f))]).boxed()
                }
                Some(Fault::LostAck) => {
                    // The listing happened; the caller never sees it.
                    let _ = inner.collect::<Vec<_>>().await;
                    stream::iter(vec![Err(injected_error(Op::List, &key, Fault::LostAck))]).boxed()
                }
                Some(Fault::EmptyList) => stream::empty().boxed(),
                _ => inner,
            }
        }
        .flatten_stream()
        .boxed()
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.delay().await;
        let len = payload.content_length() as u64;
        let fault = self.decide(Op::Put, location.as_ref()).await;
        if fault == Some(Fault::Late) {
            let call = LateCall::Put(location.clone(), payload, opts);
            self.shared.late.lock().push(call);
            return Err(injected_error(Op::Put, location.as_ref(), Fault::Late));
        }
        apply(fault, Op::Put, location.as_ref(), || async {
            let result = self.inner.put_opts(location, payload, opts).await?;
            self.shared
                .counters
                .put_bytes
                .fetch_add(len, Ordering::Relaxed);
            Ok(result)
        })
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.delay().await;
        with_fault(&self.shared, Op::PutMultipart, location.as_ref(), || {
            self.inner.put_multipart_opts(location, opts)
        })
        .await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.delay().await;
        let op = if options.head { Op::Head } else { Op::Get };
        let fault = self.decide(op, location.as_ref()).await;
        match fault {
            Some(f) if f.fails_early() => {
                return Err(injected_error(op, location.as_ref(), f));
            }
            Some(Fault::LostAck) => {
                let _ = self.inner.get_opts(location, options).await;
                return Err(injected_error(op, location.as_ref(), Fault::LostAck));
            }
            _ => {}
        }
        let result = self.inner.get_opts(location, options).await?;
        if op == Op::Head {
            return Ok(result);
        }
        self.shape_get(location, result, fault).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let inner = Arc::clone(&self.inner);
        let shared = Arc::clone(&self.shared);
        locations
            .then(move |item| {
                let inner = Arc::clone(&inner);
                let shared = Arc::clone(&shared);
                async move {
                    sleep_for(shared.latency()).await;
                    let path = item?;
                    let fault = shared.decide(Op::Delete, path.as_ref()).await;
                    if fault == Some(Fault::Late) {
                        shared.late.lock().push(LateCall::Delete(path.clone()));
                        return Err(injected_error(Op::Delete, path.as_ref(), Fault::Late));
                    }
                    apply(fault, Op::Delete, path.as_ref(), || inner.delete(&path)).await?;
                    Ok(path)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.list_inner(prefix, None)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.list_inner(prefix, Some(offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.delay().await;
        let key = prefix.map(|p| p.to_string()).unwrap_or_default();
        match self.decide(Op::List, &key).await {
            Some(Fault::EmptyList) => Ok(ListResult {
                common_prefixes: Vec::new(),
                objects: Vec::new(),
                extensions: Default::default(),
            }),
            fault => {
                apply(fault, Op::List, &key, || {
                    self.inner.list_with_delimiter(prefix)
                })
                .await
            }
        }
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.delay().await;
        with_fault(&self.shared, Op::Copy, to.as_ref(), || {
            self.inner.copy_opts(from, to, options)
        })
        .await
    }
}
