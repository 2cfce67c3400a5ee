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
//!
//! [`Volume`]: crate::Volume

use std::time::{Duration, Instant};

use bytes::Bytes;
use glidefs_cache::{Cache, Gate, LockMode, ReadPlan, Source, WritePrep, WriteTicket};

use crate::error::{Result as VResult, VolumeError};
use crate::fetch::FetchedBlock;
use crate::shared::Shared;

/// Attempts of a read or write whose blocks keep changing under it before it gives up with
/// [`VolumeError::Unsettled`].
pub const MAX_ATTEMPTS: u32 = 16;

/// Longest a partial write waits for an eviction of its block to end (see `fetch_for_write`);
/// after that the attempt counts like any other.
const EVICTION_WAIT: Duration = Duration::from_secs(30);

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

/// What [`Volume::serve_write_here`](crate::Volume::serve_write_here) came to.
#[derive(Debug)]
pub enum FirstAttempt<S, R> {
    /// `serve` ran.
    Served(R),
    /// The write needs blocks from the object store first: run
    /// [`Volume::serve_write`](crate::Volume::serve_write) with this state (no gate or
    /// stripe lock is held any more).
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

/// The request protocol over a volume's shared state (see the module docs).
pub(crate) struct Requests<'a> {
    pub(crate) v: &'a Shared,
}

impl Requests<'_> {
    /// [`Volume::serve_read`](crate::Volume::serve_read): see there.
    pub(crate) async fn serve_read<S, R, F>(
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
                if let Err(e) = glidefs_cache::read::plan_read(cache, &gate, offset, len, &mut plan)
                {
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

    /// [`Volume::serve_write`](crate::Volume::serve_write): see there.
    pub(crate) async fn serve_write<S, R, F>(
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

    /// [`Volume::serve_write_here`](crate::Volume::serve_write_here): see there.
    pub(crate) fn serve_write_here<S, R, F>(
        &self,
        offset: u64,
        len: u64,
        state: S,
        serve: F,
    ) -> FirstAttempt<S, R>
    where
        F: Fn(S, Gate, WriteTicket) -> R,
    {
        match write_attempt(&self.v.cache, offset, len, state, &serve) {
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

    /// [`Volume::write_zeroes`](crate::Volume::write_zeroes): see there.
    pub(crate) async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        self.v.check_writable()?;
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

    /// [`Volume::fetch_block`](crate::Volume::fetch_block): see there.
    pub(crate) async fn fetch_block(&self, block: u64) -> VResult<Bytes> {
        Ok(self.fetch_one(block).await?.data)
    }

    async fn fetch_one(&self, block: u64) -> VResult<FetchedBlock> {
        if let Some(f) = &self.v.fetcher.follower {
            // A read-only export: the writer's newer generation, if the last look is old.
            f.tick().await;
        }
        self.v
            .fetcher
            .fetch(block)
            .await
            .map_err(|source| VolumeError::Fetch { block, source })
    }

    /// [`Volume::fetch_for_write`](crate::Volume::fetch_for_write): see there.
    pub(crate) async fn fetch_for_write(&self, blocks: &[u64]) -> VResult<()> {
        let fetched = futures::future::join_all(blocks.iter().map(|&b| self.fetch_one(b))).await;
        for (&block, f) in blocks.iter().zip(fetched) {
            if let Some(source) = f?.fill_error {
                return Err(VolumeError::Fetch { block, source });
            }
        }
        let until = Instant::now() + EVICTION_WAIT;
        while blocks.iter().any(|&b| self.v.cache.eviction_pending(b)) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// Fetches `blocks` concurrently (each as [`Volume::fetch_block`]); the first error wins.
    pub(crate) async fn fetch_blocks(&self, blocks: &[u64]) -> VResult<Vec<Bytes>> {
        futures::future::join_all(blocks.iter().map(|&b| self.fetch_block(b)))
            .await
            .into_iter()
            .collect()
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
            let cache = self.v.cache.clone();
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
