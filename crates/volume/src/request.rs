//! The engine's request protocol: one for every caller. [`Volume::read`] and
//! [`Volume::write`] copy the bytes in memory; the ublk target moves them with the kernel
//! (zero-copy or USER_COPY). Both run the attempts below, so the engine's own tests exercise
//! the code the kernel path runs.
//!
//! An attempt runs on the blocking pool (a gate or a stripe lock never waits for an async
//! worker):
//! 1. enter the cache's gate (read side: a rotation or an eviction may make it wait);
//! 2. plan under it: for a read, where each piece comes from ([`ReadPlan`]); for a write,
//!    prepare it (promote, stripe locks: a [`WriteTicket`]); a write whose blocks were all
//!    promoted turns them Dirty now (`Cache::dirty_early`: the WAL record is written on this
//!    thread, so the commit after the data landed needs no file I/O);
//! 3. if blocks must come from the object store first, drop the gate and fetch them with no
//!    gate held (a rotation waiting for the write side must never wait on the store), then
//!    attempt again;
//! 4. else hand the gate with the plan or ticket to the caller's `serve`, on that blocking
//!    thread, still under the gate: the caller may keep the gate (and the ticket) across
//!    the kernel's I/O.
//!
//! At most [`MAX_ATTEMPTS`] attempts: a block fetched for one attempt can be evicted again
//! before the next, so a request that never settles fails with
//! [`VolumeError::Unsettled`] instead of looping.
//!
//! Fetching: for a read, the fetched bytes are kept and offered to every later attempt (a
//! fill that fails, or an eviction that punched the block again, does not send the read back
//! to the store), and a fetch is joined only when it reads the location the manifest names
//! at the time of the call (see `fetch`): no read gets bytes older than a write completed
//! before it started. For a write, the fetched blocks are filled Clean so the write can
//! promote them ([`Volume::fetch_for_write`]).
//!
//! The callers' non-blocking fast paths (the ublk loop thread's `try_enter`, a plan served
//! inline) are not attempts: they serve at once or start the protocol.
//!
//! [`Volume::serve_write_here`] is the write protocol's first attempt made on a thread the
//! caller already runs on the blocking pool (the ublk target's deferred writes: a promote
//! needs no fetch, so the common deferred write never touches an async worker). It serves,
//! or fails, or hands the state back when the write needs the whole protocol (a fetch):
//! the caller then runs [`Volume::serve_write`], which attempts again from the start.

use bytes::Bytes;
use glidefs_cache::{Cache, Gate, LockMode, ReadPlan, Source, WritePrep, WriteTicket};

use crate::error::VolumeError;
use crate::volume::Volume;

/// Attempts of a read or write whose blocks keep changing under it before it gives up with
/// [`VolumeError::Unsettled`].
pub const MAX_ATTEMPTS: u32 = 16;

/// A read ready to be served: the plan of the request's range made under `gate`, with every
/// remote piece's block fetched.
#[derive(Debug)]
pub struct ReadyRead<'a> {
    /// The gate the plan is valid under; drop it only once the planned bytes were moved.
    pub gate: Gate,
    /// Where each piece comes from.
    pub plan: ReadPlan,
    /// Bytes of the range that were remote at the first attempt (0: a warm read).
    pub first_remote: u64,
    fetched: &'a [(u64, Bytes)],
}

/// One remote piece of a ready read: `bytes` go to the request's buffer at `buf_offset`.
#[derive(Debug, Clone, Copy)]
pub struct RemotePiece<'a> {
    pub buf_offset: u64,
    pub bytes: &'a [u8],
}

