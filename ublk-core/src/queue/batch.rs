//! `UBLK_F_BATCH_IO` (Linux 7.0+): the queue talks to the driver with three commands instead
//! of one FETCH / COMMIT_AND_FETCH per tag.
//!
//! - `PREP_IO_CMDS` once at setup: one element per tag (its zero-copy slot = tag), which
//!   makes every tag ready (START_DEV and END_USER_RECOVERY wait for it, as for FETCH).
//! - `FETCH_IO_CMDS`, multishot: the driver writes the tags of new requests (2 bytes each)
//!   into a buffer it picks from the queue's provided-buffer ring ([`FetchRing`]) and posts
//!   one completion per buffer, `IORING_CQE_F_MORE` while the command stays armed. It ends
//!   (no `F_MORE`) with `UBLK_IO_RES_ABORT` (= `-ENODEV`) when STOP_DEV or QUIESCE_DEV
//!   cancels it (also what a FETCH re-armed after them answers), and with another error
//!   (`-ENOBUFS`: no buffer, or the completion could not be posted; the tags go back to the
//!   driver's queue) after which it is armed again. A failed post loses a buffer: the driver
//!   took it from the ring before the post failed, and the ending completion names no buffer.
//!   So before every re-arm the ring is reset ([`FetchRing::reset`]: unregistered, registered
//!   again and refilled); every completion of the ended FETCH was processed by then (a
//!   multishot command posts nothing after its last completion), so we hold no buffer. Endings
//!   with `-ENOBUFS` and no tag between them are counted: logged from
//!   [`ENOBUFS_WARN`] on, and after [`ENOBUFS_RETRIES`] the FETCH is left unarmed.
//! - `COMMIT_IO_CMDS`: the results of a whole turn in one command ([`Commits`]). It answers
//!   how many bytes of elements it handled; it stops at the first element it refuses, so the
//!   rest are sent again and the refused one is dropped (logged). With our transports (no
//!   buffer addresses, tags below the depth) the driver refuses an element only with `-EBUSY`:
//!   the tag is not ours (idle in the driver), so its slot is left as it is. A negative
//!   answer is `-EBUSY` for the first element, or (any other errno: a header `-EINVAL` /
//!   `-E2BIG`, `-EFAULT`, io_uring's `-ENOMEM`, ...) a command that handled nothing: then
//!   every element is sent again, up to [`COMMIT_RETRIES`] times in a row, and then dropped
//!   (logged: those requests never complete).
//!
//! With BATCH_IO the driver refuses FETCH_REQ / COMMIT_AND_FETCH_REQ. Elements are 8 bytes
//! (`struct ublk_elem_header`: tag, buf_index, result) for both our transports: zero-copy's
//! AUTO_BUF_REG slot is `buf_index` (= tag) at PREP and at every COMMIT (the slot of the next
//! request of that tag); USER_COPY needs no buffer address, so `buf_index` is unused.
//!
//! Memory handed to the kernel: the PREP and COMMIT element arrays are read while the command
//! is issued; each stays owned here, unchanged, until its completion is reaped. The fetch
//! ring and its tag buffers are one anonymous mapping registered as the ring's provided
//! buffers: the loop unregisters it before the io_uring closes and unmaps it after (or leaks
//! it if the unregister failed).

use super::cmd::{push, user_data, CqeKind};
use crate::features::KernelFeatures;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use libublk::sys;
use std::sync::atomic::{AtomicU16, Ordering};

/// Whether a new device uses `UBLK_F_BATCH_IO` ([`crate::QueueOptions::batch_io`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BatchIo {
    /// Where the kernel advertises `UBLK_F_BATCH_IO` (GET_FEATURES).
    Auto,
    /// Always; creating a device fails on a kernel without it.
    On,
    /// Never: FETCH_REQ / COMMIT_AND_FETCH_REQ per tag.
    #[default]
    Off,
}

/// `batch_io = On` on a kernel that does not advertise `UBLK_F_BATCH_IO`.
#[derive(Debug, thiserror::Error)]
#[error("batch_io=on but the kernel ({kernel}) lacks UBLK_F_BATCH_IO (Linux 7.0+; features {features:#x})")]
pub struct BatchIoError {
    /// `uname -r`.
    pub kernel: String,
    /// The kernel's feature mask.
    pub features: u64,
}

impl BatchIo {
    /// Whether a device gets BATCH_IO on a kernel with `features` (pure).
    pub fn resolve(self, features: KernelFeatures, kernel: &str) -> Result<bool, BatchIoError> {
        match self {
            BatchIo::Off => Ok(false),
            BatchIo::Auto => Ok(features.batch_io()),
            BatchIo::On if features.batch_io() => Ok(true),
            BatchIo::On => Err(BatchIoError {
                kernel: kernel.to_string(),
                features: features.bits,
            }),
        }
    }

    /// Short name for logs and reports (`auto`, `on`, `off`).
    pub fn name(self) -> &'static str {
        match self {
            BatchIo::Auto => "auto",
            BatchIo::On => "on",
            BatchIo::Off => "off",
        }
    }
}

impl std::fmt::Display for BatchIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes of one PREP / COMMIT element (`struct ublk_elem_header`, no optional fields).
pub(crate) const ELEM_BYTES: usize = 8;
/// Bytes of one fetched tag.
const TAG_BYTES: usize = 2;
/// The most tags the driver copies into one fetch buffer (its `MAX_NR_TAG`).
const MAX_TAGS_PER_BUF: u16 = 128;
/// `IORING_URING_CMD_MULTISHOT` (`sqe->uring_cmd_flags`).
const URING_CMD_MULTISHOT: u32 = 1 << 1;
/// Provided-buffer group of the fetch ring (one per ring: a queue owns its ring).
const FETCH_GROUP: u16 = 0;

/// `struct ublk_batch_io` as the 16-byte command payload.
pub(crate) fn header(queue: u16, nr_elem: u16, elem_bytes: u8) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..2].copy_from_slice(&queue.to_ne_bytes());
    // flags (2..4) stay 0: no buffer address, no zone LBA, no AUTO_BUF_REG fallback.
    h[4..6].copy_from_slice(&nr_elem.to_ne_bytes());
    h[6] = elem_bytes;
    h
}

