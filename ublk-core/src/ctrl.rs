//! Control-plane helpers on top of libublk's `UblkCtrl`: device info, listing, deletion,
//! resize.
//!
//! libublk sends control commands through a ring kept per thread; [`ensure_ctrl_ring`]
//! creates it on threads that did not construct the `UblkCtrl` they use, so every function
//! here (and [`Device`](crate::Device)'s methods) may be called from any thread.
//!
//! Note: opening an existing device through libublk (`UblkCtrl::new_simple`) prints
//! "device reload json failed" on stderr when the device has no libublk JSON export, which is
//! the normal case for glidefs devices; it is harmless.

use crate::error::{Error, Result};
use crate::features::KernelFeatures;
use crate::transport::Transport;
use libublk::ctrl::UblkCtrl;
use libublk::sys;

/// libublk returns some command failures (`-EBUSY`) as `Ok(negative)`: make them errors.
pub(crate) fn ctrl_ok(
    res: std::result::Result<i32, libublk::UblkError>,
) -> std::result::Result<i32, libublk::UblkError> {
    match res {
        Ok(r) if r < 0 => Err(libublk::UblkError::UringIOError(r)),
        other => other,
    }
}

/// Kernel state of a ublk device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceState {
    /// Added or stopped; no block device.
    Dead,
    /// Serving I/O.
    Live,
    /// Server gone, I/O held until a successor recovers the device.
    Quiesced,
    /// Server gone, I/O failed until recovery.
    FailIo,
    /// A state this crate does not know.
    Other(u16),
}

impl DeviceState {
    /// From `dev_info.state`.
    pub fn from_raw(state: u16) -> DeviceState {
        match u32::from(state) {
            sys::UBLK_S_DEV_DEAD => DeviceState::Dead,
            sys::UBLK_S_DEV_LIVE => DeviceState::Live,
            sys::UBLK_S_DEV_QUIESCED => DeviceState::Quiesced,
            sys::UBLK_S_DEV_FAIL_IO => DeviceState::FailIo,
            _ => DeviceState::Other(state),
        }
    }
}

impl std::fmt::Display for DeviceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceState::Dead => f.write_str("DEAD"),
            DeviceState::Live => f.write_str("LIVE"),
            DeviceState::Quiesced => f.write_str("QUIESCED"),
            DeviceState::FailIo => f.write_str("FAIL_IO"),
            DeviceState::Other(s) => write!(f, "state-{s}"),
        }
    }
}

/// What the kernel reports about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device id N (`/dev/ublkbN`, `/dev/ublkcN`).
    pub id: u32,
    /// Hardware queues.
    pub queues: u16,
    /// Tags per queue.
    pub depth: u16,
    /// Largest request in bytes.
    pub max_io_bytes: u32,
    /// Logical block size in bytes (0 when params are unavailable).
    pub logical_block_size: u32,
    /// Physical block size in bytes (0 when params are unavailable).
    pub physical_block_size: u32,
    /// Capacity in bytes (0 when params are unavailable).
    pub capacity_bytes: u64,
    /// `UBLK_F_*` flags the device was granted.
    pub flags: u64,
    /// Transport the flags imply.
    pub transport: Option<Transport>,
    /// Kernel state.
    pub state: DeviceState,
    /// Pid of the serving process (as last registered).
    pub owner_pid: i32,
}

impl DeviceInfo {
    /// Block device path.
    pub fn bdev_path(&self) -> String {
        format!("/dev/ublkb{}", self.id)
    }

    /// Whether the device was created with `UBLK_F_USER_RECOVERY`.
    pub fn recoverable(&self) -> bool {
        self.flags & sys::UBLK_F_USER_RECOVERY as u64 != 0
    }

    pub(crate) fn from_ctrl(ctrl: &UblkCtrl) -> DeviceInfo {
        let info = ctrl.dev_info();
        let mut params = sys::ublk_params::default();
        let basic = ctrl.get_params(&mut params).ok().map(|_| params.basic);
        DeviceInfo {
            id: info.dev_id,
            queues: info.nr_hw_queues,
            depth: info.queue_depth,
            max_io_bytes: info.max_io_buf_bytes,
            logical_block_size: basic.map_or(0, |b| 1u32 << b.logical_bs_shift),
            physical_block_size: basic.map_or(0, |b| 1u32 << b.physical_bs_shift),
            capacity_bytes: basic.map_or(0, |b| b.dev_sectors << 9),
            flags: info.flags,
            transport: Transport::from_dev_flags(info.flags),
            state: DeviceState::from_raw(info.state),
            owner_pid: info.ublksrv_pid,
        }
    }
}

