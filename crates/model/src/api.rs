//! The JSON documents of the HTTP API, shared by the server (`api`, `manager`) and the client
//! (`client`, the CLI). Field names are the wire contract documented in `glidefs/API.md`:
//! add fields, never rename or remove them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/volumes` body. Unknown fields are refused (`bad_request`).
///
/// Numeric fields are kept as raw JSON so that a bad value (negative, fractional, a string
/// that is not a size) is reported with its own error code instead of a generic parse error.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// 1..=128 characters of `[A-Za-z0-9._-]`, not `.` or `..`.
    pub name: String,
    /// Bytes: an integer or a size string (`"10G"`). Required unless `attach_existing` finds a
    /// manifest (then the stored size is used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Value>,
    /// Bytes, power of two in 4K..=16M; default from the config (or the stored manifest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<Value>,
    /// ublk queues, 1..=64; default from the config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<Value>,
    /// Requests in flight per queue, 1..=4096; default from the config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<Value>,
    /// Object-store key prefix under which `volumes/<name>/` lives (`tenant-a/prod`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Export the device read-only.
    #[serde(default)]
    pub read_only: bool,
    /// Open the volume when its manifest already exists in the store (else that is
    /// `volume_exists_in_store`).
    #[serde(default)]
    pub attach_existing: bool,
    /// With `attach_existing`: take the volume over from the daemon that owns it (that daemon
    /// is fenced: its next flush fails), instead of failing with `owned_elsewhere`.
    #[serde(default)]
    pub takeover: bool,
    /// `"VOL@SNAP"`: start from snapshot SNAP of volume VOL (same prefix). With `read_only`:
    /// attach the snapshot itself, read-only, as this device (nothing is written to the store);
    /// without: create volume `name` as a writable clone of it (copy on write: nothing is
    /// copied up front). Size and block size come from the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Encrypt the volume at rest with the key in this file (an absolute path the daemon can
    /// read; 64 hexadecimal characters = 32 bytes). The daemon reads it now and at every
    /// start; only the path is kept in its state. Not with `encryption_key_env`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_key_file: Option<String>,
    /// Encrypt the volume at rest with the key in this environment variable of the daemon
    /// (64 hexadecimal characters); only the name is kept. Not with `encryption_key_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_key_env: Option<String>,
    /// What a FLUSH of the device waits for: `local` (default; durable on this host's disk)
    /// or `store` (durable in the object store: a lost host loses no acknowledged write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
    /// Per-volume limits on the device's reads and writes (absent: none). Changed live with
    /// `PUT /v1/volumes/{name}/qos`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosLimits>,
}

/// A volume's QoS limits: token buckets on the device's READ and WRITE requests, per second
/// (`GET`/`PUT /v1/volumes/{name}/qos`, `CreateVolume::qos`). Each bucket absent is no limit.
/// A READ takes one token from `read_iops` and `iops` and its length in bytes from
/// `read_bytes` and `bytes`; a WRITE the same from the write and total buckets. A request the
/// buckets cannot cover waits (it never fails for a limit). FLUSH, DISCARD and WRITE_ZEROES
/// are not limited. Unknown fields are refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosLimits {
    /// READ requests per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<QosLimit>,
    /// WRITE requests per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<QosLimit>,
    /// READ and WRITE requests per second together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<QosLimit>,
    /// Bytes read per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bytes: Option<QosLimit>,
    /// Bytes written per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bytes: Option<QosLimit>,
    /// Bytes read and written per second together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<QosLimit>,
}

impl QosLimits {
    /// The buckets by their wire names, in a fixed order.
    pub fn named(&self) -> [(&'static str, Option<QosLimit>); 6] {
        [
            ("read_iops", self.read_iops),
            ("write_iops", self.write_iops),
            ("iops", self.iops),
            ("read_bytes", self.read_bytes),
            ("write_bytes", self.write_bytes),
            ("bytes", self.bytes),
        ]
    }

    /// Whether no bucket is set.
    pub fn is_empty(&self) -> bool {
        self.named().iter().all(|(_, l)| l.is_none())
    }

    /// The limits checked, with every burst filled in: each rate in `1..=`[`QosLimit::MAX_RATE`],
    /// each burst in `1..=rate * `[`QosLimit::MAX_BURST_SECS`]. The error names the first bucket
    /// at fault.
    pub fn checked(&self) -> Result<QosLimits, QosError> {
        let one =
            |field: &'static str, l: Option<QosLimit>| l.map(|l| l.checked(field)).transpose();
        Ok(QosLimits {
            read_iops: one("read_iops", self.read_iops)?,
            write_iops: one("write_iops", self.write_iops)?,
            iops: one("iops", self.iops)?,
            read_bytes: one("read_bytes", self.read_bytes)?,
            write_bytes: one("write_bytes", self.write_bytes)?,
            bytes: one("bytes", self.bytes)?,
        })
    }
}

/// A QoS limit out of range ([`QosLimits::checked`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid QoS limit {field}: {reason}")]
pub struct QosError {
    /// The bucket's wire name (`write_bytes`).
    pub field: &'static str,
    pub reason: String,
}

/// One token bucket: refilled at `rate` tokens per second, holding at most `burst` tokens
/// (full at the start): up to `burst` requests (or bytes) pass at once after a quiet spell,
/// then `rate` per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosLimit {
    /// Tokens per second, at least 1.
    pub rate: u64,
    /// The bucket's size, at least 1; absent: [`QosLimit::default_burst`] of the rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
}

