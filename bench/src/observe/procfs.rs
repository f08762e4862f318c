//! Reading `/proc`: memory (RSS and PSS) and CPU time of a process tree or
//! of a set of processes, machine CPU time, and TCP listeners on a port.

use std::collections::HashMap;
use std::fs;
use std::io;

use crate::observe::sys;

/// Resources used by a set of processes at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Sum of `VmRSS` (resident set size), in bytes. Pages shared between
    /// the processes (their common program text) are counted once per process.
    pub rss_bytes: u64,
    /// Sum of `Pss` (proportional set size, from `smaps_rollup`), in bytes:
    /// each shared page is split among the processes that map it, so the
    /// sum is what the processes use together.
    pub pss_bytes: u64,
    /// User plus system CPU time consumed so far by the live processes.
    pub cpu_ns: u64,
    /// The user part of `cpu_ns` (the processes' own code, not the kernel's).
    pub user_ns: u64,
    /// Processes measured.
    pub processes: u32,
}

/// The fields of `/proc/PID/stat` this module uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// State `Z`: exited, not yet reaped.
    zombie: bool,
    ppid: u32,
    /// User plus system time, in clock ticks.
    cpu_ticks: u64,
    /// User time alone, in clock ticks.
    user_ticks: u64,
    /// A `ksoftirqd/N` kernel thread.
    softirq_thread: bool,
}

/// Usage of process `root` and all its descendants (a server started through
/// a shell script may be a child of the process that was spawned; a
/// supervisor's instances are its children).
pub fn tree_usage(root: u32) -> io::Result<Usage> {
    let stats = all_stats()?;
    if !stats.contains_key(&root) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no process {root}"),
        ));
    }
    Ok(usage_of(&tree(root, &stats), &stats))
}

/// Usage of the processes `pids` that still exist.
pub fn processes_usage(pids: &[u32]) -> io::Result<Usage> {
    let stats = all_stats()?;
    let live: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|p| stats.contains_key(p))
        .collect();
    Ok(usage_of(&live, &stats))
}

/// Whether process `pid` exists (and is not a zombie).
pub fn is_alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| parse_stat(&s))
        .is_some_and(|s| !s.zombie)
}

/// `/proc/PID/stat` of every process, by pid.
fn all_stats() -> io::Result<HashMap<u32, Stat>> {
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
    Ok(stats)
}

/// Sums the usage of `pids` (all present in `stats`).
fn usage_of(pids: &[u32], stats: &HashMap<u32, Stat>) -> Usage {
    let ticks_ns = 1_000_000_000 / sys::clock_ticks_per_second();
    let mut usage = Usage::default();
    for &pid in pids {
        if let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) {
            usage.rss_bytes += parse_kib_field(&status, "VmRSS:").unwrap_or(0);
        }
        if let Ok(rollup) = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) {
            usage.pss_bytes += parse_kib_field(&rollup, "Pss:").unwrap_or(0);
        }
        usage.cpu_ns += stats[&pid].cpu_ticks * ticks_ns;
        usage.user_ns += stats[&pid].user_ticks * ticks_ns;
        usage.processes += 1;
    }
    usage
}

/// CPU time (user plus system, all threads) of the calling process.
pub fn own_cpu_ns() -> io::Result<u64> {
    let stat = fs::read_to_string("/proc/self/stat")?;
    let stat = parse_stat(&stat)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc/self/stat"))?;
    Ok(stat.cpu_ticks * (1_000_000_000 / sys::clock_ticks_per_second()))
}

/// CPU time of the whole machine so far, summed over all CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MachineCpu {
    /// Every state of the `cpu` line of `/proc/stat` except idle and iowait.
    pub busy_ns: u64,
    /// Of that, hard and soft interrupts (`/proc/stat`). On loopback this
    /// is mostly the TCP receive work of both ends. Without
    /// `CONFIG_IRQ_TIME_ACCOUNTING` it is also part of the CPU time of the
    /// process it interrupted, or of a `ksoftirqd` thread.
    pub interrupts_ns: u64,
    /// The `ksoftirqd/N` threads, where the kernel moves softirq work it
    /// could not finish right away: work of whoever sends packets, not of
    /// a process of its own.
    pub softirq_threads_ns: u64,
}

