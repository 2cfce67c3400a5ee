//! The cache's files: their names, how they are opened, reads that may meet their end, and
//! the cleanups of them that wait for the WAL ([`Deferred`]). Nothing here knows the cache
//! object; `cache.rs`, `flush.rs` and `space.rs` build on it.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{CacheError, Result};

pub(crate) fn data_path(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("data.{gen:016}"))
}

/// Opens (creating if needed) a cache data file. Its size is not set to the volume size: the
/// file grows as blocks are written (a volume may be larger than the filesystem's largest
/// file, e.g. 16 TiB on ext4, as long as the blocks written lie below that limit). Invariant:
/// every local block (Dirty, Syncing, Clean) lies wholly inside its file, so a read of it
/// never hits the end of the file (see `Cache::cover`).
pub(crate) fn open_data_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| CacheError::io("open", path, e))
}

/// Reads `buf.len()` bytes at `offset`; `false` when the file ends first.
pub(crate) fn read_whole(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<bool> {
    match f.read_exact_at(buf, offset) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// Makes `file` reach the end of block `last` (recovery: a Dirty or Syncing block whose file
/// ends before it lost its bytes, which must not fail every later read and flush; they read as
/// zeros). Never shrinks the file.
pub(crate) fn cover_block(file: &File, path: &Path, last: Option<u64>, bs: u64) -> Result<()> {
    let Some(last) = last else { return Ok(()) };
    let end = (last + 1) * bs;
    let len = file
        .metadata()
        .map_err(|e| CacheError::io("stat", path, e))?
        .len();
    if len < end {
        tracing::error!(
            path = %path.display(),
            len,
            needed = end,
            "local blocks lie past the end of their file: their bytes were lost; they read as zeros"
        );
        file.set_len(end)
            .map_err(|e| CacheError::io("extend", path, e))?;
    }
    Ok(())
}

/// Cleanups waiting for the WAL record (by sequence number) that allows them to be durable.
#[derive(Debug, Default)]
pub(crate) struct Deferred {
    /// Evicted blocks whose hole is not punched yet (they stay NO_FILL until it is).
    pub punch: Vec<(u64, u64)>,
    /// Completed flushing files not deleted yet.
    pub remove: Vec<(u64, PathBuf)>,
}

#[cfg(test)]
pub(crate) fn test_inode(f: &File) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&f.metadata().expect("metadata"))
}
