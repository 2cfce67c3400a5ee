//! Shared helpers of the volume tests: configs and a per-page oracle.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use glidefs_objstore::{GcOptions, StoreConfig, VolumeStore};

use glidefs_volume::{ManifestOwner, Volume, VolumeConfig, VolumeError};

pub const BS: u32 = 16 * 1024;
pub const BLOCKS: u64 = 16;
pub const SIZE: u64 = BLOCKS * BS as u64;
pub const PAGE: usize = 4096;
pub const PAGES: usize = (SIZE as usize) / PAGE;

pub fn config(dir: &Path) -> VolumeConfig {
    let mut c = VolumeConfig::new("vol-test", dir, SIZE);
    c.block_size = BS;
    c.pack_bytes = 4 * BS as u64; // several packs per flush
    c.readahead_blocks = 2;
    c.store.retry_base_delay = std::time::Duration::from_millis(1);
    c.store.retry_max_delay = std::time::Duration::from_millis(5);
    c
}

/// Distinct incompressible content for `page`, varied by `seed`.
pub fn page_data(seed: u64, page: usize) -> Vec<u8> {
    glidefs_testkit::noise(
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (page as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
        PAGE,
    )
}

/// What the volume must return, per 4 KiB page.
///
/// `cur` is the content after every completed write. `since` holds, per page, the content at
/// the last durability point (completed `flush` or `sync_to_store`) plus every value written
/// after it: after a crash a page may read as any of them (a write not covered by a completed
/// flush may be lost, but never turns into garbage), and nothing else.
#[derive(Debug, Clone)]
pub struct Oracle {
    pub cur: Vec<Vec<u8>>,
    pub since: Vec<Vec<Vec<u8>>>,
}

impl Oracle {
    pub fn new() -> Self {
        Self {
            cur: vec![vec![0; PAGE]; PAGES],
            since: vec![vec![vec![0; PAGE]]; PAGES],
        }
    }

    pub fn write(&mut self, page: usize, data: Vec<u8>) {
        self.since[page].push(data.clone());
        self.cur[page] = data;
    }

    /// A write that failed: it may or may not have landed.
    pub fn maybe_write(&mut self, page: usize, data: Vec<u8>) {
        self.since[page].push(data);
    }

    pub fn durable(&mut self) {
        for p in 0..PAGES {
            self.since[p] = vec![self.cur[p].clone()];
        }
    }

    /// Asserts that `buf`, read at page `first`, equals the content after every completed
    /// write.
    pub fn assert_pages(&self, first: usize, buf: &[u8], ctx: &str) {
        for (k, chunk) in buf.chunks(PAGE).enumerate() {
            let p = first + k;
            assert!(
                chunk == &self.cur[p][..],
                "{ctx}: page {p} differs from the oracle"
            );
        }
    }

    /// Checks a whole-volume image read after a crash and adopts it.
    pub fn check_after_crash(&mut self, image: &[u8], ctx: &str) {
        for p in 0..PAGES {
            let got = &image[p * PAGE..(p + 1) * PAGE];
            assert!(
                self.since[p].iter().any(|c| c == got),
                "{ctx}: page {p} reads neither its durable content nor a later write"
            );
            self.cur[p] = got.to_vec();
        }
        self.durable();
    }
}

pub async fn read_all(v: &Volume) -> Vec<u8> {
    let mut img = vec![0; SIZE as usize];
    v.read(0, &mut img).await.unwrap();
    img
}

/// A fresh in-memory object store.
pub fn mem() -> Arc<dyn object_store::ObjectStore> {
    Arc::new(object_store::memory::InMemory::new())
}

pub async fn open(dir: &Path, store: Arc<dyn object_store::ObjectStore>) -> Arc<Volume> {
    Volume::open(config(dir), store).await.unwrap()
}

/// `BS` as a length.
pub const BSU: usize = BS as usize;

/// Opens a volume on an in-memory store whose pack GETs a test can hold
/// (`glidefs_testkit::GatedStore`), with `readahead` blocks of readahead and, if given, a
/// cache fault hook.
pub async fn gated_volume(
    dir: &Path,
    readahead: u32,
    hook: Option<Arc<dyn glidefs_cache::CrashHook>>,
) -> (Arc<Volume>, Arc<glidefs_testkit::GatedStore>) {
    let gate = Arc::new(glidefs_testkit::GatedStore::new(mem(), "/packs/"));
    let mut cfg = config(dir);
    cfg.readahead_blocks = readahead;
    if let Some(hook) = hook {
        cfg.crash_hook = hook;
    }
    let store: Arc<dyn object_store::ObjectStore> = gate.clone();
    (Volume::open(cfg, store).await.unwrap(), gate)
}

/// Writes `data` at block `block`, flushes it to the store and evicts every local copy:
/// the blocks are then only in the store (NotPresent, remote).
pub async fn write_flush_evict(v: &Volume, block: u64, data: &[u8]) {
    v.write(block * u64::from(BS), data).await.unwrap();
    v.sync_to_store().await.unwrap();
    v.evict_to(0).await.unwrap();
    for b in block..block + (data.len() / BSU) as u64 {
        let info = v.cache().block_info(b);
        assert_eq!(
            info.state,
            glidefs_cache::BlockState::NotPresent,
            "block {b}"
        );
        assert!(info.remote, "block {b} remote");
    }
}

/// A gated volume (no readahead) with blocks 4-5 (noise of `seed`) flushed and evicted, the
/// gate closed and `op` spawned on it: returns once `op`'s pack GET is held at the gate.
pub async fn held_op_on_blocks_4_5<T, Fut>(
    dir: &Path,
    seed: u64,
    op: impl FnOnce(Arc<Volume>) -> Fut,
) -> (
    Arc<Volume>,
    Arc<glidefs_testkit::GatedStore>,
    tokio::task::JoinHandle<T>,
)
where
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let (v, gate) = gated_volume(dir, 0, None).await;
    write_flush_evict(&v, 4, &glidefs_testkit::noise(seed, 2 * BSU)).await;
    gate.close();
    let held = tokio::spawn(op(v.clone()));
    tokio::time::timeout(Duration::from_secs(120), gate.wait_held(1))
        .await
        .expect("the held operation's GET reached the store");
    (v, gate, held)
}

