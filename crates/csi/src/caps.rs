//! Volume capabilities: which access types and modes glidefs serves, and the capability
//! lists each service advertises.
//!
//! A glidefs volume is written by one daemon at a time (the store's owner fence), so every
//! single-node mode is served and no multi-node one: `SINGLE_NODE_WRITER`,
//! `SINGLE_NODE_READER_ONLY`, `SINGLE_NODE_SINGLE_WRITER`, `SINGLE_NODE_MULTI_WRITER` (pods
//! of one node share it). Access types: raw block, and a filesystem (`ext4`, the default, or
//! `xfs`) made on first use.

use tonic::Status;

use crate::pb;
use crate::pb::volume_capability::access_mode::Mode;
use crate::pb::volume_capability::AccessType;

/// Filesystems NodeStage makes and mounts.
pub const FILESYSTEMS: &[&str] = &["ext4", "xfs"];

/// How a volume is used on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    Block,
    Mount {
        fs_type: String,
        mount_flags: Vec<String>,
    },
}

/// Why `cap` is not served, or `None` when it is.
pub fn unsupported(cap: &pb::VolumeCapability) -> Option<String> {
    let mode = cap
        .access_mode
        .as_ref()
        .and_then(|m| Mode::try_from(m.mode).ok());
    match mode {
        None => return Some("no access mode".into()),
        Some(
            Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter,
        ) => {}
        Some(m) => {
            return Some(format!(
                "access mode {} is not served: a glidefs volume is attached to one node at a time",
                m.as_str_name()
            ))
        }
    }
    match &cap.access_type {
        None => Some("no access type (block or mount)".into()),
        Some(AccessType::Block(_)) => None,
        Some(AccessType::Mount(m)) if m.fs_type.is_empty() => None,
        Some(AccessType::Mount(m)) if FILESYSTEMS.contains(&m.fs_type.as_str()) => None,
        Some(AccessType::Mount(m)) => Some(format!(
            "filesystem {:?} is not served (one of {})",
            m.fs_type,
            FILESYSTEMS.join(", ")
        )),
    }
}

/// Checks a request's capabilities: at least one, each served (`INVALID_ARGUMENT`).
pub fn check_all(caps: &[pb::VolumeCapability]) -> Result<(), Status> {
    if caps.is_empty() {
        return Err(Status::invalid_argument("volume_capabilities is empty"));
    }
    for c in caps {
        if let Some(why) = unsupported(c) {
            return Err(Status::invalid_argument(format!(
                "volume capability: {why}"
            )));
        }
    }
    Ok(())
}

/// The access of one capability (checked), for the node.
pub fn access(cap: Option<&pb::VolumeCapability>) -> Result<Access, Status> {
    let cap = cap.ok_or_else(|| Status::invalid_argument("volume_capability is missing"))?;
    if let Some(why) = unsupported(cap) {
        return Err(Status::invalid_argument(format!(
            "volume capability: {why}"
        )));
    }
    Ok(match &cap.access_type {
        Some(AccessType::Mount(m)) => Access::Mount {
            fs_type: if m.fs_type.is_empty() {
                "ext4".into()
            } else {
                m.fs_type.clone()
            },
            mount_flags: m.mount_flags.clone(),
        },
        _ => Access::Block,
    })
}

/// Whether the capability allows one publication at a time (`SINGLE_NODE_SINGLE_WRITER`).
pub fn single_writer(cap: Option<&pb::VolumeCapability>) -> bool {
    cap.and_then(|c| c.access_mode.as_ref())
        .is_some_and(|m| m.mode == Mode::SingleNodeSingleWriter as i32)
}

/// Whether the capability only reads.
pub fn reader_only(cap: Option<&pb::VolumeCapability>) -> bool {
    cap.and_then(|c| c.access_mode.as_ref())
        .is_some_and(|m| m.mode == Mode::SingleNodeReaderOnly as i32)
}

fn controller_rpc(
    t: pb::controller_service_capability::rpc::Type,
) -> pb::ControllerServiceCapability {
    pb::ControllerServiceCapability {
        r#type: Some(pb::controller_service_capability::Type::Rpc(
            pb::controller_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

/// What the controller advertises (and so what a conformance run exercises).
pub fn controller() -> Vec<pb::ControllerServiceCapability> {
    use pb::controller_service_capability::rpc::Type as T;
    [
        T::CreateDeleteVolume,
        T::PublishUnpublishVolume,
        T::CreateDeleteSnapshot,
        T::ListSnapshots,
        T::CloneVolume,
        T::ExpandVolume,
        T::SingleNodeMultiWriter,
        T::ModifyVolume,
    ]
    .into_iter()
    .map(controller_rpc)
    .collect()
}

/// What the node advertises.
pub fn node() -> Vec<pb::NodeServiceCapability> {
    use pb::node_service_capability::rpc::Type as T;
    [
        T::StageUnstageVolume,
        T::GetVolumeStats,
        T::ExpandVolume,
        T::SingleNodeMultiWriter,
        T::VolumeCondition,
    ]
    .into_iter()
    .map(|t| pb::NodeServiceCapability {
        r#type: Some(pb::node_service_capability::Type::Rpc(
            pb::node_service_capability::Rpc { r#type: t as i32 },
        )),
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(mode: Mode, access: AccessType) -> pb::VolumeCapability {
        pb::VolumeCapability {
            access_mode: Some(pb::volume_capability::AccessMode { mode: mode as i32 }),
            access_type: Some(access),
        }
    }

    fn mount(fs: &str) -> AccessType {
        AccessType::Mount(pb::volume_capability::MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })
    }

    #[test]
    fn single_node_modes_and_known_filesystems_are_served() {
        let block = AccessType::Block(pb::volume_capability::BlockVolume {});
        assert_eq!(
            unsupported(&cap(Mode::SingleNodeWriter, block.clone())),
            None
        );
        assert_eq!(
            unsupported(&cap(Mode::SingleNodeReaderOnly, mount(""))),
            None
        );
        assert_eq!(
            unsupported(&cap(Mode::SingleNodeMultiWriter, mount("xfs"))),
            None
        );
        let why = unsupported(&cap(Mode::MultiNodeMultiWriter, block)).unwrap();
        assert!(why.contains("MULTI_NODE_MULTI_WRITER"), "{why}");
        let why = unsupported(&cap(Mode::SingleNodeWriter, mount("zfs"))).unwrap();
        assert!(why.contains("zfs"), "{why}");
        let none = pb::VolumeCapability::default();
        assert!(unsupported(&none).is_some());
        assert_eq!(
            access(Some(&cap(Mode::SingleNodeWriter, mount("")))).unwrap(),
            Access::Mount {
                fs_type: "ext4".into(),
                mount_flags: vec![]
            }
        );
        assert!(check_all(&[]).is_err());
    }
}
