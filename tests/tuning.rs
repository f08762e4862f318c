//! The OS tuning kit (`tuning/`): `check.sh N` names every limit that is
//! too small for N connections and exits 1, exits 0 when everything fits,
//! and a bad command line fails with one line and exit status 2.

use std::process::{Command, Output};

const CHECK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tuning/check.sh");
const APPLY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tuning/apply.sh");

/// Runs `script args` through `sh -c`, after `setup` (e.g. a `ulimit`).
fn run(setup: &str, script: &str, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("{setup}\nexec \"$0\" \"$@\""))
        .arg(script)
        .args(args)
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// Runs the shell `script` in a new network namespace, where every `net.*`
/// value is the kernel's default whatever the host was tuned to: as root
/// with `unshare -n`, otherwise in a user namespace as well (`unshare -rn`).
/// Panics when this machine allows neither (a container without
/// CAP_SYS_ADMIN, user namespaces disabled): the tests that call it are
/// ignored unless asked for, and asked for they must run.
fn in_fresh_netns(script: &str) -> Output {
    for flags in ["-n", "-rn"] {
        let output = Command::new("unshare")
            .args([flags, "sh", "-c", script])
            .output();
        match output {
            Ok(output) if !is_unshare_error(&output) => return output,
            _ => continue,
        }
    }
    panic!("no new network namespace here (unshare -n and unshare -rn both failed)");
}

/// Whether `unshare` itself failed, before it ran the script.
fn is_unshare_error(output: &Output) -> bool {
    String::from_utf8_lossy(&output.stderr).starts_with("unshare: ")
}

/// The summary line of a report (`summary: OK: ...` / `summary: SHORT: ...`).
fn summary(report: &str) -> &str {
    report
        .lines()
        .find(|l| l.starts_with("summary: "))
        .unwrap_or_else(|| panic!("no summary in:\n{report}"))
}

/// The one line after the summary, naming apply.sh, is there exactly when
/// a sysctl (`net.*`, `fs.*`) is short: a shell limit is not apply.sh's.
fn assert_apply_hint_iff_a_sysctl_is_short(report: &str) {
    let sysctl_short = report
        .lines()
        .any(|l| l.starts_with("SHORT  net.") || l.starts_with("SHORT  fs."));
    let after: Vec<&str> = report
        .lines()
        .skip_while(|l| !l.starts_with("summary: "))
        .skip(1)
        .collect();
    if sysctl_short {
        assert_eq!(after.len(), 1, "{report}");
        assert!(after[0].contains("/apply.sh "), "{report}");
    } else {
        assert!(after.is_empty(), "{report}");
    }
}

/// The report line of one limit (`OK     label: ...`, `SHORT  label: ...`).
fn line<'a>(report: &'a str, label: &str) -> &'a str {
    report
        .lines()
        .find(|l| {
            l.get(7..)
                .is_some_and(|rest| rest.starts_with(&format!("{label}: ")))
        })
        .unwrap_or_else(|| panic!("no line for {label:?} in:\n{report}"))
}

#[test]
fn too_few_open_files_per_process_is_short_and_exits_1() {
    // Lowering the limit is always allowed; 256 files cannot hold 100,000
    // connections in one process whatever the machine.
    let output = run("ulimit -n 256", CHECK, &["100000"]);
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{report}");

    let open_files = line(&report, "open files per server process");
    assert!(open_files.starts_with("SHORT "), "{open_files}");
    assert!(open_files.contains("needs 100064"), "{open_files}");
    assert!(open_files.contains("hard 256"), "{open_files}");
    assert!(
        report.contains("EMFILE \"Too many open files\""),
        "{report}"
    );
    // The fix names the process count that fits the limit: 100000 / (256 - 64).
    assert!(report.contains("--processes 521"), "{report}");

    // Whatever else this machine is short of for 100,000 connections.
    let summary = summary(&report);
    assert!(summary.starts_with("summary: SHORT"), "{summary}");
    assert!(
        summary.contains("open files per server process"),
        "{summary}"
    );
    assert_apply_hint_iff_a_sysctl_is_short(&report);
}

