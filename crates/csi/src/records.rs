//! The driver's own records in the object store, under `csi/` (beside the volumes'
//! `volumes/<name>/`, which only daemons write):
//!
//! | key | written by | what |
//! |---|---|---|
//! | `csi/volumes/<volume>.json` | CreateVolume (create-only) | the name's parameters: what a retried CreateVolume is compared with |
//! | `csi/snapshots/<snapshot>.json` | CreateSnapshot (create-only) | which volume a snapshot name belongs to |
//! | `csi/attachments/<volume>/<seq>.json` | ControllerPublish, ControllerUnpublish (each creates the next `seq`) | the one node a volume is published to, or none: the newest `seq` is the state |
//! | `csi/qos/<volume>/<seq>.json` | CreateVolume, ControllerModifyVolume (each creates the next `seq`) | the volume's QoS limits: the newest `seq` is in force ([`crate::qos`]) |
//! | `csi/nodes/<node>.json` | the node plugin at start (overwrite) | where the controller reaches that node's daemon |
//! | `csi/deleted/<volume>.json` | DeleteVolume of a volume that still has snapshots | purge it when its last snapshot goes |
//!
//! Contract: a record that decides between two callers (volume, snapshot, attachment) is
//! only ever *created* with a conditional put (`PutMode::Create`: S3 `If-None-Match: *`), so
//! of two controllers racing for a name or two nodes for a volume exactly one wins, and the
//! loser reads the winner's record. Nothing is updated in place.
//!
//! An attachment (and a QoS version) is never deleted: it is a log of states, each a new
//! object one `seq` past the newest (attached to a node, detached; limits), the way
//! manifests are generations. A store
//! DELETE cannot be made conditional, and one that lands late (its client timed out, the
//! caller retried and went on) would delete whatever record holds the name by then: a
//! deleted attachment of the *next* node would let a third node be granted a takeover while
//! the second still writes (test: `tests/csi_cross_host.rs`). A late create of an old
//! `seq` lands on an existing object and is refused. States older than the one before the
//! newest are pruned (a late prune can only remove such an old state, never the newest).
//! Volume and snapshot records are deleted by their DeleteVolume or DeleteSnapshot, after
//! the daemon's part of it: a late delete of those can only hit a record of the same name
//! made afterwards, which the CO does not make (names are unique per object).

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use glidefs_model::api::QosLimits;

/// A store call on a record failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    #[error("object store: {op} {key}: {source}")]
    Store {
        op: &'static str,
        key: String,
        #[source]
        source: object_store::Error,
    },
    #[error("record {key} is not valid JSON of its kind: {source}")]
    Corrupt {
        key: String,
        #[source]
        source: serde_json::Error,
    },
}

impl From<RecordError> for tonic::Status {
    fn from(e: RecordError) -> Self {
        match e {
            RecordError::Store { .. } => tonic::Status::unavailable(e.to_string()),
            RecordError::Corrupt { .. } => tonic::Status::internal(e.to_string()),
        }
    }
}

/// `csi/volumes/<volume>.json`: the parameters a volume name was created with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub name: String,
    /// Bytes, as created (a later expand does not change the record).
    pub capacity: u64,
    pub block_size: u32,
    /// The StorageClass parameters, as given.
    pub parameters: std::collections::BTreeMap<String, String>,
    /// `snapshot:<id>` or `volume:<id>` when created from one.
    pub source: Option<String>,
    /// The snapshot taken of the source volume for a clone of a volume (deleted with the
    /// clone).
    pub clone_snapshot: Option<String>,
    pub created_unix: u64,
}

/// `csi/snapshots/<snapshot>.json`: which volume a CSI snapshot name is a snapshot of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub name: String,
    pub volume: String,
    pub size: u64,
    pub created_unix: u64,
}

/// `csi/attachments/<volume>/<seq>.json`: one state of a volume's attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub volume: String,
    /// 1 for the first state, then one more per publish or unpublish.
    pub seq: u64,
    /// The node it is published to; `None`: detached.
    pub node: Option<String>,
    pub readonly: bool,
    pub since_unix: u64,
}

/// `csi/qos/<volume>/<seq>.json`: one version of a volume's QoS limits (`crate::qos`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosRecord {
    pub volume: String,
    /// 1 for the first version, then one more per change.
    pub seq: u64,
    /// Checked, bursts filled in (empty: no limits).
    pub limits: QosLimits,
    pub since_unix: u64,
}

/// `csi/nodes/<node>.json`: where the node's daemon answers the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub node: String,
    /// `unix:PATH`, `https://HOST:PORT`.
    pub api: String,
    pub updated_unix: u64,
}

