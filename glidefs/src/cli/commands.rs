//! The `glidefs volume ...` commands: resolve the API endpoint, call it, print text or JSON.

use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;

use crate::cli::args::{ApiTarget, VolumeCommand};
use crate::cli::qos::qos_text;
use crate::cli::warmset;
use glidefs_client::endpoint::{endpoint_from_url, UrlError};
use glidefs_client::{Client, ClientError, Endpoint};
use glidefs_daemon::config::{Config, ConfigError};
use glidefs_daemon::environment::Environment;
use glidefs_model::api::{CreateVolume, VolumeInfo};
use glidefs_model::size::format_size;

/// Errors of the client commands.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Url(#[from] UrlError),
    #[error("cannot read --token-file `{path}`: {source}")]
    Token {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("cannot make --encryption-key-file `{path}` absolute: {source}")]
    KeyFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The endpoint `target` names (else the socket of the config `env` points at).
pub fn endpoint(target: &ApiTarget, env: &Environment) -> Result<Endpoint, CommandError> {
    if let Some(url) = &target.url {
        let token = match &target.token_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|source| CommandError::Token {
                        path: p.clone(),
                        source,
                    })?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        return Ok(endpoint_from_url(url, token, target.ca.as_deref())?);
    }
    if let Some(s) = &target.socket {
        return Ok(Endpoint::Unix(s.clone()));
    }
    Ok(Endpoint::Unix(
        Config::locate(target.config.as_deref(), env)?.api.socket,
    ))
}

/// A key file path as the daemon must get it: absolute (the daemon reads the file, from its
/// own working directory).
pub(crate) fn absolute_key_file(
    path: Option<&std::path::Path>,
) -> Result<Option<String>, CommandError> {
    path.map(|p| {
        std::path::absolute(p)
            .map(|a| a.display().to_string())
            .map_err(|source| CommandError::KeyFile {
                path: p.to_path_buf(),
                source,
            })
    })
    .transpose()
}

pub(crate) fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

fn opt(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("-")
}

/// Multi-line text of one volume.
pub fn volume_text(v: &VolumeInfo) -> String {
    let state = serde_json::to_value(v.state)
        .ok()
        .and_then(|s| s.as_str().map(str::to_string))
        .unwrap_or_default();
    let mut s = format!(
        "name:                {}\nstate:               {state}\nsize:                {}\nblock size:          {}\nqueues x depth:      {} x {}\nread-only:           {}\nprefix:              {}\ndevice:              {}\ntransport:           {}\ndirty:               {}\nsyncing:             {}\ncached:              {}\nmanifest generation: {}\nflush lag:           {:.1}s\nflushes:             {} ({} bytes, {} errors)\ncold reads:          {}\ncache dir:           {}\n",
        v.name,
        format_size(v.size),
        format_size(u64::from(v.block_size)),
        v.queues,
        v.queue_depth,
        v.read_only,
        opt(&v.prefix),
        opt(&v.device.path),
        opt(&v.device.transport),
        format_size(v.dirty_bytes),
        format_size(v.syncing_bytes),
        format_size(v.cache_bytes),
        v.manifest_generation,
        v.flush.lag_secs,
        v.flush.count,
        v.flush.bytes,
        v.flush.errors,
        v.cold_reads,
        v.cache_dir,
    );
    if v.durability == glidefs_model::api::Durability::Store {
        s.push_str(&format!(
            "durability:          store ({} FLUSHes served by {} flushes to the store)\n",
            v.flush.store_flushes, v.flush.store_syncs
        ));
    }
    if let Some(qos) = &v.qos {
        s.push_str(&qos_text(qos));
    }
    if let Some(t) = &v.throttled {
        if t.requests > 0 {
            s.push_str(&format!(
                "throttled:           {} requests, {:.1}s waited\n",
                t.requests, t.seconds
            ));
        }
    }
    if let Some(snap) = &v.snapshot {
        s.push_str(&format!("snapshot:            {snap} (read-only)\n"));
    }
    if let Some(e) = &v.error {
        s.push_str(&format!("error:               {e}\n"));
    }
    if let Some(e) = &v.flush.last_error {
        s.push_str(&format!("last flush error:    {e}\n"));
    }
    s
}

