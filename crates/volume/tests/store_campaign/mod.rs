//! The world of the store fault campaign (`volume_store_campaign.rs`): the volume's shape,
//! the phases, target calls and faults of a cell, the per-page oracle, the store of a cell
//! (`Env`: the `FaultyStore` over `InMemory`, or the S3 server with faults at the HTTP
//! level), and the I/O helpers. The cells themselves are in `cells`.

pub mod cells;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use glidefs_objstore::{GcOptions, GcReport, StoreConfig, VolumeStore};
use glidefs_testkit::{
    generation_of, pattern, verify_pattern, Fault, FaultPlan, FaultRule, FaultyStore, Op, S3Server,
};
use glidefs_volume::{Volume, VolumeConfig};
use object_store::ObjectStore;

pub const BS: u32 = 16 * 1024;
pub const BLOCKS: u64 = 16;
pub const SIZE: u64 = BLOCKS * BS as u64;
pub const PAGE: usize = 4096;
pub const PAGES: usize = SIZE as usize / PAGE;
pub const PAGES_PER_BLOCK: usize = BS as usize / PAGE;
pub const NAME: &str = "vol-campaign";
pub const OWNER: &str = "host-a/1";
/// Blocks the `evict` phase keeps locally.
pub const EVICT_BUDGET: u64 = 4 * BS as u64;
/// A cell that has not ended after this much (virtual) time hangs.
pub const CELL_LIMIT: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Open,
    Flush,
    ColdRead,
    Evict,
    Gc,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Open => "open",
            Phase::Flush => "flush",
            Phase::ColdRead => "cold_read",
            Phase::Evict => "evict",
            Phase::Gc => "gc",
        }
    }
}

/// The store call a fault rule hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    PutPack,
    PutManifest,
    Get,
    List,
    Delete,
    Head,
}

pub const TARGETS: [Target; 6] = [
    Target::PutPack,
    Target::PutManifest,
    Target::Get,
    Target::List,
    Target::Delete,
    Target::Head,
];

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::PutPack => "PUT pack",
            Target::PutManifest => "PUT manifest",
            Target::Get => "GET",
            Target::List => "LIST",
            Target::Delete => "DELETE",
            Target::Head => "HEAD",
        }
    }

    pub fn rule(self, fault: Fault) -> FaultRule {
        let rule = FaultRule::new(fault);
        match self {
            Target::PutPack => rule.ops(&[Op::Put]).path_contains("/packs/"),
            Target::PutManifest => rule.ops(&[Op::Put]).path_contains("/manifest/"),
            Target::Get => rule.ops(&[Op::Get]),
            Target::List => rule.ops(&[Op::List]),
            Target::Delete => rule.ops(&[Op::Delete]),
            Target::Head => rule.ops(&[Op::Head]),
        }
    }
}

/// A fault of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Lost,
    LostThenDown,
    /// `LostThenDown`, then the process dies (`kill`) before the store is back; the
    /// invariant starts by reopening the cache directory.
    LostThenRestart,
    Transient,
    TransientAll,
    Timeout,
    Stall,
    Permanent,
    Hold,
    /// The whole store is down for this long from the phase's start.
    Outage(Duration),
    /// The store refuses every call for good until lifted (expired credentials).
    DeniedAll,
    /// No fault: counts which calls the phase makes (a zero stall marks pack PUTs).
    Probe,
}

pub const KINDS: [Kind; 9] = [
    Kind::Lost,
    Kind::LostThenDown,
    Kind::LostThenRestart,
    Kind::Transient,
    Kind::TransientAll,
    Kind::Timeout,
    Kind::Stall,
    Kind::Permanent,
    Kind::Hold,
];

pub const OUTAGES: [Kind; 4] = [
    Kind::Outage(Duration::from_secs(1)),
    Kind::Outage(Duration::from_secs(30)),
    Kind::Outage(Duration::from_secs(600)),
    Kind::DeniedAll,
];

impl Kind {
    pub fn name(self) -> String {
        match self {
            Kind::Lost => "lost".into(),
            Kind::LostThenDown => "lost+down".into(),
            Kind::LostThenRestart => "lost+kill".into(),
            Kind::Transient => "transient3".into(),
            Kind::TransientAll => "transient*".into(),
            Kind::Timeout => "timeout".into(),
            Kind::Stall => "stall".into(),
            Kind::Permanent => "permanent".into(),
            Kind::Hold => "hold".into(),
            Kind::Outage(d) => format!("down {}s", d.as_secs()),
            Kind::DeniedAll => "denied*".into(),
            Kind::Probe => "no fault".into(),
        }
    }

