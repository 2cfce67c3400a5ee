//! Device lifecycle: create, serve, stop, delete, hand off, recover.
//!
//! A [`Device`] owns, in drop order: its queue threads, the `/dev/ublkcN` file (inside
//! libublk's `UblkDev`; the kernel allows one opener, and every queue ring registers this
//! fd as fixed file 0), and the control handle (`UblkCtrl`).
//!
//! Create ([`Device::create`]):
//! 1. Negotiate the transport (see [`transport`](crate::transport)).
//! 2. ADD_DEV with the transport's flags plus `UBLK_F_USER_RECOVERY`; check that the kernel
//!    granted the transport we asked for (a zero-copy request never silently runs
//!    USER_COPY).
//! 3. Open `/dev/ublkcN`, start one queue loop per hardware queue (a thread of its own, or
//!    on a [`LoopPool`](crate::queue::pool::LoopPool) thread); each queues a FETCH per tag
//!    before reporting ready.
//! 4. SET_PARAMS + START_DEV (START_DEV waits until every tag has been fetched, which is why
//!    the queues start first). Any failure unwinds: queues stopped, device deleted.
//!
//! Stop ([`Device::stop_and_delete`]), each step bounded:
//! 1. STOP_DEV (on a helper thread, waited for up to [`STOP_DEV_TIMEOUT`]): the kernel
//!    removes `/dev/ublkbN`, waits for requests already handed to us (the loops keep serving
//!    them; deferred tokens that die complete with `-EIO`), then aborts every pending FETCH
//!    with `UBLK_IO_RES_ABORT`, so each loop leaves by itself. If a target holds a request
//!    past the deadline, the next steps run anyway: closing the queue rings makes the kernel
//!    take the held requests back, which lets STOP_DEV finish.
//! 2. Raise every queue's stop flag and write its eventfd (for a loop that saw no abort).
//! 3. Join each queue thread with a deadline; a thread that misses it is detached and
//!    reported as [`Error::StopTimeout`].
//! 4. Close `/dev/ublkcN` (the kernel fails any request a target still held), then DEL_DEV
//!    (the asynchronous variant when a queue thread was detached, since its ring still pins
//!    the char device), on a helper thread waited for up to [`DEL_DEV_TIMEOUT`].
//!
//! Hand-off ([`Device::detach`]) leaves the device for a successor without STOP_DEV:
//! - where the kernel has `UBLK_F_QUIESCE`, QUIESCE_DEV (on a helper thread, bounded) stops
//!   handing out new requests (they wait in the kernel), waits while the queues go on serving
//!   until each queue has an idle tag, then aborts the tags still waiting for a request. It
//!   does not wait for every request we hold, and a tag that was in the server then re-arms
//!   its FETCH with its COMMIT_AND_FETCH: nothing aborts that one. So a loop does not learn
//!   from the kernel that it may leave;
//! - then (and when QUIESCE_DEV is missing or fails) the queues' stop flags, raised at once:
//!   each loop parks what it fetches from then on (none after a QUIESCE_DEV), finishes what it
//!   dispatched and submits its last COMMITs, and returns; closing its ring cancels the FETCHes
//!   still armed. The device is created with `UBLK_F_USER_RECOVERY_REISSUE` where the kernel
//!   has it, so parked requests go to the successor instead of failing.
//!
//! Then `/dev/ublkcN` closes and the kernel holds new I/O with the device QUIESCED.
//! [`Device::recover`] (START_USER_RECOVERY, new queues, END_USER_RECOVERY) makes it LIVE
//! again under the new server without the block device disappearing. A recover that fails
//! leaves the device QUIESCED (it never deletes it: a filesystem may be mounted on it).
//!
//! Every control command that may wait on the kernel (STOP_DEV, QUIESCE_DEV, DEL_DEV) runs on
//! a helper thread that the caller waits for with a deadline, and every helper disowns its
//! libublk handle, so a late return never deletes the device behind our back. libublk reports
//! `-EBUSY` from a command as `Ok(-EBUSY)`; [`ctrl_ok`](crate::ctrl::ctrl_ok) turns every negative `Ok` into an
//! error.