/// The volume table; a volume that is not `running` gets its `error` (why it is failed,
/// fenced or recovering) on the line below it.
fn list_text(vols: &[VolumeInfo]) -> String {
    let mut s = format!(
        "{:<24} {:<10} {:>8} {:<14} {:<10} {:>8} {:>6}\n",
        "NAME", "STATE", "SIZE", "DEVICE", "TRANSPORT", "DIRTY", "GEN"
    );
    for v in vols {
        let state = serde_json::to_value(v.state)
            .ok()
            .and_then(|s| s.as_str().map(str::to_string))
            .unwrap_or_default();
        s.push_str(&format!(
            "{:<24} {:<10} {:>8} {:<14} {:<10} {:>8} {:>6}\n",
            v.name,
            state,
            format_size(v.size),
            opt(&v.device.path),
            opt(&v.device.transport),
            format_size(v.dirty_bytes),
            v.manifest_generation
        ));
        if let Some(e) = &v.error {
            s.push_str(&format!("  error: {e}\n"));
        }
    }
    s
}

/// Runs one volume command and returns what to print on stdout.
pub async fn run_volume(
    target: &ApiTarget,
    env: &Environment,
    cmd: &VolumeCommand,
) -> Result<String, CommandError> {
    let client = Client::new(endpoint(target, env)?);
    let as_json = target.json;
    Ok(match cmd {
        VolumeCommand::Create {
            name,
            size,
            block_size,
            queues,
            depth,
            prefix,
            read_only,
            attach_existing,
            takeover,
            from,
            encryption_key_file,
            encryption_key_env,
            durability,
            qos,
        } => {
            let limits = qos.limits();
            let key_file = absolute_key_file(encryption_key_file.as_deref())?;
            let req = CreateVolume {
                name: name.clone(),
                size: size.map(|s| Value::from(s.0)),
                block_size: block_size.map(|s| Value::from(s.0)),
                queues: queues.map(Value::from),
                queue_depth: depth.map(Value::from),
                prefix: prefix.clone(),
                read_only: *read_only,
                attach_existing: *attach_existing,
                takeover: *takeover,
                from: from.clone(),
                encryption_key_file: key_file,
                encryption_key_env: encryption_key_env.clone(),
                durability: durability.clone(),
                qos: (!limits.is_empty()).then_some(limits),
            };
            let v = client.create(&req).await?;
            if as_json {
                json(&v)
            } else {
                format!("created volume {}\n{}", v.name, volume_text(&v))
            }
        }
        VolumeCommand::List => {
            let l = client.list().await?;
            if as_json {
                json(&l)
            } else {
                list_text(&l.volumes)
            }
        }
        VolumeCommand::Show { name } => {
            let v = client.show(name).await?;
            if as_json {
                json(&v)
            } else {
                volume_text(&v)
            }
        }
        VolumeCommand::Flush { name } => {
            let r = client.flush(name).await?;
            if as_json {
                json(&r)
            } else {
                format!(
                    "flushed {}: {} blocks in {} packs ({}), generation {}, {} ms\n",
                    r.name,
                    r.blocks,
                    r.packs,
                    format_size(r.bytes),
                    r.generation,
                    r.duration_ms
                )
            }
        }
        VolumeCommand::Compact { name, no_gc } => {
            let r = client.compact(name, !*no_gc).await?;
            if as_json {
                json(&r)
            } else {
                format!(
                    "compacted {}: {} of {} packs below the threshold rewritten ({} copied, {} blocks moved), gc deleted {} packs ({}); stored {}, live {}, {} ms\n",
                    r.name,
                    r.packs_rewritten,
                    r.packs_below_threshold,
                    format_size(r.bytes_copied),
                    r.blocks_moved,
                    r.gc_packs_deleted,
                    format_size(r.gc_bytes_deleted),
                    format_size(r.stored_bytes),
                    format_size(r.live_bytes),
                    r.duration_ms
                )
            }
        }
        VolumeCommand::Resize { name, size } => {
            let r = client.resize(name, size.0).await?;
            if as_json {
                json(&r)
            } else {
                format!(
                    "resized {}: {} -> {}{}\n",
                    r.name,
                    format_size(r.previous_size),
                    format_size(r.size),
                    r.device
                        .as_deref()
                        .map(|d| format!(" ({d} too; grow its file system now)"))
                        .unwrap_or_default()
                )
            }
        }
        VolumeCommand::Qos {
            name,
            limits,
            clear,
        } => {
            let wanted = limits.limits();
            let (l, verb) = if *clear || !wanted.is_empty() {
                (client.set_qos(name, &wanted).await?, "set")
            } else {
                (client.qos(name).await?, "of")
            };
            if as_json {
                json(&l)
            } else {
                format!("QoS limits {verb} {name}:\n{}", qos_text(&l))
            }
        }
        VolumeCommand::Warmset { command } => warmset::run(&client, command, as_json).await?,
        VolumeCommand::Rm { name, purge, force } => {
            let r = client.remove(name, *purge, *force).await?;
            if as_json {
                json(&r)
            } else if *purge {
                format!(
                    "removed {} and purged {} objects from the store\n",
                    r.name, r.purged_objects
                )
            } else {
                format!("removed {}\n", r.name)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use glidefs_model::api::{DeviceInfo, FlushInfo, VolumeState};

    fn info(name: &str, state: VolumeState, error: Option<&str>) -> VolumeInfo {
        VolumeInfo {
            name: name.to_string(),
            state,
            error: error.map(str::to_string),
            size: 1 << 30,
            block_size: 128 << 10,
            queues: 1,
            queue_depth: 64,
            read_only: false,
            prefix: None,
            cache_dir: "/c".to_string(),
            device: DeviceInfo::default(),
            dirty_bytes: 0,
            syncing_bytes: 0,
            cache_bytes: 0,
            remote_blocks: 0,
            manifest_generation: 0,
            fenced: false,
            cold_reads: 0,
            store_gets: 0,
            fetched_bytes: 0,
            flush: FlushInfo::default(),
            space: Default::default(),
            snapshot: None,
            encryption_key_id: None,
            durability: Default::default(),
            qos: None,
            throttled: None,
        }
    }

    #[test]
    fn list_shows_the_state_and_the_error_of_a_volume_that_is_not_running() {
        let text = list_text(&[
            info("up", VolumeState::Running, None),
            info(
                "back",
                VolumeState::Recovering,
                Some("recovering: 3 attempt(s) failed; last error: connection refused"),
            ),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(
            lines[1].starts_with("up ") && lines[1].contains("running"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("back ") && lines[2].contains("recovering"),
            "{text}"
        );
        assert!(
            lines[3].contains("error: recovering: 3 attempt(s)")
                && lines[3].contains("connection refused"),
            "{text}"
        );
    }

    #[test]
    fn volume_resize_takes_a_name_and_a_size() {
        use crate::cli::args::{Cli, Command};
        use clap::Parser;
        let cli =
            Cli::try_parse_from(["glidefs", "volume", "resize", "db", "20G", "--json"]).unwrap();
        let Command::Volume(v) = cli.command else {
            panic!("not a volume command");
        };
        assert!(v.target.json);
        match v.command {
            VolumeCommand::Resize { name, size } => {
                assert_eq!((name.as_str(), size.0), ("db", 20 << 30));
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            &["glidefs", "volume", "resize", "db"][..],
            &["glidefs", "volume", "resize", "db", "12Q"][..],
            &["glidefs", "volume", "resize"][..],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }
}