/// The machine's CPU time so far (see [`MachineCpu`]).
pub fn machine_cpu() -> io::Result<MachineCpu> {
    let stat = fs::read_to_string("/proc/stat")?;
    let (busy, interrupts) = parse_machine_cpu(&stat)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc/stat"))?;
    let threads: u64 = all_stats()?
        .values()
        .filter(|s| s.softirq_thread)
        .map(|s| s.cpu_ticks)
        .sum();
    let ns = 1_000_000_000 / sys::clock_ticks_per_second();
    Ok(MachineCpu {
        busy_ns: busy * ns,
        interrupts_ns: interrupts * ns,
        softirq_threads_ns: threads * ns,
    })
}

/// Sockets in the LISTEN state on `port` (any address, v4 or v6): one per
/// instance of a server whose instances share the port (`SO_REUSEPORT`).
///
/// The kernel lists listening sockets before all others, so only the head
/// of each table is read: with a million connections open the whole table
/// is hundreds of megabytes.
pub fn listeners(port: u16) -> io::Result<usize> {
    let mut count = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        match fs::File::open(table) {
            Ok(file) => count += count_listeners(io::BufReader::new(file), port)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {} // no IPv6
            Err(e) => return Err(e),
        }
    }
    Ok(count)
}

/// Number of ports in `net.ipv4.ip_local_port_range` that are not in
/// `net.ipv4.ip_local_reserved_ports`: how many connections one source
/// address can have to one destination (`tuning/check.sh` counts the same).
pub fn local_port_range() -> io::Result<u32> {
    let range = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")?;
    let (low, high) = parse_port_range(&range)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable port range"))?;
    let reserved = match fs::read_to_string("/proc/sys/net/ipv4/ip_local_reserved_ports") {
        Ok(text) => reserved_in_range(&text, low, high).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "unparsable reserved ports")
        })?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e),
    };
    Ok((high - low + 1).saturating_sub(reserved))
}

/// `LOW HIGH` → `(LOW, HIGH)`.
fn parse_port_range(text: &str) -> Option<(u32, u32)> {
    let mut bounds = text.split_whitespace().map(|p| p.parse::<u32>().ok());
    let (low, high) = (bounds.next()??, bounds.next()??);
    (high >= low).then_some((low, high))
}

/// How many of the ports `low..=high` a reserved-ports list (`8080,9000-9010`)
/// names.
fn reserved_in_range(text: &str, low: u32, high: u32) -> Option<u32> {
    let mut count = 0;
    for item in text
        .trim()
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
    {
        let (first, last) = item.split_once('-').unwrap_or((item, item));
        let (first, last) = (
            first.trim().parse::<u32>().ok()?,
            last.trim().parse::<u32>().ok()?,
        );
        let (first, last) = (first.max(low), last.min(high));
        if last >= first {
            count += last - first + 1;
        }
    }
    Some(count)
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
    let name_end = text.rfind(')')?;
    let name = &text[text.find('(')? + 1..name_end];
    let rest = &text[name_end + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) ... utime(14) stime(15), 1-based.
    let zombie = *fields.first()? == "Z";
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Stat {
        zombie,
        ppid,
        cpu_ticks: utime + stime,
        user_ticks: utime,
        softirq_thread: name.starts_with("ksoftirqd/"),
    })
}

/// Busy and interrupt ticks from the aggregate `cpu` line of `/proc/stat`:
/// busy is user, nice, system, irq, softirq and steal (guest time is
/// already part of user); interrupts are irq and softirq.
fn parse_machine_cpu(stat: &str) -> Option<(u64, u64)> {
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
    Some((user + nice + system + irq + softirq + steal, irq + softirq))
}

/// A `NAME: N kB` field (`VmRSS:` of `/proc/PID/status`, `Pss:` of
/// `smaps_rollup`) in bytes; absent for kernel threads and zombies.
fn parse_kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let mut parts = line[name.len()..].split_whitespace();
    let kib: u64 = parts.next()?.parse().ok()?;
    (parts.next()? == "kB").then_some(kib * 1024)
}