use crate::ctrl::{ctrl_ok, ensure_ctrl_ring, raw_dev_id, DeviceInfo, DeviceState};
use crate::error::{Error, Result};
use crate::features::{kernel_release, KernelFeatures};
use crate::queue::thread::{spawn_queue, QueueSpec, QueueThread};
use crate::queue::QueueHandle;
use crate::target::Target;
use crate::transport::{self, Transport, TransportPreference};
use libublk::ctrl::UblkCtrl;
use libublk::io::UblkDev;
use libublk::{sys, UblkFlags};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// How long [`Device::stop_and_delete`] waits for queue threads.
pub const STOP_JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long [`Device::stop_and_delete`] lets STOP_DEV wait for requests the target still
/// holds before it closes the queues to make the kernel take them back.
pub const STOP_DEV_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`Device::stop_and_delete`] waits for DEL_DEV once STOP_DEV has finished.
pub const DEL_DEV_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`Device::detach`] lets QUIESCE_DEV wait for requests in flight (the kernel is
/// given the same limit; we wait a little longer for its answer). Requests the server holds
/// do not hold it up: with every tag of a queue in a stuck target it returns at once
/// (`ublk_hardening` `*_handoff_with_every_tag_held`: `detach` is bounded by the loops' drain
/// budget).
pub const QUIESCE_TIMEOUT: Duration = Duration::from_secs(30);

/// Parameters of a new device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Target type name recorded by libublk (e.g. `mem`, `glidefs`).
    pub name: String,
    /// Device id to request; `None` lets the kernel choose.
    pub id: Option<u32>,
    /// Hardware queues (one thread each).
    pub queues: u16,
    /// Tags per queue.
    pub depth: u16,
    /// Largest request in bytes (multiple of the page size).
    pub max_io_bytes: u32,
    /// Capacity in bytes (multiple of the logical block size).
    pub size_bytes: u64,
    /// log2 of the logical block size (9 = 512 B).
    pub logical_block_shift: u8,
    /// log2 of the physical block size (12 = 4 KiB).
    pub physical_block_shift: u8,
    /// Advertise DISCARD and WRITE_ZEROES.
    pub discard: bool,
    /// Discard granularity in bytes (a power of two, at least the logical block size); 0
    /// means the physical block size. A target that frees space only in whole blocks of its
    /// own advertises that block size (file systems then trim in such units: ext4's FITRIM
    /// raises its minimum length to it).
    pub discard_granularity: u32,
    /// Mark the block device read-only (`UBLK_ATTR_READ_ONLY`): the kernel refuses writes
    /// before they reach the target (the target should still refuse them).
    pub read_only: bool,
    /// Transport preference.
    pub transport: TransportPreference,
    /// How the queue threads run.
    pub queue: QueueOptions,
    /// Hand off with QUIESCE_DEV where the kernel has it (default). `false` asks for the
    /// fallback (stop flags + reissue) even there: tests use it to cover older kernels.
    pub quiesce: bool,
}

/// How a device's queue threads run (at creation and at recovery).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueOptions {
    /// Serve the queues on the threads of this pool, shared with other devices, instead of
    /// a thread per queue (see [`crate::queue::pool`]); `cpus` then does not apply.
    pub pool: Option<crate::queue::pool::LoopPool>,
    /// CPUs to pin queue threads to: queue `q` runs on `cpus[q % len]`; empty = no pin.
    pub cpus: Vec<usize>,
    /// Test hook: once a queue loop has dispatched this many requests, every wait on its
    /// ring fails with EBADFD (an injected fatal ring error; see `queue::engine`). `None`
    /// (the default) in production.
    pub fault_ring_after: Option<u64>,
    /// Whether a new device uses `UBLK_F_BATCH_IO` (one multishot FETCH and one COMMIT per
    /// turn instead of a command per request; see [`crate::queue::batch`]). Read at
    /// creation only: a recovered device keeps the mode it was created with.
    pub batch_io: crate::queue::batch::BatchIo,
}

