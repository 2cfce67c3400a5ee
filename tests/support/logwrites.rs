//! A reader and replayer of the `dm-log-writes` log (the kernel target xfstests uses to test
//! power failure), for the power-loss kernel test.
//!
//! Log layout (little-endian; checked against the kernel's drivers/md/dm-log-writes.c):
//! - the super in the first sector: `magic u64 = 0x6a736677736872, version u64 = 1,
//!   nr_entries u64, sectorsize u32` (`sectorsize`: the data device's logical block size;
//!   the super is rewritten after every FUA or mark entry and when the table is removed);
//! - entries from byte `sectorsize` on, each starting a sector with a header `sector u64,
//!   nr_sectors u64, flags u64, data_len u64` (`sector`, `nr_sectors` in `sectorsize` units);
//!   a mark's label follows the header inline (`data_len` bytes); a write's
//!   `nr_sectors * sectorsize` bytes of data fill the sectors after the header; a discard
//!   and a flush carry no data.
//!
//! Order: the kernel logs a write when the next FLUSH that was issued after it completes
//! (just before that FLUSH's own entry), a FUA write when it completes, and a mark when it is
//! asked for. So a prefix of the log ending on a FLUSH, FUA or mark entry is a state the disk
//! really had; the writes just before a FLUSH entry (since the previous FLUSH, FUA or mark)
//! may have reached the disk in any subset.

#![allow(dead_code)] // not every test binary uses everything

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

pub const FLAG_FLUSH: u64 = 1;
pub const FLAG_FUA: u64 = 2;
pub const FLAG_DISCARD: u64 = 4;
pub const FLAG_MARK: u64 = 8;
pub const FLAG_METADATA: u64 = 16;

const MAGIC: u64 = 0x006a_7366_7773_6872;
const VERSION: u64 = 1;

/// One logged entry.
#[derive(Debug, Clone)]
pub struct Entry {
    /// First sector written (in `sectorsize` units).
    pub sector: u64,
    pub nr_sectors: u64,
    pub flags: u64,
    /// A mark's label.
    pub mark: Option<String>,
    /// Byte offset of the write's data in the log.
    pub data_at: u64,
}

impl Entry {
    /// A FLUSH, FUA or mark: the disk state after it is one the disk certainly had.
    pub fn is_barrier(&self) -> bool {
        self.flags & (FLAG_FLUSH | FLAG_FUA | FLAG_MARK) != 0
    }

    /// Whether applying it changes the device.
    pub fn changes_data(&self) -> bool {
        self.nr_sectors > 0 && self.flags & FLAG_MARK == 0
    }
}

/// A parsed log; the data stays in the log file and is read when applied.
pub struct Log {
    file: File,
    pub sectorsize: u64,
    pub entries: Vec<Entry>,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Log {
    /// Reads the super and every entry header of the log on `path` (a device or a file).
    pub fn open(path: &Path) -> Result<Log, String> {
        let file = File::open(path).map_err(|e| format!("open log {}: {e}", path.display()))?;
        let mut sup = [0u8; 32];
        file.read_exact_at(&mut sup, 0)
            .map_err(|e| format!("read the log super of {}: {e}", path.display()))?;
        let (magic, version, nr) = (u64_at(&sup, 0), u64_at(&sup, 8), u64_at(&sup, 16));
        let sectorsize = u64::from(u32::from_le_bytes([sup[24], sup[25], sup[26], sup[27]]));
        if magic != MAGIC || version != VERSION {
            return Err(format!(
                "{}: not a dm-log-writes log (magic {magic:#x}, version {version})",
                path.display()
            ));
        }
        if !(512..=65536).contains(&sectorsize) || !sectorsize.is_power_of_two() {
            return Err(format!("{}: bad sectorsize {sectorsize}", path.display()));
        }
        let mut entries = Vec::with_capacity(usize::try_from(nr).unwrap_or(0));
        let mut pos = sectorsize;
        let mut hdr = vec![0u8; usize::try_from(sectorsize).map_err(|e| e.to_string())?];
        for i in 0..nr {
            file.read_exact_at(&mut hdr, pos)
                .map_err(|e| format!("read entry {i} of {nr} at byte {pos}: {e}"))?;
            let (sector, nr_sectors, flags, data_len) = (
                u64_at(&hdr, 0),
                u64_at(&hdr, 8),
                u64_at(&hdr, 16),
                u64_at(&hdr, 24),
            );
            pos += sectorsize;
            let mark = if flags & FLAG_MARK != 0 {
                let len = usize::try_from(data_len)
                    .ok()
                    .filter(|l| 32 + l <= hdr.len())
                    .ok_or_else(|| format!("entry {i}: mark label of {data_len} bytes"))?;
                Some(String::from_utf8_lossy(&hdr[32..32 + len]).into_owned())
            } else {
                None
            };
            let data_at = pos;
            if flags & (FLAG_DISCARD | FLAG_MARK) == 0 {
                pos += nr_sectors * sectorsize;
            }
            entries.push(Entry {
                sector,
                nr_sectors,
                flags,
                mark,
                data_at,
            });
        }
        Ok(Log {
            file,
            sectorsize,
            entries,
        })
    }

    /// Index of the mark entry labelled `label`.
    pub fn mark(&self, label: &str) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| e.mark.as_deref() == Some(label))
    }

    /// Writes entry `i` to `target` (a discard writes zeros: the data device, brd, reads
    /// zeros after one). FLUSH-only entries and marks change nothing.
    pub fn apply(&self, i: usize, target: &File) -> Result<(), String> {
        let e = &self.entries[i];
        if !e.changes_data() {
            return Ok(());
        }
        let off = e.sector * self.sectorsize;
        let mut left = e.nr_sectors * self.sectorsize;
        let mut done = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        while left > 0 {
            let n = left.min(buf.len() as u64);
            let chunk = &mut buf[..usize::try_from(n).map_err(|e| e.to_string())?];
            if e.flags & FLAG_DISCARD != 0 {
                chunk.fill(0);
            } else {
                self.file
                    .read_exact_at(chunk, e.data_at + done)
                    .map_err(|err| format!("read the data of entry {i}: {err}"))?;
            }
            target
                .write_all_at(chunk, off + done)
                .map_err(|err| format!("replay entry {i} at byte {}: {err}", off + done))?;
            done += n;
            left -= n;
        }
        Ok(())
    }

    /// One line describing entry `i` (for failure messages).
    pub fn describe(&self, i: usize) -> String {
        let e = &self.entries[i];
        let mut f = Vec::new();
        for (bit, name) in [
            (FLAG_FLUSH, "FLUSH"),
            (FLAG_FUA, "FUA"),
            (FLAG_DISCARD, "DISCARD"),
            (FLAG_MARK, "MARK"),
            (FLAG_METADATA, "META"),
        ] {
            if e.flags & bit != 0 {
                f.push(name);
            }
        }
        match &e.mark {
            Some(m) => format!("#{i} mark {m:?}"),
            None => format!(
                "#{i} {} sector {} +{}",
                if f.is_empty() {
                    "WRITE".to_string()
                } else {
                    f.join("|")
                },
                e.sector,
                e.nr_sectors
            ),
        }
    }
}
