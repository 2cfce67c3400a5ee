//! Manifest bytes: a fixed header, a (usually zstd-compressed) body, a trailing crc32c.
//!
//! The body lists the packs once (a table of ids) and then every block as a fixed 32-byte record
//! pointing into that table, in ascending block order. See FORMAT.md for every byte.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{check_crc, expect_magic, put_string, FormatError, Reader};
use crate::error::ObjStoreError;
use crate::location::{BlockLocation, PackId};
use crate::manifest::Manifest;

/// Magic at the start of a manifest.
pub const MANIFEST_MAGIC: &[u8; 8] = b"GLIDMNFT";
/// Current manifest format version.
pub const MANIFEST_VERSION: u32 = 1;
/// Bytes of the fixed header.
pub const MANIFEST_HEADER_LEN: usize = 32;
/// Bytes of one block record in the body.
pub const BLOCK_RECORD_LEN: usize = 32;
/// Largest decoded body accepted (bounds the allocation made while decoding).
pub const MAX_MANIFEST_BODY: u64 = 1 << 30;

const CODEC_NONE: u8 = 0;
const CODEC_ZSTD: u8 = 1;
const ZSTD_LEVEL: i32 = 3;

impl Manifest {
    /// Encodes the manifest (after [`Manifest::validate`]).
    pub fn encode(&self) -> Result<Bytes, ObjStoreError> {
        self.validate()?;
        // Number the pack table in sorted order so equal manifests encode to equal bytes.
        let packs: BTreeMap<&PackId, u32> = self
            .referenced_packs()
            .into_iter()
            .enumerate()
            .map(|(i, id)| (id, i as u32))
            .collect();
        let mut body =
            Vec::with_capacity(64 + packs.len() * 60 + self.blocks.len() * BLOCK_RECORD_LEN);
        body.extend_from_slice(&self.generation.to_le_bytes());
        body.extend_from_slice(&self.block_size.to_le_bytes());
        body.extend_from_slice(&self.volume_size.to_le_bytes());
        put_string(&mut body, &self.volume);
        body.extend_from_slice(&(packs.len() as u32).to_le_bytes());
        for id in packs.keys() {
            put_string(&mut body, id.as_str());
        }
        body.extend_from_slice(&(self.blocks.len() as u64).to_le_bytes());
        for (block, loc) in &self.blocks {
            body.extend_from_slice(&block.to_le_bytes());
            body.extend_from_slice(&packs[&loc.pack].to_le_bytes());
            body.extend_from_slice(&loc.entry.to_le_bytes());
            body.extend_from_slice(&loc.offset.to_le_bytes());
            body.extend_from_slice(&loc.len.to_le_bytes());
            body.extend_from_slice(&loc.raw_crc.to_le_bytes());
        }
        if body.len() as u64 > MAX_MANIFEST_BODY {
            return Err(ObjStoreError::InvalidInput(format!(
                "manifest volume=`{}` generation={} body is {} bytes, limit {MAX_MANIFEST_BODY}",
                self.volume,
                self.generation,
                body.len()
            )));
        }
        let (codec, stored) = match zstd::bulk::compress(&body, ZSTD_LEVEL) {
            Ok(c) if c.len() < body.len() => (CODEC_ZSTD, c),
            _ => (CODEC_NONE, body.clone()),
        };
        let mut out = Vec::with_capacity(MANIFEST_HEADER_LEN + stored.len() + 4);
        out.extend_from_slice(MANIFEST_MAGIC);
        out.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
        out.extend_from_slice(&[codec, 0, 0, 0]);
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&(stored.len() as u64).to_le_bytes());
        out.extend_from_slice(&stored);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(Bytes::from(out))
    }

    /// Decodes and verifies a manifest; any damage is a [`FormatError`], never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, FormatError> {
        const WHAT: &str = "manifest";
        let Some(crc_at) = bytes.len().checked_sub(4) else {
            return Err(FormatError::Truncated {
                what: WHAT,
                need: (MANIFEST_HEADER_LEN + 4) as u64,
                have: bytes.len() as u64,
            });
        };
        let mut r = Reader::new(WHAT, &bytes[..crc_at]);
        expect_magic(&mut r, MANIFEST_MAGIC)?;
        let version = r.u32()?;
        if version != MANIFEST_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                version,
            });
        }
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&bytes[crc_at..]);
        check_crc(
            WHAT,
            u32::from_le_bytes(crc),
            crc32c::crc32c(&bytes[..crc_at]),
        )?;
        let codec = r.u8()?;
        r.bytes(3)?;
        let raw_len = r.u64()?;
        let stored_len = r.u64()?;
        if raw_len > MAX_MANIFEST_BODY || stored_len != r.remaining() as u64 {
            return Err(FormatError::Invalid {
                what: WHAT,
                detail: format!(
                    "body lengths raw={raw_len} stored={stored_len}, {} bytes present",
                    r.remaining()
                ),
            });
        }
        let stored = r.bytes(stored_len as usize)?;
        let decompressed;
        let body: &[u8] = match codec {
            CODEC_NONE => stored,
            CODEC_ZSTD => {
                let mut out = vec![0u8; raw_len as usize];
                let n = zstd::bulk::decompress_to_buffer(stored, &mut out[..]).map_err(|e| {
                    FormatError::Invalid {
                        what: WHAT,
                        detail: format!("body does not decompress: {e}"),
                    }
                })?;
                out.truncate(n);
                decompressed = out;
                &decompressed
            }
            other => {
                return Err(FormatError::Invalid {
                    what: WHAT,
                    detail: format!("codec {other}"),
                })
            }
        };
        if body.len() as u64 != raw_len {
            return Err(FormatError::Invalid {
                what: WHAT,
                detail: format!("body is {} bytes, header says {raw_len}", body.len()),
            });
        }
        decode_body(body)
    }
}