/// Make sure this thread has libublk's control ring.
pub(crate) fn ensure_ctrl_ring() -> Result<()> {
    libublk::ublk_init_ctrl_task_ring(|ring| {
        if ring.is_none() {
            *ring = Some(
                io_uring::IoUring::<io_uring::squeue::Entry128>::builder()
                    .build(16)
                    .map_err(libublk::UblkError::IOError)?,
            );
        }
        Ok(())
    })
    .map_err(|e| Error::control("init control ring", "-", e))
}

/// Device id `id` as libublk takes it (an `i32`, where -1 means "let the kernel choose").
pub(crate) fn raw_dev_id(id: u32) -> Result<i32> {
    i32::try_from(id).map_err(|_| Error::InvalidConfig(format!("device id {id} out of range")))
}

/// Open an existing device for control commands.
pub(crate) fn open_existing(id: u32) -> Result<UblkCtrl> {
    ensure_ctrl_ring()?;
    UblkCtrl::new_simple(raw_dev_id(id)?).map_err(|e| Error::control("open device", id, e))
}

/// Current info of device `id`.
pub fn device_info(id: u32) -> Result<DeviceInfo> {
    let ctrl = open_existing(id)?;
    ctrl.read_dev_info()
        .map_err(|e| Error::control("GET_DEV_INFO", id, e))?;
    let info = DeviceInfo::from_ctrl(&ctrl);
    ctrl.disown();
    Ok(info)
}

/// Ids of every ublk device the kernel has (from `/sys/class/ublk-char`).
pub fn list_device_ids() -> Vec<u32> {
    let mut ids: Vec<u32> = std::fs::read_dir("/sys/class/ublk-char")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("ublkc")?.parse().ok())
        .collect();
    ids.sort_unstable();
    ids
}

/// Info of every ublk device (devices that vanish while listing are skipped).
pub fn list_devices() -> Vec<DeviceInfo> {
    list_device_ids()
        .into_iter()
        .filter_map(|id| device_info(id).ok())
        .collect()
}

/// Stop (if live) and delete device `id`, e.g. one left behind by a dead process.
pub fn delete_device(id: u32) -> Result<()> {
    let ctrl = open_existing(id)?;
    // Stopping a device that is not live fails harmlessly; deletion is what matters.
    let _ = ctrl.kill_dev();
    let res = ctrl
        .del_dev()
        .map(|_| ())
        .map_err(|e| Error::control("DEL_DEV", id, e));
    ctrl.disown();
    res
}

/// Why a device's capacity could not be changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResizeError {
    /// The driver does not advertise `UBLK_F_UPDATE_SIZE` (Linux 6.16+): nothing was sent.
    #[error("the kernel's ublk driver (kernel {kernel}) has no UPDATE_SIZE (needs Linux 6.16+): device {dev} keeps its size")]
    Unsupported { dev: u32, kernel: String },
    /// The size is not a whole number of 512-byte sectors, or is zero.
    #[error("device {dev}: capacity {size} bytes must be a non-zero multiple of 512")]
    BadSize { dev: u32, size: u64 },
    /// Probing the features, opening the device or the command itself failed.
    #[error(transparent)]
    Ublk(#[from] Error),
}

/// Sets the capacity of started device `id` to `size_bytes` with UPDATE_SIZE: the block device
/// (`/dev/ublkbN`) takes the new size at once while I/O goes on, and the kernel keeps it across
/// a user recovery. Refused before anything is sent when the driver lacks
/// `UBLK_F_UPDATE_SIZE` ([`ResizeError::Unsupported`]; libublk sends the command whatever the
/// device's flags say, so the driver's features decide). The kernel does not care whether the
/// size grows or shrinks: callers that must never shrink check that themselves. Blocking
/// (one control command; it does not wait for I/O).
pub fn update_size(id: u32, size_bytes: u64) -> std::result::Result<(), ResizeError> {
    if size_bytes == 0 || !size_bytes.is_multiple_of(512) {
        return Err(ResizeError::BadSize {
            dev: id,
            size: size_bytes,
        });
    }
    if !KernelFeatures::probe().map_err(Error::from)?.update_size() {
        return Err(ResizeError::Unsupported {
            dev: id,
            kernel: crate::features::kernel_release(),
        });
    }
    let ctrl = open_existing(id)?;
    let res = ctrl_ok(ctrl.update_size(size_bytes))
        .map(|_| ())
        .map_err(|e| Error::control("UPDATE_SIZE", id, e));
    ctrl.disown();
    Ok(res?)
}
