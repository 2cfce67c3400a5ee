//! Starting a queue's loop and awaiting its end: what a queue thread needs ([`QueueSpec`]),
//! how the loop is tied to its owner ([`Wiring`], [`QueueThread`]), the setup that runs on
//! the serving thread ([`setup`]: ring, descriptors, FETCHes), a thread of its own
//! ([`spawn_queue`]) and the signal a pooled loop's end fires ([`ExitSignal`]; the pool
//! itself is `pool.rs`).

use super::engine::{LoopExit, LoopParts, Plane, QueueLoop};
use super::handle::{self, EventFd, QueueHandle};
use super::{batch, cmd, iod, user_copy, zero_copy};
use crate::error::{Error, Result};
use crate::target::Target;
use crate::transport::Transport;
use io_uring::IoUring;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a stopping loop waits for deferred requests to finish (chunks it always waits
/// for: their keepalives must outlive them). What is still deferred then is left to the
/// kernel, which reissues it to the successor; the wait is part of a hand-off's I/O stall
/// when the target is stuck (every tag held: `detach` took 2.0 s with 2 s here).
pub(crate) const DRAIN_BUDGET: Duration = Duration::from_millis(500);

/// Everything a queue thread needs.
#[derive(Debug, Clone)]
pub(crate) struct QueueSpec {
    pub(crate) dev_id: u32,
    pub(crate) queue: u16,
    pub(crate) depth: u16,
    pub(crate) max_io_bytes: u32,
    pub(crate) cdev: RawFd,
    pub(crate) transport: Transport,
    pub(crate) ioctl_encode: bool,
    /// The device has `UBLK_F_BATCH_IO`: PREP / multishot FETCH / COMMIT_IO_CMDS ([`batch`]).
    pub(crate) batch: bool,
    pub(crate) cpu: Option<usize>,
    /// See [`crate::QueueOptions::fault_ring_after`].
    pub(crate) fault_ring_after: Option<u64>,
}

/// A running queue loop, on a thread of its own or in a [`pool::LoopPool`]; `K` is its
/// target's keepalive type.
#[derive(Debug)]
pub(crate) struct QueueThread<K> {
    pub(crate) queue: u16,
    handle: QueueHandle<K>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
    runner: Runner,
}

/// Where a queue loop runs, and how its end is awaited.
pub(crate) enum Runner {
    /// A thread of its own (`None` once joined).
    Thread(Option<JoinHandle<std::io::Result<LoopExit>>>),
    /// A pool thread; the signal fires after the loop's ring is closed.
    Pooled(Arc<ExitSignal>, bool),
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Runner::Thread(j) => write!(f, "Thread(joined: {})", j.is_none()),
            Runner::Pooled(_, ended) => write!(f, "Pooled(ended: {ended})"),
        }
    }
}

impl<K> QueueThread<K> {
    pub(crate) fn handle(&self) -> &QueueHandle<K> {
        &self.handle
    }

