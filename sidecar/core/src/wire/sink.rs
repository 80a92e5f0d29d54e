//! A socket as the outbox sees it: plain, or under a TLS session.

use std::io::{self, Read, Write};
use std::os::fd::RawFd;

use rustls::Connection;

use crate::wire::outbox::Sink;

/// Plaintext handed to the TLS session per send: four full records.
pub const TLS_BATCH: usize = 64 * 1024;

/// A non-blocking socket, read and written without SIGPIPE.
pub struct Socket(pub RawFd);

fn check(n: isize) -> io::Result<usize> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
        check(unsafe { libc::recv(self.0, buf.as_mut_ptr().cast(), buf.len(), 0) })
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for `buf.len()` bytes of reads.
        check(unsafe { libc::send(self.0, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) })
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        // The TLS session's queued records in one sendmsg.
        // SAFETY: IoSlice has the layout of iovec; msghdr is zeroed, then filled.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        message.msg_iovlen = bufs.len().min(libc::UIO_MAXIOV as usize) as _;
        check(unsafe { libc::sendmsg(self.0, &message, libc::MSG_NOSIGNAL) })
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Sink for Socket {
    /// The kernel copies a file to a plain socket itself, as much as the socket takes:
    /// one system call for most bodies (nginx's `sendfile_max_chunk` is the same).
    const FILE_CHUNK: usize = 2 * 1024 * 1024;

    fn flush(&mut self) -> io::Result<bool> {
        Ok(true)
    }

    fn send(&mut self, data: &[u8]) -> io::Result<usize> {
        self.write(data)
    }

    fn send_with_more(&mut self, data: &[u8]) -> io::Result<usize> {
        let flags = libc::MSG_NOSIGNAL | libc::MSG_MORE;
        // SAFETY: `data` is valid for `data.len()` bytes of reads.
        check(unsafe { libc::send(self.0, data.as_ptr().cast(), data.len(), flags) })
    }

    fn send_file(
        &mut self,
        fd: RawFd,
        pos: u64,
        len: usize,
        _scratch: &mut Vec<u8>,
    ) -> io::Result<usize> {
        // Without TLS the kernel copies the page cache to the socket itself.
        let mut offset = pos as libc::off_t;
        // SAFETY: both descriptors are open; `offset` is a valid pointer.
        let sent = check(unsafe { libc::sendfile(self.0, fd, &mut offset, len) })?;
        if sent == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "a body file is shorter than recorded",
            ));
        }
        Ok(sent)
    }
}

/// A socket under a TLS session (either side).
pub struct Tls<'a> {
    session: &'a mut Connection,
    socket: Socket,
    unsent: usize, // plaintext made into records since the last complete flush
}

impl<'a> Tls<'a> {
    pub fn new(session: &'a mut Connection, socket: Socket) -> Self {
        Self {
            session,
            socket,
            unsent: 0,
        }
    }

    pub fn session(&mut self) -> &mut Connection {
        self.session
    }
}

impl Sink for Tls<'_> {
    fn flush(&mut self) -> io::Result<bool> {
        while self.session.wants_write() {
            match self.session.write_tls(&mut self.socket) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        self.unsent = 0;
        Ok(true)
    }

    fn send(&mut self, data: &[u8]) -> io::Result<usize> {
        // Records wait until a batch of them is made, then leave in one sendmsg (a
        // head with its body); new ones are made only once those left, so the session
        // never holds much more than one batch of ciphertext.
        if self.unsent >= TLS_BATCH && !Sink::flush(self)? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let data = &data[..data.len().min(TLS_BATCH)];
        let mut taken = self.session.writer().write(data)?;
        if taken == 0 {
            // The session's own limit on ciphertext waiting (64 KiB) is reached.
            if !Sink::flush(self)? {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            taken = self.session.writer().write(data)?;
        }
        self.unsent += taken;
        Ok(taken)
    }
}
