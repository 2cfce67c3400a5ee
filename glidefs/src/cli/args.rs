//! Command-line interface (clap definitions). What each command does is in `commands`
//! (volume client commands) and `main.rs` (dispatch).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use glidefs_model::size::ByteSize;

use crate::cli::qos::QosArgs;
use crate::cli::warmset::WarmsetCommand;

/// glidefs: ublk block devices backed by a local write cache and an object store.
#[derive(Debug, Parser)]
#[command(name = "glidefs", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: HTTP API on the unix socket (and optional TCP), volumes re-attached
    /// from data_dir/state.json. Stops cleanly on SIGTERM/SIGINT.
    Serve(ServeArgs),
    /// Take over from the running daemon without the devices going away: ask it to hand
    /// off (it detaches its devices, closes its volumes and exits), then serve them from this
    /// process (same options as `serve`). `kill -HUP` does the same in place.
    Handoff(ServeArgs),
    /// Manage volumes through the API of a running daemon.
    Volume(Box<VolumeArgs>),
    /// Snapshots of a volume: create, list, show, delete, attach read-only (clone one with
    /// `volume create NEW --from VOL@SNAP`).
    Snapshot(Box<SnapshotArgs>),
    /// Report the running kernel's ublk support and the transport glidefs would pick
    /// (GLIDEFS_FORCE_USER_COPY=1 forces user-copy). Exits 0 even without ublk: the report
    /// says `ublk_available: false` and why.
    Features {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Garbage-collect the object store: delete old manifests and packs nothing references
    /// (older than gc.grace_secs).
    Gc(GcArgs),
    /// Serve the Kubernetes CSI driver (gRPC on a unix socket) on top of a running daemon:
    /// the controller (volumes, snapshots, attachments), the node plugin (stage, publish), or
    /// both. See docs/kubernetes.md.
    Csi(Box<CsiArgs>),
}

/// Which CSI services `glidefs csi` serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CsiMode {
    Controller,
    Node,
    All,
}

/// `glidefs csi`.
#[derive(Debug, Args)]
pub struct CsiArgs {
    /// The services to serve.
    #[arg(long, value_enum)]
    pub mode: CsiMode,
    /// The CSI socket the kubelet or the sidecars talk to (`unix:///PATH` or a path).
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    pub endpoint: String,
    /// This node's name (node mode): NodeGetInfo's node id, the key of its attachments.
    #[arg(long, env = "NODE_NAME", required_if_eq_any = [("mode", "node"), ("mode", "all")])]
    pub node_id: Option<String>,
    /// The daemon's config file: the object store the driver keeps its records in, and the
    /// daemon's API socket [default: $GLIDEFS_CONFIG, else built-in defaults].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The daemon's API socket [default: api.socket of the config].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Node mode: where the plugin keeps its staged volumes.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/glidefs-csi")]
    pub state_dir: PathBuf,
    /// Node mode: the address the controller reaches this node's daemon at, for snapshots
    /// and expansions of the volumes it holds (`https://HOST:PORT` of the daemon's TCP
    /// listener, or `unix:PATH` where both run on one host) [default: unix:<socket>].
    #[arg(long, value_name = "URL")]
    pub advertise_api: Option<String>,
    /// Controller mode: the bearer token file for node daemons' `https://` addresses.
    #[arg(long, value_name = "FILE")]
    pub node_token_file: Option<PathBuf>,
    /// Controller mode: the CA certificate(s) to verify node daemons with [default: the
    /// system's].
    #[arg(long, value_name = "FILE")]
    pub node_ca: Option<PathBuf>,
}

/// `glidefs serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Config file (TOML); default: $GLIDEFS_CONFIG, else built-in defaults.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Serve volumes without block devices (no kernel needed; for tests and store-only use).
    #[arg(long)]
    pub no_devices: bool,
}

/// `glidefs gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Config file (TOML) naming the store; default: $GLIDEFS_CONFIG, else built-in defaults.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Report what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Only this volume (default: every volume in the store).
    #[arg(long, value_name = "NAME")]
    pub volume: Option<String>,
    /// Print the reports as JSON.
    #[arg(long)]
    pub json: bool,
}

