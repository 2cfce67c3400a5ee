//! The daemon's file descriptor limit.
//!
//! Each volume holds several descriptors (cache files, WAL, its device's char device and
//! queue rings), so the 1024 a login shell gives runs out near a hundred volumes. At start
//! `serve` raises its soft `RLIMIT_NOFILE` to the hard limit (to `fs.nr_open` where the hard
//! limit is unlimited) and logs both values: [`raise_fd_limit`]. A create that would leave
//! fewer than [`RESERVE`] descriptors free is refused before it opens anything
//! ([`check_headroom`]), so that a daemon at its limit can still flush and remove volumes;
//! should descriptors run out anyway (an estimate was short, another path opened more), the
//! API answers `too_many_open_files` naming the limit ([`out_of_fds`]) instead of an
//! anonymous internal error. Either way the daemon goes on serving what it has.

use std::error::Error;

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// The soft limit before and after [`raise_fd_limit`], and the hard limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    /// Soft limit at start (`None`: unlimited).
    pub before: Option<u64>,
    /// Soft limit now.
    pub now: Option<u64>,
    /// Hard limit (`None`: unlimited).
    pub hard: Option<u64>,
}

/// The kernel's ceiling for a descriptor limit (`fs.nr_open`), used when the hard limit is
/// unlimited (the soft limit cannot be).
fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and logs what it got. Never fails: a
/// refused raise is logged and the daemon goes on with the limit it had.
pub fn raise_fd_limit() -> FdLimit {
    let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
    let target = maximum.unwrap_or_else(nr_open);
    let mut limit = FdLimit {
        before: current,
        now: current,
        hard: maximum,
    };
    if current.is_some_and(|c| c < target) {
        match setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(target),
                maximum,
            },
        ) {
            Ok(()) => limit.now = getrlimit(Resource::Nofile).current,
            Err(e) => tracing::warn!(
                soft = current,
                hard = maximum,
                error = %e,
                "could not raise the file descriptor limit; each volume holds several descriptors"
            ),
        }
    }
    tracing::info!(
        soft_at_start = limit.before,
        soft = limit.now,
        hard = limit.hard,
        "file descriptor limit (RLIMIT_NOFILE)"
    );
    limit
}

/// The soft descriptor limit now (`None`: unlimited).
pub fn fd_limit() -> Option<u64> {
    getrlimit(Resource::Nofile).current
}

/// Descriptors a create leaves free for everything else the daemon does: removes and
/// flushes (a directory fsync each), API connections, connections to the object store.
/// Without it the last create that fits leaves a daemon that cannot even remove a volume.
pub const RESERVE: u64 = 32;

/// Descriptors one more volume may take: its three cache files, and its device's char device
/// plus a ring and an eventfd per queue.
pub fn volume_need(queues: u16) -> u64 {
    3 + 1 + 2 * u64::from(queues)
}

/// Descriptors this process has open now (`/proc/self/fd`), `None` where that cannot be read.
pub fn open_fds() -> Option<u64> {
    std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as u64)
}

/// A create that would leave fewer than [`RESERVE`] descriptors free.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{open} file descriptors are open or promised to creates in flight, a volume with {queues} queues may take {need} more, and {RESERVE} are kept free for removes, flushes and connections: the soft RLIMIT_NOFILE of {limit} is reached (raise the hard limit: LimitNOFILE= in the systemd unit, or `ulimit -Hn` before `glidefs serve`; or remove volumes)")]
pub struct FdShortage {
    pub open: u64,
    pub queues: u16,
    pub need: u64,
    pub limit: u64,
}

/// Refuses (before anything is opened) a create of a volume with `queues` queues that would
/// leave fewer than [`RESERVE`] descriptors free, counting `pending` descriptors that creates
/// in flight may still open as taken. Unknowable counts (no `/proc`, unlimited) pass: the open
/// itself then fails with `EMFILE` if it must.
pub fn check_headroom(queues: u16, pending: u64) -> Result<(), FdShortage> {
    let (Some(limit), Some(now)) = (fd_limit(), open_fds()) else {
        return Ok(());
    };
    let open = now + pending;
    let need = volume_need(queues);
    if open + need + RESERVE > limit {
        return Err(FdShortage {
            open,
            queues,
            need,
            limit,
        });
    }
    Ok(())
}

/// Which descriptor limit an error ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfFds {
    /// `EMFILE`: this process's soft `RLIMIT_NOFILE`.
    Process,
    /// `ENFILE`: the system's `fs.file-max`.
    System,
}

/// Whether `err` or one of its causes is `EMFILE` or `ENFILE`.
pub fn out_of_fds(err: &(dyn Error + 'static)) -> Option<OutOfFds> {
    std::iter::successors(Some(err), |e| (*e).source()).find_map(|e| {
        match e.downcast_ref::<std::io::Error>()?.raw_os_error()? {
            libc::EMFILE => Some(OutOfFds::Process),
            libc::ENFILE => Some(OutOfFds::System),
            _ => None,
        }
    })
}

/// The sentence an out-of-descriptors answer starts with: which limit, its value, how to
/// raise it.
pub fn out_of_fds_message(which: OutOfFds) -> String {
    match which {
        OutOfFds::Process => format!(
            "the daemon ran out of file descriptors (its soft RLIMIT_NOFILE is {}; raise the hard limit: LimitNOFILE= in the systemd unit, or `ulimit -Hn` before `glidefs serve`)",
            fd_limit().map_or_else(|| "unlimited".to_string(), |n| n.to_string())
        ),
        OutOfFds::System => {
            "the system ran out of file descriptors (fs.file-max; see /proc/sys/fs/file-nr)"
                .to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("open the cache of volume `v`")]
    struct Wrapper(#[source] std::io::Error);

    #[test]
    fn emfile_and_enfile_are_found_anywhere_in_the_chain() {
        let deep = Wrapper(std::io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!(out_of_fds(&deep), Some(OutOfFds::Process));
        let sys = std::io::Error::from_raw_os_error(libc::ENFILE);
        assert_eq!(out_of_fds(&sys), Some(OutOfFds::System));
        let other = Wrapper(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(out_of_fds(&other), None);
    }

    #[test]
    fn the_message_names_the_limit() {
        let m = out_of_fds_message(OutOfFds::Process);
        let limit = fd_limit().map_or("unlimited".to_string(), |n| n.to_string());
        assert!(m.contains(&format!("RLIMIT_NOFILE is {limit}")), "{m}");
        assert!(m.contains("LimitNOFILE"), "{m}");
    }
}
