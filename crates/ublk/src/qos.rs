//! Per-volume QoS: token buckets for IOPS and bytes per second, read, write and total, each
//! with a burst, checked where a request enters the target (its dispatch).
//!
//! Contract:
//! - A bucket of `rate` tokens per second holds at most `burst` tokens and starts full. A
//!   READ costs one token of `read_iops` and `iops` and `len` tokens of `read_bytes` and
//!   `bytes`; a WRITE the same of the write and total buckets. FLUSH, DISCARD and
//!   WRITE_ZEROES are not limited (they move no data through the device's queues).
//! - [`Qos::admit`] takes what a request costs from every bucket that limits it at once and
//!   answers how long the request must wait before it runs: zero while the buckets hold
//!   enough, else until the most indebted bucket has refilled what it lent. A bucket may go
//!   into debt: a request is never refused or failed for a limit, it waits, and requests are
//!   served in the order they were admitted (a request larger than `burst` passes alone, at
//!   the rate). Over any span `T` a bucket so admits at most `burst + rate * T` tokens, and a
//!   steady load over the limit gets exactly the rate.
//! - Lock-free (one compare-and-swap per bucket): the queue's loop thread calls it and never
//!   blocks. Each bucket keeps the instant it is full again (`full_at`), the classic virtual
//!   clock of a token bucket (GCRA): lending a request `cost` tokens moves it `cost / rate`
//!   later.
//! - [`Qos::set`] changes the limits live and fills every bucket: the debt of the old limits
//!   is forgotten, so a limit raised (or removed) helps at once. The target admits the
//!   requests still waiting again under the new limits (`volume_target`'s `throttle_wait`),
//!   so none sits out a wait the old limits gave it.
//! - Time is a parameter (nanoseconds since the limiter was made), so tests run it on a
//!   virtual clock. What waited is counted by the caller (the target's `throttled` stats).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use glidefs_model::api::{QosLimit, QosLimits};

/// A request's direction, as the buckets see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
}

/// One token bucket (see the module docs). `rate` 0: no limit.
#[derive(Debug, Default)]
struct Bucket {
    rate: AtomicU64,
    burst: AtomicU64,
    /// Nanoseconds (since [`Qos::epoch`]) at which the bucket is full again.
    full_at: AtomicU64,
}

const NS: u128 = 1_000_000_000;

impl Bucket {
    /// New limits, the bucket full. The rate is stored before the debt is cleared: an
    /// admission racing this reads the new rate, or its compare-and-swap on the debt it read
    /// fails on the cleared one and it takes again at the rate it reads then.
    fn set(&self, limit: Option<QosLimit>) {
        let (rate, burst) = limit.map_or((0, 0), |l| (l.rate, l.burst_or_default()));
        self.burst.store(burst, Ordering::Relaxed);
        self.rate.store(rate, Ordering::Release);
        self.full_at.store(0, Ordering::Release);
    }

    fn limit(&self) -> Option<QosLimit> {
        let rate = self.rate.load(Ordering::Acquire);
        (rate > 0).then(|| QosLimit {
            rate,
            burst: Some(self.burst.load(Ordering::Relaxed)),
        })
    }

    /// Takes `cost` tokens at `now` (ns); the nanoseconds to wait before they were there.
    fn take(&self, cost: u64, now: u64) -> u64 {
        let mut full_at = self.full_at.load(Ordering::Acquire);
        loop {
            let rate = self.rate.load(Ordering::Acquire);
            if rate == 0 {
                return 0;
            }
            let span = |tokens: u64| {
                u64::try_from(u128::from(tokens) * NS / u128::from(rate)).unwrap_or(u64::MAX)
            };
            let (cost_ns, burst_ns) = (span(cost), span(self.burst.load(Ordering::Relaxed)));
            let next = full_at.max(now).saturating_add(cost_ns);
            match self.full_at.compare_exchange_weak(
                full_at,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return (next - now).saturating_sub(burst_ns),
                Err(seen) => full_at = seen,
            }
        }
    }
}

/// The buckets of one volume.
#[derive(Debug)]
pub struct Qos {
    epoch: Instant,
    read_iops: Bucket,
    write_iops: Bucket,
    iops: Bucket,
    read_bytes: Bucket,
    write_bytes: Bucket,
    bytes: Bucket,
    /// Whether any bucket has a rate (else `admit` reads no clock).
    limited: AtomicBool,
}

