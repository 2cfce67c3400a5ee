//! Encryption of manifest objects (FORMAT.md, "Encryption"): the root's encryption section
//! (key id and a tag authenticating the whole root) and sealed segment frames (a readable,
//! compressed pack table, then the sealed block records). The byte layout is written and read
//! in `manifest.rs`, which uses this module; this module holds what is specific to encryption
//! and imports nothing of the manifest's: the associated data of each seal, the key id check,
//! and the shape of the readable pack table GC uses without a key.
//!
//! Contract: a root recording a key id is used only after [`Root::check_key`] with that key
//! (a mismatch is `FormatError::KeyMismatch` naming both ids); a sealed segment is bound to
//! its segment index, generation, codec, raw length and pack table, so a frame moved to
//! another segment or generation, or given another pack table, fails to open.

use super::FormatError;
use crate::crypto::{KeyId, VolumeKey, SEAL_OVERHEAD};

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
/// `header` is the whole frame header (`FRAME_HEADER_LEN` bytes, crc first).
pub(super) fn segment_aad(header: &[u8], table: &[u8]) -> Vec<u8> {
    let fields = &header[4..];
    let mut aad = Vec::with_capacity(SEGMENT_AAD_DOMAIN.len() + fields.len() + table.len());
    aad.extend_from_slice(SEGMENT_AAD_DOMAIN);
    aad.extend_from_slice(fields);
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
