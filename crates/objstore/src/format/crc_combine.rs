//! CRC-32C of a concatenation from the CRCs of its parts: [`crc32c_combine`].
//!
//! A raw pack frame's stored crc covers its header and the block; the block's own crc is
//! computed anyway, so the frame's is derived from it instead of a second pass over the block.
//! The `crc32c` crate's combine walks 32x32 bit matrices (zlib's first method): about twenty
//! matrix squarings for a 128 KiB block, tens of microseconds, slower than hashing the block
//! again. Here combining costs one multiplication modulo the polynomial per set bit of the
//! length, with the powers `x^(2^k)` taken from a table built at compile time.
//!
//! The math: for a CRC with reflected bits and pre- and post-inversion, `crc(A || B) =
//! crc(A) * x^(8 * len(B)) mod P  xor  crc(B)` (the inversions cancel out). In the reflected
//! representation bit 31 is the coefficient of `x^0` and bit 0 that of `x^31`.

/// The CRC-32C (Castagnoli) polynomial, reflected.
const POLY: u32 = 0x82F6_3B78;

/// `x^0` in the reflected representation.
const ONE: u32 = 1 << 31;

/// `a * b mod P` (both reflected polynomials of degree below 32).
const fn mul_mod_p(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = ONE;
    // For each coefficient of `a` from x^0 upwards, add `b * x^i`; `b` is multiplied by x
    // (a right shift, reduced by P) as `i` grows. Stops after `a`'s highest power.
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        if a & (bit - 1) == 0 {
            break;
        }
        bit >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    product
}

