//! `encryption` benchmark: the cost of encryption at rest on the pack and manifest codecs, in
//! one run, encrypted against unencrypted on the same bytes.
//!
//! - Pack encode: `PackBuilder::add` of every block then `finish` (zstd level 1, the
//!   default; sealing with XChaCha20-Poly1305 when encrypted).
//! - Pack decode: `decode_entry` of every frame (crc, open, decompress, raw crc), what a cold
//!   read does per block after its GET.
//! - Both for incompressible blocks (stored raw) and compressible ones (about 4:1).
//! - Manifest encode / decode of a fully written 16 GiB volume (131,072 blocks, 32 segments,
//!   128 blocks per pack).
//!
//! Single thread, in memory (no object store: the store's transfer cost does not change with
//! encryption). Each figure is the median of `--rounds` runs (default 7).
//!
//! Usage: `cargo bench -p glidefs-objstore --bench encryption -- [--rounds N] [--pack-mib N]`.
//! Prints one JSON object: MiB/s of block (raw) bytes per case, and `ratio` =
//! encrypted / unencrypted throughput (1.0 = no cost).

use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_objstore::format::pack::decode_entry;
use glidefs_objstore::{BlockLocation, Manifest, PackBuilder, PackId, VolumeKey};

const BLOCK: u32 = 128 * 1024;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn mib_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / d.as_secs_f64()
}

fn blocks(count: usize, compressible: bool) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            let noise = glidefs_testkit::noise(i as u64 + 1, BLOCK as usize);
            if !compressible {
                return noise;
            }
            // Per 4 KiB page: 1 KiB of noise, 3 KiB of repeated text.
            let text = b"the quick brown fox jumps over the lazy dog; glidefs bench. ";
            let mut out = Vec::with_capacity(BLOCK as usize);
            for page in noise.chunks(4096) {
                out.extend_from_slice(&page[..1024]);
                out.extend(text.iter().copied().cycle().take(3072));
            }
            out
        })
        .collect()
}

fn encode(data: &[Vec<u8>], key: Option<&Arc<VolumeKey>>) -> glidefs_objstore::EncodedPack {
    let mut b = PackBuilder::new(BLOCK)
        .expect("zstd")
        .with_key(key.cloned());
    for (i, d) in data.iter().enumerate() {
        b.add(i as u64, d).expect("add");
    }
    b.finish(PackId::new("bench").expect("id"))
}

fn decode(pack: &glidefs_objstore::EncodedPack, key: Option<&Arc<VolumeKey>>) -> usize {
    let mut n = 0;
    for (block, loc) in &pack.locations {
        let frame = pack
            .bytes
            .slice(loc.offset as usize..(loc.offset + u64::from(loc.len)) as usize);
        n += decode_entry(frame, *block, loc.raw_crc, key.map(|k| &**k))
            .expect("decode")
            .len();
    }
    n
}

fn manifest() -> Manifest {
    let mut m = Manifest::new("bench", BLOCK, 16 << 30).successor();
    for b in 0..(16u64 << 30) / u64::from(BLOCK) {
        m.insert(
            b,
            BlockLocation {
                pack: PackId::new(format!(
                    "{:016x}-{:08x}-{:016x}",
                    1,
                    b / 128,
                    (b / 128) * 7919
                ))
                .expect("id"),
                entry: (b % 128) as u32,
                offset: (b % 128) * 70_000,
                len: 65_000 + (b % 5000) as u32,
                raw_crc: (b as u32).wrapping_mul(0x9E37_79B9),
            },
        );
    }
    m
}

