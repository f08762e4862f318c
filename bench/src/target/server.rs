//! The server under test as a child process: spawned from a command line,
//! fed broadcast lines on its standard input, measured through `/proc`,
//! and always stopped when its owner goes away.

use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::str::FromStr;
use std::thread;
use std::time::{Duration, Instant};
use wspush::sys::ParentDeath;

use crate::observe::cpu::wait_quiet;
use crate::observe::procfs::{self, Usage};
use crate::observe::sys;
use crate::target::{self, Target};
use crate::Error;

/// Command (or label) that stands for this program's own `floor` server;
/// as the first word of a command, the rest are `floor`'s options.
pub const FLOOR: &str = "floor";

/// Placeholder replaced by the port in a server command.
const PORT_PLACEHOLDER: &str = "{port}";

/// How long a server gets to exit after SIGTERM before it is SIGKILLed.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// A server to measure: a label for reports and the command that starts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// Name in reports.
    pub label: String,
    /// Command template (see [`command_line`]).
    pub command: String,
}

impl FromStr for ServerSpec {
    type Err = String;

    /// `NAME=COMMAND`, or just `floor` for the built-in floor server.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        match s.split_once('=') {
            Some((label, command)) if !label.is_empty() && !command.trim().is_empty() => {
                Ok(ServerSpec {
                    label: label.to_string(),
                    command: command.to_string(),
                })
            }
            None if s == FLOOR => Ok(ServerSpec {
                label: FLOOR.to_string(),
                command: FLOOR.to_string(),
            }),
            _ => Err(format!("expected NAME=COMMAND or `{FLOOR}`, got `{s}`")),
        }
    }
}

/// The shell command that starts `template` on `port`.
///
/// `floor [OPTIONS]` means this program's own floor server (`own_exe`);
/// otherwise each `{port}` is replaced by the port, or the port is
/// appended as the last argument when there is no `{port}` (so `run.sh`
/// takes it as `$1`).
pub fn command_line(template: &str, port: u16, own_exe: &Path) -> String {
    let template = template.trim();
    if let Some(options) = template.strip_prefix(FLOOR) {
        if options.is_empty() || options.starts_with(' ') {
            return format!(
                "{} floor --listen 127.0.0.1:{port}{options}",
                quote(own_exe)
            );
        }
    }
    if template.contains(PORT_PLACEHOLDER) {
        template.replace(PORT_PLACEHOLDER, &port.to_string())
    } else {
        format!("{template} {port}")
    }
}

/// The command that runs wspush itself for `conns` connections:
/// `--processes auto --total-connections CONNS`, so wspush starts one
/// instance per CPU, or as many as the connections need within each
/// instance's open-file limit. The binary is the `wspush` next to this
/// program (cargo builds both into `target/release`), else
/// `target/release/wspush` under the current directory. `extra` options
/// are added.
pub fn default_wspush(own_exe: &Path, extra: &str, conns: usize) -> String {
    format!(
        "{} --processes auto --total-connections {conns}{extra} --listen 127.0.0.1:{PORT_PLACEHOLDER}",
        wspush_exe(own_exe)
    )
}

/// The `wspush` binary next to this program, else `target/release/wspush`
/// under the current directory; quoted for `sh`.
pub fn wspush_exe(own_exe: &Path) -> String {
    let beside = own_exe.with_file_name("wspush");
    let exe = if beside.is_file() {
        beside
    } else {
        PathBuf::from("target/release/wspush")
    };
    quote(&exe)
}

