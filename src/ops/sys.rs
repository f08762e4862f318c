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
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{fstat, ftruncate, memfd_create, MemfdFlags};
use rustix::io::{fcntl_setfd, FdFlags};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

// What only the binary, the bench and the tests call (see `internals`).
#[cfg(feature = "internals")]
use {
    rustix::process::{
        getrlimit, set_parent_process_death_signal, setrlimit, Resource, Rlimit, Signal,
    },
    std::os::unix::process::CommandExt,
    std::process::Command,
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
#[cfg(feature = "internals")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentDeath {
    /// SIGINT: it shuts down cleanly and at once, without a drain (a
    /// supervisor's instances: they let go of the port, so that a new
    /// supervisor can take it).
    Interrupt,
    /// SIGKILL: it ends at once (a benchmark's server and workers).
    Kill,
}

/// Makes the process `command` starts receive `signal` when its parent
/// dies (`PR_SET_PDEATHSIG`, kept across `exec`): no orphans if the parent
/// is killed.
#[cfg(feature = "internals")]
pub fn die_with_parent(command: &mut Command, signal: ParentDeath) {
    let signal = match signal {
        ParentDeath::Interrupt => Signal::INT,
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
#[cfg(feature = "internals")]
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

/// Whether processes this one starts inherit descriptor `fd`: with
/// `inherit`, its close-on-exec flag is cleared (set it again once the
/// child that is to have it is started).
#[cfg(feature = "internals")]
pub fn set_inheritable(fd: BorrowedFd<'_>, inherit: bool) -> io::Result<()> {
    keep_across_exec(fd, inherit)
}

/// Steers the new connections of the `SO_REUSEPORT` group that listener
/// `fd` is in to the members at positions `to` (the order the group's
/// sockets began listening in), by the connection's hash: a classic BPF
/// program (`SO_ATTACH_REUSEPORT_CBPF`) replacing any before it. With
/// `to` empty, or for a packet without a hash, the kernel picks among all
/// members, as without a program.
#[cfg(feature = "internals")]
pub fn steer_reuseport(fd: BorrowedFd<'_>, to: &[u32]) -> io::Result<()> {
    let program = steering_program(to);
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `program`, which outlives the call; the
    // kernel copies the program in and checks it; `fd` is an open socket
    // (borrowed), and the option's length is that of `fprog`.
    let set = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The classic BPF program of [`steer_reuseport`]: `A = hash; if A == 0:
/// out of range; A %= len(to); return to[A]` (a chain of comparisons).
/// An index out of range makes the kernel fall back to its own pick.
#[cfg(feature = "internals")]
fn steering_program(to: &[u32]) -> Vec<libc::sock_filter> {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const MOD_K: u16 = 0x94;
    const RET_K: u16 = 0x06;
    const OUT_OF_RANGE: u32 = u32::MAX;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let Some((last, first)) = to.split_last() else {
        return vec![op(RET_K, 0, 0, OUT_OF_RANGE)];
    };
    let hash = (libc::SKF_AD_OFF + libc::SKF_AD_RXHASH) as u32;
    let mut program = vec![
        op(LD_W_ABS, 0, 0, hash),
        op(JEQ_K, 0, 1, 0),
        op(RET_K, 0, 0, OUT_OF_RANGE),
        op(MOD_K, 0, 0, to.len() as u32),
    ];
    for (i, &member) in first.iter().enumerate() {
        program.push(op(JEQ_K, 0, 1, i as u32));
        program.push(op(RET_K, 0, 0, member));
    }
    program.push(op(RET_K, 0, 0, *last));
    program
}

/// Takes ownership of descriptor `fd`, inherited from the parent process
/// (which named it), if it is open: the binary's, for the history its
/// supervisor shares.
#[cfg(feature = "internals")]
pub fn inherited_fd(fd: i32) -> io::Result<OwnedFd> {
    own_open_fd(fd)
}

/// Takes ownership of descriptor `fd`, which another image of this
/// process, or its parent, named for it to own, if it is open.
fn own_open_fd(fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(F_GETFD) only reads the descriptor table; it fails
    // with EBADF for a number that is not open.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("descriptor {fd} is not open"),
        ));
    }
    // SAFETY: the descriptor is open (checked) and was handed to this
    // process for it to own; nothing else in the process uses its number
    // (the caller takes each named number once, at start).
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Replaces this process's image with `program` (`argv`, `env`), with
/// `held` signals blocked: one that comes during the exec stays pending
/// (where the new image's default action could end it) until the new
/// image handles them and calls [`release_signals`]. Returns only on
/// failure, with the signals as they were.
#[cfg(feature = "internals")]
pub fn exec_holding_signals(
    program: &std::ffi::CStr,
    argv: &[std::ffi::CString],
    env: &[std::ffi::CString],
    held: &[i32],
) -> io::Error {
    let pointers = |strings: &[std::ffi::CString]| -> Vec<*const libc::c_char> {
        (strings.iter().map(|s| s.as_ptr()))
            .chain([std::ptr::null()])
            .collect()
    };
    let (argv, env) = (pointers(argv), pointers(env));
    let mut before = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    if let Err(e) = mask_signals(libc::SIG_BLOCK, held, before.as_mut_ptr()) {
        return e;
    }
    // SAFETY: `program` and every string pointed to are NUL-terminated
    // and outlive the call; both arrays end with a null pointer. On
    // success nothing of this process runs on; on failure it returns.
    unsafe { libc::execve(program.as_ptr(), argv.as_ptr(), env.as_ptr()) };
    let failed = io::Error::last_os_error();
    // SAFETY: `before` was filled by the successful mask change above.
    let before = unsafe { before.assume_init() };
    // SAFETY: `before` is a valid set; the old mask is not asked for.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut()) };
    failed
}

/// Blocks `signals` for this thread (and the threads it starts from now
/// on, which inherit its mask): they stay pending until a thread takes
/// them (see [`release_signals`]).
#[cfg(feature = "internals")]
pub fn hold_signals(signals: &[i32]) -> io::Result<()> {
    mask_signals(libc::SIG_BLOCK, signals, std::ptr::null_mut())
}

/// Makes `signal` pending for this thread, which holds it (see
/// [`hold_signals`]): it survives an exec, and the next image takes it.
#[cfg(feature = "internals")]
pub fn raise_held(signal: i32) -> io::Result<()> {
    // SAFETY: pthread_kill on this very thread with a valid signal number;
    // the signal is blocked here, so it only becomes pending.
    match unsafe { libc::pthread_kill(libc::pthread_self(), signal) } {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// Unblocks `signals` for this thread (those an earlier image held across
/// its exec, see [`exec_holding_signals`]): any that came meanwhile is
/// delivered now, to the handlers set before.
#[cfg(feature = "internals")]
pub fn release_signals(signals: &[i32]) -> io::Result<()> {
    mask_signals(libc::SIG_UNBLOCK, signals, std::ptr::null_mut())
}

/// Changes this thread's signal mask by `how` for `signals`, saving the
/// mask before in `before` unless it is null.
#[cfg(feature = "internals")]
fn mask_signals(how: libc::c_int, signals: &[i32], before: *mut libc::sigset_t) -> io::Result<()> {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set it is given, and sigaddset
    // adds to the set initialised so.
    let set = unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for &signal in signals {
            libc::sigaddset(set.as_mut_ptr(), signal);
        }
        set.assume_init()
    };
    // SAFETY: `set` is initialised; `before` is null or points to a set
    // the caller owns.
    match unsafe { libc::pthread_sigmask(how, &set, before) } {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// A new memory file holding `bytes`, read from its start: state a
/// process hands its next image.
pub fn memory_file(name: &str, bytes: &[u8]) -> io::Result<OwnedFd> {
    use std::io::{Seek, Write};
    let mut file = std::fs::File::from(memfd_create(name, MemfdFlags::CLOEXEC)?);
    file.write_all(bytes)?;
    file.rewind()?;
    Ok(file.into())
}

/// Keeps descriptor `fd` open across an exec (`keep`), or closes it
/// there (the default of every descriptor this process opens).
pub fn keep_across_exec(fd: BorrowedFd<'_>, keep: bool) -> io::Result<()> {
    let flags = match keep {
        true => FdFlags::empty(),
        false => FdFlags::CLOEXEC,
    };
    fcntl_setfd(fd, flags)?;
    Ok(())
}

/// Takes ownership of descriptor `fd`, kept open across an exec by this
/// process's earlier image (which named it), if it is open; closed
/// across the next exec again.
pub fn adopt_fd(fd: i32) -> io::Result<OwnedFd> {
    let fd = own_open_fd(fd)?;
    keep_across_exec(fd.as_fd(), false)?;
    Ok(fd)
}

/// The host's monotonic clock (`CLOCK_MONOTONIC`, which `Instant` reads
/// too), in nanoseconds: a time every process of the host can compare.
/// glibc's `clock_gettime` rather than rustix's: rustix parses the vDSO
/// itself and crashes under valgrind, where glibc falls back to the
/// system call.
pub fn monotonic_nanos() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a live, exclusive `timespec` for the duration of
    // the call, which only writes it; CLOCK_MONOTONIC always exists on
    // Linux, so the call cannot fail.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now);
    }
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Memory shared between processes, as this process may only read it: a
/// memory file (`memfd`) mapped read-only into a process it was handed to
/// (by descriptor: see [`SharedView::inheritable`]), or the read side of
/// a [`SharedMemory`]. The one who writes publishes through atomic words;
/// readers load those words and copy bytes out, then check the words
/// again (a seqlock), since the bytes may change under them. Nothing here
/// stores: a read-only mapping hands out no reference a store could go
/// through.
///
/// ```compile_fail
/// # use std::sync::atomic::Ordering;
/// # fn store(view: &wspush::sys::SharedView) {
/// view.word(0).store(1, Ordering::Relaxed); // No `word` on a view.
/// # }
/// ```
#[derive(Debug)]
pub struct SharedView {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

/// Memory shared between processes that this process writes: a memory
/// file it made, or one another process made for every process of the
/// host to update ([`SharedMemory::open`]). It reads as a [`SharedView`]
/// too.
#[derive(Debug)]
pub struct SharedMemory(SharedView);

// SAFETY: the mapping is plain memory owned by this value (unmapped on
// drop); it holds no thread-bound state, and every access goes through
// the methods below, whose copies and atomics are fine from any thread.
unsafe impl Send for SharedView {}

impl SharedView {
    /// Maps a memory file another process made, read-only.
    pub fn open(fd: OwnedFd) -> io::Result<SharedView> {
        let len = usize::try_from(fstat(&fd)?.st_size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a negative size"))?;
        SharedView::map(fd, 0, len, false)
    }

    fn map(fd: OwnedFd, offset: usize, len: usize, writable: bool) -> io::Result<SharedView> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty memory file",
            ));
        }
        let prot = match writable {
            true => ProtFlags::READ | ProtFlags::WRITE,
            false => ProtFlags::READ,
        };
        let offset = offset as u64;
        // SAFETY: a new mapping at an address the kernel picks (the kernel
        // refuses an offset not page-aligned), of a file this value keeps
        // open; it aliases no Rust object, and it is unmapped only in
        // `drop`.
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                prot,
                MapFlags::SHARED,
                &fd,
                offset,
            )?
        };
        let ptr = NonNull::new(ptr.cast()).ok_or_else(io::Error::last_os_error)?;
        Ok(SharedView { ptr, len, fd })
    }

    /// Lets processes this one starts inherit the descriptor (cleared
    /// close-on-exec), and returns it, to be named to them.
    pub fn inheritable(&self) -> io::Result<BorrowedFd<'_>> {
        fcntl_setfd(&self.fd, FdFlags::empty())?;
        Ok(self.fd.as_fd())
    }

    /// Its descriptor, as it is (close-on-exec set).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Its size, in bytes.
    pub fn size(&self) -> usize {
        self.len
    }

    /// The 64-bit word at `offset` (a multiple of 8, inside).
    fn atomic(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset + 8 <= self.len,
            "bug: word {offset} of {}",
            self.len
        );
        // SAFETY: in bounds and aligned (the mapping is page-aligned), and
        // only ever accessed as an `AtomicU64` by every process sharing it,
        // so no non-atomic access races with it. It lives as long as the
        // borrow of `self`, which keeps the mapping. A store through it
        // needs a writable mapping: only [`SharedMemory::word`] hands it out.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// Loads the 64-bit word at `offset` (a multiple of 8, inside).
    pub fn load(&self, offset: usize, order: Ordering) -> u64 {
        self.atomic(offset).load(order)
    }

    /// Copies the bytes at `offset` into `out` (they may be changing: the
    /// caller checks the writer's words afterwards).
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset
                .checked_add(out.len())
                .is_some_and(|end| end <= self.len),
            "bug: read past the end"
        );
        // SAFETY: in bounds (checked); `out` is a distinct, exclusive
        // buffer. The source may be written meanwhile by another process
        // (the seqlock's readers discard such a copy), so it is copied with
        // volatile byte reads: no reference to it is ever formed.
        unsafe {
            let from = self.ptr.as_ptr().add(offset);
            for (i, byte) in out.iter_mut().enumerate() {
                *byte = std::ptr::read_volatile(from.add(i));
            }
        }
    }
}

