//! The operations of the simulation and what each one tells the model.
//!
//! Every operation that talks to the store may run under a fault on its host's store (a lost
//! reply, transient errors, a permanent refusal, a stale listing), or suspended: held at
//! its k-th store call while later steps run on other volumes and hosts, then released or
//! its host crashed. Outcomes that a fault leaves unknown are resolved by asking the store
//! once the fault is lifted, the way an operator (or the daemon's restart) would.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use glidefs_objstore::GcOptions;
use glidefs_testkit::{Fault, FaultRule, Op};
use glidefs_volume::{CompactOptions, Volume, VolumeErrorKind};

use super::model::*;
use super::world::*;

/// How an operation's failure is judged.
pub type Check = Result<(), String>;

const COMPACT: CompactOptions = CompactOptions {
    threshold: 0.6,
    max_bytes: 1 << 30,
};

/// Compaction of every pack with a dead block (`POST /compact` with threshold 1).
pub const EVERY_PACK: CompactOptions = CompactOptions {
    threshold: 1.0,
    max_bytes: 1 << 30,
};

/// How long a released operation may take (real time) before the step fails as hung.
const HUNG: Duration = Duration::from_secs(60);

/// Where a suspended operation is held: `k` < [`ANY_CALL`]: at its k-th store call (from
/// 0); then at its first manifest PUT (a publish in flight: a flush, a snapshot's flush, a
/// claim, a clone's generation 1), or at its second GET of a snapshot record (a clone's
/// final check, after its generation 1 landed).
pub fn hold_rule(k: u64) -> (FaultRule, String) {
    let hold = FaultRule::new(Fault::Hold);
    match k {
        k if k < ANY_CALL => (hold.after(k).times(1), format!("store call {k}")),
        k if k < ANY_CALL + 2 => (
            hold.ops(&[Op::Put]).path_contains("/manifest/").times(1),
            "its first manifest PUT".into(),
        ),
        _ => (
            hold.ops(&[Op::Get])
                .path_contains("/snapshots/")
                .after(1)
                .times(1),
            "its second snapshot GET".into(),
        ),
    }
}

/// Holds at the k-th call for k below this; [`HOLDS`] kinds of hold in all.
pub const ANY_CALL: u64 = 10;
pub const HOLDS: u64 = ANY_CALL + 4;

impl World {
    /// Puts one random fault on `host`'s store for the next operation; says which.
    pub fn inject_fault(&mut self, host: usize) -> String {
        let k = self.below(4) as u64;
        let kinds = if self.scope.late { 6 } else { 5 };
        let (rule, what) = match self.below(kinds) {
            0 => (
                FaultRule::new(Fault::LostAck)
                    .ops(&[Op::Put])
                    .path_contains("manifest")
                    .after(k / 2)
                    .times(1),
                "lost reply of a manifest PUT",
            ),
            1 => (
                FaultRule::new(Fault::LostAck)
                    .ops(&[Op::Put])
                    .after(k)
                    .times(1),
                "lost reply of a PUT",
            ),
            2 => (
                FaultRule::new(Fault::Transient).after(k).times(2),
                "2 transient errors",
            ),
            3 => (
                FaultRule::new(Fault::Permanent).after(k).times(1),
                "a permanent error",
            ),
            5 => (
                FaultRule::new(Fault::Late)
                    .ops(&[Op::Put, Op::Delete])
                    .after(k)
                    .times(1 + k % 2),
                "late puts or deletes",
            ),
            _ => (
                FaultRule::new(Fault::EmptyList).ops(&[Op::List]).times(1),
                "a stale (empty) listing",
            ),
        };
        self.hosts[host].faulty.inject(rule);
        format!(" [{what}, after {k} calls]")
    }

    /// Lands the calls parked on `host`'s store ([`Fault::Late`]), in the order they were
    /// made or the other way round, after the operation that made them ended and before
    /// anything else learns its outcome.
    ///
    /// Why no later: the store orders requests by when it receives them (S3: the latest
    /// timestamp wins), and a request is received, if ever, within its client's timeout and
    /// retries, so while its operation still runs. Overtaken by its own retry and by the
    /// operation's later calls it may be; by the next operation, which starts once this one
    /// reported its outcome, it may not. (A request that outlived that could delete a
    /// snapshot record taken again meanwhile: no store without conditional deletes protects
    /// a name against it.) Calls of other hosts that overlap an operation are what a held
    /// one meets ([`hold_rule`]).
    pub async fn land_late(&mut self, host: usize) {
        if self.hosts[host].faulty.late_calls() == 0 {
            return;
        }
        let reversed = self.chance(0.5);
        let n = self.hosts[host].faulty.land_late(reversed).await;
        let order = if reversed { ", reversed" } else { "" };
        self.log(format!("  h{host}: {n} late calls land{order}"));
    }

    pub fn clear_faults(&self) {
        for h in &self.hosts {
            h.faulty.clear_faults();
        }
    }

    /// A writer's error: a current writer is never fenced (takeovers drop the old writer
    /// from the model as they happen).
    fn not_fenced(&self, vol: &str, err: &OpError) -> Check {
        if err.fenced {
            return Err(format!(
                "the writer of `{vol}` was fenced without a takeover: {err}"
            ));
        }
        Ok(())
    }