/// `path` quoted for `sh`.
fn quote(path: &Path) -> String {
    format!("'{}'", path.to_string_lossy().replace('\'', r"'\''"))
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// A running server; stopped (with its whole process group) on drop.
#[derive(Debug)]
pub struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Server {
    /// Runs `command` as `/bin/sh -c "exec COMMAND"` (so it must be one
    /// simple command, which then replaces the shell) in a process group of
    /// its own, with its standard input a pipe and its standard output sent
    /// to our standard error (so that `--json` output stays clean).
    pub fn spawn(command: &str) -> io::Result<Server> {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(format!("exec {command}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::from(io::stderr().as_fd().try_clone_to_owned()?))
            .stderr(Stdio::inherit())
            .process_group(0);
        wspush::sys::die_with_parent(&mut cmd, ParentDeath::Kill);
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take();
        Ok(Server { child, stdin })
    }

    /// Process id of the spawned process (the root of the measured tree).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until something listens on `port`, checking `interrupted`
    /// and that the server is still running.
    pub fn wait_listening(&mut self, port: u16, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            if procfs::listeners(port)? > 0 {
                return Ok(());
            }
            if sys::interrupted() {
                return Err(io::ErrorKind::Interrupted.into());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("server did not listen on port {port} within {timeout:?}"),
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server: SIGINT to its process group (wspush closes at
    /// once, without a drain; the peers exit), SIGKILL after a grace period.
    pub fn stop(&mut self) {
        self.stdin = None;
        let pgid = self.child.id();
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = sys::signal_group(pgid, libc::SIGINT);
            let deadline = Instant::now() + STOP_GRACE;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
        }
        // Also reaches helpers the server left behind in its group; ESRCH
        // (nothing left) is the normal outcome.
        let _ = sys::signal_group(pgid, libc::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Target for Server {
    /// Writes the line and a newline to the server's standard input.
    fn send_line(&mut self, line: &[u8]) -> io::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| io::Error::other("server stdin closed"))?;
        target::write_line(stdin, line)
    }

    /// Writes the lines to the server's standard input at once.
    fn send_lines(&mut self, lines: &[u8]) -> io::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| io::Error::other("server stdin closed"))?;
        io::Write::write_all(stdin, lines)
    }

    /// Memory and CPU time of the server's process tree.
    fn usage(&self) -> io::Result<Usage> {
        procfs::tree_usage(self.pid())
    }

    fn check_alive(&mut self) -> io::Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => Err(io::Error::other(format!("server exited: {status}"))),
        }
    }

    /// `signal` (`HUP` or `USR2`) to the server: a supervisor rolls its
    /// instances, or upgrades them to the binary on disk.
    fn roll(&mut self, signal: &str) -> io::Result<u32> {
        let pid = self.pid();
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()?;
        match sent.success() {
            true => Ok(pid),
            false => Err(io::Error::other(format!("kill -{signal} {pid} failed"))),
        }
    }

    /// Kills the supervisor's first child.
    fn kill_an_instance(&mut self) -> io::Result<u32> {
        let pid = self.pid();
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
        let child: u32 = children
            .split_whitespace()
            .next()
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| {
                io::Error::other("the server has no instances (run it with --processes)")
            })?;
        let killed = std::process::Command::new("kill")
            .args(["-9", &child.to_string()])
            .status()?;
        match killed.success() {
            true => Ok(child),
            false => Err(io::Error::other(format!("kill -9 {child} failed"))),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits for a quiet machine (if `wait_quiet_secs` > 0), then spawns
/// `spec` on `port` (or a free one) and waits until it listens; returns
/// the server, its command line and its port.
pub fn start_server(
    spec: &ServerSpec,
    port: Option<u16>,
    wait_quiet_secs: u64,
    start_timeout_secs: u64,
) -> Result<(Server, String, u16), Error> {
    if wait_quiet_secs > 0 {
        wait_quiet(Duration::from_secs(wait_quiet_secs))?;
    }
    let exe = std::env::current_exe()?;
    let port = match port {
        Some(port) => port,
        None => free_port()?,
    };
    let command = command_line(&spec.command, port, &exe);
    eprintln!("[{}] starting: {command}", spec.label);
    let mut server = Server::spawn(&command)?;
    server.wait_listening(port, Duration::from_secs(start_timeout_secs))?;
    Ok((server, command, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let spec: ServerSpec = "wspush=/x/wspush --listen 127.0.0.1:{port}"
            .parse()
            .unwrap();
        assert_eq!(spec.label, "wspush");
        assert_eq!(spec.command, "/x/wspush --listen 127.0.0.1:{port}");
        assert_eq!("floor".parse::<ServerSpec>().unwrap().command, FLOOR);
        assert_eq!(" floor ".parse::<ServerSpec>().unwrap().label, FLOOR);
        assert!("wspush".parse::<ServerSpec>().is_err());
        assert!("=cmd".parse::<ServerSpec>().is_err());
        assert!("a= ".parse::<ServerSpec>().is_err());
    }

    #[test]
    fn port_substitution() {
        let exe = Path::new("/t/wspush-bench");
        assert_eq!(
            command_line("srv --listen 127.0.0.1:{port}", 4000, exe),
            "srv --listen 127.0.0.1:4000"
        );
        assert_eq!(
            command_line("/tmp/node-ws/run.sh", 4000, exe),
            "/tmp/node-ws/run.sh 4000"
        );
        assert_eq!(
            command_line(" floor ", 4000, exe),
            "'/t/wspush-bench' floor --listen 127.0.0.1:4000"
        );
        assert_eq!(
            command_line("floor --processes 4", 4000, exe),
            "'/t/wspush-bench' floor --listen 127.0.0.1:4000 --processes 4"
        );
        assert_eq!(command_line("floorish {port}", 4000, exe), "floorish 4000");
        let wspush = default_wspush(Path::new("/nowhere/wspush-bench"), " --echo", 1000);
        assert_eq!(
            command_line(&wspush, 4000, exe),
            "'target/release/wspush' --processes auto --total-connections 1000 --echo \
             --listen 127.0.0.1:4000"
        );
    }

    #[test]
    fn spawn_feed_and_stop() {
        let mut server = Server::spawn("cat >/dev/null").unwrap();
        server.send_line(b"hello").unwrap();
        server.check_alive().unwrap();
        assert!(server.usage().unwrap().rss_bytes > 0);
        server.stop();
        assert!(server.check_alive().is_err());
    }
}
