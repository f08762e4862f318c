//! The `wspush` binary: standard input lines become broadcasts, and bad
//! command lines fail with one line and a non-zero exit.

mod util;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tungstenite::protocol::frame::coding::CloseCode as WsCloseCode;
use tungstenite::Message;
use util::{connect, texts, Binary, IO_TIMEOUT};

#[test]
fn stdin_lines_are_broadcast_in_order_by_the_documented_rules() {
    let mut server = Binary::start(&["--max-message-bytes", "16"]);
    let mut client = connect(server.addr, "/ws?id=cli");
    server
        .process
        .send(b"first\n\ncrlf\r\nbad \xff line\n0123456789abcdefX\nno newline");
    drop(server.process.child.stdin.take()); // end of input
    for expected in ["first", "", "crlf", "no newline"] {
        assert_eq!(client.read().unwrap(), Message::text(expected));
    }
    server
        .process
        .wait_for("input line 4 skipped: not valid UTF-8");
    server
        .process
        .wait_for("input line 5 skipped: longer than the 16-byte message limit");
    server.process.wait_for("the input ended; still serving");

    // End of input did not stop the server.
    let mut late = connect(server.addr, "/");
    late.send(Message::Ping(b"alive?".to_vec().into())).unwrap();
    assert_eq!(
        late.read().unwrap(),
        Message::Pong(b"alive?".to_vec().into())
    );
    assert!(server.process.child.try_wait().unwrap().is_none());
}

/// Runs the binary with `args` and returns its exit code and stderr.
fn run_expecting_failure(args: &[&str]) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wspush"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + IO_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("wspush {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code().expect("exited, not killed"), stderr)
}

#[test]
fn bad_command_lines_fail_with_one_line_and_a_non_zero_exit() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let unreadable = std::env::temp_dir().join(format!("wspush-no-tokens-{}", std::process::id()));
    let unreadable = unreadable.to_str().unwrap();
    let base = ["--listen", "127.0.0.1:0"];
    let with = |extra: &[&'static str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (vec![], 2, "--listen"),
        (
            vec!["--listen".into(), "nonsense".into()],
            2,
            "invalid socket address",
        ),
        (
            vec!["--listen".into(), "10.0.0.300:80".into()],
            2,
            "invalid socket address",
        ),
        (with(&["--max-connections", "0"]), 2, "must be at least 1"),
        (with(&["--max-connections", "-5"]), 2, "must be at least 1"),
        (
            with(&["--max-connections-per-ip", "0"]),
            2,
            "must be at least 1",
        ),
        (
            with(&["--max-message-bytes", "0"]),
            2,
            "--max-message-bytes",
        ),
        (with(&["--max-queued-bytes", "0"]), 2, "must be at least 1"),
        (with(&["--slow-consumer", "maybe"]), 2, "--slow-consumer"),
        (
            with(&["--ping-interval", "0s"]),
            2,
            "must be longer than zero",
        ),
        (with(&["--ping-interval", "-1s"]), 2, "must not be negative"),
        (
            with(&["--stats-interval", "10000000000000000000"]),
            2,
            "longer than 365 days",
        ),
        (
            with(&["--handshake-timeout", "10 parsecs"]),
            2,
            "--handshake-timeout",
        ),
        (
            with(&["--ping-interval", "10s", "--idle-timeout", "5s"]),
            1,
            "idle timeout must be at least",
        ),
        (
            with(&["--allow-origin", "https://example.com/"]),
            1,
            "no path or trailing slash",
        ),
        (
            with(&["--metrics-listen", "localhost"]),
            2,
            "--metrics-listen",
        ),
        (with(&["--path", "ws"]), 1, "path must start with '/'"),
        (
            with(&["--demo", "--path", "/ws"]),
            1,
            "the demo page connects to /",
        ),
        (
            base.iter()
                .map(|s| s.to_string())
                .chain(["--token-file".into(), unreadable.into()])
                .collect(),
            1,
            "cannot read token file",
        ),
        (
            vec!["--listen".into(), taken.clone()],
            1,
            "cannot listen on",
        ),
        (with(&["--total-connections", "1000"]), 2, "--processes"),
        (
            with(&["--redis", "redis://127.0.0.1"]),
            2,
            "--upstream-stream",
        ),
        (
            with(&["--upstream", "redis-stream"]),
            1,
            "needs --upstream-stream KEY",
        ),
        (
            with(&["--upstream", "redis-stream", "--upstream-stream", "up"]),
            2,
            "--redis",
        ),
        (
            with(&[
                "--upstream",
                "stdout",
                "--redis",
                "redis://127.0.0.1",
                "--upstream-stream",
                "up",
            ]),
            1,
            "goes with --upstream redis-stream",
        ),
        (
            with(&[
                "--upstream",
                "redis-stream",
                "--redis",
                "redis://127.0.0.1",
                "--upstream-stream",
                "up",
                "--host-name",
                "two words",
            ]),
            1,
            "--host-name",
        ),
        (
            with(&["--redis", "redis://127.0.0.1", "--host-name", "h1"]),
            2,
            "--upstream-stream",
        ),
    ];
    for (args, code, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let args = &args[..];
        let (status, stderr) = run_expecting_failure(args);
        assert_eq!(status, code, "{args:?}: {stderr}");
        assert_eq!(
            stderr.lines().count(),
            1,
            "{args:?} printed more than one line: {stderr}"
        );
        assert!(
            stderr.starts_with("wspush: ") && stderr.contains(needle),
            "{args:?}: {stderr}"
        );
    }
}

