//! Helpers shared by the kernel tests: device setup, O_DIRECT buffers, data patterns, fio.
#![allow(dead_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ublk_core::targets::{MemOptions, MemTarget};
use ublk_core::{Device, DeviceConfig, Transport, TransportPreference};

pub const MIB: u64 = 1 << 20;

/// A page-aligned, zeroed buffer for O_DIRECT.
pub struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let layout = Layout::from_size_align(len.max(4096), 4096).expect("layout");
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "allocation of {len} bytes failed");
        AlignedBuf { ptr, layout }
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is a live allocation of `layout.size()` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// The transport a test row asks for, and a check that the kernel granted exactly it.
pub fn preference(t: Transport) -> TransportPreference {
    match t {
        Transport::ZeroCopy => TransportPreference::PreferZeroCopy,
        Transport::UserCopy => TransportPreference::UserCopy,
    }
}

/// Create a mem device of `size` bytes with `queues` queues on transport `t`; fail unless
/// the kernel granted `t` (prints the granted flags).
pub fn mem_device(
    t: Transport,
    size: u64,
    queues: u16,
    opts: MemOptions,
) -> (Device<MemTarget>, Arc<MemTarget>) {
    let target = MemTarget::new(size, opts).expect("mem target");
    let mut cfg = DeviceConfig::new("mem", size);
    cfg.queues = queues;
    cfg.depth = 64;
    cfg.transport = preference(t);
    let dev = Device::create(&cfg, Arc::clone(&target)).expect("create ublk device");
    let info = dev.info().expect("device info");
    println!(
        "device {} kernel {}: asked {t}, granted {} (flags {:#x}), queues {} depth {} capacity {}",
        dev.bdev_path(),
        ublk_core::features::kernel_release(),
        dev.transport(),
        info.flags,
        info.queues,
        info.depth,
        info.capacity_bytes
    );
    assert_eq!(
        dev.transport(),
        t,
        "kernel granted {} instead of {t}",
        dev.transport()
    );
    assert_eq!(
        info.transport,
        Some(t),
        "device flags {:#x} do not show {t}",
        info.flags
    );
    assert_eq!(info.queues, queues);
    assert_eq!(info.capacity_bytes, size);
    (dev, target)
}

/// Open a block device with O_DIRECT for read and write.
pub fn open_direct(path: &str) -> File {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => return f,
            Err(e) if Instant::now() < deadline => {
                eprintln!("waiting for {path}: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("open {path} O_DIRECT: {e}"),
        }
    }
}

/// Deterministic content of 4 KiB block `block` in generation `gen`: a header naming both,
/// then bytes from a xorshift stream seeded by them.
pub fn fill_block(out: &mut [u8], gen: u64, block: u64) {
    assert_eq!(out.len(), 4096);
    out[0..8].copy_from_slice(&gen.to_le_bytes());
    out[8..16].copy_from_slice(&block.to_le_bytes());
    let mut x =
        gen.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ block.wrapping_add(0xD1B5_4A32_D192_ED03) | 1;
    for b in out[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
    }
}

/// Write generation `gen` over blocks `[first, first+count)` in requests of `io_blocks`.
pub fn write_pattern(f: &File, gen: u64, first: u64, count: u64, io_blocks: u64) {
    let mut buf = AlignedBuf::new((io_blocks * 4096) as usize);
    let mut b = first;
    while b < first + count {
        let n = io_blocks.min(first + count - b);
        for i in 0..n {
            let s = (i * 4096) as usize;
            fill_block(&mut buf.as_mut_slice()[s..s + 4096], gen, b + i);
        }
        f.write_all_at(&buf.as_slice()[..(n * 4096) as usize], b * 4096)
            .unwrap_or_else(|e| panic!("write blocks {b}+{n}: {e}"));
        b += n;
    }
}

/// Read blocks `[first, first+count)` in requests of `io_blocks` and compare each byte with
/// `expected(block)` (a generation, or `None` for zeroes).
pub fn verify_pattern(
    f: &File,
    first: u64,
    count: u64,
    io_blocks: u64,
    expected: impl Fn(u64) -> Option<u64>,
) {
    let mut buf = AlignedBuf::new((io_blocks * 4096) as usize);
    let mut want = vec![0u8; 4096];
    let mut b = first;
    while b < first + count {
        let n = io_blocks.min(first + count - b);
        let got = &mut buf.as_mut_slice()[..(n * 4096) as usize];
        f.read_exact_at(got, b * 4096)
            .unwrap_or_else(|e| panic!("read blocks {b}+{n}: {e}"));
        for i in 0..n {
            let blk = b + i;
            match expected(blk) {
                Some(gen) => fill_block(&mut want, gen, blk),
                None => want.fill(0),
            }
            let s = (i * 4096) as usize;
            let have = &got[s..s + 4096];
            if have != want.as_slice() {
                let at = have
                    .iter()
                    .zip(&want)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                panic!(
                    "block {blk} mismatch at byte {at}: expected gen {:?}, found header gen={} block={}",
                    expected(blk),
                    u64::from_le_bytes(have[0..8].try_into().unwrap()),
                    u64::from_le_bytes(have[8..16].try_into().unwrap()),
                );
            }
        }
        b += n;
    }
}

/// Run fio with `args` against `dev` and fail on any error (exit status or job error).
pub fn fio(dev: &str, args: &[&str]) {
    let out = Command::new("fio")
        .arg(format!("--filename={dev}"))
        .args([
            "--direct=1",
            "--ioengine=io_uring",
            "--verify_state_save=0",
            "--output-format=json",
        ])
        .args(args)
        .output()
        .expect("running fio");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "fio {args:?} failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    let json: serde_json::Value = serde_json::from_str(&stdout[stdout.find('{').unwrap_or(0)..])
        .unwrap_or_else(|e| panic!("fio json: {e}\n{stdout}"));
    for job in json["jobs"].as_array().expect("fio jobs") {
        let name = job["jobname"].as_str().unwrap_or("?");
        let err = job["error"].as_i64().unwrap_or(-1);
        let rd = job["read"]["io_bytes"].as_u64().unwrap_or(0);
        let wr = job["write"]["io_bytes"].as_u64().unwrap_or(0);
        println!("fio job {name}: error={err} read={rd} B written={wr} B");
        assert_eq!(err, 0, "fio job {name} reported error {err}");
        assert!(wr > 0, "fio job {name} wrote nothing");
        assert!(rd > 0, "fio job {name} read (verified) nothing");
    }
    assert!(
        !stderr.contains("verify:"),
        "fio reported verify problems:\n{stderr}"
    );
}

/// Number of open fds of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// ublk block devices the kernel shows.
pub fn ublk_block_devices() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/block")
        .expect("/sys/block")
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with("ublkb"))
        .collect();
    v.sort();
    v
}

/// Run `f` on a helper thread; fail the test if it takes longer than `limit`.
pub fn bounded<R: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(r) => {
            println!("{what} took {:?}", start.elapsed());
            r
        }
        Err(_) => panic!("{what} did not finish within {limit:?} (hang)"),
    }
}
