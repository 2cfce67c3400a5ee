//! The clean-close marker (`store.closed`, see `base`): an owner's `Volume::close`
//! records "stopped on base G, nothing publishing", and the next open on that cache skips its
//! claim when the store is still at G. These tests drive the interleavings where skipping the
//! claim could matter: a publish still on the wire when the handle closes (its sync future
//! dropped, or its reply lost), a close waiting for a publish in flight, a takeover while the
//! close waits, a reopen whose first attempt failed on the store, a second open of the same
//! cache, and a takeover claim from another host that lands late (after the open skipped its
//! claim). Each asserts what must hold: nothing acknowledged to the store is lost, no writer
//! publishes on top of a generation it did not know, a fenced cache stays fenced.

mod common;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::stream::BoxStream;
use glidefs_objstore::{Manifest, StoreConfig, VolumeStore};
use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
use glidefs_volume::{VolumeError, VolumeErrorKind};
use object_store::path::Path as StorePath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};

/// The latest manifest in `store` (read directly, as a third party would).
async fn latest(store: &Arc<dyn ObjectStore>) -> Manifest {
    VolumeStore::new(store.clone(), "vol-test", StoreConfig::default())
        .unwrap()
        .load_manifest()
        .await
        .unwrap()
        .expect("a manifest")
}

fn marker(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("store.closed")).ok()
}

fn base_file(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("store.base")).unwrap()
}

// ---------------------------------------------------------------------------------------
// WireStore: manifest PUTs that stay "on the wire" after their caller gave up.
// ---------------------------------------------------------------------------------------

/// How a parked PUT looks to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// The caller waits for the reply (dropping its future leaves the request on the wire).
    Hang,
    /// The caller gets a client-side timeout at once (retryable); the request still reaches
    /// the store when delivered.
    TimeOut,
}

/// Forwards to `inner`; while armed, a PUT whose path contains `pattern` is parked in a
/// detached task that performs it on the inner store only when [`WireStore::deliver`] is
/// called, whatever became of the caller (a process that died or gave up with the request
/// sent: the store still processes it).
struct WireStore {
    inner: Arc<dyn ObjectStore>,
    pattern: String,
    armed: Mutex<Option<Wire>>,
    gate: watch::Sender<bool>,
    parked: watch::Sender<usize>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<bool>>>,
}

impl std::fmt::Debug for WireStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WireStore({})", self.inner)
    }
}

impl std::fmt::Display for WireStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WireStore({})", self.inner)
    }
}

impl WireStore {
    fn new(inner: Arc<dyn ObjectStore>, pattern: &str) -> Self {
        Self {
            inner,
            pattern: pattern.to_string(),
            armed: Mutex::new(None),
            gate: watch::Sender::new(false),
            parked: watch::Sender::new(0),
            tasks: Mutex::new(Vec::new()),
        }
    }

    fn arm(&self, mode: Wire) {
        *self.armed.lock() = Some(mode);
    }

    fn disarm(&self) {
        *self.armed.lock() = None;
    }

    async fn wait_parked(&self, n: usize) {
        let mut rx = self.parked.subscribe();
        let _ = rx.wait_for(|p| *p >= n).await;
    }

    /// Lets every parked request reach the store; returns how many of them created their
    /// object (the others found it there already).
    async fn deliver(&self) -> usize {
        self.gate.send_replace(true);
        let tasks = std::mem::take(&mut *self.tasks.lock());
        let mut landed = 0;
        for t in tasks {
            if t.await.unwrap() {
                landed += 1;
            }
        }
        landed
    }

    fn put_parked(
        &self,
        mode: Wire,
        location: &StorePath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> oneshot::Receiver<object_store::Result<PutResult>> {
        let (tx, rx) = oneshot::channel();
        let (inner, location) = (self.inner.clone(), location.clone());
        let mut gate = self.gate.subscribe();
        let task = tokio::spawn(async move {
            let _ = gate.wait_for(|open| *open).await;
            let r = inner.put_opts(&location, payload, opts).await;
            let landed = r.is_ok();
            if mode == Wire::Hang {
                let _ = tx.send(r);
            }
            landed
        });
        self.tasks.lock().push(task);
        self.parked.send_modify(|p| *p += 1);
        rx
    }
}

type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

fn timed_out() -> object_store::Error {
    object_store::Error::Generic {
        store: "WireStore",
        source: Box::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "client-side timeout; the request is still on the wire",
        )),
    }
}

