//! Manifest bytes. See FORMAT.md for every byte.
//!
//! Version 2 (written): an object per generation holding a frame for every segment of the
//! block map that changed since it was last stored, then a root that points at the frame of
//! every segment (in this object or in an older generation's object). A flush therefore
//! writes O(changed segments) of frames plus a root of 36 bytes per mapped segment.
//!
//! The root may end with an owner section (who published the generation, whether they
//! released the volume), announced by bit 0 of the header's flags byte; written only when the
//! manifest has an owner, so a manifest without one is byte-identical to what builds before
//! owners wrote.
//!
//! Encryption (bit 1 of the header's flags, FORMAT.md "Encryption"): the root stays readable
//! (GC needs no key) and ends with the key id and a tag authenticating the whole root; each
//! segment frame keeps its pack table readable (GC again) and seals its block records, bound to
//! the frame header (segment, generation) and the pack table. Nonces are synthetic (a keyed
//! hash of what they seal), so encoding stays deterministic.
//!
//! Version 1 (read, and written by [`Manifest::encode_v1`] for tests and tools): a fixed
//! header, a (usually zstd-compressed) body listing the packs once and then every block as a
//! 32-byte record, a trailing crc32c. A version-1 manifest loads with every segment
//! "not stored", so the first publish after it writes them all (the migration to version 2).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use super::manifest_seal::{
    check_key_ids, root_aad, segment_aad, RootSeal, TablePart, ROOT_SEAL_LEN, SEGMENT_SEALED,
};
use super::{check_crc, expect_magic, put_string, FormatError, Reader};
use crate::crypto::{KeyId, VolumeKey, SEAL_OVERHEAD};
use crate::error::ObjStoreError;
use crate::location::{BlockIndex, BlockLocation, PackId};
use crate::manifest::{
    validate_owner_id, FrameRef, Manifest, ManifestOwner, Segment, SEGMENT_BLOCKS,
};

/// Magic at the start of a manifest.
pub const MANIFEST_MAGIC: &[u8; 8] = b"GLIDMNFT";
/// Manifest format version written.
pub const MANIFEST_VERSION: u32 = 2;
/// The dense format (every block in one body), still read.
pub const MANIFEST_VERSION_1: u32 = 1;
/// Bytes of the fixed header.
pub const MANIFEST_HEADER_LEN: usize = 32;
/// Bytes of one block record (version 1 body, version 2 segment payload).
pub const BLOCK_RECORD_LEN: usize = 32;
/// Bytes of one segment entry of the version 2 root.
pub const SEGMENT_ENTRY_LEN: usize = 36;
/// Bytes of a version 2 segment frame header.
pub const FRAME_HEADER_LEN: usize = 28;
/// Largest decoded body (version 1) or root (version 2) accepted.
pub const MAX_MANIFEST_BODY: u64 = 1 << 30;
/// Largest decoded segment payload accepted.
pub const MAX_SEGMENT_PAYLOAD: u64 = 64 << 20;

/// Header flag (version 2, byte 13): the root ends with an owner section.
pub const FLAG_OWNER: u8 = 0x01;
/// Header flag (version 2, byte 13): the manifest is encrypted (the root ends with the key id
/// and its tag; every segment frame seals its block records).
pub const FLAG_ENCRYPTED: u8 = 0x02;
/// Header flags this build knows.
const KNOWN_FLAGS: u8 = FLAG_OWNER | FLAG_ENCRYPTED;
/// Owner section state byte: the owner holds the volume.
const OWNER_HELD: u8 = 0;
/// Owner section state byte: the owner released the volume.
const OWNER_RELEASED: u8 = 1;

const CODEC_NONE: u8 = 0;
const CODEC_ZSTD: u8 = 1;
const ZSTD_LEVEL: i32 = 3;

/// Compresses `raw` when that makes it smaller: (codec, stored bytes).
pub(super) fn compress(raw: Vec<u8>) -> (u8, Vec<u8>) {
    match zstd::bulk::compress(&raw, ZSTD_LEVEL) {
        Ok(c) if c.len() < raw.len() => (CODEC_ZSTD, c),
        _ => (CODEC_NONE, raw),
    }
}

/// The decoded bytes of `stored` (`raw_len` of them, at most `max`).
pub(super) fn decompress(
    what: &'static str,
    codec: u8,
    stored: &[u8],
    raw_len: u64,
    max: u64,
) -> Result<Vec<u8>, FormatError> {
    let invalid = |detail: String| FormatError::Invalid { what, detail };
    if raw_len > max {
        return Err(invalid(format!("decoded length {raw_len} exceeds {max}")));
    }
    let body = match codec {
        CODEC_NONE => stored.to_vec(),
        CODEC_ZSTD => {
            let mut out = vec![0u8; raw_len as usize];
            let n = zstd::bulk::decompress_to_buffer(stored, &mut out[..])
                .map_err(|e| invalid(format!("does not decompress: {e}")))?;
            out.truncate(n);
            out
        }
        other => return Err(invalid(format!("codec {other}"))),
    };
    if body.len() as u64 != raw_len {
        return Err(invalid(format!(
            "decoded {} bytes, header says {raw_len}",
            body.len()
        )));
    }
    Ok(body)
}

/// [`decompress`] of a segment's stored part (at most [`MAX_SEGMENT_PAYLOAD`] decoded bytes).
pub(super) fn decompress_segment(
    what: &'static str,
    codec: u8,
    stored: &[u8],
    raw_len: u32,
) -> Result<Vec<u8>, FormatError> {
    decompress(what, codec, stored, u64::from(raw_len), MAX_SEGMENT_PAYLOAD)
}

/// Appends a pack table (`packs`, sorted, numbered in order) and the block records.
fn put_blocks<'a>(
    out: &mut Vec<u8>,
    packs: impl Iterator<Item = &'a PackId>,
    blocks: impl Iterator<Item = (BlockIndex, &'a BlockLocation)>,
    count: u64,
    wide_count: bool,
) {
    let packs = put_pack_table(out, packs);
    put_records(out, &packs, blocks, count, wide_count);
}

/// Appends a pack table (`packs`, sorted, numbered in order); returns the numbering.
fn put_pack_table<'a>(
    out: &mut Vec<u8>,
    packs: impl Iterator<Item = &'a PackId>,
) -> BTreeMap<&'a PackId, u32> {
    let packs: BTreeMap<&PackId, u32> = packs.enumerate().map(|(i, p)| (p, i as u32)).collect();
    out.extend_from_slice(&(packs.len() as u32).to_le_bytes());
    for id in packs.keys() {
        put_string(out, id.as_str());
    }
    packs
}