/// `csi/deleted/<volume>.json`: the volume was deleted through CSI while snapshots of it
/// remained (a Kubernetes snapshot outlives its source volume); the last snapshot's delete
/// purges it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub volume: String,
    pub deleted_unix: u64,
}

/// What a create-only put found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created<T> {
    /// This call wrote the record.
    New,
    /// A record was there already (read back).
    Exists(T),
}

/// The records, in one object store.
#[derive(Debug, Clone)]
pub struct Records {
    store: Arc<dyn ObjectStore>,
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Records {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    fn key(kind: &str, name: &str) -> Path {
        Path::from(format!("csi/{kind}/{name}.json"))
    }

    async fn get<T: DeserializeOwned>(&self, key: &Path) -> Result<Option<T>, RecordError> {
        let bytes = match self.store.get(key).await {
            Ok(r) => r.bytes().await,
            Err(e) => Err(e),
        };
        match bytes {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|source| RecordError::Corrupt {
                    key: key.to_string(),
                    source,
                }),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(source) => Err(RecordError::Store {
                op: "get",
                key: key.to_string(),
                source,
            }),
        }
    }

    /// Writes `value` at `key` unless a record is there; then returns that one.
    async fn create<T: Serialize + DeserializeOwned>(
        &self,
        key: &Path,
        value: &T,
    ) -> Result<Created<T>, RecordError> {
        let body = serde_json::to_vec_pretty(value).map_err(|source| RecordError::Corrupt {
            key: key.to_string(),
            source,
        })?;
        let opts = PutOptions::from(PutMode::Create);
        match self.store.put_opts(key, PutPayload::from(body), opts).await {
            Ok(_) => Ok(Created::New),
            Err(object_store::Error::AlreadyExists { .. }) => match self.get(key).await? {
                Some(found) => Ok(Created::Exists(found)),
                // Deleted between our put and our get: whoever deleted it owned it; ours
                // was refused, so the caller sees the race as a conflict it may retry.
                None => Err(RecordError::Store {
                    op: "create",
                    key: key.to_string(),
                    source: object_store::Error::Precondition {
                        path: key.to_string(),
                        source: "the record existed and was deleted meanwhile: retry".into(),
                    },
                }),
            },
            Err(source) => Err(RecordError::Store {
                op: "create",
                key: key.to_string(),
                source,
            }),
        }
    }