/// `POWERS[k] = x^(2^k) mod P`, up to the highest power a 64-bit byte count needs.
const POWERS: [u32; 67] = {
    let mut t = [0u32; 67];
    t[0] = ONE >> 1; // x^1
    let mut k = 1;
    while k < 67 {
        t[k] = mul_mod_p(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// `x^(8 * bytes) mod P`.
fn x_pow_8n(bytes: u64) -> u32 {
    let mut acc = ONE;
    let mut n = bytes;
    let mut k = 3; // x^(8 n) = product over set bits j of n of x^(2^(j + 3))
    while n != 0 {
        if n & 1 != 0 {
            acc = mul_mod_p(POWERS[k], acc);
        }
        n >>= 1;
        k += 1;
    }
    acc
}

/// The CRC-32C of `A || B` given `crc_a = crc32c(A)`, `crc_b = crc32c(B)` and `len_b =
/// B.len()`: the same value as `crc32c::crc32c_combine(crc_a, crc_b, len_b)` for the crcs of
/// real byte strings (with `len_b == 0` the crate ignores `crc_b`; here it is xored in, and
/// the crc of an empty string is 0).
pub(crate) fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    mul_mod_p(x_pow_8n(len_b as u64), crc_a) ^ crc_b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_a_direct_crc_of_the_concatenation() {
        let data = glidefs_testkit::noise(7, 300_000);
        let cuts = [
            0, 1, 3, 8, 20, 24, 4095, 4096, 65_536, 131_072, 131_096, 299_999,
        ];
        for &a in &cuts {
            for &b in &[0usize, 1, 7, 20, 4096, 131_072] {
                if a + b > data.len() {
                    continue;
                }
                let (x, y) = (&data[..a], &data[a..a + b]);
                let whole = crc32c::crc32c(&data[..a + b]);
                let combined = crc32c_combine(crc32c::crc32c(x), crc32c::crc32c(y), b);
                assert_eq!(combined, whole, "A {a} bytes, B {b} bytes");
                assert_eq!(
                    combined,
                    crc32c::crc32c_combine(crc32c::crc32c(x), crc32c::crc32c(y), b)
                );
            }
        }
    }

    #[test]
    fn powers_of_x_are_squares_of_each_other() {
        // x^2 = (x^1)^2, and multiplying by x^0 changes nothing.
        assert_eq!(POWERS[1], ONE >> 2);
        assert_eq!(mul_mod_p(ONE, 0x1234_5678), 0x1234_5678);
        assert_eq!(x_pow_8n(0), ONE);
        assert_eq!(x_pow_8n(1), mul_mod_p(POWERS[3], ONE));
    }

    /// Every split of a 200-byte buffer, and odd lengths around powers of two up to 1 MiB.
    #[test]
    fn every_split_and_odd_lengths_agree_with_a_direct_crc() {
        let data = glidefs_testkit::noise(11, (1 << 20) + 4100);
        for total in 0..=200usize {
            let whole = crc32c::crc32c(&data[..total]);
            for a in 0..=total {
                let (x, y) = (&data[..a], &data[a..total]);
                let c = crc32c_combine(crc32c::crc32c(x), crc32c::crc32c(y), y.len());
                assert_eq!(c, whole, "A {a} bytes, B {} bytes", y.len());
            }
        }
        for k in 1..=20u32 {
            for d in [-3i64, -1, 0, 1, 3] {
                let b = ((1i64 << k) + d).max(0) as usize;
                for a in [0usize, 1, 20, 4097] {
                    let (x, y) = (&data[..a], &data[a..a + b]);
                    let c = crc32c_combine(crc32c::crc32c(x), crc32c::crc32c(y), b);
                    assert_eq!(c, crc32c::crc32c(&data[..a + b]), "A {a}, B {b}");
                }
            }
        }
    }

    /// Lengths too large to hash: the crate's matrix combine is the reference; also
    /// `x^(8(m+n)) = x^(8m) x^(8n)`, with wrap-around at `u64::MAX`.
    #[test]
    fn huge_lengths_agree_with_the_crates_combine() {
        let mut rng = glidefs_testkit::rng::Rng(0x0123_4567_89AB_CDEF);
        let mut lens = vec![usize::MAX, usize::MAX - 1, 1 << 40, (1 << 40) - 1];
        lens.extend([
            u32::MAX as usize,
            u32::MAX as usize + 1,
            1 << 63,
            (1 << 63) + 1,
        ]);
        lens.extend((0..200).map(|_| rng.next_u64() as usize));
        let s = rng.next_u64();
        for (i, &n) in lens.iter().enumerate() {
            let (a, b) = ((s as u32) ^ i as u32, (s >> 32) as u32);
            assert_eq!(
                crc32c_combine(a, b, n),
                crc32c::crc32c_combine(a, b, n),
                "len {n}"
            );
            assert_eq!(crc32c_combine(0, b, n), b, "empty A, len {n}");
            let m = lens[(i * 7 + 3) % lens.len()] as u64;
            let n = n as u64;
            if let Some(sum) = m.checked_add(n) {
                assert_eq!(
                    x_pow_8n(sum),
                    mul_mod_p(x_pow_8n(m), x_pow_8n(n)),
                    "{m}+{n}"
                );
            }
        }
    }

    /// `mul_mod_p` is commutative and agrees with a bit-serial reference (no early exit).
    #[test]
    fn mul_mod_p_matches_a_plain_shift_and_add() {
        fn reference(a: u32, mut b: u32) -> u32 {
            let mut p = 0;
            for i in 0..32 {
                if a & (ONE >> i) != 0 {
                    p ^= b;
                }
                b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
            }
            p
        }
        let mut rng = glidefs_testkit::rng::Rng(0xDEAD_BEEF);
        let mut vals = vec![0u32, 1, ONE, u32::MAX, POLY, ONE >> 1, 3];
        vals.extend((0..300).map(|_| rng.next_u64() as u32));
        for &a in &vals {
            for &b in vals.iter().take(40) {
                assert_eq!(mul_mod_p(a, b), reference(a, b), "{a:#x} * {b:#x}");
                assert_eq!(mul_mod_p(a, b), mul_mod_p(b, a), "{a:#x} * {b:#x}");
            }
        }
        for k in 1..POWERS.len() {
            assert_eq!(POWERS[k], reference(POWERS[k - 1], POWERS[k - 1]), "k {k}");
        }
    }
}
