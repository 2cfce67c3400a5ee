//! Helpers of the snapshot tests (`snapshot.rs`, `snapshot_concurrent_deletes.rs`).

use std::collections::BTreeSet;
use std::time::Duration;

use futures::TryStreamExt;
use glidefs_objstore::{GcOptions, ObjStoreError, SnapshotProblem, VolumeStore};
use object_store::path::Path;

use super::{empty, next_manifest, pattern_pack};

/// GC that collects everything unpinned: no grace, one manifest, an hour from now.
pub fn collect_all() -> GcOptions {
    GcOptions {
        grace: Duration::ZERO,
        dry_run: false,
        keep_manifests: 1,
        now: Some(std::time::SystemTime::now() + Duration::from_secs(3600)),
    }
}

pub async fn packs_of(vs: &VolumeStore, volume: &str) -> BTreeSet<String> {
    vs.object_store()
        .list(Some(&Path::from(format!("volumes/{volume}/packs"))))
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .iter()
        .map(|m| m.location.filename().unwrap_or_default().to_string())
        .collect()
}

pub fn problem(e: &ObjStoreError) -> Option<&SnapshotProblem> {
    match e {
        ObjStoreError::Snapshot { problem, .. } => Some(problem),
        _ => None,
    }
}

/// Generation 1 maps blocks 0..4 to pack A (pattern generation 1); generation 2 rewrites all
/// of them into pack B (pattern generation 2).
pub async fn two_generations(vs: &VolumeStore) -> (String, String) {
    vs.load_manifest().await.unwrap();
    let a = pattern_pack(&[0, 1, 2, 3], 1, 0);
    vs.upload_packs(std::slice::from_ref(&a)).await.unwrap();
    let mut m1 = next_manifest(&empty("v"), &[&a]);
    vs.publish_manifest(&mut m1).await.unwrap();
    vs.create_snapshot("s1", 1).await.unwrap();
    // Snapshots name the newest generation only.
    let b = pattern_pack(&[0, 1, 2, 3], 2, 0);
    vs.upload_packs(std::slice::from_ref(&b)).await.unwrap();
    let mut m2 = next_manifest(&m1, &[&b]);
    vs.publish_manifest(&mut m2).await.unwrap();
    (format!("{}.pack", a.id), format!("{}.pack", b.id))
}