/// Appends the record count and the block records, naming packs by their number in `packs`.
fn put_records<'a>(
    out: &mut Vec<u8>,
    packs: &BTreeMap<&'a PackId, u32>,
    blocks: impl Iterator<Item = (BlockIndex, &'a BlockLocation)>,
    count: u64,
    wide_count: bool,
) {
    if wide_count {
        out.extend_from_slice(&count.to_le_bytes());
    } else {
        out.extend_from_slice(&(count as u32).to_le_bytes());
    }
    for (block, loc) in blocks {
        out.extend_from_slice(&block.to_le_bytes());
        out.extend_from_slice(&packs[&loc.pack].to_le_bytes());
        out.extend_from_slice(&loc.entry.to_le_bytes());
        out.extend_from_slice(&loc.offset.to_le_bytes());
        out.extend_from_slice(&loc.len.to_le_bytes());
        out.extend_from_slice(&loc.raw_crc.to_le_bytes());
    }
}

/// Reads a pack table and block records (ascending, each checked by `check`).
fn get_blocks(
    r: &mut Reader<'_>,
    wide_count: bool,
    what: &'static str,
    check: impl FnMut(BlockIndex) -> Result<(), String>,
) -> Result<BTreeMap<BlockIndex, BlockLocation>, FormatError> {
    let packs = get_pack_table(r, what)?;
    get_records(r, &packs, wide_count, what, check)
}

/// Reads a pack table.
pub(super) fn get_pack_table(
    r: &mut Reader<'_>,
    what: &'static str,
) -> Result<Vec<PackId>, FormatError> {
    let invalid = |detail: String| FormatError::Invalid { what, detail };
    let pack_count = r.u32()? as usize;
    // Each table entry takes at least 2 bytes: bound the allocation by what is present.
    if pack_count > r.remaining() / 2 {
        return Err(invalid(format!("pack count {pack_count} exceeds the body")));
    }
    let mut packs = Vec::with_capacity(pack_count);
    for _ in 0..pack_count {
        let id = PackId(r.string("pack id")?.into());
        id.validate()
            .map_err(|e| invalid(format!("pack table: {e}")))?;
        packs.push(id);
    }
    Ok(packs)
}

/// Reads the record count and the block records (ascending, each checked by `check`), whose
/// pack numbers index `packs`.
fn get_records(
    r: &mut Reader<'_>,
    packs: &[PackId],
    wide_count: bool,
    what: &'static str,
    mut check: impl FnMut(BlockIndex) -> Result<(), String>,
) -> Result<BTreeMap<BlockIndex, BlockLocation>, FormatError> {
    let invalid = |detail: String| FormatError::Invalid { what, detail };
    let pack_count = packs.len();
    let block_count = if wide_count {
        r.u64()?
    } else {
        u64::from(r.u32()?)
    };
    if block_count.saturating_mul(BLOCK_RECORD_LEN as u64) != r.remaining() as u64 {
        return Err(invalid(format!(
            "{block_count} block records do not fill the {} remaining bytes",
            r.remaining()
        )));
    }
    let mut blocks = BTreeMap::new();
    let mut previous: Option<u64> = None;
    for _ in 0..block_count {
        let block = r.u64()?;
        let pack_ref = r.u32()? as usize;
        let entry = r.u32()?;
        let offset = r.u64()?;
        let len = r.u32()?;
        let raw_crc = r.u32()?;
        if previous.is_some_and(|p| block <= p) {
            return Err(invalid(format!("block {block} out of order")));
        }
        previous = Some(block);
        check(block).map_err(invalid)?;
        let pack = packs
            .get(pack_ref)
            .ok_or_else(|| {
                invalid(format!(
                    "block {block} names pack #{pack_ref} of {pack_count}"
                ))
            })?
            .clone();
        blocks.insert(
            block,
            BlockLocation {
                pack,
                entry,
                offset,
                len,
                raw_crc,
            },
        );
    }
    Ok(blocks)
}

/// The header fields after the magic.
struct Header {
    version: u32,
    codec: u8,
    /// Version 2 flags ([`FLAG_OWNER`]); version 1 ignores the byte, as it always did.
    flags: u8,
    raw_len: u64,
    stored_len: u64,
}

fn read_header(r: &mut Reader<'_>) -> Result<Header, FormatError> {
    expect_magic(r, MANIFEST_MAGIC)?;
    let version = r.u32()?;
    if version != MANIFEST_VERSION && version != MANIFEST_VERSION_1 {
        return Err(FormatError::UnsupportedVersion {
            what: "manifest",
            version,
        });
    }
    let codec = r.u8()?;
    let flags = r.u8()?;
    r.bytes(2)?;
    if version == MANIFEST_VERSION && flags & !KNOWN_FLAGS != 0 {
        return Err(FormatError::Invalid {
            what: "manifest",
            detail: format!(
                "unknown header flags {flags:#04x} (this build knows {KNOWN_FLAGS:#04x})"
            ),
        });
    }
    Ok(Header {
        version,
        codec,
        flags,
        raw_len: r.u64()?,
        stored_len: r.u64()?,
    })
}

fn put_header(
    out: &mut Vec<u8>,
    version: u32,
    codec: u8,
    flags: u8,
    raw_len: usize,
    stored_len: usize,
) {
    out.extend_from_slice(MANIFEST_MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&[codec, flags, 0, 0]);
    out.extend_from_slice(&(raw_len as u64).to_le_bytes());
    out.extend_from_slice(&(stored_len as u64).to_le_bytes());
}

/// One segment entry of a version 2 root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RootEntry {
    pub index: u64,
    pub frame: FrameRef,
    pub blocks: u32,
}

/// A decoded version 2 root: the header fields and where every segment's frame is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Root {
    pub volume: String,
    pub generation: u64,
    pub block_size: u32,
    pub volume_size: u64,
    pub mapped: u64,
    pub entries: Vec<RootEntry>,
    pub owner: Option<ManifestOwner>,
    /// The key id of an encrypted manifest, with what its tag authenticates.
    pub sealed: Option<RootSeal>,
}

/// A decoded manifest object.
#[derive(Debug)]
pub(crate) enum Decoded {
    /// Version 1: the whole map.
    Full(Manifest),
    /// Version 2: the root; frames are read from `bytes` (this generation's) or from older
    /// objects (see [`assemble`]).
    Root(Root),
}

