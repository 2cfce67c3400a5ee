//! GET bodies in large chunks for the test S3 server.
//!
//! `s3s-fs` 0.14 streams an object's bytes 4 KiB at a time through `tokio::fs` (one trip to
//! the blocking pool and one write to the socket per 4 KiB). No real S3 server sends that
//! way, and it made the in-VM server, not the clients, the bottleneck of cold-read
//! benchmarks: natively, 6-7 CPU-seconds per GiB served, about 130 context switches per
//! 128 KiB block on both sides of the connection. [`AtomicFs`](crate::s3_atomic::AtomicFs) therefore
//! lets `s3s-fs` answer the GET (status, headers, range checks, ETag, checksums, errors) and
//! swaps only the body for [`range_body`]: the same bytes, [`CHUNK`] at a time.
//!
//! Consistency: the body is read from a file descriptor opened *before* `s3s-fs` opened its
//! own, and it replaces `s3s-fs`'s body only if the object's path still names the same file
//! (device and inode) after `s3s-fs` answered. Objects are written to a temporary file and
//! renamed into place, so a file never changes once it has a key: the swapped body is the
//! object the headers describe. If a PUT replaced the object in between, `s3s-fs`'s own body
//! is kept.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::Stream;
use s3s::dto::{GetObjectOutput, StreamingBlob};

/// The most bytes one read of the object's file returns (and one body chunk holds).
pub const CHUNK: u64 = 1 << 20;

/// The file `key` of `bucket` is stored in under `root`, or `None` for a key that `s3s-fs`
/// would resolve differently (a `..`, `.` or absolute component): those keep `s3s-fs`'s body.
pub(crate) fn object_path(root: &Path, bucket: &str, key: &str) -> Option<PathBuf> {
    let plain = |s: &str| {
        !s.is_empty()
            && Path::new(s)
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
    };
    (plain(bucket) && plain(key)).then(|| root.join(bucket).join(key))
}

/// A file opened for a GET before `s3s-fs` serves it (see the module docs).
pub(crate) struct OpenedObject {
    file: File,
    path: PathBuf,
}

impl OpenedObject {
    /// Opens `path`; `None` if it cannot be opened (`s3s-fs` then answers on its own).
    pub(crate) async fn open(path: PathBuf) -> Option<Self> {
        tokio::task::spawn_blocking(move || {
            let file = File::open(&path).ok()?;
            Some(Self { file, path })
        })
        .await
        .ok()
        .flatten()
    }

    /// Replaces `output`'s body with [`range_body`] over this file, if `output` is a
    /// successful GET of it and `path` still names this file.
    pub(crate) async fn swap_body(self, output: &mut GetObjectOutput) {
        let Some(len) = output.content_length.and_then(|l| u64::try_from(l).ok()) else {
            return;
        };
        let start = match output.content_range.as_deref() {
            None => Some(0),
            Some(range) => range_start(range),
        };
        let Some(start) = start else { return };
        let same = tokio::task::spawn_blocking(move || {
            let (now, ours) = (
                std::fs::metadata(&self.path).ok()?,
                self.file.metadata().ok()?,
            );
            (now.dev() == ours.dev() && now.ino() == ours.ino()).then_some(self.file)
        })
        .await
        .ok()
        .flatten();
        if let Some(file) = same {
            output.body = Some(StreamingBlob::wrap(range_body(file, start, len)));
        }
    }
}

/// The first byte of a `Content-Range` value (`bytes FIRST-LAST/SIZE`).
fn range_start(content_range: &str) -> Option<u64> {
    let spec = content_range.strip_prefix("bytes ")?;
    spec.split_once('-')?.0.parse().ok()
}

/// `len` bytes of `file` from `start`, read [`CHUNK`] at a time on the blocking pool. A file
/// shorter than the range ends the body with an error (the client sees a short body).
pub fn range_body(
    file: File,
    start: u64,
    len: u64,
) -> impl Stream<Item = std::io::Result<Bytes>> + Send + Sync + 'static {
    let file = Arc::new(file);
    futures::stream::try_unfold((file, start, len), |(file, at, left)| async move {
        if left == 0 {
            return Ok(None);
        }
        let n = left.min(CHUNK);
        let reader = Arc::clone(&file);
        let chunk = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; n as usize];
            reader
                .read_exact_at(&mut buf, at)
                .map(|()| Bytes::from(buf))
        })
        .await
        .map_err(std::io::Error::other)??;
        Ok(Some((chunk, (file, at + n, left - n))))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;
    use std::io::Write;

    #[test]
    fn content_range_start() {
        assert_eq!(range_start("bytes 0-9/10"), Some(0));
        assert_eq!(range_start("bytes 4096-8191/1048576"), Some(4096));
        assert_eq!(range_start("bytes */10"), None);
        assert_eq!(range_start("items 0-9/10"), None);
    }

    #[test]
    fn only_plain_keys_have_a_path_of_their_own() {
        let root = Path::new("/srv");
        assert_eq!(
            object_path(root, "b", "vol/packs/00ab"),
            Some(PathBuf::from("/srv/b/vol/packs/00ab"))
        );
        for key in ["../escape", "a/../b", "./a", "/abs", ""] {
            assert_eq!(object_path(root, "b", key), None, "{key:?}");
        }
    }

    #[tokio::test]
    async fn a_range_body_holds_the_range_bytes_in_chunks() {
        let data = crate::noise(3, (2 * CHUNK + 12_345) as usize);
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        for (start, len) in [(0, data.len() as u64), (7, CHUNK + 1), (CHUNK, 0)] {
            let chunks: Vec<Bytes> = range_body(f.try_clone().unwrap(), start, len)
                .try_collect()
                .await
                .unwrap();
            assert!(chunks.iter().all(|c| c.len() as u64 <= CHUNK));
            let got: Vec<u8> = chunks.concat();
            assert!(
                got[..] == data[start as usize..(start + len) as usize],
                "{start}+{len}"
            );
        }
        // Past the end: the body fails instead of ending short without a word.
        let past: std::io::Result<Vec<Bytes>> =
            range_body(f, data.len() as u64 - 5, 10).try_collect().await;
        assert!(past.is_err());
    }
}
