//! `GatedStore`: an [`ObjectStore`] wrapper that holds matching GETs until the test opens
//! its gate, so a test can keep a fetch in flight while other work completes (no timing).
//!
//! While the gate is closed, every GET (not HEAD) whose path contains the configured pattern
//! waits before it reaches the inner store and is counted as held; [`GatedStore::open`]
//! releases every held GET and lets later ones through; [`GatedStore::close`] gates again.
//! Every other call goes straight to the inner store.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, Default)]
struct GateState {
    closed: bool,
    /// GETs that found the gate closed (since the store was made).
    held: u64,
}

/// An object store whose GETs of matching paths wait while its gate is closed.
pub struct GatedStore {
    inner: Arc<dyn ObjectStore>,
    pattern: String,
    gate: watch::Sender<GateState>,
}

impl fmt::Debug for GatedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatedStore")
            .field("inner", &self.inner)
            .field("pattern", &self.pattern)
            .field("gate", &*self.gate.borrow())
            .finish()
    }
}

impl fmt::Display for GatedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GatedStore({})", self.inner)
    }
}

impl GatedStore {
    /// Wraps `inner`, gating GETs whose path contains `pattern` (e.g. `"/packs/"`); the gate
    /// starts open.
    pub fn new(inner: Arc<dyn ObjectStore>, pattern: &str) -> Self {
        Self {
            inner,
            pattern: pattern.to_string(),
            gate: watch::Sender::new(GateState::default()),
        }
    }

    /// From now on matching GETs wait until [`GatedStore::open`].
    pub fn close(&self) {
        self.gate.send_modify(|s| s.closed = true);
    }

    /// Releases every held GET and lets later ones through.
    pub fn open(&self) {
        self.gate.send_modify(|s| s.closed = false);
    }

    /// GETs that found the gate closed so far (released ones included).
    pub fn held(&self) -> u64 {
        self.gate.borrow().held
    }

    /// Waits until at least `n` GETs found the gate closed.
    pub async fn wait_held(&self, n: u64) {
        let mut rx = self.gate.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|s| s.held >= n).await;
    }

    /// Waits while the gate is closed, if `path` matches.
    async fn pass(&self, path: &Path) {
        if !path.as_ref().contains(&self.pattern) {
            return;
        }
        let mut rx = self.gate.subscribe();
        let held = self.gate.send_if_modified(|s| {
            if s.closed {
                s.held += 1;
            }
            s.closed
        });
        if held {
            let _ = rx.wait_for(|s| !s.closed).await;
        }
    }
}

#[async_trait]
impl ObjectStore for GatedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if !options.head {
            self.pass(location).await;
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
