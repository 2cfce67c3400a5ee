//! Block-device I/O for the kernel tests: page-aligned buffers for O_DIRECT, opening a
//! device, and 4 KiB blocks of the generation-tagged [`pattern`](crate::pattern) written and
//! verified over a range of blocks.
//!
//! Block `b` of generation `g` is `pattern(b * 4096, g, 4096)`: its first stamp (its header)
//! names the block's offset and the generation, and so does every 32-byte stamp after it, so
//! a mismatch says which generation or which other block a device returned.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::{Duration, Instant};

use crate::pattern::{fill_pattern, verify_block};

/// One mebibyte.
pub const MIB: u64 = 1 << 20;

/// The size of a block of the helpers here.
pub const BLOCK: usize = 4096;

/// A page-aligned, zeroed buffer for O_DIRECT.
pub struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (at least one page), aligned to 4 KiB.
    pub fn new(len: usize) -> AlignedBuf {
        let layout = Layout::from_size_align(len.max(4096), 4096).expect("layout");
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "allocation of {len} bytes failed");
        AlignedBuf { ptr, layout }
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is a live allocation of `layout.size()` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }

    /// The whole buffer, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.layout.size())
    }
}

/// Opens a block device with O_DIRECT for read and write, waiting up to 10 s for it to
/// appear.
pub fn open_direct(path: &str) -> File {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => return f,
            Err(e) if Instant::now() < deadline => {
                eprintln!("waiting for {path}: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("open {path} O_DIRECT: {e}"),
        }
    }
}

/// Fills `out` (one 4 KiB block) with the content of block `block` in generation `gen`.
pub fn fill_block(out: &mut [u8], gen: u64, block: u64) {
    assert_eq!(out.len(), BLOCK);
    fill_pattern(out, block * BLOCK as u64, gen);
}

/// What a block's header (its first stamp) names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The generation that wrote it.
    pub generation: u64,
    /// The block it was written for; `None` when the stamped offset is not a block's start.
    pub block: Option<u64>,
}

/// The header of a 4 KiB block read back. Read without checking the stamp, so a block torn
/// after its first 16 bytes still names its block and generation.
pub fn header(block: &[u8]) -> Header {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&block[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    let offset = word(0);
    Header {
        generation: word(1),
        block: (offset % BLOCK as u64 == 0).then_some(offset / BLOCK as u64),
    }
}

/// Writes generation `gen` over blocks `[first, first+count)` in requests of `io_blocks`.
pub fn write_blocks(f: &File, gen: u64, first: u64, count: u64, io_blocks: u64) {
    let mut buf = AlignedBuf::new(io_blocks as usize * BLOCK);
    let mut b = first;
    while b < first + count {
        let n = io_blocks.min(first + count - b);
        for i in 0..n {
            let s = i as usize * BLOCK;
            fill_block(&mut buf.as_mut_slice()[s..s + BLOCK], gen, b + i);
        }
        f.write_all_at(&buf.as_slice()[..n as usize * BLOCK], b * BLOCK as u64)
            .unwrap_or_else(|e| panic!("write blocks {b}+{n}: {e}"));
        b += n;
    }
}

/// Reads blocks `[first, first+count)` in requests of `io_blocks` and compares each byte
/// with `expected(block)` (a generation, or `None` for zeroes); panics at the first block
/// that differs, saying what it holds.
pub fn verify_blocks(
    f: &File,
    first: u64,
    count: u64,
    io_blocks: u64,
    expected: impl Fn(u64) -> Option<u64>,
) {
    let mut buf = AlignedBuf::new(io_blocks as usize * BLOCK);
    let mut b = first;
    while b < first + count {
        let n = io_blocks.min(first + count - b);
        let got = &mut buf.as_mut_slice()[..n as usize * BLOCK];
        f.read_exact_at(got, b * BLOCK as u64)
            .unwrap_or_else(|e| panic!("read blocks {b}+{n}: {e}"));
        for i in 0..n {
            let blk = b + i;
            let s = i as usize * BLOCK;
            check_block(blk, &got[s..s + BLOCK], expected(blk));
        }
        b += n;
    }
}

/// Panics unless `have` is block `blk` of generation `want` (`None`: zeroes).
fn check_block(blk: u64, have: &[u8], want: Option<u64>) {
    match want {
        Some(gen) => {
            if let Err(m) = verify_block(blk, gen, have) {
                panic!("block {blk}: {m} (header {:?})", header(have));
            }
        }
        None => {
            if let Some(at) = have.iter().position(|&x| x != 0) {
                panic!(
                    "block {blk} mismatch at byte {at}: expected zeroes, found header {:?}",
                    header(have)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pattern::block_pattern;

    #[test]
    fn a_block_is_the_pattern_at_its_offset_and_its_header_names_it() {
        let mut out = vec![0u8; BLOCK];
        fill_block(&mut out, 7, 3);
        assert_eq!(out, block_pattern(3, 7, BLOCK));
        assert_eq!(
            header(&out),
            Header {
                generation: 7,
                block: Some(3)
            }
        );
        // A block torn after its header still names its block.
        out[100..].fill(0);
        assert_eq!(header(&out).block, Some(3));
        // Bytes that are not a block's pattern name no block.
        let mut garbage = vec![0u8; BLOCK];
        garbage[0] = 1;
        assert_eq!(header(&garbage).block, None);
    }

    #[test]
    fn check_block_reports_a_stale_generation_and_accepts_its_own() {
        let mut out = vec![0u8; BLOCK];
        fill_block(&mut out, 2, 5);
        check_block(5, &out, Some(2));
        let stale = std::panic::catch_unwind(|| check_block(5, &out, Some(3)))
            .expect_err("generation 2 is not 3");
        let msg = stale.downcast_ref::<String>().unwrap();
        assert!(msg.contains("found generation 2"), "{msg}");
        check_block(9, &[0u8; BLOCK], None);
        assert!(std::panic::catch_unwind(|| check_block(5, &out, None)).is_err());
    }

    #[test]
    fn blocks_written_read_back_through_a_file() {
        let file = tempfile::tempfile().unwrap();
        write_blocks(&file, 4, 2, 5, 2);
        verify_blocks(&file, 0, 7, 3, |b| (b >= 2).then_some(4));
    }
}
