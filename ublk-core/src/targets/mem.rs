//! A RAM disk backed by a memfd that moves data with real chunks, so the transport's data
//! path can be verified end to end.
//!
//! - READ/WRITE: chunks of at most `chunk_bytes` between the memfd (at the device offset)
//!   and the request buffer; with a small `chunk_bytes` one request becomes many chunks,
//!   which exercises per-tag chunk counting.
//! - DISCARD/WRITE_ZEROES: `fallocate(PUNCH_HOLE)`; the range reads back as zeroes.
//! - FLUSH: nothing to make durable (RAM; `fdatasync` is not issued even for a file).
//!
//! Performance note: shmem (memfd, tmpfs) files do not advertise non-blocking I/O to
//! io_uring, so every zero-copy chunk against a memfd is handed to an io_uring worker
//! thread; with 4 KiB requests that hand-off can cost more than the copy it saves. Reads of
//! ext4/xfs/btrfs files run inline; buffered writes run inline only where the filesystem
//! supports async buffered writes (xfs, btrfs; our measurements show ext4 writes handed to
//! workers as well). [`MemTarget::from_file`] serves the same logic over such a file.
//!
//! The memfd is held in an `Arc<File>`; every chunk holds a clone (see [`Chunk`]), so the
//! file stays open until the request's chunks completed even if the target is dropped
//! meanwhile. The target needs no keepalive (`Keepalive = ()`).
//!
//! [`DeferPolicy`] moves requests to a worker thread that finishes them through the
//! deferred path; tests use it to cover the cross-thread hand-back.

use crate::target::{Action, Chunk, Dispatch, IoDesc, IoOp, Target};
use crate::{Deferred, DispatchCtx};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

/// Which requests the mem target finishes from its worker thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeferPolicy {
    /// Everything inline on the loop thread.
    #[default]
    Never,
    /// FLUSH, DISCARD and WRITE_ZEROES deferred (the ops that would block in a real target).
    Slow,
    /// Every request deferred.
    All,
}

/// Options of [`MemTarget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemOptions {
    /// Largest chunk in bytes (a request is split into chunks of at most this size).
    pub chunk_bytes: u32,
    /// Deferral policy.
    pub defer: DeferPolicy,
}

impl Default for MemOptions {
    fn default() -> Self {
        MemOptions {
            chunk_bytes: 1 << 20,
            defer: DeferPolicy::Never,
        }
    }
}

/// Counters, for tests.
#[derive(Debug, Default)]
pub struct MemStats {
    /// READs committed successfully.
    pub reads: AtomicU64,
    /// WRITEs committed successfully.
    pub writes: AtomicU64,
    /// Requests finished through the deferred path.
    pub deferred: AtomicU64,
}

/// memfd-backed RAM disk.
#[derive(Debug)]
pub struct MemTarget {
    file: Arc<File>,
    size: u64,
    opts: MemOptions,
    stats: MemStats,
    worker: Option<mpsc::Sender<Deferred>>,
}

/// Errors creating a mem target.
#[derive(Debug, thiserror::Error)]
#[error("mem target of {size} bytes: {step} failed: {source}")]
pub struct MemError {
    size: u64,
    step: &'static str,
    #[source]
    source: std::io::Error,
}