/// How to reach the API, and the output format.
#[derive(Debug, Args)]
pub struct ApiTarget {
    /// Unix socket of the daemon [default: api.socket of --config / $GLIDEFS_CONFIG, else
    /// /run/glidefs/api.sock].
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        env = "GLIDEFS_SOCKET",
        conflicts_with = "url"
    )]
    pub socket: Option<PathBuf>,
    /// Talk to the TCP listener instead: https://HOST:PORT (TLS; the daemon's certificate is
    /// verified against --ca, else the system's CA certificates, and must name HOST), or
    /// http://HOST:PORT for a plaintext listener on loopback.
    #[arg(long, global = true, value_name = "URL")]
    pub url: Option<String>,
    /// CA certificate(s), PEM, to verify an https:// --url with (e.g. the daemon's
    /// api.tls_cert if self-signed) [default: the system's CA certificates]. An error with
    /// http://.
    #[arg(long, global = true, value_name = "FILE", env = "GLIDEFS_CA")]
    pub ca: Option<PathBuf>,
    /// File holding the bearer token for --url.
    #[arg(long, global = true, value_name = "FILE", requires = "url")]
    pub token_file: Option<PathBuf>,
    /// Config file to take the socket path from.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the API's JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `glidefs volume ...`.
#[derive(Debug, Args)]
pub struct VolumeArgs {
    #[command(flatten)]
    pub target: ApiTarget,
    #[command(subcommand)]
    pub command: VolumeCommand,
}

/// Volume subcommands.
#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create a volume (and its block device).
    Create {
        /// Volume name: 1..=128 characters of [A-Za-z0-9._-].
        name: String,
        /// Size with K/M/G/T suffix (e.g. 10G); optional with --attach-existing.
        #[arg(long)]
        size: Option<ByteSize>,
        /// Block size, a power of two in 4K..=16M [default: the daemon's, 128K].
        #[arg(long)]
        block_size: Option<ByteSize>,
        /// ublk queues [default: the daemon's, 1].
        #[arg(long)]
        queues: Option<u16>,
        /// Requests in flight per queue [default: the daemon's, 64].
        #[arg(long)]
        depth: Option<u16>,
        /// Object-store prefix the volume lives under.
        #[arg(long)]
        prefix: Option<String>,
        /// Export the device read-only.
        #[arg(long)]
        read_only: bool,
        /// Open the volume if it already exists in the object store.
        #[arg(long)]
        attach_existing: bool,
        /// With --attach-existing: take the volume over from the daemon that owns it (that
        /// daemon is fenced and can no longer flush it).
        #[arg(long, requires = "attach_existing")]
        takeover: bool,
        /// Create the volume as a writable clone of snapshot SNAP of volume VOL (copy on
        /// write: nothing is copied up front; size and block size are the snapshot's). With
        /// --read-only: attach the snapshot itself read-only (see `snapshot attach`).
        #[arg(long, value_name = "VOL@SNAP", conflicts_with = "attach_existing")]
        from: Option<String>,
        /// Encrypt the volume at rest (XChaCha20-Poly1305) with the key in this file: 64
        /// hexadecimal characters (32 bytes), e.g. from `openssl rand -hex 32`, in a regular
        /// file of mode 0600 or stricter. The daemon reads the file (the path is sent
        /// absolute), now and at every start; only the path is kept in its state. Needed again, with the same key, to attach the volume.
        #[arg(long, value_name = "PATH", conflicts_with = "encryption_key_env")]
        encryption_key_file: Option<PathBuf>,
        /// Encrypt the volume at rest with the key (64 hexadecimal characters) in this
        /// environment variable of the daemon (not of this command), a GLIDEFS_KEY_* variable
        /// set when the daemon starts (e.g. the unit's EnvironmentFile=); only the name is kept.
        #[arg(long, value_name = "NAME")]
        encryption_key_env: Option<String>,
        /// What the device's FLUSH waits for: `local` (this host's disk; the default) or
        /// `store` (the object store too: a lost host loses no acknowledged write; FLUSHes
        /// wait for an upload and a publish, shared by every FLUSH waiting).
        #[arg(long, value_name = "LEVEL", value_parser = ["local", "store"])]
        durability: Option<String>,
        /// QoS limits on the device's reads and writes (see `volume qos`).
        #[command(flatten)]
        qos: QosArgs,
    },
    /// List volumes.
    #[command(alias = "ls")]
    List,
    /// Show one volume.
    Show {
        /// Volume name.
        name: String,
    },
    /// Flush a volume to the object store and wait until it is there.
    Flush {
        /// Volume name.
        name: String,
    },
    /// Compact a volume now: rewrite its mostly-dead packs, then collect garbage (the
    /// daemon's [space] and [gc] options).
    Compact {
        /// Volume name.
        name: String,
        /// Skip the GC pass.
        #[arg(long)]
        no_gc: bool,
    },
    /// Grow a volume while it is in use: its cache, its entry in the daemon's state and its
    /// block device (ublk UPDATE_SIZE, Linux 6.16+) take the new size; then grow the file
    /// system on it (e.g. `resize2fs /dev/ublkbN`). Volumes never shrink.
    Resize {
        /// Volume name.
        name: String,
        /// New size with K/M/G/T suffix (e.g. 20G): at least the current size, a multiple of
        /// the block size.
        size: ByteSize,
    },
    /// Show a volume's QoS limits, or replace them all while it serves: a limit not given is
    /// none. Each is a token bucket, RATE[:BURST]: requests per second (`*-iops`) or bytes
    /// per second (`*-bps`, with K/M/G/T suffixes); a request over a limit waits, it never
    /// fails. FLUSH, DISCARD and WRITE_ZEROES are not limited.
    Qos {
        /// Volume name.
        name: String,
        #[command(flatten)]
        limits: QosArgs,
        /// Remove every limit.
        #[arg(long, conflicts_with_all = ["read_iops", "write_iops", "iops", "read_bps", "write_bps", "bps"])]
        clear: bool,
    },
    /// A volume's warm set: the blocks it reads first (recorded once, e.g. over a boot),
    /// which every later attach of it, and of a clone made from one of its snapshots
    /// afterwards, fetches ahead of the guest (`volume_defaults.warm_budget`).
    Warmset {
        #[command(subcommand)]
        command: WarmsetCommand,
    },
    /// Remove a volume: flush it to the store, stop its device, delete its local cache.
    #[command(alias = "remove")]
    Rm {
        /// Volume name.
        name: String,
        /// Also delete the volume's data in the object store (irreversible).
        #[arg(long)]
        purge: bool,
        /// Do not flush first, and remove the device even while it is mounted or open:
        /// local data not yet in the store is lost. (Without it, a device in use is refused
        /// with `device_busy` and keeps serving.)
        #[arg(long)]
        force: bool,
    },
}

