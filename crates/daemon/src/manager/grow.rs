//! Online resize (grow only) of a volume: [`VolumeManager::resize`].
//!
//! Steps, under the admin lock (serialised with create, remove, restore and shutdown):
//! 1. validate: the volume is open and writable here (not read-only, not fenced), the size
//!    parses, is a multiple of the block size, at most 256T and no smaller than the current
//!    size or the one `state.json` records (the same size retries the device step, or the
//!    engine step, of an earlier resize);
//! 2. ask the exporter whether the volume's device can change its capacity (the kernel's
//!    `UBLK_F_UPDATE_SIZE`): where it cannot, the call fails here with nothing changed;
//! 3. record the new size in `state.json` (the entry is replaced by one with the new spec);
//! 4. grow the volume ([`glidefs_volume::Volume::resize`]: the cache's checkpoint records the
//!    size durably, the store's manifest at the next publish). On failure `state.json` keeps
//!    the new size: the cache may have recorded it already (a failure while its checkpoint
//!    was replaced), and opening with a larger size than recorded is always safe while a
//!    smaller one is refused; the error says so, and the same call again retries;
//! 5. grow the block device (ublk UPDATE_SIZE): a failure here is `device_failed` saying
//!    that the volume grew and the device did not; the same call again retries it.
//!
//! Crashes: before step 3 is durable the volume reopens at the old size; after it, at the new
//! one (`Volume::open` grows a volume opened with a larger size than its cache and manifest
//! record, so a crash between 3 and 4 completes the resize at the next start); a device the
//! crashed daemon left at the old size is grown when it is recovered (`VolumeDevice::recover`).
//! Data is never lost: the old end only moves up, and nothing addresses a block past it
//! before the engine grew.

use serde_json::Value;

use crate::config::limits;
use crate::manager::blocking::device_step;
use crate::manager::error::{Detail, ManagerError};
use crate::manager::spec::{json_bytes, VolumeSpec};
use crate::manager::VolumeManager;
use glidefs_model::api::ResizeReport;
use glidefs_model::log::chain;

/// The size a resize of `spec`'s volume (now `current` bytes) to `requested` asks for, checked.
fn check_size(spec: &VolumeSpec, current: u64, requested: &Value) -> Result<u64, ManagerError> {
    let bad = |reason: String| ManagerError::InvalidSize {
        value: requested.to_string(),
        reason,
    };
    let name = &spec.name;
    let size = json_bytes(requested).map_err(bad)?;
    let bs = u64::from(spec.block_size);
    if size == 0 || size > limits::MAX_VOLUME_SIZE {
        return Err(bad(format!(
            "must be in 1..=256T (volume `{name}` is {current} bytes)"
        )));
    }
    if !size.is_multiple_of(bs) {
        return Err(bad(format!(
            "{size} bytes is not a multiple of the block size {bs} of volume `{name}` (now {current} bytes)"
        )));
    }
    if size < current {
        return Err(bad(format!(
            "volume `{name}` is {current} bytes; shrinking it to {size} bytes is not supported (a volume only grows)"
        )));
    }
    if spec.read_only {
        return Err(ManagerError::ReadOnly {
            name: name.clone(),
            detail: Detail::new(
                "it is exported read-only here (or is a snapshot attachment); resize it on the daemon that writes it",
            ),
        });
    }
    Ok(size)
}

impl VolumeManager {
    /// Grows volume `name` to `size` (bytes or a size string); see the module docs.
    pub async fn resize(&self, name: &str, size: &Value) -> Result<ResizeReport, ManagerError> {
        let admin = self.admin.lock().await;
        if *admin {
            return Err(ManagerError::ShuttingDown);
        }
        let entry = self.entry(name)?;
        let open = entry.open()?;
        if let Some(f) = open.volume.fenced() {
            return Err(ManagerError::Fenced {
                name: name.to_string(),
                detail: Detail::new(format!("resize refused, nothing changed: {f}")),
            });
        }
        let from = open.volume.size();
        // Never below what state.json records: after an engine failure the cache may hold
        // that size already (see the module docs).
        let to = check_size(&entry.spec, from.max(entry.spec.size), size)?;
        let id = open.device_id();
        if let Some(id) = id {
            let (ex, n) = (self.devices.clone(), name.to_string());
            device_step(name, "check resize", move || Ok(ex.check_resize(&n, id)?)).await?;
        }
        self.record_spec(
            &entry,
            VolumeSpec {
                size: to,
                ..entry.spec.clone()
            },
        )
        .await?;
        if from != to {
            // Also when state.json already had the size (an earlier call failed after it).
            if let Err(e) = open.volume.resize(to).await {
                tracing::error!(volume = %name, from, to, error = %chain(&e), "resize failed in the engine; state.json keeps the new size");
                let op = format!(
                    "resize from {from} to {to} bytes (state.json records {to}: the volume opens at that size at the next start; the same resize again retries now)"
                );
                return Err(open.error(name, &op, e));
            }
        }
        let mut device = None;
        if let Some(id) = id {
            let (ex, n) = (self.devices.clone(), name.to_string());
            device_step(name, "resize", move || Ok(ex.resize(&n, id, to)?))
                .await
                .map_err(|e| ManagerError::DeviceNotResized {
                    name: name.to_string(),
                    from,
                    to,
                    detail: Detail::caused(format!("device {id}"), e),
                })?;
            device = open.device.lock().as_ref().and_then(|d| d.path());
        }
        drop(admin);
        tracing::info!(volume = %name, from, to, ?device, "volume resized");
        Ok(ResizeReport {
            name: name.to_string(),
            previous_size: from,
            size: to,
            device,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(read_only: bool) -> VolumeSpec {
        // From JSON (as state.json holds it), so fields added later keep their defaults.
        serde_json::from_value(json!({
            "name": "v", "size": 1u64 << 30, "block_size": 128 << 10, "queues": 1,
            "queue_depth": 64, "read_only": read_only,
        }))
        .unwrap()
    }

    #[test]
    fn sizes_are_checked_and_errors_name_both_sizes() {
        let s = spec(false);
        let cur = 1u64 << 30;
        assert_eq!(check_size(&s, cur, &json!("2G")).unwrap(), 2 << 30);
        assert_eq!(
            check_size(&s, cur, &json!(cur)).unwrap(),
            cur,
            "same size: retry"
        );
        let e = check_size(&s, cur, &json!("512M")).unwrap_err();
        assert_eq!(e.code(), "invalid_size");
        let m = e.to_string();
        assert!(
            m.contains("1073741824") && m.contains("536870912") && m.contains("shrink"),
            "{m}"
        );
        let e = check_size(&s, cur, &json!(cur + 4096)).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains(&(cur + 4096).to_string()) && m.contains("131072"),
            "{m}"
        );
        for bad in [json!(0), json!("1P"), json!(-1), json!("x"), json!(1.5)] {
            assert_eq!(
                check_size(&s, cur, &bad).unwrap_err().code(),
                "invalid_size",
                "{bad}"
            );
        }
        let e = check_size(&spec(true), cur, &json!("2G")).unwrap_err();
        assert!(e.to_string().contains("read-only"), "{e}");
    }
}
