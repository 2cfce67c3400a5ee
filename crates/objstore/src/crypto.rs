//! Encryption at rest: a volume's key, its key id, and sealing / opening byte strings.
//!
//! Contract (FORMAT.md, "Encryption"):
//! - A volume key is 32 bytes, given as exactly 64 hexadecimal characters (upper or lower
//!   case; surrounding ASCII whitespace, such as a trailing newline, is ignored), read from a
//!   file ([`VolumeKey::from_file`]) or handed over as text ([`VolumeKey::parse_hex`], e.g.
//!   the daemon's value of an environment variable: library crates do not read the
//!   environment). Anything else is refused with a [`KeyError`] naming the source (never the
//!   key).
//! - Its [`KeyId`] is the first 8 bytes of `SHA-256("glidefs volume key id v1\0" ‖ key)`:
//!   recorded in manifests and encrypted packs so that a wrong key, a missing key or a key
//!   for an unencrypted volume is a clear error, never garbage. The key itself is never
//!   written anywhere, nor printed (`Debug` shows the key id only); the copies this module
//!   makes (the parsed bytes, the file's text, the cipher's key, the nonce key) are zeroed
//!   when dropped.
//! - Sealing is XChaCha20-Poly1305: `nonce (24) ‖ ciphertext ‖ tag (16)`, so a sealed string
//!   is [`SEAL_OVERHEAD`] bytes longer than its plaintext. [`VolumeKey::seal_random`] draws
//!   the nonce from the thread-local CSPRNG (pack entry frames: 192-bit random nonces never
//!   repeat in practice). [`VolumeKey::seal_synthetic`] derives it from a keyed hash of the
//!   associated data and the plaintext (manifest frames and roots, whose encoding must stay
//!   deterministic so a publisher recognises its own manifest after a lost reply): equal
//!   inputs give equal output, different inputs different nonces.
//! - The associated data is chosen by the format (see `format::pack`, `format::manifest`);
//!   it never includes a pack id or an object offset, so a sealed entry frame stays valid
//!   when compaction copies it into another pack, or a clone reads it from its parent's.

use std::fmt;
use std::path::Path;

use chacha20poly1305::aead::AeadInOut;
use chacha20poly1305::{KeyInit, Tag, XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};
use zeroize::Zeroize;

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 24;
/// Bytes of an authentication tag.
pub const TAG_LEN: usize = 16;
/// Bytes a sealed string has beyond its plaintext (nonce and tag).
pub const SEAL_OVERHEAD: usize = NONCE_LEN + TAG_LEN;
/// Bytes of a key.
pub const KEY_LEN: usize = 32;

const KEY_ID_DOMAIN: &[u8] = b"glidefs volume key id v1\0";
const NONCE_KEY_DOMAIN: &[u8] = b"glidefs synthetic nonce key v1\0";

/// Public identifier of a volume key: 8 bytes of a domain-separated SHA-256 of the key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub [u8; 8]);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// Why a key could not be loaded. Messages name the source, never the key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key file could not be read.
    #[error("encryption key file `{path}` cannot be read: {source}")]
    File {
        /// The file.
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The text is not 64 hexadecimal characters.
    #[error(
        "encryption key from {source_name} is not a 32-byte key in hex (64 characters \
         0-9a-fA-F, surrounding whitespace ignored): {detail}"
    )]
    Malformed {
        /// `file `PATH`` or `environment variable `NAME``.
        source_name: String,
        /// What is wrong (length, offending position), never the key text.
        detail: String,
    },
}

/// A sealed string failed to open: wrong key, or bytes changed (ciphertext, tag, or the
/// associated data: a frame moved to another block, segment or generation).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("authentication failed (key id {key_id}): wrong key, or the bytes or their context were changed")]
pub struct OpenError {
    /// The key that was tried.
    pub key_id: KeyId,
}

/// A volume's encryption key (32 bytes) with its cipher and key id.
#[derive(Clone)]
pub struct VolumeKey {
    cipher: XChaCha20Poly1305,
    nonce_key: [u8; 32],
    id: KeyId,
}

impl Drop for VolumeKey {
    fn drop(&mut self) {
        // The cipher zeroes its own key (feature `zeroize`).
        self.nonce_key.zeroize();
    }
}

impl fmt::Debug for VolumeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VolumeKey").field("id", &self.id).finish()
    }
}

/// Two keys are equal when their ids are (the id is a hash of the key).
impl PartialEq for VolumeKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for VolumeKey {}

