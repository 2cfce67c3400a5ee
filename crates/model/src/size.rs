//! Byte sizes as operators write them: `10G`, `128K`, `64MiB`, `4096`.
//!
//! Suffixes are binary (K = 1024, M = 1024², G = 1024³, T = 1024⁴), case-insensitive, with an
//! optional `B`/`iB` tail (`128k`, `128KB`, `128KiB` are all 131072). A bare number is bytes.
//! [`ByteSize`] deserializes from an integer or such a string, so config files and API requests
//! accept both.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A size string that is not a number with an optional K/M/G/T suffix, or overflows u64.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size `{input}`: expected a number of bytes with an optional K, M, G or T suffix (e.g. 10G)")]
pub struct SizeError {
    /// The text that did not parse.
    pub input: String,
}

/// Parses `10G`, `128K`, `4096`, `64MiB` into bytes.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let err = || SizeError {
        input: input.to_string(),
    };
    let s = input.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(digits_end);
    if digits.is_empty() {
        return Err(err());
    }
    let n: u64 = digits.parse().map_err(|_| err())?;
    let suffix = suffix.trim().to_ascii_lowercase();
    let unit = suffix
        .strip_suffix("ib")
        .or_else(|| suffix.strip_suffix('b'))
        .unwrap_or(&suffix);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(err()),
    };
    // A bare "b"/"ib" without a unit letter is only fine as "b" (bytes).
    if unit.is_empty() && suffix == "ib" {
        return Err(err());
    }
    n.checked_mul(1u64 << shift).ok_or_else(err)
}

/// Formats bytes with the largest binary unit that divides them exactly (`10G`, `1536K`).
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// A byte count that deserializes from an integer or a size string (see module docs) and
/// serializes as an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Default)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_size(self.0))
    }
}

impl std::str::FromStr for ByteSize {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, SizeError> {
        parse_size(s).map(ByteSize)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected a byte count: an integer or a string like \"10G\" / \"128K\"",
            )
        })? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(s) => parse_size(&s)
                .map(ByteSize)
                .map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_are_binary_and_case_insensitive() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("128K"), Ok(128 << 10));
        assert_eq!(parse_size("128kib"), Ok(128 << 10));
        assert_eq!(parse_size("64MB"), Ok(64 << 20));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size(" 2t "), Ok(2 << 40));
        assert_eq!(parse_size("7b"), Ok(7));
    }

    #[test]
    fn garbage_and_overflow_are_errors_naming_the_input() {
        for bad in ["", "G", "-1", "1.5G", "10X", "10 GG", "99999999999T", "5ib"] {
            let err = parse_size(bad).expect_err(bad);
            assert!(err.to_string().contains(&format!("`{bad}`")), "{err}");
        }
    }

    #[test]
    fn format_round_trips() {
        for n in [0, 1, 4096, 128 << 10, 10 << 30, 3 << 40, 1536 << 10] {
            assert_eq!(parse_size(&format_size(n)), Ok(n));
        }
        assert_eq!(format_size(10 << 30), "10G");
    }

    #[test]
    fn byte_size_deserializes_from_int_or_string() {
        #[derive(Deserialize)]
        struct T {
            a: ByteSize,
            b: ByteSize,
        }
        let t: T = serde_json::from_str(r#"{"a": 4096, "b": "1M"}"#).unwrap();
        assert_eq!((t.a.0, t.b.0), (4096, 1 << 20));
        assert!(serde_json::from_str::<T>(r#"{"a": "x", "b": 1}"#).is_err());
    }
}