impl Manifest {
    /// Encodes this generation's manifest object (format 2, after [`Manifest::validate`]):
    /// frames for the segments not stored in another generation, then the root. Deterministic
    /// (equal manifests with equal stored segments give equal bytes). Also returns where each
    /// written segment's frame lies in the object, for the store to record once the object is
    /// published. With `key`, the manifest is encrypted (FORMAT.md, "Encryption").
    pub(crate) fn encode_with_frames(
        &self,
        key: Option<&VolumeKey>,
    ) -> Result<(Bytes, Vec<(u64, FrameRef)>), ObjStoreError> {
        self.validate()?;
        let mut out = Vec::new();
        put_header(&mut out, MANIFEST_VERSION, 0, 0, 0, 0); // patched below
        let mut written = Vec::new();
        let mut entries = Vec::with_capacity(self.segments.len());
        for (&index, seg) in &self.segments {
            let elsewhere = seg.stored.filter(|_| self.is_stored_elsewhere(seg));
            let frame = match elsewhere {
                Some(frame) => frame,
                None => {
                    let frame = self.put_frame(&mut out, index, seg, key)?;
                    written.push((index, frame));
                    frame
                }
            };
            entries.push(RootEntry {
                index,
                frame,
                blocks: seg.blocks.len() as u32,
            });
        }
        let mut root = Vec::with_capacity(64 + entries.len() * SEGMENT_ENTRY_LEN);
        root.extend_from_slice(&self.generation.to_le_bytes());
        root.extend_from_slice(&self.block_size.to_le_bytes());
        root.extend_from_slice(&self.volume_size.to_le_bytes());
        put_string(&mut root, &self.volume);
        root.extend_from_slice(&(SEGMENT_BLOCKS as u32).to_le_bytes());
        root.extend_from_slice(&self.mapped.to_le_bytes());
        root.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for e in &entries {
            root.extend_from_slice(&e.index.to_le_bytes());
            root.extend_from_slice(&e.frame.generation.to_le_bytes());
            root.extend_from_slice(&e.frame.offset.to_le_bytes());
            root.extend_from_slice(&e.frame.len.to_le_bytes());
            root.extend_from_slice(&e.frame.crc.to_le_bytes());
            root.extend_from_slice(&e.blocks.to_le_bytes());
        }
        let mut flags = 0;
        if let Some(o) = &self.owner {
            flags |= FLAG_OWNER;
            put_string(&mut root, &o.id);
            root.extend_from_slice(&o.claimed_at.to_le_bytes());
            root.push(if o.released {
                OWNER_RELEASED
            } else {
                OWNER_HELD
            });
        }
        if let Some(key) = key {
            flags |= FLAG_ENCRYPTED;
            root.extend_from_slice(&key.id().0);
            let aad = root_aad(flags, &root);
            key.seal_synthetic(&aad, &[], &mut root);
        }
        if root.len() as u64 > MAX_MANIFEST_BODY {
            return Err(ObjStoreError::InvalidInput(format!(
                "manifest volume=`{}` generation={} root is {} bytes, limit {MAX_MANIFEST_BODY}",
                self.volume,
                self.generation,
                root.len()
            )));
        }
        let raw_len = root.len();
        let (codec, stored) = compress(root);
        let mut header = Vec::with_capacity(MANIFEST_HEADER_LEN);
        put_header(
            &mut header,
            MANIFEST_VERSION,
            codec,
            flags,
            raw_len,
            stored.len(),
        );
        out[..MANIFEST_HEADER_LEN].copy_from_slice(&header);
        let mut crc = crc32c::crc32c(&header);
        crc = crc32c::crc32c_append(crc, &stored);
        out.extend_from_slice(&stored);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok((Bytes::from(out), written))
    }

    /// Encodes this generation's manifest object (format 2, not encrypted); see
    /// `encode_with_frames`.
    pub fn encode(&self) -> Result<Bytes, ObjStoreError> {
        Ok(self.encode_with_frames(None)?.0)
    }

    /// Encodes this generation's manifest object (format 2), encrypted with `key` when given.
    pub fn encode_with_key(&self, key: Option<&VolumeKey>) -> Result<Bytes, ObjStoreError> {
        Ok(self.encode_with_frames(key)?.0)
    }

    /// Appends the frame of segment `index` to `out` (at this generation); with `key`, the
    /// pack table stays readable and the block records are sealed.
    fn put_frame(
        &self,
        out: &mut Vec<u8>,
        index: u64,
        seg: &Segment,
        key: Option<&VolumeKey>,
    ) -> Result<FrameRef, ObjStoreError> {
        let mut payload = Vec::with_capacity(64 + seg.blocks.len() * BLOCK_RECORD_LEN);
        let mut table = Vec::new();
        let numbers = put_pack_table(
            if key.is_some() {
                &mut table
            } else {
                &mut payload
            },
            seg.packs.keys(),
        );
        put_records(
            &mut payload,
            &numbers,
            seg.blocks.iter().map(|(b, l)| (*b, l)),
            seg.blocks.len() as u64,
            false,
        );
        let raw_len = payload.len();
        let (codec, stored) = compress(payload);
        let offset = out.len() as u64;
        let start = out.len();
        let flags = if key.is_some() { SEGMENT_SEALED } else { 0 };
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&[codec, flags, 0, 0]);
        out.extend_from_slice(&index.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&(raw_len as u32).to_le_bytes());
        match key {
            Some(key) => {
                // The readable pack table: codec, raw length, stored length, stored bytes.
                let table_raw = table.len();
                let (table_codec, table) = compress(table);
                let too_big = |_| {
                    ObjStoreError::InvalidInput(format!("segment {index} pack table exceeds 4 GiB"))
                };
                let section = out.len();
                out.push(table_codec);
                out.extend_from_slice(&u32::try_from(table_raw).map_err(too_big)?.to_le_bytes());
                out.extend_from_slice(&u32::try_from(table.len()).map_err(too_big)?.to_le_bytes());
                out.extend_from_slice(&table);
                let aad = segment_aad(&out[start..start + FRAME_HEADER_LEN], &out[section..]);
                key.seal_synthetic(&aad, &stored, out);
            }
            None => out.extend_from_slice(&stored),
        }
        let crc = crc32c::crc32c(&out[start + 4..]);
        out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
        let len = u32::try_from(out.len() - start).map_err(|_| {
            ObjStoreError::InvalidInput(format!("segment {index} frame exceeds 4 GiB"))
        })?;
        Ok(FrameRef {
            generation: self.generation,
            offset,
            len,
            crc,
        })
    }

    /// Encodes format 1 (every block in one body). Publishing writes format 2; this exists
    /// for tests and tools that need version-1 objects. Format 1 has no owner record: a
    /// manifest with an owner is refused.
    pub fn encode_v1(&self) -> Result<Bytes, ObjStoreError> {
        self.validate()?;
        if let Some(o) = &self.owner {
            return Err(ObjStoreError::InvalidInput(format!(
                "manifest volume=`{}` generation={}: format 1 cannot record owner `{}`",
                self.volume, self.generation, o.id
            )));
        }
        let mut body = Vec::with_capacity(64 + self.len() as usize * BLOCK_RECORD_LEN);
        body.extend_from_slice(&self.generation.to_le_bytes());
        body.extend_from_slice(&self.block_size.to_le_bytes());
        body.extend_from_slice(&self.volume_size.to_le_bytes());
        put_string(&mut body, &self.volume);
        put_blocks(
            &mut body,
            self.referenced_packs().into_iter(),
            self.iter(),
            self.len(),
            true,
        );
        if body.len() as u64 > MAX_MANIFEST_BODY {
            return Err(ObjStoreError::InvalidInput(format!(
                "manifest volume=`{}` generation={} body is {} bytes, limit {MAX_MANIFEST_BODY}",
                self.volume,
                self.generation,
                body.len()
            )));
        }
        let raw_len = body.len();
        let (codec, stored) = compress(body);
        let mut out = Vec::with_capacity(MANIFEST_HEADER_LEN + stored.len() + 4);
        put_header(
            &mut out,
            MANIFEST_VERSION_1,
            codec,
            0,
            raw_len,
            stored.len(),
        );
        out.extend_from_slice(&stored);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(Bytes::from(out))
    }

    /// Decodes and verifies a self-contained manifest object: version 1, or version 2 whose
    /// frames all lie in this object (a root pointing into older objects needs the store:
    /// `VolumeStore::fetch_manifest`). Any damage is a [`FormatError`], never a panic. An
    /// encrypted manifest is refused (`KeyMismatch`): see [`Manifest::decode_with_key`].
    pub fn decode(bytes: &[u8]) -> Result<Manifest, FormatError> {
        Self::decode_with_key(bytes, None)
    }

    /// [`Manifest::decode`] of a manifest encrypted with `key` (`None`: not encrypted); a
    /// manifest recording another key id, or none when a key is given, is `KeyMismatch`.
    pub fn decode_with_key(bytes: &[u8], key: Option<&VolumeKey>) -> Result<Manifest, FormatError> {
        match decode_object(bytes)? {
            Decoded::Full(m) => {
                check_key_ids("manifest", None, key)?;
                Ok(m)
            }
            Decoded::Root(root) => {
                root.check_key(key)?;
                let mut frames = Vec::with_capacity(root.entries.len());
                for e in &root.entries {
                    if e.frame.generation != root.generation {
                        return Err(FormatError::Invalid {
                            what: "manifest root",
                            detail: format!(
                                "segment {} is stored in generation {}: not self-contained",
                                e.index, e.frame.generation
                            ),
                        });
                    }
                    frames.push(frame_in(bytes, e)?);
                }
                assemble(root, frames, key)
            }
        }
    }
}