#[test]
fn one_source_address_is_short_for_a_million_local_clients() {
    // No ephemeral port range exceeds 65,535 ports: one source address cannot
    // open a million connections to one ip:port, on any machine.
    let args = [
        "1000000",
        "--both-ends",
        "--processes",
        "100",
        "--client-processes",
        "100",
        "--source-addrs",
        "1",
    ];
    let output = run("", CHECK, &args);
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{report}");
    let sources = line(&report, "client source addresses");
    assert!(sources.starts_with("SHORT "), "{sources}");
    assert!(sources.contains("has 1 (--source-addrs)"), "{sources}");
    assert!(report.contains("EADDRNOTAVAIL"), "{report}");
}

#[test]
fn source_addresses_are_planned_at_45_percent_of_the_port_range() {
    let check = |sources: &str| {
        let args = ["1000000", "--both-ends", "--processes", "100"];
        let args = [
            &args[..],
            &["--client-processes", "100", "--source-addrs", sources],
        ]
        .concat();
        let report = stdout(&run("", CHECK, &args));
        line(&report, "client source addresses").to_string()
    };
    let short = check("1");
    assert!(short.starts_with("SHORT "), "{short}");
    // "needs A (45% of ports LO-HI per address: P connections ...; at least B)"
    let number_after = |text: &str, word: &str| -> u64 {
        let rest = text
            .split(word)
            .nth(1)
            .unwrap_or_else(|| panic!("{word:?} in {text}"));
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("a number after {word:?} in {text}"))
    };
    let (needs, per_address, least) = (
        number_after(&short, "needs "),
        number_after(&short, "per address: "),
        number_after(&short, "at least "),
    );
    assert_eq!(needs, 1_000_000u64.div_ceil(per_address), "{short}");
    assert!(least < needs, "{short}");
    // Enough for the ports but over half of each address's range: a risk.
    let warn = check(&least.to_string());
    assert!(warn.starts_with("WARN "), "{warn}");
    assert!(check(&needs.to_string()).starts_with("OK "));
}

/// A hundred connections fit: exit 0, nothing short, every limit reported
/// (tracked connections even when not loaded), one summary line last.
fn assert_a_hundred_fit(output: &Output, what: &str) {
    let report = stdout(output);
    assert_eq!(output.status.code(), Some(0), "{what}:\n{report}");
    assert!(!report.lines().any(|l| l.starts_with("SHORT")), "{report}");
    for label in [
        "open files per server process",
        "fs.nr_open",
        "fs.file-max",
        "net.core.somaxconn",
        "net.ipv4.tcp_max_syn_backlog",
        "net.ipv4.tcp_mem",
        "net.core.netdev_max_backlog",
        "net.netfilter.nf_conntrack_max",
        "net.ipv4.tcp_max_orphans",
        "net.ipv4.tcp_ehash_entries",
    ] {
        line(&report, label);
    }
    assert_eq!(report.lines().last(), Some(summary(&report)), "{report}");
    assert!(summary(&report).starts_with("summary: OK"), "{report}");
}

#[test]
fn a_hundred_connections_fit_any_normal_linux() {
    for args in [&["100"][..], &["100", "--both-ends"][..]] {
        assert_a_hundred_fit(&run("", CHECK, args), &format!("{args:?}"));
    }
}

#[test]
#[ignore = "needs a new network namespace (root, or user namespaces): cargo test --test tuning -- --ignored"]
fn a_hundred_connections_fit_a_fresh_network_namespace() {
    // The kernel's defaults for every net.* value, however the host was
    // tuned; the host-wide ones are not visible there, and say so.
    let script = format!("exec {CHECK} 100 --both-ends");
    let output = in_fresh_netns(&script);
    assert_a_hundred_fit(&output, "a fresh network namespace");
    let report = stdout(&output);
    for host_wide in [
        "net.ipv4.tcp_mem",
        "net.core.netdev_max_backlog",
        "net.ipv4.tcp_max_orphans",
    ] {
        let warn = line(&report, host_wide);
        assert!(warn.starts_with("WARN "), "{warn}");
        assert!(
            warn.contains("not visible in this network namespace"),
            "{warn}"
        );
    }
}