impl MemTarget {
    /// A zero-filled RAM disk of `size` bytes.
    pub fn new(size: u64, opts: MemOptions) -> Result<Arc<MemTarget>, MemError> {
        let err = |step, source| MemError { size, step, source };
        // SAFETY: the name is a NUL-terminated literal; a non-negative result is a new fd.
        let fd = unsafe { libc::memfd_create(c"ublk-mem".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(err("memfd_create", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size).map_err(|e| err("ftruncate", e))?;
        Self::from_file(file, opts)
    }

    /// The same disk over any readable and writable file (its current length is the
    /// capacity), e.g. a file on ext4/xfs to measure a backing that io_uring can drive
    /// without worker threads (shmem cannot: see the module docs).
    pub fn from_file(file: File, opts: MemOptions) -> Result<Arc<MemTarget>, MemError> {
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let err = |step, source| MemError { size, step, source };
        let (tx, rx) = mpsc::channel::<Deferred>();
        let target = Arc::new(MemTarget {
            file: Arc::new(file),
            size,
            opts,
            stats: MemStats::default(),
            worker: (opts.defer != DeferPolicy::Never).then_some(tx),
        });
        if target.worker.is_some() {
            let weak = Arc::downgrade(&target);
            std::thread::Builder::new()
                .name("ublk-mem-worker".into())
                .spawn(move || {
                    while let Ok(d) = rx.recv() {
                        match weak.upgrade() {
                            Some(t) => {
                                t.stats.deferred.fetch_add(1, Ordering::Relaxed);
                                let io = *d.io();
                                d.finish(t.plan(&io), None);
                            }
                            None => d.complete(-libc::EIO),
                        }
                    }
                })
                .map_err(|e| err("spawning the worker thread", e))?;
        }
        Ok(target)
    }

    /// Capacity in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Counters.
    pub fn stats(&self) -> &MemStats {
        &self.stats
    }

    /// The backing file (for checks from tests).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The action that serves `io`, as `dispatch` answers it inline (no keepalive): for
    /// wrappers in tests that defer or probe requests themselves.
    pub fn plan(&self, io: &IoDesc) -> Action {
        // FLUSH carries no range (its sector field is not meaningful).
        let end = io.offset.checked_add(u64::from(io.len));
        if io.op != IoOp::Flush && end.is_none_or(|e| e > self.size) {
            return Action::Complete(-libc::EINVAL);
        }
        match io.op {
            IoOp::Read | IoOp::Write => {
                let step = self.opts.chunk_bytes.max(512);
                let mut chunks = Vec::with_capacity(io.len.div_ceil(step) as usize);
                let mut done = 0u32;
                while done < io.len {
                    let len = step.min(io.len - done);
                    let off = io.offset + u64::from(done);
                    chunks.push(if io.op == IoOp::Read {
                        Chunk::read_into(&self.file, off, len, done)
                    } else {
                        Chunk::write_from(&self.file, off, len, done)
                    });
                    done += len;
                }
                Action::Chunks(chunks)
            }
            IoOp::Flush => Action::Complete(0),
            IoOp::Discard | IoOp::WriteZeroes => Action::Complete(self.punch(io.offset, io.len)),
        }
    }

    /// What `after_write` does with a landed write (counts it when `result` is a success)
    /// and the result to commit: for wrappers whose keepalive type differs, which cannot
    /// hand their own `DispatchCtx` on.
    pub fn landed(&self, result: i32) -> i32 {
        if result >= 0 {
            self.stats.writes.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    fn punch(&self, offset: u64, len: u32) -> i32 {
        let Ok(off) = libc::off_t::try_from(offset) else {
            return -libc::EINVAL;
        };
        let len = libc::off_t::from(len);
        // SAFETY: fallocate on an fd we own; no memory arguments.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                len,
            )
        };
        if rc == 0 {
            0
        } else {
            -std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        }
    }

    fn should_defer(&self, op: IoOp) -> bool {
        match self.opts.defer {
            DeferPolicy::Never => false,
            DeferPolicy::All => true,
            DeferPolicy::Slow => matches!(op, IoOp::Flush | IoOp::Discard | IoOp::WriteZeroes),
        }
    }
}

impl Target for MemTarget {
    type Keepalive = ();

    fn dispatch(&self, io: &IoDesc, ctx: &mut DispatchCtx<'_>) -> Dispatch {
        if self.should_defer(io.op) {
            if let Some(worker) = &self.worker {
                // `Sender::send` never blocks. A send to a dead worker drops the token, which
                // completes with -EIO.
                let _ = worker.send(ctx.defer());
                return Dispatch::Deferred;
            }
        }
        Dispatch::inline(self.plan(io))
    }

    fn after_read(&self, _io: &IoDesc, result: i32, _keepalive: Option<&mut ()>) -> i32 {
        if result >= 0 {
            self.stats.reads.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    fn after_write(
        &self,
        _io: &IoDesc,
        result: i32,
        _keepalive: Option<()>,
        _ctx: &mut DispatchCtx<'_>,
    ) -> Dispatch {
        Dispatch::complete(self.landed(result))
    }
}