/// Zeroes blocks 4-5 (the whole of their pack), flushes (block 4 is stored as the
/// rotation's first block, block 5 unmapped) and GC deletes the old pack.
pub async fn unmap_5_and_delete_its_pack(v: &Volume, gate: &Arc<glidefs_testkit::GatedStore>) {
    v.write_zeroes(4 * u64::from(BS), 2 * u64::from(BS))
        .await
        .unwrap();
    v.sync_to_store().await.unwrap();
    assert_eq!(v.stats().await.mapped_blocks, 1, "block 5 unmapped");
    assert!(!v.cache().block_info(5).remote, "block 5 not remote");
    let store: Arc<dyn object_store::ObjectStore> = gate.clone();
    let gc = gc_hard(&store).await;
    assert_eq!(gc.packs_deleted.len(), 1, "{gc:?}");
}

/// Where the tests' partial writes land inside their block, and how long they are.
pub const PW_AT: usize = 4096;
pub const PW_LEN: usize = 4096;

/// `base` (one block) with a partial write's bytes `pw` over it at [`PW_AT`].
pub fn overlaid(base: &[u8], pw: &[u8]) -> Vec<u8> {
    let mut b = base.to_vec();
    b[PW_AT..PW_AT + PW_LEN].copy_from_slice(pw);
    b
}

/// Closes the gate and reads blocks 5-7 (never written: zeros, no GET) in sequence, which
/// makes a stream whose readahead window, blocks 8..16, goes out as two runs (packs of 4
/// blocks); returns once both runs' GETs are held. Needs a volume with readahead 8.
pub async fn hold_readahead_of_8_to_16(v: &Volume, gate: &glidefs_testkit::GatedStore) {
    gate.close();
    for b in [5, 6, 7] {
        assert_eq!(read_block(v, b).await, vec![0; BSU]);
    }
    tokio::time::timeout(Duration::from_secs(120), gate.wait_held(2))
        .await
        .expect("both readahead GETs reached the store");
}

