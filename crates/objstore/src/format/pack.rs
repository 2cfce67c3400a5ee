//! Pack bytes: entry frames, then an index, then a fixed footer.
//!
//! An entry frame is self-checking so a ranged GET of just that frame can be verified without
//! the index: `stored_crc` covers the rest of the frame header and the payload, and the raw crc
//! (kept in the index and in every `BlockLocation`) covers the decompressed block.
//!
//! Encrypted packs (version 2, written for volumes with a key; FORMAT.md, "Encryption"): each
//! entry frame's payload is sealed with XChaCha20-Poly1305 under a random nonce, bound (as
//! associated data) to the frame header: codec, flags, block index and raw length, never the
//! pack id or the frame's offset, so compaction copies a sealed frame as is and a clone reads
//! its parent's frames with the same key. `stored_crc` still covers the whole frame (nonce,
//! ciphertext, tag), so damage in transit is told from a wrong key without the key, and the
//! raw crc is still checked after decryption. The index records the key id and no raw crc
//! (a crc of the plaintext would let a reader confirm guesses of block contents).

use bytes::Bytes;

use super::{check_crc, expect_magic, FormatError, Reader, MAX_BLOCK_SIZE};
use crate::compress::{BlockCompressor, CompressError};
use crate::crypto::{KeyId, VolumeKey, NONCE_LEN, SEAL_OVERHEAD};
use crate::location::BlockIndex;

/// Magic at the start of the pack footer.
pub const PACK_MAGIC: &[u8; 8] = b"GLIDPACK";
/// Pack format version of unencrypted packs (byte-identical to builds before encryption).
pub const PACK_VERSION: u32 = 1;
/// Pack format version of encrypted packs (index header carries the key id).
pub const PACK_VERSION_ENCRYPTED: u32 = 2;
/// Entry frame flags (byte 5): the payload is sealed (`nonce ‖ ciphertext ‖ tag`).
pub const FRAME_ENCRYPTED: u8 = 0x01;
/// Bytes of the index header of an encrypted pack (entry count, block size, key id).
pub const INDEX_HEADER_LEN_ENCRYPTED: usize = 16;
/// Domain separation of an entry frame's associated data.
const ENTRY_AAD_DOMAIN: &[u8] = b"glidefs pack entry v1\0";
pub use crate::location::ENTRY_HEADER_LEN;
/// Bytes of one index record.
pub const INDEX_RECORD_LEN: usize = 32;
/// Bytes of the index header (entry count, block size).
pub const INDEX_HEADER_LEN: usize = 8;
/// Bytes of the footer.
pub const FOOTER_LEN: usize = 40;

/// How an entry's payload is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// Raw block bytes (used when compression does not make them smaller).
    None = 0,
    /// One zstd frame.
    Zstd = 1,
}

impl Codec {
    fn from_u8(what: &'static str, v: u8) -> Result<Self, FormatError> {
        match v {
            0 => Ok(Codec::None),
            1 => Ok(Codec::Zstd),
            other => Err(FormatError::Invalid {
                what,
                detail: format!("codec {other}"),
            }),
        }
    }
}

/// One index record: everything needed to find and verify an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexRecord {
    /// Block index within the volume.
    pub block: BlockIndex,
    /// Offset of the entry frame in the pack.
    pub offset: u64,
    /// Length of the entry frame.
    pub len: u32,
    /// crc32c of the raw block bytes.
    pub raw_crc: u32,
    /// crc32c stored in the frame header (covers frame bytes 4..len).
    pub stored_crc: u32,
    /// Payload codec.
    pub codec: Codec,
    /// The payload is sealed ([`FRAME_ENCRYPTED`]).
    pub encrypted: bool,
}

/// The associated data of an entry frame: a domain tag and header bytes 4..20 (codec, flags,
/// reserved, block index, raw length). Nothing about where the frame is stored.
fn entry_aad(header: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(ENTRY_AAD_DOMAIN.len() + ENTRY_HEADER_LEN - 4);
    aad.extend_from_slice(ENTRY_AAD_DOMAIN);
    aad.extend_from_slice(&header[4..ENTRY_HEADER_LEN]);
    aad
}

