//! `glidefs gc`: one garbage-collection pass of the object store (see
//! `crates/objstore/src/gc.rs` for what is kept: the newest `keep_manifests` manifests, any
//! younger than the grace period, and every pack they reference or that is in grace).
//!
//! A volume whose pass fails (an unreadable manifest, a store error) is reported with its
//! error and the others are still collected; `glidefs gc` then exits non-zero.
//!
//! Which volumes: `--volume NAME` (looked up in `state.json` for its prefix), else every
//! volume under the store root's `volumes/` plus every volume `state.json` lists under a
//! prefix. Safe while the daemon runs: packs stored after a volume's newest manifest (a flush
//! that has not published yet) are never deleted, whatever the grace period or this host's
//! clock; the grace period (at least `MIN_GC_GRACE`, see `config.rs`) is a margin on top.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use glidefs_objstore::{open_store, GcOptions, GcReport, ObjStoreError, StoreConfig, VolumeStore};
use object_store::path::Path as StorePath;
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;
use serde::Serialize;

use crate::config::Config;
use crate::manager::state;
use glidefs_model::log::chain;
use glidefs_model::BoxError;

/// GC errors, naming the store or volume.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GcError {
    #[error("object store `{url}`: {source}")]
    Store {
        url: String,
        #[source]
        source: BoxError,
    },
    #[error("{0}")]
    State(#[from] state::StateError),
    #[error("gc of volume `{volume}` failed: {source}")]
    Volume {
        volume: String,
        #[source]
        source: Box<ObjStoreError>,
    },
}

/// The outcome for one volume. When its pass failed, `error` says why and the counts are 0.
#[derive(Debug, Clone, Serialize)]
pub struct VolumeGc {
    pub volume: String,
    pub prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub dry_run: bool,
    pub manifests_retained: Vec<u64>,
    pub manifests_deleted: Vec<u64>,
    pub packs_referenced: usize,
    pub packs_in_grace: usize,
    pub packs_deleted: usize,
    pub bytes_deleted: u64,
}

impl VolumeGc {
    fn new(volume: &str, prefix: Option<&str>, r: GcReport) -> Self {
        Self {
            volume: volume.to_string(),
            prefix: prefix.map(str::to_string),
            error: None,
            dry_run: r.dry_run,
            manifests_retained: r.manifests_retained,
            manifests_deleted: r.manifests_deleted,
            packs_referenced: r.packs_referenced,
            packs_in_grace: r.packs_in_grace,
            packs_deleted: r.packs_deleted.len(),
            bytes_deleted: r.bytes_deleted,
        }
    }

    fn failed(volume: &str, prefix: Option<&str>, dry_run: bool, error: GcError) -> Self {
        Self {
            error: Some(error.to_string()),
            ..Self::new(
                volume,
                prefix,
                GcReport {
                    dry_run,
                    ..GcReport::default()
                },
            )
        }
    }
}

/// Volume names directly under `volumes/` of `store`.
async fn list_volumes(store: &Arc<dyn ObjectStore>) -> Result<Vec<String>, object_store::Error> {
    let root = StorePath::from("volumes");
    let listing = store.list_with_delimiter(Some(&root)).await?;
    Ok(listing
        .common_prefixes
        .iter()
        .filter_map(|p| p.filename().map(str::to_string))
        .collect())
}

/// Runs one pass over the selected volumes. A volume whose pass fails does not stop the
/// others: its entry carries the error (see [`failures`]); only a failure to reach the store
/// or read `state.json` at all is an `Err`.
pub async fn run(
    cfg: &Config,
    dry_run: bool,
    only: Option<&str>,
) -> Result<Vec<VolumeGc>, GcError> {
    let url = cfg.store_url();
    let store_err = |e: BoxError| GcError::Store {
        url: url.clone(),
        source: e,
    };
    let root = open_store(&url, &cfg.s3_options()).map_err(|e| store_err(e.into()))?;
    let specs = state::load(&cfg.state_path())?;
    let mut targets: BTreeSet<(Option<String>, String)> = BTreeSet::new();
    match only {
        Some(name) => {
            let prefix = specs
                .iter()
                .find(|s| s.name == name)
                .and_then(|s| s.prefix.clone());
            targets.insert((prefix, name.to_string()));
        }
        None => {
            for name in list_volumes(&root).await.map_err(|e| store_err(e.into()))? {
                targets.insert((None, name));
            }
            for s in specs.iter().filter(|s| s.prefix.is_some()) {
                targets.insert((s.prefix.clone(), s.name.clone()));
            }
        }
    }
    let opts = GcOptions {
        grace: Duration::from_secs(cfg.gc.grace_secs),
        dry_run,
        keep_manifests: cfg.gc.keep_manifests,
        now: None,
    };
    let store_cfg = StoreConfig {
        upload_concurrency: cfg.store.upload_concurrency,
        max_retries: cfg.store.max_retries,
        ..StoreConfig::default()
    };
    let mut out = Vec::new();
    for (prefix, name) in targets {
        let store: Arc<dyn ObjectStore> = match &prefix {
            Some(p) => Arc::new(PrefixStore::new(root.clone(), p.as_str())),
            None => root.clone(),
        };
        let fail = |e| GcError::Volume {
            volume: name.clone(),
            source: Box::new(e),
        };
        let result = match VolumeStore::new(store, &name, store_cfg.clone()) {
            Ok(vs) => vs.gc(opts.clone()).await.map_err(fail),
            Err(e) => Err(fail(e)),
        };
        out.push(match result {
            Ok(report) => VolumeGc::new(&name, prefix.as_deref(), report),
            Err(e) => {
                tracing::error!(volume = %name, prefix = ?prefix, error = %chain(&e), "gc of a volume failed, going on with the others");
                VolumeGc::failed(&name, prefix.as_deref(), dry_run, e)
            }
        });
    }
    Ok(out)
}

/// The volumes of `reports` whose pass failed, with their errors.
pub fn failures(reports: &[VolumeGc]) -> Vec<(&str, &str)> {
    reports
        .iter()
        .filter_map(|r| Some((r.volume.as_str(), r.error.as_deref()?)))
        .collect()
}
