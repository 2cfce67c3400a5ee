//! Generation-tagged data patterns and a verifier that explains mismatches.
//!
//! The byte at absolute device offset `p` written in generation `g` is a pure function of
//! `(p, g)`: the device is cut into 32-byte *stamps* aligned to absolute offsets, and stamp `s`
//! (starting at offset `a = p & !31`) is
//!
//! | bytes  | content                                  |
//! | ------ | ---------------------------------------- |
//! | 0..8   | `a` (u64 LE)                             |
//! | 8..16  | `g` (u64 LE)                             |
//! | 16..24 | `mix(a, g)` (u64 LE, a splitmix64 hash)  |
//! | 24..32 | `mix(mix(a, g), g)` (u64 LE)             |
//!
//! So any 32-byte-aligned stamp read back tells which offset and which generation wrote it, and a
//! mismatch report can say "offset X holds generation 3, expected 5" or "offset X holds data
//! stamped for offset Y" (a misdirected write) instead of only "bytes differ". Patterns may start
//! and end at any offset; partial stamps at the edges are cut from the full stamp.

use std::fmt;

/// Size of one self-describing stamp.
pub const STAMP: usize = 32;

fn mix(a: u64, b: u64) -> u64 {
    // splitmix64 finaliser over a combination of both inputs.
    let mut z = a ^ b.rotate_left(32) ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn stamp(aligned_offset: u64, generation: u64) -> [u8; STAMP] {
    let check = mix(aligned_offset, generation);
    let mut out = [0u8; STAMP];
    out[0..8].copy_from_slice(&aligned_offset.to_le_bytes());
    out[8..16].copy_from_slice(&generation.to_le_bytes());
    out[16..24].copy_from_slice(&check.to_le_bytes());
    out[24..32].copy_from_slice(&mix(check, generation).to_le_bytes());
    out
}

/// Fills `buf` with the pattern for absolute offset `offset` and `generation`.
pub fn fill_pattern(buf: &mut [u8], offset: u64, generation: u64) {
    let mut pos = 0usize;
    while pos < buf.len() {
        let abs = offset + pos as u64;
        let aligned = abs & !(STAMP as u64 - 1);
        let within = (abs - aligned) as usize;
        let s = stamp(aligned, generation);
        let n = (STAMP - within).min(buf.len() - pos);
        buf[pos..pos + n].copy_from_slice(&s[within..within + n]);
        pos += n;
    }
}

/// `len` pattern bytes for absolute offset `offset` written in `generation`.
pub fn pattern(offset: u64, generation: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    fill_pattern(&mut buf, offset, generation);
    buf
}

/// The pattern of block `block` (of `block_size` bytes) written in `generation`.
pub fn block_pattern(block: u64, generation: u64, block_size: usize) -> Vec<u8> {
    pattern(block * block_size as u64, generation, block_size)
}

/// `len` incompressible bytes (xorshift64 seeded with `seed | 1`, so any seed works): for
/// tests that need data zstd cannot shrink, or many distinct page contents. Deterministic in
/// `seed`; carries no stamp, so [`verify_pattern`] cannot explain a mismatch in it.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Checks `buf`, read at `offset` while writes of its pages raced it: every stamp holds its
/// own offset's pattern (or zeroes: generation 0, never written) of a generation no older
/// than `floor[page]` (the last write of that page completed before the read started) and no
/// newer than `ceiling[page]` (the last one started before the read ended); pages are
/// `page` bytes from `offset`. A stamp that decodes to nothing passes only where a write of
/// its page overlapped the read (a copy racing a write of the same page may see it half
/// done). Panics naming `ctx` and the offset otherwise.
pub fn check_generations(
    offset: u64,
    buf: &[u8],
    page: u64,
    floor: &[u64],
    ceiling: &[u64],
    ctx: &str,
) {
    for (i, stamp) in buf.chunks(STAMP).enumerate() {
        let at = offset + (i * STAMP) as u64;
        let p = ((at - offset) / page) as usize;
        let g = if stamp.iter().all(|&b| b == 0) {
            0
        } else {
            match generation_of(at, stamp) {
                Some(g) => g,
                None if ceiling[p] > floor[p] => continue,
                None => panic!("{ctx}: offset {at} holds bytes of no write"),
            }
        };
        assert!(
            g >= floor[p],
            "{ctx}: offset {at} holds generation {g}, but generation {} of it was completed \
             before the read started",
            floor[p]
        );
        assert!(
            g <= ceiling[p],
            "{ctx}: offset {at} holds generation {g}, never written there (last started: {})",
            ceiling[p]
        );
    }
}

/// What a mismatching region turned out to hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A valid stamp for the right offset, but from another generation (a stale or lost write).
    Generation(u64),
    /// A valid stamp for another offset (a misdirected write or read), with its generation.
    OtherOffset {
        /// The offset the stamp was written for.
        offset: u64,
        /// The generation that wrote it.
        generation: u64,
    },
    /// The whole stamp is zero (never written, or a hole).
    Zeros,
    /// Not a valid stamp, or only part of a stamp was in the buffer.
    Garbage,
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Found::Generation(g) => write!(f, "generation {g}"),
            Found::OtherOffset { offset, generation } => {
                write!(f, "data of offset {offset} (generation {generation})")
            }
            Found::Zeros => write!(f, "zeros"),
            Found::Garbage => write!(f, "unrecognised bytes"),
        }
    }
}