/// Write element `i` of `buf`: `struct ublk_elem_header { u16 tag; u16 buf_index; s32 result }`.
pub(crate) fn encode_elem(buf: &mut [u8], i: usize, tag: u16, buf_index: u16, result: i32) {
    let e = &mut buf[i * ELEM_BYTES..(i + 1) * ELEM_BYTES];
    e[0..2].copy_from_slice(&tag.to_ne_bytes());
    e[2..4].copy_from_slice(&buf_index.to_ne_bytes());
    e[4..8].copy_from_slice(&result.to_ne_bytes());
}

/// A batch command SQE on fixed file 0 (`/dev/ublkcN`) with `elems` as its element array.
fn batch_sqe(op: u32, queue: u16, elems: &[u8], kind: CqeKind, id: u16) -> squeue::Entry {
    let nr = u16::try_from(elems.len() / ELEM_BYTES).unwrap_or(u16::MAX);
    opcode::UringCmd16::new(types::Fixed(0), op)
        .cmd(header(queue, nr, ELEM_BYTES as u8))
        .addr(Some(elems.as_ptr() as u64))
        .build()
        .user_data(user_data(kind, id))
}

/// The one PREP_IO_CMDS of a queue: every tag, zero-copy slot = tag. `elems` must stay
/// unchanged until the command's completion is reaped.
pub(crate) fn prep_sqe(queue: u16, depth: u16, elems: &mut Vec<u8>) -> squeue::Entry {
    elems.clear();
    elems.resize(usize::from(depth) * ELEM_BYTES, 0);
    for tag in 0..depth {
        encode_elem(elems, usize::from(tag), tag, tag, 0);
    }
    batch_sqe(sys::UBLK_U_IO_PREP_IO_CMDS, queue, elems, CqeKind::Prep, 0)
}

/// The multishot FETCH_IO_CMDS, selecting buffers from the fetch ring's group.
pub(crate) fn fetch_sqe(queue: u16, tags_per_buf: u16) -> squeue::Entry {
    let sqe = opcode::UringCmd16::new(types::Fixed(0), sys::UBLK_U_IO_FETCH_IO_CMDS)
        .cmd(header(queue, tags_per_buf, TAG_BYTES as u8))
        .build()
        .flags(squeue::Flags::BUFFER_SELECT)
        .user_data(user_data(CqeKind::Fetch, 0));
    // io-uring 0.7's UringCmd16 cannot set `uring_cmd_flags` or `buf_group` (its
    // `buf_index` also sets IORING_URING_CMD_FIXED, which the kernel refuses together with
    // MULTISHOT): patch the two fields in the SQE's bytes.
    let mut raw = sqe_bytes(sqe);
    let flags = u32::from_ne_bytes([raw[28], raw[29], raw[30], raw[31]]) | URING_CMD_MULTISHOT;
    raw[28..32].copy_from_slice(&flags.to_ne_bytes());
    raw[40..42].copy_from_slice(&FETCH_GROUP.to_ne_bytes());
    sqe_from_bytes(raw)
}

/// `struct io_uring_sqe` as bytes (offsets: 28 `uring_cmd_flags`, 40 `buf_group`).
fn sqe_bytes(sqe: squeue::Entry) -> [u8; 64] {
    // SAFETY: `squeue::Entry` is `#[repr(C)]` around the 64-byte `struct io_uring_sqe`, a
    // plain C struct without padding, built from zeroed memory: every byte is initialised
    // and the sizes match (checked by `transmute`).
    unsafe { std::mem::transmute::<squeue::Entry, [u8; 64]>(sqe) }
}

fn sqe_from_bytes(raw: [u8; 64]) -> squeue::Entry {
    // SAFETY: the inverse of `sqe_bytes`: any 64 bytes are a valid `struct io_uring_sqe`
    // (integers and unions of integers only).
    unsafe { std::mem::transmute::<[u8; 64], squeue::Entry>(raw) }
}

/// Why a fetch completion could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("fetch completion names buffer {bid}, the ring has {entries}")]
    BadBuffer { bid: u16, entries: u16 },
    #[error("fetch completion of {bytes} bytes: not whole tags or more than a buffer ({max})")]
    BadLength { bytes: i32, max: usize },
}

/// An anonymous mapping the kernel reads (the ring) and writes (the tag buffers); see the
/// module docs for its life.
struct Mapping {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    /// Never unmapped (the buffer ring could not be unregistered).
    leaked: bool,
}