/// Appends one entry frame for `raw` to `out`, compressing with `compressor` when its probe
/// and the result say that helps (`crate::compress`), and sealing the payload with `key` when
/// given. A zstd error is returned, never taken as "store raw".
pub(crate) fn encode_entry(
    out: &mut Vec<u8>,
    compressor: Option<&mut BlockCompressor>,
    block: BlockIndex,
    raw: &[u8],
    key: Option<&VolumeKey>,
) -> Result<IndexRecord, CompressError> {
    let start = out.len();
    let raw_len = raw.len();
    // The payload starts after the header, and after the nonce slot when sealed.
    let at = start + ENTRY_HEADER_LEN + if key.is_some() { NONCE_LEN } else { 0 };
    // Room for the worst case up front, as for a compressed frame: the buffer then grows in
    // the same steps whatever the probe decides.
    out.reserve(at - start + zstd::zstd_safe::compress_bound(raw_len).max(raw_len));
    out.resize(at, 0);
    let compressed = match compressor {
        Some(c) => c.compress_into(raw, out, at)?,
        None => None,
    };
    let codec = match compressed {
        Some(_) => Codec::Zstd,
        None => {
            out.extend_from_slice(raw);
            Codec::None
        }
    };
    let header = &mut out[start..start + ENTRY_HEADER_LEN];
    header[4] = codec as u8;
    header[5] = if key.is_some() { FRAME_ENCRYPTED } else { 0 };
    header[8..16].copy_from_slice(&block.to_le_bytes());
    header[16..20].copy_from_slice(&(raw_len as u32).to_le_bytes());
    if let Some(key) = key {
        let aad = entry_aad(&out[start..start + ENTRY_HEADER_LEN]);
        key.seal_in_place_random(&aad, out, at);
    }
    let raw_crc = crc32c::crc32c(raw);
    let stored_crc = if codec == Codec::None && key.is_none() {
        // The payload is `raw` itself: extend the header's crc by the raw crc instead of a
        // second pass over the block.
        let head = crc32c::crc32c(&out[start + 4..at]);
        super::crc_combine::crc32c_combine(head, raw_crc, raw_len)
    } else {
        crc32c::crc32c(&out[start + 4..])
    };
    out[start..start + 4].copy_from_slice(&stored_crc.to_le_bytes());
    Ok(IndexRecord {
        block,
        offset: start as u64,
        len: (out.len() - start) as u32,
        raw_crc,
        stored_crc,
        codec,
        encrypted: key.is_some(),
    })
}

/// Checks an entry frame without decoding its payload (compaction copies frames as is):
/// length, `stored_crc`, codec, that it is sealed exactly when `encrypted`, that it holds
/// `block`, and a raw length of `block_size`. Returns the stored crc and the codec. (A sealed
/// payload is not opened: its tag is checked when the block is read.)
pub(crate) fn check_frame(
    frame: &[u8],
    block: BlockIndex,
    block_size: u32,
    encrypted: bool,
) -> Result<(u32, Codec), String> {
    if frame.len() < ENTRY_HEADER_LEN || frame.len() > u32::MAX as usize {
        return Err(format!("frame of {} bytes", frame.len()));
    }
    let word = |at: usize| u32::from_le_bytes(frame[at..at + 4].try_into().unwrap_or([0; 4]));
    let stored_crc = word(0);
    let found = crc32c::crc32c(&frame[4..]);
    if stored_crc != found {
        return Err(format!(
            "frame crc {found:#010x}, header says {stored_crc:#010x}"
        ));
    }
    let codec = Codec::from_u8("pack entry", frame[4]).map_err(|e| e.to_string())?;
    let want = if encrypted { FRAME_ENCRYPTED } else { 0 };
    if frame[5] != want || frame[6..8] != [0, 0] {
        return Err(format!(
            "frame flags {:#04x} (a {} pack needs {want:#04x})",
            frame[5],
            if encrypted { "sealed" } else { "plain" }
        ));
    }
    let overhead = if encrypted { SEAL_OVERHEAD } else { 0 };
    if frame.len() < ENTRY_HEADER_LEN + overhead {
        return Err(format!("sealed frame of {} bytes", frame.len()));
    }
    let frame_block = u64::from_le_bytes(frame[8..16].try_into().unwrap_or([0; 8]));
    if frame_block != block {
        return Err(format!("frame holds block {frame_block}"));
    }
    let raw_len = word(16);
    if raw_len != block_size {
        return Err(format!("raw length {raw_len}, block size is {block_size}"));
    }
    let payload = frame.len() - ENTRY_HEADER_LEN - overhead;
    if codec == Codec::None && payload != raw_len as usize {
        return Err(format!("raw payload of {payload} bytes"));
    }
    Ok((stored_crc, codec))
}