/// The bytes of `e`'s frame inside its own generation's object `bytes`.
pub(crate) fn frame_in<'a>(bytes: &'a [u8], e: &RootEntry) -> Result<&'a [u8], FormatError> {
    let start = usize::try_from(e.frame.offset).unwrap_or(usize::MAX);
    let end = start.saturating_add(e.frame.len as usize);
    bytes
        .get(start..end)
        .filter(|_| start >= MANIFEST_HEADER_LEN)
        .ok_or_else(|| FormatError::Invalid {
            what: "manifest root",
            detail: format!(
                "segment {} frame {}+{} lies outside the {}-byte object",
                e.index,
                e.frame.offset,
                e.frame.len,
                bytes.len()
            ),
        })
}

/// Decodes a manifest object: a whole version 1 map, or a version 2 root.
pub(crate) fn decode_object(bytes: &[u8]) -> Result<Decoded, FormatError> {
    const WHAT: &str = "manifest";
    let Some(crc_at) = bytes.len().checked_sub(4) else {
        return Err(FormatError::Truncated {
            what: WHAT,
            need: (MANIFEST_HEADER_LEN + 4) as u64,
            have: bytes.len() as u64,
        });
    };
    let mut r = Reader::new(WHAT, &bytes[..crc_at]);
    let Header {
        version,
        codec,
        flags,
        raw_len,
        stored_len,
    } = read_header(&mut r)?;
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&bytes[crc_at..]);
    let stored_crc = u32::from_le_bytes(crc);
    if version == MANIFEST_VERSION_1 {
        check_crc(WHAT, stored_crc, crc32c::crc32c(&bytes[..crc_at]))?;
        if stored_len != r.remaining() as u64 {
            return Err(FormatError::Invalid {
                what: WHAT,
                detail: format!(
                    "body lengths raw={raw_len} stored={stored_len}, {} bytes present",
                    r.remaining()
                ),
            });
        }
        let stored = r.bytes(stored_len as usize)?;
        let body = decompress(WHAT, codec, stored, raw_len, MAX_MANIFEST_BODY)?;
        return decode_v1_body(&body).map(Decoded::Full);
    }
    // Version 2: header | frames | root | crc(header ‖ root).
    let root_at = (crc_at as u64)
        .checked_sub(stored_len)
        .filter(|&at| at >= MANIFEST_HEADER_LEN as u64)
        .ok_or_else(|| FormatError::Invalid {
            what: WHAT,
            detail: format!(
                "root of {stored_len} bytes does not fit the {}-byte object",
                bytes.len()
            ),
        })? as usize;
    let root_stored = &bytes[root_at..crc_at];
    let computed =
        crc32c::crc32c_append(crc32c::crc32c(&bytes[..MANIFEST_HEADER_LEN]), root_stored);
    check_crc(WHAT, stored_crc, computed)?;
    let root = decompress(WHAT, codec, root_stored, raw_len, MAX_MANIFEST_BODY)?;
    let root = decode_root(&root, flags & FLAG_OWNER != 0, flags & FLAG_ENCRYPTED != 0)?;
    for e in root
        .entries
        .iter()
        .filter(|e| e.frame.generation == root.generation)
    {
        if e.frame.offset.saturating_add(u64::from(e.frame.len)) > root_at as u64 {
            return Err(FormatError::Invalid {
                what: "manifest root",
                detail: format!("segment {} frame overlaps the root", e.index),
            });
        }
    }
    Ok(Decoded::Root(root))
}

fn decode_v1_body(body: &[u8]) -> Result<Manifest, FormatError> {
    const WHAT: &str = "manifest body";
    let mut r = Reader::new(WHAT, body);
    let generation = r.u64()?;
    let block_size = r.u32()?;
    let volume_size = r.u64()?;
    let volume = r.string("volume")?.to_string();
    let blocks = get_blocks(&mut r, true, WHAT, |_| Ok(()))?;
    r.finish()?;
    let mut manifest = Manifest::new(&volume, block_size, volume_size);
    manifest.generation = generation;
    manifest.extend(blocks);
    manifest.validate().map_err(|e| FormatError::Invalid {
        what: WHAT,
        detail: format!("invariant violated: {e}"),
    })?;
    Ok(manifest)
}

