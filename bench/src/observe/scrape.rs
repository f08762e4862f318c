//! A server's own counts: `GET /metrics` (Prometheus text) and its
//! samples by name.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The value of the unlabelled sample `name` in a Prometheus text page.
pub fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let mut fields = l.split_whitespace();
        (fields.next()? == name).then(|| fields.next()?.parse().ok())?
    })
}

/// `GET /metrics` from `addr`: the body of a 200 answer.
pub fn fetch_metrics(addr: SocketAddr) -> io::Result<String> {
    let timeout = Duration::from_secs(5);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buf)?;
        got.extend_from_slice(&buf[..n]);
        if let Some(body) = complete_body(&got) {
            return body;
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the /metrics answer ended early",
            ));
        }
    }
}

/// The body of a complete HTTP answer in `got` (Content-Length, else up to
/// the end); `None` while it is incomplete.
fn complete_body(got: &[u8]) -> Option<io::Result<String>> {
    let head_end = got.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&got[..head_end]);
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        let status = head.lines().next().unwrap_or("").to_string();
        return Some(Err(io::Error::other(format!("/metrics answered {status}"))));
    }
    let length = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    })?;
    let body = &got[head_end..];
    (body.len() >= length).then(|| Ok(String::from_utf8_lossy(&body[..length]).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_pages_are_read_by_name() {
        let page = "# HELP wspush_subscriptions Subscriptions held.\n\
                    # TYPE wspush_subscriptions gauge\n\
                    wspush_subscriptions 190000\n\
                    wspush_subscriptions_refused_total 0\n\
                    wspush_requests_rejected_total{status=\"400\"} 3\n\
                    wspush_channels 1000 1712345678\n";
        assert_eq!(metric(page, "wspush_subscriptions"), Some(190_000.0));
        assert_eq!(metric(page, "wspush_channels"), Some(1000.0));
        assert_eq!(metric(page, "wspush_requests_rejected_total"), None);
        assert_eq!(metric(page, "wspush_connections_with_id"), None);
    }

    #[test]
    fn http_answers_are_complete_at_their_length() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\n";
        assert!(complete_body(&head[..20]).is_none());
        let mut got = head.to_vec();
        got.extend_from_slice(b"ab");
        assert!(complete_body(&got).is_none());
        got.extend_from_slice(b"cde");
        assert_eq!(complete_body(&got).unwrap().unwrap(), "abcde");
        assert!(
            complete_body(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                .unwrap()
                .is_err()
        );
    }
}