/// The first difference between data and the expected pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pattern mismatch at offset {offset}: expected generation {expected}, found {found}")]
pub struct Mismatch {
    /// Absolute offset of the first byte that differs.
    pub offset: u64,
    /// The generation the caller expected.
    pub expected: u64,
    /// What the stamp around that byte holds.
    pub found: Found,
}

/// Decodes the stamp that covers absolute offset `abs`, if it lies completely inside `data`
/// (which starts at absolute offset `offset`).
fn decode_at(data: &[u8], offset: u64, abs: u64) -> Found {
    let aligned = abs & !(STAMP as u64 - 1);
    if aligned < offset {
        return Found::Garbage;
    }
    let start = (aligned - offset) as usize;
    let Some(bytes) = data.get(start..start + STAMP) else {
        return Found::Garbage;
    };
    if bytes.iter().all(|&b| b == 0) {
        return Found::Zeros;
    }
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    let (stamped_offset, generation) = (word(0), word(1));
    if stamp(stamped_offset, generation)[..] != bytes[..] {
        return Found::Garbage;
    }
    if stamped_offset == aligned {
        Found::Generation(generation)
    } else {
        Found::OtherOffset {
            offset: stamped_offset,
            generation,
        }
    }
}

/// Checks that `data` (read from absolute offset `offset`) is the pattern of `generation`.
/// Reports the first differing byte and what the stamp around it holds.
pub fn verify_pattern(offset: u64, generation: u64, data: &[u8]) -> Result<(), Mismatch> {
    let mut expected = [0u8; 4096];
    let mut pos = 0usize;
    while pos < data.len() {
        let n = expected.len().min(data.len() - pos);
        fill_pattern(&mut expected[..n], offset + pos as u64, generation);
        if let Some(i) = (0..n).find(|&i| data[pos + i] != expected[i]) {
            let abs = offset + (pos + i) as u64;
            return Err(Mismatch {
                offset: abs,
                expected: generation,
                found: decode_at(data, offset, abs),
            });
        }
        pos += n;
    }
    Ok(())
}

/// Checks block `block` (of `data.len()` bytes) against the pattern of `generation`.
pub fn verify_block(block: u64, generation: u64, data: &[u8]) -> Result<(), Mismatch> {
    verify_pattern(block * data.len() as u64, generation, data)
}

