//! The target contract: what a block device answers, and how its data moves.
//!
//! The queue loop reads each request from the kernel, describes it as an [`IoDesc`] and
//! calls [`Target::dispatch`] on the queue's own thread. The target answers with a
//! [`Dispatch`]:
//!
//! - [`Dispatch::Inline`]: an [`Action`] to run now, on the loop thread:
//!   - [`Action::Chunks`]: data-plane chunks. A [`Chunk::ReadInto`] moves `len` bytes from
//!     `(file, file_offset)` into the request's buffer at `buf_offset` (serves READ); a
//!     [`Chunk::WriteFrom`] moves them from the request's buffer into the file (serves
//!     WRITE); a [`Chunk::Zeros`] fills part of a READ's buffer with zeroes. The queue
//!     submits every chunk, counts completions per tag, keeps the first error, and commits
//!     the request once all chunks are done: READ/WRITE complete with the request's byte
//!     count, other ops with 0. A short transfer counts as `-EIO`.
//!   - [`Action::Complete`]: complete the request now with this result (bytes or `-errno`).
//!     For READ/WRITE a non-negative result must be the request's full length: anything
//!     else (0 included, which the kernel would requeue forever) completes with `-EIO`.
//!     Completing a READ this way leaves the request buffer as it is (a null device).
//! - [`Dispatch::Deferred`]: the target took a [`Deferred`](crate::Deferred) token from the
//!   [`DispatchCtx`] and will finish the request later from any thread.
//!   The token posts its action through the queue's channel and wakes the loop with an
//!   eventfd; a token dropped unfinished completes the request with `-EIO`.
//!
//! Contracts:
//! - **What may block where.** `dispatch`, `after_read` and `after_write` run on the queue's
//!   loop thread and must never block: no waiting on locks (use `try_*` and defer when
//!   contended), no network, no fsync. Anything that may wait is deferred.
//! - **Who owns the fds.** A file-backed chunk owns a clone of the target's `Arc<File>`
//!   (one atomic increment, no allocation), and the queue keeps a request's chunks until
//!   every one of them completed. So the descriptor the kernel is given is open and names
//!   that file for as long as the kernel may use it: a type-level fact, not a promise of the
//!   target, which may drop its own handle at any time (the queue's drop of the last chunk
//!   then closes the file, on the loop thread, once the kernel is done with it). A
//!   [`Chunk::Zeros`] has no file at all. An owning `Arc` was chosen over `unsafe`
//!   constructors taking a raw fd: the targets keep their files in `Arc`s anyway, so the
//!   guarantee costs an atomic increment per chunk and leaves no `unsafe` in any target.
//! - **Keepalive.** [`Target::Keepalive`] is the target's own type. A keepalive attached to
//!   an action is held by the queue from the moment the action is accepted until
//!   `after_read`/`after_write` ran and the request's COMMIT is queued, i.e. for the whole
//!   time the kernel may move data into or out of the target's file for this request, and
//!   it is handed to those hooks as the target gave it (no downcast). It is dropped on the
//!   loop thread. Use it for what the file's lifetime does not cover: a lock guard (e.g. the
//!   cache's rotation read guard) held across the kernel I/O, a ticket to commit after it.
//! - **Coverage.** The chunks of a READ or WRITE must cover the request exactly: every byte
//!   of `[0, len)` once, no overlaps, nothing outside (checked before any chunk starts). A
//!   READ range that should read as zeroes is covered by a [`Chunk::Zeros`]. A request whose
//!   chunks do not cover it (an empty list included) completes with `-EIO` and no chunk runs:
//!   acknowledging it would leak stale buffer contents (READ) or lose data (WRITE).
//! - **Hooks.** `after_read`/`after_write` run once per READ/WRITE that went through chunks,
//!   after the last chunk completed and before the commit, with the result the queue computed
//!   and mutable access to the keepalive; they return the result to commit.
//! - **FUA.** A WRITE with [`IoDesc::fua`] must be durable when it completes. Chunks land in
//!   the page cache (no `RWF_DSYNC` per chunk), so after `after_write` succeeded and the
//!   keepalive was dropped, the queue calls [`Target::make_durable`]; the target completes at
//!   once when its writes are already durable, or defers (e.g. an fdatasync on another
//!   thread) and completes the token once they are. The loop thread never waits for it.

pub use crate::io::{Action, Chunk, IoDesc, IoOp};
use crate::queue::handle::DispatchCtx;

/// The target's answer to [`Target::dispatch`] (and to the after-write hooks); `K` is the
/// target's [`Target::Keepalive`].
pub enum Dispatch<K = ()> {
    /// Run `action` now on the loop thread, holding `keepalive` until the commit.
    Inline {
        action: Action,
        keepalive: Option<K>,
    },
    /// The target took a [`Deferred`](crate::Deferred) token and finishes later.
    Deferred,
}