impl DeviceConfig {
    /// A config with common defaults: 1 queue, depth 64, 512 KiB requests, 512 B logical and
    /// 4 KiB physical blocks, discard on, zero-copy preferred, quiesce on hand-off.
    pub fn new(name: &str, size_bytes: u64) -> DeviceConfig {
        DeviceConfig {
            name: name.to_string(),
            id: None,
            queues: 1,
            depth: 64,
            max_io_bytes: 512 * 1024,
            size_bytes,
            logical_block_shift: 9,
            physical_block_shift: 12,
            discard: true,
            discard_granularity: 0,
            read_only: false,
            transport: TransportPreference::PreferZeroCopy,
            queue: QueueOptions::default(),
            quiesce: true,
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if self.queues == 0 || u32::from(self.queues) > sys::UBLK_MAX_NR_QUEUES {
            return bad(format!(
                "queues={} (1..={})",
                self.queues,
                sys::UBLK_MAX_NR_QUEUES
            ));
        }
        if self.depth == 0 || u32::from(self.depth) > sys::UBLK_MAX_QUEUE_DEPTH {
            return bad(format!(
                "depth={} (1..={})",
                self.depth,
                sys::UBLK_MAX_QUEUE_DEPTH
            ));
        }
        if self.max_io_bytes < 4096
            || !self.max_io_bytes.is_multiple_of(4096)
            || self.max_io_bytes > (1 << sys::UBLK_IO_BUF_BITS)
        {
            return bad(format!(
                "max_io_bytes={} (4 KiB multiple up to 32 MiB)",
                self.max_io_bytes
            ));
        }
        if !(9..=12).contains(&self.logical_block_shift)
            || self.physical_block_shift < self.logical_block_shift
        {
            return bad(format!(
                "block shifts logical={} physical={}",
                self.logical_block_shift, self.physical_block_shift
            ));
        }
        let lbs = 1u64 << self.logical_block_shift;
        let g = self.discard_granularity;
        if g != 0 && (!g.is_power_of_two() || u64::from(g) < lbs) {
            return bad(format!(
                "discard_granularity={g} (0, or a power of two of at least {lbs})"
            ));
        }
        if self.size_bytes == 0 || !self.size_bytes.is_multiple_of(lbs) {
            return bad(format!(
                "size_bytes={} (non-zero multiple of {lbs})",
                self.size_bytes
            ));
        }
        Ok(())
    }

    fn params(&self) -> sys::ublk_params {
        let mut p = sys::ublk_params {
            types: sys::UBLK_PARAM_TYPE_BASIC,
            basic: sys::ublk_param_basic {
                attrs: sys::UBLK_ATTR_VOLATILE_CACHE
                    | sys::UBLK_ATTR_FUA
                    | if self.read_only {
                        sys::UBLK_ATTR_READ_ONLY
                    } else {
                        0
                    },
                logical_bs_shift: self.logical_block_shift,
                physical_bs_shift: self.physical_block_shift,
                io_opt_shift: self.physical_block_shift,
                io_min_shift: self.physical_block_shift,
                max_sectors: self.max_io_bytes >> 9,
                dev_sectors: self.size_bytes >> 9,
                ..Default::default()
            },
            ..Default::default()
        };
        if self.discard {
            p.types |= sys::UBLK_PARAM_TYPE_DISCARD;
            p.discard = sys::ublk_param_discard {
                discard_granularity: match self.discard_granularity {
                    0 => 1 << self.physical_block_shift,
                    g => g,
                },
                max_discard_sectors: u32::MAX >> 9,
                max_write_zeroes_sectors: u32::MAX >> 9,
                max_discard_segments: 1,
                ..Default::default()
            };
        }
        p
    }
}

/// A ublk device served by this process.
pub struct Device<T: Target> {
    // Field order is drop order: queue threads, then the char device, then the control.
    queues: Vec<QueueThread<T::Keepalive>>,
    dev: Option<UblkDev>,
    // Shared with the helper thread that issues STOP_DEV (see `shutdown`).
    ctrl: Arc<UblkCtrl>,
    target: Arc<T>,
    transport: Transport,
    id: u32,
    /// `UBLK_F_*` the kernel granted.
    flags: u64,
    finished: bool,
}

impl<T: Target> std::fmt::Debug for Device<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("id", &self.id)
            .field("transport", &self.transport)
            .field("queues", &self.queues.len())
            .finish()
    }
}