/// Verifies and decodes one entry frame (exactly the bytes of `BlockLocation::offset..+len`).
///
/// Checks, in order: frame length, `stored_crc`, codec, flags (a sealed frame needs `key`, a
/// plain one needs no key), that the frame belongs to `block`, that the raw length is at most
/// [`MAX_BLOCK_SIZE`], the tag of a sealed payload (which also binds the header), the
/// decompressed length, and `raw_crc`. A raw (uncompressed, plain) payload is returned as a
/// slice of `frame` without copying.
pub fn decode_entry(
    frame: Bytes,
    block: BlockIndex,
    raw_crc: u32,
    key: Option<&VolumeKey>,
) -> Result<Bytes, FormatError> {
    const WHAT: &str = "pack entry";
    let mut r = Reader::new(WHAT, &frame);
    let stored_crc = r.u32()?;
    // The frame crc in two parts, header and payload, combined: a raw unsealed payload is the
    // block itself, and its crc then serves the raw crc check below too (one pass, not two).
    let payload_crc =
        (frame.len() >= ENTRY_HEADER_LEN).then(|| crc32c::crc32c(&frame[ENTRY_HEADER_LEN..]));
    let frame_crc = match payload_crc {
        Some(tail) => super::crc_combine::crc32c_combine(
            crc32c::crc32c(&frame[4..ENTRY_HEADER_LEN]),
            tail,
            frame.len() - ENTRY_HEADER_LEN,
        ),
        None => crc32c::crc32c(&frame[4..]),
    };
    check_crc(WHAT, stored_crc, frame_crc)?;
    let codec = Codec::from_u8(WHAT, r.u8()?)?;
    let flags = r.u8()?;
    let reserved = r.u16()?;
    let sealed = match (flags, key) {
        (0, None) if reserved == 0 => false,
        (FRAME_ENCRYPTED, Some(_)) if reserved == 0 => true,
        (FRAME_ENCRYPTED, None) => {
            return Err(FormatError::Invalid {
                what: WHAT,
                detail: "the frame is encrypted and no key was given".into(),
            })
        }
        (0, Some(k)) => {
            return Err(FormatError::Invalid {
                what: WHAT,
                detail: format!(
                    "the frame is not encrypted, but the volume has a key (id {})",
                    k.id()
                ),
            })
        }
        _ => {
            return Err(FormatError::Invalid {
                what: WHAT,
                detail: format!("flags {flags:#04x}, reserved {reserved:#06x}"),
            })
        }
    };
    let frame_block = r.u64()?;
    if frame_block != block {
        return Err(FormatError::Invalid {
            what: WHAT,
            detail: format!("frame holds block {frame_block}, expected block {block}"),
        });
    }
    let raw_len = r.u32()?;
    if raw_len > MAX_BLOCK_SIZE {
        return Err(FormatError::Invalid {
            what: WHAT,
            detail: format!("raw length {raw_len} exceeds {MAX_BLOCK_SIZE}"),
        });
    }
    let payload = match key.filter(|_| sealed) {
        Some(key) => {
            let aad = entry_aad(&frame[..ENTRY_HEADER_LEN]);
            let plain = key
                .open(&aad, &frame[ENTRY_HEADER_LEN..])
                .map_err(|source| FormatError::Decrypt { what: WHAT, source })?;
            Bytes::from(plain)
        }
        None => frame.slice(ENTRY_HEADER_LEN..),
    };
    let raw_is_payload = codec == Codec::None && !sealed;
    let raw = match codec {
        Codec::None => {
            if payload.len() != raw_len as usize {
                return Err(FormatError::Invalid {
                    what: WHAT,
                    detail: format!(
                        "raw payload is {} bytes, header says {raw_len}",
                        payload.len()
                    ),
                });
            }
            payload
        }
        Codec::Zstd => {
            let out = crate::compress::decompress(&payload, raw_len as usize).map_err(|e| {
                FormatError::Invalid {
                    what: WHAT,
                    detail: format!("zstd payload does not decompress: {e}"),
                }
            })?;
            let n = out.len();
            if n != raw_len as usize {
                return Err(FormatError::Invalid {
                    what: WHAT,
                    detail: format!("decompressed {n} bytes, header says {raw_len}"),
                });
            }
            Bytes::from(out)
        }
    };
    let found = match payload_crc {
        Some(c) if raw_is_payload => c,
        _ => crc32c::crc32c(&raw),
    };
    check_crc("pack entry raw data", raw_crc, found)?;
    Ok(raw)
}

