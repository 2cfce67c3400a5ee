//! What the node plugin does to the node's filesystem tree: make a filesystem, mount, bind,
//! unmount, grow, measure. [`SystemMounter`] runs the system's tools (`blkid`, `mkfs.*`,
//! `mount`, `umount`, `resize2fs`, `xfs_growfs`) and reads `/proc/self/mountinfo`; tests of
//! the gRPC surface use a mounter that only records.
//!
//! Contract: every call is idempotent where the CSI call it serves must be (mounting what is
//! mounted there already, unmounting what is not mounted, are no-ops); a filesystem is only
//! ever made on a device that has none (`blkid` finds no signature), so a volume's data is
//! never formatted away.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A node-side operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    #[error("{command} failed: {detail}")]
    Command { command: String, detail: String },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl MountError {
    pub fn status(&self) -> tonic::Status {
        tonic::Status::internal(self.to_string())
    }
}

/// Space of a mounted filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub used_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
}

/// The node's mount operations (blocking: called from the blocking pool).
pub trait Mounter: Send + Sync + std::fmt::Debug {
    /// Whether `path` is a mount point.
    fn is_mounted(&self, path: &Path) -> Result<bool, MountError>;
    /// Makes an `fs` filesystem on `device` unless it has one; returns whether it made one.
    fn format_if_blank(&self, device: &str, fs: &str) -> Result<bool, MountError>;
    /// Mounts `device` (filesystem `fs`) on the directory `target`.
    fn mount(
        &self,
        device: &str,
        target: &Path,
        fs: &str,
        options: &[String],
    ) -> Result<(), MountError>;
    /// Binds `source` (a directory, or a device file) onto `target`, read-only if asked.
    fn bind(&self, source: &Path, target: &Path, readonly: bool) -> Result<(), MountError>;
    /// Unmounts `target` (nothing mounted there: a no-op).
    fn unmount(&self, target: &Path) -> Result<(), MountError>;
    /// Grows the filesystem `fs` on `device`, mounted at `mounted_at`, to the device's size.
    fn grow(&self, device: &str, mounted_at: &Path, fs: &str) -> Result<(), MountError>;
    /// Space of the filesystem at `path`.
    fn usage(&self, path: &Path) -> Result<Usage, MountError>;
}

/// The mount points of this process's mount namespace (`/proc/self/mountinfo`'s fifth
/// field, octal escapes decoded).
pub fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .collect()
}

/// Decodes mountinfo's `\NNN` octal escapes (space, tab, newline, backslash).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let digit = |k: usize| u32::from(b[i + k] - b'0');
            if let Ok(v) = u8::try_from(digit(1) * 64 + digit(2) * 8 + digit(3)) {
                out.push(v);
                i += 4;
                continue;
            }
            out.push(b[i]);
            i += 1;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The system's tools.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemMounter;

fn run(program: &str, args: &[&str]) -> Result<std::process::Output, MountError> {
    let command = format!("{program} {}", args.join(" "));
    Command::new(program)
        .args(args)
        .output()
        .map_err(|e| MountError::Command {
            command,
            detail: e.to_string(),
        })
}

fn run_ok(program: &str, args: &[&str]) -> Result<(), MountError> {
    let out = run(program, args)?;
    if out.status.success() {
        return Ok(());
    }
    Err(MountError::Command {
        command: format!("{program} {}", args.join(" ")),
        detail: format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}

fn path_str(p: &Path) -> Result<&str, MountError> {
    p.to_str().ok_or_else(|| MountError::Io {
        op: "use",
        path: p.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "path is not UTF-8"),
    })
}

impl Mounter for SystemMounter {
    fn is_mounted(&self, path: &Path) -> Result<bool, MountError> {
        let info =
            std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| MountError::Io {
                op: "read",
                path: "/proc/self/mountinfo".into(),
                source,
            })?;
        // Compared as given and canonical (a kubelet path may pass through a symlink).
        let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        Ok(mount_points(&info)
            .iter()
            .any(|m| m == path || *m == canonical))
    }

    fn format_if_blank(&self, device: &str, fs: &str) -> Result<bool, MountError> {
        // blkid -p: probe the device itself (no cache); exit 2 when it finds no signature.
        let probe = run("blkid", &["-p", "-o", "value", "-s", "TYPE", device])?;
        match probe.status.code() {
            Some(0) => return Ok(false),
            Some(2) => {}
            _ => {
                return Err(MountError::Command {
                    command: format!("blkid -p {device}"),
                    detail: String::from_utf8_lossy(&probe.stderr).trim().to_string(),
                })
            }
        }
        match fs {
            "ext4" => run_ok("mkfs.ext4", &["-q", "-F", device])?,
            "xfs" => run_ok("mkfs.xfs", &["-q", device])?,
            other => {
                return Err(MountError::Command {
                    command: format!("mkfs.{other}"),
                    detail: "not a filesystem glidefs makes".into(),
                })
            }
        }
        Ok(true)
    }

    fn mount(
        &self,
        device: &str,
        target: &Path,
        fs: &str,
        options: &[String],
    ) -> Result<(), MountError> {
        if self.is_mounted(target)? {
            return Ok(());
        }
        let t = path_str(target)?;
        let mut args = vec!["-t", fs];
        let opts = options.join(",");
        if !opts.is_empty() {
            args.extend(["-o", opts.as_str()]);
        }
        args.extend([device, t]);
        run_ok("mount", &args)
    }

    fn bind(&self, source: &Path, target: &Path, readonly: bool) -> Result<(), MountError> {
        if self.is_mounted(target)? {
            return Ok(());
        }
        let (s, t) = (path_str(source)?, path_str(target)?);
        run_ok("mount", &["--bind", s, t])?;
        if readonly {
            if let Err(e) = run_ok("mount", &["-o", "remount,bind,ro", t]) {
                let _ = run_ok("umount", &[t]);
                return Err(e);
            }
        }
        Ok(())
    }

    fn unmount(&self, target: &Path) -> Result<(), MountError> {
        if !self.is_mounted(target)? {
            return Ok(());
        }
        run_ok("umount", &[path_str(target)?])
    }

    fn grow(&self, device: &str, mounted_at: &Path, fs: &str) -> Result<(), MountError> {
        match fs {
            "xfs" => run_ok("xfs_growfs", &[path_str(mounted_at)?]),
            _ => run_ok("resize2fs", &[device]),
        }
    }

    fn usage(&self, path: &Path) -> Result<Usage, MountError> {
        let s = rustix::fs::statvfs(path).map_err(|e| MountError::Io {
            op: "statvfs",
            path: path.to_path_buf(),
            source: e.into(),
        })?;
        let frag = s.f_frsize;
        Ok(Usage {
            total_bytes: s.f_blocks.saturating_mul(frag),
            available_bytes: s.f_bavail.saturating_mul(frag),
            used_bytes: s.f_blocks.saturating_sub(s.f_bfree).saturating_mul(frag),
            total_inodes: s.f_files,
            free_inodes: s.f_ffree,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_read_with_escapes_decoded() {
        let info = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                    90 22 259:0 / /var/lib/kubelet/pods/x/volumes/my\\040vol rw - ext4 /dev/ublkb0 rw\n";
        let points = mount_points(info);
        assert_eq!(
            points,
            vec![
                PathBuf::from("/"),
                PathBuf::from("/var/lib/kubelet/pods/x/volumes/my vol")
            ]
        );
        assert_eq!(unescape("a\\134b"), "a\\b");
        assert_eq!(unescape("tail\\04"), "tail\\04");
    }
}
