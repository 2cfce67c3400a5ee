//! The checkpoint: a snapshot of the state map at a WAL sequence number.
//!
//! Layout (little endian): magic `GCKP` | version u32 | block_size u32 | volume_size u64 |
//! seq u64 | active_gen u64 | flushing_gen u64 (0 = none) | states (one byte per block) |
//! crc32c u32 of everything before it. Written to `checkpoint.tmp`, fsynced, renamed over
//! `checkpoint`, directory fsynced: a reader sees the old or the new checkpoint, never a mix.

use std::io::Write;
use std::path::Path;

use crate::error::{CacheError, Result};
use crate::geometry::Geometry;

const MAGIC: &[u8; 4] = b"GCKP";
const VERSION: u32 = 1;
const HEADER: usize = 4 + 4 + 4 + 8 + 8 + 8 + 8;
pub(crate) const FILE: &str = "checkpoint";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub seq: u64,
    pub active_gen: u64,
    pub flushing_gen: Option<u64>,
    pub states: Vec<u8>,
}

impl Checkpoint {
    pub(crate) fn write(&self, dir: &Path, geo: &Geometry) -> Result<()> {
        let mut buf = Vec::with_capacity(HEADER + self.states.len() + 4);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&VERSION.to_le_bytes());
        buf.extend_from_slice(&geo.block_size().to_le_bytes());
        buf.extend_from_slice(&geo.volume_size().to_le_bytes());
        buf.extend_from_slice(&self.seq.to_le_bytes());
        buf.extend_from_slice(&self.active_gen.to_le_bytes());
        buf.extend_from_slice(&self.flushing_gen.unwrap_or(0).to_le_bytes());
        buf.extend_from_slice(&self.states);
        let crc = crc32c::crc32c(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        let tmp = dir.join("checkpoint.tmp");
        let io = |op, e| CacheError::io(op, &tmp, e);
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("create", e))?;
        f.write_all(&buf).map_err(|e| io("write", e))?;
        f.sync_all().map_err(|e| io("fsync", e))?;
        let dst = dir.join(FILE);
        std::fs::rename(&tmp, &dst).map_err(|e| io("rename", e))?;
        crate::sys::sync_dir(dir).map_err(|e| CacheError::io("fsync dir", dir, e))
    }

    /// Loads the checkpoint, `None` when there is none. Fails on a corrupt file or another
    /// geometry (the directory belongs to a different volume shape).
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
        if u32_at(4) != VERSION {
            return Err(corrupt(&format!("unsupported version {}", u32_at(4))));
        }
        let (bs, size) = (u32_at(8), u64_at(12));
        if bs != geo.block_size() || size != geo.volume_size() {
            return Err(CacheError::GeometryMismatch {
                path,
                stored: format!("size={size} block_size={bs}"),
                requested: format!("size={} block_size={}", geo.volume_size(), geo.block_size()),
            });
        }
        let states = body[HEADER..].to_vec();
        if states.len() as u64 != geo.num_blocks() {
            return Err(corrupt("state map length does not match the geometry"));
        }
        let fg = u64_at(36);
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

    #[test]
    fn round_trip_and_rejects_damage() {
        let dir = tempfile::tempdir().unwrap();
        let geo = Geometry::new(4 * 4096, 4096).unwrap();
        assert_eq!(Checkpoint::load(dir.path(), &geo).unwrap(), None);
        let cp = Checkpoint {
            seq: 42,
            active_gen: 3,
            flushing_gen: Some(2),
            states: vec![0, 1, 2, 3],
        };
        cp.write(dir.path(), &geo).unwrap();
        assert_eq!(Checkpoint::load(dir.path(), &geo).unwrap(), Some(cp));
        let other = Geometry::new(8 * 4096, 4096).unwrap();
        assert!(matches!(
            Checkpoint::load(dir.path(), &other),
            Err(CacheError::GeometryMismatch { .. })
        ));
        let p = dir.path().join(FILE);
        let mut b = std::fs::read(&p).unwrap();
        b[HEADER] ^= 1;
        std::fs::write(&p, b).unwrap();
        assert!(matches!(
            Checkpoint::load(dir.path(), &geo),
            Err(CacheError::Corrupt { .. })
        ));
    }
}
