//! The request keepalive ([`Keep`]) against the cache's write side, through the target's
//! own hooks (no kernel). Between a request's last chunk and its hook (where the queue loop
//! holds the keepalive) a rotation or a flush completion asked for must wait for the
//! request's gate, and a WRITE always lands with its ticket, whichever path it took.

use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_testkit::noise;
use glidefs_volume::cache::{BlockState, Cache};
use parking_lot::Mutex;
use ublk_core::testing::Harness;
use ublk_core::{Dispatch, IoDesc, IoOp, Target};

use super::target::VolumeTarget;
use super::tests::{fixture_with, io, Fixture, BS};
use super::{DispatchCtx, Keep};

/// Hang guard only (never a timed assertion).
pub(super) const HANG: Duration = Duration::from_secs(120);

/// What [`Checked`] runs on a request's keepalive.
type Check = Box<dyn Fn(&IoDesc, &Keep) + Send + Sync>;

/// The fixture's target, with `check` run on a request's keepalive after its last chunk and
/// before its hook (`after_read` / `after_write`). A request served by chunks that reaches
/// its hook without a keepalive panics the test.
pub(super) struct Checked {
    target: VolumeTarget,
    check: Check,
}

impl Checked {
    pub(super) fn new(
        f: &Fixture,
        check: impl Fn(&IoDesc, &Keep) + Send + Sync + 'static,
    ) -> Checked {
        Checked {
            target: VolumeTarget {
                inner: Arc::clone(&f.target.inner),
            },
            check: Box::new(check),
        }
    }
}

impl Target for Checked {
    type Keepalive = Keep;

    fn dispatch(&self, io: &IoDesc, ctx: &mut DispatchCtx<'_>) -> Dispatch<Keep> {
        self.target.dispatch(io, ctx)
    }

    fn after_read(&self, io: &IoDesc, result: i32, keepalive: Option<&mut Keep>) -> i32 {
        let keep = keepalive.expect("a READ served by chunks reaches after_read with its Keep");
        (self.check)(io, keep);
        self.target.after_read(io, result, Some(keep))
    }

    fn after_write(
        &self,
        io: &IoDesc,
        result: i32,
        keepalive: Option<Keep>,
        ctx: &mut DispatchCtx<'_>,
    ) -> Dispatch<Keep> {
        let keep = keepalive.expect("a WRITE reaches after_write with its Keep");
        (self.check)(io, &keep);
        self.target.after_write(io, result, Some(keep), ctx)
    }

    fn make_durable(&self, io: &IoDesc, ctx: &mut DispatchCtx<'_>) -> Dispatch<Keep> {
        self.target.make_durable(io, ctx)
    }
}

fn fixture() -> Fixture {
    fixture_with(Arc::new(object_store::memory::InMemory::new()), None, 4)
}

/// Runs `op` (which takes the gate's write side) on a thread of its own and returns once it
/// waits on the gate (`try_enter` fails while a writer waits for the readers); fails the
/// test when `op` finished instead (no reader held the gate). The channel brings `op`'s
/// result.
pub(super) fn queue_writer<R: Send + 'static>(
    cache: &Arc<Cache>,
    op: impl FnOnce(&Cache) -> R + Send + 'static,
) -> mpsc::Receiver<R> {
    let (tx, rx) = mpsc::channel();
    let c = Arc::clone(cache);
    std::thread::spawn(move || {
        let _ = tx.send(op(&c));
    });
    let t0 = Instant::now();
    while let Some(gate) = cache.try_enter() {
        drop(gate);
        assert!(
            rx.try_recv().is_err(),
            "the gate's write side was taken while a request's keepalive held the gate"
        );
        assert!(t0.elapsed() < HANG, "the writer never queued on the gate");
        std::thread::sleep(Duration::from_millis(1));
    }
    rx
}