    async fn delete(&self, key: &Path) -> Result<(), RecordError> {
        match self.store.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(RecordError::Store {
                op: "delete",
                key: key.to_string(),
                source,
            }),
        }
    }

    async fn list<T: DeserializeOwned>(&self, kind: &str) -> Result<Vec<T>, RecordError> {
        let prefix = Path::from(format!("csi/{kind}"));
        let metas: Vec<_> =
            self.store
                .list(Some(&prefix))
                .try_collect()
                .await
                .map_err(|source| RecordError::Store {
                    op: "list",
                    key: prefix.to_string(),
                    source,
                })?;
        let mut out = Vec::with_capacity(metas.len());
        for m in metas {
            if let Some(v) = self.get(&m.location).await? {
                out.push(v);
            }
        }
        Ok(out)
    }

    pub async fn volume(&self, name: &str) -> Result<Option<VolumeRecord>, RecordError> {
        self.get(&Self::key("volumes", name)).await
    }

    pub async fn create_volume(
        &self,
        rec: &VolumeRecord,
    ) -> Result<Created<VolumeRecord>, RecordError> {
        self.create(&Self::key("volumes", &rec.name), rec).await
    }

    pub async fn delete_volume(&self, name: &str) -> Result<(), RecordError> {
        self.delete(&Self::key("volumes", name)).await
    }

    pub async fn snapshot(&self, name: &str) -> Result<Option<SnapshotRecord>, RecordError> {
        self.get(&Self::key("snapshots", name)).await
    }

    pub async fn create_snapshot(
        &self,
        rec: &SnapshotRecord,
    ) -> Result<Created<SnapshotRecord>, RecordError> {
        self.create(&Self::key("snapshots", &rec.name), rec).await
    }

    pub async fn delete_snapshot(&self, name: &str) -> Result<(), RecordError> {
        self.delete(&Self::key("snapshots", name)).await
    }

    /// Every snapshot record, by name.
    pub async fn snapshots(&self) -> Result<Vec<SnapshotRecord>, RecordError> {
        let mut all: Vec<SnapshotRecord> = self.list("snapshots").await?;
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    fn log_key(kind: &str, volume: &str, seq: u64) -> Path {
        Path::from(format!("csi/{kind}/{volume}/{seq:020}.json"))
    }

    /// The `seq`s of `volume`'s log of `kind` (`attachments`, `qos`), ascending.
    async fn log_seqs(&self, kind: &str, volume: &str) -> Result<Vec<u64>, RecordError> {
        let prefix = Path::from(format!("csi/{kind}/{volume}"));
        let metas: Vec<_> =
            self.store
                .list(Some(&prefix))
                .try_collect()
                .await
                .map_err(|source| RecordError::Store {
                    op: "list",
                    key: prefix.to_string(),
                    source,
                })?;
        let mut seqs: Vec<u64> = metas
            .iter()
            .filter_map(|m| m.location.filename()?.strip_suffix(".json")?.parse().ok())
            .collect();
        seqs.sort_unstable();
        Ok(seqs)
    }

    /// The newest state of `volume`'s log of `kind` (`None`: none written).
    async fn log_newest<T: DeserializeOwned>(
        &self,
        kind: &str,
        volume: &str,
    ) -> Result<Option<T>, RecordError> {
        // A state pruned between the list and the get is an old one: look again.
        for _ in 0..3 {
            let Some(&seq) = self.log_seqs(kind, volume).await?.last() else {
                return Ok(None);
            };
            if let Some(a) = self.get(&Self::log_key(kind, volume, seq)).await? {
                return Ok(Some(a));
            }
        }
        Err(RecordError::Store {
            op: "get",
            key: format!("csi/{kind}/{volume}"),
            source: object_store::Error::Generic {
                store: "records",
                source: format!("the newest {kind} state keeps disappearing").into(),
            },
        })
    }

    /// Creates state `seq` of `volume`'s log of `kind` (one past the newest the caller read);
    /// an existing one (another caller got there first) is returned instead. Prunes the
    /// states before the previous one.
    async fn log_next<T: Serialize + DeserializeOwned + PartialEq>(
        &self,
        kind: &str,
        volume: &str,
        seq: u64,
        rec: &T,
    ) -> Result<Created<T>, RecordError> {
        let created = self.create(&Self::log_key(kind, volume, seq), rec).await?;
        if created == Created::New {
            for old in self.log_seqs(kind, volume).await? {
                if old + 1 < seq {
                    let _ = self.delete(&Self::log_key(kind, volume, old)).await;
                }
            }
        }
        Ok(created)
    }

    /// The newest attachment state of `volume` (`None`: never published).
    pub async fn attachment(&self, volume: &str) -> Result<Option<Attachment>, RecordError> {
        self.log_newest("attachments", volume).await
    }

    /// Creates attachment state `rec.seq` (one past the newest the caller read); an
    /// existing one (another caller got there first) is returned instead. Prunes the states
    /// before the previous one.
    pub async fn next_attachment(
        &self,
        rec: &Attachment,
    ) -> Result<Created<Attachment>, RecordError> {
        self.log_next("attachments", &rec.volume, rec.seq, rec)
            .await
    }

    /// The newest QoS limits recorded for `volume` (`None`: never set).
    pub async fn qos(&self, volume: &str) -> Result<Option<QosRecord>, RecordError> {
        self.log_newest("qos", volume).await
    }

    /// Creates QoS version `rec.seq` (one past the newest the caller read); an existing one
    /// (another caller got there first) is returned instead.
    pub async fn next_qos(&self, rec: &QosRecord) -> Result<Created<QosRecord>, RecordError> {
        self.log_next("qos", &rec.volume, rec.seq, rec).await
    }

    pub async fn node(&self, node: &str) -> Result<Option<NodeRecord>, RecordError> {
        self.get(&Self::key("nodes", node)).await
    }

    /// Registers (or re-registers) a node's daemon address.
    pub async fn register_node(&self, rec: &NodeRecord) -> Result<(), RecordError> {
        let key = Self::key("nodes", &rec.node);
        let body = serde_json::to_vec_pretty(rec).map_err(|source| RecordError::Corrupt {
            key: key.to_string(),
            source,
        })?;
        self.store
            .put(&key, PutPayload::from(body))
            .await
            .map(|_| ())
            .map_err(|source| RecordError::Store {
                op: "put",
                key: key.to_string(),
                source,
            })
    }

    pub async fn tombstone(&self, volume: &str) -> Result<Option<Tombstone>, RecordError> {
        self.get(&Self::key("deleted", volume)).await
    }

    pub async fn bury(&self, volume: &str) -> Result<(), RecordError> {
        let t = Tombstone {
            volume: volume.to_string(),
            deleted_unix: now_unix(),
        };
        self.create(&Self::key("deleted", volume), &t)
            .await
            .map(|_| ())
    }

    pub async fn unbury(&self, volume: &str) -> Result<(), RecordError> {
        self.delete(&Self::key("deleted", volume)).await
    }
}
