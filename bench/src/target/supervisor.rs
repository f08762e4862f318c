//! `floor --processes N`: N floor instances behind one port, mirroring the
//! wspush supervisor, so that the reference scales to a million
//! connections like the server it is compared with.
//!
//! Every instance is a child process (`floor --reuse-port`, so the kernel
//! spreads incoming connections over their listeners); each line of the
//! supervisor's standard input is written to every instance's standard
//! input. The instances die with the supervisor (`PR_SET_PDEATHSIG`), and
//! the supervisor exits, stopping the others, when one of them exits.

use std::io::{self, BufRead, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::str::FromStr;
use std::thread;
use std::time::Duration;
use wspush::sys::ParentDeath;

/// How many instances to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Processes {
    /// One per CPU, like `wspush --processes auto`.
    Auto,
    /// This many.
    Count(usize),
}

impl FromStr for Processes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Processes::Auto),
            n => match n.parse() {
                Ok(0) | Err(_) => Err(format!("expected `auto` or a positive count, got `{s}`")),
                Ok(n) => Ok(Processes::Count(n)),
            },
        }
    }
}

impl Processes {
    /// The number of instances.
    pub fn count(self) -> usize {
        match self {
            Processes::Count(n) => n,
            Processes::Auto => thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// Runs `count` instances of `exe floor --reuse-port EXTRA_ARGS` on
/// `listen` and feeds them standard input; returns when one of them exits
/// (an error).
pub fn run(exe: &Path, listen: SocketAddr, count: usize, extra_args: &[String]) -> io::Result<()> {
    let mut children: Vec<Child> = Vec::with_capacity(count);
    let mut inputs: Vec<ChildStdin> = Vec::with_capacity(count);
    for _ in 0..count {
        let mut cmd = Command::new(exe);
        cmd.args(["floor", "--reuse-port", "--listen", &listen.to_string()])
            .args(extra_args)
            .stdin(Stdio::piped());
        wspush::sys::die_with_parent(&mut cmd, ParentDeath::Kill);
        let mut child = cmd.spawn()?;
        inputs.push(child.stdin.take().expect("piped"));
        children.push(child);
    }
    eprintln!("floor supervisor: {count} instances on {listen}");
    thread::Builder::new()
        .name("fan-in".into())
        .spawn(move || fan_out_lines(io::stdin().lock(), inputs))?;
    loop {
        for child in &mut children {
            if let Some(status) = child.try_wait()? {
                for other in &mut children {
                    let _ = other.kill();
                    let _ = other.wait();
                }
                return Err(io::Error::other(format!("an instance exited: {status}")));
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Writes every line of `input` (with its newline) to every one of
/// `outputs`, each with one `write()`; stops at the end of the input.
fn fan_out_lines(mut input: impl BufRead, mut outputs: Vec<impl Write>) {
    let mut line = Vec::new();
    loop {
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        // An instance that is gone is noticed by the supervisor's loop.
        outputs.retain_mut(|out| out.write_all(&line).is_ok());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_counts() {
        assert_eq!("auto".parse(), Ok(Processes::Auto));
        assert_eq!("3".parse(), Ok(Processes::Count(3)));
        assert!("0".parse::<Processes>().is_err());
        assert!("many".parse::<Processes>().is_err());
        assert_eq!(Processes::Count(3).count(), 3);
        assert!(Processes::Auto.count() >= 1);
    }

    #[test]
    fn every_line_reaches_every_output() {
        let input = io::Cursor::new(b"one\ntwo\r\nlast".to_vec());
        let mut outputs = vec![Vec::new(), Vec::new()];
        fan_out_lines(input, outputs.iter_mut().collect());
        for out in outputs {
            assert_eq!(out, b"one\ntwo\r\nlast\n");
        }
    }
}