impl VolumeKey {
    /// The key made of these 32 bytes.
    pub fn from_bytes(key: [u8; KEY_LEN]) -> Self {
        let id_hash = Sha256::new()
            .chain_update(KEY_ID_DOMAIN)
            .chain_update(key)
            .finalize();
        let mut id = [0u8; 8];
        id.copy_from_slice(&id_hash[..8]);
        let mut nonce_hash = Sha256::new()
            .chain_update(NONCE_KEY_DOMAIN)
            .chain_update(key)
            .finalize();
        let mut nonce_key = [0u8; 32];
        nonce_key.copy_from_slice(&nonce_hash);
        nonce_hash.as_mut_slice().zeroize();
        Self {
            cipher: XChaCha20Poly1305::new(&key.into()),
            nonce_key,
            id: KeyId(id),
        }
    }

    /// Parses 64 hexadecimal characters (surrounding ASCII whitespace ignored);
    /// `source_name` names where the text came from in the error.
    pub fn parse_hex(text: &[u8], source_name: &str) -> Result<Self, KeyError> {
        let malformed = |detail: String| KeyError::Malformed {
            source_name: source_name.to_string(),
            detail,
        };
        let text = text.trim_ascii();
        if text.len() != 2 * KEY_LEN {
            return Err(malformed(format!(
                "{} characters after trimming whitespace",
                text.len()
            )));
        }
        let mut key = [0u8; KEY_LEN];
        for (i, pair) in text.chunks_exact(2).enumerate() {
            let nibble = |at: usize| {
                char::from(pair[at]).to_digit(16).ok_or_else(|| {
                    malformed(format!("character {} is not hexadecimal", 2 * i + at + 1))
                })
            };
            key[i] = (nibble(0)? << 4 | nibble(1)?) as u8;
        }
        let parsed = Self::from_bytes(key);
        key.zeroize();
        Ok(parsed)
    }

    /// Reads the key from a file holding 64 hexadecimal characters.
    pub fn from_file(path: &Path) -> Result<Self, KeyError> {
        let mut text = std::fs::read(path).map_err(|source| KeyError::File {
            path: path.display().to_string(),
            source,
        })?;
        let key = Self::parse_hex(&text, &format!("file `{}`", path.display()));
        text.zeroize();
        key
    }

    /// This key's id.
    pub fn id(&self) -> KeyId {
        self.id
    }

    /// Appends `nonce ‖ ciphertext(plaintext) ‖ tag` to `out`, with a random nonce.
    pub fn seal_random(&self, aad: &[u8], plaintext: &[u8], out: &mut Vec<u8>) {
        let nonce: [u8; NONCE_LEN] = rand::random();
        self.seal_with(nonce, aad, plaintext, out);
    }

