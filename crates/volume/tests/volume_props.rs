//! Property test: random sequences of writes, reads, FLUSHes, flushes to the store, evictions,
//! cold reads and crash-restarts against a per-page oracle (see `common::Oracle`), on the
//! in-memory store and on the real S3 protocol (glidefs-testkit's in-process server).
//!
//! Cases: `PROPTEST_CASES` (default 16 in-memory, 6 over S3).

mod common;

use std::sync::Arc;

use common::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    /// Write `pages` pages starting at `page` with content derived from `seed`.
    Write {
        page: usize,
        pages: usize,
        seed: u64,
    },
    /// Read and compare (pages may be cold: this is where cold reads happen).
    Read { page: usize, pages: usize },
    /// The block device's FLUSH.
    Flush,
    /// Flush to the object store (rotation, packs, manifest, eviction under budget).
    Sync,
    /// Evict Clean blocks down to `blocks` blocks of local disk.
    Evict { blocks: u64 },
    /// Kill the process (no clean shutdown) and reopen the same dir and store.
    Crash,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..PAGES, 1usize..=6, any::<u64>()).prop_map(|(page, pages, seed)| Step::Write {
            page,
            pages: pages.min(PAGES - page),
            seed
        }),
        4 => (0..PAGES, 1usize..=8).prop_map(|(page, pages)| Step::Read {
            page,
            pages: pages.min(PAGES - page)
        }),
        1 => Just(Step::Flush),
        2 => Just(Step::Sync),
        1 => (0..BLOCKS).prop_map(|blocks| Step::Evict { blocks }),
        1 => Just(Step::Crash),
    ]
}

async fn run(steps: Vec<Step>, store: Arc<dyn object_store::ObjectStore>) {
    let dir = tempfile::tempdir().unwrap();
    let mut oracle = Oracle::new();
    let mut v = open(dir.path(), store.clone()).await;
    for (i, s) in steps.into_iter().enumerate() {
        match s {
            Step::Write { page, pages, seed } => {
                let mut buf = Vec::with_capacity(pages * PAGE);
                for p in page..page + pages {
                    let d = page_data(seed, p);
                    buf.extend_from_slice(&d);
                    oracle.write(p, d);
                }
                v.write((page * PAGE) as u64, &buf).await.unwrap();
            }
            Step::Read { page, pages } => {
                let mut buf = vec![0; pages * PAGE];
                v.read((page * PAGE) as u64, &mut buf).await.unwrap();
                oracle.assert_pages(page, &buf, &format!("step {i}"));
            }
            Step::Flush => {
                v.flush().await.unwrap();
                oracle.durable();
            }
            Step::Sync => {
                v.sync_to_store().await.unwrap();
                oracle.durable();
            }
            Step::Evict { blocks } => {
                v.evict_to(blocks * BS as u64).await.unwrap();
            }
            Step::Crash => {
                v.kill().await;
                drop(v);
                v = open(dir.path(), store.clone()).await;
                let img = read_all(&v).await;
                oracle.check_after_crash(&img, &format!("step {i}"));
            }
        }
    }
    // finally: everything reads as the oracle, also after one more crash-restart and from a
    // fresh host once synced
    let img = read_all(&v).await;
    oracle.assert_pages(0, &img, "final");
    v.sync_to_store().await.unwrap();
    v.kill().await;
    drop(v);
    let fresh = tempfile::tempdir().unwrap();
    let v = open(fresh.path(), store).await;
    oracle.assert_pages(0, &read_all(&v).await, "fresh host");
}

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(16), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_oracle_in_memory(steps in proptest::collection::vec(step(), 1..60)) {
        runtime().block_on(run(steps, mem()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(6), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_oracle_over_s3(steps in proptest::collection::vec(step(), 1..40)) {
        let rt = runtime();
        rt.block_on(async {
            let server = glidefs_testkit::S3Server::start().await.unwrap();
            let store = server.object_store().unwrap();
            run(steps, store).await;
        });
    }
}