pub(super) fn decode_root(
    body: &[u8],
    has_owner: bool,
    has_key: bool,
) -> Result<Root, FormatError> {
    const WHAT: &str = "manifest root";
    let invalid = |detail: String| FormatError::Invalid { what: WHAT, detail };
    let mut r = Reader::new(WHAT, body);
    let generation = r.u64()?;
    let block_size = r.u32()?;
    let volume_size = r.u64()?;
    let volume = r.string("volume")?.to_string();
    let segment_blocks = r.u32()?;
    if u64::from(segment_blocks) != SEGMENT_BLOCKS {
        return Err(invalid(format!(
            "segment size {segment_blocks} blocks (this build reads {SEGMENT_BLOCKS})"
        )));
    }
    let mapped = r.u64()?;
    let count = r.u32()? as usize;
    let entries_len = count.saturating_mul(SEGMENT_ENTRY_LEN);
    let seal_len = if has_key { ROOT_SEAL_LEN } else { 0 };
    let fits = if has_owner {
        entries_len.saturating_add(seal_len) < r.remaining()
    } else {
        entries_len.saturating_add(seal_len) == r.remaining()
    };
    if !fits {
        let and_owner = match (has_owner, has_key) {
            (false, false) => "",
            (true, false) => " and an owner section",
            (false, true) => " and an encryption section",
            (true, true) => " and owner and encryption sections",
        };
        return Err(invalid(format!(
            "{count} segment entries{and_owner} do not fill the {} remaining bytes",
            r.remaining()
        )));
    }
    let probe = Manifest::new(&volume, block_size, volume_size);
    probe
        .validate()
        .map_err(|e| invalid(format!("invariant violated: {e}")))?;
    let segments = probe.block_count().div_ceil(SEGMENT_BLOCKS);
    let mut entries: Vec<RootEntry> = Vec::with_capacity(count);
    let mut total = 0u64;
    for _ in 0..count {
        let e = RootEntry {
            index: r.u64()?,
            frame: FrameRef {
                generation: r.u64()?,
                offset: r.u64()?,
                len: r.u32()?,
                crc: r.u32()?,
            },
            blocks: r.u32()?,
        };
        if entries.last().is_some_and(|p| e.index <= p.index) {
            return Err(invalid(format!("segment {} out of order", e.index)));
        }
        if e.index >= segments
            || e.frame.generation == 0
            || e.frame.generation > generation
            || (e.frame.len as usize) < FRAME_HEADER_LEN
            || e.blocks == 0
            || u64::from(e.blocks) > SEGMENT_BLOCKS
        {
            return Err(invalid(format!("bad segment entry {e:?}")));
        }
        total += u64::from(e.blocks);
        entries.push(e);
    }
    let owner = if has_owner {
        let id = r.string("owner id")?.to_string();
        validate_owner_id(&id).map_err(|e| invalid(e.to_string()))?;
        let claimed_at = r.u64()?;
        if claimed_at == 0 || claimed_at > generation {
            return Err(invalid(format!(
                "owner `{id}` claimed at generation {claimed_at}, outside 1..={generation}"
            )));
        }
        let released = match r.u8()? {
            OWNER_HELD => false,
            OWNER_RELEASED => true,
            other => return Err(invalid(format!("owner state {other}"))),
        };
        Some(ManifestOwner {
            id,
            claimed_at,
            released,
        })
    } else {
        None
    };
    let sealed = if has_key {
        let signed = body.len() - r.remaining() + 8;
        let mut id = [0u8; 8];
        id.copy_from_slice(r.bytes(8)?);
        let flags = FLAG_ENCRYPTED | if has_owner { FLAG_OWNER } else { 0 };
        Some(RootSeal {
            key_id: KeyId(id),
            aad: root_aad(flags, &body[..signed]),
            sealed: r.bytes(SEAL_OVERHEAD)?.to_vec(),
        })
    } else {
        None
    };
    r.finish()?;
    if total != mapped {
        return Err(invalid(format!(
            "segments hold {total} blocks, the root says {mapped}"
        )));
    }
    Ok(Root {
        volume,
        generation,
        block_size,
        volume_size,
        mapped,
        entries,
        owner,
        sealed,
    })
}

/// A segment frame split into its parts, checked against its root entry.
struct FrameParts<'a> {
    codec: u8,
    raw_len: u32,
    /// The readable pack table section of a sealed frame (`None`: plain frame, table in the
    /// payload).
    table: Option<TablePart<'a>>,
    /// The stored payload (sealed: nonce, ciphertext, tag).
    stored: &'a [u8],
    /// The header (for the associated data).
    header: &'a [u8],
}

/// Checks the frame of `e` (length, crc, flags, segment, generation) and splits it.
fn frame_parts<'a>(frame: &'a [u8], e: &RootEntry) -> Result<FrameParts<'a>, FormatError> {
    const WHAT: &str = "manifest segment";
    let invalid = |detail: String| FormatError::Invalid { what: WHAT, detail };
    if frame.len() != e.frame.len as usize {
        return Err(FormatError::Truncated {
            what: WHAT,
            need: u64::from(e.frame.len),
            have: frame.len() as u64,
        });
    }
    let mut r = Reader::new(WHAT, frame);
    let stored_crc = r.u32()?;
    check_crc(WHAT, e.frame.crc, stored_crc)?;
    check_crc(WHAT, stored_crc, crc32c::crc32c(&frame[4..]))?;
    let codec = r.u8()?;
    let flags = r.u8()?;
    if r.u16()? != 0 || flags & !SEGMENT_SEALED != 0 {
        return Err(invalid(format!(
            "frame flags {flags:#04x} or reserved bytes set"
        )));
    }
    let (index, generation, raw_len) = (r.u64()?, r.u64()?, r.u32()?);
    if index != e.index || generation != e.frame.generation {
        return Err(invalid(format!(
            "frame holds segment {index} of generation {generation}, expected segment {} of generation {}",
            e.index, e.frame.generation
        )));
    }
    let table = if flags & SEGMENT_SEALED != 0 {
        let at = frame.len() - r.remaining();
        let (codec, raw_len, len) = (r.u8()?, r.u32()?, r.u32()? as usize);
        let stored = r.bytes(len)?;
        Some(TablePart {
            codec,
            raw_len,
            stored,
            section: &frame[at..at + 9 + len],
        })
    } else {
        None
    };
    Ok(FrameParts {
        codec,
        raw_len,
        table,
        stored: r.bytes(r.remaining())?,
        header: &frame[..FRAME_HEADER_LEN],
    })
}