impl<'a> ReadyRead<'a> {
    /// The plan's remote pieces with their bytes, in buffer order.
    pub fn remote_pieces(&self) -> Result<Vec<RemotePiece<'a>>, VolumeError> {
        let fetched = self.fetched;
        let mut pieces = Vec::new();
        for seg in self.plan.segments() {
            let Source::Remote { block, within } = seg.source else {
                continue;
            };
            let data = fetched
                .iter()
                .find(|(b, _)| *b == block)
                .map(|(_, d)| d)
                .ok_or(VolumeError::NotFetched { block })?;
            let end = within + seg.len;
            let bytes = usize::try_from(within)
                .ok()
                .zip(usize::try_from(end).ok())
                .and_then(|(a, b)| data.get(a..b))
                .ok_or(VolumeError::ShortBlock {
                    block,
                    got: data.len(),
                    needed: end,
                })?;
            pieces.push(RemotePiece {
                buf_offset: seg.buf_offset,
                bytes,
            });
        }
        Ok(pieces)
    }

    /// Copies the whole planned range into `buf` (local pieces read from the gate's files).
    pub(crate) fn copy_into(&self, cache: &Cache, buf: &mut [u8]) -> Result<(), VolumeError> {
        let fetched: Vec<glidefs_cache::Fetched<'_>> = self
            .fetched
            .iter()
            .map(|(block, data)| glidefs_cache::Fetched {
                block: *block,
                data,
            })
            .collect();
        match cache.copy_planned(&self.gate, &self.plan, buf, &fetched)? {
            glidefs_cache::ReadOutcome::Done => Ok(()),
            glidefs_cache::ReadOutcome::NeedsFetch(blocks) => Err(VolumeError::NotFetched {
                block: blocks.first().copied().unwrap_or(0),
            }),
        }
    }
}

/// A request the protocol gave up on, with the caller's state when it came back (`None`
/// only when the blocking task running an attempt panicked).
#[derive(Debug)]
pub struct Refused<S> {
    pub state: Option<S>,
    pub error: VolumeError,
}

/// What [`Volume::serve_write_here`] came to.
#[derive(Debug)]
pub enum FirstAttempt<S, R> {
    /// `serve` ran.
    Served(R),
    /// The write needs blocks from the object store first: run [`Volume::serve_write`] with
    /// this state (no gate or stripe lock is held any more).
    Protocol(S),
    /// Preparing the write failed.
    Refused(Refused<S>),
}

/// What one attempt came to.
enum Step<S, R> {
    /// `serve` ran: the request is over.
    Served(R),
    /// These blocks must be fetched first.
    Fetch(S, Vec<u64>),
    /// A stripe lock was busy: attempt again.
    Retry(S),
    /// Planning failed.
    Failed(S, VolumeError),
}

/// What fetched blocks are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FetchFor {
    /// Kept and offered to later attempts.
    Read,
    /// Filled Clean (the write promotes them).
    Write,
}

