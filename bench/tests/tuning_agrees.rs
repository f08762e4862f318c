//! `tuning/check.sh` plans the client's source addresses the way the bench
//! picks them (`push --sources`' default), on this machine's port range.

use std::process::Command;

use wspush_bench::client::dial;
use wspush_bench::observe::procfs;

const CHECK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tuning/check.sh");

#[test]
fn check_sh_asks_for_the_source_addresses_the_bench_uses() {
    let ports = procfs::local_port_range().unwrap();
    for conns in [100_000, 1_000_000] {
        let bench = dial::sources_for(conns, ports).unwrap();
        let output = Command::new(CHECK)
            .args([&conns.to_string(), "--both-ends", "--source-addrs", "1"])
            .output()
            .unwrap();
        let report = String::from_utf8(output.stdout).unwrap();
        let line = report
            .lines()
            .find(|l| l.contains("client source addresses: "))
            .unwrap_or_else(|| panic!("no source address line in:\n{report}"));
        let needs = line
            .split("needs ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u8>().ok())
            .unwrap_or_else(|| panic!("no count in {line:?}"));
        assert_eq!(needs, bench, "{conns} connections: {line}");
    }
}
