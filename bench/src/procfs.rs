//! Reading `/proc`: resident memory and CPU time of a process tree, and
//! whether anything listens on a TCP port.

use std::collections::HashMap;
use std::fs;
use std::io;

use crate::sys;

/// Resources used by a process tree at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Sum of `VmRSS` (resident set size) over the tree, in bytes.
    pub rss_bytes: u64,
    /// User plus system CPU time consumed so far by the live processes.
    pub cpu_ns: u64,
}

/// The fields of `/proc/PID/stat` this module uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    ppid: u32,
    /// User plus system time, in clock ticks.
    cpu_ticks: u64,
}

/// Usage of process `root` and all its descendants (a server started through
/// a shell script may be a child of the process that was spawned).
pub fn tree_usage(root: u32) -> io::Result<Usage> {
    let mut stats = HashMap::new();
    for entry in fs::read_dir("/proc")? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // Processes may exit while the directory is read: skip those.
        if let Some(stat) = fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| parse_stat(&s))
        {
            stats.insert(pid, stat);
        }
    }
    if !stats.contains_key(&root) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no process {root}"),
        ));
    }
    let ticks_ns = 1_000_000_000 / sys::clock_ticks_per_second();
    let mut usage = Usage::default();
    for pid in tree(root, &stats) {
        if let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) {
            usage.rss_bytes += parse_vm_rss(&status).unwrap_or(0);
        }
        usage.cpu_ns += stats[&pid].cpu_ticks * ticks_ns;
    }
    Ok(usage)
}

/// CPU time (user plus system, all threads) of the calling process.
pub fn own_cpu_ns() -> io::Result<u64> {
    let stat = fs::read_to_string("/proc/self/stat")?;
    let stat = parse_stat(&stat)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc/self/stat"))?;
    Ok(stat.cpu_ticks * (1_000_000_000 / sys::clock_ticks_per_second()))
}

/// Busy CPU time of the whole machine so far, summed over all CPUs: every
/// state of the `cpu` line of `/proc/stat` except idle and iowait.
pub fn machine_busy_ns() -> io::Result<u64> {
    let stat = fs::read_to_string("/proc/stat")?;
    let ticks = parse_machine_busy(&stat)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc/stat"))?;
    Ok(ticks * (1_000_000_000 / sys::clock_ticks_per_second()))
}

/// Whether a socket is in the LISTEN state on `port` (any address, v4 or v6).
pub fn is_listening(port: u16) -> io::Result<bool> {
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        match fs::read_to_string(table) {
            Ok(text) if has_listener(&text, port) => return Ok(true),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {} // no IPv6
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// `root` followed by all its descendants in `stats`.
fn tree(root: u32, stats: &HashMap<u32, Stat>) -> Vec<u32> {
    let mut members = vec![root];
    let mut i = 0;
    while i < members.len() {
        let parent = members[i];
        members.extend(
            stats
                .iter()
                .filter(|(_, s)| s.ppid == parent)
                .map(|(&pid, _)| pid),
        );
        i += 1;
    }
    members
}

/// Parses `/proc/PID/stat`; the command name may contain spaces and
/// parentheses, so fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) ... utime(14) stime(15), 1-based.
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Stat {
        ppid,
        cpu_ticks: utime + stime,
    })
}

/// Busy ticks from the aggregate `cpu` line of `/proc/stat`: user, nice,
/// system, irq, softirq and steal (guest time is already part of user).
fn parse_machine_busy(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal ...
    let &[user, nice, system, _idle, _iowait, irq, softirq, steal, ..] = ticks.as_slice() else {
        return None;
    };
    Some(user + nice + system + irq + softirq + steal)
}

/// `VmRSS` from `/proc/PID/status`, in bytes (absent for kernel threads and zombies).
fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut parts = line["VmRSS:".len()..].split_whitespace();
    let kib: u64 = parts.next()?.parse().ok()?;
    (parts.next()? == "kB").then_some(kib * 1024)
}

/// Whether a `/proc/net/tcp`-format table has a LISTEN (state `0A`) socket on `port`.
fn has_listener(table: &str, port: u16) -> bool {
    table.lines().skip(1).any(|line| {
        let mut fields = line.split_whitespace();
        let local = fields.nth(1);
        let state = fields.nth(1);
        let local_port = local
            .and_then(|l| l.rsplit(':').next())
            .and_then(|p| u16::from_str_radix(p, 16).ok());
        state == Some("0A") && local_port == Some(port)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_awkward_name() {
        let text = "4242 (my (weird) srv) S 17 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 36 0 0 20 0 3 0 123 456 789";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                ppid: 17,
                cpu_ticks: 286
            })
        );
        assert_eq!(parse_stat("12 (x) S"), None);
    }

    #[test]
    fn vm_rss_in_bytes() {
        let status = "Name:\tnode\nVmPeak:\t  999 kB\nVmRSS:\t   51234 kB\nThreads:\t7\n";
        assert_eq!(parse_vm_rss(status), Some(51234 * 1024));
        assert_eq!(parse_vm_rss("Name:\tkthreadd\n"), None);
    }

    #[test]
    fn machine_busy_skips_idle_and_iowait() {
        let stat = "cpu  100 2 30 5000 7 1 4 6 0 0\ncpu0 50 1 15 2500 3 0 2 3 0 0\n";
        assert_eq!(parse_machine_busy(stat), Some(143));
        assert_eq!(parse_machine_busy("cpu  1 2 3\n"), None);
    }

    #[test]
    fn listening_sockets() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
             0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0\n   \
             1: 0100007F:1F91 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0\n";
        assert!(has_listener(table, 8080));
        assert!(!has_listener(table, 8081), "established, not listening");
        assert!(!has_listener(table, 80));
        let v6 = "sl local rem st\n 0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 0\n";
        assert!(has_listener(v6, 8080));
    }

    #[test]
    fn tree_follows_parents() {
        let stat = |ppid| Stat { ppid, cpu_ticks: 0 };
        let stats = HashMap::from([
            (1, stat(0)),
            (10, stat(1)),
            (11, stat(10)),
            (12, stat(10)),
            (20, stat(1)),
        ]);
        let mut members = tree(10, &stats);
        members.sort_unstable();
        assert_eq!(members, vec![10, 11, 12]);
    }

    #[test]
    fn own_process_is_measurable() {
        let usage = tree_usage(std::process::id()).unwrap();
        assert!(usage.rss_bytes > 0);
        own_cpu_ns().unwrap();
    }
}
