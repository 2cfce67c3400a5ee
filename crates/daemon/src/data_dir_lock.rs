//! One daemon per data directory: an exclusive lock on `data_dir/lock`.
//!
//! Contract:
//! - `glidefs serve` takes the lock ([`DataDirLock::acquire`], `flock(LOCK_EX | LOCK_NB)`
//!   through [`std::fs::File::try_lock`]) before it touches anything the data directory's
//!   owner uses: the API socket, `owner-id`, `state.json`, the volume caches. A second daemon
//!   on the same data directory is refused at once with [`LockError::Held`], naming the
//!   directory and, when the lock file says it, the holder's pid; it has changed nothing.
//! - The lock is held for the process's whole life: the server keeps it until its last step
//!   (after the socket is removed), and `glidefs serve` keeps it from there until the process
//!   exits or re-executes itself. The kernel releases it with the last descriptor of the open
//!   file: at exit, on any death (`kill -9` included: no stale lock survives a crash), and at
//!   the `exec` of a SIGHUP hand-off (the descriptor is close-on-exec), so the re-executed
//!   image takes it again at its start.
//! - `glidefs handoff` starts while the old daemon still holds the lock: it asks the old one to
//!   hand off, waits for its pid to exit, then takes the lock with a bounded wait
//!   ([`DataDirLock::acquire_within`], [`LockError::StillHeld`] when it runs out) before it
//!   serves; it never waits on the lock without a bound.
//! - The pid written into the lock file after locking is for the error message only: the
//!   lock is the `flock`, never the file's content or existence (the file is never removed,
//!   so two daemons can never lock two different files at the same path).

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The lock file's name inside `data_dir`.
pub const LOCK_FILE: &str = "lock";

/// How often [`DataDirLock::acquire_within`] tries again.
const RETRY_EVERY: Duration = Duration::from_millis(10);

/// Why the data directory's lock was not taken; each names the directory or the lock file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    #[error(
        "data_dir `{data_dir}` is in use by another glidefs ({}): two daemons on one data \
         directory would share its owner id, state.json and volume caches; stop that one first \
         (lock file `{path}`)",
        holder(.pid)
    )]
    Held {
        data_dir: String,
        path: String,
        /// The holder's pid, when its lock file says it.
        pid: Option<u32>,
    },
    #[error(
        "data_dir `{data_dir}` is still in use by another glidefs ({}) after waiting {waited:?} \
         for it to let go (lock file `{path}`)",
        holder(.pid)
    )]
    StillHeld {
        data_dir: String,
        path: String,
        pid: Option<u32>,
        waited: Duration,
    },
    #[error("cannot {what} lock file `{path}`: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

fn holder(pid: &Option<u32>) -> String {
    match pid {
        Some(pid) => format!("pid {pid}"),
        None => "pid unknown".to_string(),
    }
}

/// The held lock of one data directory; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct DataDirLock {
    /// The locked open file: the `flock` lives as long as this descriptor.
    _file: File,
    data_dir: PathBuf,
}

impl DataDirLock {
    /// Takes the lock of `data_dir` (which must exist) without waiting: [`LockError::Held`]
    /// when another process (or another open of it in this one) holds it.
    pub fn acquire(data_dir: &Path) -> Result<Self, LockError> {
        match Self::try_acquire(data_dir)? {
            Ok(lock) => Ok(lock),
            Err(pid) => Err(LockError::Held {
                data_dir: data_dir.display().to_string(),
                path: lock_path(data_dir).display().to_string(),
                pid,
            }),
        }
    }

    /// Takes the lock of `data_dir`, waiting up to `wait` for its holder to let go (a
    /// predecessor that is exiting): [`LockError::StillHeld`] when it has not by then.
    pub async fn acquire_within(data_dir: &Path, wait: Duration) -> Result<Self, LockError> {
        let start = Instant::now();
        loop {
            match Self::try_acquire(data_dir)? {
                Ok(lock) => return Ok(lock),
                Err(pid) if start.elapsed() >= wait => {
                    return Err(LockError::StillHeld {
                        data_dir: data_dir.display().to_string(),
                        path: lock_path(data_dir).display().to_string(),
                        pid,
                        waited: wait,
                    })
                }
                Err(_) => tokio::time::sleep(RETRY_EVERY).await,
            }
        }
    }

    /// The locked data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// One try: the lock, or the holder's pid as far as the lock file tells it.
    fn try_acquire(data_dir: &Path) -> Result<Result<Self, Option<u32>>, LockError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = lock_path(data_dir);
        let shown = path.display().to_string();
        let io = |what: &'static str| {
            let path = shown.clone();
            move |source| LockError::Io { what, path, source }
        };
        // Not truncated on open: until we hold the lock, the pid in it is the holder's.
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io("open"))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(Err(read_pid(&mut file))),
            Err(std::fs::TryLockError::Error(e)) => return Err(io("lock")(e)),
        }
        // Informational only: a failure to record the pid does not cost the lock.
        if let Err(e) = write_pid(&mut file) {
            tracing::warn!(path = %shown, error = %e, "cannot write this daemon's pid into the data directory's lock file");
        }
        Ok(Ok(Self {
            _file: file,
            data_dir: data_dir.to_path_buf(),
        }))
    }
}

/// `data_dir/lock`.
pub fn lock_path(data_dir: &Path) -> PathBuf {
    data_dir.join(LOCK_FILE)
}

/// The pid the holder wrote, if the file holds one (it may be mid-write: then none).
fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

fn write_pid(file: &mut File) -> std::io::Result<()> {
    use std::io::Seek;
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_acquire_is_refused_with_the_holders_pid_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).expect("first");
        assert_eq!(
            std::fs::read_to_string(lock_path(dir.path())).unwrap(),
            format!("{}\n", std::process::id())
        );
        let err = DataDirLock::acquire(dir.path()).expect_err("second while the first holds it");
        match &err {
            LockError::Held { pid, .. } => assert_eq!(*pid, Some(std::process::id())),
            other => panic!("{other:?}"),
        }
        let text = err.to_string();
        for needle in [
            dir.path().display().to_string(),
            format!("pid {}", std::process::id()),
        ] {
            assert!(text.contains(&needle), "`{needle}` missing: {text}");
        }
        drop(first);
        DataDirLock::acquire(dir.path()).expect("free once the first is dropped");
    }

    #[test]
    fn an_unreadable_pid_is_reported_as_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let _first = DataDirLock::acquire(dir.path()).unwrap();
        std::fs::write(lock_path(dir.path()), "garbage").unwrap();
        match DataDirLock::acquire(dir.path()) {
            Err(e @ LockError::Held { pid: None, .. }) => {
                assert!(e.to_string().contains("pid unknown"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn acquire_within_waits_for_the_holder_and_gives_up_after_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        match DataDirLock::acquire_within(dir.path(), Duration::from_millis(50)).await {
            Err(LockError::StillHeld { waited, .. }) => {
                assert_eq!(waited, Duration::from_millis(50))
            }
            other => panic!("{other:?}"),
        }
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(first);
        });
        DataDirLock::acquire_within(dir.path(), Duration::from_secs(10))
            .await
            .expect("taken once the holder lets go");
        release.await.unwrap();
    }
}