/// Waits until `n` cold reads or writes joined a fetch in flight (hang guard only).
pub async fn wait_coalesced(v: &Volume, n: u64, what: &str) {
    tokio::time::timeout(Duration::from_secs(120), async {
        while v.stats().await.fetches_coalesced < n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}"));
}

/// Reads block `block` whole.
pub async fn read_block(v: &Volume, block: u64) -> Vec<u8> {
    let mut buf = vec![0; BSU];
    v.read(block * u64::from(BS), &mut buf).await.unwrap();
    buf
}

/// Owner ids of three hosts (ownership tests).
pub const A: &str = "host-a/0a0a0a0a-0000-4000-8000-00000000000a";
pub const B: &str = "host-b/0b0b0b0b-0000-4000-8000-00000000000b";
pub const C: &str = "host-c/0c0c0c0c-0000-4000-8000-00000000000c";

/// `config(dir)` opened as `owner`, with or without takeover.
pub fn owned(dir: &Path, owner: &str, takeover: bool) -> VolumeConfig {
    let mut c = config(dir);
    c.owner = Some(owner.to_string());
    c.takeover = takeover;
    c
}

pub async fn open_as(
    dir: &Path,
    store: &Arc<dyn object_store::ObjectStore>,
    owner: &str,
    takeover: bool,
) -> Result<Arc<Volume>, VolumeError> {
    Volume::open(owned(dir, owner, takeover), store.clone()).await
}

/// The owner record of `id`, claimed at `claimed_at`, held.
pub fn held(id: &str, claimed_at: u64) -> Option<ManifestOwner> {
    Some(ManifestOwner {
        id: id.into(),
        claimed_at,
        released: false,
    })
}

/// The next manifest PUT lands but its reply is lost, and every retry (a manifest PUT or GET)
/// then fails as transient until `clear_faults`: the publish ends with an unknown outcome.
pub fn lose_next_manifest_reply(faulty: &glidefs_testkit::FaultyStore) {
    use glidefs_testkit::{Fault, FaultRule, Op};
    faulty.inject(
        FaultRule::new(Fault::LostAck)
            .ops(&[Op::Put])
            .path_contains("manifest/")
            .times(1),
    );
    faulty.inject(
        FaultRule::new(Fault::Transient)
            .ops(&[Op::Put, Op::Get])
            .path_contains("manifest"),
    );
}

/// Pages per block.
pub const PPB: usize = BS as usize / PAGE;

/// Writes whole blocks, page by page, with `seed`'s content, and tells the oracle.
pub async fn write_blocks(v: &Volume, oracle: &mut Oracle, seed: u64, blocks: &[usize]) {
    for &b in blocks {
        for p in b * PPB..(b + 1) * PPB {
            let d = page_data(seed, p);
            v.write((p * PAGE) as u64, &d).await.unwrap();
            oracle.write(p, d);
        }
    }
}

/// Opens the store on an empty cache directory and checks every page against the oracle.
pub async fn check_fresh_host(
    store: &Arc<dyn object_store::ObjectStore>,
    oracle: &Oracle,
    ctx: &str,
) {
    let fresh = tempfile::tempdir().unwrap();
    let v = open(fresh.path(), store.clone()).await;
    oracle.assert_pages(0, &read_all(&v).await, ctx);
    v.close().await.unwrap();
}

/// The test volume's store.
pub fn vstore(store: &Arc<dyn object_store::ObjectStore>) -> VolumeStore {
    VolumeStore::new(store.clone(), "vol-test", StoreConfig::default()).unwrap()
}

/// The most aggressive GC options there are: one manifest kept, no grace.
pub fn hard_gc() -> GcOptions {
    GcOptions {
        grace: Duration::ZERO,
        dry_run: false,
        keep_manifests: 1,
        now: Some(SystemTime::now() + Duration::from_secs(3600)),
    }
}

/// GC of the test volume with [`hard_gc`].
pub async fn gc_hard(store: &Arc<dyn object_store::ObjectStore>) -> glidefs_objstore::GcReport {
    vstore(store).gc(hard_gc()).await.unwrap()
}

/// A crash hook that crashes nothing: once armed, it parks the `nth` (from 0) task reaching
/// `point` until `go`. (A parked task blocks its thread: run the test on a multi-thread
/// runtime.)
pub struct PauseAt {
    point: glidefs_volume::cache::CrashPoint,
    nth: u64,
    armed: std::sync::atomic::AtomicBool,
    seen: std::sync::atomic::AtomicU64,
    reached_tx: parking_lot::Mutex<std::sync::mpsc::Sender<()>>,
    reached_rx: parking_lot::Mutex<std::sync::mpsc::Receiver<()>>,
    go_tx: parking_lot::Mutex<std::sync::mpsc::Sender<()>>,
    go_rx: parking_lot::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl std::fmt::Debug for PauseAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PauseAt")
            .field("point", &self.point)
            .field("nth", &self.nth)
            .finish_non_exhaustive()
    }
}