/// A WRITE's gate outlives its chunk: a rotation asked for after the data landed waits
/// until `after_write` committed the ticket (here on the commit thread: the block turns
/// Dirty, a WAL record), then moves the committed block, with the very file the chunk
/// wrote (the chunk's file is the active file of the request's gate, which becomes the
/// flushing file).
#[test]
fn a_writes_gate_outlives_its_chunk_and_a_rotation_waits_for_its_commit() {
    let f = fixture();
    let cache = Arc::clone(f.volume.cache());
    let req = io(IoOp::Write, 3 * BS + 4096, 8192, 1);
    let data = noise(31, 8192);
    let rotated = Arc::new(Mutex::new(None));
    let landed_in = Arc::new(Mutex::new(None));
    let target = {
        let (cache, data) = (Arc::clone(&cache), data.clone());
        let (rotated, landed_in) = (Arc::clone(&rotated), Arc::clone(&landed_in));
        Checked::new(&f, move |io, keep| {
            *landed_in.lock() = Some(landed(io, keep, &data));
            let rx = queue_writer(&cache, |c| c.rotate().unwrap().map(|r| r.blocks().to_vec()));
            assert_eq!(cache.block_info(3).state, BlockState::NotPresent);
            *rotated.lock() = Some(rx);
        })
    };
    let mut lp = Harness::default();
    let mut buf = data.clone();
    assert_eq!(lp.run(&target, req, &mut buf), Ok(8192));
    let rx = rotated.lock().take().expect("the check ran");
    let blocks = rx
        .recv_timeout(HANG)
        .expect("the rotation never ran after the commit")
        .expect("block 3 was dirty");
    assert_eq!(blocks, vec![3], "the rotation saw the committed write");
    assert_eq!(cache.block_info(3).state, BlockState::Syncing);
    let gate = cache.enter();
    let flushing = gate.flushing_arc().expect("a flushing file");
    let landed_in = landed_in.lock().take().expect("the check ran");
    assert!(
        Arc::ptr_eq(flushing, &landed_in),
        "the chunk's file is the one the rotation moved"
    );
    let mut back = vec![0u8; 8192];
    flushing.read_exact_at(&mut back, req.offset).unwrap();
    assert!(back == data, "the flushing file holds the write");
    drop(gate);
    f.rt.block_on(f.volume.read(req.offset, &mut back)).unwrap();
    assert!(back == data, "the volume reads the write back");
}

/// The active file a WRITE's chunk wrote: asserts the chunk already wrote `data` there, at
/// the ticket's offset.
pub(super) fn landed(io: &IoDesc, keep: &Keep, data: &[u8]) -> Arc<std::fs::File> {
    let ticket = keep.ticket.as_ref().expect("a WRITE lands with its ticket");
    let mut now = vec![0u8; io.len as usize];
    keep.gate
        .active()
        .read_exact_at(&mut now, ticket.file_offset())
        .unwrap();
    assert!(now == data, "the chunk wrote elsewhere");
    Arc::clone(keep.gate.active_arc())
}

/// Block 4 of `f` Syncing with `data`: written, then rotated, its bytes staged for an upload
/// that has not completed (they are in the flushing file); the rotation.
pub(super) fn syncing_block_4(f: &Fixture, data: &[u8]) -> Arc<glidefs_volume::cache::Rotation> {
    let cache = f.volume.cache();
    f.rt.block_on(f.volume.write(4 * BS, data)).unwrap();
    let rot = cache.rotate().unwrap().expect("block 4 is dirty");
    let mut staged = vec![0u8; BS as usize];
    for i in 0..rot.blocks().len() {
        cache.read_for_flush(&rot, i, &mut staged).unwrap();
    }
    assert_eq!(cache.block_info(4).state, BlockState::Syncing);
    rot
}

/// A READ's gate outlives its chunks: the READ of a Syncing block reads the flushing file,
/// and the flush completion asked for after its chunks ran (which takes the flushing file
/// out of the gate and unlinks it) waits until the READ's hook ran; the READ returns the
/// block's bytes, and so does the volume once the flush completed (from the clean file).
#[test]
fn a_reads_gate_outlives_its_chunks_and_complete_flush_waits_for_it() {
    let f = fixture();
    let cache = Arc::clone(f.volume.cache());
    let data = noise(32, BS as usize);
    let rot = syncing_block_4(&f, &data);
    let completed = Arc::new(Mutex::new(None));
    let target = {
        let (cache, rot) = (Arc::clone(&cache), Arc::clone(&rot));
        let completed = Arc::clone(&completed);
        Checked::new(&f, move |_, keep| {
            assert!(
                keep.gate.flushing_arc().is_some(),
                "the READ's gate names the flushing file"
            );
            let rot = Arc::clone(&rot);
            let rx = queue_writer(&cache, move |c| {
                c.complete_flush(&rot).map_err(|e| e.to_string())
            });
            assert_eq!(cache.block_info(4).state, BlockState::Syncing);
            *completed.lock() = Some(rx);
        })
    };
    let mut lp = Harness::default();
    let mut buf = vec![0xAAu8; BS as usize];
    let req = io(IoOp::Read, 4 * BS, BS as u32, 2);
    assert_eq!(lp.run(&target, req, &mut buf), Ok(BS as i32));
    assert!(
        buf == data,
        "the READ returned other bytes than the block's"
    );
    let rx = completed.lock().take().expect("the check ran");
    rx.recv_timeout(HANG)
        .expect("the flush completion never ran after the READ")
        .expect("the flush completion");
    assert_eq!(cache.block_info(4).state, BlockState::Clean);
    assert!(cache.enter().flushing_arc().is_none());
    let mut back = vec![0u8; BS as usize];
    f.rt.block_on(f.volume.read(4 * BS, &mut back)).unwrap();
    assert!(back == data, "the volume reads the block back");
}