impl ObjectStore for WireStore {
    fn put_opts<'life0, 'life1, 'async_trait>(
        &'life0 self,
        location: &'life1 StorePath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Fut<'async_trait, object_store::Result<PutResult>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            let mode = *self.armed.lock();
            match mode {
                Some(mode) if location.as_ref().contains(&self.pattern) => {
                    let rx = self.put_parked(mode, location, payload, opts);
                    match mode {
                        Wire::Hang => rx.await.unwrap_or_else(|_| Err(timed_out())),
                        Wire::TimeOut => Err(timed_out()),
                    }
                }
                _ => self.inner.put_opts(location, payload, opts).await,
            }
        })
    }

    fn put_multipart_opts<'life0, 'life1, 'async_trait>(
        &'life0 self,
        location: &'life1 StorePath,
        opts: PutMultipartOptions,
    ) -> Fut<'async_trait, object_store::Result<Box<dyn MultipartUpload>>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move { self.inner.put_multipart_opts(location, opts).await })
    }

    fn get_opts<'life0, 'life1, 'async_trait>(
        &'life0 self,
        location: &'life1 StorePath,
        options: GetOptions,
    ) -> Fut<'async_trait, object_store::Result<GetResult>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move { self.inner.get_opts(location, options).await })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<StorePath>>,
    ) -> BoxStream<'static, object_store::Result<StorePath>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&StorePath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&StorePath>,
        offset: &StorePath,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    fn list_with_delimiter<'life0, 'life1, 'async_trait>(
        &'life0 self,
        prefix: Option<&'life1 StorePath>,
    ) -> Fut<'async_trait, object_store::Result<ListResult>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move { self.inner.list_with_delimiter(prefix).await })
    }

    fn copy_opts<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        from: &'life1 StorePath,
        to: &'life2 StorePath,
        options: CopyOptions,
    ) -> Fut<'async_trait, object_store::Result<()>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move { self.inner.copy_opts(from, to, options).await })
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// A sync whose manifest PUT is on the wire when its future is dropped (an API flush whose
/// client went away, a task aborted): the sync lock is free, so `close` runs and writes its
/// marker, naming the last confirmed generation G. The base file still says `publishing G+1`,
/// so the next open must claim (the marker alone would let it skip): its claim takes G+1,
/// and the old request, landing afterwards, finds G+1 taken and changes nothing. Every
/// locally flushed write is published by the reopened handle, which is not fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_left_on_the_wire_by_a_dropped_sync_makes_the_next_open_claim() {
    let mem = mem();
    let wire = Arc::new(WireStore::new(mem.clone(), "manifest/"));
    let store: Arc<dyn ObjectStore> = wire.clone();
    let dir = tempfile::tempdir().unwrap();
    let bs = BS as usize;
    let (x, y, z) = (vec![0xA1; bs], vec![0xB2; bs], vec![0xC3; bs]);

    let a = open_as(dir.path(), &store, A, false).await.unwrap();
    a.write(0, &x).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 2);
    a.write(BS as u64, &y).await.unwrap();
    a.flush().await.unwrap();

    wire.arm(Wire::Hang);
    let task = {
        let a = a.clone();
        tokio::spawn(async move { a.sync_to_store().await })
    };
    wire.wait_parked(1).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    wire.disarm();

    a.close().await.unwrap();
    assert_eq!(marker(dir.path()).as_deref(), Some("closed 2\n"));
    assert!(
        base_file(dir.path()).contains("publishing 3 "),
        "{}",
        base_file(dir.path())
    );
    drop(a);

    let a = open_as(dir.path(), &store, A, false).await.unwrap();
    assert!(a.fenced().is_none(), "{:?}", a.fenced());
    assert_eq!(
        a.manifest_generation(),
        3,
        "a publish may still land on generation 3: the open claims it"
    );
    assert_eq!(a.owner(), held(A, 3));
    assert_eq!(wire.deliver().await, 0, "the old request finds 3 taken");
    assert_eq!(latest(&mem).await.owner, held(A, 3));

    a.write(2 * BS as u64, &z).await.unwrap();
    // The pending rotation (y) at 4, then the new one (z) at 5.
    assert_eq!(a.sync_to_store().await.unwrap().generation, 5);
    assert!(a.fenced().is_none());
    a.evict_to(0).await.unwrap();
    let img = read_all(&a).await;
    assert_eq!(&img[..bs], &x[..]);
    assert_eq!(&img[bs..2 * bs], &y[..]);
    assert_eq!(&img[2 * bs..3 * bs], &z[..]);
}

