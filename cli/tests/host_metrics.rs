//! One `/metrics` for the host under `--processes`: the supervisor serves
//! on `--metrics-listen` the sums of its instances' counters (each
//! instance's too, labelled `instance`), as does `/metrics` on the main
//! listener, read from the host's metrics board; each instance still
//! serves its own on PORT+K. A process killed and started again loses
//! nothing of what it had counted: no sum goes backwards.

mod util;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use util::{connect, http_get, sample, signal, texts, Client, IO_TIMEOUT};

/// The instances.
const INSTANCES: u16 = 3;

/// The series whose sums are checked: a gauge, counters, a histogram's
/// count.
const SERIES: [&str; 4] = [
    "wspush_connections_open",
    "wspush_upgrades_total",
    "wspush_broadcast_deliveries_total",
    "wspush_delivery_latency_seconds_count{transport=\"websocket\"}",
];

fn page(at: SocketAddr) -> String {
    http_get(at, "/metrics", "").body
}

/// `series` with the label `instance="K"` first.
fn of_instance(series: &str, k: u16) -> String {
    match series.split_once('{') {
        Some((name, labels)) => format!("{name}{{instance=\"{k}\",{labels}"),
        None => format!("{series}{{instance=\"{k}\"}}"),
    }
}

/// Waits until `at` accepts connections.
fn serving(at: SocketAddr) {
    let deadline = Instant::now() + IO_TIMEOUT;
    while std::net::TcpStream::connect(at).is_err() {
        assert!(Instant::now() < deadline, "nothing serves {at}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The instance a process serves (its `WSPUSH_INSTANCE`).
fn instance_of(pid: u32) -> u16 {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    environ
        .split(|&b| b == 0)
        .find_map(|var| var.strip_prefix(b"WSPUSH_INSTANCE="))
        .map(|k| std::str::from_utf8(k).unwrap().parse().unwrap())
        .unwrap()
}

/// Waits until the host's page and the instances' own agree on every
/// [`SERIES`] (their pages are read one after another); returns the
/// host's page and the instances'.
fn agreed(host: SocketAddr, port: u16) -> (String, Vec<String>) {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let own: Vec<String> = (1..=INSTANCES)
            .map(|k| page(SocketAddr::from(([127, 0, 0, 1], port + k))))
            .collect();
        let host_page = page(host);
        let agree = SERIES.iter().all(|series| {
            let each: Vec<u64> = own.iter().map(|p| sample(p, series)).collect();
            let labelled: Vec<u64> = (1..=INSTANCES)
                .map(|k| sample(&host_page, &of_instance(series, k)))
                .collect();
            sample(&host_page, series) == each.iter().sum::<u64>() && labelled == each
        });
        if agree {
            return (host_page, own);
        }
        assert!(Instant::now() < deadline, "never agreed:\n{host_page}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_host_metrics_sum_the_instances_and_keep_a_killed_process_counts() {
    let port = util::free_ports(INSTANCES + 1);
    let metrics = SocketAddr::from(([127, 0, 0, 1], port));
    let listen = metrics.to_string();
    let args = ["--quiet", "--processes", "3", "--metrics-listen", &listen];
    let binary = Path::new(env!("CARGO_BIN_EXE_wspush"));
    let (mut supervisor, addr) = util::start_supervisor(binary, &args, 3, "info");
    serving(metrics);
    let mut clients: Vec<Client> = (0..12).map(|_| connect(addr, "/")).collect();
    for n in 0..5 {
        supervisor.send(format!("line {n}\n").as_bytes());
    }
    for client in &mut clients {
        assert_eq!(texts(client, 5).len(), 5);
    }
    let (before, own) = agreed(metrics, port);
    assert_eq!(sample(&before, "wspush_upgrades_total"), 12);
    assert_eq!(sample(&before, "wspush_broadcast_deliveries_total"), 60);
    // Every instance framed the 5 lines: the host's input, not their sum.
    assert_eq!(sample(&before, "wspush_broadcasts_total"), 5);
    for k in 1..=INSTANCES {
        assert_eq!(
            sample(&before, &of_instance("wspush_broadcasts_total", k)),
            5
        );
    }
    assert!(own.iter().all(|p| sample(p, "wspush_upgrades_total") < 12));

    // One process killed: its counts stay with its instance.
    let victim = util::deploy::children(&supervisor)[0];
    let k = instance_of(victim);
    let its_upgrades = sample(&before, &of_instance("wspush_upgrades_total", k));
    signal(victim, "-KILL");
    supervisor.wait_for(&format!("instance {k} started again"));
    let restarted = SocketAddr::from(([127, 0, 0, 1], port + k));
    serving(restarted);
    let deadline = Instant::now() + IO_TIMEOUT;
    clients.extend((0..6).map(|_| connect(addr, "/")));
    supervisor.send(b"after\n");
    let after = loop {
        let host = page(metrics);
        if sample(&host, "wspush_upgrades_total") == 18 {
            break host;
        }
        assert!(Instant::now() < deadline, "{host}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let own_now = page(restarted);
    assert_eq!(
        sample(&after, &of_instance("wspush_upgrades_total", k)),
        its_upgrades + sample(&own_now, "wspush_upgrades_total"),
        "instance {k}: the killed process's upgrades, and its successor's"
    );
    for series in ["wspush_broadcast_deliveries_total", "wspush_upgrades_total"] {
        assert!(
            sample(&after, series) >= sample(&before, series),
            "{series}"
        );
    }
    assert_eq!(
        sample(&after, "wspush_connections_open"),
        (1..=INSTANCES)
            .map(|k| sample(
                &page(SocketAddr::from(([127, 0, 0, 1], port + k))),
                "wspush_connections_open"
            ))
            .sum::<u64>(),
        "a gauge: the processes running only"
    );
    signal(supervisor.child.id(), "-INT");
}

#[test]
fn the_host_metrics_leave_the_instances_out_when_asked() {
    let port = util::free_ports(3);
    let listen = format!("127.0.0.1:{port}");
    let args = [
        "--quiet",
        "--processes",
        "2",
        "--metrics-listen",
        &listen,
        "--metrics-sums-only",
    ];
    let binary = Path::new(env!("CARGO_BIN_EXE_wspush"));
    let (supervisor, addr) = util::start_supervisor(binary, &args, 2, "info");
    let host = SocketAddr::from(([127, 0, 0, 1], port));
    serving(host);
    let _clients: Vec<Client> = (0..4).map(|_| connect(addr, "/")).collect();
    let deadline = Instant::now() + IO_TIMEOUT;
    while sample(&page(host), "wspush_connections_open") != 4 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = page(host);
    assert!(!text.contains("instance=\""), "{text}");
    assert_eq!(http_get(host, "/healthz", "").body, "ok\n");
    assert_eq!(http_get(host, "/nothing", "").status, 404);
    signal(supervisor.child.id(), "-INT");
}

#[test]
fn without_a_metrics_listener_any_instance_answers_the_hosts_metrics() {
    let args = ["--quiet", "--processes", "2"];
    let binary = Path::new(env!("CARGO_BIN_EXE_wspush"));
    let (supervisor, addr) = util::start_supervisor(binary, &args, 2, "info");
    let _clients: Vec<Client> = (0..6).map(|_| connect(addr, "/")).collect();
    let deadline = Instant::now() + IO_TIMEOUT;
    // Whichever instance a scrape reaches, the host's sums.
    let mut pages = 0;
    while pages < 6 {
        let text = page(addr);
        if sample(&text, "wspush_upgrades_total") == 6 {
            let each: u64 = (1..=2)
                .map(|k| sample(&text, &of_instance("wspush_upgrades_total", k)))
                .sum();
            assert_eq!(each, 6, "{text}");
            pages += 1;
        }
        assert!(Instant::now() < deadline, "{text}");
    }
    signal(supervisor.child.id(), "-INT");
}
