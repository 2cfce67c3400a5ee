//! The volume's plain I/O calls: read, write, the device's FLUSH, readahead and eviction,
//! over the parts' shared state (`shared.rs`). Reads and writes run the request protocol
//! (`request.rs`, which also holds the cold fetches); a ublk target calls that protocol
//! itself.

use bytes::Bytes;

use crate::blocking::blocking;
use crate::error::Result;
use crate::request::Requests;
use crate::shared::Shared;

/// The plain I/O calls over a volume's shared state.
pub(crate) struct Io<'a> {
    pub(crate) v: &'a Shared,
}

impl Io<'_> {
    /// [`Volume::read`](crate::Volume::read): see there.
    pub(crate) async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.note_read(offset, buf.len() as u64);
        let (cache, len) = (self.v.cache.clone(), buf.len());
        let staged = Requests { v: self.v }
            .serve_read(offset, len as u64, (), move |(), ready| {
                let mut staged = vec![0u8; len];
                ready.copy_into(&cache, &mut staged).map(|()| staged)
            })
            .await
            .map_err(|refused| refused.error)??;
        buf.copy_from_slice(&staged);
        Ok(())
    }

    /// [`Volume::note_read`](crate::Volume::note_read): see there.
    pub(crate) fn note_read(&self, offset: u64, len: u64) {
        // (A range past the end of the address space is refused by the read itself.)
        let Some(end) = offset.checked_add(len) else {
            return;
        };
        if len == 0 {
            return;
        }
        let bs = u64::from(self.v.cfg.block_size);
        let (first, last) = (offset / bs, (end - 1) / bs);
        self.v.warm.note(first, last);
        if self.v.cfg.readahead_blocks == 0 {
            return;
        }
        let window = u64::from(self.v.cfg.readahead_blocks);
        let Some(ahead) =
            self.v
                .readahead
                .note(first, last, window, self.v.cache.geometry().num_blocks())
        else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            self.v.fetcher.prefetch(ahead);
        } else {
            self.v.fetcher.prefetch_soon(ahead);
        }
    }

    /// [`Volume::write`](crate::Volume::write): see there.
    pub(crate) async fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.v.check_writable()?;
        Requests { v: self.v }
            .write_copied(offset, Bytes::copy_from_slice(data))
            .await
    }

    /// [`Volume::flush`](crate::Volume::flush): see there.
    pub(crate) async fn flush(&self) -> Result<()> {
        self.v.check_fence()?;
        let cache = self.v.cache.clone();
        let (every, name) = (self.v.cfg.checkpoint_records, self.v.cfg.name.clone());
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

    /// [`Volume::evict_to`](crate::Volume::evict_to): see there.
    pub(crate) async fn evict_to(&self, budget: u64) -> Result<u64> {
        let cache = self.v.cache.clone();
        blocking(move || Ok(cache.evict_to(budget)?)).await
    }
}