    /// Arms the fault on `plan` for `target` at the phase's start.
    pub fn arm(self, plan: &FaultPlan, target: Option<Target>) {
        let rule = |f: Fault| target.expect("a rule fault has a target").rule(f);
        match self {
            Kind::Lost => plan.inject(rule(Fault::LostAck).times(1)),
            Kind::LostThenDown | Kind::LostThenRestart => {
                plan.inject(rule(Fault::LostAck).times(1).then_outage())
            }
            Kind::Transient => plan.inject(rule(Fault::Transient).times(3)),
            Kind::TransientAll => plan.inject(rule(Fault::Transient)),
            Kind::Timeout => plan.inject(rule(Fault::Timeout(Duration::from_secs(60))).times(2)),
            Kind::Stall => plan.inject(rule(Fault::Stall(Duration::from_secs(600))).times(1)),
            Kind::Permanent => plan.inject(rule(Fault::Permanent)),
            Kind::Hold => plan.inject(rule(Fault::Hold).times(1)),
            Kind::Outage(d) => plan.outage_for(d),
            Kind::DeniedAll => plan.inject(FaultRule::new(Fault::Permanent)),
            Kind::Probe => plan.inject(Target::PutPack.rule(Fault::Stall(Duration::ZERO))),
        }
    }
}

/// Per page: the generations it may hold (0: never written, zeros). An acknowledged write
/// leaves one; a failed write adds its own (it may or may not have landed); a check adopts
/// what it read.
#[derive(Debug, Clone)]
pub struct Oracle(pub Vec<BTreeSet<u64>>);

impl Oracle {
    pub fn new() -> Self {
        Self(vec![BTreeSet::from([0]); PAGES])
    }

    pub fn set(&mut self, page: usize, generation: u64) {
        self.0[page] = BTreeSet::from([generation]);
    }

    pub fn maybe(&mut self, page: usize, generation: u64) {
        self.0[page].insert(generation);
    }

