//! The controller's snapshot calls. A CSI snapshot is the glidefs snapshot of the same name
//! of its source volume; its id is `VOLUME@NAME`.
//!
//! - CreateSnapshot asks the daemon that holds the source volume (see [`crate::holder`]) to
//!   take it (a snapshot is taken of everything written before the call: the holder flushes
//!   first), then records the name (`csi/snapshots/<name>.json`, create-only). Snapshot
//!   names are global in CSI and per volume in glidefs: the record is what refuses a second
//!   volume's snapshot of a taken name (`ALREADY_EXISTS`). A retry after a crash between
//!   the two steps finds the glidefs snapshot and records it.
//! - DeleteSnapshot deletes the glidefs snapshot (refused while a clone reads from it), then
//!   the record; a volume deleted while it had snapshots is purged with its last one.
//! - ListSnapshots reads the records (paged by the index of the first entry).

use tonic::Status;

use crate::controller::Controller;
use crate::holder::Found;
use crate::pb;
use crate::records::{now_unix, Created, SnapshotRecord};

/// `VOLUME@NAME`.
pub fn snapshot_id(volume: &str, name: &str) -> String {
    format!("{volume}@{name}")
}

/// The parts of a snapshot id, or `None` for an id this driver never made.
pub fn parse_id(id: &str) -> Option<(&str, &str)> {
    id.split_once('@')
        .filter(|(v, n)| !v.is_empty() && !n.is_empty())
}

fn doc(rec: &SnapshotRecord) -> pb::Snapshot {
    pb::Snapshot {
        size_bytes: i64::try_from(rec.size).unwrap_or(i64::MAX),
        snapshot_id: snapshot_id(&rec.volume, &rec.name),
        source_volume_id: rec.volume.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: i64::try_from(rec.created_unix).unwrap_or(0),
            nanos: 0,
        }),
        ready_to_use: true,
        ..Default::default()
    }
}

impl Controller {
    pub(crate) async fn snapshot_create(
        &self,
        req: pb::CreateSnapshotRequest,
    ) -> Result<pb::Snapshot, Status> {
        if req.name.is_empty() {
            return Err(Status::invalid_argument("name is empty"));
        }
        if req.source_volume_id.is_empty() {
            return Err(Status::invalid_argument("source_volume_id is empty"));
        }
        let (volume, name) = (req.source_volume_id.as_str(), req.name.as_str());
        // The volume too: a DeleteVolume of it must not decide on its snapshots meanwhile.
        let _busy_volume = self.busy.start(volume)?;
        let _busy = self.busy.start(&format!("snapshot {name}"))?;
        let records = &self.holders.records;
        if let Some(rec) = records.snapshot(name).await? {
            if rec.volume == volume {
                return Ok(doc(&rec));
            }
            return Err(Status::already_exists(format!(
                "snapshot {name} exists, of volume {}",
                rec.volume
            )));
        }
        if records.volume(volume).await?.is_none() {
            return Err(Status::not_found(format!("no volume {volume:?}")));
        }
        let taken = self
            .holders
            .with_volume(
                volume,
                &format!("snapshot {name} of volume {volume}"),
                |d| async move {
                    match d.snapshot(volume, name).await {
                        Err(e) if e.is("snapshot_exists") => {
                            d.snapshot_info(volume, name).await?.ok_or_else(|| {
                                crate::daemon::DaemonError::unavailable(format!(
                                    "snapshot {name} of {volume} was there and is gone again"
                                ))
                            })
                        }
                        r => r,
                    }
                },
            )
            .await?;
        let facts = match taken {
            Found::Done(f) => f,
            Found::Missing => {
                return Err(Status::not_found(format!(
                    "volume {volume} is not in the store"
                )))
            }
        };
        let rec = SnapshotRecord {
            name: name.to_string(),
            volume: volume.to_string(),
            size: facts.size,
            created_unix: if facts.created_unix > 0 {
                facts.created_unix
            } else {
                now_unix()
            },
        };
        match records.create_snapshot(&rec).await? {
            Created::New => Ok(doc(&rec)),
            Created::Exists(other) if other.volume == volume => Ok(doc(&other)),
            Created::Exists(other) => {
                // Another volume's snapshot took the name first: ours goes.
                let _ = self.drop_engine_snapshot(volume, name).await;
                Err(Status::already_exists(format!(
                    "snapshot {name} exists, of volume {}",
                    other.volume
                )))
            }
        }
    }

    pub(crate) async fn snapshot_delete(&self, id: &str) -> Result<(), Status> {
        if id.is_empty() {
            return Err(Status::invalid_argument("snapshot_id is empty"));
        }
        let Some((volume, name)) = parse_id(id) else {
            return Ok(()); // not one of ours: nothing to delete
        };
        // The volume too: a DeleteVolume that finds this snapshot left must not be told
        // "kept for its snapshots" after this delete decided there is nothing to purge
        // (found by review: the volume stayed in the store for good).
        let _busy_volume = self.busy.start(volume)?;
        let _busy = self.busy.start(&format!("snapshot {name}"))?;
        let records = &self.holders.records;
        match records.snapshot(name).await? {
            Some(rec) if rec.volume != volume => return Ok(()), // the name is another's
            _ => {}
        }
        self.drop_engine_snapshot(volume, name).await?;
        records.delete_snapshot(name).await.map_err(Status::from)
    }

    pub(crate) async fn snapshot_list(
        &self,
        req: pb::ListSnapshotsRequest,
    ) -> Result<pb::ListSnapshotsResponse, Status> {
        let max = usize::try_from(req.max_entries).map_err(|_| {
            Status::invalid_argument(format!("max_entries {} is negative", req.max_entries))
        })?;
        let start = match req.starting_token.as_str() {
            "" => 0,
            t => t.parse::<usize>().map_err(|_| {
                Status::aborted(format!("starting_token {t:?} is not one this driver gave"))
            })?,
        };
        let records = &self.holders.records;
        let all: Vec<SnapshotRecord> = if !req.snapshot_id.is_empty() {
            match parse_id(&req.snapshot_id) {
                Some((volume, name)) => records
                    .snapshot(name)
                    .await?
                    .filter(|r| r.volume == volume)
                    .into_iter()
                    .collect(),
                None => Vec::new(),
            }
        } else {
            records.snapshots().await?
        };
        let all: Vec<_> = all
            .into_iter()
            .filter(|r| req.source_volume_id.is_empty() || r.volume == req.source_volume_id)
            .collect();
        if start > all.len() {
            return Err(Status::aborted(format!(
                "starting_token {start} is past the {} snapshots",
                all.len()
            )));
        }
        let take = if max == 0 { all.len() } else { max };
        let page: Vec<_> = all.iter().skip(start).take(take).collect();
        let next = start + page.len();
        Ok(pb::ListSnapshotsResponse {
            entries: page
                .into_iter()
                .map(|r| pb::list_snapshots_response::Entry {
                    snapshot: Some(doc(r)),
                })
                .collect(),
            next_token: if next < all.len() {
                next.to_string()
            } else {
                String::new()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_ids_name_volume_and_snapshot() {
        assert_eq!(snapshot_id("pvc-1", "snap-2"), "pvc-1@snap-2");
        assert_eq!(parse_id("pvc-1@snap-2"), Some(("pvc-1", "snap-2")));
        assert_eq!(parse_id("nothing"), None);
        assert_eq!(parse_id("@x"), None);
        assert_eq!(parse_id("x@"), None);
    }
}
