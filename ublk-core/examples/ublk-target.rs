//! Run a test target as a ublk device until SIGINT/SIGTERM.
//!
//! ```text
//! ublk-target mem --size 256M --queues 2 [--depth 64] [--user-copy]
//! ublk-target null --size 1G
//! ```
//!
//! Prints one line `ready <bdev> transport=<zero-copy|user-copy> flags=<hex>` once the
//! device serves I/O, then stops and deletes the device on the first signal.

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use std::io::Write;
use std::sync::Arc;
use ublk_core::targets::{DeferPolicy, MemOptions, MemTarget, NullTarget};
use ublk_core::{Device, DeviceConfig, Target, TransportPreference};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Kind {
    /// memfd-backed RAM disk (real data).
    Mem,
    /// completes everything at once (no data).
    Null,
    /// the mem target's logic over a regular file (`--path`, created with `--size`).
    File,
}

#[derive(Debug, Parser)]
#[command(
    name = "ublk-target",
    about = "Serve a test ublk device until SIGINT/SIGTERM"
)]
struct Args {
    /// Target kind.
    kind: Kind,
    /// Capacity, with optional K/M/G suffix.
    #[arg(long, default_value = "256M")]
    size: String,
    /// Hardware queues.
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// Tags per queue.
    #[arg(long, default_value_t = 64)]
    depth: u16,
    /// Largest request in KiB.
    #[arg(long, default_value_t = 512)]
    max_io_kb: u32,
    /// Use USER_COPY even if zero-copy is available.
    #[arg(long)]
    user_copy: bool,
    /// mem: largest chunk in KiB (smaller splits requests into more chunks).
    #[arg(long, default_value_t = 1024)]
    chunk_kb: u32,
    /// mem: finish requests from a worker thread (never, slow, all).
    #[arg(long, default_value = "never")]
    defer: String,
    /// file: path of the backing file (created or truncated to `--size`).
    #[arg(long)]
    path: Option<std::path::PathBuf>,
    /// Pin queue q to CPU list[q % len] (comma separated).
    #[arg(long, value_delimiter = ',')]
    cpus: Vec<usize>,
    /// Serve the queues on a shared loop pool of this many threads instead of a thread per
    /// queue.
    #[arg(long)]
    pool: Option<usize>,
    /// UBLK_F_BATCH_IO: auto (where the kernel has it), on, off.
    #[arg(long, default_value = "off")]
    batch_io: String,
}

fn parse_size(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = num.parse().with_context(|| format!("bad size `{s}`"))?;
    n.checked_mul(mult)
        .with_context(|| format!("size `{s}` overflows"))
}

/// `n` KiB in bytes; an error (not an overflow panic) when that does not fit in a u32.
fn kib(n: u32, flag: &str) -> anyhow::Result<u32> {
    n.checked_mul(1024)
        .with_context(|| format!("{flag} {n} is too large"))
}

/// Block SIGINT/SIGTERM in this thread (inherited by every thread spawned later) so that
/// `wait_for_signal` can take them synchronously.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; the libc calls only touch the local set and this
    // thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` is a valid, initialised set and `sig` a live local.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

fn serve<T: Target>(
    config: &DeviceConfig,
    target: Arc<T>,
    signals: &libc::sigset_t,
) -> anyhow::Result<()> {
    let device = Device::create(config, target).context("creating the ublk device")?;
    let info = device.info()?;
    println!(
        "ready {} transport={} batch_io={} flags={:#x} queues={} depth={}",
        device.bdev_path(),
        device.transport(),
        info.flags & libublk::sys::UBLK_F_BATCH_IO as u64 != 0,
        info.flags,
        info.queues,
        info.depth
    );
    std::io::stdout().flush()?;
    let sig = wait_for_signal(signals);
    eprintln!("ublk-target: signal {sig}: stopping {}", device.bdev_path());
    device
        .stop_and_delete()
        .context("stopping the ublk device")?;
    eprintln!("ublk-target: device deleted");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let signals = block_signals();
    let size = parse_size(&args.size)?;
    let mut config = DeviceConfig::new(&format!("{:?}", args.kind).to_lowercase(), size);
    config.queues = args.queues;
    config.depth = args.depth;
    config.max_io_bytes = kib(args.max_io_kb, "--max-io-kb")?;
    config.queue.cpus = args.cpus.clone();
    if let Some(threads) = args.pool {
        config.queue.pool =
            Some(ublk_core::LoopPool::new(threads).context("starting the loop pool")?);
    }
    if args.user_copy {
        config.transport = TransportPreference::UserCopy;
    }
    config.queue.batch_io = match args.batch_io.as_str() {
        "auto" => ublk_core::BatchIo::Auto,
        "on" => ublk_core::BatchIo::On,
        "off" => ublk_core::BatchIo::Off,
        other => bail!("--batch-io must be auto, on or off, got `{other}`"),
    };
    match args.kind {
        Kind::Null => serve(&config, Arc::new(NullTarget), &signals),
        Kind::Mem | Kind::File => {
            let defer = match args.defer.as_str() {
                "never" => DeferPolicy::Never,
                "slow" => DeferPolicy::Slow,
                "all" => DeferPolicy::All,
                other => bail!("--defer must be never, slow or all, got `{other}`"),
            };
            let opts = MemOptions {
                chunk_bytes: kib(args.chunk_kb, "--chunk-kb")?,
                defer,
            };
            let target = match (args.kind, &args.path) {
                (Kind::File, Some(path)) => {
                    let file = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .open(path)
                        .with_context(|| format!("opening {}", path.display()))?;
                    file.set_len(size)?;
                    MemTarget::from_file(file, opts)?
                }
                (Kind::File, None) => bail!("the file target needs --path"),
                _ => MemTarget::new(size, opts)?,
            };
            serve(&config, target, &signals)
        }
    }
}