/// Same, with the sync returning an error (every attempt timed out on the client, all of
/// them still on the wire) and the requests landing before the reopen: the store holds the
/// old handle's generation 3, the marker names 2, so the open recognises 3 as its own
/// (`publishing 3 <pack>`) and claims 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_that_lands_after_its_sync_failed_is_adopted_and_claimed_over() {
    let mem = mem();
    let wire = Arc::new(WireStore::new(mem.clone(), "manifest/"));
    let store: Arc<dyn ObjectStore> = wire.clone();
    let dir = tempfile::tempdir().unwrap();
    let bs = BS as usize;
    let (x, y) = (vec![0xA1; bs], vec![0xB2; bs]);

    let a = open_as(dir.path(), &store, A, false).await.unwrap();
    a.write(0, &x).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 2);
    a.write(BS as u64, &y).await.unwrap();
    wire.arm(Wire::TimeOut);
    a.sync_to_store().await.unwrap_err();
    wire.disarm();
    a.close().await.unwrap();
    assert_eq!(marker(dir.path()).as_deref(), Some("closed 2\n"));
    drop(a);
    assert_eq!(wire.deliver().await, 1, "one of the attempts lands");

    let a = open_as(dir.path(), &store, A, false).await.unwrap();
    assert!(a.fenced().is_none(), "{:?}", a.fenced());
    assert_eq!(
        a.manifest_generation(),
        4,
        "3 adopted as ours, then a claim"
    );
    assert_eq!(a.sync_to_store().await.unwrap().generation, 5);
    a.evict_to(0).await.unwrap();
    let img = read_all(&a).await;
    assert_eq!(&img[..bs], &x[..]);
    assert_eq!(&img[bs..2 * bs], &y[..]);
}

/// A close that arrives while a publish is in flight waits for it (sync lock), then names
/// the generation it confirmed: the next open skips its claim on that generation, and the
/// data is all there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_waits_for_a_publish_in_flight_then_names_its_generation() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let bs = BS as usize;
    let (x, y) = (vec![0xA1; bs], vec![0xB2; bs]);

    let a = open_as(dir.path(), &store, A, false).await.unwrap();
    a.write(0, &x).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 2);
    a.write(BS as u64, &y).await.unwrap();
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Put])
            .path_contains("manifest/")
            .times(1),
    );
    let sync = {
        let a = a.clone();
        tokio::spawn(async move { a.sync_to_store().await })
    };
    faulty.wait_held(1).await;
    let close = {
        let a = a.clone();
        tokio::spawn(async move { a.close().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!close.is_finished(), "close must wait for the publish");
    assert!(marker(dir.path()).is_none());
    faulty.release_held();
    assert_eq!(sync.await.unwrap().unwrap().generation, 3);
    close.await.unwrap().unwrap();
    assert_eq!(marker(dir.path()).as_deref(), Some("closed 3\n"));
    assert!(matches!(
        a.sync_to_store().await.unwrap_err(),
        VolumeError::Closed { .. }
    ));
    drop(a);

    let a = open_as(dir.path(), &store, A, false).await.unwrap();
    assert_eq!(a.manifest_generation(), 3, "no claim after a clean close");
    assert_eq!(a.owner(), held(A, 1));
    a.evict_to(0).await.unwrap();
    let img = read_all(&a).await;
    assert_eq!(&img[..bs], &x[..]);
    assert_eq!(&img[bs..2 * bs], &y[..]);
    assert_eq!(
        a.sync_to_store().await.unwrap().generation,
        3,
        "nothing new"
    );
}

/// A takeover lands while `close` waits for a publish in flight: the publish is fenced, and
/// whatever close then writes, the marker can never match again (the store moved past it):
/// after the new owner released, the old cache reopens fenced (it holds unpublished data),
/// and the new owner's data is intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_while_close_waits_leaves_the_old_cache_fenced() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let (da, db, dc) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let bs = BS as usize;
    let (x, y, w) = (vec![0xA1; bs], vec![0xB2; bs], vec![0xD4; bs]);

    let a = open_as(da.path(), &store, A, false).await.unwrap();
    a.write(0, &x).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 2);
    a.write(BS as u64, &y).await.unwrap();
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Put])
            .path_contains("manifest/")
            .times(1),
    );
    let sync = {
        let a = a.clone();
        tokio::spawn(async move { a.sync_to_store().await })
    };
    faulty.wait_held(1).await;
    let close = {
        let a = a.clone();
        tokio::spawn(async move { a.close().await })
    };
    let b = open_as(db.path(), &store, B, true).await.unwrap();
    assert_eq!(b.manifest_generation(), 3);
    faulty.release_held();
    let err = sync.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), VolumeErrorKind::Fenced, "{err}");
    let closed = close.await.unwrap();
    println!(
        "close after the fence: {closed:?}, marker {:?}",
        marker(da.path())
    );
    drop(a);

    b.write(0, &w).await.unwrap();
    assert_eq!(b.sync_to_store().await.unwrap().generation, 4);
    assert_eq!(b.release().await.unwrap(), 5);
    b.close().await.unwrap();
    drop(b);

    let a = open_as(da.path(), &store, A, false).await.unwrap();
    let fence = a
        .fenced()
        .expect("the old cache holds unpublished data: fenced");
    assert_eq!(fence.newer, Some(5), "{fence}");
    assert_eq!(
        a.manifest_generation(),
        5,
        "a fenced cache publishes nothing"
    );
    drop(a);
    let c = open_as(dc.path(), &store, C, false).await.unwrap();
    let img = read_all(&c).await;
    assert_eq!(&img[..bs], &w[..]);
    assert!(img[bs..].iter().all(|&v| v == 0), "nothing of A's y");
}