/// Appends the index and the footer for `records` to `out` (which holds the entry frames):
/// version 1, or version 2 recording `key_id` (every frame sealed, raw crcs left out).
pub(crate) fn encode_index_and_footer(
    out: &mut Vec<u8>,
    block_size: u32,
    records: &[IndexRecord],
    key_id: Option<KeyId>,
) {
    let index_offset = out.len();
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    out.extend_from_slice(&block_size.to_le_bytes());
    if let Some(id) = key_id {
        out.extend_from_slice(&id.0);
    }
    for rec in records {
        out.extend_from_slice(&rec.block.to_le_bytes());
        out.extend_from_slice(&rec.offset.to_le_bytes());
        out.extend_from_slice(&rec.len.to_le_bytes());
        let raw_crc = if key_id.is_some() { 0 } else { rec.raw_crc };
        out.extend_from_slice(&raw_crc.to_le_bytes());
        out.extend_from_slice(&rec.stored_crc.to_le_bytes());
        let flags = if rec.encrypted { FRAME_ENCRYPTED } else { 0 };
        out.extend_from_slice(&[rec.codec as u8, flags, 0, 0]);
    }
    let index_crc = crc32c::crc32c(&out[index_offset..]);
    let index_len = (out.len() - index_offset) as u64;
    let footer_start = out.len();
    out.extend_from_slice(PACK_MAGIC);
    let version = if key_id.is_some() {
        PACK_VERSION_ENCRYPTED
    } else {
        PACK_VERSION
    };
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    out.extend_from_slice(&(index_offset as u64).to_le_bytes());
    out.extend_from_slice(&index_len.to_le_bytes());
    out.extend_from_slice(&index_crc.to_le_bytes());
    let footer_crc = crc32c::crc32c(&out[footer_start..]);
    out.extend_from_slice(&footer_crc.to_le_bytes());
}

/// The decoded footer of a pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackFooter {
    /// [`PACK_VERSION`] or [`PACK_VERSION_ENCRYPTED`].
    pub version: u32,
    /// Number of entries.
    pub entry_count: u32,
    /// Offset of the index.
    pub index_offset: u64,
    /// Length of the index.
    pub index_len: u64,
    /// crc32c of the index bytes.
    pub index_crc: u32,
}