fn decode_body(body: &[u8]) -> Result<Manifest, FormatError> {
    const WHAT: &str = "manifest body";
    let invalid = |detail: String| FormatError::Invalid { what: WHAT, detail };
    let mut r = Reader::new(WHAT, body);
    let generation = r.u64()?;
    let block_size = r.u32()?;
    let volume_size = r.u64()?;
    let volume = r.string("volume")?.to_string();
    let pack_count = r.u32()? as usize;
    // Each table entry takes at least 2 bytes: bound the allocation by what is present.
    if pack_count > r.remaining() / 2 {
        return Err(invalid(format!("pack count {pack_count} exceeds the body")));
    }
    let mut packs = Vec::with_capacity(pack_count);
    for _ in 0..pack_count {
        let id = PackId(r.string("pack id")?.to_string());
        id.validate()
            .map_err(|e| invalid(format!("pack table: {e}")))?;
        packs.push(id);
    }
    let block_count = r.u64()?;
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
    r.finish()?;
    let manifest = Manifest {
        volume,
        generation,
        block_size,
        volume_size,
        blocks,
    };
    manifest
        .validate()
        .map_err(|e| invalid(format!("invariant violated: {e}")))?;
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(blocks: u64) -> Manifest {
        let mut m = Manifest::new("vol-a", 4096, 1 << 30);
        m.generation = 42;
        for b in 0..blocks {
            m.blocks.insert(
                b * 3,
                BlockLocation {
                    pack: PackId(format!("pack-{}", b % 5)),
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
        }
    }

    #[test]
    fn damage_is_reported_as_format_errors() {
        let bytes = sample(100).encode().unwrap().to_vec();
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
        let mut flipped = bytes.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x10;
        assert!(matches!(
            Manifest::decode(&flipped),
            Err(FormatError::Checksum { .. })
        ));
        assert!(Manifest::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(Manifest::decode(&[]).is_err());
    }

    #[test]
    fn encode_refuses_invalid_manifests() {
        let mut m = sample(1);
        m.volume_size = 4096; // one block, but block 0 and ... sample has only block 0
        m.blocks.insert(
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
        let mut m = sample(0);
        m.volume = "bad/name".into();
        assert!(m.encode().is_err());
    }
}
