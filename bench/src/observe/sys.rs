//! The handful of Linux calls that neither std nor mio wrap.
//!
//! Every `unsafe` block of the crate lives in this module. The OS calls
//! the server makes too (the open-file limit, `TCP_DEFER_ACCEPT`, the
//! parent-death signal) are the server's own, from `wspush::sys`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Nanoseconds on `CLOCK_MONOTONIC`.
///
/// Unlike [`std::time::Instant`] the value is a plain number that means the
/// same in every process of the machine, so it can travel inside a message
/// and be compared with the receiver's clock.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` and CLOCK_MONOTONIC exists on
    // every Linux; the call only writes into `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    // Both fields are non-negative for CLOCK_MONOTONIC.
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sets `IP_BIND_ADDRESS_NO_PORT` on a socket: a later `bind(addr, 0)` then
/// leaves the choice of the source port to `connect()`, which only needs the
/// 4-tuple to be unique. Without it every bound socket reserves a port for
/// itself and a few tens of thousands of connections exhaust the range.
pub fn set_bind_address_no_port(socket: BorrowedFd<'_>) -> io::Result<()> {
    let enable: libc::c_int = 1;
    // SAFETY: the descriptor is open for the lifetime of the borrow, and the
    // option value is a live `c_int` whose exact size is passed along.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&enable as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Clock ticks per second, the unit of the CPU times in `/proc/PID/stat`.
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// Sends `signal` to every process of the process group `pgid`.
pub fn signal_group(pgid: u32, signal: libc::c_int) -> io::Result<()> {
    let pgid = libc::pid_t::try_from(pgid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill() has no memory-safety preconditions; a negative pid names
    // the process group, which the caller created for a child of its own.
    if unsafe { libc::kill(-pgid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Installs a handler for SIGINT, SIGTERM and SIGHUP that only records the
/// signal (see [`interrupted`]), so every loop can wind down and the spawned
/// server is stopped by its owner's `Drop`.
///
/// The handler is installed without `SA_RESTART`, so a blocking `epoll_wait`
/// returns early with `EINTR` when the signal arrives.
pub fn install_interrupt_handler() -> io::Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: an all-zero `sigaction` is a valid value (empty mask, no flags).
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: `action` is fully initialised; the handler only stores to an
        // atomic, which is async-signal-safe; the old action is not requested.
        if unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether SIGINT, SIGTERM or SIGHUP arrived since [`install_interrupt_handler`].
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_moves_forward() {
        let a = now_ns();
        let b = now_ns();
        assert!(a > 0 && b >= a);
    }
}