/// The generation stamped at the start of `data` (read from absolute `offset`), if the first
/// whole stamp in it is valid and belongs to that offset.
pub fn generation_of(offset: u64, data: &[u8]) -> Option<u64> {
    let first = offset.next_multiple_of(STAMP as u64);
    match decode_at(data, offset, first) {
        Found::Generation(g) => Some(g),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_deterministic_and_position_dependent() {
        assert_eq!(pattern(4096, 3, 8192), pattern(4096, 3, 8192));
        assert_ne!(pattern(4096, 3, 4096), pattern(8192, 3, 4096));
        assert_ne!(pattern(4096, 3, 4096), pattern(4096, 4, 4096));
        // A slice of a longer pattern equals the pattern generated at the slice's offset,
        // including unaligned starts and ends.
        let long = pattern(1000, 7, 5000);
        assert_eq!(&long[123..4567], &pattern(1123, 7, 4444)[..]);
        assert_eq!(block_pattern(5, 2, 4096), pattern(5 * 4096, 2, 4096));
    }

    #[test]
    fn noise_is_deterministic_and_seed_dependent() {
        assert_eq!(noise(7, 4096), noise(7, 4096));
        assert_ne!(noise(7, 4096), noise(8, 4096));
        assert_ne!(noise(0, 64), vec![0u8; 64], "a zero seed still gives noise");
        let mut seen = [false; 256];
        noise(1, 4096).iter().for_each(|&b| seen[b as usize] = true);
        assert!(
            seen.iter().all(|&s| s),
            "4 KiB of noise holds every byte value"
        );
    }

    #[test]
    fn verify_accepts_the_right_generation() {
        let data = block_pattern(9, 11, 128 * 1024);
        verify_block(9, 11, &data).expect("own pattern verifies");
        assert_eq!(generation_of(9 * 128 * 1024, &data), Some(11));
        assert_eq!(generation_of(9 * 128 * 1024 + 5, &data[5..]), Some(11));
    }

    #[test]
    fn verify_reports_stale_generation_with_offset() {
        let mut data = block_pattern(2, 5, 4096);
        // Bytes 1024..2048 still hold generation 4 (a lost overwrite).
        data[1024..2048].copy_from_slice(&pattern(2 * 4096 + 1024, 4, 1024));
        let m = verify_block(2, 5, &data).expect_err("must mismatch");
        assert_eq!(m.expected, 5);
        assert_eq!(m.found, Found::Generation(4));
        // The first differing byte is inside the first stale stamp: the offset word matches, so
        // the first difference is in the generation word (byte 8 of the stamp).
        assert_eq!(m.offset, 2 * 4096 + 1024 + 8);
        assert!(m
            .to_string()
            .contains("expected generation 5, found generation 4"));
    }

    #[test]
    fn verify_reports_zeros_misdirected_and_garbage() {
        let mut data = pattern(0, 1, 4096);
        data[64..96].fill(0);
        let m = verify_pattern(0, 1, &data).unwrap_err();
        assert_eq!((m.offset, m.found), (64, Found::Zeros));

        let mut data = pattern(0, 1, 4096);
        data[256..512].copy_from_slice(&pattern(8192, 1, 256));
        let m = verify_pattern(0, 1, &data).unwrap_err();
        assert_eq!(
            m.found,
            Found::OtherOffset {
                offset: 8192,
                generation: 1
            }
        );
        // Offsets 256 and 8192 share their lowest byte, so the first difference is byte 1.
        assert_eq!(m.offset, 257);

        let mut data = pattern(0, 1, 4096);
        data[100] ^= 0x40;
        let m = verify_pattern(0, 1, &data).unwrap_err();
        assert_eq!((m.offset, m.found), (100, Found::Garbage));
    }

    #[test]
    fn mismatch_in_a_partial_edge_stamp_is_garbage_not_a_panic() {
        let mut data = pattern(10, 1, 20);
        data[19] ^= 1;
        let m = verify_pattern(10, 1, &data).unwrap_err();
        assert_eq!((m.offset, m.found), (29, Found::Garbage));
        verify_pattern(0, 0, &[]).expect("empty data verifies");
    }
}