impl Mapping {
    fn new(len: usize) -> std::io::Result<Mapping> {
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(p.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Mapping {
            ptr,
            len,
            leaked: false,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.leaked {
            return;
        }
        // SAFETY: `ptr`/`len` are exactly the mapping made in `new`; the kernel no longer
        // uses it (unregistered before the ring closed, else `leaked`), and no reference
        // into it outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The fetch command's provided-buffer ring: `entries` buffers of `tags_per_buf` tags. Every
/// buffer is in the ring except between the completion that used it and [`FetchRing::give_back`],
/// or, taken for a completion the driver could not post, until [`FetchRing::reset`].
pub(crate) struct FetchRing {
    map: Mapping,
    entries: u16,
    tags_per_buf: u16,
    /// Offset of the first tag buffer (the ring itself is page-rounded before it).
    bufs_at: usize,
    /// Our copy of the ring's tail (the kernel only reads it).
    tail: u16,
    /// Registered with the io_uring (and not yet unregistered).
    registered: bool,
}

/// Bytes of one `struct io_uring_buf` ring entry; entry 0's last 2 bytes are the tail.
const RING_ENTRY_BYTES: usize = 16;

impl FetchRing {
    /// A ring for a queue of `depth` tags. Between two reaps the driver posts at most `depth`
    /// fetch completions (each holds a tag we did not yet commit), so with at least `depth`
    /// buffers, each given back as its completion is processed, the fetch never runs dry.
    pub(crate) fn new(depth: u16) -> std::io::Result<FetchRing> {
        let entries = depth.max(1).checked_next_power_of_two().unwrap_or(32768);
        let tags_per_buf = depth.clamp(1, MAX_TAGS_PER_BUF);
        let ring_bytes = usize::from(entries) * RING_ENTRY_BYTES;
        let bufs_at = ring_bytes.div_ceil(4096) * 4096;
        let len = bufs_at + usize::from(entries) * usize::from(tags_per_buf) * TAG_BYTES;
        Ok(FetchRing {
            map: Mapping::new(len)?,
            entries,
            tags_per_buf,
            bufs_at,
            tail: 0,
            registered: false,
        })
    }

    pub(crate) fn tags_per_buf(&self) -> u16 {
        self.tags_per_buf
    }

    fn buf_bytes(&self) -> usize {
        usize::from(self.tags_per_buf) * TAG_BYTES
    }

    /// Register the ring with `ring` and put every buffer in it (the kernel's head starts
    /// at 0, so our tail does too).
    pub(crate) fn register(&mut self, ring: &IoUring) -> std::io::Result<()> {
        self.tail = 0;
        // SAFETY: offset 14 is inside the mapping and 2-aligned (see `give_back`); the ring
        // is not registered, so the kernel does not read it.
        unsafe { &*self.map.ptr.as_ptr().add(14).cast::<AtomicU16>() }.store(0, Ordering::Release);
        // SAFETY: the mapping is `entries` ring entries long, page-aligned, and lives until
        // it is unregistered (`unregister`) or leaked: the queue loop unregisters it before
        // its io_uring closes and drops this ring after.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                self.map.ptr.as_ptr() as u64,
                self.entries,
                FETCH_GROUP,
                0,
            )
        }?;
        self.registered = true;
        for bid in 0..self.entries {
            self.give_back(bid);
        }
        Ok(())
    }

    /// Give every buffer back after a FETCH ended (see the module docs): unregister from
    /// `ring`, register again, refill. Only while no FETCH is armed. On an unregister failure
    /// the ring stays registered as it was.
    pub(crate) fn reset(&mut self, ring: &IoUring) -> std::io::Result<()> {
        if self.registered {
            ring.submitter().unregister_buf_ring(FETCH_GROUP)?;
            self.registered = false;
        }
        self.register(ring)
    }

    /// Unregister from `ring` (before it closes); on failure the mapping is never unmapped.
    pub(crate) fn unregister(&mut self, ring: &IoUring) {
        if !std::mem::take(&mut self.registered) {
            return;
        }
        if let Err(e) = ring.submitter().unregister_buf_ring(FETCH_GROUP) {
            tracing::error!(error = %e, "unregistering the batch fetch ring failed; leaking it");
            self.map.leaked = true;
        }
    }

    /// Put buffer `bid` back in the ring (after its tags were read).
    pub(crate) fn give_back(&mut self, bid: u16) {
        let mask = self.entries - 1;
        let slot = usize::from(self.tail & mask) * RING_ENTRY_BYTES;
        let addr = self.map.ptr.as_ptr() as u64
            + (self.bufs_at + usize::from(bid) * self.buf_bytes()) as u64;
        let len = u32::try_from(self.buf_bytes()).unwrap_or(u32::MAX);
        let base = self.map.ptr.as_ptr();
        // SAFETY: `slot + 16 <= entries * 16 <= bufs_at <= map.len`, so every write lands in
        // the mapping; fields are written at their natural alignment (the mapping is page
        // aligned, entries are 16 bytes). The 2 bytes at `slot + 14` are not written: for
        // slot 0 they are the ring's tail, which only the store below changes. The kernel
        // reads an entry only after the tail store (release) makes it visible.
        unsafe {
            base.add(slot).cast::<u64>().write(addr);
            base.add(slot + 8).cast::<u32>().write(len);
            base.add(slot + 12).cast::<u16>().write(bid);
        }
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: offset 14 is inside the mapping and 2-aligned; the kernel reads the tail
        // as an acquire load, which this release store pairs with.
        let tail = unsafe { &*base.add(14).cast::<AtomicU16>() };
        tail.store(self.tail, Ordering::Release);
    }

    /// Append to `out` the tags a completion of `bytes` wrote into buffer `bid`. Call once per
    /// completion, before [`give_back`](Self::give_back) of that buffer.
    pub(crate) fn read_tags(
        &self,
        bid: u16,
        bytes: i32,
        out: &mut Vec<u16>,
    ) -> Result<(), FetchError> {
        if bid >= self.entries {
            return Err(FetchError::BadBuffer {
                bid,
                entries: self.entries,
            });
        }
        let n = usize::try_from(bytes).unwrap_or(usize::MAX);
        if n > self.buf_bytes() || n % TAG_BYTES != 0 {
            return Err(FetchError::BadLength {
                bytes,
                max: self.buf_bytes(),
            });
        }
        let start = out.len();
        out.resize(start + n / TAG_BYTES, 0);
        let at = self.bufs_at + usize::from(bid) * self.buf_bytes();
        // SAFETY: `at + n <= map.len` (bid < entries, n <= buf_bytes). The kernel wrote these
        // bytes before posting the completion we reaped (the CQ head load orders them), and
        // writes this buffer again only after `give_back` puts it back in the ring; `out`
        // has room for `n` bytes past `start` (resized above) and does not overlap the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.ptr.as_ptr().add(at),
                out.as_mut_ptr().add(start).cast::<u8>(),
                n,
            );
        }
        Ok(())
    }

    #[cfg(test)]
    fn entry(&self, i: u16) -> (u64, u32, u16) {
        let slot = usize::from(i & (self.entries - 1)) * RING_ENTRY_BYTES;
        // SAFETY: test-only read inside the mapping (see `give_back`).
        unsafe {
            let b = self.map.ptr.as_ptr();
            (
                b.add(slot).cast::<u64>().read(),
                b.add(slot + 8).cast::<u32>().read(),
                b.add(slot + 12).cast::<u16>().read(),
            )
        }
    }

    #[cfg(test)]
    fn kernel_writes(&mut self, bid: u16, tags: &[u16]) {
        let at = self.bufs_at + usize::from(bid) * self.buf_bytes();
        for (i, t) in tags.iter().enumerate() {
            // SAFETY: test-only write inside buffer `bid` (the test keeps `tags` short).
            unsafe {
                self.map
                    .ptr
                    .as_ptr()
                    .add(at + i * TAG_BYTES)
                    .cast::<u16>()
                    .write_unaligned(*t)
            };
        }
    }

    #[cfg(test)]
    fn tail_seen_by_kernel(&self) -> u16 {
        // SAFETY: test-only read of the tail (see `give_back`).
        unsafe { &*self.map.ptr.as_ptr().add(14).cast::<AtomicU16>() }.load(Ordering::Acquire)
    }
}

/// One COMMIT_IO_CMDS element array and what it carries, kept until its completion.
struct CommitBuf {
    elems: Vec<u8>,
    sent: Vec<(u16, i32)>,
    in_flight: bool,
}