impl Drop for SharedView {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of this length, unmapped once;
        // no borrow of it outlives `self`.
        if let Err(e) = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) } {
            log::warn!("unmapping shared memory failed: {e}");
        }
    }
}

impl SharedMemory {
    /// A new memory file of `len` bytes (zeroed), mapped read-write.
    pub fn create(name: &str, len: usize) -> io::Result<SharedMemory> {
        let fd = memfd_create(name, MemfdFlags::CLOEXEC)?;
        ftruncate(&fd, len as u64)?;
        SharedView::map(fd, 0, len, true).map(SharedMemory)
    }

    /// Maps a memory file another process made for every process of the
    /// host to update, read-write, whole.
    pub fn open(fd: OwnedFd) -> io::Result<SharedMemory> {
        let len = usize::try_from(fstat(&fd)?.st_size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a negative size"))?;
        SharedView::map(fd, 0, len, true).map(SharedMemory)
    }

    /// The 64-bit word at `offset` (a multiple of 8, inside), for atomic
    /// access, stores included.
    pub fn word(&self, offset: usize) -> &AtomicU64 {
        self.0.atomic(offset)
    }

    /// Writes `bytes` at `offset`.
    pub fn write(&self, offset: usize, bytes: &[u8]) {
        let view = &self.0;
        assert!(
            offset
                .checked_add(bytes.len())
                .is_some_and(|end| end <= view.len),
            "bug: write past the end"
        );
        // SAFETY: in bounds (checked) of a writable mapping (a
        // `SharedMemory` is only ever made writable); `bytes` is a
        // distinct buffer. Readers in other processes copy with volatile
        // reads and check the writer's words after, so a concurrent copy
        // is discarded, never trusted.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                view.ptr.as_ptr().add(offset),
                bytes.len(),
            );
        }
    }
}