fn main() {
    let mut rounds = 7usize;
    let mut pack_mib = 16usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).unwrap_or(rounds),
            "--pack-mib" => pack_mib = args.next().and_then(|v| v.parse().ok()).unwrap_or(pack_mib),
            _ => {} // `cargo bench` passes --bench
        }
    }
    let key = Arc::new(VolumeKey::from_bytes([0x42; 32]));
    let count = pack_mib * 1024 * 1024 / BLOCK as usize;
    let raw_bytes = count * BLOCK as usize;
    let mut cases = Vec::new();
    for compressible in [false, true] {
        let data = blocks(count, compressible);
        let (mut enc_plain, mut enc_sealed, mut dec_plain, mut dec_sealed) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut sizes = (0, 0);
        for _ in 0..rounds.max(1) {
            // Alternate the order so neither side always runs on a warmer cache.
            for sealed in [false, true] {
                let k = sealed.then_some(&key);
                let t = Instant::now();
                let pack = encode(&data, k);
                let e = t.elapsed();
                let t = Instant::now();
                assert_eq!(decode(&pack, k), raw_bytes);
                let d = t.elapsed();
                if sealed {
                    enc_sealed.push(e);
                    dec_sealed.push(d);
                    sizes.1 = pack.bytes.len();
                } else {
                    enc_plain.push(e);
                    dec_plain.push(d);
                    sizes.0 = pack.bytes.len();
                }
            }
        }
        let (ep, es) = (
            mib_s(raw_bytes, median(enc_plain)),
            mib_s(raw_bytes, median(enc_sealed)),
        );
        let (dp, ds) = (
            mib_s(raw_bytes, median(dec_plain)),
            mib_s(raw_bytes, median(dec_sealed)),
        );
        cases.push(format!(
            "\"{}\": {{\"pack_bytes_plain\": {}, \"pack_bytes_encrypted\": {}, \
             \"encode_mib_s_plain\": {ep:.1}, \"encode_mib_s_encrypted\": {es:.1}, \"encode_ratio\": {:.3}, \
             \"decode_mib_s_plain\": {dp:.1}, \"decode_mib_s_encrypted\": {ds:.1}, \"decode_ratio\": {:.3}}}",
            if compressible { "compressible" } else { "incompressible" },
            sizes.0,
            sizes.1,
            es / ep,
            ds / dp,
        ));
    }
    // Manifest of a fully written 16 GiB volume: encode (first publish: every segment) and
    // decode (a load), milliseconds.
    let m = manifest();
    let (mut me_p, mut me_s, mut md_p, mut md_s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut msize = (0, 0);
    for _ in 0..rounds.max(1) {
        for sealed in [false, true] {
            let k = sealed.then_some(&*key);
            let t = Instant::now();
            let bytes = m.encode_with_key(k).expect("encode");
            let e = t.elapsed();
            let t = Instant::now();
            let back = Manifest::decode_with_key(&bytes, k).expect("decode");
            let d = t.elapsed();
            assert_eq!(back.len(), m.len());
            let (enc, dec, size) = if sealed {
                (&mut me_s, &mut md_s, &mut msize.1)
            } else {
                (&mut me_p, &mut md_p, &mut msize.0)
            };
            enc.push(e);
            dec.push(d);
            *size = bytes.len();
        }
    }
    let ms = |v: Vec<Duration>| median(v).as_secs_f64() * 1000.0;
    let (mep, mes, mdp, mds) = (ms(me_p), ms(me_s), ms(md_p), ms(md_s));
    println!(
        "{{\"bench\": \"encryption\", \"block_bytes\": {BLOCK}, \"pack_mib\": {pack_mib}, \"rounds\": {rounds}, \
         \"threads\": 1, \"cipher\": \"XChaCha20-Poly1305\", {}, \"manifest_16gib\": {{\"blocks\": {}, \
         \"bytes_plain\": {}, \"bytes_encrypted\": {}, \"encode_ms_plain\": {mep:.2}, \"encode_ms_encrypted\": {mes:.2}, \
         \"decode_ms_plain\": {mdp:.2}, \"decode_ms_encrypted\": {mds:.2}}}}}",
        cases.join(", "),
        m.len(),
        msize.0,
        msize.1,
    );
}
