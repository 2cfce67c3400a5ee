//! The checkpoint: a snapshot of the state map at a WAL sequence number.
//!
//! Layout (little endian), version 2 or 3: magic `GCKP` | version u32 | block_size u32 |
//! volume_size u64 | seq u64 | active_gen u64 | flushing_gen u64 (0 = none) | run count u64 |
//! runs: (first block u64, block count u64, persisted state bits u8: the state, `REMOTE`,
//! `ROTATED`, see `state`) ascending, disjoint, non-empty, bits non-zero | crc32c u32 of
//! everything before it. Blocks outside every run are NotPresent and not remote, so the file
//! grows with the touched blocks (17 bytes per run of equal states), not with the volume.
//! Version 1 (one state byte per block after the header) is still read, and rewritten as
//! version 2 or 3 by the next checkpoint.
//!
//! Version 3 is version 2 whose runs carry `ROTATED` (see `state`); it is written while a
//! rotation is pending, version 2 otherwise (no block is then `ROTATED`), so a binary from
//! before the bit refuses a checkpoint it would misread (it would leave the promoted blocks
//! out of the rotation) and reads every other. A version 1 or 2 checkpoint with a pending
//! rotation came from such a binary: its Syncing blocks are the rotation, and a block that
//! binary promoted out of it is plainly Dirty and cannot be told apart (the flushing file's
//! data does not tell: a failed write can leave bytes under a block it never made Dirty), so
//! it stays out, as that binary had it. Finish a pending flush (a successful flush to the
//! store) before upgrading from such a binary.
//!
//! Written with [`write_atomic`] (`checkpoint.tmp`, fsynced, renamed over `checkpoint`,
//! directory fsynced): a reader sees the old or the new checkpoint, never a mix.

use std::path::Path;

use crate::durable::write_atomic;
use crate::error::{CacheError, Result};
use crate::geometry::Geometry;
use crate::state::{Run, PERSISTED};

const MAGIC: &[u8; 4] = b"GCKP";
/// Runs with `ROTATED`, written while a rotation is pending.
const VERSION: u32 = 3;
/// Runs without `ROTATED` (see the module docs).
const VERSION_RUNS: u32 = 2;
/// Dense format: one byte per block.
const VERSION_DENSE: u32 = 1;
const HEADER: usize = 4 + 4 + 4 + 8 + 8 + 8 + 8;
const RUN_BYTES: usize = 8 + 8 + 1;
pub(crate) const FILE: &str = "checkpoint";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub seq: u64,
    pub active_gen: u64,
    pub flushing_gen: Option<u64>,
    pub states: Vec<Run>,
}

/// The runs of a dense state array (version 1).
fn runs_of(bytes: &[u8]) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for (b, &raw) in bytes.iter().enumerate() {
        let bits = raw & PERSISTED;
        if bits == 0 {
            continue;
        }
        match out.last_mut() {
            Some(r) if r.bits == bits && r.first + r.count == b as u64 => r.count += 1,
            _ => out.push(Run {
                first: b as u64,
                count: 1,
                bits,
            }),
        }
    }
    out
}