impl<T: Target> Device<T> {
    /// Add, configure and start a new device served by `target`.
    pub fn create(config: &DeviceConfig, target: Arc<T>) -> Result<Device<T>> {
        config.validate()?;
        let features = KernelFeatures::probe()?;
        let transport = transport::negotiate(features, config.transport, &kernel_release())?;
        let batch = config.queue.batch_io.resolve(features, &kernel_release())?;
        let flags = device_flags(transport, features, config.quiesce, batch);
        ensure_ctrl_ring()?;
        let id = config.id.map_or(Ok(-1), raw_dev_id)?;
        let ctrl = UblkCtrl::new(
            Some(config.name.clone()),
            id,
            u32::from(config.queues),
            u32::from(config.depth),
            config.max_io_bytes,
            flags,
            0,
            UblkFlags::UBLK_DEV_F_ADD_DEV,
        )
        .map_err(|e| {
            Error::control(
                "ADD_DEV",
                config.id.map_or("auto".into(), |i| i.to_string()),
                e,
            )
        })?;
        // From here on, dropping `ctrl` deletes the device (libublk's add-mode Drop).
        let info = ctrl.dev_info();
        let dev_id = info.dev_id;
        let granted = Transport::from_dev_flags(info.flags);
        if granted != Some(transport) {
            return Err(Error::Transport(transport::TransportError {
                kernel: kernel_release(),
                missing: if transport == Transport::ZeroCopy {
                    "SUPPORT_ZERO_COPY|AUTO_BUF_REG (not granted at ADD_DEV)"
                } else {
                    "USER_COPY (not granted at ADD_DEV)"
                },
                features: info.flags,
            }));
        }
        if batch && info.flags & sys::UBLK_F_BATCH_IO as u64 == 0 {
            return Err(Error::BatchIo(crate::queue::batch::BatchIoError {
                kernel: kernel_release(),
                features: info.flags,
            }));
        }
        let params = config.params();
        let dev = UblkDev::new(
            config.name.clone(),
            |dev| {
                dev.tgt.dev_size = config.size_bytes;
                dev.tgt.params = params;
                Ok(())
            },
            &ctrl,
        )
        .map_err(|e| Error::control("open char device", dev_id, e))?;
        let device = Self::launch(ctrl, dev, target, transport, &config.queue, Launch::Start)?;
        tracing::info!(dev = dev_id, %transport, batch, flags = format_args!("{:#x}", info.flags), "ublk device started");
        Ok(device)
    }

    /// Starts the queue threads for an opened char device, then sends START_DEV or
    /// END_USER_RECOVERY, which returns once every queue has FETCHed. A failure unwinds as
    /// `how` says: a new device is deleted, a recovered one is left QUIESCED.
    fn launch(
        ctrl: UblkCtrl,
        dev: UblkDev,
        target: Arc<T>,
        transport: Transport,
        queue: &QueueOptions,
        how: Launch,
    ) -> Result<Device<T>> {
        let info = ctrl.dev_info();
        let mut device = Device {
            queues: Vec::new(),
            dev: Some(dev),
            ctrl: Arc::new(ctrl),
            target,
            transport,
            id: info.dev_id,
            flags: info.flags,
            finished: false,
        };
        let started = device
            .start_queues(queue)
            .and_then(|()| device.start(how.step()));
        if let Err(e) = started {
            device.abort_setup(how);
            return Err(e);
        }
        Ok(device)
    }