    /// Appends `nonce ‖ ciphertext(plaintext) ‖ tag` to `out`, with a nonce derived from a
    /// keyed hash of `aad` and `plaintext` (deterministic).
    pub fn seal_synthetic(&self, aad: &[u8], plaintext: &[u8], out: &mut Vec<u8>) {
        let hash = Sha256::new()
            .chain_update(self.nonce_key)
            .chain_update((aad.len() as u64).to_le_bytes())
            .chain_update(aad)
            .chain_update(plaintext)
            .finalize();
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&hash[..NONCE_LEN]);
        self.seal_with(nonce, aad, plaintext, out);
    }

    /// Encrypts `out[at..]` in place (the plaintext already there, right after the nonce
    /// slot `out[at - NONCE_LEN..at]` that this fills with a random nonce) and appends the tag.
    pub(crate) fn seal_in_place_random(&self, aad: &[u8], out: &mut Vec<u8>, at: usize) {
        let nonce: [u8; NONCE_LEN] = rand::random();
        out[at - NONCE_LEN..at].copy_from_slice(&nonce);
        let tag = self.encrypt(&nonce, aad, &mut out[at..]);
        out.extend_from_slice(&tag);
    }

    fn seal_with(&self, nonce: [u8; NONCE_LEN], aad: &[u8], plaintext: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(&nonce);
        let at = out.len();
        out.extend_from_slice(plaintext);
        let tag = self.encrypt(&nonce, aad, &mut out[at..]);
        out.extend_from_slice(&tag);
    }

    fn encrypt(&self, nonce: &[u8; NONCE_LEN], aad: &[u8], buf: &mut [u8]) -> [u8; TAG_LEN] {
        let nonce = XNonce::from(*nonce);
        // XChaCha20-Poly1305 refuses only messages beyond 256 GiB; ours are at most 64 MiB
        // (MAX_BLOCK_SIZE, MAX_SEGMENT_PAYLOAD) or 1 GiB (a manifest root). Were it to refuse,
        // fail closed: the buffer is wiped (no plaintext leaves) and the zero tag never opens.
        let mut out = [0u8; TAG_LEN];
        match self.cipher.encrypt_inout_detached(&nonce, aad, buf.into()) {
            Ok(tag) => out.copy_from_slice(&tag),
            Err(_) => buf.fill(0),
        }
        out
    }

    /// Opens `sealed` (`nonce ‖ ciphertext ‖ tag`): the plaintext, or an error when it is too
    /// short, the key is wrong, or the bytes or `aad` differ from what was sealed.
    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        let fail = OpenError { key_id: self.id };
        if sealed.len() < SEAL_OVERHEAD {
            return Err(fail);
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let (ciphertext, tag) = rest.split_at(rest.len() - TAG_LEN);
        let nonce = XNonce::try_from(nonce).map_err(|_| fail.clone())?;
        let tag = Tag::try_from(tag).map_err(|_| fail.clone())?;
        let mut plain = ciphertext.to_vec();
        self.cipher
            .decrypt_inout_detached(&nonce, aad, plain.as_mut_slice().into(), &tag)
            .map_err(|_| fail)?;
        Ok(plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn hex_keys_parse_and_everything_else_is_refused_naming_the_source() {
        let k = VolumeKey::parse_hex(format!("  {HEX}\n").as_bytes(), "test").unwrap();
        let upper = VolumeKey::parse_hex(HEX.to_uppercase().as_bytes(), "test").unwrap();
        assert_eq!(k.id(), upper.id());
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = i as u8;
        }
        assert_eq!(k.id(), VolumeKey::from_bytes(bytes).id());
        for bad in [&HEX[..62], "", &format!("{HEX}00"), &HEX.replace('a', "g")] {
            let err = VolumeKey::parse_hex(bad.as_bytes(), "file `/k`").unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("file `/k`"), "{msg}");
            assert!(!msg.contains(&HEX[..16]), "the key never appears: {msg}");
        }
        let raw = [7u8; 32];
        assert!(
            VolumeKey::parse_hex(&raw, "raw").is_err(),
            "raw bytes are not accepted"
        );
        let err = VolumeKey::from_file(Path::new("/nonexistent/key")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/key"));
    }

    #[test]
    fn key_ids_differ_per_key_and_never_show_the_key() {
        let a = VolumeKey::from_bytes([1; 32]);
        let b = VolumeKey::from_bytes([2; 32]);
        assert_ne!(a.id(), b.id());
        assert_eq!(a.id().to_string().len(), 16);
        assert!(!format!("{a:?}").contains("0101"), "{a:?}");
    }

    #[test]
    fn seal_open_round_trip_and_refuse_changes() {
        let k = VolumeKey::from_bytes([9; 32]);
        let mut sealed = Vec::new();
        k.seal_random(b"ctx", b"hello world", &mut sealed);
        assert_eq!(sealed.len(), 11 + SEAL_OVERHEAD);
        assert_eq!(k.open(b"ctx", &sealed).unwrap(), b"hello world");
        assert!(k.open(b"other", &sealed).is_err(), "aad is bound");
        let other = VolumeKey::from_bytes([8; 32]);
        assert_eq!(
            other.open(b"ctx", &sealed).unwrap_err().key_id,
            other.id(),
            "wrong key"
        );
        for at in [0, NONCE_LEN, sealed.len() - 1] {
            let mut bent = sealed.clone();
            bent[at] ^= 1;
            assert!(k.open(b"ctx", &bent).is_err(), "flip at {at}");
        }
        assert!(k.open(b"ctx", &sealed[..SEAL_OVERHEAD - 1]).is_err());
        let mut again = Vec::new();
        k.seal_random(b"ctx", b"hello world", &mut again);
        assert_ne!(again, sealed, "random nonces");
        let (mut s1, mut s2, mut s3) = (Vec::new(), Vec::new(), Vec::new());
        k.seal_synthetic(b"ctx", b"hello", &mut s1);
        k.seal_synthetic(b"ctx", b"hello", &mut s2);
        k.seal_synthetic(b"ctx", b"hellp", &mut s3);
        assert_eq!(s1, s2, "synthetic nonces are deterministic");
        assert_ne!(s1[..NONCE_LEN], s3[..NONCE_LEN], "and differ per message");
        assert_eq!(k.open(b"ctx", &s1).unwrap(), b"hello");
    }
}
