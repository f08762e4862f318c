//! SIGTERM during a stream of broadcasts: every client gets every message
//! the server took before the signal, the same ones, in order, then a
//! 1001 close; the process exits 0.

mod util;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::Message;
use util::{connect, Binary, IO_TIMEOUT};

#[test]
fn sigterm_during_a_broadcast_stream_delivers_what_was_sent_then_1001() {
    let mut server = Binary::start(&["--quiet"]);
    let mut clients: Vec<_> = (0..5)
        .map(|i| connect(server.addr, &format!("/?id={i}")))
        .collect();

    // A feeder writes numbered lines as fast as the server takes them.
    let mut stdin = server.process.child.stdin.take().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                if writeln!(stdin, "{n}").is_err() {
                    break; // The server is gone.
                }
            }
        })
    };

    // Let the stream run, then signal while it is still flowing.
    for client in &mut clients[..1] {
        for expected in 1..=200u64 {
            assert_eq!(client.read().unwrap(), Message::text(expected.to_string()));
        }
    }
    let pid = server.process.child.id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());

    let mut lasts = Vec::new();
    for (i, client) in clients.iter_mut().enumerate() {
        let mut next = if i == 0 { 201 } else { 1 };
        loop {
            match client.read() {
                Ok(Message::Text(text)) => {
                    assert_eq!(
                        text.as_str(),
                        next.to_string(),
                        "client {i}: gap or reorder"
                    );
                    next += 1;
                }
                Ok(Message::Close(Some(frame))) => {
                    assert_eq!(frame.code, CloseCode::Away, "client {i}");
                    break;
                }
                other => panic!("client {i}: unexpected {other:?}"),
            }
        }
        lasts.push(next - 1);
    }
    stop.store(true, Ordering::Relaxed);
    assert!(lasts[0] >= 200, "{lasts:?}");
    assert!(
        lasts.iter().all(|&last| last == lasts[0]),
        "every client got the same messages: {lasts:?}"
    );

    // Each client answers the close (tungstenite does on read) and goes;
    // the server exits 0 as soon as all are gone.
    for client in &mut clients {
        let _ = client.read();
    }
    drop(clients);
    let deadline = Instant::now() + IO_TIMEOUT;
    let status = loop {
        if let Some(status) = server.process.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    feeder.join().unwrap();
}