impl<K> Dispatch<K> {
    /// Inline action without a keepalive.
    pub fn inline(action: Action) -> Dispatch<K> {
        Dispatch::Inline {
            action,
            keepalive: None,
        }
    }

    /// Complete now with `result`.
    pub fn complete(result: i32) -> Dispatch<K> {
        Dispatch::inline(Action::Complete(result))
    }
}

impl<K> std::fmt::Debug for Dispatch<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dispatch::Inline { action, keepalive } => f
                .debug_struct("Inline")
                .field("action", action)
                .field("keepalive", &keepalive.is_some())
                .finish(),
            Dispatch::Deferred => f.write_str("Deferred"),
        }
    }
}

/// A block device's behaviour. One instance serves every queue of a device (it is shared by
/// the queue threads), so per-queue state belongs behind `io.queue`.
pub trait Target: Send + Sync + 'static {
    /// What the queue holds for one request until it is committed (see the module docs):
    /// the target's own type, handed back to `after_read`/`after_write` as it was given.
    /// `()` for a target that needs none.
    type Keepalive: Send + 'static;

    /// Decide what to do with one request; runs on the loop thread and must not block.
    fn dispatch(
        &self,
        io: &IoDesc,
        ctx: &mut DispatchCtx<'_, Self::Keepalive>,
    ) -> Dispatch<Self::Keepalive>;

    /// After every chunk of a READ completed; returns the result to commit.
    fn after_read(
        &self,
        _io: &IoDesc,
        result: i32,
        _keepalive: Option<&mut Self::Keepalive>,
    ) -> i32 {
        result
    }

    /// After every chunk of a WRITE completed (`result`: the bytes moved, or `-errno`): the
    /// target's commit of the write. The kernel moves no more data for the request, so the
    /// keepalive is the target's now. Runs on the loop thread and must not block: answer
    /// `Dispatch::complete(result)` (the default), or, when committing needs work that may
    /// block (a log write, a lock a slow thread holds), take `ctx.defer()`, move the
    /// keepalive into that work, return [`Dispatch::Deferred`] and complete the token with
    /// the write's result once it is committed. Only `Action::Complete` answers are accepted
    /// (chunks complete with `-EIO`). A FUA write whose answer is success goes on to
    /// [`make_durable`](Target::make_durable).
    fn after_write(
        &self,
        io: &IoDesc,
        result: i32,
        keepalive: Option<Self::Keepalive>,
        ctx: &mut DispatchCtx<'_, Self::Keepalive>,
    ) -> Dispatch<Self::Keepalive> {
        let _ = (io, keepalive, ctx);
        Dispatch::complete(result)
    }

    /// A FUA WRITE landed (`after_write` answered success, the keepalive is gone): make it
    /// durable. Runs on the loop thread and must not block: return
    /// `Dispatch::complete(io.success_result())` when the data already is durable, or take
    /// `ctx.defer()`, return [`Dispatch::Deferred`] and complete the token once it is. Only
    /// `Action::Complete` answers are accepted here (chunks complete with `-EIO`). The
    /// default treats every landed write as durable (memory and null targets).
    fn make_durable(
        &self,
        io: &IoDesc,
        _ctx: &mut DispatchCtx<'_, Self::Keepalive>,
    ) -> Dispatch<Self::Keepalive> {
        Dispatch::complete(io.success_result())
    }
}

impl<T: Target> Target for std::sync::Arc<T> {
    type Keepalive = T::Keepalive;

    fn dispatch(
        &self,
        io: &IoDesc,
        ctx: &mut DispatchCtx<'_, T::Keepalive>,
    ) -> Dispatch<T::Keepalive> {
        (**self).dispatch(io, ctx)
    }
    fn after_read(&self, io: &IoDesc, result: i32, keepalive: Option<&mut T::Keepalive>) -> i32 {
        (**self).after_read(io, result, keepalive)
    }
    fn after_write(
        &self,
        io: &IoDesc,
        result: i32,
        keepalive: Option<T::Keepalive>,
        ctx: &mut DispatchCtx<'_, T::Keepalive>,
    ) -> Dispatch<T::Keepalive> {
        (**self).after_write(io, result, keepalive, ctx)
    }
    fn make_durable(
        &self,
        io: &IoDesc,
        ctx: &mut DispatchCtx<'_, T::Keepalive>,
    ) -> Dispatch<T::Keepalive> {
        (**self).make_durable(io, ctx)
    }
}
