//! The OS calls the loop and the binary make that no safe wrapper covers:
//! the crate's only `unsafe` code, each block with its safety argument.
//!
//! ## Giving freed heap memory back to the kernel
//!
//! glibc's allocator keeps freed chunks in its arenas and returns memory
//! to the kernel only from the top of the heap. After a burst (say 10,000
//! half-sent requests, each holding an 8 KiB pool buffer) the freed
//! buffers sit among live allocations, so the process keeps the burst's
//! resident size for good: measured here, 6.7 MB before a 10,000-socket
//! slowloris, 49.8 MB at its peak and still 49.8 MB once every buffer was
//! freed. `malloc_trim(0)` also releases the whole free pages inside the
//! heap (`MADV_DONTNEED`), which brings it back to the baseline.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use rustix::process::{
    getrlimit, set_parent_process_death_signal, setrlimit, Resource, Rlimit, Signal,
};

/// Releases the allocator's free memory to the kernel. Costs a walk over
/// the free chunks, so call it after freeing much, not per free.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free_memory() {
    // SAFETY: `malloc_trim` takes no pointer, reads and writes only the
    // allocator's own state under the allocator's locks (glibc documents
    // it MT-Safe), and leaves every live allocation untouched.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other allocators return memory on their own; nothing to do.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_memory() {}

/// Sets `TCP_DEFER_ACCEPT` on a listening socket: the kernel hands a
/// connection to `accept()` only once its first data arrived (or after
/// about `secs`, when it resends its SYN-ACK). Neither socket2 nor rustix
/// wraps it (std's wrapper is unstable).
pub fn set_tcp_defer_accept(socket: &impl AsFd, secs: u32) -> io::Result<()> {
    let value = libc::c_int::try_from(secs).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is open for the duration of the call (the
    // caller's borrow), and the option value is a live `c_int` whose exact
    // size is passed along; setsockopt only reads it.
    let set = unsafe {
        libc::setsockopt(
            socket.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The signal a child gets when its parent dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentDeath {
    /// SIGTERM: it may shut down cleanly (a supervisor's instances).
    Term,
    /// SIGKILL: it ends at once (a benchmark's server and workers).
    Kill,
}

/// Makes the process `command` starts receive `signal` when its parent
/// dies (`PR_SET_PDEATHSIG`, kept across `exec`): no orphans if the parent
/// is killed.
pub fn die_with_parent(command: &mut Command, signal: ParentDeath) {
    let signal = match signal {
        ParentDeath::Term => Signal::TERM,
        ParentDeath::Kill => Signal::KILL,
    };
    // SAFETY: the closure runs in the forked child before exec. It makes
    // one async-signal-safe system call (prctl) and neither allocates nor
    // touches locks, which is all that is allowed there.
    unsafe {
        command.pre_exec(move || {
            set_parent_process_death_signal(Some(signal)).map_err(io::Error::from)
        });
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_the_open_file_limit_is_idempotent_and_reaches_the_hard_limit() {
        let first = raise_open_file_limit().unwrap();
        assert_eq!(raise_open_file_limit().unwrap(), first);
        let limit = getrlimit(Resource::Nofile);
        assert_eq!(limit.current, limit.maximum);
    }
}