/// LISTEN (state `0A`) sockets on `port` in a `/proc/net/tcp`-format table.
/// Reading stops at the first socket in another state.
fn count_listeners(table: impl io::BufRead, port: u16) -> io::Result<usize> {
    let mut count = 0;
    for line in table.lines().skip(1) {
        let line = line?;
        let mut fields = line.split_whitespace();
        let local = fields.nth(1);
        if fields.nth(1) != Some("0A") {
            break;
        }
        let local_port = local
            .and_then(|l| l.rsplit(':').next())
            .and_then(|p| u16::from_str_radix(p, 16).ok());
        count += usize::from(local_port == Some(port));
    }
    Ok(count)
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
                zombie: false,
                ppid: 17,
                cpu_ticks: 286,
                user_ticks: 250,
                softirq_thread: false,
            })
        );
        assert_eq!(parse_stat("12 (x) S"), None);
        let kthread = "14 (ksoftirqd/0) S 2 0 0 0 -1 69238848 0 0 0 0 0 5465 0 0 20 0 1 0 7";
        assert!(parse_stat(kthread).is_some_and(|s| s.softirq_thread && s.cpu_ticks == 5465));
    }

    #[test]
    fn kib_fields_in_bytes() {
        let status = "Name:\tnode\nVmPeak:\t  999 kB\nVmRSS:\t   51234 kB\nThreads:\t7\n";
        assert_eq!(parse_kib_field(status, "VmRSS:"), Some(51234 * 1024));
        assert_eq!(parse_kib_field("Name:\tkthreadd\n", "VmRSS:"), None);
        let rollup = "55d0-7ffd [rollup]\nRss:   3000 kB\nPss:   1200 kB\nPss_Anon:  800 kB\n";
        assert_eq!(parse_kib_field(rollup, "Pss:"), Some(1200 * 1024));
    }

    #[test]
    fn machine_busy_skips_idle_and_iowait() {
        let stat = "cpu  100 2 30 5000 7 1 4 6 0 0\ncpu0 50 1 15 2500 3 0 2 3 0 0\n";
        assert_eq!(parse_machine_cpu(stat), Some((143, 5)));
        assert_eq!(parse_machine_cpu("cpu  1 2 3\n"), None);
    }

    #[test]
    fn listening_sockets() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
             0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0\n   \
             1: 0100007F:1F91 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0\n   \
             2: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1 0\n";
        let count = |text: &str, port| count_listeners(text.as_bytes(), port).unwrap();
        assert_eq!(
            count(table, 8080),
            1,
            "listeners come first: reading stops after them"
        );
        assert_eq!(count(table, 8081), 0, "established, not listening");
        assert_eq!(count(table, 80), 0);
        let v6 = "sl local rem st\n 0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 0\n \
                  1: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 0\n";
        assert_eq!(count(v6, 8080), 2);
    }

    #[test]
    fn port_ranges() {
        assert_eq!(parse_port_range("32768\t60999\n"), Some((32_768, 60_999)));
        assert_eq!(parse_port_range("1024 65535"), Some((1024, 65_535)));
        assert_eq!(parse_port_range("9 8"), None);
        assert_eq!(parse_port_range("x"), None);
        assert!(local_port_range().unwrap() > 0);
        // Only reserved ports inside the range count.
        assert_eq!(reserved_in_range("\n", 32_768, 60_999), Some(0));
        assert_eq!(reserved_in_range("8080,32768", 32_768, 60_999), Some(1));
        assert_eq!(
            reserved_in_range("30000-32769, 60990-61000", 32_768, 60_999),
            Some(12)
        );
        assert_eq!(reserved_in_range("80-x", 1, 100), None);
    }

    #[test]
    fn tree_follows_parents() {
        let stat = |ppid| Stat {
            zombie: false,
            ppid,
            cpu_ticks: 0,
            user_ticks: 0,
            softirq_thread: false,
        };
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
        let me = std::process::id();
        let usage = tree_usage(me).unwrap();
        assert!(usage.rss_bytes > 0 && usage.pss_bytes > 0);
        assert!(usage.pss_bytes <= usage.rss_bytes);
        assert_eq!(processes_usage(&[me, u32::MAX]).unwrap().processes, 1);
        assert!(is_alive(me) && !is_alive(u32::MAX));
        own_cpu_ns().unwrap();
    }
}