impl Qos {
    /// A limiter with `limits` (all buckets full).
    pub fn new(limits: &QosLimits) -> Qos {
        let qos = Qos {
            epoch: Instant::now(),
            read_iops: Bucket::default(),
            write_iops: Bucket::default(),
            iops: Bucket::default(),
            read_bytes: Bucket::default(),
            write_bytes: Bucket::default(),
            bytes: Bucket::default(),
            limited: AtomicBool::new(false),
        };
        qos.set(limits);
        qos
    }

    /// Replaces the limits (see the module docs).
    pub fn set(&self, limits: &QosLimits) {
        self.read_iops.set(limits.read_iops);
        self.write_iops.set(limits.write_iops);
        self.iops.set(limits.iops);
        self.read_bytes.set(limits.read_bytes);
        self.write_bytes.set(limits.write_bytes);
        self.bytes.set(limits.bytes);
        self.limited.store(!limits.is_empty(), Ordering::Release);
    }

    /// The limits in force (bursts filled in with their defaults).
    pub fn limits(&self) -> QosLimits {
        QosLimits {
            read_iops: self.read_iops.limit(),
            write_iops: self.write_iops.limit(),
            iops: self.iops.limit(),
            read_bytes: self.read_bytes.limit(),
            write_bytes: self.write_bytes.limit(),
            bytes: self.bytes.limit(),
        }
    }

    /// Whether any limit is set (else [`Qos::admit`] always answers zero).
    pub fn is_limited(&self) -> bool {
        self.limited.load(Ordering::Acquire)
    }

    /// Nanoseconds since the limiter was made: the clock [`Qos::admit_at`] runs on.
    pub fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Admits a request of `len` bytes now: how long it must wait (see the module docs).
    /// Without limits: zero, reading no clock.
    pub fn admit(&self, dir: Direction, len: u64) -> Duration {
        if !self.is_limited() {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.admit_at(dir, len, self.now()))
    }