/// A reopen whose first attempt failed before it reached the cache (the store did not
/// answer: `recovering` in the daemon) keeps the marker: the attempt published nothing, so
/// the retry still skips its claim. An attempt that did reach the cache took the marker, so
/// the one after it claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopen_after_a_failed_attempt_skips_the_claim_only_if_nothing_was_sent() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let bs = BS as usize;
    let x = vec![0xA1; bs];

    let a = open_as(dir.path(), &store, A, false).await.unwrap();
    a.write(0, &x).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 2);
    a.close().await.unwrap();
    drop(a);

    faulty.set_outage(true);
    open_as(dir.path(), &store, A, false).await.unwrap_err();
    faulty.set_outage(false);
    assert_eq!(marker(dir.path()).as_deref(), Some("closed 2\n"));
    let a = open_as(dir.path(), &store, A, false).await.unwrap();
    assert_eq!(a.manifest_generation(), 2, "nothing was sent: no claim");
    assert_eq!(marker(dir.path()), None);
    a.close().await.unwrap();
    drop(a);

    // A store answering GETs and LISTs but failing PUTs: the attempt takes the marker, and
    // being a clean close on the latest generation it does not need the PUT at all.
    faulty.inject(FaultRule::new(Fault::Transient).ops(&[Op::Put]));
    let a = open_as(dir.path(), &store, A, false).await.unwrap();
    assert_eq!(a.manifest_generation(), 2);
    faulty.clear_faults();
    a.kill().await; // no close: no marker
    drop(a);
    let a = open_as(dir.path(), &store, A, false).await.unwrap();
    assert_eq!(a.manifest_generation(), 3, "after a crash the open claims");
    assert_eq!(&read_all(&a).await[..bs], &x[..]);
}

/// A second open of the same cache while the first (which skipped its claim) is still open:
/// the marker is gone, so the second claims; the first is fenced at its next publish and
/// nothing interleaves in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_open_of_the_cache_claims_and_fences_the_first() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let bs = BS as usize;
    let (x, y) = (vec![0xA1; bs], vec![0xB2; bs]);

    let a = open_as(dir.path(), &store, A, false).await.unwrap();
    a.write(0, &x).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 2);
    a.close().await.unwrap();
    drop(a);

    let first = open_as(dir.path(), &store, A, false).await.unwrap();
    assert_eq!(first.manifest_generation(), 2);
    let second = open_as(dir.path(), &store, A, false).await.unwrap();
    assert_eq!(second.manifest_generation(), 3, "no marker left: a claim");
    first.write(BS as u64, &y).await.unwrap();
    let err = first.sync_to_store().await.unwrap_err();
    assert_eq!(err.kind(), VolumeErrorKind::Fenced, "{err}");
    assert_eq!(latest(&store).await.generation, 3);
}

/// Another host's takeover claim that is still on the wire when this owner's hand-off open
/// skips its claim lands afterwards and fences the reopened writer. Before the change the
/// open's claim took that generation first and the late takeover claim found it taken. No
/// split brain either way (conditional publish): the reopened writer's first publish is
/// refused, its unpublished writes stay in its cache (a takeover's documented loss), and the
/// store says B although B's open reported failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_takeover_claim_fences_a_writer_whose_open_skipped_its_claim() {
    let mem = mem();
    let wire = Arc::new(WireStore::new(mem.clone(), "manifest/"));
    let store: Arc<dyn ObjectStore> = wire.clone();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let bs = BS as usize;
    let (x, z) = (vec![0xA1; bs], vec![0xC3; bs]);

    let a = open_as(da.path(), &store, A, false).await.unwrap();
    a.write(0, &x).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 2);
    a.close().await.unwrap();
    drop(a);

    // B's takeover: every claim PUT times out on B's side, all are still on the wire.
    wire.arm(Wire::TimeOut);
    let err = open_as(db.path(), &store, B, true).await.unwrap_err();
    println!("B's takeover failed as far as B knows: {err}");
    wire.disarm();

    // The hand-off open of A skips its claim; A accepts and locally flushes a write.
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    assert_eq!(a.manifest_generation(), 2, "no claim");
    a.write(BS as u64, &z).await.unwrap();
    a.flush().await.unwrap();

    assert_eq!(wire.deliver().await, 1, "B's claim lands at 3");
    assert_eq!(latest(&mem).await.owner, held(B, 3));
    let err = a.sync_to_store().await.unwrap_err();
    assert_eq!(err.kind(), VolumeErrorKind::Fenced, "{err}");
    assert_eq!(latest(&mem).await.generation, 3, "nothing published over B");
}