    /// Reads `vol`'s writer whole and compares it with every acknowledged write.
    pub async fn check_writer(&mut self, vol: &str) -> Check {
        let Some(w) = self.vols[vol].writer.as_ref() else {
            return Ok(());
        };
        let v = w.v.clone();
        let img = read_img(&v)
            .await
            .map_err(|e| format!("writer of `{vol}`: {e}"))?;
        self.vols[vol]
            .content
            .check_cur(&img)
            .map_err(|e| format!("writer of `{vol}` {e}"))
    }

    // ----- writes, on a writer (no store calls) -----

    pub async fn write(&mut self, vol: &str, zero: bool) -> Check {
        let v = self.vols[vol].writer.as_ref().unwrap().v.clone();
        let pages = v.size() as usize / PAGE;
        let first = self.below(pages);
        let len = 1 + self.below(8.min(pages - first));
        let tag = if zero { 0 } else { self.tag() };
        let tags = vec![tag; len];
        self.log(format!("write `{vol}` pages {first}+{len} #{tag}"));
        let r = if zero {
            v.write_zeroes((first * PAGE) as u64, (len * PAGE) as u64)
                .await
        } else {
            v.write((first * PAGE) as u64, &write_bytes(first, &tags))
                .await
        };
        r.map_err(|e| format!("write to `{vol}` failed: {e}"))?;
        self.vols.get_mut(vol).unwrap().content.write(first, &tags);
        Ok(())
    }

    pub async fn flush(&mut self, vol: &str) -> Check {
        let v = self.vols[vol].writer.as_ref().unwrap().v.clone();
        self.log(format!("flush `{vol}`"));
        v.flush()
            .await
            .map_err(|e| format!("flush of `{vol}` failed: {e}"))?;
        self.vols.get_mut(vol).unwrap().content.flushed();
        Ok(())
    }

    /// Evicts every Clean block of `vol`'s writer (a disk budget of 0): later reads go to
    /// the store.
    pub async fn evict(&mut self, vol: &str) -> Check {
        let v = self.vols[vol].writer.as_ref().unwrap().v.clone();
        self.log(format!("evict `{vol}`"));
        v.evict_to(0)
            .await
            .map_err(|e| format!("evict of `{vol}` failed: {e}"))?;
        self.check_writer(vol).await
    }

    // ----- operations that may be suspended -----

    /// Starts `kind` on `host` as a task; `hold_at`: held at one of its store calls
    /// ([`hold_rule`]).
    pub async fn run(
        &mut self,
        host: usize,
        kind: PendingKind,
        fault: bool,
        hold_at: Option<u64>,
    ) -> Check {
        let mut note = String::new();
        if let Some(k) = hold_at {
            let (rule, what) = hold_rule(k);
            self.hosts[host].faulty.inject(rule);
            note = format!(" [held at {what}]");
        } else if fault {
            note = self.inject_fault(host);
        }
        self.log(format!("h{host} {kind:?}{note}"));
        let mut task = self.start(host, &kind);
        if hold_at.is_some() {
            let faulty = self.hosts[host].faulty.clone();
            tokio::select! {
                out = &mut task => {
                    self.clear_faults();
                    self.log("  (finished before the hold)".into());
                    return self.apply(host, kind, out.expect("task")).await;
                }
                _ = faulty.wait_held(1) => {}
            }
            self.clear_faults();
            // Held past its start: the flush it begins with may publish before the hold is
            // resolved (a read-only export that reopens meanwhile reads it), and its volume
            // takes no write until then (`busy`).
            if let PendingKind::Sync(vol) | PendingKind::Snapshot(vol, _) = &kind {
                self.content(vol).maybe_published();
            }
            let steps_left = 1 + self.below(4) as u32;
            self.pending = Some(Pending {
                host,
                kind,
                task,
                steps_left,
            });
            return Ok(());
        }
        let out = task.await.expect("task");
        self.clear_faults();
        self.land_late(host).await;
        self.apply(host, kind, out).await
    }

    fn start(&self, host: usize, kind: &PendingKind) -> tokio::task::JoinHandle<Outcome> {
        let writer = |vol: &str| self.vols[vol].writer.as_ref().map(|w| w.v.clone());
        match kind.clone() {
            PendingKind::Sync(vol) => {
                let v = writer(&vol).unwrap();
                tokio::spawn(async move {
                    Outcome::Unit(v.sync_to_store().await.map(|_| ()).map_err(OpError::from))
                })
            }
            PendingKind::Compact(vol) => {
                let v = writer(&vol).unwrap();
                tokio::spawn(async move {
                    Outcome::Unit(v.compact(COMPACT).await.map(|_| ()).map_err(OpError::from))
                })
            }
            PendingKind::Snapshot(vol, name) => {
                let v = writer(&vol).unwrap();
                tokio::spawn(async move {
                    Outcome::Unit(
                        v.create_snapshot(&name)
                            .await
                            .map(|_| ())
                            .map_err(OpError::from),
                    )
                })
            }
            PendingKind::DeleteSnapshot(vol, name) => {
                if let Some(v) = writer(&vol) {
                    tokio::spawn(async move {
                        Outcome::Unit(
                            v.delete_snapshot(&name)
                                .await
                                .map(|_| ())
                                .map_err(OpError::from),
                        )
                    })
                } else {
                    let s = self.vstore(host, &vol);
                    tokio::spawn(async move {
                        Outcome::Unit(
                            s.delete_snapshot(&name)
                                .await
                                .map(|_| ())
                                .map_err(OpError::from),
                        )
                    })
                }
            }
            PendingKind::Clone { name, origin, snap } => {
                let mut cfg = self.writer_config(host, &name, false);
                let store = self.hosts[host].store();
                let sized = self.scope.resize;
                tokio::spawn(async move {
                    if sized {
                        // A clone has its snapshot's size (what the daemon reads first).
                        match snapshot_size(&store, &origin, &snap).await {
                            Ok(Some(size)) => cfg.size = size,
                            Ok(None) => {}
                            Err(e) => return Outcome::Opened(Err(e)),
                        }
                    }
                    Outcome::Opened(
                        Volume::create_clone(cfg, store, &origin, &snap)
                            .await
                            .map_err(OpError::from),
                    )
                })
            }
            PendingKind::Takeover(vol) => {
                let cfg = self.writer_config(host, &vol, true);
                let store = self.hosts[host].store();
                tokio::spawn(async move {
                    Outcome::Opened(Volume::open(cfg, store).await.map_err(OpError::from))
                })
            }
        }
    }