/// What a COMMIT_IO_CMDS completion said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CommitDone {
    /// Every element was handled.
    All(usize),
    /// The driver stopped at `refused` (`errno` when it was the first element: then the
    /// result was `-EBUSY`); the elements after it are queued again.
    Partial {
        handled: usize,
        refused: (u16, i32),
        errno: Option<i32>,
        requeued: usize,
    },
    /// The command failed as a whole (`-errno`, nothing handled): every element is queued
    /// again; `attempt` failures in a row so far.
    Failed {
        errno: i32,
        requeued: usize,
        attempt: u32,
    },
    /// The command failed as a whole for the [`COMMIT_RETRIES`]th time in a row: its results
    /// are dropped (those requests never complete).
    Dropped {
        errno: i32,
        results: Vec<(u16, i32)>,
    },
    /// A completion for a buffer with nothing in flight (a bug, logged by the caller).
    Unknown,
}

/// The results of a turn, sent as one COMMIT_IO_CMDS (see the module docs).
pub(crate) struct Commits {
    queue: u16,
    /// The most elements one command may carry (the driver refuses more than the depth).
    max: usize,
    auto_buf_reg: bool,
    pending: Vec<(u16, i32)>,
    bufs: Vec<CommitBuf>,
    /// Commands failed as a whole in a row.
    failures: u32,
}

/// Consecutive COMMIT_IO_CMDS failed as a whole after which their results are dropped.
pub(crate) const COMMIT_RETRIES: u32 = 3;

/// Whether a COMMIT_IO_CMDS answered `res < 0` because the driver refused its first element
/// `first` (`ublk_batch_commit_io`: `-EBUSY`, the tag is not ours; `-EINVAL` for a tag past
/// the depth) rather than because it handled nothing (header checks, copying the elements,
/// io_uring itself). A buffer-address `-EINVAL` cannot happen: our transports send none.
fn element_refused(res: i32, first: (u16, i32), depth: usize) -> bool {
    res == -libc::EBUSY || (res == -libc::EINVAL && usize::from(first.0) >= depth)
}

impl Commits {
    pub(crate) fn new(queue: u16, depth: u16, auto_buf_reg: bool) -> Commits {
        Commits {
            queue,
            max: usize::from(depth.max(1)),
            auto_buf_reg,
            pending: Vec::new(),
            bufs: Vec::new(),
            failures: 0,
        }
    }

    /// Queue `tag`'s result for the next [`flush`](Self::flush).
    pub(crate) fn add(&mut self, tag: u16, result: i32) {
        self.pending.push((tag, result));
    }

    /// Nothing queued and nothing the driver has not answered.
    pub(crate) fn idle(&self) -> bool {
        self.pending.is_empty() && self.bufs.iter().all(|b| !b.in_flight)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.bufs.iter().filter(|b| b.in_flight).count()
    }

    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The SQE that commits everything queued (`None`: nothing queued), and its buffer index
    /// for [`sent`](Self::sent). The elements stay queued until `sent` is called.
    fn prepare(&mut self) -> Option<(usize, squeue::Entry)> {
        if self.pending.is_empty() {
            return None;
        }
        let idx = match self.bufs.iter().position(|b| !b.in_flight) {
            Some(i) => i,
            None => {
                self.bufs.push(CommitBuf {
                    elems: Vec::new(),
                    sent: Vec::new(),
                    in_flight: false,
                });
                self.bufs.len() - 1
            }
        };
        let n = self.pending.len().min(self.max);
        let auto = self.auto_buf_reg;
        let buf = &mut self.bufs[idx];
        buf.elems.clear();
        buf.elems.resize(n * ELEM_BYTES, 0);
        for (i, &(tag, result)) in self.pending[..n].iter().enumerate() {
            // Zero-copy: the next request of this tag is registered at slot = tag again.
            encode_elem(&mut buf.elems, i, tag, if auto { tag } else { 0 }, result);
        }
        let id = u16::try_from(idx).unwrap_or(u16::MAX);
        let sqe = batch_sqe(
            sys::UBLK_U_IO_COMMIT_IO_CMDS,
            self.queue,
            &buf.elems,
            CqeKind::Commit,
            id,
        );
        Some((idx, sqe))
    }

    /// The SQE of `prepare` is queued: its elements are in flight in buffer `idx`.
    fn sent(&mut self, idx: usize) {
        let n = self.bufs[idx].elems.len() / ELEM_BYTES;
        let rest = self.pending.split_off(n);
        self.bufs[idx].sent = std::mem::replace(&mut self.pending, rest);
        self.bufs[idx].in_flight = true;
    }

    /// Queue one COMMIT_IO_CMDS with everything gathered (nothing when there is nothing). On
    /// a refused push the results stay queued for the next flush.
    pub(crate) fn flush(&mut self, ring: &mut IoUring) -> std::io::Result<()> {
        let Some((idx, sqe)) = self.prepare() else {
            return Ok(());
        };
        push(ring, &sqe)?;
        self.sent(idx);
        Ok(())
    }

    /// Completion of the COMMIT in buffer `id` with `res` (bytes handled, or `-errno` when
    /// none was; see the module docs).
    pub(crate) fn done(&mut self, id: u16, res: i32) -> CommitDone {
        let Some(buf) = self.bufs.get_mut(usize::from(id)).filter(|b| b.in_flight) else {
            return CommitDone::Unknown;
        };
        buf.in_flight = false;
        let sent = std::mem::take(&mut buf.sent);
        let Some(&first) = sent.first() else {
            return CommitDone::All(0);
        };
        if res < 0 && !element_refused(res, first, self.max) {
            self.failures += 1;
            if self.failures >= COMMIT_RETRIES {
                self.failures = 0;
                return CommitDone::Dropped {
                    errno: -res,
                    results: sent,
                };
            }
            let requeued = sent.len();
            self.pending.splice(0..0, sent);
            return CommitDone::Failed {
                errno: -res,
                requeued,
                attempt: self.failures,
            };
        }
        self.failures = 0;
        let handled = usize::try_from(res).map_or(0, |b| b / ELEM_BYTES);
        if handled >= sent.len() {
            return CommitDone::All(sent.len());
        }
        let refused = sent[handled];
        let again = &sent[handled + 1..];
        // Sent again before anything gathered since (order does not matter to the driver).
        self.pending.splice(0..0, again.iter().copied());
        CommitDone::Partial {
            handled,
            refused,
            errno: (res < 0).then_some(-res),
            requeued: again.len(),
        }
    }
}