/// Every WRITE path hands `after_write` a keepalive with its ticket, the data already in
/// the active file of the request's own gate at the ticket's offset: deferred at dispatch
/// (a fresh block past the active file's end, extended first; a Clean block, promoted
/// first: the gate and the ticket come back through the token from the blocking pool) or
/// inline, its commit on the commit thread (blocks turning Dirty) or on the loop thread
/// (blocks already Dirty, or turned Dirty on the blocking pool after their promote). Each completes with its length; afterwards no gate or stripe
/// lock is left held (a flush to the store runs) and the volume reads every write back.
#[test]
fn every_write_path_lands_with_its_ticket_in_its_gates_active_file() {
    let f = fixture();
    let clean = noise(33, BS as usize);
    f.rt.block_on(async {
        f.volume.write(6 * BS, &clean).await.unwrap();
        f.volume.sync_to_store().await.unwrap();
    });
    assert_eq!(f.volume.cache().block_info(6).state, BlockState::Clean);
    let landed = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    let target = {
        let landed = Arc::clone(&landed);
        Checked::new(&f, move |io, keep| {
            assert_eq!(io.op, IoOp::Write);
            let ticket = keep.ticket.as_ref().expect("a WRITE lands with its ticket");
            assert_eq!(ticket.len(), u64::from(io.len));
            let mut now = vec![0u8; io.len as usize];
            keep.gate
                .active()
                .read_exact_at(&mut now, ticket.file_offset())
                .unwrap();
            landed.lock().push(now);
        })
    };
    // (what, offset, (dispatched inline, deferrals: at dispatch and for the commit)).
    let writes = [
        ("a fresh block past the file's end", 8 * BS + 4096, (0, 2)),
        ("a Dirty block", 8 * BS + 8192, (1, 0)),
        ("a fresh block inside the file", 7 * BS + 4096, (1, 1)),
        ("a Clean block", 6 * BS + 4096, (0, 1)),
    ];
    let mut lp = Harness::default();
    let mut want = vec![0u8; (10 * BS) as usize];
    want[(6 * BS) as usize..(7 * BS) as usize].copy_from_slice(&clean);
    for (i, (what, offset, path)) in writes.into_iter().enumerate() {
        let data = noise(40 + i as u64, 4096);
        let before = target.target.stats();
        let mut buf = data.clone();
        let r = lp.run(&target, io(IoOp::Write, offset, 4096, 0), &mut buf);
        assert_eq!(r, Ok(4096), "the WRITE to {what}");
        let after = target.target.stats();
        let took = (
            after.inline - before.inline,
            after.deferred - before.deferred,
        );
        assert_eq!(took, path, "the path of the WRITE to {what}");
        let seen = landed.lock().pop().expect("the check ran");
        assert!(seen == data, "the WRITE to {what} landed elsewhere");
        want[offset as usize..offset as usize + 4096].copy_from_slice(&data);
    }
    f.rt.block_on(async {
        tokio::time::timeout(HANG, f.volume.sync_to_store())
            .await
            .expect("a gate or stripe lock was left held")
            .unwrap();
    });
    let mut back = vec![0u8; want.len()];
    f.rt.block_on(f.volume.read(0, &mut back)).unwrap();
    assert!(back == want, "the volume reads back other bytes");
}
