//! The `glidefs snapshot ...` commands: call the API, print text or JSON.

use hyper::Method;

use crate::cli::args::{ApiTarget, SnapshotCommand};
use crate::cli::commands::{absolute_key_file, endpoint, json, volume_text, CommandError};
use glidefs_client::Client;
use glidefs_daemon::environment::Environment;
use glidefs_model::api::{CreateVolume, SnapshotDoc};
use glidefs_model::size::format_size;

/// Multi-line text of one snapshot.
fn snapshot_text(s: &SnapshotDoc) -> String {
    let list = |v: &[String]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(", ")
        }
    };
    format!(
        "snapshot:    {}@{}\ngeneration:  {}\ncreated:     {} (unix)\nsize:        {}\nblock size:  {}\nclones:      {}\nattached:    {}\ndeleting:    {}\n",
        s.volume,
        s.name,
        s.generation,
        s.created_unix,
        format_size(s.size),
        format_size(u64::from(s.block_size)),
        list(&s.clones),
        list(&s.attached),
        s.deleting
    )
}

fn table(snaps: &[SnapshotDoc]) -> String {
    let mut s = format!(
        "{:<24} {:>10} {:>12} {:>8} {:<20}\n",
        "NAME", "GENERATION", "CREATED", "SIZE", "CLONES"
    );
    for x in snaps {
        s.push_str(&format!(
            "{:<24} {:>10} {:>12} {:>8} {:<20}\n",
            x.name,
            x.generation,
            x.created_unix,
            format_size(x.size),
            if x.clones.is_empty() {
                "-".to_string()
            } else {
                x.clones.join(",")
            }
        ));
    }
    s
}

/// Runs one snapshot command and returns what to print on stdout.
pub async fn run_snapshot(
    target: &ApiTarget,
    env: &Environment,
    cmd: &SnapshotCommand,
) -> Result<String, CommandError> {
    let client = Client::new(endpoint(target, env)?);
    let one = |s: SnapshotDoc, verb: &str| {
        if target.json {
            json(&s)
        } else {
            format!(
                "{verb} snapshot {}@{}\n{}",
                s.volume,
                s.name,
                snapshot_text(&s)
            )
        }
    };
    Ok(match cmd {
        SnapshotCommand::Create { volume, name } => {
            one(client.snapshot_create(volume, name).await?, "created")
        }
        SnapshotCommand::List { volume } => {
            let l = client.snapshot_list(volume).await?;
            if target.json {
                json(&l)
            } else {
                table(&l.snapshots)
            }
        }
        SnapshotCommand::Show { volume, name } => {
            let s = client.snapshot_one(Method::GET, volume, name).await?;
            if target.json {
                json(&s)
            } else {
                snapshot_text(&s)
            }
        }
        SnapshotCommand::Delete { volume, name } => one(
            client.snapshot_one(Method::DELETE, volume, name).await?,
            "deleted",
        ),
        SnapshotCommand::Attach {
            snapshot,
            name,
            prefix,
            encryption_key_file,
            encryption_key_env,
        } => {
            let v = client
                .create(&CreateVolume {
                    name: name.clone(),
                    prefix: prefix.clone(),
                    read_only: true,
                    from: Some(snapshot.clone()),
                    encryption_key_file: absolute_key_file(encryption_key_file.as_deref())?,
                    encryption_key_env: encryption_key_env.clone(),
                    ..CreateVolume::default()
                })
                .await?;
            if target.json {
                json(&v)
            } else {
                format!(
                    "attached snapshot {snapshot} read-only as {}\n{}",
                    v.name,
                    volume_text(&v)
                )
            }
        }
    })
}
