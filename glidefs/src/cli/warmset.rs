//! `glidefs volume warmset ...`: record, show and drop a volume's warm set, the blocks it
//! reads first, which every later attach of the volume (and of a clone made from one of its
//! snapshots afterwards) fetches ahead of the guest.

use clap::Subcommand;
use glidefs_client::{Client, ClientError};
use glidefs_model::api::{RecordWarmSet, WarmSetInfo};
use glidefs_model::size::format_size;

use crate::cli::commands::json;

/// `glidefs volume warmset` subcommands.
#[derive(Debug, Subcommand)]
pub enum WarmsetCommand {
    /// Show the stored warm set, a recording in progress, and what the last recording and
    /// the last warm (at attach) did.
    Show {
        /// Volume name.
        name: String,
    },
    /// Record, from now, the blocks the volume reads (each once, in first-read order) for
    /// --seconds or until --max-blocks; then store them as its warm set, replacing any.
    /// Start it right after attaching, before the workload to capture (a boot, a mount,
    /// opening the files a program starts from).
    Record {
        /// Volume name.
        name: String,
        /// How long to record (1..=3600).
        #[arg(long, default_value_t = RecordWarmSet::DEFAULT_SECONDS)]
        seconds: u64,
        /// The most blocks to record (1..=524288).
        #[arg(long, default_value_t = RecordWarmSet::DEFAULT_MAX_BLOCKS)]
        max_blocks: u64,
    },
    /// Drop the warm set: a recording in progress ends storing nothing, the stored set is
    /// deleted (clones made before keep their copy).
    Drop {
        /// Volume name.
        name: String,
    },
}

/// Runs `cmd`: the text (or JSON) to print.
pub async fn run(
    client: &Client,
    cmd: &WarmsetCommand,
    as_json: bool,
) -> Result<String, ClientError> {
    let (name, info, verb) = match cmd {
        WarmsetCommand::Show { name } => (name, client.warm_set(name).await?, None),
        WarmsetCommand::Record {
            name,
            seconds,
            max_blocks,
        } => {
            let req = RecordWarmSet {
                seconds: *seconds,
                max_blocks: *max_blocks,
            };
            let info = client.record_warm_set(name, &req).await?;
            (name, info, Some(format!("recording the warm set of {name} for {seconds} s (at most {max_blocks} blocks)")))
        }
        WarmsetCommand::Drop { name } => (
            name,
            client.drop_warm_set(name).await?,
            Some(format!("dropped the warm set of {name}")),
        ),
    };
    if as_json {
        return Ok(json(&info));
    }
    let mut s = verb.map(|v| format!("{v}\n")).unwrap_or_default();
    s.push_str(&text(name, &info));
    Ok(s)
}

/// The warm-set state, a line each.
pub fn text(name: &str, w: &WarmSetInfo) -> String {
    let mut s = match &w.stored {
        Some(set) => format!(
            "warm set of {name}: {} blocks of {} ({}), recorded over {} s (at {} Unix time)\n",
            set.blocks,
            format_size(u64::from(set.block_size)),
            format_size(set.blocks * u64::from(set.block_size)),
            set.window_secs,
            set.recorded_unix
        ),
        None => format!("warm set of {name}: none stored\n"),
    };
    if let Some(r) = &w.recording {
        s.push_str(&format!(
            "recording: {} blocks so far (at most {}), {} s in, {} s left\n",
            r.blocks, r.max_blocks, r.elapsed_secs, r.remaining_secs
        ));
    }
    if let Some(r) = &w.last_recording {
        match &r.error {
            Some(e) => s.push_str(&format!("last recording: FAILED: {e}\n")),
            None => s.push_str(&format!("last recording: {} blocks stored\n", r.blocks)),
        }
    }
    if w.warming {
        s.push_str("warming now\n");
    }
    if let Some(r) = &w.last_warm {
        s.push_str(&format!(
            "last warm: {} of {} blocks fetched ({} in {} GETs, {} ms); {} already here, {} over the budget, {} failed{}\n",
            r.fetched_blocks,
            r.set_blocks,
            format_size(r.fetched_bytes),
            r.gets,
            r.took_ms,
            r.skipped,
            r.over_budget,
            r.failed,
            r.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use glidefs_model::api::{StoredWarmSet, WarmRecording, WarmReportInfo};

    #[test]
    fn the_text_says_what_is_stored_recording_and_warmed() {
        let none = text("v", &WarmSetInfo::default());
        assert_eq!(none, "warm set of v: none stored\n");
        let w = WarmSetInfo {
            stored: Some(StoredWarmSet {
                blocks: 10,
                block_size: 131072,
                recorded_unix: 1_700_000_000,
                window_secs: 30,
            }),
            recording: Some(WarmRecording {
                blocks: 3,
                max_blocks: 100,
                elapsed_secs: 2,
                remaining_secs: 8,
            }),
            last_recording: None,
            warming: false,
            last_warm: Some(WarmReportInfo {
                set_blocks: 10,
                skipped: 2,
                fetched_blocks: 8,
                fetched_bytes: 1 << 20,
                gets: 1,
                took_ms: 25,
                ..WarmReportInfo::default()
            }),
        };
        let t = text("v", &w);
        assert!(t.contains("10 blocks of 128K (1280K)"), "{t}");
        assert!(t.contains("recording: 3 blocks so far"), "{t}");
        assert!(
            t.contains("last warm: 8 of 10 blocks fetched (1M in 1 GETs, 25 ms); 2 already here"),
            "{t}"
        );
    }
}
