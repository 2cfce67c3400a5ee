//! A queue loop without a kernel, for a target's own tests.
//!
//! [`Harness::run`] takes one request through a [`Target`] the way the queue loop does, on
//! the calling thread (which stands in for the loop thread): `dispatch`, the chunks (checked
//! like the loop checks them, then moved with pread/pwrite between the named files and the
//! request's buffer), `after_read` / `after_write`, and `make_durable` for a successful FUA
//! write. Whenever the target defers, the harness waits for the token's answer, as the loop
//! does between completions. No ring, no zero-copy: what it checks is the target's side of
//! the contract (which thread does what, which results come back), not the transport's.

use std::os::unix::fs::FileExt;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::queue::engine::{check_chunks, complete_result};
use crate::queue::handle::{EventFd, Posted};
use crate::target::{Action, Chunk, Dispatch, IoDesc, IoOp, Target};
use crate::{DispatchCtx, QueueHandle};

/// How long [`Harness::run`] waits for a deferred answer before it fails the request.
pub const DEFERRED_WAIT: Duration = Duration::from_secs(60);

/// One queue's loop, driven by hand (see the module docs), for targets whose keepalive type
/// is `K`.
pub struct Harness<K = ()> {
    handle: QueueHandle<K>,
    rx: mpsc::Receiver<Posted<K>>,
    seq: u32,
}

impl<K> std::fmt::Debug for Harness<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("handle", &self.handle)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

/// Why a request did not complete the way the loop would have completed it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum HarnessError {
    #[error("the target deferred request tag {tag} without taking a token")]
    NoToken { tag: u16 },
    #[error("no answer to deferred request tag {tag} within {DEFERRED_WAIT:?}")]
    NoAnswer { tag: u16 },
    #[error("the target answered a landed write (tag {tag}) with chunks")]
    ChunksForLandedWrite { tag: u16 },
    #[error("the chunks of request tag {tag} were refused (errno {errno})")]
    BadChunks { tag: u16, errno: i32 },
    #[error("chunk {chunk:?} of request tag {tag} failed: {error}")]
    Chunk {
        tag: u16,
        chunk: Chunk,
        error: String,
    },
}

impl<K> Default for Harness<K> {
    fn default() -> Self {
        Harness::new(0)
    }
}

impl<K> Harness<K> {
    /// A loop for queue `queue`.
    pub fn new(queue: u16) -> Harness<K> {
        let (tx, rx) = mpsc::channel();
        let wake = Arc::new(EventFd::new().expect("eventfd for the test harness"));
        Harness {
            handle: QueueHandle::new(tx, wake, queue),
            rx,
            seq: 0,
        }
    }

    /// Runs `io` to its final result (bytes, 0 or `-errno`): `buf` is the request's data
    /// (the source of a WRITE, the destination of a READ; `io.len` bytes).
    pub fn run<T: Target<Keepalive = K>>(
        &mut self,
        target: &T,
        io: IoDesc,
        buf: &mut [u8],
    ) -> Result<i32, HarnessError> {
        self.seq = self.seq.wrapping_add(1);
        let mut ctx = DispatchCtx::new(&self.handle, io, self.seq);
        let answer = target.dispatch(&io, &mut ctx);
        let (action, keepalive) = self.answer(answer, ctx.took_deferred(), io)?;
        let chunks = match action {
            Action::Complete(res) => return Ok(complete_result(&io, res)),
            Action::Chunks(chunks) => chunks,
        };
        run_chunks(&io, &chunks, buf)?;
        let mut keepalive = keepalive;
        let result = io.success_result();
        match io.op {
            IoOp::Read => {
                let r = target.after_read(&io, result, keepalive.as_mut());
                Ok(complete_result(&io, r))
            }
            IoOp::Write => self.land_write(target, io, result, keepalive),
            _ => Ok(result),
        }
    }