#[test]
#[ignore = "needs a new network namespace (root, or user namespaces): cargo test --test tuning -- --ignored"]
fn a_short_accept_queue_is_found_then_raised_by_apply_sh() {
    // The state is built here, in a namespace of its own: both queues at
    // 128, too small for 10,000 connections arriving at once.
    let script = format!(
        "echo 128 > /proc/sys/net/core/somaxconn\n\
         echo 128 > /proc/sys/net/ipv4/tcp_max_syn_backlog\n\
         {CHECK} 10000; echo \"check exit $?\"\n\
         {APPLY} 10000; echo \"apply exit $?\"\n\
         {CHECK} 10000"
    );
    let output = in_fresh_netns(&script);
    let out = stdout(&output);
    let (before, rest) = out
        .split_once("check exit ")
        .unwrap_or_else(|| panic!("{out}"));
    let (applied, after) = rest
        .split_once("apply exit ")
        .unwrap_or_else(|| panic!("{out}"));

    for label in ["net.core.somaxconn", "net.ipv4.tcp_max_syn_backlog"] {
        let short = line(before, label);
        assert!(short.starts_with("SHORT "), "{short}");
        assert!(short.contains("has 128"), "{short}");
        assert!(
            applied.contains(&format!("raised      {label}: 128 -> 10000")),
            "{applied}"
        );
        let ok = line(after, label);
        assert!(ok.starts_with("OK "), "{ok}");
        assert!(ok.contains("has 10000"), "{ok}");
    }
    assert!(applied.starts_with("1\n"), "check.sh exits 1: {out}");
    assert!(summary(before).starts_with("summary: SHORT"), "{before}");
    assert_apply_hint_iff_a_sysctl_is_short(before);
    // What a namespace cannot change is named, not failed: apply.sh exits 0.
    assert!(after.starts_with("0\n"), "apply.sh exits 0: {out}");
}

#[test]
fn bad_usage_fails_with_one_line_and_exit_2() {
    let cases: &[&[&str]] = &[
        &[],
        &["many"],
        &["0"],
        &["100", "200"],
        &["100", "--processes"],
        &["100", "--processes", "0"],
        &["100", "--port", "70000"],
        &["100", "--source-addrs", "4"], // needs --both-ends
        &["100", "--bogus"],
    ];
    for (script, name) in [(CHECK, "check.sh"), (APPLY, "apply.sh")] {
        for &args in cases {
            let mut args = args.to_vec();
            if name == "apply.sh" {
                // N is optional there; and should a case ever be valid, it
                // must not change the machine.
                if args.is_empty() {
                    continue;
                }
                args.push("--dry-run");
            }
            let output = run("", script, &args);
            assert_eq!(output.status.code(), Some(2), "{name} {args:?}");
            assert!(output.stdout.is_empty(), "{name} {args:?}");
            let stderr = String::from_utf8(output.stderr).unwrap();
            assert_eq!(stderr.lines().count(), 1, "{name} {args:?}: {stderr}");
            assert!(stderr.starts_with(&format!("{name}: ")), "{stderr}");
        }
    }
}

/// The established-socket hash is a cost, not a shortage: more sockets
/// than its buckets is a WARN naming the boot parameter and the namespace
/// way out, as many or fewer is OK, and neither changes the exit status.
#[test]
fn more_sockets_than_established_hash_buckets_is_a_warning() {
    let Ok(table) = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_ehash_entries") else {
        return; // Linux before 6.1 does not show it (check.sh says INFO).
    };
    let buckets = table.trim().parse::<i64>().unwrap().unsigned_abs();
    let at = |n: u64| {
        let output = run("", CHECK, &[&n.to_string()]);
        line(&stdout(&output), "net.ipv4.tcp_ehash_entries").to_string()
    };
    let fits = at(buckets);
    assert!(fits.starts_with("OK "), "{fits}");
    let over = run("", CHECK, &[&(buckets + 1).to_string()]);
    let report = stdout(&over);
    let warn = line(&report, "net.ipv4.tcp_ehash_entries");
    assert!(warn.starts_with("WARN "), "{warn}");
    assert!(
        warn.contains(&format!("{} sockets in {buckets} buckets", buckets + 1)),
        "{warn}"
    );
    let fix = format!("thash_entries={}", (buckets + 1).next_power_of_two());
    assert!(report.contains(&fix), "{report}");
    assert!(report.contains("tcp_child_ehash_entries"), "{report}");
}
