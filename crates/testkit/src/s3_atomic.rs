//! Makes the test S3 server's conditional writes atomic, as real S3 guarantees.
//!
//! `s3s-fs` 0.14 checks `If-None-Match` / `If-Match` and only then writes the object (a temp file
//! renamed into place). Two racing `PutMode::Create` requests for one key can both pass the
//! check and both "succeed", the later rename silently replacing the earlier object. Real S3
//! (and MinIO) decide conditional writes atomically, and manifest fencing depends on that, so
//! this wrapper serialises every mutation of one key (put, multipart completion, copy onto it,
//! single delete) behind a per-key lock and delegates everything else unchanged. Bulk
//! `DeleteObjects` is not serialised against puts of the same key; nothing here needs that.
//!
//!
//! Listings: `s3s-fs` lists by reading each directory entry and then its metadata; an object
//! deleted in between (glidefs gc deleting manifests while a writer lists them to publish)
//! failed the whole listing with `InternalError`, which real S3 never does. Deletes therefore
//! exclude listings (a read-write lock: listings share it, deletes take it alone).
//!
//! Side files: `s3s-fs` keeps an object's checksums (and user metadata) in files next to the
//! buckets (`.bucket-B.object-K.internal.json`, `.metadata.json`) and never deletes them, so a
//! long-running server (`glidefs-s3-server` under `glidefs gc`) kept one per object ever
//! written. A delete removes them too.
//!
//! GET bodies: sent in 1 MiB chunks instead of `s3s-fs`'s 4 KiB ones (see `s3_get`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, S3};
use s3s_fs::FileSystem;

/// The URL-safe base64 (no padding) that `s3s-fs` names side files with.
fn base64_url(s: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(s.len().div_ceil(3) * 4);
    for chunk in s.as_bytes().chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | u32::from(c) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
        }
    }
    out
}

/// One async lock per (bucket, key) being written.
type KeyLocks = HashMap<(String, String), Arc<tokio::sync::Mutex<()>>>;

/// `s3s_fs::FileSystem` with atomic conditional writes (see the module docs).
#[derive(Debug)]
pub struct AtomicFs {
    inner: FileSystem,
    locks: parking_lot::Mutex<KeyLocks>,
    /// Shared by listings, taken alone by deletes (see the module docs).
    listing: tokio::sync::RwLock<()>,
    /// The directory `inner` serves (canonical, as `s3s-fs` keeps it).
    root: PathBuf,
}

impl AtomicFs {
    /// Wraps `inner`, which serves `root`.
    pub fn new(inner: FileSystem, root: &Path) -> Self {
        Self {
            inner,
            locks: parking_lot::Mutex::new(HashMap::new()),
            listing: tokio::sync::RwLock::new(()),
            root: root.canonicalize().unwrap_or_else(|_| root.to_path_buf()),
        }
    }

    /// Removes the side files of a deleted object (see the module docs).
    async fn remove_side_files(&self, bucket: &str, key: &str) {
        let name = format!(".bucket-{}.object-{}", base64_url(bucket), base64_url(key));
        for ext in ["internal.json", "metadata.json"] {
            let _ = tokio::fs::remove_file(self.root.join(format!("{name}.{ext}"))).await;
        }
    }

    fn key_lock(&self, bucket: &str, key: &str) -> KeyLock<'_> {
        let key = (bucket.to_string(), key.to_string());
        let lock = Arc::clone(self.locks.lock().entry(key.clone()).or_default());
        KeyLock {
            locks: &self.locks,
            key,
            lock,
        }
    }
}

/// One key's lock, taken from the map; its entry leaves the map when the last user is done,
/// so a long-running server (`glidefs-s3-server`) keeps only the keys being written.
struct KeyLock<'a> {
    locks: &'a parking_lot::Mutex<KeyLocks>,
    key: (String, String),
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for KeyLock<'_> {
    fn drop(&mut self) {
        let mut locks = self.locks.lock();
        // The map's reference and ours: nobody else holds or awaits it, and nobody can
        // clone it meanwhile (that takes the map's mutex, held here).
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.key);
        }
    }
}

#[async_trait::async_trait]
impl S3 for AtomicFs {
    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let key = self.key_lock(&req.input.bucket, &req.input.key);
        let _guard = key.lock.lock().await;
        self.inner.put_object(req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let key = self.key_lock(&req.input.bucket, &req.input.key);
        let _guard = key.lock.lock().await;
        self.inner.complete_multipart_upload(req).await
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let key = self.key_lock(&req.input.bucket, &req.input.key);
        let _guard = key.lock.lock().await;
        self.inner.copy_object(req).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let key = self.key_lock(&req.input.bucket, &req.input.key);
        let _guard = key.lock.lock().await;
        let _no_listing = self.listing.write().await;
        let (bucket, k) = (req.input.bucket.clone(), req.input.key.clone());
        let out = self.inner.delete_object(req).await?;
        self.remove_side_files(&bucket, &k).await;
        Ok(out)
    }

    // Everything else is delegated unchanged.
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        self.inner.create_bucket(req).await
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        self.inner.delete_bucket(req).await
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let _no_listing = self.listing.write().await;
        let bucket = req.input.bucket.clone();
        let out = self.inner.delete_objects(req).await?;
        for key in out
            .output
            .deleted
            .iter()
            .flatten()
            .filter_map(|d| d.key.as_ref())
        {
            self.remove_side_files(&bucket, key).await;
        }
        Ok(out)
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.inner.get_bucket_location(req).await
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        // The body in large chunks (see `s3_get`); everything else as `s3s-fs` answers.
        let path = crate::s3_get::object_path(&self.root, &req.input.bucket, &req.input.key);
        let opened = match path {
            Some(path) => crate::s3_get::OpenedObject::open(path).await,
            None => None,
        };
        let mut resp = self.inner.get_object(req).await?;
        if let Some(opened) = opened {
            opened.swap_body(&mut resp.output).await;
        }
        Ok(resp)
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.inner.head_bucket(req).await
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        self.inner.head_object(req).await
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        self.inner.list_buckets(req).await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let _listing = self.listing.read().await;
        self.inner.list_objects(req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let _listing = self.listing.read().await;
        self.inner.list_objects_v2(req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.inner.create_multipart_upload(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.inner.upload_part(req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        self.inner.upload_part_copy(req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        self.inner.list_parts(req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.inner.abort_multipart_upload(req).await
    }
}