/// What the binary prints on standard output for `flag` alone, which it
/// answers with success.
fn printed_for(flag: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_wspush"))
        .arg(flag)
        .output()
        .unwrap();
    assert!(output.status.success(), "{flag}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn help_prints_and_states_the_stdin_rules() {
    // Every flag's help, and its row in OPERATIONS, are checked against
    // the parser itself (the binary's unit test
    // `every_flag_has_help_and_a_row_with_its_default_in_the_operations_table`).
    let help = printed_for("--help");
    assert!(help.contains("--listen <ADDR>"), "{help}");
    assert!(
        help.contains("empty") && help.contains("UTF-8"),
        "--help states the stdin rules"
    );
}

#[test]
fn version_names_the_program_not_its_package_and_the_state_format() {
    // An upgrade checks a new binary by this line (a lone server's
    // re-exec, by its state format too).
    let version = printed_for("--version");
    assert_eq!(
        version,
        format!(
            "wspush {} (state format {})\n",
            env!("CARGO_PKG_VERSION"),
            wspush::STATE_FORMAT
        )
    );
}

#[test]
fn standard_input_takes_commands() {
    let mut server = Binary::start(&["--input", "commands"]);
    let mut news = connect(server.addr, "/?channel=news");
    let mut alice = connect(server.addr, "/?id=alice");
    server.process.send(
        b"pub news hello, news\nbogus line\nid alice hi alice\nall:b64 AAEC\nsub alice news\npub news to both\nclose id alice 4000 done\n",
    );
    server
        .process
        .wait_for("input line 2 skipped: unknown command");
    assert_eq!(texts(&mut news, 1), ["hello, news"]);
    assert_eq!(news.read().unwrap(), Message::binary(vec![0, 1, 2]));
    assert_eq!(texts(&mut news, 1), ["to both"]);
    assert_eq!(texts(&mut alice, 1), ["hi alice"]);
    assert_eq!(alice.read().unwrap(), Message::binary(vec![0, 1, 2]));
    assert_eq!(texts(&mut alice, 1), ["to both"]);
    match alice.read() {
        Ok(Message::Close(Some(frame))) => assert_eq!(frame.code, WsCloseCode::from(4000)),
        other => panic!("not the close: {other:?}"),
    }
}
