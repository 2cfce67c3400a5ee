//! Fake exporters for the API tests: devices that pretend ([`FakeDevices`]), devices that
//! fail to attach or to stop ([`BrokenDevices`]), devices a crashed daemon left behind to
//! be taken over ([`Reattaching`]), and devices whose last writes land as they stop, with the
//! store going down right after ([`LastWrites`]), and devices that record their QoS limits
//! ([`QosRecording`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use glidefs::model::QosLimits;
use glidefs::ublk::export::{Export, ExportError, ExportSpec, Exporter};
use glidefs::ublk::io_stats::{IoRecorder, IoStats};
use glidefs_volume::Volume;
use ublk_core::IoOp;

/// An exporter that pretends: `/dev/ublkbN`, `user-copy`, counts attaches and stops; while
/// `busy` is set its devices are in use (`stop_if_unused` refuses, as for a mounted one).
#[derive(Default)]
pub struct FakeDevices {
    pub attached: AtomicUsize,
    pub stopped: Arc<AtomicUsize>,
    pub busy: std::sync::atomic::AtomicBool,
    /// How long `stop_if_unused` takes (a remove holds the admin lock meanwhile).
    pub stop_check_delay: std::time::Duration,
    /// Devices hold descriptors the way a ublk device does (its char device, a ring and an
    /// eventfd per queue: `1 + 2 * queues`, here `/dev/null`s); `EMFILE` fails the attach
    /// like a real one.
    pub hold_fds: bool,
    /// Set: a hand-off keeps the devices (`detach` counts here and returns the id), as the
    /// ublk exporter does; unset: `detach` stops them (the trait's default).
    pub detached: Option<Arc<AtomicUsize>>,
}

pub struct FakeDevice {
    pub id: u32,
    pub io: IoRecorder,
    pub stopped: Arc<AtomicUsize>,
    /// The descriptors it holds (`FakeDevices::hold_fds`), closed when it is dropped.
    pub held: Vec<std::fs::File>,
    /// `FakeDevices::detached`.
    pub detached: Option<Arc<AtomicUsize>>,
}

