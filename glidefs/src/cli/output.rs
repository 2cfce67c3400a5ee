//! What the commands write on stdout and stderr. Like the usual Unix tools, a reader that went
//! away (stdout a closed pipe: `glidefs volume list | head -0`, EPIPE) ends the output quietly
//! and the command keeps its own exit status; `println!` would panic (exit 101). Any other
//! write error (a full disk under a redirect) is the command's error.

use std::io::Write;

/// Writes `text` to stdout (locked, then flushed); a closed pipe drops it silently.
pub fn stdout(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// Writes `line` and a newline to stderr; a failure is dropped (there is nowhere left to say
/// it).
pub fn stderr_line(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