impl PauseAt {
    pub fn new(point: glidefs_volume::cache::CrashPoint, nth: u64) -> Arc<Self> {
        let (reached_tx, reached_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel();
        Arc::new(Self {
            point,
            nth,
            armed: Default::default(),
            seen: Default::default(),
            reached_tx: parking_lot::Mutex::new(reached_tx),
            reached_rx: parking_lot::Mutex::new(reached_rx),
            go_tx: parking_lot::Mutex::new(go_tx),
            go_rx: parking_lot::Mutex::new(go_rx),
        })
    }

    /// Counts from now on.
    pub fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits until a task is parked; fails if `task` ends first.
    pub async fn parked<T: std::fmt::Debug>(&self, task: &mut tokio::task::JoinHandle<T>) {
        while self.reached_rx.lock().try_recv().is_err() {
            assert!(
                !task.is_finished(),
                "ended before the pause: {:?}",
                task.await
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Lets the parked task go on.
    pub fn go(&self) {
        self.go_tx.lock().send(()).unwrap();
    }
}

impl glidefs_volume::cache::CrashHook for PauseAt {
    fn should_crash(&self, point: glidefs_volume::cache::CrashPoint) -> bool {
        use std::sync::atomic::Ordering;
        if point == self.point
            && self.armed.load(Ordering::SeqCst)
            && self.seen.fetch_add(1, Ordering::SeqCst) == self.nth
        {
            let _ = self.reached_tx.lock().send(());
            let _ = self.go_rx.lock().recv();
        }
        false
    }
}

/// `config(dir)` at `size` bytes (resize tests).
pub fn config_at(dir: &Path, size: u64) -> VolumeConfig {
    let mut c = config(dir);
    c.size = size;
    c
}

/// Opens `config_at(dir, size)` on `store`.
pub async fn open_at(
    dir: &Path,
    store: &Arc<dyn object_store::ObjectStore>,
    size: u64,
) -> Result<Arc<Volume>, VolumeError> {
    Volume::open(config_at(dir, size), store.clone()).await
}

/// Reads `len` bytes at `off` (the buffer starts as 0xAA, so a short fill shows).
pub async fn read_range(v: &Volume, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xAA; len];
    v.read(off, &mut buf).await.unwrap();
    buf
}

/// Writes one block's worth of distinct data at `off` and returns it (`noise` ignores its
/// seed's low bit: the seeds are spread so that consecutive ones differ).
pub async fn put_block(v: &Volume, off: u64, seed: u64) -> Vec<u8> {
    let data = glidefs_testkit::noise(2 * seed + 1, BS as usize);
    v.write(off, &data).await.unwrap();
    data
}

/// Resize tests: the size a volume of [`SIZE`] grows to, and where they write: below the old
/// end, straddling it, at the new end.
pub const NEW: u64 = 3 * SIZE;
pub const LOW: u64 = BS as u64;
pub const ACROSS: u64 = SIZE - BS as u64 / 2;
pub const HIGH: u64 = NEW - BS as u64;

/// Where `off..off+len` lies against the old end [`SIZE`], for messages.
fn against_old_end(off: u64, len: usize) -> &'static str {
    match (off < SIZE, off + len as u64 <= SIZE) {
        (true, true) => "below the old end",
        (true, false) => "across the old end",
        _ => "past the old end",
    }
}

/// A grown volume reads `w` (offset, data) back, and zeros where nothing was written past
/// the old end.
pub async fn check_grown(v: &Volume, w: &[(u64, Vec<u8>)], ctx: &str) {
    for (off, d) in w {
        assert_eq!(
            &read_range(v, *off, d.len()).await,
            d,
            "{ctx}: offset {off}, {}",
            against_old_end(*off, d.len())
        );
    }
    assert_eq!(
        read_range(v, SIZE + 2 * BS as u64, 4096).await,
        vec![0; 4096],
        "{ctx}: never written past the old end"
    );
}

/// [`check_grown`] on a fresh host: an empty cache at size [`NEW`] over `store`.
pub async fn cold_check_grown(
    store: &Arc<dyn object_store::ObjectStore>,
    w: &[(u64, Vec<u8>)],
    ctx: &str,
) {
    let fresh = tempfile::tempdir().unwrap();
    let v = open_at(fresh.path(), store, NEW).await.unwrap();
    check_grown(&v, w, ctx).await;
    v.close().await.unwrap();
}

/// Compaction options that copy every pack whose live share is below 0.6.
pub const HALF: glidefs_volume::CompactOptions = glidefs_volume::CompactOptions {
    threshold: 0.6,
    max_bytes: 256 << 20,
};

/// 16 blocks in 4 packs of 4; then 2 of every 4 overwritten and flushed: the old packs are
/// half live. A pass at `HALF` copies the 8 live blocks (0, 1, 4, 5 | 8, 9, 12, 13) into
/// two new packs, one publish each.
pub async fn half_live(v: &Volume, oracle: &mut Oracle) {
    let all: Vec<usize> = (0..BLOCKS as usize).collect();
    write_blocks(v, oracle, 1, &all).await;
    v.sync_to_store().await.unwrap();
    let dead: Vec<usize> = all.iter().copied().filter(|b| b % 4 >= 2).collect();
    write_blocks(v, oracle, 2, &dead).await;
    v.sync_to_store().await.unwrap();
}
