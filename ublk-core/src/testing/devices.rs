//! Devices for the kernel tests: a mem device on the transport a test row asks for (the test
//! fails unless the kernel granted exactly that transport), and the ublk block devices the
//! kernel shows.

use std::sync::Arc;

use crate::targets::{MemOptions, MemTarget};
use crate::{Device, DeviceConfig, Transport, TransportPreference};

/// The preference that asks for transport `t`.
pub fn preference(t: Transport) -> TransportPreference {
    match t {
        Transport::ZeroCopy => TransportPreference::PreferZeroCopy,
        Transport::UserCopy => TransportPreference::UserCopy,
    }
}

/// Creates a mem device of `size` bytes with `queues` queues on transport `t`; fails unless
/// the kernel granted `t` (prints the granted flags).
pub fn mem_device(
    t: Transport,
    size: u64,
    queues: u16,
    opts: MemOptions,
) -> (Device<MemTarget>, Arc<MemTarget>) {
    mem_device_on(t, size, queues, opts, None)
}

/// [`mem_device`] whose queues run on `pool` (`None`: a thread per queue).
pub fn mem_device_on(
    t: Transport,
    size: u64,
    queues: u16,
    opts: MemOptions,
    pool: Option<&crate::LoopPool>,
) -> (Device<MemTarget>, Arc<MemTarget>) {
    mem_device_batch(t, size, queues, opts, pool, crate::BatchIo::default())
}

/// [`mem_device_on`] with `batch` as its BATCH_IO choice; with `On` or `Off` the test fails
/// unless the device's flags say exactly that.
pub fn mem_device_batch(
    t: Transport,
    size: u64,
    queues: u16,
    opts: MemOptions,
    pool: Option<&crate::LoopPool>,
    batch: crate::BatchIo,
) -> (Device<MemTarget>, Arc<MemTarget>) {
    let target = MemTarget::new(size, opts).expect("mem target");
    let mut cfg = DeviceConfig::new("mem", size);
    cfg.queues = queues;
    cfg.depth = 64;
    cfg.transport = preference(t);
    cfg.queue.pool = pool.cloned();
    cfg.queue.batch_io = batch;
    let dev = Device::create(&cfg, Arc::clone(&target)).expect("create ublk device");
    let info = dev.info().expect("device info");
    let batched = info.flags & libublk::sys::UBLK_F_BATCH_IO as u64 != 0;
    println!(
        "device {} kernel {}: asked {t} batch_io={batch}, granted {} batch {batched} (flags {:#x}), queues {} depth {} capacity {} on {}",
        dev.bdev_path(),
        crate::features::kernel_release(),
        dev.transport(),
        info.flags,
        info.queues,
        info.depth,
        info.capacity_bytes,
        if pool.is_some() { "the pool" } else { "a thread per queue" }
    );
    match batch {
        crate::BatchIo::On => assert!(batched, "batch_io=on but the device has no BATCH_IO"),
        crate::BatchIo::Off => assert!(!batched, "batch_io=off but the device has BATCH_IO"),
        crate::BatchIo::Auto => {}
    }
    assert_eq!(
        dev.transport(),
        t,
        "kernel granted {} instead of {t}",
        dev.transport()
    );
    assert_eq!(
        info.transport,
        Some(t),
        "device flags {:#x} do not show {t}",
        info.flags
    );
    assert_eq!(info.queues, queues);
    assert_eq!(info.capacity_bytes, size);
    (dev, target)
}

/// ublk block devices the kernel shows (`/sys/block/ublkb*`), sorted.
pub fn ublk_block_devices() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/block")
        .expect("/sys/block")
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with("ublkb"))
        .collect();
    v.sort();
    v
}

/// Serves reads from a mem target but keeps every WRITE's deferred token without finishing it
/// (a request stuck on, say, a hung network fetch) until [`StuckWrites::release`].
#[derive(Debug)]
pub struct StuckWrites {
    mem: Arc<MemTarget>,
    held: std::sync::Mutex<Vec<crate::Deferred>>,
}

impl StuckWrites {
    /// Over a mem target of `size` bytes.
    pub fn new(size: u64) -> Arc<StuckWrites> {
        Arc::new(StuckWrites {
            mem: MemTarget::new(size, MemOptions::default()).expect("mem target"),
            held: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// WRITEs held now.
    pub fn held(&self) -> usize {
        self.held.lock().expect("held writes").len()
    }

    /// Waits until at least one WRITE is held.
    pub fn wait_for_a_held_write(&self) {
        while self.held() == 0 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Finishes every held token with `result` (harmless once their queue is gone).
    pub fn release(&self, result: i32) {
        self.held
            .lock()
            .expect("held writes")
            .drain(..)
            .for_each(|d| d.complete(result));
    }
}

impl crate::Target for StuckWrites {
    type Keepalive = ();

    fn dispatch(&self, io: &crate::IoDesc, ctx: &mut crate::DispatchCtx<'_>) -> crate::Dispatch {
        if io.op == crate::IoOp::Write {
            // Test-only: uncontended lock; a real target would hand the token to a task.
            self.held.lock().expect("held writes").push(ctx.defer());
            return crate::Dispatch::Deferred;
        }
        self.mem.dispatch(io, ctx)
    }
}