/// The packs the frame of `e` names, read without a key (GC of an encrypted volume: the pack
/// table of a sealed frame is readable; a plain frame is decoded whole).
pub(crate) fn frame_packs(frame: &[u8], e: &RootEntry) -> Result<Vec<PackId>, FormatError> {
    const WHAT: &str = "manifest segment";
    let parts = frame_parts(frame, e)?;
    match parts.table {
        Some(table) => table.packs(),
        None => {
            let payload = decompress_segment(WHAT, parts.codec, parts.stored, parts.raw_len)?;
            let mut p = Reader::new(WHAT, &payload);
            get_pack_table(&mut p, WHAT)
        }
    }
}

/// Decodes the frame of `e` (its exact bytes) and checks it is the one the root names; a
/// sealed frame is opened with `key` (and refused without one, as a plain frame is with one).
pub(crate) fn decode_frame(
    frame: &[u8],
    e: &RootEntry,
    block_count: u64,
    key: Option<&VolumeKey>,
) -> Result<BTreeMap<BlockIndex, BlockLocation>, FormatError> {
    const WHAT: &str = "manifest segment";
    let invalid = |detail: String| FormatError::Invalid { what: WHAT, detail };
    let index = e.index;
    let parts = frame_parts(frame, e)?;
    let opened;
    let (packs, stored) = match (parts.table, key) {
        (None, None) => (None, parts.stored),
        (Some(table), Some(key)) => {
            let packs = table.packs()?;
            opened = key
                .open(&segment_aad(parts.header, table.section), parts.stored)
                .map_err(|source| FormatError::Decrypt { what: WHAT, source })?;
            (Some(packs), &opened[..])
        }
        (Some(_), None) => {
            return Err(invalid(format!(
                "segment {index} is encrypted and no key was given"
            )))
        }
        (None, Some(key)) => {
            return Err(invalid(format!(
                "segment {index} is not encrypted, but a key (id {}) was given",
                key.id()
            )))
        }
    };
    let payload = decompress_segment(WHAT, parts.codec, stored, parts.raw_len)?;
    let mut p = Reader::new(WHAT, &payload);
    let range = index * SEGMENT_BLOCKS..(index + 1) * SEGMENT_BLOCKS;
    let check = |b| {
        if range.contains(&b) && b < block_count {
            Ok(())
        } else {
            Err(format!("block {b} outside segment {index}"))
        }
    };
    let blocks = match packs {
        Some(packs) => get_records(&mut p, &packs, false, WHAT, check)?,
        None => get_blocks(&mut p, false, WHAT, check)?,
    };
    p.finish()?;
    if blocks.len() as u64 != u64::from(e.blocks) {
        return Err(invalid(format!(
            "segment {index} holds {} blocks, the root says {}",
            blocks.len(),
            e.blocks
        )));
    }
    for (block, loc) in &blocks {
        if (loc.len as usize) < super::pack::ENTRY_HEADER_LEN {
            return Err(invalid(format!(
                "block {block} has a {}-byte location",
                loc.len
            )));
        }
    }
    Ok(blocks)
}

/// Builds the manifest of `root` from the frames of its entries (in entry order), each
/// verified against its entry (and opened with `key`: check the root's key first,
/// [`Root::check_key`]). The segments are marked stored where the root says.
pub(crate) fn assemble(
    root: Root,
    frames: Vec<&[u8]>,
    key: Option<&VolumeKey>,
) -> Result<Manifest, FormatError> {
    let mut m = Manifest::new(&root.volume, root.block_size, root.volume_size);
    m.generation = root.generation;
    let count = m.block_count();
    if frames.len() != root.entries.len() {
        return Err(FormatError::Invalid {
            what: "manifest root",
            detail: format!(
                "{} frames for {} segments",
                frames.len(),
                root.entries.len()
            ),
        });
    }
    for (e, frame) in root.entries.iter().zip(frames) {
        let blocks = decode_frame(frame, e, count, key)?;
        m.segments.insert(
            e.index,
            Arc::new(Segment::from_blocks(blocks, Some(e.frame))),
        );
    }
    m.mapped = root.mapped;
    m.owner = root.owner;
    Ok(m)
}

impl Root {
    /// The key id this root records (`None`: not encrypted).
    pub(crate) fn key_id(&self) -> Option<KeyId> {
        self.sealed.as_ref().map(|s| s.key_id)
    }

    /// Checks that the root was written with `key` (or, without a key, is not encrypted) and
    /// that its tag holds: `KeyMismatch` naming both key ids, or `Decrypt`.
    pub(crate) fn check_key(&self, key: Option<&VolumeKey>) -> Result<(), FormatError> {
        check_key_ids("manifest", self.key_id(), key)?;
        if let (Some(seal), Some(key)) = (&self.sealed, key) {
            key.open(&seal.aad, &seal.sealed)
                .map_err(|source| FormatError::Decrypt {
                    what: "manifest root",
                    source,
                })?;
        }
        Ok(())
    }
}