impl QosLimit {
    /// The burst of a limit that names none: a tenth of a second at the rate, at least 1.
    pub fn default_burst(rate: u64) -> u64 {
        (rate / 10).max(1)
    }

    /// The bucket's size: `burst`, else the default.
    pub fn burst_or_default(&self) -> u64 {
        self.burst.unwrap_or_else(|| Self::default_burst(self.rate))
    }

    /// The largest rate: 2^40 tokens per second (about 1.1 TB/s, or 10^12 requests/s).
    pub const MAX_RATE: u64 = 1 << 40;
    /// The largest burst, in seconds at the rate.
    pub const MAX_BURST_SECS: u64 = 3_600;

    /// This limit of bucket `field` checked (see [`QosLimits::checked`]), its burst filled in.
    pub fn checked(&self, field: &'static str) -> Result<QosLimit, QosError> {
        let bad = |reason: String| QosError { field, reason };
        let max = Self::MAX_RATE;
        if self.rate == 0 || self.rate > max {
            return Err(bad(format!(
                "rate {} must be in 1..={max} per second (leave the limit out for none)",
                self.rate
            )));
        }
        let burst = self.burst_or_default();
        let max_burst = self.rate.saturating_mul(Self::MAX_BURST_SECS);
        if burst == 0 || burst > max_burst {
            return Err(bad(format!(
                "burst {burst} must be in 1..={max_burst} ({} s at the rate {})",
                Self::MAX_BURST_SECS,
                self.rate
            )));
        }
        Ok(QosLimit {
            rate: self.rate,
            burst: Some(burst),
        })
    }
}

/// Where a volume's FLUSH makes writes durable (`CreateVolume::durability`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// This host's disk.
    #[default]
    Local,
    /// The object store (group commit: one upload and publish serve every FLUSH waiting).
    Store,
}

impl Durability {
    /// Parses `local` / `store`.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "local" => Some(Durability::Local),
            "store" => Some(Durability::Store),
            _ => None,
        }
    }

    /// `true` for the default (`local`), which `state.json` leaves out.
    pub fn is_local(&self) -> bool {
        *self == Durability::Local
    }
}

/// Lifecycle state of a volume in the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VolumeState {
    /// Open, its device (if any) serving.
    Running,
    /// Open but fenced: another writer published a newer generation; writes are refused.
    Fenced,
    /// Listed in the daemon's state but could not be opened at start (see `error`).
    Failed,
    /// Listed in the daemon's state; opening it failed because the object store did not
    /// answer. Retried in the background with backoff (`error` has the last failure); it turns
    /// `running` by itself once the store answers (its device then serves, or resumes).
    Recovering,
}

/// The block device of a volume (all `null` without one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// `N` of `/dev/ublkbN`.
    pub id: Option<u32>,
    /// `/dev/ublkbN`.
    pub path: Option<String>,
    /// `zero-copy` or `user-copy`.
    pub transport: Option<String>,
}

/// Flush-to-store figures of a volume.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlushInfo {
    /// Seconds the oldest data not yet in the object store has waited (0 when none).
    pub lag_secs: f64,
    /// Successful flushes (background and requested).
    pub count: u64,
    /// Bytes uploaded by them.
    pub bytes: u64,
    /// Failed flushes.
    pub errors: u64,
    /// FLUSHes that waited for the object store (`durability: store`), and the flushes to the
    /// store that served them (group commit: fewer syncs than FLUSHes under load).
    #[serde(default)]
    pub store_flushes: u64,
    #[serde(default)]
    pub store_syncs: u64,
    /// Unix time (seconds) of the last successful flush.
    pub last_success_unix: Option<u64>,
    /// The last failure's message, cleared by the next success.
    pub last_error: Option<String>,
}