impl Exporter for FakeDevices {
    fn attach(
        &self,
        name: &str,
        _volume: Arc<Volume>,
        spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError> {
        assert!(spec.queues >= 1 && spec.max_io_bytes >= 4096);
        let wanted = if self.hold_fds {
            1 + 2 * usize::from(spec.queues)
        } else {
            0
        };
        let held = (0..wanted)
            .map(|_| std::fs::File::open("/dev/null"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ExportError::Failed {
                volume: name.to_string(),
                source: Box::new(e),
            })?;
        let id = u32::try_from(self.attached.fetch_add(1, Ordering::SeqCst)).map_err(|e| {
            ExportError::Failed {
                volume: "fake".into(),
                source: Box::new(e),
            }
        })?;
        let io = IoRecorder::default();
        io.record(
            IoOp::Read,
            4096,
            4096,
            std::time::Duration::from_micros(120),
        );
        Ok(Box::new(FakeDevice {
            id,
            io,
            stopped: self.stopped.clone(),
            held,
            detached: self.detached.clone(),
        }))
    }

    fn stop_if_unused(&self, name: &str, id: u32) -> Result<(), ExportError> {
        std::thread::sleep(self.stop_check_delay);
        if self.busy.load(Ordering::SeqCst) {
            return Err(ExportError::Busy {
                volume: name.to_string(),
                detail: format!("/dev/ublkb{id} is mounted (test)"),
            });
        }
        Ok(())
    }
}

impl Export for FakeDevice {
    fn id(&self) -> Option<u32> {
        Some(self.id)
    }
    fn path(&self) -> Option<String> {
        Some(format!("/dev/ublkb{}", self.id))
    }
    fn transport(&self) -> Option<String> {
        Some("user-copy".into())
    }
    fn io_stats(&self) -> IoStats {
        self.io.snapshot()
    }
    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        self.stopped.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn detach(self: Box<Self>) -> Result<Option<u32>, ExportError> {
        match &self.detached {
            Some(kept) => {
                kept.fetch_add(1, Ordering::SeqCst);
                Ok(Some(self.id))
            }
            None => self.stop().map(|()| None),
        }
    }
}

/// An exporter whose attach fails for names starting with `noattach` and whose devices
/// cannot be stopped.
pub struct BrokenDevices;

pub struct StuckDevice;

impl Exporter for BrokenDevices {
    fn attach(
        &self,
        name: &str,
        _volume: Arc<Volume>,
        _spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError> {
        if name.starts_with("noattach") {
            return Err(ExportError::Failed {
                volume: name.to_string(),
                source: "ADD_DEV: Device or resource busy (test)".into(),
            });
        }
        Ok(Box::new(StuckDevice))
    }
}

impl Export for StuckDevice {
    fn id(&self) -> Option<u32> {
        Some(7)
    }
    fn path(&self) -> Option<String> {
        Some("/dev/ublkb7".into())
    }
    fn transport(&self) -> Option<String> {
        Some("zero-copy".into())
    }
    fn io_stats(&self) -> IoStats {
        IoStats::default()
    }
    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        Err(ExportError::Failed {
            volume: "stuck".into(),
            source: "STOP_DEV timed out (test)".into(),
        })
    }
}

/// An exporter standing in for devices a crashed daemon left QUIESCED: `attach` makes
/// device 0, `reattach` takes device `id` over and records it. With `elsewhere` set, the
/// device asked for is gone and its id taken: `reattach` records the id asked for and makes
/// a new device with the id `elsewhere` names.
#[derive(Default)]
pub struct Reattaching {
    pub reattached: parking_lot::Mutex<Vec<u32>>,
    pub stopped: Arc<AtomicUsize>,
    pub elsewhere: Option<u32>,
}

impl Exporter for Reattaching {
    fn attach(
        &self,
        _name: &str,
        _volume: Arc<Volume>,
        _spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError> {
        Ok(Box::new(FakeDevice {
            id: 0,
            io: IoRecorder::default(),
            stopped: self.stopped.clone(),
            held: Vec::new(),
            detached: None,
        }))
    }

    fn reattach(
        &self,
        _name: &str,
        _volume: Arc<Volume>,
        _spec: &ExportSpec,
        id: u32,
    ) -> Result<Box<dyn Export>, ExportError> {
        self.reattached.lock().push(id);
        Ok(Box::new(FakeDevice {
            id: self.elsewhere.unwrap_or(id),
            io: IoRecorder::default(),
            stopped: self.stopped.clone(),
            held: Vec::new(),
            detached: None,
        }))
    }
}

/// An exporter whose devices can change their capacity (resize tests): `no_update_size`
/// stands in for a kernel without UPDATE_SIZE (`check_resize` refuses), `fail_resize` for an
/// UPDATE_SIZE that fails; every resize done is recorded as (device id, size).
#[derive(Default)]
pub struct Resizing {
    pub no_update_size: std::sync::atomic::AtomicBool,
    pub fail_resize: std::sync::atomic::AtomicBool,
    pub resized: parking_lot::Mutex<Vec<(u32, u64)>>,
    /// Makes the devices (device 0).
    pub devices: Reattaching,
}

impl Exporter for Resizing {
    fn attach(
        &self,
        name: &str,
        volume: Arc<Volume>,
        spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError> {
        self.devices.attach(name, volume, spec)
    }

    fn check_resize(&self, name: &str, id: u32) -> Result<(), ExportError> {
        if self.no_update_size.load(Ordering::SeqCst) {
            return Err(ExportError::Unsupported(
                format!("no UPDATE_SIZE in this kernel (test): device {id} of `{name}`").into(),
            ));
        }
        Ok(())
    }

    fn resize(&self, name: &str, id: u32, size: u64) -> Result<(), ExportError> {
        self.check_resize(name, id)?;
        if self.fail_resize.load(Ordering::SeqCst) {
            return Err(ExportError::Failed {
                volume: name.to_string(),
                source: "UPDATE_SIZE: Input/output error (test)".into(),
            });
        }
        self.resized.lock().push((id, size));
        Ok(())
    }
}

/// An exporter whose attach takes `delay` (a device step that waits on the kernel), counting
/// attaches in progress and the most seen at once; devices as [`FakeDevices`] makes them.
#[derive(Default)]
pub struct SlowDevices {
    pub delay: std::time::Duration,
    pub in_progress: AtomicUsize,
    pub most_at_once: AtomicUsize,
    pub devices: FakeDevices,
}

impl Exporter for SlowDevices {
    fn attach(
        &self,
        name: &str,
        volume: Arc<Volume>,
        spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError> {
        let now = self.in_progress.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        self.in_progress.fetch_sub(1, Ordering::SeqCst);
        self.devices.attach(name, volume, spec)
    }

    fn stop_if_unused(&self, name: &str, id: u32) -> Result<(), ExportError> {
        self.devices.stop_if_unused(name, id)
    }
}

/// An exporter whose devices, when stopped, first complete one last write (4 KiB of
/// `pattern` at `offset`: a request the kernel finishes before the device goes) and then
/// take the object store down (`outage`): the remove's tail flush has that write to upload
/// and no store to upload it to.
pub struct LastWrites {
    pub offset: u64,
    pub pattern: u8,
    pub outage: Arc<dyn Fn() + Send + Sync>,
}

pub struct LastWriteDevice {
    volume: Arc<Volume>,
    offset: u64,
    pattern: u8,
    outage: Arc<dyn Fn() + Send + Sync>,
}

impl Exporter for LastWrites {
    fn attach(
        &self,
        _name: &str,
        volume: Arc<Volume>,
        _spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError> {
        Ok(Box::new(LastWriteDevice {
            volume,
            offset: self.offset,
            pattern: self.pattern,
            outage: self.outage.clone(),
        }))
    }
}

impl Export for LastWriteDevice {
    fn id(&self) -> Option<u32> {
        Some(3)
    }
    fn path(&self) -> Option<String> {
        Some("/dev/ublkb3".into())
    }
    fn transport(&self) -> Option<String> {
        Some("user-copy".into())
    }
    fn io_stats(&self) -> IoStats {
        IoStats::default()
    }
    /// Runs on the blocking pool (a device step), inside the runtime.
    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        let data = vec![self.pattern; 4096];
        tokio::runtime::Handle::current()
            .block_on(self.volume.write(self.offset, &data))
            .map_err(|e| ExportError::Failed {
                volume: "last-writes".into(),
                source: Box::new(e),
            })?;
        (self.outage)();
        Ok(())
    }
}

/// A daemon on a `FaultyStore` whose devices make a last write of `pattern` at `offset` as
/// they stop, then take the store down ([`LastWrites`]), with a 4 MiB volume `v` (4 KiB
/// blocks).
pub async fn last_writes_daemon(
    dir: &std::path::Path,
    offset: u64,
    pattern: u8,
) -> (super::daemon::Daemon, Arc<glidefs_testkit::FaultyStore>) {
    last_writes_daemon_then(dir, offset, pattern, |store| store.set_outage(true)).await
}

/// [`last_writes_daemon`], but after the last write a device does `then` to the store
/// instead of taking it down (e.g. injects a fault for the tail flush).
pub async fn last_writes_daemon_then(
    dir: &std::path::Path,
    offset: u64,
    pattern: u8,
    then: fn(&glidefs_testkit::FaultyStore),
) -> (super::daemon::Daemon, Arc<glidefs_testkit::FaultyStore>) {
    let store = Arc::new(glidefs_testkit::FaultyStore::new(
        super::daemon::file_store(dir),
    ));
    let at_stop = store.clone();
    let devices = LastWrites {
        offset,
        pattern,
        outage: Arc::new(move || then(&at_stop)),
    };
    let d = super::daemon::assemble(dir, store.clone(), Arc::new(devices)).await;
    d.create(serde_json::json!({"name": "v", "size": "4M", "block_size": "4K"}))
        .await;
    (d, store)
}

/// Stops `d`, brings `store` back and starts the next daemon on `dir` (no devices): `v` is
/// `running` there with `unflushed` bytes not in the store yet.
pub async fn restart_with_the_store_back(
    mut d: super::daemon::Daemon,
    dir: &std::path::Path,
    store: &Arc<glidefs_testkit::FaultyStore>,
    unflushed: u64,
) -> super::daemon::Daemon {
    d.stop().await;
    next_daemon(dir, store, unflushed).await
}

/// Brings `store` back (no faults, no outage) and starts the next daemon on `dir` (no
/// devices), after a stop or a `kill`: `v` is `running` there with `unflushed` bytes not in
/// the store yet.
pub async fn next_daemon(
    dir: &std::path::Path,
    store: &Arc<glidefs_testkit::FaultyStore>,
    unflushed: u64,
) -> super::daemon::Daemon {
    store.clear_faults();
    store.set_outage(false);
    let devices = Arc::new(glidefs::ublk::export::NoDevices);
    let d = super::daemon::assemble(dir, store.clone(), devices).await;
    let v = d.client.show("v").await.unwrap();
    assert_eq!(v.state, glidefs::model::VolumeState::Running, "{v:?}");
    assert_eq!(v.dirty_bytes + v.syncing_bytes, unflushed, "{v:?}");
    d
}

/// Blocks 0 and 1 (4 KiB each) of `v` as read from the store alone: `v` attached again
/// after its removal.
pub async fn blocks_from_store(d: &super::daemon::Daemon) -> (Vec<u8>, Vec<u8>) {
    d.create(serde_json::json!({"name": "v", "attach_existing": true}))
        .await;
    let mut buf = vec![0xAAu8; 8192];
    d.volume("v").read(0, &mut buf).await.unwrap();
    let b1 = buf.split_off(4096);
    (buf, b1)
}

/// Brings the store back and asserts that a plain remove of `v` now succeeds, leaving no
/// cache behind, and that the store alone then holds blocks 0 and 1 as `b0` and `b1`.
pub async fn removed_with_the_store_back(
    d: &super::daemon::Daemon,
    store: &glidefs_testkit::FaultyStore,
    b0: u8,
    b1: u8,
) {
    store.clear_faults();
    store.set_outage(false);
    let r = d.req(hyper::Method::DELETE, "/v1/volumes/v", None).await;
    let after = d.client.show("v").await.ok().and_then(|v| v.error);
    assert_eq!(
        r.status,
        200,
        "a plain remove, the store back: {}; the volume now says: {after:?}",
        super::daemon::text(&r)
    );
    assert!(d.names().await.is_empty());
    assert!(super::daemon::cache_dirs(&d.cfg).is_empty());
    let (got0, got1) = blocks_from_store(d).await;
    assert!(got0.iter().all(|&b| b == b0), "block 0 from the store");
    assert!(got1.iter().all(|&b| b == b1), "block 1 from the store");
}

/// A daemon (no devices) on a `FaultyStore` with a 4 MiB volume `v` (4 KiB blocks) holding
/// 4 KiB of `7` at 0, flushed (generation 2).
pub async fn flushed_daemon(
    dir: &std::path::Path,
) -> (super::daemon::Daemon, Arc<glidefs_testkit::FaultyStore>) {
    let store = Arc::new(glidefs_testkit::FaultyStore::new(
        super::daemon::file_store(dir),
    ));
    let devices = Arc::new(glidefs::ublk::export::NoDevices);
    let d = super::daemon::assemble(dir, store.clone(), devices).await;
    d.create(serde_json::json!({"name": "v", "size": "4M", "block_size": "4K"}))
        .await;
    d.volume("v").write(0, &[7u8; 4096]).await.unwrap();
    assert_eq!(d.client.flush("v").await.unwrap().generation, 2);
    (d, store)
}

/// An exporter recording QoS limits (QoS tests): the limits each device got at attach (or
/// reattach), and every live change (`Export::set_qos`) as (device id, limits); devices as
/// [`Reattaching`] makes them.
#[derive(Default)]
pub struct QosRecording {
    pub at_attach: parking_lot::Mutex<Vec<QosLimits>>,
    pub changed: Arc<parking_lot::Mutex<Vec<(u32, QosLimits)>>>,
    pub devices: Reattaching,
}

/// A device of [`QosRecording`].
pub struct QosDevice {
    inner: Box<dyn Export>,
    changed: Arc<parking_lot::Mutex<Vec<(u32, QosLimits)>>>,
}

impl QosRecording {
    fn wrap(&self, spec: &ExportSpec, inner: Box<dyn Export>) -> Box<dyn Export> {
        self.at_attach.lock().push(spec.qos);
        Box::new(QosDevice {
            inner,
            changed: self.changed.clone(),
        })
    }
}

impl Exporter for QosRecording {
    fn attach(
        &self,
        name: &str,
        volume: Arc<Volume>,
        spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError> {
        let dev = self.devices.attach(name, volume, spec)?;
        Ok(self.wrap(spec, dev))
    }

    fn reattach(
        &self,
        name: &str,
        volume: Arc<Volume>,
        spec: &ExportSpec,
        id: u32,
    ) -> Result<Box<dyn Export>, ExportError> {
        let dev = self.devices.reattach(name, volume, spec, id)?;
        Ok(self.wrap(spec, dev))
    }
}

impl Export for QosDevice {
    fn id(&self) -> Option<u32> {
        self.inner.id()
    }
    fn path(&self) -> Option<String> {
        self.inner.path()
    }
    fn transport(&self) -> Option<String> {
        self.inner.transport()
    }
    fn io_stats(&self) -> IoStats {
        self.inner.io_stats()
    }
    fn set_qos(&self, limits: &QosLimits) {
        let id = self.inner.id().unwrap_or(u32::MAX);
        self.changed.lock().push((id, *limits));
    }
    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        self.inner.stop()
    }
}