/// Decodes the last [`FOOTER_LEN`] bytes of a pack.
pub fn decode_footer(footer: &[u8]) -> Result<PackFooter, FormatError> {
    const WHAT: &str = "pack footer";
    if footer.len() != FOOTER_LEN {
        return Err(FormatError::Truncated {
            what: WHAT,
            need: FOOTER_LEN as u64,
            have: footer.len() as u64,
        });
    }
    let mut r = Reader::new(WHAT, footer);
    expect_magic(&mut r, PACK_MAGIC)?;
    let version = r.u32()?;
    if version != PACK_VERSION && version != PACK_VERSION_ENCRYPTED {
        return Err(FormatError::UnsupportedVersion {
            what: WHAT,
            version,
        });
    }
    let entry_count = r.u32()?;
    let index_offset = r.u64()?;
    let index_len = r.u64()?;
    let index_crc = r.u32()?;
    let footer_crc = r.u32()?;
    check_crc(WHAT, footer_crc, crc32c::crc32c(&footer[..FOOTER_LEN - 4]))?;
    let header_len = if version == PACK_VERSION {
        INDEX_HEADER_LEN
    } else {
        INDEX_HEADER_LEN_ENCRYPTED
    };
    let expected_len = header_len as u64 + entry_count as u64 * INDEX_RECORD_LEN as u64;
    if index_len != expected_len {
        return Err(FormatError::Invalid {
            what: WHAT,
            detail: format!("index length {index_len} does not fit {entry_count} entries"),
        });
    }
    Ok(PackFooter {
        version,
        entry_count,
        index_offset,
        index_len,
        index_crc,
    })
}

/// Decodes and verifies a pack's index given the whole pack; checks that every entry lies
/// inside the entry area and that entries do not overlap. (Block size, records.)
pub fn decode_index(pack: &[u8]) -> Result<(u32, Vec<IndexRecord>), FormatError> {
    decode_index_with_key_id(pack).map(|(block_size, _, records)| (block_size, records))
}