    /// What a finished operation tells the model.
    pub async fn apply(&mut self, host: usize, kind: PendingKind, out: Outcome) -> Check {
        match (kind, out) {
            (PendingKind::Sync(vol), Outcome::Unit(r)) => {
                match r {
                    Ok(()) => self.content(&vol).published(),
                    Err(e) => {
                        self.log(format!("  failed: {e}"));
                        self.not_fenced(&vol, &e)?;
                        self.content(&vol).maybe_published();
                    }
                }
                self.check_writer(&vol).await
            }
            (PendingKind::Compact(vol), Outcome::Unit(r)) => {
                if let Err(e) = r {
                    self.log(format!("  failed: {e}"));
                    self.not_fenced(&vol, &e)?;
                }
                self.check_writer(&vol).await
            }
            (PendingKind::Snapshot(vol, name), Outcome::Unit(r)) => {
                let existed = self.snaps.contains_key(&(vol.clone(), name.clone()));
                match r {
                    Ok(()) if existed => {
                        // Idempotent only for the same state (a retry of its own create).
                        let cur = self.vols[&vol].content.cur.clone();
                        if self.deleting(&vol, &name) {
                            // The suspended delete took the old one before it was held.
                            self.log("  (the suspended delete took the old one)".into());
                            self.snaps.insert((vol.clone(), name.clone()), cur);
                        } else if self.snaps[&(vol.clone(), name.clone())] != cur {
                            return Err(format!(
                                "snapshot `{vol}@{name}` was taken again over another state"
                            ));
                        }
                        self.content(&vol).published();
                    }
                    Ok(()) => {
                        self.content(&vol).published();
                        let img = self.vols[&vol].content.cur.clone();
                        self.snaps.insert((vol.clone(), name), img);
                    }
                    Err(e) => {
                        self.log(format!("  failed: {e}"));
                        self.not_fenced(&vol, &e)?;
                        if existed {
                            // Refused for its name, after the flush it starts with.
                            self.content(&vol).maybe_published();
                        } else {
                            self.resolve_snapshot(host, &vol, &name).await?;
                        }
                    }
                }
                self.check_writer(&vol).await
            }
            (PendingKind::DeleteSnapshot(vol, name), Outcome::Unit(r)) => {
                let key = (vol.clone(), name.clone());
                match r {
                    Ok(()) => {
                        // Its name may have been taken again since it deleted (while it was
                        // suspended after its work): the store says which.
                        let s = self.vstore(host, &vol);
                        if s.snapshot(&name)
                            .await
                            .map_err(|e| e.to_string())?
                            .is_some()
                        {
                            self.log("  (its name was taken again since)".into());
                        } else if self.snaps.contains_key(&key) {
                            self.snap_may_go(&vol, &name)?;
                            self.snaps.remove(&key);
                        }
                    }
                    Err(e) => {
                        self.log(format!("  failed: {e}"));
                        self.not_fenced(&vol, &e)?;
                        self.delete_again(host, &vol, &name).await?;
                    }
                }
                Ok(())
            }
            (PendingKind::Clone { name, origin, snap }, Outcome::Opened(r)) => match r {
                Ok(v) => {
                    let Some(img) = self.snaps.get(&(origin.clone(), snap.clone())).cloned() else {
                        return Err(format!(
                            "clone `{name}` was created from `{origin}@{snap}`, which was deleted"
                        ));
                    };
                    let size = v.size();
                    self.vols.insert(
                        name.clone(),
                        Vol {
                            origin: Some((origin, snap)),
                            content: Content::new(img),
                            writer: Some(Writer { host, v }),
                            owner_host: host,
                            size,
                        },
                    );
                    self.check_writer(&name).await
                }
                Err(e) => {
                    self.log(format!("  failed: {e}"));
                    self.resolve_clone(host, &name, &origin, &snap).await
                }
            },
            (PendingKind::Takeover(vol), Outcome::Opened(r)) => match r {
                Ok(v) => self.took_over(host, &vol, v).await,
                Err(e) => {
                    self.log(format!("  failed: {e}"));
                    self.resolve_takeover(host, &vol).await
                }
            },
            _ => unreachable!("outcome of another kind"),
        }
    }