impl TablePart<'_> {
    /// The pack ids of the table.
    pub(super) fn packs(&self) -> Result<Vec<PackId>, FormatError> {
        const WHAT: &str = "manifest segment pack table";
        let raw = decompress_segment(WHAT, self.codec, self.stored, self.raw_len)?;
        let mut t = Reader::new(WHAT, &raw);
        let packs = get_pack_table(&mut t, WHAT)?;
        t.finish()?;
        Ok(packs)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn sample(blocks: u64) -> Manifest {
        let mut m = Manifest::new("vol-a", 4096, 1 << 30);
        m.generation = 42;
        for b in 0..blocks {
            m.insert(
                b * 3,
                BlockLocation {
                    pack: PackId(format!("pack-{}", b % 5).into()),
                    entry: b as u32,
                    offset: b * 100,
                    len: 100,
                    raw_crc: b as u32 ^ 0xdead_beef,
                },
            );
        }
        m
    }

    #[test]
    fn round_trip_empty_and_large() {
        for n in [0, 1, 10_000] {
            let m = sample(n);
            let bytes = m.encode().unwrap();
            assert_eq!(Manifest::decode(&bytes).unwrap(), m);
            assert_eq!(bytes, m.encode().unwrap(), "encoding is deterministic");
            let v1 = m.encode_v1().unwrap();
            assert_eq!(Manifest::decode(&v1).unwrap(), m, "version 1 still reads");
        }
    }

    /// Segments stored in an older generation are not written again: the object of a
    /// generation that changed one block holds one frame and a root.
    #[test]
    fn only_changed_segments_are_written() {
        let mut m = sample(10_000); // 30_000 blocks: 8 segments
        let (bytes, frames) = m.encode_with_frames(None).unwrap();
        assert_eq!(frames.len(), 8);
        for (i, f) in &frames {
            Arc::make_mut(m.segments.get_mut(i).unwrap()).stored = Some(*f);
        }
        let mut next = m.successor();
        next.insert(5, next.get(3).unwrap().clone());
        let (small, written) = next.encode_with_frames(None).unwrap();
        assert_eq!(written.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![0]);
        assert!(
            small.len() * 4 < bytes.len(),
            "{} bytes for one changed segment vs {} for all",
            small.len(),
            bytes.len()
        );
        let err = Manifest::decode(&small).unwrap_err();
        assert!(err.to_string().contains("not self-contained"), "{err}");
        // With the older object's frames at hand the whole map comes back.
        let Decoded::Root(root) = decode_object(&small).unwrap() else {
            panic!("version 2");
        };
        let frames: Vec<&[u8]> = root
            .entries
            .iter()
            .map(|e| {
                let src: &[u8] = if e.frame.generation == next.generation {
                    &small
                } else {
                    &bytes
                };
                frame_in(src, e).unwrap()
            })
            .collect();
        assert_eq!(assemble(root, frames, None).unwrap(), next);
    }

    #[test]
    fn damage_is_reported_as_format_errors() {
        for bytes in [
            sample(100).encode().unwrap().to_vec(),
            sample(100).encode_v1().unwrap().to_vec(),
        ] {
            let mut bad_magic = bytes.clone();
            bad_magic[0] ^= 1;
            assert!(matches!(
                Manifest::decode(&bad_magic),
                Err(FormatError::BadMagic { .. })
            ));
            let mut bad_version = bytes.clone();
            bad_version[8] = 9;
            assert!(matches!(
                Manifest::decode(&bad_version),
                Err(FormatError::UnsupportedVersion { version: 9, .. })
            ));
            for at in [40, bytes.len() / 2, bytes.len() - 10] {
                let mut flipped = bytes.clone();
                flipped[at] ^= 0x10;
                assert!(
                    matches!(
                        Manifest::decode(&flipped),
                        Err(FormatError::Checksum { .. })
                    ),
                    "flip at {at} of {}",
                    bytes.len()
                );
            }
            assert!(Manifest::decode(&bytes[..bytes.len() - 1]).is_err());
            assert!(Manifest::decode(&[]).is_err());
        }
    }

    /// Generation 3 of a 3-segment volume, no owner: the bytes builds before owners wrote
    /// (captured from the encoder of commit 24bbf77). An owner-less manifest must not change.
    const GOLDEN_NO_OWNER: &str = "474c49444d4e4654020000000100000097000000000000005c000000000000003ddb948001000000000000000000000003000000000000002c00000028b52ffd202c050100a801000000020070610100000007400000000100cdab040020e5c5022070e092a117d57500000000010000000000000003000000000000002c000000010000000200706201000000051000000000000000000000051000002370000000000000400000000510cdabf773498201000000020000000000000003000000000000002c00000028b52ffd202c150100c0010000000200706101000000002000e0400000000020cdab030060e425001ba80328b52ffd20979d0200340303001000030500766f6c2d67200000450000003ddb948001000000016548000000a117d57502ad47000000f7734982010000000d002013d0175806197b54d798adbc74d84930f3804db314bbc0e20c600165e5df82";

    pub(in crate::format) fn golden_manifest() -> Manifest {
        let mut m = Manifest::new("vol-g", 4096, 4096 * 3 * SEGMENT_BLOCKS);
        m.generation = 3;
        for (b, p) in [
            (1u64, "pa"),
            (SEGMENT_BLOCKS + 5, "pb"),
            (2 * SEGMENT_BLOCKS, "pa"),
        ] {
            m.insert(
                b,
                BlockLocation {
                    pack: PackId(p.into()),
                    entry: b as u32,
                    offset: b * 7,
                    len: 64,
                    raw_crc: 0xabcd_0000 ^ b as u32,
                },
            );
        }
        m
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn a_manifest_without_owner_encodes_as_before_owners_existed() {
        let m = golden_manifest();
        assert_eq!(hex(&m.encode().unwrap()), GOLDEN_NO_OWNER);
        let golden: Vec<u8> = (0..GOLDEN_NO_OWNER.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&GOLDEN_NO_OWNER[i..i + 2], 16).unwrap())
            .collect();
        let decoded = Manifest::decode(&golden).unwrap();
        assert_eq!(decoded.owner, None);
        assert_eq!(decoded, m);
    }

    fn owned(released: bool) -> Manifest {
        let mut m = golden_manifest();
        m.owner = Some(ManifestOwner {
            id: "host-a/6f1c2d3e-0000-4000-8000-000000000001".into(),
            claimed_at: 2,
            released,
        });
        m
    }

    /// The decoded root of a manifest object.
    pub(in crate::format) fn raw_root(bytes: &[u8]) -> Vec<u8> {
        let raw_len = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
        let stored_len = u64::from_le_bytes(bytes[24..32].try_into().unwrap()) as usize;
        let stored = &bytes[bytes.len() - 4 - stored_len..bytes.len() - 4];
        decompress("root", bytes[12], stored, raw_len, MAX_MANIFEST_BODY).unwrap()
    }

    #[test]
    fn owner_round_trips_and_sets_the_header_flag() {
        for released in [false, true] {
            let m = owned(released);
            let bytes = m.encode().unwrap();
            assert_eq!(bytes[13], FLAG_OWNER);
            let back = Manifest::decode(&bytes).unwrap();
            assert_eq!(back.owner, m.owner);
            assert_eq!(back, m);
            assert_ne!(back, golden_manifest(), "the owner is part of equality");
            let root = raw_root(&bytes);
            let id = &m.owner.as_ref().unwrap().id;
            let tail = &root[root.len() - (2 + id.len() + 8 + 1)..];
            assert_eq!(&tail[..2], &(id.len() as u16).to_le_bytes());
            assert_eq!(&tail[2..2 + id.len()], id.as_bytes());
            assert_eq!(&tail[2 + id.len()..tail.len() - 1], &2u64.to_le_bytes());
            assert_eq!(tail[tail.len() - 1], released as u8);
        }
        let unowned = golden_manifest().encode().unwrap();
        assert_eq!(unowned[13], 0);
    }

    /// A build from before owners ignores the flags byte and parses the root without the
    /// owner section: it refuses the object (the section reads as trailing bytes) instead of
    /// silently ignoring the owner.
    #[test]
    fn a_reader_unaware_of_owners_refuses_an_owned_root() {
        let bytes = owned(false).encode().unwrap();
        let err = decode_root(&raw_root(&bytes), false, false).unwrap_err();
        assert!(err.to_string().contains("do not fill"), "{err}");
        let ok = decode_root(&raw_root(&bytes), true, false).unwrap();
        assert!(ok.owner.is_some());
    }

    #[test]
    fn damaged_owner_sections_are_refused() {
        let bytes = owned(false).encode().unwrap();
        let root = raw_root(&bytes);
        let n = root.len();
        // Unknown state byte.
        let mut bad = root.clone();
        bad[n - 1] = 2;
        assert!(decode_root(&bad, true, false)
            .unwrap_err()
            .to_string()
            .contains("owner state 2"));
        // claimed_at beyond the generation (3), and zero.
        for claimed in [0u64, 4] {
            let mut bad = root.clone();
            bad[n - 9..n - 1].copy_from_slice(&claimed.to_le_bytes());
            assert!(decode_root(&bad, true, false)
                .unwrap_err()
                .to_string()
                .contains("claimed at generation"));
        }
        // A space in the id.
        let mut bad = root.clone();
        let id_at = n - 9 - "host-a/6f1c2d3e-0000-4000-8000-000000000001".len();
        bad[id_at + 4] = b' ';
        assert!(decode_root(&bad, true, false).is_err());
        // Flag set but no section, and unknown flag bits.
        let plain = golden_manifest().encode().unwrap();
        assert!(decode_root(&raw_root(&plain), true, false).is_err());
        let mut flagged = bytes.to_vec();
        flagged[13] |= 0x80;
        let err = Manifest::decode(&flagged).unwrap_err();
        assert!(err.to_string().contains("unknown header flags"), "{err}");
    }

    #[test]
    fn invalid_owners_are_not_encoded() {
        let mut m = owned(false);
        m.owner.as_mut().unwrap().claimed_at = 4;
        assert!(m.encode().is_err(), "claimed after the generation");
        for id in ["", "a b", "tab\t", &"x".repeat(256)] {
            let mut m = owned(false);
            m.owner.as_mut().unwrap().id = id.to_string();
            assert!(m.encode().is_err(), "{id:?}");
        }
        assert!(owned(false).encode_v1().is_err(), "format 1 has no owner");
    }

    #[test]
    fn encode_refuses_invalid_manifests() {
        let mut m = sample(1);
        m.volume_size = 4096; // one block, but block 0 and ... sample has only block 0
        m.insert(
            5,
            BlockLocation {
                pack: PackId("p".into()),
                entry: 0,
                offset: 0,
                len: 64,
                raw_crc: 0,
            },
        );
        assert!(m.encode().is_err(), "block beyond volume size");
        assert!(m.encode_v1().is_err(), "block beyond volume size");
        let mut m = sample(0);
        m.volume = "bad/name".into();
        assert!(m.encode().is_err());
    }
}