/// [`decode_index`], and the key id of an encrypted pack (version 2; its frames are all
/// sealed and its records' raw crcs are 0).
pub fn decode_index_with_key_id(
    pack: &[u8],
) -> Result<(u32, Option<KeyId>, Vec<IndexRecord>), FormatError> {
    const WHAT: &str = "pack index";
    let Some(footer_start) = pack.len().checked_sub(FOOTER_LEN) else {
        return Err(FormatError::Truncated {
            what: "pack",
            need: FOOTER_LEN as u64,
            have: pack.len() as u64,
        });
    };
    let footer = decode_footer(&pack[footer_start..])?;
    let end = footer.index_offset.checked_add(footer.index_len);
    if end != Some(footer_start as u64) {
        return Err(FormatError::Invalid {
            what: WHAT,
            detail: format!(
                "index {}+{} does not end at footer offset {footer_start}",
                footer.index_offset, footer.index_len
            ),
        });
    }
    let index = &pack[footer.index_offset as usize..footer_start];
    check_crc(WHAT, footer.index_crc, crc32c::crc32c(index))?;
    let mut r = Reader::new(WHAT, index);
    let count = r.u32()?;
    let block_size = r.u32()?;
    let key_id = if footer.version == PACK_VERSION_ENCRYPTED {
        let mut id = [0u8; 8];
        id.copy_from_slice(r.bytes(8)?);
        Some(KeyId(id))
    } else {
        None
    };
    if count != footer.entry_count || block_size == 0 || block_size > MAX_BLOCK_SIZE {
        return Err(FormatError::Invalid {
            what: WHAT,
            detail: format!("entry count {count} / block size {block_size}"),
        });
    }
    let mut records = Vec::with_capacity(count as usize);
    let mut next_free = 0u64;
    for i in 0..count {
        let block = r.u64()?;
        let offset = r.u64()?;
        let len = r.u32()?;
        let raw_crc = r.u32()?;
        let stored_crc = r.u32()?;
        let codec = Codec::from_u8(WHAT, r.u8()?)?;
        let flags = r.u8()?;
        r.bytes(2)?;
        let encrypted = key_id.is_some();
        if flags != if encrypted { FRAME_ENCRYPTED } else { 0 } {
            return Err(FormatError::Invalid {
                what: WHAT,
                detail: format!(
                    "entry {i} flags {flags:#04x} in a version {} pack",
                    footer.version
                ),
            });
        }
        let end = offset.checked_add(len as u64);
        if offset < next_free
            || (len as usize) < ENTRY_HEADER_LEN
            || end.is_none_or(|e| e > footer.index_offset)
        {
            return Err(FormatError::Invalid {
                what: WHAT,
                detail: format!("entry {i} range {offset}+{len} overlaps or leaves the entry area"),
            });
        }
        next_free = offset + len as u64;
        records.push(IndexRecord {
            block,
            offset,
            len,
            raw_crc,
            stored_crc,
            codec,
            encrypted,
        });
    }
    r.finish()?;
    Ok((block_size, key_id, records))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A raw frame's crc is the header's extended by the block's (`crc32c_combine`): it must
    /// equal a crc over the whole frame, with and without a compressor whose probe stores the
    /// block raw.
    #[test]
    fn a_raw_frame_crc_combined_from_the_block_crc_matches_a_whole_frame_crc() {
        let raw = glidefs_testkit::noise(7, 64 * 1024); // noise zstd cannot shrink
        let mut c = BlockCompressor::new(1).unwrap();
        for compressor in [None, Some(&mut c)] {
            let mut out = vec![0xAB; 7];
            let rec = encode_entry(&mut out, compressor, 42, &raw, None).unwrap();
            assert_eq!(rec.codec, Codec::None, "noise is stored raw");
            let frame = &out[7..];
            assert_eq!(rec.stored_crc, crc32c::crc32c(&frame[4..]));
            assert_eq!(rec.raw_crc, crc32c::crc32c(&raw));
            let (crc, codec) = check_frame(frame, 42, raw.len() as u32, false).unwrap();
            assert_eq!((crc, codec), (rec.stored_crc, Codec::None));
        }
    }

    fn frame_of(
        raw: &[u8],
        block: BlockIndex,
        zstd: bool,
        key: Option<&VolumeKey>,
    ) -> (Vec<u8>, IndexRecord) {
        let mut c = BlockCompressor::new(1).unwrap();
        let mut out = Vec::new();
        let rec = encode_entry(&mut out, zstd.then_some(&mut c), block, raw, key).unwrap();
        (out, rec)
    }

    /// Rewrites a frame's stored crc so that only the later checks can reject it.
    fn fix_crc(frame: &mut [u8]) {
        let crc = crc32c::crc32c(&frame[4..]);
        frame[..4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Round trips of raw, zstd and sealed frames of sizes around the 20-byte header and
    /// odd sizes, with the stored crc equal to a crc of bytes 4.. in every case.
    #[test]
    fn frames_round_trip_at_odd_sizes() {
        let key = VolumeKey::from_bytes([7; 32]);
        for len in [0usize, 1, 3, 19, 20, 21, 511, 4095, 4097, 65_537, 131_072] {
            for (raw, zstd) in [
                (glidefs_testkit::noise(len as u64, len), false),
                (glidefs_testkit::noise(len as u64, len), true),
                (vec![0x5A; len], true),
            ] {
                for k in [None, Some(&key)] {
                    let (frame, rec) = frame_of(&raw, 9, zstd, k);
                    assert_eq!(rec.stored_crc, crc32c::crc32c(&frame[4..]), "len {len}");
                    assert_eq!(rec.raw_crc, crc32c::crc32c(&raw));
                    let got = decode_entry(Bytes::from(frame), 9, rec.raw_crc, k).unwrap();
                    assert_eq!(
                        &got[..],
                        &raw[..],
                        "len {len}, zstd {zstd}, key {}",
                        k.is_some()
                    );
                }
            }
        }
    }

    /// A frame of 0..=20 bytes never panics; one of exactly 20 bytes (an empty raw block) is
    /// accepted only with its block, raw crc 0, codec none and no flags.
    #[test]
    fn short_frames_are_rejected_or_are_an_empty_block() {
        let key = VolumeKey::from_bytes([7; 32]);
        for len in 0..=ENTRY_HEADER_LEN {
            for fill in [0u8, 1, 0xFF] {
                let mut f = vec![fill; len];
                if len >= 4 {
                    fix_crc(&mut f);
                }
                let _ = decode_entry(Bytes::from(f.clone()), 0, 0, None);
                let _ = decode_entry(Bytes::from(f.clone()), 0, 0, Some(&key));
                if len < ENTRY_HEADER_LEN {
                    assert!(
                        decode_entry(Bytes::from(f), 0, 0, None).is_err(),
                        "len {len}"
                    );
                }
            }
        }
        let (frame, rec) = frame_of(&[], 5, false, None);
        assert_eq!((frame.len(), rec.raw_crc), (ENTRY_HEADER_LEN, 0));
        assert!(decode_entry(Bytes::from(frame.clone()), 5, 0, None)
            .unwrap()
            .is_empty());
        assert!(decode_entry(Bytes::from(frame.clone()), 4, 0, None).is_err());
        assert!(decode_entry(Bytes::from(frame.clone()), 5, 1, None).is_err());
        assert!(decode_entry(Bytes::from(frame.clone()), 5, 0, Some(&key)).is_err());
        let mut l = frame.clone();
        l[16] = 1; // raw length 1, no payload
        fix_crc(&mut l);
        assert!(decode_entry(Bytes::from(l), 5, 0, None).is_err());
    }

    /// Every bit flip, truncation and one-byte extension of raw, zstd and sealed frames is
    /// rejected, and so is every wrong raw crc.
    #[test]
    fn any_damage_to_a_frame_is_rejected() {
        let key = VolumeKey::from_bytes([7; 32]);
        for (raw, zstd) in [
            (glidefs_testkit::noise(3, 97), false),
            (vec![0x11; 300], true),
        ] {
            for k in [None, Some(&key)] {
                let (frame, rec) = frame_of(&raw, 77, zstd, k);
                let dec = |f: &[u8], crc| decode_entry(Bytes::copy_from_slice(f), 77, crc, k);
                assert_eq!(&dec(&frame, rec.raw_crc).unwrap()[..], &raw[..]);
                for bit in 0..frame.len() * 8 {
                    let mut f = frame.clone();
                    f[bit / 8] ^= 1 << (bit % 8);
                    assert!(dec(&f, rec.raw_crc).is_err(), "bit {bit} flipped accepted");
                }
                for cut in 0..frame.len() {
                    assert!(
                        dec(&frame[..cut], rec.raw_crc).is_err(),
                        "cut at {cut} accepted"
                    );
                }
                for extra in [0u8, 0xFF] {
                    let mut f = frame.clone();
                    f.push(extra);
                    assert!(dec(&f, rec.raw_crc).is_err(), "extended accepted");
                    fix_crc(&mut f);
                    assert!(
                        dec(&f, rec.raw_crc).is_err(),
                        "extended, crc fixed, accepted"
                    );
                }
                for bit in 0..32 {
                    assert!(
                        dec(&frame, rec.raw_crc ^ (1 << bit)).is_err(),
                        "raw crc bit {bit}"
                    );
                }
                assert!(decode_entry(Bytes::from(frame.clone()), 78, rec.raw_crc, k).is_err());
                let other = VolumeKey::from_bytes([8; 32]);
                let wrong_key = if k.is_some() { None } else { Some(&other) };
                let got = decode_entry(Bytes::from(frame.clone()), 77, rec.raw_crc, wrong_key);
                assert!(got.is_err(), "sealed/plain mismatch accepted");
            }
        }
    }

    /// Damage behind a rewritten stored crc: the payload of a raw frame (whose crc is reused as
    /// the raw crc), the codec byte, the flags, the block and the raw length.
    #[test]
    fn damage_behind_a_fixed_frame_crc_is_rejected() {
        let raw = glidefs_testkit::noise(5, 4096);
        let (frame, rec) = frame_of(&raw, 3, true, None);
        assert_eq!(rec.codec, Codec::None);
        let dec = |f: &[u8]| decode_entry(Bytes::copy_from_slice(f), 3, rec.raw_crc, None);
        for at in [
            ENTRY_HEADER_LEN,
            ENTRY_HEADER_LEN + 1,
            2000,
            frame.len() - 1,
        ] {
            let mut f = frame.clone();
            f[at] ^= 0x80;
            fix_crc(&mut f);
            assert!(
                dec(&f).is_err(),
                "payload byte {at} changed, crc fixed, accepted"
            );
        }
        // Payload bytes swapped (same multiset, so only a position-sensitive crc catches it).
        let mut f = frame.clone();
        let at = (ENTRY_HEADER_LEN..f.len() - 1)
            .find(|&i| f[i] != f[i + 1])
            .unwrap();
        f.swap(at, at + 1);
        fix_crc(&mut f);
        assert!(f != frame && dec(&f).is_err());
        // Header fields: codec none -> zstd, flags, reserved, block, raw length.
        for (at, v) in [
            (4usize, 1u8),
            (5, 1),
            (6, 1),
            (7, 1),
            (8, 4),
            (15, 1),
            (16, 1),
            (17, 0),
            (19, 1),
        ] {
            let mut f = frame.clone();
            f[at] = v;
            fix_crc(&mut f);
            assert!(
                dec(&f).is_err(),
                "header byte {at} = {v}, crc fixed, accepted"
            );
        }
        // A zstd frame with its codec byte set to none.
        let (z, zrec) = frame_of(&vec![9u8; 4096], 3, true, None);
        assert_eq!(zrec.codec, Codec::Zstd);
        let mut f = z.clone();
        f[4] = Codec::None as u8;
        fix_crc(&mut f);
        assert!(decode_entry(Bytes::from(f), 3, zrec.raw_crc, None).is_err());
        // A raw frame whose payload is the zstd frame's, raw length matching, raw crc of the
        // zstd bytes' decompression: rejected, since the payload's crc is not that raw crc.
        let mut f = z[..ENTRY_HEADER_LEN].to_vec();
        f[4] = Codec::None as u8;
        f[16..20].copy_from_slice(&((z.len() - ENTRY_HEADER_LEN) as u32).to_le_bytes());
        f.extend_from_slice(&z[ENTRY_HEADER_LEN..]);
        fix_crc(&mut f);
        assert!(decode_entry(Bytes::from(f), 3, zrec.raw_crc, None).is_err());
    }

    /// The frame crc check agrees with a crc over bytes 4.. of the frame for arbitrary
    /// frames: a Checksum error for the frame exactly when they differ, naming that crc.
    #[test]
    fn the_frame_crc_check_equals_a_whole_frame_crc() {
        for len in 4..600usize {
            let mut f = glidefs_testkit::noise(len as u64 + 1000, len);
            let whole = crc32c::crc32c(&f[4..]);
            f[..4].copy_from_slice(&(whole ^ 1).to_le_bytes());
            match decode_entry(Bytes::from(f.clone()), 0, 0, None) {
                Err(FormatError::Checksum {
                    what: "pack entry",
                    stored,
                    computed,
                }) => {
                    assert_eq!((stored, computed), (whole ^ 1, whole), "len {len}");
                }
                other => panic!("len {len}: {other:?}"),
            }
            fix_crc(&mut f);
            let got = decode_entry(Bytes::from(f), 0, 0, None);
            assert!(
                !matches!(
                    got,
                    Err(FormatError::Checksum {
                        what: "pack entry",
                        ..
                    })
                ),
                "len {len}: {got:?}"
            );
        }
    }
}