    fn content(&mut self, vol: &str) -> &mut Content {
        &mut self.vols.get_mut(vol).unwrap().content
    }

    /// A snapshot is gone from the store: nothing may have depended on it.
    fn snap_may_go(&self, vol: &str, name: &str) -> Check {
        let users: Vec<_> = self
            .vols
            .iter()
            .filter(|(_, v)| v.origin == Some((vol.to_string(), name.to_string())))
            .map(|(n, _)| n.clone())
            .collect();
        if !users.is_empty() {
            return Err(format!(
                "snapshot `{vol}@{name}` was deleted while clones {users:?} use it"
            ));
        }
        if self.scope.views_pin {
            let views = self
                .readers
                .iter()
                .filter(|r| r.vol == vol && r.snapshot.as_deref() == Some(name))
                .count();
            if views > 0 {
                return Err(format!(
                    "snapshot `{vol}@{name}` was deleted while {views} views attach it"
                ));
            }
        }
        Ok(())
    }

    /// A snapshot delete failed or its host died: it may have left its `deleting` mark (no
    /// clone or view can use the snapshot then), so the operator deletes again, with no
    /// fault, which finishes it or, refused, takes the mark away. The store then says
    /// whether the snapshot is gone.
    async fn delete_again(&mut self, host: usize, vol: &str, name: &str) -> Check {
        let s = self.vstore(host, vol);
        let again = s.delete_snapshot(name).await;
        self.log(format!(
            "  delete of `{vol}@{name}` again: {}",
            match &again {
                Ok(_) => "done".to_string(),
                Err(e) => e.to_string(),
            }
        ));
        let info = s.snapshot(name).await.map_err(|e| e.to_string())?;
        let key = (vol.to_string(), name.to_string());
        match info {
            // Refused again (a view or clone holds it), while the dead delete's own marker is
            // younger than `clone_deadline`: the shared marker stays for that long (a refused
            // delete never takes it from a delete that may be under way). It still pins.
            Some(i) if i.deleting && again.is_ok() => Err(format!(
                "snapshot `{vol}@{name}` keeps its deleting mark after a delete that succeeded"
            )),
            Some(_) => Ok(()),
            None if self.snaps.contains_key(&key) => {
                self.log("  (it is gone from the store)".into());
                self.snap_may_go(vol, name)?;
                self.snaps.remove(&key);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// A snapshot create failed: the record may be there (its sync landed first).
    async fn resolve_snapshot(&mut self, host: usize, vol: &str, name: &str) -> Check {
        let s = self.vstore(host, vol);
        let there = s.snapshot(name).await.map_err(|e| e.to_string())?;
        if there.is_some() {
            self.log("  (the record landed)".into());
            self.content(vol).published();
            let img = self.vols[vol].content.cur.clone();
            self.snaps.insert((vol.to_string(), name.to_string()), img);
        } else {
            self.content(vol).maybe_published();
        }
        Ok(())
    }

    /// A clone create failed (or its host died): if the clone is in the store, it is a volume
    /// (it must read its snapshot, which must still be there).
    async fn resolve_clone(&mut self, host: usize, name: &str, origin: &str, snap: &str) -> Check {
        let s = self.vstore(host, name);
        let g = s.latest_generation().await.map_err(|e| e.to_string())?;
        if g == 0 {
            // What the daemon does with a clone that failed, or that its restart finds
            // interrupted (issue 45 item 9): nothing published, so its registration (and any
            // origin record) goes and the snapshot is no longer pinned by it.
            let o = glidefs_objstore::CloneOrigin {
                volume: origin.to_string(),
                snapshot: snap.to_string(),
                generation: 0,
            };
            return s
                .unregister_clone(&o)
                .await
                .map_err(|e| format!("undo of the clone `{name}`: {e}"));
        }
        self.log(format!(
            "  (clone `{name}` is in the store at generation {g})"
        ));
        let Some(img) = self
            .snaps
            .get(&(origin.to_string(), snap.to_string()))
            .cloned()
        else {
            return Err(format!(
                "clone `{name}` was left in the store, but its snapshot `{origin}@{snap}` was deleted"
            ));
        };
        let size = self.stored_size(host, name, None).await?;
        self.vols.insert(
            name.to_string(),
            Vol {
                origin: Some((origin.to_string(), snap.to_string())),
                content: Content::new(img),
                writer: None,
                owner_host: host,
                size,
            },
        );
        Ok(())
    }

    /// `host` opened `vol` with takeover: it must read what the store holds; the old writer
    /// must not publish again.
    pub async fn took_over(&mut self, host: usize, vol: &str, v: Arc<Volume>) -> Check {
        let v = self.discard_diverged(host, vol, v).await?;
        let img = read_img(&v)
            .await
            .map_err(|e| format!("new owner of `{vol}`: {e}"))?;
        let old = self.vols.get_mut(vol).unwrap().writer.take();
        if let Err(e) = self.content(vol).after_takeover(img) {
            if std::env::var_os("GLIDEFS_SIM_DUMP").is_some() {
                self.dump_generations(host, vol).await;
            }
            return Err(format!("new owner h{host} of `{vol}`: {e}"));
        }
        let w = self.vols.get_mut(vol).unwrap();
        w.writer = Some(Writer { host, v });
        w.owner_host = host;
        if let Some(old) = old {
            let tag = self.tag();
            let wrote = old.v.write(0, &write_bytes(0, &[tag])).await.is_ok();
            let published = old.v.sync_to_store().await;
            old.v.kill().await;
            if wrote && published.is_ok() {
                return Err(format!(
                    "the old writer h{} of `{vol}` published after h{host} took over",
                    old.host
                ));
            }
        }
        self.check_writer(vol).await
    }

    /// Prints every manifest generation of `vol` left in the store, block by block
    /// (`GLIDEFS_SIM_DUMP`, see `volume_sim.rs`).
    async fn dump_generations(&self, host: usize, vol: &str) {
        let s = self.vstore(host, vol);
        let last = s.latest_generation().await.unwrap_or(0);
        for g in 0..=last {
            match s.fetch_manifest(g).await {
                Ok(m) => {
                    let map: Vec<String> =
                        m.iter().map(|(b, l)| format!("{b}:{}", l.pack)).collect();
                    eprintln!("DUMP gen {g} owner {:?}: {}", m.owner, map.join(" "));
                }
                Err(e) => eprintln!("DUMP gen {g}: {e}"),
            }
        }
    }

    /// A writer opened on a cache directory that holds writes the store never got, while
    /// another owner published since (this host was fenced before): the open latches the
    /// volume fenced and the daemon reports it failed. The operator discards that cache (its
    /// writes were lost by the takeover that fenced them) and attaches again.
    async fn discard_diverged(
        &mut self,
        host: usize,
        vol: &str,
        v: Arc<Volume>,
    ) -> Result<Arc<Volume>, String> {
        let Some(fence) = v.fenced() else {
            return Ok(v);
        };
        self.log(format!(
            "  (h{host}'s cache of `{vol}` diverged: {fence}; discarded)"
        ));
        v.kill().await;
        drop(v);
        std::fs::remove_dir_all(self.dir(host, "w", vol)).map_err(|e| e.to_string())?;
        let v = Volume::open(
            self.writer_config(host, vol, true),
            self.hosts[host].store(),
        )
        .await
        .map_err(|e| format!("attach of `{vol}` on h{host} with a new cache: {e}"))?;
        match v.fenced() {
            Some(f) => Err(format!("a new cache of `{vol}` on h{host} is fenced: {f}")),
            None => Ok(v),
        }
    }

    /// A takeover failed (or its host died): its claim may have landed. The old writer finds
    /// out with a flush; if it is fenced, `host` takes over for real.
    async fn resolve_takeover(&mut self, host: usize, vol: &str) -> Check {
        let Some(old) = self.vols[vol].writer.as_ref().map(|w| w.v.clone()) else {
            // Nobody to ask: whoever attaches next takes over.
            self.vols.get_mut(vol).unwrap().owner_host = UNKNOWN_OWNER;
            return Ok(());
        };
        match old.sync_to_store().await {
            Ok(_) => {
                self.content(vol).published();
                Ok(())
            }
            Err(e) if e.kind() == VolumeErrorKind::Fenced => {
                self.log(format!(
                    "  (the claim landed: the old writer is fenced: {e})"
                ));
                let v = Volume::open(
                    self.writer_config(host, vol, true),
                    self.hosts[host].store(),
                )
                .await
                .map_err(|e| format!("takeover of `{vol}` again: {e}"))?;
                self.took_over(host, vol, v).await
            }
            Err(e) => Err(format!("flush of `{vol}` after a failed takeover: {e}")),
        }
    }

    /// Resolves the pending operation: lets it go on, or crashes its host.
    pub async fn resolve_pending(&mut self, crash: bool) -> Check {
        let Some(p) = self.pending.take() else {
            return Ok(());
        };
        let faulty = self.hosts[p.host].faulty.clone();
        if crash {
            self.log(format!("h{} crashes during {:?}", p.host, p.kind));
            p.task.abort();
            let _ = p.task.await;
            faulty.release_held();
            return self.crash(p.host, Some(p.kind)).await;
        }
        self.log(format!("h{} goes on with {:?}", p.host, p.kind));
        faulty.release_held();
        let out = tokio::time::timeout(HUNG, p.task)
            .await
            .map_err(|_| format!("{:?} hung after its release", p.kind))?
            .expect("task");
        self.apply(p.host, p.kind, out).await
    }

    /// `host` dies and restarts: every handle it holds is killed and opened again on the
    /// same directory; `pending`: the operation it was in.
    pub async fn crash(&mut self, host: usize, pending: Option<PendingKind>) -> Check {
        // Outcomes the dead operation leaves unknown, asked before the restart.
        match &pending {
            Some(PendingKind::Sync(vol)) => self.content(vol).maybe_published(),
            Some(PendingKind::Snapshot(vol, name)) => {
                if self.snaps.contains_key(&(vol.clone(), name.clone())) {
                    // Its name was taken: only the flush it starts with may have landed.
                    self.content(vol).maybe_published();
                } else {
                    let (vol, name) = (vol.clone(), name.clone());
                    self.resolve_snapshot(host, &vol, &name).await?;
                }
            }
            _ => {}
        }
        let vols: Vec<String> = self
            .vols
            .iter()
            .filter(|(_, v)| v.writer.as_ref().is_some_and(|w| w.host == host))
            .map(|(n, _)| n.clone())
            .collect();
        for vol in &vols {
            let w = self.vols.get_mut(vol).unwrap().writer.take().unwrap();
            w.v.kill().await;
        }
        let readers: Vec<Reader> = {
            let (mine, others) = std::mem::take(&mut self.readers)
                .into_iter()
                .partition(|r| r.host == host);
            self.readers = others;
            mine
        };
        for r in &readers {
            r.v.kill().await;
        }
        for vol in vols {
            let v = match Volume::open(
                self.writer_config(host, &vol, false),
                self.hosts[host].store(),
            )
            .await
            {
                Ok(v) => v,
                // A takeover by another host, suspended after its claim landed: this host
                // lost the volume (what it had not published goes with it).
                Err(glidefs_volume::VolumeError::OwnedElsewhere { .. }) if self.busy(&vol) => {
                    self.log(format!(
                        "  (`{vol}` is owned elsewhere now: a takeover is under way)"
                    ));
                    continue;
                }
                Err(e) => {
                    return Err(format!(
                        "`{vol}` does not reopen on h{host} after its crash: {e}"
                    ))
                }
            };
            if let Some(f) = v.fenced() {
                return Err(format!(
                    "`{vol}` reopens fenced on h{host} after its crash: {f}"
                ));
            }
            let img = read_img(&v)
                .await
                .map_err(|e| format!("`{vol}` after h{host}'s crash: {e}"))?;
            self.content(&vol)
                .after_crash(img)
                .map_err(|e| format!("`{vol}` after h{host}'s crash: {e}"))?;
            self.vols.get_mut(&vol).unwrap().writer = Some(Writer { host, v });
        }
        if let Some(PendingKind::DeleteSnapshot(vol, name)) = &pending {
            // Before the views reopen: the mark the dead delete may have left refuses them.
            let (vol, name) = (vol.clone(), name.clone());
            self.delete_again(host, &vol, &name).await?;
        }
        for r in readers {
            self.open_reader(host, &r.vol, r.snapshot.as_deref())
                .await?;
        }
        match pending {
            Some(PendingKind::Clone { name, origin, snap }) => {
                self.resolve_clone(host, &name, &origin, &snap).await
            }
            Some(PendingKind::Takeover(vol)) => self.resolve_takeover(host, &vol).await,
            _ => Ok(()),
        }
    }

    /// Every clone is pinned: its origin record names the snapshot it was cloned from, and
    /// that snapshot exists at the same generation with the clone registered under it (what
    /// keeps GC from the packs the clone maps; a `deleting` mark left by a refused retry of a
    /// dead delete pins as well). Clones whose snapshot a suspended delete holds are left for
    /// after it.
    pub async fn check_clones(&mut self) -> Check {
        let clones: Vec<(String, String, String)> = self
            .vols
            .iter()
            .filter_map(|(n, v)| v.origin.clone().map(|(o, s)| (n.clone(), o, s)))
            .collect();
        for (clone, origin, snap) in clones {
            if self.deleting(&origin, &snap) {
                continue;
            }
            let o = self
                .vstore(0, &clone)
                .origin()
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("clone `{clone}` has no origin record"))?;
            let info = self
                .vstore(0, &origin)
                .snapshot(&snap)
                .await
                .map_err(|e| e.to_string())?;
            let pinned = match &info {
                None => Err("is gone".to_string()),
                Some(i) if i.record.generation != o.generation => Err(format!(
                    "is another snapshot of that name (generation {}, the clone's is {})",
                    i.record.generation, o.generation
                )),
                Some(i) if !i.clones.contains(&clone) => Err("does not register the clone".into()),
                Some(_) => Ok(()),
            };
            if let Err(why) = pinned {
                return Err(format!(
                    "clone `{clone}` is not pinned: its snapshot `{origin}@{snap}` {why}"
                ));
            }
        }
        Ok(())
    }

    // ----- readers -----

    /// Opens a read-only export (`snapshot: None`) or a snapshot view on `host` and checks
    /// what it reads.
    pub async fn open_reader(&mut self, host: usize, vol: &str, snapshot: Option<&str>) -> Check {
        let what = match snapshot {
            Some(s) => format!("view of `{vol}@{s}` on h{host}"),
            None => format!("export of `{vol}` on h{host}"),
        };
        let size = self.stored_size(host, vol, snapshot).await?;
        let mut opened = Volume::open(
            self.reader_config(host, vol, snapshot, size),
            self.hosts[host].store(),
        )
        .await;
        if let Err(glidefs_volume::VolumeError::Cache(
            glidefs_cache::CacheError::GeometryMismatch { .. },
        )) = &opened
        {
            // The host's view directory served a larger snapshot (taken after a resize): a
            // cache never shrinks, so the open refuses it. The daemon never meets this (it
            // deletes a device's directory when the device goes); the host discards it too,
            // and opens the view on a new one.
            self.log(format!(
                "  (h{host}'s view directory of `{vol}` is larger than {size} bytes: discarded)"
            ));
            let dir = self.dir(host, if snapshot.is_some() { "s" } else { "x" }, vol);
            std::fs::remove_dir_all(dir).map_err(|e| e.to_string())?;
            opened = Volume::open(
                self.reader_config(host, vol, snapshot, size),
                self.hosts[host].store(),
            )
            .await;
        }
        let v = match opened {
            Ok(v) => v,
            Err(glidefs_volume::VolumeError::Snapshot {
                problem: glidefs_objstore::SnapshotProblem::Deleting,
                ..
            }) if snapshot.is_some() => {
                // A suspended delete of the snapshot has put its marker, or a dead delete's
                // marker lingers (see `delete_again`): the store must say so.
                let s = snapshot.unwrap_or_default();
                let marked = self
                    .vstore(host, vol)
                    .snapshot(s)
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some_and(|i| i.deleting);
                if !marked {
                    return Err(format!("{what} refused as being deleted, with no marker"));
                }
                self.log(format!("  {what} refused: a delete is under way"));
                return Ok(());
            }
            Err(e) => return Err(format!("{what} does not open: {e}")),
        };
        let want = snapshot.map(|s| self.snaps[&(vol.to_string(), s.to_string())].clone());
        self.readers.push(Reader {
            host,
            vol: vol.to_string(),
            snapshot: snapshot.map(str::to_string),
            want,
            floor: 0,
            v,
        });
        self.check_reader(self.readers.len() - 1).await
    }

    pub async fn check_reader(&mut self, i: usize) -> Check {
        let r = &self.readers[i];
        let (v, vol, snapshot, host) = (r.v.clone(), r.vol.clone(), r.snapshot.clone(), r.host);
        let img = read_img(&v).await;
        match snapshot {
            Some(s) => {
                let img = img.map_err(|e| format!("view of `{vol}@{s}` on h{host}: {e}"))?;
                let want = self.readers[i].want.as_ref().unwrap();
                if &img != want {
                    return Err(format!(
                        "view of `{vol}@{s}` on h{host} reads other bytes than the snapshot:{}",
                        diff(&img, want)
                    ));
                }
                Ok(())
            }
            None => {
                let img = img.map_err(|e| format!("export of `{vol}` on h{host}: {e}"))?;
                // An export serves the size it opened with (a writer that grew since does
                // not grow it: `follow.rs`).
                let img = &img[..v.size() as usize / PAGE];
                let floor = self.vols[&vol]
                    .content
                    .check_export(img, self.readers[i].floor)
                    .map_err(|e| format!("export of `{vol}` on h{host} reads {e}"))?;
                self.readers[i].floor = floor;
                Ok(())
            }
        }
    }

    /// A reader tries what a writer's space keeper and an operator would (compaction, GC, a
    /// snapshot, a flush to the store): each is refused, and the owner goes on unfenced.
    pub async fn reader_publishes(&mut self, i: usize) -> Check {
        let r = &self.readers[i];
        let (v, vol, host) = (r.v.clone(), r.vol.clone(), r.host);
        let line = format!(
            "h{host} reader of `{vol}` ({:?}) compacts, gcs, snapshots",
            r.snapshot
        );
        self.log(line);
        let tried = [
            ("compaction", v.compact(EVERY_PACK).await.map(|_| ()).err()),
            (
                "gc",
                v.collect_garbage(self.gc_options(host, &vol))
                    .await
                    .map(|_| ())
                    .err(),
            ),
            ("snapshot", v.create_snapshot("s1").await.map(|_| ()).err()),
        ];
        // Whatever it did must not have fenced the owner: its next flush tells.
        if self.vols.get(&vol).is_some_and(|v| v.writer.is_some()) && !self.busy(&vol) {
            let h = self.vols[&vol].writer.as_ref().unwrap().host;
            self.write(&vol, false).await?;
            self.run(h, PendingKind::Sync(vol.clone()), false, None)
                .await?;
        }
        match tried.iter().find(|(_, err)| err.is_none()) {
            Some((op, _)) => Err(format!("a reader of `{vol}` on h{host} ran a {op}")),
            None => Ok(()),
        }
    }

    // ----- GC and purge -----

    /// GC options for a pass on `host`: no grace and one manifest kept (as after an hour),
    /// unless an operation is suspended (its uploads are young: a pass with the default
    /// grace, aged by `host`'s clock, which may be hours ahead), or a reader the scope leaves
    /// unprotected would lose its packs.
    pub fn gc_options(&self, host: usize, vol: &str) -> GcOptions {
        let exposed = !self.scope.exports_follow
            && self
                .readers
                .iter()
                .any(|r| r.vol == vol && r.snapshot.is_none());
        if self.pending.is_some() || exposed {
            return GcOptions {
                now: Some(self.hosts[host].clock()),
                ..GcOptions::default()
            };
        }
        GcOptions {
            grace: Duration::ZERO,
            dry_run: false,
            keep_manifests: 1,
            now: Some(SystemTime::now() + Duration::from_secs(3600)),
        }
    }

    pub async fn gc(&mut self, host: usize, vol: &str, in_daemon: bool, fault: bool) -> Check {
        // An in-daemon pass runs on the writer's host (and its fault there).
        let host = match &self.vols[vol].writer {
            Some(w) if in_daemon => w.host,
            _ => host,
        };
        let opts = self.gc_options(host, vol);
        let note = if fault {
            self.inject_fault(host)
        } else {
            String::new()
        };
        let how = if in_daemon { "in-daemon" } else { "offline" };
        self.log(format!(
            "h{host} {how} gc `{vol}` keep={} grace={:?}{note}",
            opts.keep_manifests, opts.grace
        ));
        let r = if in_daemon {
            let v = self.vols[vol].writer.as_ref().unwrap().v.clone();
            v.collect_garbage(opts)
                .await
                .map(|_| ())
                .map_err(OpError::from)
        } else {
            self.vstore(host, vol)
                .gc(opts)
                .await
                .map(|_| ())
                .map_err(OpError::from)
        };
        self.clear_faults();
        self.land_late(host).await;
        if let Err(e) = r {
            self.log(format!("  failed: {e}"));
            if in_daemon {
                self.not_fenced(vol, &e)?;
            }
        }
        if self.vols[vol].writer.is_some() {
            self.check_writer(vol).await?;
        }
        Ok(())
    }

    /// Purges `vol` the way the daemon does: its device and attachments go first, then its
    /// objects (retried once without faults, which must succeed), then its cache directories.
    pub async fn purge(&mut self, host: usize, vol: &str, fault: bool) -> Check {
        if let Some(w) = self.vols.get_mut(vol).unwrap().writer.take() {
            let _ = w.v.close().await;
        }
        let (gone, kept) = std::mem::take(&mut self.readers)
            .into_iter()
            .partition(|r| r.vol == vol);
        self.readers = kept;
        // Every host detaches first (a view's close ends its registration; a purge is
        // refused while one is live).
        for r in gone {
            let Reader { v, .. } = r;
            v.close()
                .await
                .map_err(|e| format!("close of a reader of `{vol}` before its purge: {e}"))?;
        }
        // The fault is the purge's (a close that cannot unregister leaves a registration that
        // refuses the purge until its lease runs out: safe, and not what is tried here).
        let note = if fault {
            self.inject_fault(host)
        } else {
            String::new()
        };
        self.log(format!("h{host} purge `{vol}`{note}"));
        let first = self.vstore(host, vol).purge().await;
        self.clear_faults();
        self.land_late(host).await;
        if let Err(e) = first {
            self.log(format!("  failed: {e}; again"));
            self.vstore(host, vol)
                .purge()
                .await
                .map_err(|e| format!("purge of `{vol}` fails without faults: {e}"))?;
        }
        self.vols.remove(vol);
        self.snaps.retain(|(v, _), _| v != vol);
        for h in 0..HOSTS {
            for kind in ["w", "x", "s"] {
                let _ = std::fs::remove_dir_all(self.dir(h, kind, vol));
            }
        }
        Ok(())
    }

    /// Creates fresh volume `vol` on `host`.
    pub async fn create(&mut self, host: usize, vol: &str) -> Check {
        self.log(format!("h{host} create `{vol}`"));
        let v = Volume::open(
            self.writer_config(host, vol, false),
            self.hosts[host].store(),
        )
        .await
        .map_err(|e| format!("create of `{vol}` failed: {e}"))?;
        self.vols.insert(
            vol.to_string(),
            Vol {
                origin: None,
                content: Content::new(vec![0; MAX_PAGES]),
                writer: Some(Writer { host, v }),
                owner_host: host,
                size: crate::common::SIZE,
            },
        );
        self.check_writer(vol).await
    }

    /// Opens a writer for `vol` (which has none) on `host`, taking over from another host.
    pub async fn attach(&mut self, host: usize, vol: &str) -> Check {
        let takeover = self.vols[vol].owner_host != host;
        self.log(format!("h{host} attach `{vol}` takeover={takeover}"));
        let v = Volume::open(
            self.writer_config(host, vol, takeover),
            self.hosts[host].store(),
        )
        .await
        .map_err(|e| format!("attach of `{vol}` on h{host} failed: {e}"))?;
        self.took_over(host, vol, v).await
    }

    /// Grows `vol` by one to four blocks (up to twice its initial size): the world records
    /// the new size first (as the daemon does), then the writer grows. Nothing of it reaches
    /// the store before the next publish, and what a crash or a takeover reopens is at the
    /// recorded size.
    pub async fn resize(&mut self, vol: &str) -> Check {
        let v = self.vols[vol].writer.as_ref().unwrap().v.clone();
        let max = (MAX_PAGES * PAGE) as u64;
        let from = self.vols[vol].size;
        if from >= max {
            return Ok(());
        }
        let to = (from + BS as u64 * (1 + self.below(4) as u64)).min(max);
        self.log(format!("resize `{vol}` {from} -> {to}"));
        self.vols.get_mut(vol).unwrap().size = to;
        let before = v
            .resize(to)
            .await
            .map_err(|e| format!("resize of `{vol}` to {to}: {e}"))?;
        if before > to || v.size() != to {
            return Err(format!(
                "resize of `{vol}` to {to}: it was {before}, it is {} now",
                v.size()
            ));
        }
        self.check_writer(vol).await
    }
}

/// The size recorded in snapshot `vol@name` (`None`: there is none).
async fn snapshot_size(
    store: &Arc<dyn object_store::ObjectStore>,
    vol: &str,
    name: &str,
) -> Result<Option<u64>, OpError> {
    let s = glidefs_objstore::VolumeStore::new(
        store.clone(),
        vol,
        glidefs_objstore::StoreConfig::default(),
    )?;
    Ok(s.snapshot(name).await?.map(|i| i.record.volume_size))
}