impl std::ops::Deref for SharedMemory {
    type Target = SharedView;

    fn deref(&self) -> &SharedView {
        &self.0
    }
}

/// Types that may lie in memory shared between processes: `repr(C)`
/// structures of `AtomicU64` words only (nested such structures and
/// arrays of them included), with no padding, for which every bit
/// pattern is a value. See [`Placed`].
///
/// # Safety
///
/// An implementer must be exactly that: another process may write any
/// bits into it at any time, always through atomics.
pub unsafe trait AtomicWords {}

// SAFETY: `Counters` and every structure in it (`Metrics`, made by the
// `metrics!` macro; `LoopHistogram`; `Latency`) are `repr(C)` and hold
// `AtomicU64` fields or arrays of them only (`metrics` checks their size
// is their words').
unsafe impl AtomicWords for crate::ops::metrics::Counters {}

/// A `T` that lies in shared memory this process writes, at an offset
/// (for a process's counters in its host's metrics board, where the
/// other processes of the host read them as they change). It keeps the
/// mapping.
#[derive(Debug)]
pub struct Placed<T: AtomicWords> {
    mem: SharedMemory,
    offset: usize,
    _words: std::marker::PhantomData<T>,
}

// SAFETY: a `Placed` hands out only `&T`, atomics only (`AtomicWords`),
// which any thread may use at once; the mapping it owns is plain memory.
unsafe impl<T: AtomicWords> Sync for Placed<T> {}

