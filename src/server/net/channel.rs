//! The handover's Unix stream socket: bytes, with descriptors beside
//! them (SCM_RIGHTS), blocking with a timeout so that neither side waits
//! for a peer that is gone. Descriptors sent with a chunk of bytes arrive
//! no later than its first byte, so a reader that takes one per record,
//! in order, takes the right one.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::protocol::handover::{FormatError, Record, HEAD_BYTES};

/// Descriptors sent with one chunk: the kernel takes at most 253
/// (`SCM_MAX_FD`) in one message.
pub(crate) const FDS_PER_CHUNK: usize = 250;

/// One end of the handover's socket.
#[derive(Debug)]
pub(crate) struct Channel {
    stream: UnixStream,
    /// Bytes received and not read yet, from `at`.
    received: Vec<u8>,
    at: usize,
    /// Descriptors received and not taken yet, in order.
    fds: VecDeque<OwnedFd>,
}

impl Channel {
    /// The channel on `socket` (a Unix stream socket), whose reads and
    /// writes give up after `timeout`.
    pub(crate) fn new(socket: OwnedFd, timeout: Duration) -> io::Result<Channel> {
        let stream = UnixStream::from(socket);
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Channel {
            stream,
            received: Vec::new(),
            at: 0,
            fds: VecDeque::new(),
        })
    }

    /// Sends `bytes` with `fds` (at most [`FDS_PER_CHUNK`]) beside their
    /// first byte.
    pub(crate) fn send(&mut self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let mut space =
            [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_CHUNK))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(io::Error::other("too many descriptors in one chunk"));
        }
        let sent = loop {
            match sendmsg(
                &self.stream,
                &[IoSlice::new(bytes)],
                &mut control,
                SendFlags::NOSIGNAL,
            ) {
                Ok(n) => break n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        self.stream.write_all(&bytes[sent..])
    }

    /// Reads more: bytes, and the descriptors that came with them.
    fn fill(&mut self) -> io::Result<()> {
        if self.at == self.received.len() {
            self.received.clear();
            self.at = 0;
        }
        let mut chunk = [0u8; 64 * 1024];
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(253))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = loop {
            match recvmsg(
                &self.stream,
                &mut [IoSliceMut::new(&mut chunk)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(got) => break got,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = message {
                self.fds.extend(fds);
            }
        }
        if got.bytes == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.received.extend_from_slice(&chunk[..got.bytes]);
        Ok(())
    }

    /// Makes reads give up after `timeout`.
    pub(crate) fn set_read_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.stream.set_read_timeout(Some(timeout))
    }

    /// Reads an ask or an answer.
    pub(crate) fn read_head(&mut self) -> io::Result<[u8; HEAD_BYTES]> {
        while self.received.len() - self.at < HEAD_BYTES {
            self.fill()?;
        }
        let head = self.received[self.at..self.at + HEAD_BYTES]
            .try_into()
            .unwrap();
        self.at += HEAD_BYTES;
        Ok(head)
    }

    /// Reads the next record.
    pub(crate) fn read_record(&mut self) -> io::Result<Record> {
        loop {
            match Record::decode(&self.received[self.at..]) {
                Ok(Some((record, used))) => {
                    self.at += used;
                    return Ok(record);
                }
                Ok(None) => self.fill()?,
                Err(e) => return Err(invalid(e)),
            }
        }
    }

    /// The next descriptor received, in order.
    pub(crate) fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }

    /// Writes `bytes` whole (an ask, an answer).
    pub(crate) fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }
}

/// Makes the socket a successor takes the connections over on (see
/// [`Server::take_over`](crate::Server::take_over)): one end of a new
/// pair goes, over `control`, to the server that watches it (see
/// [`Server::hand_over_on`](crate::Server::hand_over_on)); the other is
/// returned, for the successor.
pub fn introduce_successor(control: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let (theirs, ours) = UnixStream::pair()?;
    let fds = [std::os::fd::AsFd::as_fd(&theirs)];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    ancillary.push(SendAncillaryMessage::ScmRights(&fds));
    loop {
        match sendmsg(
            control,
            &[IoSlice::new(b"S")],
            &mut ancillary,
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        ) {
            Ok(1) => return Ok(ours.into()),
            Ok(_) => return Err(io::ErrorKind::WriteZero.into()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The successors' sockets that arrived on `control` (see
/// [`introduce_successor`]), without waiting; `None` once its other end
/// is closed.
pub(crate) fn arrived(control: BorrowedFd<'_>) -> io::Result<Option<Vec<OwnedFd>>> {
    let mut sockets = Vec::new();
    loop {
        let mut byte = [0u8; 16];
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(16))];
        let mut ancillary = RecvAncillaryBuffer::new(&mut space);
        let got = match recvmsg(
            control,
            &mut [IoSliceMut::new(&mut byte)],
            &mut ancillary,
            RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(got) => got,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) => return Ok(Some(sockets)),
            Err(e) => return Err(e.into()),
        };
        for message in ancillary.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = message {
                sockets.extend(fds);
            }
        }
        if got.bytes == 0 {
            return Ok(None);
        }
    }
}

/// Makes `socket` non-blocking.
pub(crate) fn set_nonblocking(socket: &OwnedFd) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(socket)?;
    rustix::fs::fcntl_setfl(socket, flags | rustix::fs::OFlags::NONBLOCK)?;
    Ok(())
}

/// A format error as an I/O error.
pub(crate) fn invalid(e: FormatError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;

    #[test]
    fn descriptors_arrive_in_order_with_their_records() {
        let (a, b) = UnixStream::pair().unwrap();
        let timeout = Duration::from_secs(5);
        let mut giver = Channel::new(a.into(), timeout).unwrap();
        let mut taker = Channel::new(b.into(), timeout).unwrap();
        // 600 pipes' read ends, in chunks of 250, each after its record.
        let pipes: Vec<(OwnedFd, std::io::PipeWriter)> = (0..600)
            .map(|_| std::io::pipe().map(|(r, w)| (r.into(), w)).unwrap())
            .collect();
        let writer = std::thread::spawn(move || {
            for chunk in pipes.chunks(FDS_PER_CHUNK) {
                let mut bytes = Vec::new();
                for _ in chunk {
                    Record::End { count: 0 }.encode(&mut bytes);
                }
                let fds: Vec<_> = chunk.iter().map(|(r, _)| r.as_fd()).collect();
                giver.send(&bytes, &fds).unwrap();
            }
            pipes.into_iter().map(|(_, w)| w).collect::<Vec<_>>()
        });
        let mut read_ends = Vec::new();
        for _ in 0..600 {
            assert_eq!(taker.read_record().unwrap(), Record::End { count: 0 });
            read_ends.push(taker.take_fd().expect("its descriptor"));
        }
        let write_ends = writer.join().unwrap();
        // Each read end is the one its pipe's write end writes to.
        for (i, (r, mut w)) in read_ends.into_iter().zip(write_ends).enumerate() {
            w.write_all(&(i as u32).to_le_bytes()).unwrap();
            let mut got = [0u8; 4];
            std::fs::File::from(r).read_exact(&mut got).unwrap();
            assert_eq!(u32::from_le_bytes(got), i as u32);
        }
        assert!(taker.read_record().is_err(), "the giver's end was dropped");
    }
}