impl Volume {
    /// Runs the read protocol (module docs) for `len` bytes at `offset`: once a plan under a
    /// gate has every remote block fetched, `serve(state, ready)` runs on the blocking pool
    /// and its answer is returned. On failure the state comes back with the error.
    pub async fn serve_read<S, R, F>(
        &self,
        offset: u64,
        len: u64,
        state: S,
        serve: F,
    ) -> Result<R, Refused<S>>
    where
        S: Send + 'static,
        R: Send + 'static,
        F: Fn(S, ReadyRead<'_>) -> R + Send + Sync + 'static,
    {
        let mut first_remote = None;
        self.attempts(
            "read",
            offset,
            FetchFor::Read,
            state,
            move |cache, state, have| {
                let gate = cache.enter();
                let mut plan = ReadPlan::default();
                if let Err(e) = cache.plan_read(&gate, offset, len, &mut plan) {
                    return Step::Failed(state, e.into());
                }
                let remote: u64 = plan
                    .segments()
                    .iter()
                    .filter(|s| matches!(s.source, Source::Remote { .. }))
                    .map(|s| s.len)
                    .sum();
                let first = *first_remote.get_or_insert(remote);
                let mut missing: Vec<u64> = plan
                    .remote_blocks()
                    .filter(|b| !have.iter().any(|(h, _)| h == b))
                    .collect();
                if !missing.is_empty() {
                    missing.dedup();
                    return Step::Fetch(state, missing);
                }
                let ready = ReadyRead {
                    gate,
                    plan,
                    first_remote: first,
                    fetched: have,
                };
                Step::Served(serve(state, ready))
            },
        )
        .await
    }

    /// Runs the write protocol (module docs) for `len` bytes at `offset`: once the write is
    /// prepared under a gate (stripe locks waited for), `serve(state, gate, ticket)` runs on
    /// the blocking pool; the caller moves the data into `gate.active()` at
    /// `ticket.file_offset()` and commits the ticket under that gate
    /// ([`Volume::commit_write`]). On failure the state comes back with the error.
    pub async fn serve_write<S, R, F>(
        &self,
        offset: u64,
        len: u64,
        state: S,
        serve: F,
    ) -> Result<R, Refused<S>>
    where
        S: Send + 'static,
        R: Send + 'static,
        F: Fn(S, Gate, WriteTicket) -> R + Send + Sync + 'static,
    {
        self.attempts(
            "write",
            offset,
            FetchFor::Write,
            state,
            move |cache, state, _| write_attempt(cache, offset, len, state, &serve),
        )
        .await
    }

    /// The first attempt of [`Volume::serve_write`], made here: on a blocking-pool thread
    /// (it waits for the gate and stripe locks, and promotes), never on an async worker.
    pub fn serve_write_here<S, R, F>(
        &self,
        offset: u64,
        len: u64,
        state: S,
        serve: F,
    ) -> FirstAttempt<S, R>
    where
        F: Fn(S, Gate, WriteTicket) -> R,
    {
        match write_attempt(&self.shared.cache, offset, len, state, &serve) {
            Step::Served(r) => FirstAttempt::Served(r),
            Step::Fetch(state, _) | Step::Retry(state) => FirstAttempt::Protocol(state),
            Step::Failed(state, error) => FirstAttempt::Refused(Refused {
                state: Some(state),
                error,
            }),
        }
    }

    /// The plain write of [`Volume::write`] through the protocol: each attempt is the cache's
    /// exclusive plain write (stripe locks of every block across the pwrite, page CRCs from
    /// `data`), under the attempt's gate.
    pub(crate) async fn write_copied(&self, offset: u64, data: Bytes) -> Result<(), VolumeError> {
        let r = self
            .attempts("write", offset, FetchFor::Write, (), move |cache, (), _| {
                let gate = cache.enter();
                match cache.write_with(&gate, offset, &data) {
                    Ok(glidefs_cache::WriteOutcome::Done) => Step::Served(()),
                    Ok(glidefs_cache::WriteOutcome::NeedsFetch(blocks)) => Step::Fetch((), blocks),
                    Err(e) => Step::Failed((), e.into()),
                }
            })
            .await;
        r.map_err(|refused| refused.error)
    }

    /// DISCARD / WRITE_ZEROES: makes `len` bytes at `offset` read as zeros by punching the
    /// cache's active file (`Cache::zero_with`), fetching first a partial block that is only
    /// in the store. Whole blocks so zeroed are published unmapped by the next flush: they
    /// take no space in the store and read with no I/O.
    pub async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        self.shared.check_writable()?;
        let r = self
            .attempts(
                "write zeroes",
                offset,
                FetchFor::Write,
                (),
                move |cache, (), _| {
                    let gate = cache.enter();
                    match cache.zero_with(&gate, offset, len) {
                        Ok(glidefs_cache::WriteOutcome::Done) => Step::Served(()),
                        Ok(glidefs_cache::WriteOutcome::NeedsFetch(blocks)) => {
                            Step::Fetch((), blocks)
                        }
                        Err(e) => Step::Failed((), e.into()),
                    }
                },
            )
            .await;
        r.map_err(|refused| refused.error)
    }

    /// The attempt loop: `attempt(cache, state, fetched)` on the blocking pool, fetches in
    /// between with no gate held, at most [`MAX_ATTEMPTS`] attempts.
    async fn attempts<S, R, A>(
        &self,
        what: &'static str,
        offset: u64,
        fetch_for: FetchFor,
        state: S,
        attempt: A,
    ) -> Result<R, Refused<S>>
    where
        S: Send + 'static,
        R: Send + 'static,
        A: FnMut(&Cache, S, &[(u64, Bytes)]) -> Step<S, R> + Send + 'static,
    {
        let mut attempt = attempt;
        let mut state = state;
        let mut fetched: Vec<(u64, Bytes)> = Vec::new();
        for _ in 0..MAX_ATTEMPTS {
            let cache = self.shared.cache.clone();
            // The closure and the fetched blocks travel into the blocking task and back.
            let ran = tokio::task::spawn_blocking(move || {
                let step = attempt(&cache, state, &fetched);
                (attempt, fetched, step)
            })
            .await;
            let step = match ran {
                Ok((a, f, step)) => {
                    (attempt, fetched) = (a, f);
                    step
                }
                Err(e) => {
                    return Err(Refused {
                        state: None,
                        error: VolumeError::Task(e.to_string()),
                    })
                }
            };
            let blocks = match step {
                Step::Served(r) => return Ok(r),
                Step::Failed(s, error) => {
                    return Err(Refused {
                        state: Some(s),
                        error,
                    })
                }
                Step::Retry(s) => {
                    state = s;
                    continue;
                }
                Step::Fetch(s, blocks) => {
                    state = s;
                    blocks
                }
            };
            let got = match fetch_for {
                FetchFor::Read => self.fetch_blocks(&blocks).await.map(|data| {
                    fetched.extend(blocks.into_iter().zip(data));
                }),
                FetchFor::Write => self.fetch_for_write(&blocks).await,
            };
            if let Err(error) = got {
                return Err(Refused {
                    state: Some(state),
                    error,
                });
            }
        }
        Err(Refused {
            state: Some(state),
            error: VolumeError::Unsettled {
                what,
                offset,
                attempts: MAX_ATTEMPTS,
            },
        })
    }
}