    /// The end of a WRITE whose chunks finished with `result` (a failed or short transfer
    /// can be fed here): `after_write` with `keepalive`, then `make_durable` for a
    /// successful FUA write, each waited for when deferred. The request must be the last
    /// one [`run`](Harness::run) dispatched, or one made with [`Harness::next`].
    pub fn land_write<T: Target<Keepalive = K>>(
        &mut self,
        target: &T,
        io: IoDesc,
        result: i32,
        keepalive: Option<K>,
    ) -> Result<i32, HarnessError> {
        let r = self.landed(io, |ctx| target.after_write(&io, result, keepalive, ctx))?;
        if io.fua() && r == io.success_result() {
            return self.landed(io, |ctx| target.make_durable(&io, ctx));
        }
        Ok(r)
    }

    /// Starts a new request without dispatching it (for [`land_write`](Harness::land_write)
    /// on a keepalive the test built itself).
    pub fn next(&mut self) {
        self.seq = self.seq.wrapping_add(1);
    }

    /// Asks the target about a landed write; waits when it defers.
    fn landed(
        &mut self,
        io: IoDesc,
        ask: impl FnOnce(&mut DispatchCtx<'_, K>) -> Dispatch<K>,
    ) -> Result<i32, HarnessError> {
        let mut ctx = DispatchCtx::new(&self.handle, io, self.seq);
        let answer = ask(&mut ctx);
        match self.answer(answer, ctx.took_deferred(), io)? {
            (Action::Complete(res), _) => Ok(complete_result(&io, res)),
            (Action::Chunks(_), _) => Err(HarnessError::ChunksForLandedWrite { tag: io.tag }),
        }
    }

    /// The action of an answer, waiting for a deferred one.
    fn answer(
        &self,
        answer: Dispatch<K>,
        took_token: bool,
        io: IoDesc,
    ) -> Result<(Action, Option<K>), HarnessError> {
        match answer {
            Dispatch::Inline { action, keepalive } => Ok((action, keepalive)),
            Dispatch::Deferred if !took_token => Err(HarnessError::NoToken { tag: io.tag }),
            Dispatch::Deferred => loop {
                let posted = self
                    .rx
                    .recv_timeout(DEFERRED_WAIT)
                    .map_err(|_| HarnessError::NoAnswer { tag: io.tag })?;
                // An answer for an older request of this tag is stale, as in the loop.
                if posted.tag == io.tag && posted.seq == self.seq {
                    return Ok((posted.action, posted.keepalive));
                }
            },
        }
    }
}

/// A request of queue 0 without flags: `len` bytes at device offset `offset`, tag `tag`.
pub fn request(op: IoOp, offset: u64, len: u32, tag: u16) -> IoDesc {
    IoDesc {
        op,
        offset,
        len,
        flags: 0,
        queue: 0,
        tag,
    }
}

/// Runs a request's chunks as the loop would: checked against `io` first (direction, bounds,
/// exact cover), then each moved with pread/pwrite between its file and `buf` (the request's
/// buffer). For tests that build the chunks through a target's inner steps.
pub fn run_chunks(io: &IoDesc, chunks: &[Chunk], buf: &mut [u8]) -> Result<(), HarnessError> {
    check_chunks(io, chunks).map_err(|errno| HarnessError::BadChunks { tag: io.tag, errno })?;
    for c in chunks {
        move_chunk(c, buf).map_err(|e| HarnessError::Chunk {
            tag: io.tag,
            chunk: c.clone(),
            error: e.to_string(),
        })?;
    }
    Ok(())
}

/// Moves one chunk's bytes between its file and `buf`.
fn move_chunk(c: &Chunk, buf: &mut [u8]) -> std::io::Result<()> {
    let start = c.buf_offset() as usize;
    let part = buf
        .get_mut(start..start + c.len() as usize)
        .ok_or_else(|| std::io::Error::other("chunk outside the request buffer"))?;
    match c {
        Chunk::ReadInto {
            file, file_offset, ..
        } => file.read_exact_at(part, *file_offset),
        Chunk::WriteFrom {
            file, file_offset, ..
        } => file.write_all_at(part, *file_offset),
        Chunk::Zeros { .. } => {
            part.fill(0);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::sync::Mutex;

    /// The keepalive of [`Ticketed`]: a plain struct of the target's own.
    #[derive(Debug, PartialEq, Eq)]
    struct Ticket {
        id: u32,
        hooks: u32,
    }

    /// Serves READ/WRITE with one chunk over `file`, each with a [`Ticket`] as keepalive
    /// (READs deferred to a thread, which submits the chunk with the ticket); commits WRITEs
    /// on a thread that owns the ticket. Records which ticket each hook got.
    struct Ticketed {
        file: Arc<File>,
        seen: Mutex<Vec<(IoOp, Ticket)>>,
    }

    impl Ticketed {
        fn action(&self, io: &IoDesc) -> (Vec<Chunk>, Ticket) {
            let chunk = if io.op == IoOp::Read {
                Chunk::read_into(&self.file, io.offset, io.len, 0)
            } else {
                Chunk::write_from(&self.file, io.offset, io.len, 0)
            };
            let ticket = Ticket {
                id: u32::from(io.tag) * 100 + u32::from(io.op == IoOp::Write),
                hooks: 0,
            };
            (vec![chunk], ticket)
        }
    }

    impl Target for Ticketed {
        type Keepalive = Ticket;

        fn dispatch(&self, io: &IoDesc, ctx: &mut DispatchCtx<'_, Ticket>) -> Dispatch<Ticket> {
            let (chunks, ticket) = self.action(io);
            if io.op == IoOp::Read {
                let token = ctx.defer();
                std::thread::spawn(move || token.submit(chunks, Some(ticket)));
                return Dispatch::Deferred;
            }
            Dispatch::Inline {
                action: Action::Chunks(chunks),
                keepalive: Some(ticket),
            }
        }

        fn after_read(&self, io: &IoDesc, result: i32, keepalive: Option<&mut Ticket>) -> i32 {
            let Some(ticket) = keepalive else {
                return -libc::EIO;
            };
            ticket.hooks += 1;
            let seen = Ticket {
                id: ticket.id,
                hooks: ticket.hooks,
            };
            self.seen.lock().unwrap().push((io.op, seen));
            result
        }

        fn after_write(
            &self,
            io: &IoDesc,
            result: i32,
            keepalive: Option<Ticket>,
            ctx: &mut DispatchCtx<'_, Ticket>,
        ) -> Dispatch<Ticket> {
            let Some(mut ticket) = keepalive else {
                return Dispatch::complete(-libc::EIO);
            };
            ticket.hooks += 1;
            self.seen.lock().unwrap().push((io.op, ticket));
            let token = ctx.defer();
            std::thread::spawn(move || token.complete(result));
            Dispatch::Deferred
        }
    }

    #[test]
    fn a_keepalive_of_the_targets_type_comes_back_to_its_hooks() {
        let target = Ticketed {
            file: Arc::new(tempfile::tempfile().unwrap()),
            seen: Mutex::new(Vec::new()),
        };
        let mut lp = Harness::default();
        let mut data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        let write = request(IoOp::Write, 4096, 8192, 3);
        assert_eq!(lp.run(&target, write, &mut data), Ok(8192));
        let mut back = vec![0u8; 8192];
        let read = request(IoOp::Read, 4096, 8192, 5);
        assert_eq!(lp.run(&target, read, &mut back), Ok(8192));
        assert_eq!(back, data, "the read returns what the write stored");
        // Each hook got the ticket its request was dispatched with, once, as a `Ticket`
        // (the READ's came back through the deferred token's channel).
        let seen = target.seen.lock().unwrap();
        assert_eq!(
            *seen,
            vec![
                (IoOp::Write, Ticket { id: 301, hooks: 1 }),
                (IoOp::Read, Ticket { id: 500, hooks: 1 }),
            ]
        );
    }
}
