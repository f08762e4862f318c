//! The binary on disk, as an upgrade runs it: opened (so that what was
//! checked is what runs, whatever is renamed over it later) and asked its
//! `--version`, whose line also names the state format it reads.

use std::fmt;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// This build's version, as `--version` prints it after the name: with
/// the state format its handovers and re-execs write and read.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (state format 1)");

/// The end of the `--version` line of a build that reads this one's state.
pub fn state_format_words() -> String {
    format!("(state format {})", wspush::STATE_FORMAT)
}

/// The outcome of checking a new binary (run on a thread of its own):
/// its file and its `--version` line, or why it is refused.
pub type Checked = Result<(std::fs::File, String), String>;

/// How long a new binary has to answer `--version` before an upgrade is
/// refused.
pub const VERSION_TIMEOUT: Duration = Duration::from_secs(5);

/// How a process ended, in words.
pub struct Ended(pub ExitStatus);

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0.code(), self.0.signal()) {
            (Some(code), _) => write!(f, "exited with status {code}"),
            (_, Some(signal)) => write!(f, "was killed by signal {signal}"),
            _ => write!(f, "ended ({})", self.0),
        }
    }
}

/// Opens the binary at `path` and runs it (through this process's
/// descriptor of it, so what runs later is what was checked) with
/// `--version`: its file and the version line, or why it is refused.
pub fn check_binary(path: &Path) -> Checked {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot be opened ({e})"))?;
    let pinned = format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd());
    let mut child = Command::new(&pinned)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("does not run ({e})"))?;
    let deadline = Instant::now() + VERSION_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "did not answer --version within {VERSION_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    let version = out.lines().next().unwrap_or("").trim().to_string();
    if !status.success() || !version.starts_with("wspush ") {
        return Err(format!(
            "does not answer --version as wspush does (it {}, and printed {version:?})",
            Ended(status)
        ));
    }
    Ok((file, version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_names_the_librarys_state_format() {
        assert!(VERSION.ends_with(&state_format_words()), "{VERSION}");
    }
}