/// Space in the object store of a volume (see docs/engine/space.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpaceInfo {
    /// Bytes of the volume's pack objects: as of the last compaction or GC pass, plus this
    /// daemon's uploads since (0 before the first pass).
    pub stored_bytes: u64,
    /// Bytes of the blocks the latest manifest maps (their compressed frames).
    pub live_bytes: u64,
    /// Blocks the latest manifest maps.
    pub mapped_blocks: u64,
    /// Bytes uploaded (flushes and compaction) since the volume was opened.
    pub uploaded_bytes: u64,
    /// Bytes the guest wrote through the device since it was attached.
    pub guest_written_bytes: u64,
    /// `uploaded_bytes / guest_written_bytes` (`null` before the guest wrote anything).
    pub write_amplification: Option<f64>,
    /// Compaction passes that published, and the bytes they copied.
    pub compactions: u64,
    pub compacted_bytes: u64,
}

/// `GET /v1/volumes/{name}` and the items of `GET /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeInfo {
    pub name: String,
    pub state: VolumeState,
    /// Why the volume is `failed`, `fenced` or `recovering`.
    pub error: Option<String>,
    /// Bytes.
    pub size: u64,
    pub block_size: u32,
    pub queues: u16,
    pub queue_depth: u16,
    pub read_only: bool,
    /// Object-store prefix (`null`: the store root).
    pub prefix: Option<String>,
    /// Local cache directory.
    pub cache_dir: String,
    pub device: DeviceInfo,
    /// Bytes written locally and not yet being flushed.
    pub dirty_bytes: u64,
    /// Bytes being flushed right now (or whose last flush failed).
    pub syncing_bytes: u64,
    /// Bytes of the volume held on local disk (clean + dirty + syncing).
    pub cache_bytes: u64,
    /// Blocks that have a copy in the object store.
    pub remote_blocks: u64,
    /// Generation of the latest manifest loaded or published.
    pub manifest_generation: u64,
    pub fenced: bool,
    /// Blocks fetched from the object store (cold reads, readahead and warm).
    pub cold_reads: u64,
    /// Ranged GETs those fetches made, and the bytes they moved (stored frames).
    #[serde(default)]
    pub store_gets: u64,
    #[serde(default)]
    pub fetched_bytes: u64,
    pub flush: FlushInfo,
    #[serde(default)]
    pub space: SpaceInfo,
    /// `"VOL@SNAP"` when this device is a read-only attachment of a snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Key id (16 hex digits) of the volume's encryption key when it is encrypted at rest and
    /// open; absent otherwise. Never the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_key_id: Option<String>,
    /// What the device's FLUSH waits for (`local` or `store`).
    #[serde(default)]
    pub durability: Durability,
    /// The QoS limits in force (bursts filled in); absent when none is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosLimits>,
    /// The device's requests that waited for a QoS limit since it was attached, and the
    /// seconds they waited in all (absent without a device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttled: Option<ThrottleInfo>,
}

/// `VolumeInfo::throttled`: what the QoS limits held back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ThrottleInfo {
    /// Requests that waited.
    pub requests: u64,
    /// Their waits, summed, in seconds.
    pub seconds: f64,
}

/// `POST /v1/volumes/{name}/warmset/record` body: record the blocks the volume reads from
/// now on, each once in first-read order, for `seconds` or until `max_blocks` are recorded;
/// then they are stored as the volume's warm set (replacing any), which every later attach
/// of the volume, and of a clone made from one of its snapshots afterwards, fetches ahead
/// of the guest. Unknown fields are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordWarmSet {
    /// How long to record, 1..=3600 seconds. Default 60.
    #[serde(default = "RecordWarmSet::default_seconds")]
    pub seconds: u64,
    /// The most blocks to record, 1..=524288. Default 65536.
    #[serde(default = "RecordWarmSet::default_max_blocks")]
    pub max_blocks: u64,
}

impl RecordWarmSet {
    pub const DEFAULT_SECONDS: u64 = 60;
    pub const DEFAULT_MAX_BLOCKS: u64 = 65_536;
    fn default_seconds() -> u64 {
        Self::DEFAULT_SECONDS
    }
    fn default_max_blocks() -> u64 {
        Self::DEFAULT_MAX_BLOCKS
    }
}

impl Default for RecordWarmSet {
    fn default() -> Self {
        Self {
            seconds: Self::DEFAULT_SECONDS,
            max_blocks: Self::DEFAULT_MAX_BLOCKS,
        }
    }
}

/// `GET /v1/volumes/{name}/warmset` (also the answer of recording and dropping): the stored
/// set, the recording in progress, and what this daemon's last recording and warm of the
/// volume did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WarmSetInfo {
    /// The volume's stored warm set; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<StoredWarmSet>,
    /// The recording in progress, if one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recording: Option<WarmRecording>,
    /// How the last recording (since the volume was opened here) ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_recording: Option<WarmRecorded>,
    /// Whether a warm runs now.
    #[serde(default)]
    pub warming: bool,
    /// What the last warm (at the volume's attach here) did, once it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_warm: Option<WarmReportInfo>,
}