/// Encryption of manifest objects (`manifest_seal.rs`'s contract).
#[cfg(test)]
mod seal_tests {
    use super::tests::{golden_manifest, raw_root};
    use super::*;
    use crate::manifest::FrameRef;

    /// A sealed segment frame is bound to its segment index, its generation and its pack
    /// table: each rewritten (crc fixed, root entry following) fails authentication, while
    /// GC's keyless read of the pack table still works on the untouched frame.
    #[test]
    fn sealed_segment_frames_are_bound_to_their_segment_generation_and_pack_table() {
        let key = VolumeKey::from_bytes([3; 32]);
        let m = golden_manifest();
        let bytes = m.encode_with_key(Some(&key)).unwrap();
        let Decoded::Root(root) = decode_object(&bytes).unwrap() else {
            panic!("version 2");
        };
        assert_eq!(root.key_id(), Some(key.id()));
        root.check_key(Some(&key)).unwrap();
        let count = m.block_count();
        let e = root.entries[1];
        let frame = frame_in(&bytes, &e).unwrap().to_vec();
        assert_eq!(frame[5], SEGMENT_SEALED);
        decode_frame(&frame, &e, count, Some(&key)).unwrap();
        assert_eq!(frame_packs(&frame, &e).unwrap(), vec![PackId("pb".into())]);
        // Rewrites `frame` with `change`, fixes its crc, returns it with a matching entry.
        let bent = |change: &dyn Fn(&mut Vec<u8>), e: RootEntry| {
            let mut f = frame.clone();
            change(&mut f);
            let crc = crc32c::crc32c(&f[4..]);
            f[..4].copy_from_slice(&crc.to_le_bytes());
            let mut e = e;
            e.frame.crc = crc;
            (f, e)
        };
        let moved = RootEntry { index: 2, ..e };
        let (f, e2) = bent(&|f| f[8..16].copy_from_slice(&2u64.to_le_bytes()), moved);
        let err = decode_frame(&f, &e2, count, Some(&key)).unwrap_err();
        assert!(matches!(err, FormatError::Decrypt { .. }), "{err}");
        let older = RootEntry {
            frame: FrameRef {
                generation: 2,
                ..e.frame
            },
            ..e
        };
        let (f, e2) = bent(&|f| f[16..24].copy_from_slice(&2u64.to_le_bytes()), older);
        let err = decode_frame(&f, &e2, count, Some(&key)).unwrap_err();
        assert!(matches!(err, FormatError::Decrypt { .. }), "{err}");
        // The pack table (raw: too small to compress) names `pb`: rename it `pa`.
        let at = frame.windows(2).position(|w| w == b"pb").unwrap();
        let (f, e2) = bent(&|f| f[at + 1] = b'a', e);
        assert_eq!(frame_packs(&f, &e2).unwrap(), vec![PackId("pa".into())]);
        let err = decode_frame(&f, &e2, count, Some(&key)).unwrap_err();
        assert!(matches!(err, FormatError::Decrypt { .. }), "{err}");
        // No key, or a plain frame with a key.
        assert!(decode_frame(&frame, &e, count, None).is_err());
        let plain = m.encode().unwrap();
        let Decoded::Root(proot) = decode_object(&plain).unwrap() else {
            panic!("version 2");
        };
        let pe = proot.entries[1];
        assert!(decode_frame(frame_in(&plain, &pe).unwrap(), &pe, count, Some(&key)).is_err());
    }

    /// The root is authenticated: a changed root (crc fixed) fails with the key; without
    /// the key the mismatch is reported first.
    #[test]
    fn encrypted_roots_are_authenticated() {
        let key = VolumeKey::from_bytes([3; 32]);
        let m = golden_manifest();
        let bytes = m.encode_with_key(Some(&key)).unwrap();
        let mut root = raw_root(&bytes);
        // Generation 3 -> volume size field changed: bytes 12..20 of the root.
        root[12] ^= 0x01;
        let r = decode_root(&root, false, true).unwrap();
        let err = r.check_key(Some(&key)).unwrap_err();
        assert!(matches!(err, FormatError::Decrypt { .. }), "{err}");
        assert!(matches!(
            r.check_key(None),
            Err(FormatError::KeyMismatch { given: None, .. })
        ));
        let other = VolumeKey::from_bytes([4; 32]);
        match r.check_key(Some(&other)) {
            Err(FormatError::KeyMismatch { stored, given, .. }) => {
                assert_eq!((stored, given), (Some(key.id()), Some(other.id())));
            }
            x => panic!("{x:?}"),
        }
    }
}