    /// Reattach a QUIESCED device left by a previous server (same or another process),
    /// serving it with `target`. Waits up to `wait` for the device to reach QUIESCED (the
    /// kernel moves it there after the previous server's char device closes).
    pub fn recover(
        id: u32,
        name: &str,
        target: Arc<T>,
        queue: &QueueOptions,
        wait: Duration,
    ) -> Result<Device<T>> {
        ensure_ctrl_ring()?;
        let ctrl = UblkCtrl::new(
            Some(name.to_string()),
            raw_dev_id(id)?,
            0,
            0,
            0,
            0,
            0,
            UblkFlags::UBLK_DEV_F_RECOVER_DEV,
        )
        .map_err(|e| Error::control("open device for recovery", id, e))?;
        // From here on nothing deletes the device: a failed recover leaves it QUIESCED.
        ctrl.disown();
        let start = Instant::now();
        let deadline = start + wait;
        loop {
            // A transient GET_DEV_INFO failure is retried until the deadline.
            if let Err(e) = ctrl_ok(ctrl.read_dev_info()) {
                if Instant::now() >= deadline {
                    return Err(Error::control("GET_DEV_INFO", id, e));
                }
                tracing::debug!(dev = id, error = %e, "GET_DEV_INFO failed; retrying");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let state = DeviceState::from_raw(ctrl.dev_info().state);
            if state == DeviceState::Quiesced {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::WrongState {
                    dev: id,
                    state: state.to_string(),
                    what: "recover (needs QUIESCED)",
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let info = ctrl.dev_info();
        let transport = Transport::from_dev_flags(info.flags).ok_or_else(|| {
            Error::InvalidConfig(format!(
                "device {id} has neither zero-copy nor USER_COPY (flags {:#x})",
                info.flags
            ))
        })?;
        ctrl_ok(ctrl.start_user_recover())
            .map_err(|e| Error::control("START_USER_RECOVERY", id, e))?;
        let dev = UblkDev::new(name.to_string(), |_| Ok(()), &ctrl)
            .map_err(|e| Error::control("open char device", id, e))?;
        let device = Self::launch(ctrl, dev, target, transport, queue, Launch::Recover)?;
        tracing::info!(dev = id, %transport, ms = millis(start.elapsed()), "ublk device recovered");
        Ok(device)
    }

    fn start_queues(&mut self, opts: &QueueOptions) -> Result<()> {
        let cpus = &opts.cpus;
        let info = self.ctrl.dev_info();
        let cdev = self.dev.as_ref().map_or(-1, |d| d.tgt.fds[0]);
        for q in 0..info.nr_hw_queues {
            let spec = QueueSpec {
                dev_id: self.id,
                queue: q,
                depth: info.queue_depth,
                max_io_bytes: info.max_io_buf_bytes,
                cdev,
                transport: self.transport,
                ioctl_encode: info.flags & sys::UBLK_F_CMD_IOCTL_ENCODE as u64 != 0,
                batch: info.flags & sys::UBLK_F_BATCH_IO as u64 != 0,
                cpu: (!cpus.is_empty()).then(|| cpus[usize::from(q) % cpus.len()]),
                fault_ring_after: opts.fault_ring_after,
            };
            let target = Arc::clone(&self.target);
            let queue = match &opts.pool {
                Some(pool) => pool.spawn_queue(spec, target)?,
                None => spawn_queue(spec, target)?,
            };
            self.queues.push(queue);
        }
        Ok(())
    }

    fn start(&mut self, step: &'static str) -> Result<()> {
        ensure_ctrl_ring()?;
        let res = match self.dev.as_ref() {
            Some(dev) => ctrl_ok(self.ctrl.start_dev(dev)).map(|_| ()),
            None => Ok(()),
        };
        res.map_err(|e| Error::control(step, self.id, e))
    }

    /// Unwind a failed launch: stop queue threads, close the char device, then delete a new
    /// device (bounded) or leave a recovered one QUIESCED for the next attempt.
    fn abort_setup(&mut self, how: Launch) {
        self.finished = true;
        let _ = self.stop_queues();
        self.dev = None;
        match how {
            Launch::Start => {
                if let Err(e) = self.delete(true) {
                    tracing::warn!(dev = self.id, error = %e, "deleting the half-created device failed");
                }
            }
            Launch::Recover => self.ctrl.disown(),
        }
    }

    /// Stop flags + eventfd writes, then a bounded join. Returns the queues that did not exit.
    fn stop_queues(&mut self) -> Vec<u16> {
        for q in &self.queues {
            q.request_stop();
        }
        let deadline = Instant::now() + STOP_JOIN_TIMEOUT;
        let mut stuck = Vec::new();
        for q in &mut self.queues {
            if !q.join_until(deadline) {
                stuck.push(q.queue);
            }
        }
        self.queues.clear();
        stuck
    }

    /// Device id N.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// `/dev/ublkbN`.
    pub fn bdev_path(&self) -> String {
        format!("/dev/ublkb{}", self.id)
    }

    /// `/dev/ublkcN`.
    pub fn cdev_path(&self) -> String {
        format!("/dev/ublkc{}", self.id)
    }

    /// Transport the kernel granted.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The target serving this device.
    pub fn target(&self) -> &Arc<T> {
        &self.target
    }

    /// Handle to queue `q` (for posting work that is not tied to a request).
    pub fn queue_handle(&self, q: u16) -> Option<&QueueHandle<T::Keepalive>> {
        self.queues
            .iter()
            .find(|t| t.queue == q)
            .map(QueueThread::handle)
    }

    /// Fresh info from the kernel (state, flags, params).
    pub fn info(&self) -> Result<DeviceInfo> {
        ensure_ctrl_ring()?;
        self.ctrl
            .read_dev_info()
            .map_err(|e| Error::control("GET_DEV_INFO", self.id, e))?;
        Ok(DeviceInfo::from_ctrl(&self.ctrl))
    }

    /// Stop serving and delete the device (see the module docs for the steps).
    pub fn stop_and_delete(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        ensure_ctrl_ring()?;
        // 1. STOP_DEV on a helper thread: it returns once the kernel got back every request
        //    it handed us, which a target could hold indefinitely (a deferred request stuck
        //    on the network). Past the deadline the queues are stopped anyway: closing their
        //    rings makes the kernel reclaim the held requests, and STOP_DEV then finishes.
        let mut stop = self.ctrl_on_helper("stop", "STOP_DEV", |c| {
            let r = ctrl_ok(c.kill_dev());
            // If we stopped waiting, this handle may be the last one: its Drop must not send
            // a DEL_DEV nobody bounds (the caller deletes through its own bounded helper).
            c.disown();
            r
        });
        let mut stop_dev_done = match &mut stop {
            Ok(helper) => match helper.wait(STOP_DEV_TIMEOUT) {
                Some(res) => {
                    if let Err(e) = res {
                        tracing::warn!(dev = self.id, error = %e, "STOP_DEV failed; stopping queues anyway");
                    }
                    true
                }
                None => {
                    tracing::warn!(dev = self.id, timeout = ?STOP_DEV_TIMEOUT, "STOP_DEV still waiting for requests held by the target; closing the queues");
                    false
                }
            },
            Err(e) => {
                tracing::warn!(dev = self.id, error = %e, "could not spawn the STOP_DEV helper");
                true
            }
        };
        // 2-3. Stop flags, eventfd writes, bounded joins.
        let stuck = self.stop_queues();
        // 4. Close /dev/ublkcN. With the rings gone this is its last reference; on release the
        //    kernel fails (-EIO) whatever the target still held, so a pending STOP_DEV ends.
        self.dev = None;
        if let (false, Ok(helper)) = (stop_dev_done, &mut stop) {
            stop_dev_done = helper.wait(STOP_DEV_TIMEOUT).is_some();
        }
        let del = if stop_dev_done {
            self.delete(stuck.is_empty())
        } else {
            // The helper still holds our control handle's lock; delete through a fresh handle,
            // on a helper thread too (DEL_DEV waits on the device's lock, which the pending
            // STOP_DEV may hold).
            let id = self.id;
            run_on_helper(id, "del", move || {
                let c = crate::ctrl::open_existing(id)?;
                c.disown();
                ctrl_ok(c.del_dev_async())
                    .map(|_| ())
                    .map_err(|e| Error::control("DEL_DEV_ASYNC", id, e))
            })
            .map_err(|e| Error::control("spawn DEL_DEV helper", id, libublk::UblkError::IOError(e)))
            .and_then(|mut h| {
                h.wait(DEL_DEV_TIMEOUT)
                    .unwrap_or(Err(Error::ControlTimeout {
                        step: "DEL_DEV_ASYNC",
                        dev: id,
                        timeout: DEL_DEV_TIMEOUT,
                    }))
            })
        };
        if !stuck.is_empty() {
            return Err(Error::StopTimeout {
                dev: self.id,
                queues: stuck,
            });
        }
        if !stop_dev_done {
            return Err(Error::StopTimeout {
                dev: self.id,
                queues: Vec::new(),
            });
        }
        del
    }

    /// Runs control command `step` against our handle on a helper thread named
    /// `ublkN-{name}`, for a command the kernel may hold for a long time. While the command
    /// runs it holds the handle's lock, so a caller that stops waiting must not touch
    /// `self.ctrl` again.
    fn ctrl_on_helper(
        &self,
        name: &str,
        step: &'static str,
        op: impl FnOnce(&UblkCtrl) -> std::result::Result<i32, libublk::UblkError> + Send + 'static,
    ) -> std::io::Result<CtrlHelper> {
        let ctrl = Arc::clone(&self.ctrl);
        let id = self.id;
        run_on_helper(id, name, move || {
            ensure_ctrl_ring()?;
            op(&ctrl)
                .map(|_| ())
                .map_err(|e| Error::control(step, id, e))
        })
    }

    /// DEL_DEV after STOP_DEV finished, bounded by [`DEL_DEV_TIMEOUT`]: the synchronous
    /// variant waits until the kernel has released the device, the asynchronous one (`sync`
    /// false: a detached queue ring still pins the char device) does not wait.
    fn delete(&self, sync: bool) -> Result<()> {
        let del = move |c: &UblkCtrl| {
            let r = ctrl_ok(if sync { c.del_dev() } else { c.del_dev_async() });
            // The device is gone (or going); keep libublk's Drop from trying again.
            c.disown();
            r
        };
        let mut helper = match self.ctrl_on_helper("del", "DEL_DEV", del) {
            Ok(helper) => helper,
            Err(e) => {
                tracing::warn!(dev = self.id, error = %e, "could not spawn the DEL_DEV helper; deleting inline");
                let r = del(&self.ctrl);
                return r
                    .map(|_| ())
                    .map_err(|e| Error::control("DEL_DEV", self.id, e));
            }
        };
        match helper.wait(DEL_DEV_TIMEOUT) {
            Some(res) => {
                // Also when the helper failed before running DEL_DEV (its lock is free now).
                self.ctrl.disown();
                res
            }
            None => Err(Error::ControlTimeout {
                step: "DEL_DEV",
                dev: self.id,
                timeout: DEL_DEV_TIMEOUT,
            }),
        }
    }

    /// Stop serving but leave the device for a successor: the kernel quiesces it (I/O is
    /// held) until [`Device::recover`] reattaches. The requests this server holds are
    /// answered (deferred ones within the queues' drain budget); any fetched after the stop
    /// flags are parked for the successor (see the module docs). Returns the device id.
    pub fn detach(mut self) -> Result<u32> {
        self.finished = true;
        let start = Instant::now();
        let mut ctrl_free = true;
        if self.flags & sys::UBLK_F_QUIESCE as u64 != 0 && self.quiesce() == Quiesce::Pending {
            ctrl_free = false;
        }
        let quiesced = start.elapsed();
        // Never wait for the kernel to abort every tag (see the module docs): the stop flags
        // end each loop as soon as it has answered what it holds.
        let stuck = self.stop_queues();
        self.dev = None;
        if ctrl_free {
            self.ctrl.disown();
        }
        tracing::info!(
            dev = self.id,
            quiesce_ms = millis(quiesced),
            total_ms = millis(start.elapsed()),
            "ublk device detached"
        );
        if !stuck.is_empty() {
            return Err(Error::StopTimeout {
                dev: self.id,
                queues: stuck,
            });
        }
        Ok(self.id)
    }

    /// QUIESCE_DEV on a helper thread; the queues keep serving meanwhile.
    fn quiesce(&mut self) -> Quiesce {
        let ms = u64::try_from(QUIESCE_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
        let helper = self.ctrl_on_helper("quiesce", "QUIESCE_DEV", move |c| {
            let r = ctrl_ok(c.quiesce_dev(ms));
            // Hand-off never deletes the device, however late this returns.
            c.disown();
            r
        });
        let mut helper = match helper {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(dev = self.id, error = %e, "could not spawn the QUIESCE_DEV helper; using stop flags");
                return Quiesce::Failed;
            }
        };
        match helper.wait(QUIESCE_TIMEOUT + Duration::from_secs(5)) {
            Some(Ok(())) => Quiesce::Done,
            Some(Err(e)) => {
                tracing::warn!(dev = self.id, error = %e, "QUIESCE_DEV failed; using stop flags");
                Quiesce::Failed
            }
            None => {
                tracing::warn!(
                    dev = self.id,
                    "QUIESCE_DEV did not answer; using stop flags"
                );
                Quiesce::Pending
            }
        }
    }
}

/// How a QUIESCE_DEV attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quiesce {
    /// No new request reaches the queues; the idle tags were aborted.
    Done,
    /// The kernel refused or timed out; the helper has returned.
    Failed,
    /// No answer in time: the helper still holds the control handle's lock.
    Pending,
}

/// Whether a launch creates a device or recovers one (what a failure unwinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Launch {
    Start,
    Recover,
}

impl Launch {
    fn step(self) -> &'static str {
        match self {
            Launch::Start => "START_DEV",
            Launch::Recover => "END_USER_RECOVERY",
        }
    }
}

/// The `UBLK_F_*` flags a new device asks for: the transport's, user recovery with reissue
/// (requests in flight when a server dies or hands off go to its successor), QUIESCE_DEV
/// for hand-off and UPDATE_SIZE (online resize; the driver does not check the device's bit,
/// it records the intent), each only where the kernel has it; `UBLK_F_BATCH_IO` when `batch`
/// (already checked against the kernel by [`BatchIo::resolve`](crate::BatchIo::resolve)),
/// and then no QUIESCE (see below).
///
/// Not `UBLK_F_NO_AUTO_PART_SCAN`: libublk 0.4.8 rejects it at ADD_DEV (it is missing from
/// its `UBLK_DRV_F_ALL`). START_DEV therefore scans for partitions and waits for a READ of
/// LBA 0, which the queues (already running) serve: a target whose cold reads are deferred
/// must keep serving them while `create` runs (never block the thread or runtime that
/// finishes deferred requests on `create`).
fn device_flags(transport: Transport, features: KernelFeatures, quiesce: bool, batch: bool) -> u64 {
    let mut flags = transport.dev_flags();
    if batch {
        flags |= sys::UBLK_F_BATCH_IO as u64;
    }
    let mut want = |bit: u64, wanted: bool| {
        if wanted && features.has(bit) {
            flags |= bit;
        }
    };
    let recovery = features.user_recovery();
    want(sys::UBLK_F_USER_RECOVERY as u64, recovery);
    want(sys::UBLK_F_USER_RECOVERY_REISSUE as u64, recovery);
    // Not with BATCH_IO: on 7.3.4 QUIESCE_DEV cancels a batch queue's FETCH by marking the
    // queue force-aborted, which nothing clears, so after the recovery every request fails
    // with EIO (`ublk_batch` `*_handoff_by_quiesce_under_load`). A batch device is handed
    // off with the stop flags, which the module docs describe as the fallback.
    want(sys::UBLK_F_QUIESCE as u64, recovery && quiesce && !batch);
    want(sys::UBLK_F_UPDATE_SIZE as u64, true);
    flags
}

/// Runs `op` on a helper thread named `ublkN-{name}`; the caller waits with a deadline.
fn run_on_helper(
    id: u32,
    name: &str,
    op: impl FnOnce() -> Result<()> + Send + 'static,
) -> std::io::Result<CtrlHelper> {
    let (tx, rx) = mpsc::sync_channel(1);
    let join = std::thread::Builder::new()
        .name(format!("ublk{id}-{name}"))
        .spawn(move || {
            let _ = tx.send(op());
        })?;
    Ok(CtrlHelper {
        rx,
        join: Some(join),
    })
}

/// A control command running on its own thread (see [`Device::ctrl_on_helper`]).
struct CtrlHelper {
    rx: mpsc::Receiver<Result<()>>,
    join: Option<std::thread::JoinHandle<()>>,
}

impl CtrlHelper {
    /// The command's result, or `None` while it still runs after `timeout`. Once the result
    /// is in, also waits for the thread to end (it only drops its per-thread control ring), so
    /// a finished command leaves no fd behind.
    fn wait(&mut self, timeout: Duration) -> Option<Result<()>> {
        let res = self.rx.recv_timeout(timeout).ok()?;
        if let Some(join) = self.join.take() {
            let _ = join.join();
        }
        Some(res)
    }
}

impl<T: Target> Drop for Device<T> {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(dev = self.id, error = %e, "ublk device cleanup on drop failed");
        }
    }
}

/// `d` in whole milliseconds, for log fields.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_ok_from_libublk_is_an_error() {
        // libublk hands -EBUSY back as Ok(-EBUSY) (e.g. QUIESCE_DEV timing out).
        let busy = ctrl_ok(Ok(-libc::EBUSY));
        assert!(
            matches!(busy, Err(libublk::UblkError::UringIOError(e)) if e == -libc::EBUSY),
            "{busy:?}"
        );
        assert!(matches!(ctrl_ok(Ok(0)), Ok(0)));
        assert!(matches!(ctrl_ok(Ok(7)), Ok(7)));
    }
}