impl<T: AtomicWords> Placed<T> {
    /// The `T` at `offset` (a multiple of 8) of `mem`; an error if it does
    /// not fit.
    pub fn new(mem: SharedMemory, offset: usize) -> io::Result<Placed<T>> {
        let fits = offset.is_multiple_of(8)
            && std::mem::align_of::<T>() <= 8
            && offset
                .checked_add(std::mem::size_of::<T>())
                .is_some_and(|end| end <= mem.size());
        match fits {
            true => Ok(Placed {
                mem,
                offset,
                _words: std::marker::PhantomData,
            }),
            false => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "counters that do not fit their place in shared memory",
            )),
        }
    }
}

impl<T: AtomicWords> std::ops::Deref for Placed<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: in bounds and aligned (checked in `new`; the mapping is
        // page-aligned), of a writable mapping that lives as long as
        // `self`. `T` is atomic words only (`AtomicWords`): any bits
        // another process wrote are a value, and every process accesses
        // them only atomically, so nothing races non-atomically.
        unsafe { &*self.mem.0.ptr.as_ptr().add(self.offset).cast::<T>() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many of `count` connections to `listeners[0]`'s port each of
    /// `listeners` takes.
    fn spread(listeners: &[std::net::TcpListener], count: usize) -> Vec<usize> {
        let addr = listeners[0].local_addr().unwrap();
        let _clients: Vec<_> = (0..count)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        listeners
            .iter()
            .map(|listener| {
                listener.set_nonblocking(true).unwrap();
                std::iter::from_fn(|| listener.accept().ok()).count()
            })
            .collect()
    }

    #[test]
    #[cfg(feature = "internals")]
    fn steering_sends_new_connections_to_the_members_named_only() {
        let bind = |addr: &str| {
            let socket =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            socket.set_reuse_port(true).unwrap();
            socket
                .bind(&addr.parse::<std::net::SocketAddr>().unwrap().into())
                .unwrap();
            socket.listen(128).unwrap();
            std::net::TcpListener::from(socket)
        };
        let first = bind("127.0.0.1:0");
        let addr = first.local_addr().unwrap().to_string();
        let listeners = [first, bind(&addr), bind(&addr)];
        let group = listeners[0].as_fd();
        steer_reuseport(group, &[1]).unwrap();
        assert_eq!(spread(&listeners, 30), [0, 30, 0]);
        steer_reuseport(group, &[0, 2]).unwrap();
        let [a, b, c] = spread(&listeners, 60)[..] else {
            unreachable!()
        };
        assert_eq!((a + c, b), (60, 0));
        assert!(a > 0 && c > 0, "by the connection's hash: {a} and {c}");
        // Nobody named: the kernel's own pick, over all three.
        steer_reuseport(group, &[]).unwrap();
        assert!(spread(&listeners, 60).iter().all(|&n| n > 0));
        assert_eq!(steering_program(&[4, 5, 6]).len(), 2 * 3 + 3);
    }

    #[test]
    fn raising_the_open_file_limit_is_idempotent_and_reaches_the_hard_limit() {
        let first = raise_open_file_limit().unwrap();
        assert_eq!(raise_open_file_limit().unwrap(), first);
        let limit = getrlimit(Resource::Nofile);
        assert_eq!(limit.current, limit.maximum);
    }

    #[test]
    fn shared_memory_written_here_is_read_through_another_mapping() {
        let mine = SharedMemory::create("wspush-test", 8192).unwrap();
        let theirs = SharedView::open(mine.fd.try_clone().unwrap()).unwrap();
        assert_eq!(theirs.size(), 8192);
        mine.write(100, b"hello");
        mine.word(8).store(42, Ordering::Release);
        let mut out = [0u8; 5];
        theirs.read(100, &mut out);
        assert_eq!((&out, theirs.load(8, Ordering::Acquire)), (b"hello", 42));
        assert!(theirs.inheritable().is_ok());
        // Opened writable by another, it is written where this one reads.
        let other = SharedMemory::open(mine.fd.try_clone().unwrap()).unwrap();
        other.word(4096 + 16).store(7, Ordering::Release);
        assert_eq!(mine.load(4096 + 16, Ordering::Acquire), 7);
    }
}

/// A thread at the highest priority it may take, set back on drop: a
/// loop while a handover pauses its connections (and a new process
/// until it took them over). On a busy host (64 instances fanning out a broadcast on
/// two cores) the handover's work would otherwise get a sixty-fourth of
/// the machine, and its pause grow from tens of milliseconds to seconds.
/// Without the privilege (`CAP_SYS_NICE`), nothing changes.
#[derive(Debug)]
pub struct Urgent {
    /// The thread (`None`: the calling one), and its priority before.
    raised: Option<(Option<rustix::process::Pid>, i32)>,
}

impl Urgent {
    /// Raises the calling thread's priority (nice -20).
    pub fn raise() -> Urgent {
        Urgent::raise_thread(None)
    }

    /// Raises the priority of process `pid`'s main thread (its loop's,
    /// for an instance), from another process.
    #[cfg(feature = "internals")]
    pub fn raise_process(pid: u32) -> Urgent {
        let pid = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        match pid {
            Some(pid) => Urgent::raise_thread(Some(pid)),
            None => Urgent { raised: None },
        }
    }

    /// Raises `pid`'s (`None`: the calling) thread to nice -20. One
    /// already there is left as it is, with nothing to set back: whoever
    /// raised it sets it back (the supervisor raises an instance's loop
    /// before that loop raises itself, and may set it back first).
    fn raise_thread(pid: Option<rustix::process::Pid>) -> Urgent {
        use rustix::process::{getpriority_process, setpriority_process};
        let raised = match getpriority_process(pid) {
            Ok(before) if before > URGENT && setpriority_process(pid, URGENT).is_ok() => {
                Some((pid, before))
            }
            _ => None,
        };
        Urgent { raised }
    }

    /// Sets nothing back: the thread is gone (its process was reaped, and
    /// its id may be another's).
    #[cfg(feature = "internals")]
    pub fn forget(mut self) {
        self.raised = None;
    }
}

/// The nice value [`Urgent`] raises a thread to.
const URGENT: i32 = -20;

impl Drop for Urgent {
    fn drop(&mut self) {
        if let Some((pid, before)) = self.raised {
            let _ = rustix::process::setpriority_process(pid, before);
        }
    }
}