/// `WarmSetInfo::stored`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredWarmSet {
    /// Blocks it names.
    pub blocks: u64,
    /// The size of those blocks, in bytes.
    pub block_size: u32,
    /// When its recording ended (seconds since the Unix epoch).
    pub recorded_unix: u64,
    /// How long its recording ran, in seconds.
    pub window_secs: u64,
}

/// `WarmSetInfo::recording`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmRecording {
    pub blocks: u64,
    pub max_blocks: u64,
    pub elapsed_secs: u64,
    pub remaining_secs: u64,
}

/// `WarmSetInfo::last_recording`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmRecorded {
    /// Blocks stored (0 when storing failed).
    pub blocks: u64,
    /// Why the set could not be stored, if it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `WarmSetInfo::last_warm`: what a warm fetched.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmReportInfo {
    /// Blocks the set names.
    pub set_blocks: u64,
    /// Of those, blocks already here (written or cached) or fetched by the guest first.
    pub skipped: u64,
    /// Blocks the warm fetched, and the bytes and ranged GETs that took.
    pub fetched_blocks: u64,
    pub fetched_bytes: u64,
    pub gets: u64,
    /// Blocks left out because the byte budget (`volume_defaults.warm_budget`) was spent.
    pub over_budget: u64,
    /// Blocks whose fetch failed, or whose fill was refused twice (a read of them fetches
    /// them again).
    pub failed: u64,
    pub took_ms: u64,
    /// Why the warm stopped early or did nothing, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// `POST /v1/volumes/{name}/snapshots` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// 1..=128 characters of `[A-Za-z0-9._-]`, not `.` or `..`.
    pub name: String,
}

/// One snapshot (`GET /v1/volumes/{name}/snapshots/{snap}`, the items of the list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotDoc {
    pub volume: String,
    pub name: String,
    /// The manifest generation it freezes.
    pub generation: u64,
    /// When it was taken (Unix seconds).
    pub created_unix: u64,
    pub size: u64,
    pub block_size: u32,
    /// Volumes cloned from it (it cannot be deleted while there are any).
    pub clones: Vec<String>,
    /// A delete started and did not finish (deleting it again completes it).
    pub deleting: bool,
    /// Devices of this daemon attached to it read-only.
    pub attached: Vec<String>,
}

/// `GET /v1/volumes/{name}/snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotDoc>,
}

/// `GET /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeList {
    pub volumes: Vec<VolumeInfo>,
}

/// `POST /v1/volumes/{name}/compact`: one compaction pass, then (unless `gc=false`) one GC
/// pass with the daemon's `[gc]` rules.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompactResult {
    pub name: String,
    /// Packs under the compaction threshold, and those rewritten.
    pub packs_below_threshold: u64,
    pub packs_rewritten: u64,
    /// Live bytes copied into new packs; blocks now in them.
    pub bytes_copied: u64,
    pub blocks_moved: u64,
    /// Generations the pass published (one per new pack), and the last one (`null`: nothing
    /// to do, or it lost a race).
    pub publishes: u64,
    pub generation: Option<u64>,
    /// Packs and bytes the GC pass deleted (0 with `gc=false`).
    pub gc_packs_deleted: u64,
    pub gc_bytes_deleted: u64,
    /// The volume's space afterwards.
    pub stored_bytes: u64,
    pub live_bytes: u64,
    pub duration_ms: u64,
}

/// `POST /v1/volumes/{name}/flush`: what the flush uploaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlushReport {
    pub name: String,
    /// Manifest generation after the flush.
    pub generation: u64,
    pub blocks: u64,
    pub packs: u64,
    pub bytes: u64,
    /// Clean blocks evicted to honour the disk budget.
    pub evicted: u64,
    pub duration_ms: u64,
}

/// `DELETE /v1/volumes/{name}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoveReport {
    pub name: String,
    /// Object-store objects deleted (only with `purge=true`).
    pub purged_objects: u64,
}

/// Every error response: `{"error":{"code":"...","message":"..."}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The stable `code` and a human `message`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

/// `POST /v1/volumes/{name}/resize` body. Unknown fields are refused (`bad_request`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResizeVolume {
    /// The new size in bytes: an integer or a size string (`"20G"`). At least the current
    /// size (a volume only grows; the same size retries a resize whose device step failed)
    /// and a multiple of the block size.
    pub size: Value,
}

/// `POST /v1/volumes/{name}/resize`: the volume, its `state.json` entry and its block device
/// have the new size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResizeReport {
    pub name: String,
    /// Bytes before the call.
    pub previous_size: u64,
    /// Bytes now.
    pub size: u64,
    /// The block device, resized too (`None` when the volume has no device).
    pub device: Option<String>,
}