/// Consecutive fetch failures (other than ABORT, without a request between them) after which
/// the fetch is left unarmed: the queue then serves nothing more, like a legacy tag whose
/// FETCH failed (logged).
const FETCH_RETRIES: u32 = 3;

/// Consecutive FETCH endings with `-ENOBUFS` and no tag between them from which each is
/// logged (the driver cannot post: a CQ that stays full or overflowed).
pub(crate) const ENOBUFS_WARN: u32 = 8;
/// ... and after which the FETCH is left unarmed instead of re-armed at once, forever.
pub(crate) const ENOBUFS_RETRIES: u32 = 64;

/// What a fetch completion meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fetched {
    /// Tags were appended; the command is still armed.
    Tags,
    /// The command ended (tags may have been appended too); it is armed again by
    /// [`Batch::rearm`] unless `aborted`.
    Ended { res: i32, aborted: bool },
}

/// A BATCH_IO queue's side of the driver: fetch ring, fetch state, commits.
pub(crate) struct Batch {
    queue: u16,
    depth: u16,
    ring: FetchRing,
    commits: Commits,
    /// The PREP element array, kept until its completion.
    prep: Vec<u8>,
    fetch_armed: bool,
    fetch_aborted: bool,
    fetch_failures: u32,
    /// `-ENOBUFS` endings in a row without a tag between them.
    enobufs: u32,
    /// A FETCH ended without ABORT: reset the ring before it is armed again.
    reset_due: bool,
}

impl Batch {
    pub(crate) fn new(queue: u16, depth: u16, auto_buf_reg: bool) -> std::io::Result<Batch> {
        Ok(Batch {
            queue,
            depth,
            ring: FetchRing::new(depth)?,
            commits: Commits::new(queue, depth, auto_buf_reg),
            prep: Vec::new(),
            fetch_armed: false,
            fetch_aborted: false,
            fetch_failures: 0,
            enobufs: 0,
            reset_due: false,
        })
    }

    /// Register the fetch ring, PREP every tag (waiting for the answer: FETCH is refused
    /// until the queue is ready), then queue the multishot FETCH (submitted by the caller).
    pub(crate) fn arm(&mut self, ring: &mut IoUring) -> std::io::Result<()> {
        self.ring.register(ring)?;
        let prep = prep_sqe(self.queue, self.depth, &mut self.prep);
        push(ring, &prep)?;
        ring.submit_and_wait(1)?;
        // Nothing else is in flight on this ring yet: the completion is the PREP's.
        let res = ring
            .completion()
            .find(|c| c.user_data() == user_data(CqeKind::Prep, 0))
            .map(|c| c.result());
        self.prep = Vec::new();
        match res {
            Some(0) => {}
            Some(r) if r < 0 => return Err(std::io::Error::from_raw_os_error(-r)),
            other => {
                return Err(std::io::Error::other(format!(
                    "PREP_IO_CMDS answered {other:?}"
                )))
            }
        }
        self.rearm(ring)
    }

    /// Queue the multishot FETCH, after resetting the fetch ring when the last one ended (a
    /// failed reset counts as a failed FETCH).
    pub(crate) fn rearm(&mut self, ring: &mut IoUring) -> std::io::Result<()> {
        self.reset_ring(ring)?;
        push(ring, &fetch_sqe(self.queue, self.ring.tags_per_buf()))?;
        self.fetch_armed = true;
        Ok(())
    }

    /// The ring reset [`rearm`](Self::rearm) does when the FETCH ended (see the module docs).
    fn reset_ring(&mut self, ring: &IoUring) -> std::io::Result<()> {
        if !self.reset_due {
            return Ok(());
        }
        if let Err(e) = self.ring.reset(ring) {
            self.fetch_failures += 1;
            tracing::error!(queue = self.queue, error = %e, attempt = self.fetch_failures, "resetting the batch fetch ring failed");
            return Err(e);
        }
        self.reset_due = false;
        Ok(())
    }

    /// The fetch ended, was not aborted, and has not failed too often: arm it again (a
    /// pooled loop's `settle` asks, so that the pool does not sleep with the fetch unarmed).
    pub(crate) fn rearm_due(&self) -> bool {
        !self.fetch_armed
            && !self.fetch_aborted
            && self.fetch_failures < FETCH_RETRIES
            && self.enobufs < ENOBUFS_RETRIES
    }

    /// STOP_DEV or QUIESCE_DEV cancelled the fetch: no new request reaches this queue.
    pub(crate) fn fetch_aborted(&self) -> bool {
        self.fetch_aborted
    }

    /// A FETCH completion: append its tags to `tags` and give its buffer back.
    pub(crate) fn on_fetch(&mut self, res: i32, flags: u32, tags: &mut Vec<u16>) -> Fetched {
        let (buffer, more) = (cqueue::buffer_select(flags), cqueue::more(flags));
        if let Some(bid) = buffer {
            if res > 0 {
                match self.ring.read_tags(bid, res, tags) {
                    Ok(()) => {
                        self.fetch_failures = 0;
                        self.enobufs = 0;
                    }
                    Err(e) => {
                        tracing::error!(queue = self.queue, error = %e, "fetch completion dropped")
                    }
                }
            }
            self.ring.give_back(bid);
        }
        if more {
            return Fetched::Tags;
        }
        self.fetch_armed = false;
        // -ENODEV: also a FETCH re-armed after STOP_DEV / QUIESCE_DEV (`ublk_batch_attach`).
        let aborted = res == sys::UBLK_IO_RES_ABORT;
        if aborted {
            self.fetch_aborted = true;
            return Fetched::Ended { res, aborted };
        }
        // The driver may hold a buffer it took for a completion it could not post.
        self.reset_due = true;
        if res == -libc::ENOBUFS {
            self.enobufs += 1;
            if self.enobufs >= ENOBUFS_RETRIES {
                tracing::error!(
                    queue = self.queue,
                    "batch FETCH ended with ENOBUFS {ENOBUFS_RETRIES} times without a request; left unarmed"
                );
            } else if self.enobufs >= ENOBUFS_WARN {
                tracing::warn!(
                    queue = self.queue,
                    in_a_row = self.enobufs,
                    "batch FETCH keeps ending with ENOBUFS (completion queue full?)"
                );
            }
        } else if res < 0 {
            self.fetch_failures += 1;
            if self.fetch_failures >= FETCH_RETRIES {
                tracing::error!(
                    queue = self.queue,
                    res,
                    "batch FETCH failed {FETCH_RETRIES} times in a row; left unarmed"
                );
            }
        }
        Fetched::Ended { res, aborted }
    }