impl Checkpoint {
    pub(crate) fn write(&self, dir: &Path, geo: &Geometry) -> Result<()> {
        let mut buf = Vec::with_capacity(HEADER + 8 + self.states.len() * RUN_BYTES + 4);
        buf.extend_from_slice(MAGIC);
        let version = if self.flushing_gen.is_some() {
            VERSION
        } else {
            VERSION_RUNS
        };
        buf.extend_from_slice(&version.to_le_bytes());
        buf.extend_from_slice(&geo.block_size().to_le_bytes());
        buf.extend_from_slice(&geo.volume_size().to_le_bytes());
        buf.extend_from_slice(&self.seq.to_le_bytes());
        buf.extend_from_slice(&self.active_gen.to_le_bytes());
        buf.extend_from_slice(&self.flushing_gen.unwrap_or(0).to_le_bytes());
        buf.extend_from_slice(&(self.states.len() as u64).to_le_bytes());
        for r in &self.states {
            buf.extend_from_slice(&r.first.to_le_bytes());
            buf.extend_from_slice(&r.count.to_le_bytes());
            buf.push(r.bits);
        }
        let crc = crc32c::crc32c(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        Ok(write_atomic(&dir.join(FILE), &buf)?)
    }

    /// Loads the checkpoint, `None` when there is none. Fails on a corrupt file, another
    /// block size or a larger volume (the directory belongs to a different volume shape; a
    /// volume never shrinks). A smaller volume is the one `geo` grew from (see `grow`): its
    /// blocks keep their states, the new ones are NotPresent.
    pub(crate) fn load(dir: &Path, geo: &Geometry) -> Result<Option<Self>> {
        let path = dir.join(FILE);
        let buf = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(CacheError::io("read", &path, e)),
        };
        let corrupt = |what: &str| CacheError::Corrupt {
            path: path.clone(),
            what: what.to_string(),
        };
        if buf.len() < HEADER + 4 || &buf[0..4] != MAGIC {
            return Err(corrupt("bad magic or short checkpoint"));
        }
        let (body, tail) = buf.split_at(buf.len() - 4);
        let u32_at = |o: usize| u32::from_le_bytes(body[o..o + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |o: usize| u64::from_le_bytes(body[o..o + 8].try_into().unwrap_or([0; 8]));
        if crc32c::crc32c(body).to_le_bytes() != tail {
            return Err(corrupt("checksum mismatch"));
        }
        let version = u32_at(4);
        if ![VERSION, VERSION_RUNS, VERSION_DENSE].contains(&version) {
            return Err(corrupt(&format!("unsupported version {version}")));
        }
        let (bs, size) = (u32_at(8), u64_at(12));
        if bs != geo.block_size() || size > geo.volume_size() {
            return Err(CacheError::GeometryMismatch {
                path,
                stored: format!("size={size} block_size={bs}"),
                requested: format!("size={} block_size={}", geo.volume_size(), geo.block_size()),
            });
        }
        let states = if version == VERSION_DENSE {
            let dense = &body[HEADER..];
            if dense.len() as u64 != size / u64::from(bs) {
                return Err(corrupt("state map length does not match the geometry"));
            }
            runs_of(dense)
        } else {
            let n = if body.len() >= HEADER + 8 {
                u64_at(HEADER)
            } else {
                u64::MAX
            };
            let runs = &body[(HEADER + 8).min(body.len())..];
            if n.checked_mul(RUN_BYTES as u64) != Some(runs.len() as u64) {
                return Err(corrupt("run count does not match the file length"));
            }
            let mut out: Vec<Run> = Vec::with_capacity(n as usize);
            for r in runs.chunks_exact(RUN_BYTES) {
                let run = Run {
                    first: u64::from_le_bytes(r[0..8].try_into().unwrap_or([0; 8])),
                    count: u64::from_le_bytes(r[8..16].try_into().unwrap_or([0; 8])),
                    bits: r[16],
                };
                let after_previous = out.last().is_none_or(|p| run.first >= p.first + p.count);
                let inside = run
                    .first
                    .checked_add(run.count)
                    .is_some_and(|end| end <= size / u64::from(bs));
                if run.count == 0 || run.bits & PERSISTED == 0 || !after_previous || !inside {
                    return Err(corrupt(&format!("bad state run {run:?}")));
                }
                out.push(run);
            }
            out
        };
        let fg = u64_at(36);
        if fg != 0 && version != VERSION {
            tracing::warn!(dir = %dir.display(), flushing = fg,
                "checkpoint from before promoted blocks were marked, with a flush pending: a \
                 block promoted out of that flush since is not in it (see `checkpoint`)");
        }
        Ok(Some(Self {
            seq: u64_at(20),
            active_gen: u64_at(28),
            flushing_gen: (fg != 0).then_some(fg),
            states,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first: u64, count: u64, bits: u8) -> Run {
        Run { first, count, bits }
    }

    #[test]
    fn round_trip_and_rejects_damage() {
        let dir = tempfile::tempdir().unwrap();
        let geo = Geometry::new(4 * 4096, 4096).unwrap();
        assert_eq!(Checkpoint::load(dir.path(), &geo).unwrap(), None);
        let cp = Checkpoint {
            seq: 42,
            active_gen: 3,
            flushing_gen: Some(2),
            states: vec![run(1, 1, 1), run(2, 2, 3 | 4)],
        };
        cp.write(dir.path(), &geo).unwrap();
        assert_eq!(
            Checkpoint::load(dir.path(), &geo).unwrap(),
            Some(cp.clone())
        );
        let version = |d: &Path| std::fs::read(d.join(FILE)).unwrap()[4];
        assert_eq!(version(dir.path()), 3, "a pending rotation: version 3");
        let idle = Checkpoint {
            flushing_gen: None,
            ..cp.clone()
        };
        idle.write(dir.path(), &geo).unwrap();
        assert_eq!(version(dir.path()), 2, "no rotation pending: version 2");
        assert_eq!(Checkpoint::load(dir.path(), &geo).unwrap(), Some(idle));
        cp.write(dir.path(), &geo).unwrap();
        let smaller = Geometry::new(2 * 4096, 4096).unwrap();
        assert!(matches!(
            Checkpoint::load(dir.path(), &smaller),
            Err(CacheError::GeometryMismatch { .. })
        ));
        let other_bs = Geometry::new(4 * 8192, 8192).unwrap();
        assert!(matches!(
            Checkpoint::load(dir.path(), &other_bs),
            Err(CacheError::GeometryMismatch { .. })
        ));
        // A larger volume is this one grown: the states load unchanged.
        let grown = Geometry::new(8 * 4096, 4096).unwrap();
        assert_eq!(
            Checkpoint::load(dir.path(), &grown).unwrap(),
            Checkpoint::load(dir.path(), &geo).unwrap()
        );
        let p = dir.path().join(FILE);
        let mut b = std::fs::read(&p).unwrap();
        b[HEADER] ^= 1;
        std::fs::write(&p, b).unwrap();
        assert!(matches!(
            Checkpoint::load(dir.path(), &geo),
            Err(CacheError::Corrupt { .. })
        ));
    }

    /// A run past the volume, overlapping runs or a zero run are refused even with a valid
    /// checksum (they could only come from a bug or a foreign file).
    #[test]
    fn refuses_bad_runs() {
        let dir = tempfile::tempdir().unwrap();
        let geo = Geometry::new(4 * 4096, 4096).unwrap();
        for bad in [
            vec![run(3, 2, 1)],
            vec![run(0, 2, 1), run(1, 1, 2)],
            vec![run(0, 0, 1)],
            vec![run(0, 1, 0)],
        ] {
            let cp = Checkpoint {
                seq: 1,
                active_gen: 1,
                flushing_gen: None,
                states: bad.clone(),
            };
            cp.write(dir.path(), &geo).unwrap();
            assert!(
                matches!(
                    Checkpoint::load(dir.path(), &geo),
                    Err(CacheError::Corrupt { .. })
                ),
                "{bad:?}"
            );
        }
    }

    /// Version 1 (dense, one byte per block) checkpoints of existing caches still load.
    #[test]
    fn reads_version_1() {
        let dir = tempfile::tempdir().unwrap();
        let geo = Geometry::new(5 * 4096, 4096).unwrap();
        let mut buf = Vec::new();
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&1u32.to_le_bytes());
        buf.extend_from_slice(&4096u32.to_le_bytes());
        buf.extend_from_slice(&(5u64 * 4096).to_le_bytes());
        buf.extend_from_slice(&9u64.to_le_bytes());
        buf.extend_from_slice(&4u64.to_le_bytes());
        buf.extend_from_slice(&0u64.to_le_bytes());
        buf.extend_from_slice(&[0, 2, 2, 0x0d, 5]);
        let crc = crc32c::crc32c(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        std::fs::write(dir.path().join(FILE), buf).unwrap();
        assert_eq!(
            Checkpoint::load(dir.path(), &geo).unwrap(),
            Some(Checkpoint {
                seq: 9,
                active_gen: 4,
                flushing_gen: None,
                states: vec![run(1, 2, 2), run(3, 2, 5)],
            })
        );
    }
}