    /// Checks `buf` read at page `first`, then adopts what it holds.
    pub fn check(&mut self, first: usize, buf: &[u8], ctx: &str) -> Result<(), String> {
        for (k, chunk) in buf.chunks(PAGE).enumerate() {
            let page = first + k;
            let offset = (page * PAGE) as u64;
            let found = if chunk.iter().all(|&b| b == 0) {
                Some(0)
            } else {
                generation_of(offset, chunk).filter(|&g| verify_pattern(offset, g, chunk).is_ok())
            };
            match found {
                Some(g) if self.0[page].contains(&g) => self.set(page, g),
                _ => {
                    let detail = match self.0[page].iter().next_back() {
                        Some(&g) if g > 0 => verify_pattern(offset, g, chunk)
                            .err()
                            .map_or_else(|| "?".into(), |m| m.to_string()),
                        _ => "expected zeros".into(),
                    };
                    return Err(format!(
                        "{ctx}: page {page} (block {}) holds {found:?}, acknowledged {:?} ({detail})",
                        page / PAGES_PER_BLOCK,
                        self.0[page]
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The store of one cell: the fault plan, the store the volume uses, and one that bypasses
/// the faults (the HTTP cells have none: faults are lifted before it is used).
pub struct Env {
    pub plan: Arc<FaultPlan>,
    pub store: Arc<dyn ObjectStore>,
    pub raw: Arc<dyn ObjectStore>,
    pub http: bool,
    pub _server: Option<S3Server>,
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn memory() -> Self {
        Self::memory_seeded(0)
    }

    /// Probability rules draw from an RNG seeded with `seed`.
    pub fn memory_seeded(seed: u64) -> Self {
        let inner: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let faulty = FaultyStore::with_seed(inner.clone(), seed);
        Self {
            plan: faulty.plan().clone(),
            store: Arc::new(faulty),
            raw: inner,
            http: false,
            _server: None,
            dir: cache_dir(),
        }
    }

    pub async fn http() -> Self {
        let plan = Arc::new(FaultPlan::new(7));
        let server = S3Server::start_with_faults("glidefs-campaign", Some(plan.clone()))
            .await
            .expect("S3 server starts");
        let retry = object_store::RetryConfig {
            max_retries: 2,
            retry_timeout: Duration::from_secs(10),
            backoff: object_store::BackoffConfig {
                init_backoff: Duration::from_millis(1),
                max_backoff: Duration::from_millis(5),
                base: 2.0,
            },
        };
        let store: Arc<dyn ObjectStore> =
            Arc::new(server.s3_builder().with_retry(retry).build().unwrap());
        Self {
            plan,
            raw: store.clone(),
            store,
            http: true,
            _server: Some(server),
            dir: cache_dir(),
        }
    }

    pub fn config(&self, dir: &Path, owner: Option<&str>, budget: u64) -> VolumeConfig {
        let mut c = VolumeConfig::new(NAME, dir, SIZE);
        c.block_size = BS;
        c.pack_bytes = 4 * BS as u64;
        c.readahead_blocks = 4;
        c.disk_budget = budget;
        c.owner = owner.map(str::to_string);
        // Every publish HEADs the packs it uploaded (as after a long upload-to-publish time),
        // so HEAD is one of the calls each flush makes and the faults reach it.
        c.store.pack_recheck_after = Duration::ZERO;
        if self.http {
            // Real time: keep the retries short.
            c.store = StoreConfig {
                max_retries: 3,
                retry_base_delay: Duration::from_millis(1),
                retry_max_delay: Duration::from_millis(5),
                ..c.store
            };
        }
        c
    }

    pub async fn open(&self, budget: u64) -> Result<Arc<Volume>, String> {
        Volume::open(
            self.config(self.dir.path(), Some(OWNER), budget),
            self.store.clone(),
        )
        .await
        .map_err(|e| e.to_string())
    }

    pub fn lift(&self) {
        self.plan.clear_faults();
        self.plan.set_outage(false);
        self.plan.release_held();
    }
}

/// A cache directory: on tmpfs where there is one (this campaign is about the store, and a
/// cell's many fsyncs on a disk would make it slow), else in the temporary directory.
pub fn cache_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

pub async fn write_block(
    v: &Volume,
    oracle: &mut Oracle,
    block: u64,
    generation: u64,
) -> Result<(), String> {
    let offset = block * BS as u64;
    let r = v
        .write(offset, &pattern(offset, generation, BS as usize))
        .await;
    let first = block as usize * PAGES_PER_BLOCK;
    for page in first..first + PAGES_PER_BLOCK {
        match r {
            Ok(()) => oracle.set(page, generation),
            Err(_) => oracle.maybe(page, generation),
        }
    }
    r.map_err(|e| format!("write of block {block}: {e}"))
}

pub async fn write_page(
    v: &Volume,
    oracle: &mut Oracle,
    page: usize,
    generation: u64,
) -> Result<(), String> {
    let offset = (page * PAGE) as u64;
    let r = v.write(offset, &pattern(offset, generation, PAGE)).await;
    match r {
        Ok(()) => oracle.set(page, generation),
        Err(_) => oracle.maybe(page, generation),
    }
    r.map_err(|e| format!("write of page {page}: {e}"))
}

pub async fn read_range(v: &Volume, first_page: usize, pages: usize) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; pages * PAGE];
    v.read((first_page * PAGE) as u64, &mut buf)
        .await
        .map_err(|e| format!("read of pages {first_page}+{pages}: {e}"))?;
    Ok(buf)
}

pub async fn check_all(v: &Volume, oracle: &mut Oracle, ctx: &str) -> Result<(), String> {
    let buf = read_range(v, 0, PAGES)
        .await
        .map_err(|e| format!("{ctx}: {e}"))?;
    oracle.check(0, &buf, ctx)
}

/// A `glidefs gc` pass over `store`: keep one manifest, and everything is older than the
/// grace (the pass runs two hours "later").
pub async fn gc_pass(store: Arc<dyn ObjectStore>) -> Result<GcReport, String> {
    let vs = VolumeStore::new(store, NAME, StoreConfig::default()).map_err(|e| e.to_string())?;
    let grace = Duration::from_secs(3600);
    vs.gc(GcOptions {
        grace,
        keep_manifests: 1,
        now: Some(SystemTime::now() + 2 * grace),
        ..GcOptions::default()
    })
    .await
    .map_err(|e| format!("gc: {e}"))
}
