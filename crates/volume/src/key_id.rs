//! The key id a cache directory's data was written under (`<dir>/key-id`: 16 hex digits, or
//! `none`), checked at every open.
//!
//! The store's manifests record the key id, and `Volume::open` refuses a key that does not
//! match the latest one. Before a volume's first publish there is no manifest to check
//! against: without this record, a cache written under one key and reopened with another (or
//! none) would upload its acknowledged writes sealed with the wrong key, or in clear. The
//! file is written (atomically) at the first open of a directory and never changed; a cache
//! directory from before this record adopts the key of its next open.

use std::path::Path;

use glidefs_objstore::{FormatError, KeyId, ObjStoreError, VolumeKey};

use crate::error::{Result, VolumeError};

const FILE: &str = "key-id";

fn text(id: Option<KeyId>) -> String {
    id.map_or_else(|| "none".to_string(), |k| k.to_string())
}

fn parse(s: &str) -> Option<Option<KeyId>> {
    let s = s.trim();
    if s == "none" {
        return Some(None);
    }
    if s.len() != 16 {
        return None;
    }
    let mut id = [0u8; 8];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Some(KeyId(id)))
}

/// Checks the directory's record against `key` (blocking file I/O), or writes it.
pub(crate) fn check_or_record(dir: &Path, volume: &str, key: Option<&VolumeKey>) -> Result<()> {
    let path = dir.join(FILE);
    let given = key.map(VolumeKey::id);
    let mismatch = |stored| {
        VolumeError::store(
            "open the local cache",
            volume,
            ObjStoreError::KeyMismatch {
                path: path.display().to_string(),
                source: FormatError::KeyMismatch {
                    what: "local cache",
                    stored,
                    given,
                },
            },
        )
    };
    match std::fs::read_to_string(&path) {
        Ok(s) => match parse(&s) {
            Some(stored) if stored == given => Ok(()),
            Some(stored) => Err(mismatch(stored)),
            None => Err(VolumeError::InvalidConfig {
                volume: volume.to_string(),
                detail: format!("`{}` is damaged: {:?}", path.display(), s.trim()),
            }),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            glidefs_cache::durable::write_atomic(&path, text(given).as_bytes()).map_err(|e| {
                VolumeError::InvalidConfig {
                    volume: volume.to_string(),
                    detail: format!("cannot record the key id: {e}"),
                }
            })
        }
        Err(e) => Err(VolumeError::InvalidConfig {
            volume: volume.to_string(),
            detail: format!("cannot read `{}`: {e}", path.display()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_as_text() {
        for id in [None, Some(KeyId([0xab, 1, 2, 3, 4, 5, 6, 0xff]))] {
            assert_eq!(parse(&text(id)), Some(id));
        }
        assert_eq!(parse("xyz"), None);
        assert_eq!(parse("abababababababzz"), None);
    }
}
