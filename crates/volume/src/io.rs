//! The volume's plain I/O calls: read, write, the device's FLUSH, cold fetches, readahead
//! and eviction. A ublk target serves requests through the gate-level request protocol
//! (`request.rs`) and these calls; both work on the parts' shared state (`shared.rs`).

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::blocking::blocking;
use crate::error::{Result, VolumeError};
use crate::fetch::FetchedBlock;
use crate::volume::Volume;

/// Longest a partial write waits for an eviction of its block to end (see `fetch_for_write`);
/// after that the attempt counts like any other.
const EVICTION_WAIT: Duration = Duration::from_secs(30);

impl Volume {
    /// Fetches one block from the object store (coalesced with a concurrent fetch of the same
    /// location: see `fetch`) and keeps it locally as Clean. The zero-copy path uses it for
    /// `Source::Remote` segments. A fill that fails (the cache file system is full or
    /// failing) does not fail the call: the fetched bytes are returned, the block just stays
    /// uncached.
    pub async fn fetch_block(&self, block: u64) -> Result<Bytes> {
        Ok(self.fetch_one(block).await?.data)
    }

    async fn fetch_one(&self, block: u64) -> Result<FetchedBlock> {
        if let Some(f) = &self.shared.fetcher.follower {
            // A read-only export: the writer's newer generation, if the last look is old.
            f.tick().await;
        }
        self.shared
            .fetcher
            .fetch(block)
            .await
            .map_err(|source| VolumeError::Fetch { block, source })
    }

    /// Fetches the blocks a partial write needs (`WritePrep::NeedsFetch`), then waits while
    /// an eviction of any of them is still punching its hole: the fill of such a block is
    /// refused (NO_FILL), so retrying the write at once would need the same fetch again and
    /// again and could run out of attempts (-EIO to the guest) while the eviction syncs files.
    /// Once the eviction ends, the next fetch fills the block. Bounded by [`EVICTION_WAIT`].
    /// A fill that failed (cache file system full or failing) fails the call with its error:
    /// the write needs the block in the cache.
    pub async fn fetch_for_write(&self, blocks: &[u64]) -> Result<()> {
        let fetched = futures::future::join_all(blocks.iter().map(|&b| self.fetch_one(b))).await;
        for (&block, f) in blocks.iter().zip(fetched) {
            if let Some(source) = f?.fill_error {
                return Err(VolumeError::Fetch { block, source });
            }
        }
        let until = Instant::now() + EVICTION_WAIT;
        while blocks
            .iter()
            .any(|&b| self.shared.cache.eviction_pending(b))
            && Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// Fetches `blocks` concurrently (each as [`Volume::fetch_block`]); the first error wins.
    pub(crate) async fn fetch_blocks(&self, blocks: &[u64]) -> Result<Vec<Bytes>> {
        futures::future::join_all(blocks.iter().map(|&b| self.fetch_block(b)))
            .await
            .into_iter()
            .collect()
    }

    /// Reads `buf.len()` bytes at `offset`, fetching cold blocks as needed. The cache's file
    /// I/O runs on the blocking pool (into a staging buffer copied into `buf`), never on an
    /// async worker.
    ///
    /// Returns no byte older than a write completed before the call (a fetch in flight is
    /// joined only if it reads the location the manifest names now, see `fetch`). A cold
    /// block whose fill into the cache fails (full or failing cache file system) is served
    /// from the fetched bytes and stays uncached (`VolumeStats::fills_failed`).
    pub async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.note_read(offset, buf.len() as u64);
        let (cache, len) = (self.shared.cache.clone(), buf.len());
        let staged = self
            .serve_read(offset, len as u64, (), move |(), ready| {
                let mut staged = vec![0u8; len];
                ready.copy_into(&cache, &mut staged).map(|()| staged)
            })
            .await
            .map_err(|refused| refused.error)??;
        buf.copy_from_slice(&staged);
        Ok(())
    }

    /// Tells the readahead heuristic that `len` bytes at `offset` are being read (by
    /// [`Volume::read`] itself, or by a ublk target serving a READ from the cache); when the
    /// read continues a sequential stream, the cold blocks among the `readahead_blocks`
    /// blocks after it are fetched in the background (see `crate::readahead` for what
    /// makes a stream, and `Fetcher::prefetch`). A stream over cached blocks costs a few
    /// atomic operations per read. Starting the fetches locks the manifest and the
    /// fetcher's in-flight map for a few map operations: on a thread of a tokio runtime that
    /// happens here, on any other thread (a ublk queue's loop thread, which must never wait
    /// for a lock) a task on the volume's runtime does it, so the caller takes no lock.
    pub fn note_read(&self, offset: u64, len: u64) {
        // (A range past the end of the address space is refused by the read itself.)
        let Some(end) = offset.checked_add(len) else {
            return;
        };
        if self.shared.cfg.readahead_blocks == 0 || len == 0 {
            return;
        }
        let bs = u64::from(self.shared.cfg.block_size);
        let (first, last) = (offset / bs, (end - 1) / bs);
        let window = u64::from(self.shared.cfg.readahead_blocks);
        let Some(ahead) = self
            .readahead
            .note(first, last, window, self.geometry().num_blocks())
        else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            self.shared.fetcher.prefetch(ahead);
        } else {
            self.shared.fetcher.prefetch_soon(ahead);
        }
    }

    /// Writes `data` at `offset`. A partial write to a block that is only in the object store
    /// fetches that block first. The cache's file I/O (and its wait for the blocks' stripe
    /// locks) runs on the blocking pool, never on an async worker.
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.shared.check_writable()?;
        self.write_copied(offset, Bytes::copy_from_slice(data))
            .await
    }

    /// The block device's FLUSH: every write completed before the call is durable on local
    /// disk when it returns (concurrent flushes share one fsync).
    pub async fn flush(&self) -> Result<()> {
        self.shared.check_fence()?;
        let cache = self.shared.cache.clone();
        let (every, name) = (
            self.shared.cfg.checkpoint_records,
            self.shared.cfg.name.clone(),
        );
        blocking(move || {
            cache.flush()?;
            // Bound replay time even when nothing is flushed to the store for a long time.
            // The FLUSH is already durable: a checkpoint that fails (a nearly full disk) only
            // leaves a longer replay, so it is logged, never the FLUSH's error.
            if cache.checkpoint_due(every) {
                if let Err(e) = cache.checkpoint() {
                    tracing::warn!(volume = %name, error = %e, "checkpoint after a FLUSH failed; the WAL keeps growing until one succeeds");
                }
            }
            Ok(())
        })
        .await
    }

    /// Evicts Clean blocks until the local cache fits in `budget` bytes.
    pub async fn evict_to(&self, budget: u64) -> Result<u64> {
        let cache = self.shared.cache.clone();
        blocking(move || Ok(cache.evict_to(budget)?)).await
    }
}