    /// [`Qos::admit`] at `now` nanoseconds on the limiter's clock; the wait in nanoseconds.
    pub fn admit_at(&self, dir: Direction, len: u64, now: u64) -> u64 {
        let (ops, bytes) = match dir {
            Direction::Read => (&self.read_iops, &self.read_bytes),
            Direction::Write => (&self.write_iops, &self.write_bytes),
        };
        ops.take(1, now)
            .max(self.iops.take(1, now))
            .max(bytes.take(len, now))
            .max(self.bytes.take(len, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn limit(rate: u64, burst: u64) -> Option<QosLimit> {
        Some(QosLimit {
            rate,
            burst: Some(burst),
        })
    }

    /// `depth` clients, each issuing its next request when the last one ran (service time
    /// zero), on a virtual clock, for `secs` seconds from `start`: requests (and bytes)
    /// admitted to run before the end.
    fn closed_loop(
        qos: &Qos,
        dir: Direction,
        len: u64,
        depth: usize,
        start: u64,
        secs: u64,
    ) -> (u64, u64) {
        let end = start + secs * SEC;
        // each client's next issue time
        let mut next = vec![start; depth];
        let (mut n, mut bytes) = (0, 0);
        loop {
            let (i, &t) = next.iter().enumerate().min_by_key(|(_, t)| **t).unwrap();
            if t >= end {
                return (n, bytes);
            }
            let runs_at = t + qos.admit_at(dir, len, t);
            if runs_at < end {
                n += 1;
                bytes += len;
            }
            next[i] = runs_at;
        }
    }

    #[test]
    fn a_steady_load_over_the_limit_gets_the_rate_plus_at_most_the_burst() {
        let qos = Qos::new(&QosLimits {
            write_iops: limit(1_000, 100),
            ..QosLimits::default()
        });
        let (n, _) = closed_loop(&qos, Direction::Write, 4096, 32, 0, 60);
        // 60 s at 1,000/s, plus the full bucket at the start
        assert!((60_000..=60_100).contains(&n), "{n} writes in 60 s");
        // reads are not limited by a write limit
        for _ in 0..100_000 {
            assert_eq!(qos.admit_at(Direction::Read, 4096, 60 * SEC), 0);
        }
    }

    #[test]
    fn bytes_limits_pace_requests_larger_than_the_burst() {
        let mib = 1 << 20;
        let qos = Qos::new(&QosLimits {
            bytes: limit(10 * mib, mib),
            ..QosLimits::default()
        });
        // 4 MiB requests, 4 times the burst: each waits its own excess even when idle
        assert_eq!(
            qos.admit_at(Direction::Write, 4 * mib, 0),
            3 * SEC / 10,
            "an idle bucket lends the burst, the rest waits at the rate"
        );
        let (_, bytes) = closed_loop(&qos, Direction::Read, 4 * mib, 8, SEC, 60);
        let want = 60 * 10 * mib;
        assert!(
            bytes >= want - 4 * mib && bytes <= want + mib,
            "{bytes} bytes in 60 s, want {want}"
        );
    }

    #[test]
    fn a_quiet_bucket_fills_to_its_burst_and_no_further() {
        let qos = Qos::new(&QosLimits {
            read_iops: limit(100, 10),
            ..QosLimits::default()
        });
        // the first 10 pass at once, the 11th waits 1/100 s
        for _ in 0..10 {
            assert_eq!(qos.admit_at(Direction::Read, 512, 0), 0);
        }
        assert_eq!(qos.admit_at(Direction::Read, 512, 0), SEC / 100);
        // an hour later the bucket holds 10 again, not 360,000
        let later = 3_600 * SEC;
        for _ in 0..10 {
            assert_eq!(qos.admit_at(Direction::Read, 512, later), 0);
        }
        assert_eq!(qos.admit_at(Direction::Read, 512, later), SEC / 100);
    }

    #[test]
    fn the_total_limit_holds_reads_and_writes_together_and_the_tightest_bucket_wins() {
        let qos = Qos::new(&QosLimits {
            iops: limit(1_000, 1),
            write_iops: limit(100, 1),
            ..QosLimits::default()
        });
        let (w, _) = closed_loop(&qos, Direction::Write, 4096, 4, 0, 10);
        assert!((1_000..=1_002).contains(&w), "{w} writes in 10 s at 100/s");
        // reads share the total with the writes' debt so far: from 10 s on, 1,000/s
        let (r, _) = closed_loop(&qos, Direction::Read, 4096, 4, 10 * SEC, 10);
        assert!(
            (9_900..=10_001).contains(&r),
            "{r} reads in 10 s at 1,000/s"
        );
    }

    #[test]
    fn a_limit_changed_live_applies_from_the_next_request() {
        let qos = Qos::new(&QosLimits {
            write_bytes: limit(1 << 20, 1 << 16),
            ..QosLimits::default()
        });
        let (_, slow) = closed_loop(&qos, Direction::Write, 1 << 16, 4, 0, 10);
        assert!(slow <= (10 << 20) + (1 << 17), "{slow} bytes at 1 MiB/s");
        qos.set(&QosLimits {
            write_bytes: limit(8 << 20, 1 << 16),
            ..QosLimits::default()
        });
        // the debt in time carries over: the 4 clients' last requests, admitted at 1 MiB/s
        // (at most 4 x 62.5 ms), then 8 MiB/s
        let (_, fast) = closed_loop(&qos, Direction::Write, 1 << 16, 4, 10 * SEC, 10);
        let want = 80u64 << 20;
        assert!(
            fast >= want - (3 << 20) && fast <= want + (1 << 17),
            "{fast} bytes at 8 MiB/s, want {want}"
        );
        assert_eq!(qos.limits().write_bytes, limit(8 << 20, 1 << 16));
        // removing every limit: nothing waits, and the clock is not read
        qos.set(&QosLimits::default());
        assert!(!qos.is_limited());
        assert_eq!(qos.admit(Direction::Write, 1 << 30), Duration::ZERO);
        assert_eq!(qos.limits(), QosLimits::default());
    }

    #[test]
    fn limits_report_their_default_burst() {
        let qos = Qos::new(&QosLimits {
            read_bytes: Some(QosLimit {
                rate: 50 << 20,
                burst: None,
            }),
            ..QosLimits::default()
        });
        assert_eq!(qos.limits().read_bytes, limit(50 << 20, 5 << 20));
    }

    #[test]
    fn concurrent_admissions_lend_every_token_once() {
        let qos = std::sync::Arc::new(Qos::new(&QosLimits {
            iops: limit(1_000, 1),
            ..QosLimits::default()
        }));
        // 4 threads x 1,000 requests at the same instant: the waits are exactly 0, 1, .., 3,999
        // ms (as one thread would see them), in some order
        let mut waits: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let q = &qos;
                    s.spawn(move || {
                        (0..1_000)
                            .map(|_| q.admit_at(Direction::Read, 4096, 0))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        waits.sort_unstable();
        let want: Vec<u64> = (0..4_000).map(|i| i * SEC / 1_000).collect();
        assert_eq!(waits, want);
    }
}
