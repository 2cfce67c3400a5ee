//! Byte formats of everything this crate writes (documented byte by byte in FORMAT.md).
//!
//! Decoders take arbitrary bytes and either return a value or a [`FormatError`]; they never
//! panic, never index out of bounds and never allocate more than the input could justify
//! (every count read from the input is checked against the bytes that remain).

mod crc_combine;
pub mod manifest;
mod manifest_seal;
pub mod pack;

pub use crate::error::FormatError;
pub use crate::location::MAX_BLOCK_SIZE;

/// A bounds-checked little-endian reader over a byte slice.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    what: &'static str,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(what: &'static str, buf: &'a [u8]) -> Self {
        Self { what, buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        if n > self.remaining() {
            return Err(FormatError::Truncated {
                what: self.what,
                need: (self.pos as u64).saturating_add(n as u64),
                have: self.buf.len() as u64,
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A u16-length-prefixed UTF-8 string.
    pub(crate) fn string(&mut self, field: &str) -> Result<&'a str, FormatError> {
        let len = self.u16()? as usize;
        let bytes = self.bytes(len)?;
        std::str::from_utf8(bytes).map_err(|_| FormatError::Invalid {
            what: self.what,
            detail: format!("{field} is not UTF-8"),
        })
    }

    /// Fails unless every byte was consumed.
    pub(crate) fn finish(self) -> Result<(), FormatError> {
        if self.remaining() != 0 {
            return Err(FormatError::Invalid {
                what: self.what,
                detail: format!("{} trailing bytes", self.remaining()),
            });
        }
        Ok(())
    }
}

/// Checks a fixed magic at the start of `r`.
pub(crate) fn expect_magic(r: &mut Reader<'_>, magic: &[u8; 8]) -> Result<(), FormatError> {
    let found = r.bytes(8)?;
    if found != magic {
        return Err(FormatError::BadMagic {
            what: r.what,
            found: found.to_vec(),
        });
    }
    Ok(())
}

/// Compares a stored and a computed checksum.
pub(crate) fn check_crc(what: &'static str, stored: u32, computed: u32) -> Result<(), FormatError> {
    if stored != computed {
        return Err(FormatError::Checksum {
            what,
            stored,
            computed,
        });
    }
    Ok(())
}

/// Appends a u16-length-prefixed string; the caller guarantees `s.len() <= u16::MAX`.
pub(crate) fn put_string(out: &mut Vec<u8>, s: &str) {
    let len = u16::try_from(s.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..len as usize]);
}