    /// Raise the stop flag and wake the loop (does not wait).
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.wake();
    }

    /// Wait until the loop has ended (its ring closed) or `deadline` passed. Returns false
    /// on timeout (a thread of its own is then detached when this value drops; a pooled
    /// loop stays in its pool).
    pub(crate) fn join_until(&mut self, deadline: Instant) -> bool {
        let ended = match &mut self.runner {
            Runner::Thread(join) => {
                let Some(j) = join.take() else {
                    return true;
                };
                while !j.is_finished() {
                    if Instant::now() >= deadline {
                        *join = Some(j);
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                j.join().ok()
            }
            Runner::Pooled(_, true) => return true,
            Runner::Pooled(exit, ended) => {
                let Some(result) = exit.wait_until(deadline) else {
                    return false;
                };
                *ended = true;
                Some(result)
            }
        };
        match ended {
            Some(Ok(exit)) => tracing::debug!(queue = self.queue, ?exit, "queue loop exited"),
            Some(Err(e)) => tracing::error!(queue = self.queue, error = %e, "queue loop failed"),
            None => tracing::error!(queue = self.queue, "queue loop panicked"),
        }
        true
    }
}

/// What ties a queue's loop to its owner and to the threads that finish its deferred
/// requests: the eventfd that wakes it, its stop flag, the handle posts go through, and the
/// loop's end of that channel. Built the same way for a thread of its own and for a pool.
pub(crate) struct Wiring<K> {
    pub(crate) handle: QueueHandle<K>,
    pub(crate) rx: mpsc::Receiver<handle::Posted<K>>,
    pub(crate) wake: Arc<EventFd>,
    pub(crate) stop: Arc<AtomicBool>,
}

impl<K> Wiring<K> {
    pub(crate) fn new(spec: &QueueSpec) -> Result<Wiring<K>> {
        let wake = Arc::new(EventFd::new().map_err(|e| spec.setup_error(e))?);
        let (tx, rx) = mpsc::channel();
        Ok(Wiring {
            handle: QueueHandle::new(tx, Arc::clone(&wake), spec.queue),
            rx,
            wake,
            stop: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The owner's side of this wiring, for a loop that runs as `runner`.
    pub(crate) fn owner(&self, queue: u16, runner: Runner) -> QueueThread<K> {
        QueueThread {
            queue,
            handle: self.handle.clone(),
            wake: Arc::clone(&self.wake),
            stop: Arc::clone(&self.stop),
            runner,
        }
    }
}

impl QueueSpec {
    /// Setting this queue up failed with `source`.
    pub(crate) fn setup_error(&self, source: std::io::Error) -> Error {
        Error::QueueSetup {
            dev: self.dev_id,
            queue: self.queue,
            source,
        }
    }
}

/// Start the thread for one queue; returns once its FETCHes are queued (or setup failed).
pub(crate) fn spawn_queue<T: Target>(
    spec: QueueSpec,
    target: Arc<T>,
) -> Result<QueueThread<T::Keepalive>> {
    let wiring = Wiring::new(&spec)?;
    let mut owner = wiring.owner(spec.queue, Runner::Thread(None));
    let (ready_tx, ready_rx) = mpsc::sync_channel::<std::io::Result<()>>(1);
    let exit_handle = wiring.handle.clone();
    let thread_spec = spec.clone();
    let join = std::thread::Builder::new()
        .name(format!("ublk{}-q{}", spec.dev_id, spec.queue))
        .spawn(move || {
            let lp = match setup(&thread_spec, target, wiring, false) {
                Ok(lp) => lp,
                Err(e) => {
                    let raw = e.raw_os_error();
                    let _ = ready_tx.send(Err(e));
                    return Err(raw.map_or_else(
                        || std::io::Error::other("queue setup failed"),
                        std::io::Error::from_raw_os_error,
                    ));
                }
            };
            let _ = ready_tx.send(Ok(()));
            drop(ready_tx);
            let exit = lp.run(DRAIN_BUDGET);
            // The ring and the slots are gone: deferred tokens of this loop are abandoned.
            exit_handle.mark_exited();
            exit
        })
        .map_err(|e| spec.setup_error(e))?;

    match ready_rx.recv() {
        Ok(Ok(())) => {
            owner.runner = Runner::Thread(Some(join));
            Ok(owner)
        }
        Ok(Err(e)) => {
            let _ = join.join();
            Err(spec.setup_error(e))
        }
        Err(_) => {
            let _ = join.join();
            Err(spec.setup_error(std::io::Error::other("queue thread exited during setup")))
        }
    }
}

/// Runs on the thread that will serve the queue: pin (a thread of its own only), build the
/// ring, map descriptors, queue the FETCHes. `pooled`: a pool thread serves it (the ring
/// also reports deferred completions in its SQ flags, which a pooled turn looks at).
pub(crate) fn setup<T: Target>(
    spec: &QueueSpec,
    target: Arc<T>,
    wiring: Wiring<T::Keepalive>,
    pooled: bool,
) -> std::io::Result<QueueLoop<T>> {
    let Wiring {
        handle,
        rx,
        wake,
        stop,
    } = wiring;
    if !pooled {
        if let Some(cpu) = spec.cpu {
            pin_to_cpu(cpu)?;
        }
        mark_io_flusher();
    }
    let depth = u32::from(spec.depth);
    let mut builder = IoUring::builder();
    builder
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_coop_taskrun()
        .setup_cqsize(depth * 4 + 8);
    if pooled {
        builder.setup_taskrun_flag();
    }
    let ring = builder.build(depth * 2 + 8)?;
    ring.submitter().register_files(&[spec.cdev])?;
    let plane = match spec.transport {
        Transport::ZeroCopy => {
            zero_copy::prepare_ring(&ring, spec.depth)?;
            Plane::ZeroCopy {
                zero: std::fs::File::open("/dev/zero")?,
            }
        }
        Transport::UserCopy => {
            // SAFETY: the device owns `spec.cdev` and keeps it open until every queue thread
            // was joined or detached; this thread is being set up, so it is open now. The
            // borrow only lives for the duplication.
            let cdev = unsafe { BorrowedFd::borrow_raw(spec.cdev) }.try_clone_to_owned()?;
            Plane::UserCopy(user_copy::UserCopy::new(
                cdev,
                spec.queue,
                spec.max_io_bytes,
            ))
        }
    };
    let iod = iod::IodArea::map(spec.cdev, spec.queue, spec.depth)?;
    let enc = cmd::CmdEncoding {
        queue: spec.queue,
        ioctl_encode: spec.ioctl_encode,
        auto_buf_reg: spec.transport == Transport::ZeroCopy,
    };
    let batch = if spec.batch {
        Some(batch::Batch::new(
            spec.queue,
            spec.depth,
            spec.transport == Transport::ZeroCopy,
        )?)
    } else {
        None
    };
    let mut lp = QueueLoop::new(LoopParts {
        ring,
        iod,
        enc,
        plane,
        target,
        depth: spec.depth,
        handle,
        rx,
        wake,
        stop,
        fault_after: spec.fault_ring_after,
        pooled,
        batch,
    });
    lp.arm()?;
    Ok(lp)
}

/// Pin the calling thread to one CPU.
fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `cpu < CPU_SETSIZE` (checked above), so the bit lies inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: passes a live cpu_set_t of the size we state; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Tell the kernel this thread does I/O on behalf of the block layer, so memory reclaim does
/// not recurse into our own device (best effort).
pub(crate) fn mark_io_flusher() {
    const PR_SET_IO_FLUSHER: libc::c_int = 57;
    // SAFETY: prctl with integer arguments only.
    let _ = unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) };
}

/// How a pooled queue's end reaches its owner (`QueueThread::join_until`).
#[derive(Default)]
pub(crate) struct ExitSignal {
    result: Mutex<Option<std::io::Result<LoopExit>>>,
    ended: Condvar,
}

impl ExitSignal {
    pub(crate) fn set(&self, result: std::io::Result<LoopExit>) {
        let mut r = self.result.lock().unwrap_or_else(|p| p.into_inner());
        *r = Some(result);
        self.ended.notify_all();
    }

    /// The loop's end, once it has ended; `None` if it did not by `deadline`.
    pub(crate) fn wait_until(&self, deadline: Instant) -> Option<std::io::Result<LoopExit>> {
        let mut r = self.result.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(result) = r.take() {
                return Some(result);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            r = self
                .ended
                .wait_timeout(r, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}