    /// Queue `tag`'s result for this turn's COMMIT_IO_CMDS.
    pub(crate) fn commit(&mut self, tag: u16, result: i32) {
        self.commits.add(tag, result);
    }

    /// Send the turn's results (see [`Commits::flush`]).
    pub(crate) fn flush(&mut self, ring: &mut IoUring) -> std::io::Result<()> {
        self.commits.flush(ring)
    }

    pub(crate) fn on_commit(&mut self, id: u16, res: i32) -> CommitDone {
        self.commits.done(id, res)
    }

    /// No result waits to be sent or answered.
    pub(crate) fn commits_idle(&self) -> bool {
        self.commits.idle()
    }

    /// COMMIT_IO_CMDS sent and not yet answered. The driver answers one as it is issued, so
    /// a loop that waits for `1 + this` completions sleeps until something else happens (a
    /// fetch, a chunk, a wake-up) instead of waking for its own commit.
    pub(crate) fn commits_in_flight(&self) -> usize {
        self.commits.in_flight()
    }

    /// Results gathered but not yet sent.
    pub(crate) fn commits_pending(&self) -> bool {
        self.commits.pending() > 0
    }

    /// Before the ring closes (see the module docs).
    pub(crate) fn unregister(&mut self, ring: &IoUring) {
        self.ring.unregister(ring);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feats(bits: u64) -> KernelFeatures {
        KernelFeatures { bits }
    }

    #[test]
    fn batch_io_resolves_from_the_kernel_features() {
        let with = feats(sys::UBLK_F_BATCH_IO as u64);
        let without = feats(sys::UBLK_F_USER_COPY as u64);
        assert!(BatchIo::Auto.resolve(with, "7.3").unwrap());
        assert!(!BatchIo::Auto.resolve(without, "6.17").unwrap());
        assert!(!BatchIo::Off.resolve(with, "7.3").unwrap());
        assert!(BatchIo::On.resolve(with, "7.3").unwrap());
        let err = BatchIo::On.resolve(without, "6.17-test").unwrap_err();
        assert!(err.to_string().contains("6.17-test"), "{err}");
    }

    #[test]
    fn header_and_elements_match_the_uapi_layout() {
        let h = header(3, 64, 8);
        assert_eq!(u16::from_ne_bytes([h[0], h[1]]), 3, "q_id");
        assert_eq!(u16::from_ne_bytes([h[2], h[3]]), 0, "flags");
        assert_eq!(u16::from_ne_bytes([h[4], h[5]]), 64, "nr_elem");
        assert_eq!(h[6], 8, "elem_bytes");
        assert!(h[7..].iter().all(|&b| b == 0), "reserved");
        let mut buf = vec![0u8; 16];
        encode_elem(&mut buf, 1, 7, 7, -5);
        assert_eq!(&buf[..8], &[0u8; 8]);
        assert_eq!(u16::from_ne_bytes([buf[8], buf[9]]), 7, "tag");
        assert_eq!(u16::from_ne_bytes([buf[10], buf[11]]), 7, "buf_index");
        assert_eq!(i32::from_ne_bytes([buf[12], buf[13], buf[14], buf[15]]), -5);
    }

    #[test]
    fn prep_lists_every_tag_with_its_own_slot() {
        let mut elems = Vec::new();
        let sqe = prep_sqe(1, 4, &mut elems);
        assert_eq!(elems.len(), 4 * ELEM_BYTES);
        for tag in 0..4u16 {
            let e = &elems[usize::from(tag) * 8..];
            assert_eq!(u16::from_ne_bytes([e[0], e[1]]), tag);
            assert_eq!(u16::from_ne_bytes([e[2], e[3]]), tag);
        }
        let raw = sqe_bytes(sqe);
        assert_eq!(raw[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(
            u32::from_ne_bytes([raw[8], raw[9], raw[10], raw[11]]),
            sys::UBLK_U_IO_PREP_IO_CMDS
        );
        let addr = u64::from_ne_bytes(raw[16..24].try_into().unwrap());
        assert_eq!(addr, elems.as_ptr() as u64);
        assert_eq!(&raw[48..64], &header(1, 4, 8));
    }

    #[test]
    fn fetch_is_multishot_with_buffer_select_and_no_fixed_buffer() {
        let raw = sqe_bytes(fetch_sqe(2, 64));
        assert_eq!(
            u32::from_ne_bytes([raw[8], raw[9], raw[10], raw[11]]),
            sys::UBLK_U_IO_FETCH_IO_CMDS
        );
        let flags = u32::from_ne_bytes([raw[28], raw[29], raw[30], raw[31]]);
        assert_eq!(
            flags, URING_CMD_MULTISHOT,
            "multishot, not IORING_URING_CMD_FIXED"
        );
        assert_eq!(u16::from_ne_bytes([raw[40], raw[41]]), FETCH_GROUP);
        let sqe_flags = raw[1];
        assert_ne!(sqe_flags & squeue::Flags::BUFFER_SELECT.bits(), 0);
        assert_ne!(sqe_flags & squeue::Flags::FIXED_FILE.bits(), 0);
        assert_eq!(&raw[48..64], &header(2, 64, 2));
        assert_eq!(
            u64::from_ne_bytes(raw[32..40].try_into().unwrap()),
            user_data(CqeKind::Fetch, 0)
        );
    }

    #[test]
    fn fetch_ring_hands_out_every_buffer_and_reads_back_tags() {
        let mut r = FetchRing::new(64).unwrap();
        assert_eq!((r.entries, r.tags_per_buf), (64, 64));
        for bid in 0..r.entries {
            r.give_back(bid);
        }
        assert_eq!(r.tail_seen_by_kernel(), 64);
        let base = r.map.ptr.as_ptr() as u64 + r.bufs_at as u64;
        assert_eq!(r.entry(0), (base, 128, 0));
        assert_eq!(r.entry(5), (base + 5 * 128, 128, 5));
        // The kernel fills buffer 5 with three tags and posts 6 bytes.
        r.kernel_writes(5, &[9, 3, 63]);
        let mut tags = vec![1];
        r.read_tags(5, 6, &mut tags).unwrap();
        assert_eq!(tags, vec![1, 9, 3, 63]);
        // Given back, it lands in the next slot (wrapping) and the tail moves on.
        r.give_back(5);
        assert_eq!(r.entry(64), (base + 5 * 128, 128, 5));
        assert_eq!(r.tail_seen_by_kernel(), 65);
        // Bad completions are refused without touching `out`.
        let mut out = Vec::new();
        assert_eq!(
            r.read_tags(64, 2, &mut out),
            Err(FetchError::BadBuffer {
                bid: 64,
                entries: 64
            })
        );
        assert!(matches!(
            r.read_tags(1, 3, &mut out),
            Err(FetchError::BadLength { .. })
        ));
        assert!(matches!(
            r.read_tags(1, 130, &mut out),
            Err(FetchError::BadLength { .. })
        ));
        assert!(out.is_empty());
    }

    #[test]
    fn fetch_ring_sizes_follow_the_depth() {
        let r = FetchRing::new(1000).unwrap();
        assert_eq!((r.entries, r.tags_per_buf), (1024, 128));
        let r = FetchRing::new(1).unwrap();
        assert_eq!((r.entries, r.tags_per_buf), (1, 1));
    }

    #[test]
    fn a_turn_commits_in_one_command_and_partial_commits_are_sent_again() {
        let mut c = Commits::new(0, 64, true);
        assert!(c.idle());
        for (tag, res) in [(4u16, 4096), (9, 512), (1, -5)] {
            c.add(tag, res);
        }
        let (idx, sqe) = c.prepare().unwrap();
        let raw = sqe_bytes(sqe);
        assert_eq!(
            u32::from_ne_bytes([raw[8], raw[9], raw[10], raw[11]]),
            sys::UBLK_U_IO_COMMIT_IO_CMDS
        );
        assert_eq!(&raw[48..64], &header(0, 3, 8));
        let elems = &c.bufs[idx].elems;
        assert_eq!(
            u64::from_ne_bytes(raw[16..24].try_into().unwrap()),
            elems.as_ptr() as u64
        );
        assert_eq!(u16::from_ne_bytes([elems[8], elems[9]]), 9);
        assert_eq!(
            u16::from_ne_bytes([elems[10], elems[11]]),
            9,
            "zero-copy slot = tag"
        );
        c.sent(idx);
        assert_eq!((c.pending(), c.idle(), c.in_flight()), (0, false, 1));
        // Gathered while the first is in flight: a second buffer.
        c.add(2, 0);
        let (idx2, _) = c.prepare().unwrap();
        assert_ne!(idx2, idx);
        c.sent(idx2);
        // The driver handled one element (8 bytes) and refused the second: the third is
        // sent again, the refused one dropped.
        let id = u16::try_from(idx).unwrap();
        assert_eq!(
            c.done(id, 8),
            CommitDone::Partial {
                handled: 1,
                refused: (9, 512),
                errno: None,
                requeued: 1
            }
        );
        assert_eq!(c.pending, vec![(1, -5)]);
        assert_eq!(c.done(id, 8), CommitDone::Unknown, "answered once");
        assert_eq!(c.done(u16::try_from(idx2).unwrap(), 8), CommitDone::All(1));
        // An error result means nothing was handled.
        let (idx3, _) = c.prepare().unwrap();
        c.sent(idx3);
        assert_eq!(
            c.done(u16::try_from(idx3).unwrap(), -libc::EBUSY),
            CommitDone::Partial {
                handled: 0,
                refused: (1, -5),
                errno: Some(libc::EBUSY),
                requeued: 0
            }
        );
        assert!(c.idle());
    }

    #[test]
    fn a_commit_carries_at_most_the_depth() {
        let mut c = Commits::new(0, 2, false);
        for tag in 0..3 {
            c.add(tag, 0);
        }
        let (idx, _) = c.prepare().unwrap();
        assert_eq!(c.bufs[idx].elems.len(), 2 * ELEM_BYTES);
        c.sent(idx);
        assert_eq!(
            c.pending,
            vec![(2, 0)],
            "the third goes with the next command"
        );
    }

    /// Review (rev-batch): the driver can consume a fetch buffer without reporting it.
    /// `io_uring_mshot_cmd_post_cqe` (io_uring/uring_cmd.c) commits the selected buffer
    /// (`io_put_kbuf`: a non-incremental ring's head moves on) before it posts the CQE; when
    /// the post fails (CQ full, or an overflow pending: `io_req_post_cqe` never overflows),
    /// `__ublk_batch_dispatch` puts the tags back in its fifo and `ublk_batch_dispatch` ends
    /// the command through `io_uring_cmd_done(-ENOBUFS)`, whose CQE has cflags 0: no
    /// `IORING_CQE_F_BUFFER`, so `on_fetch` never learns the bid and never gives it back.
    /// Without a reset each such ending loses a buffer for good, until every re-armed FETCH
    /// ends at once. Here a real io_uring plays the driver: a READ that selects a buffer
    /// from the fetch group takes it (its completion is dropped: the failed post), then the
    /// FETCH ends. One round more than there are buffers: every take must still find one.
    #[test]
    fn a_fetch_ended_by_a_failed_post_loses_no_buffer() {
        let Ok(mut ring) = IoUring::new(8) else {
            eprintln!("io_uring unavailable here: skipped");
            return;
        };
        let mut b = Batch::new(0, 4, false).unwrap();
        if let Err(e) = b.ring.register(&ring) {
            eprintln!("buffer rings unavailable here ({e}): skipped");
            return;
        }
        let entries = b.ring.entries;
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let len = u32::try_from(b.ring.buf_bytes()).unwrap();
        for round in 0..=entries {
            // SAFETY: writes 2 bytes from a live array to our pipe.
            let n = unsafe { libc::write(fds[1], [1u8, 2].as_ptr().cast(), 2) };
            assert_eq!(n, 2);
            let take = opcode::Read::new(types::Fd(fds[0]), std::ptr::null_mut(), len)
                .buf_group(FETCH_GROUP)
                .build()
                .flags(squeue::Flags::BUFFER_SELECT)
                .user_data(77);
            // SAFETY: the read selects its buffer from the registered ring (no pointer here).
            unsafe { ring.submission().push(&take) }.unwrap();
            ring.submit_and_wait(1).unwrap();
            let cqe = ring.completion().next().unwrap();
            assert_eq!(
                (cqe.result(), cqueue::buffer_select(cqe.flags()).is_some()),
                (2, true),
                "round {round}: the ring had no buffer left ({})",
                cqe.result()
            );
            let mut tags = Vec::new();
            let fetched = b.on_fetch(-libc::ENOBUFS, 0, &mut tags);
            assert_eq!(
                fetched,
                Fetched::Ended {
                    res: -libc::ENOBUFS,
                    aborted: false
                }
            );
            assert!(b.rearm_due(), "ENOBUFS is re-armed");
            // What `rearm` does before it queues the FETCH again.
            b.reset_ring(&ring).unwrap();
            assert_eq!(b.ring.tail_seen_by_kernel(), entries, "refilled");
        }
        b.ring.unregister(&ring);
        assert!(!b.ring.map.leaked);
        // SAFETY: our pipe's descriptors, closed once.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }

    #[test]
    fn enobufs_endings_without_a_request_are_bounded() {
        let mut b = Batch::new(0, 4, false).unwrap();
        let mut tags = Vec::new();
        for _ in 1..ENOBUFS_RETRIES {
            b.on_fetch(-libc::ENOBUFS, 0, &mut tags);
            assert!(b.rearm_due());
            b.fetch_armed = true;
        }
        // A request in between starts the count again.
        b.ring.kernel_writes(0, &[3]);
        // IORING_CQE_F_BUFFER (bid 0) | IORING_CQE_F_MORE.
        b.on_fetch(2, 1 | 2, &mut tags);
        assert_eq!(tags, vec![3]);
        b.on_fetch(-libc::ENOBUFS, 0, &mut tags);
        assert!(b.rearm_due());
        for _ in 1..ENOBUFS_RETRIES {
            b.on_fetch(-libc::ENOBUFS, 0, &mut tags);
        }
        assert!(
            !b.rearm_due(),
            "left unarmed after {ENOBUFS_RETRIES} in a row"
        );
    }

    /// Review (rev-batch) 5: a FETCH re-armed after an external STOP_DEV is refused with
    /// -ENODEV by `ublk_batch_attach` (queue canceling): that is `UBLK_IO_RES_ABORT`, so the
    /// loop's `all_aborted` sees it and no ring reset or re-arm follows.
    #[test]
    fn a_fetch_refused_with_enodev_is_an_abort() {
        let mut b = Batch::new(0, 4, false).unwrap();
        let mut tags = Vec::new();
        assert_eq!(
            b.on_fetch(-libc::ENODEV, 0, &mut tags),
            Fetched::Ended {
                res: -libc::ENODEV,
                aborted: true
            }
        );
        assert!(b.fetch_aborted() && !b.rearm_due() && !b.reset_due);
    }

    /// Review (rev-batch): a COMMIT_IO_CMDS that fails as a whole (io_uring refused the SQE
    /// before the driver read an element, e.g. -ENOMEM from `io_uring_cmd_prep`'s async data,
    /// or a header error) handled nothing, yet `done` drops the first element as "refused":
    /// that request's result is never sent (a served WRITE never acknowledged; the engine
    /// then marks the tag Unarmed and ignores it), so it hangs until the ring closes.
    #[test]
    fn a_commit_failed_as_a_whole_keeps_every_result() {
        let mut c = Commits::new(0, 64, false);
        c.add(4, 4096);
        c.add(9, 512);
        let (idx, _) = c.prepare().unwrap();
        c.sent(idx);
        let done = c.done(u16::try_from(idx).unwrap(), -libc::ENOMEM);
        assert_eq!(
            c.pending,
            vec![(4, 4096), (9, 512)],
            "the driver handled no element, so every result must be sent again ({done:?})"
        );
    }

    #[test]
    fn whole_commit_failures_are_retried_then_dropped() {
        let mut c = Commits::new(0, 64, false);
        c.add(4, 4096);
        c.add(9, 512);
        let send = |c: &mut Commits| {
            let (idx, _) = c.prepare().unwrap();
            c.sent(idx);
            u16::try_from(idx).unwrap()
        };
        for attempt in 1..COMMIT_RETRIES {
            let id = send(&mut c);
            assert_eq!(
                c.done(id, -libc::EINVAL),
                CommitDone::Failed {
                    errno: libc::EINVAL,
                    requeued: 2,
                    attempt
                },
                "a header -EINVAL (our tags are below the depth) handled nothing"
            );
        }
        let id = send(&mut c);
        assert_eq!(
            c.done(id, -libc::EFAULT),
            CommitDone::Dropped {
                errno: libc::EFAULT,
                results: vec![(4, 4096), (9, 512)]
            }
        );
        assert!(c.idle());
        // A success in between starts the count again.
        c.add(1, 0);
        let id = send(&mut c);
        assert!(matches!(
            c.done(id, -libc::ENOMEM),
            CommitDone::Failed { attempt: 1, .. }
        ));
        let id = send(&mut c);
        assert_eq!(c.done(id, 8), CommitDone::All(1));
        assert_eq!(c.failures, 0);
    }

    /// Only what `ublk_batch_commit_io` answers for one element drops it: -EBUSY (not ours),
    /// -EINVAL for a tag past the depth.
    #[test]
    fn a_negative_commit_refuses_its_first_element_only_for_element_errors() {
        assert!(element_refused(-libc::EBUSY, (3, 0), 64));
        assert!(element_refused(-libc::EINVAL, (64, 0), 64));
        assert!(!element_refused(-libc::EINVAL, (3, 0), 64));
        for errno in [libc::E2BIG, libc::EFAULT, libc::ENOMEM, libc::ECANCELED] {
            assert!(!element_refused(-errno, (3, 0), 64), "{errno}");
        }
    }

    #[test]
    fn user_copy_commits_leave_buf_index_zero() {
        let mut c = Commits::new(1, 64, false);
        c.add(5, 4096);
        let (idx, _) = c.prepare().unwrap();
        let e = &c.bufs[idx].elems;
        assert_eq!(u16::from_ne_bytes([e[0], e[1]]), 5);
        assert_eq!(u16::from_ne_bytes([e[2], e[3]]), 0);
    }
}