/// One attempt of the write protocol (blocking: gate, stripe locks, promote). A write that
/// promoted every block it turns Dirty publishes them Dirty here (`Cache::dirty_early`): this
/// thread may write the WAL, so the caller's commit then needs no file I/O.
fn write_attempt<S, R, F>(cache: &Cache, offset: u64, len: u64, state: S, serve: &F) -> Step<S, R>
where
    F: Fn(S, Gate, WriteTicket) -> R,
{
    let gate = cache.enter();
    match cache.prepare_write(&gate, offset, len, LockMode::Wait) {
        Ok(WritePrep::Ready(mut ticket)) => match cache.dirty_early(&gate, &mut ticket) {
            Ok(()) => Step::Served(serve(state, gate, ticket)),
            Err(e) => Step::Failed(state, e.into()),
        },
        Ok(WritePrep::NeedsFetch(blocks)) => Step::Fetch(state, blocks),
        Ok(WritePrep::WouldBlock) => Step::Retry(state),
        Err(e) => Step::Failed(state, e.into()),
    }
}

/// The gate-level calls of a caller's non-blocking fast path (the ublk loop thread) and of
/// what it does with a ready plan or ticket. None of them waits for a lock or does file I/O
/// except where said.
impl Volume {
    /// The gate, if no rotation or eviction holds or waits for its write side.
    pub fn try_enter(&self) -> Option<Gate> {
        self.shared.cache.try_enter()
    }

    /// Plans a read of `len` bytes at `offset` under `gate` into `plan` (cleared first).
    pub fn plan_read(
        &self,
        gate: &Gate,
        offset: u64,
        len: u64,
        plan: &mut ReadPlan,
    ) -> glidefs_cache::Result<()> {
        self.shared.cache.plan_read(gate, offset, len, plan)
    }

    /// Prepares a write without waiting: [`WritePrep::WouldBlock`] for a busy stripe lock or
    /// a write that needs file I/O first (then run [`Volume::serve_write`]).
    pub fn try_prepare_write(
        &self,
        gate: &Gate,
        offset: u64,
        len: u64,
    ) -> glidefs_cache::Result<WritePrep> {
        self.shared
            .cache
            .prepare_write(gate, offset, len, LockMode::Try)
    }

    /// Commits a landed write without file I/O, or hands the ticket back
    /// ([`glidefs_cache::Commit::WouldBlock`]) to be committed with [`Volume::commit_write`]
    /// off the loop thread.
    pub fn try_commit_write(
        &self,
        gate: &Gate,
        ticket: WriteTicket,
    ) -> glidefs_cache::Result<glidefs_cache::Commit> {
        self.shared.cache.try_commit_write(gate, ticket)
    }

    /// Commits a write whose bytes landed in `gate.active()` (may write the WAL: blocking).
    pub fn commit_write(&self, gate: &Gate, ticket: WriteTicket) -> glidefs_cache::Result<()> {
        self.shared.cache.commit_write(gate, ticket, None)
    }

    /// The state of `block` (lock-free).
    pub fn block_info(&self, block: u64) -> glidefs_cache::BlockInfo {
        self.shared.cache.block_info(block)
    }

    /// The cache's per-state counters (O(1), lock-free: see `Cache::stats`).
    pub fn cache_stats(&self) -> glidefs_cache::CacheStats {
        self.shared.cache.stats()
    }
}
