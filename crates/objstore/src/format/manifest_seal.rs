//! Encryption of manifest objects (FORMAT.md, "Encryption"): the root's encryption section
//! (key id and a tag authenticating the whole root) and sealed segment frames (a readable,
//! compressed pack table, then the sealed block records). The byte layout is written and read
//! in `manifest.rs`; this module holds what is specific to encryption: the associated data of
//! each seal, the key id check, and the readable pack table GC uses without a key.
//!
//! Contract: a root recording a key id is used only after [`Root::check_key`] with that key
//! (a mismatch is `FormatError::KeyMismatch` naming both ids); a sealed segment is bound to
//! its segment index, generation, codec, raw length and pack table, so a frame moved to
//! another segment or generation, or given another pack table, fails to open.

use super::manifest::{decompress_segment, get_pack_table, Root, FRAME_HEADER_LEN};
use super::{FormatError, Reader};
use crate::crypto::{KeyId, VolumeKey, SEAL_OVERHEAD};
use crate::location::PackId;

/// Segment frame flag (byte 5): the block records are sealed.
pub const SEGMENT_SEALED: u8 = 0x01;
/// Bytes of the root's encryption section: key id, nonce, tag.
pub(super) const ROOT_SEAL_LEN: usize = 8 + SEAL_OVERHEAD;
const ROOT_AAD_DOMAIN: &[u8] = b"glidefs manifest root v1\0";
const SEGMENT_AAD_DOMAIN: &[u8] = b"glidefs manifest segment v1\0";

/// The encryption section of a root: the key id, and the tag over the rest of the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RootSeal {
    pub key_id: KeyId,
    /// The associated data the tag covers (domain, flags, root up to the key id).
    pub aad: Vec<u8>,
    /// Nonce and tag (the sealing of an empty plaintext).
    pub sealed: Vec<u8>,
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

/// `KeyMismatch` unless `stored` is the id of `key` (or both are absent).
pub(super) fn check_key_ids(
    what: &'static str,
    stored: Option<KeyId>,
    key: Option<&VolumeKey>,
) -> Result<(), FormatError> {
    let given = key.map(VolumeKey::id);
    if stored != given {
        return Err(FormatError::KeyMismatch {
            what,
            stored,
            given,
        });
    }
    Ok(())
}

/// The associated data of a root's tag: a domain tag, the header flags, and the root up to
/// and including the key id.
pub(super) fn root_aad(flags: u8, root: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(ROOT_AAD_DOMAIN.len() + 1 + root.len());
    aad.extend_from_slice(ROOT_AAD_DOMAIN);
    aad.push(flags);
    aad.extend_from_slice(root);
    aad
}

/// The associated data of a sealed segment frame: a domain tag, frame header bytes 4..28
/// (codec, flags, segment index, generation, raw length) and the readable pack table section
/// (the records name packs by their number in it).
pub(super) fn segment_aad(header: &[u8], table: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(SEGMENT_AAD_DOMAIN.len() + FRAME_HEADER_LEN + table.len());
    aad.extend_from_slice(SEGMENT_AAD_DOMAIN);
    aad.extend_from_slice(&header[4..FRAME_HEADER_LEN]);
    aad.extend_from_slice(table);
    aad
}

/// The readable pack table of a sealed segment frame.
pub(super) struct TablePart<'a> {
    pub codec: u8,
    pub raw_len: u32,
    pub stored: &'a [u8],
    /// The whole section (codec, lengths, stored table), bound to the seal.
    pub section: &'a [u8],
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
mod tests {
    use super::super::manifest::tests::{golden_manifest, raw_root};
    use super::super::manifest::{
        decode_frame, decode_object, decode_root, frame_in, frame_packs, Decoded, RootEntry,
    };
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
