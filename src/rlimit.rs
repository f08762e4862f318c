//! The open-file limit: how many connections one process can hold.

use std::io;

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Descriptors a server keeps for itself (listener, epoll, waker, stdio,
/// the binary and libraries) before any connection.
pub const RESERVED_FDS: u64 = 32;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the new
/// soft limit (`u64::MAX` for unlimited). Every socket is a file
/// descriptor, so this bounds the connections a process can hold; the hard
/// limit only root or the service manager can raise.
pub fn raise_open_file_limit() -> io::Result<u64> {
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        setrlimit(Resource::Nofile, raised)?;
    }
    Ok(limit.maximum.unwrap_or(u64::MAX))
}

/// Connections that fit in `open_files` descriptors.
pub fn connection_capacity(open_files: u64) -> u64 {
    open_files.saturating_sub(RESERVED_FDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_is_idempotent_and_reaches_the_hard_limit() {
        let first = raise_open_file_limit().unwrap();
        assert_eq!(raise_open_file_limit().unwrap(), first);
        let limit = getrlimit(Resource::Nofile);
        assert_eq!(limit.current, limit.maximum);
        assert_eq!(connection_capacity(20_000), 19_968);
        assert_eq!(connection_capacity(10), 0);
    }
}