/// `glidefs snapshot ...`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub target: ApiTarget,
    #[command(subcommand)]
    pub command: SnapshotCommand,
}

/// Snapshot subcommands.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Snapshot a volume now: flushes it to the object store and freezes that generation
    /// (new writes wait only for the flush to start, not for the upload). The snapshot's
    /// data stays in the store until the snapshot is deleted.
    Create {
        /// Volume name.
        volume: String,
        /// Snapshot name: 1..=128 characters of [A-Za-z0-9._-].
        name: String,
    },
    /// List a volume's snapshots.
    #[command(alias = "ls")]
    List {
        /// Volume name.
        volume: String,
    },
    /// Show one snapshot (its generation, clones and read-only attachments).
    Show {
        /// Volume name.
        volume: String,
        /// Snapshot name.
        name: String,
    },
    /// Delete a snapshot; its data is released to the next GC pass. Refused while a clone
    /// uses it or a device is attached to it.
    #[command(alias = "rm")]
    Delete {
        /// Volume name.
        volume: String,
        /// Snapshot name.
        name: String,
    },
    /// Attach a snapshot read-only as a block device of its own (remove it with
    /// `volume rm NAME`).
    Attach {
        /// The snapshot: VOL@SNAP.
        #[arg(value_name = "VOL@SNAP")]
        snapshot: String,
        /// Name of the read-only device in the daemon.
        name: String,
        /// Object-store prefix the volume lives under.
        #[arg(long)]
        prefix: Option<String>,
        /// The key of an encrypted volume, in this file (64 hexadecimal characters, mode 0600
        /// or stricter; the path is sent absolute): the one the volume was created with.
        #[arg(long, value_name = "PATH", conflicts_with = "encryption_key_env")]
        encryption_key_file: Option<PathBuf>,
        /// The key of an encrypted volume, in this GLIDEFS_KEY_* environment variable of the
        /// daemon (not of this command).
        #[arg(long, value_name = "NAME")]
        encryption_key_env: Option<String>,
    },
}
