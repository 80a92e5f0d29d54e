//! What waits to go to one client, in order: bytes, and ranges of stored body files.
//!
//! A response head is bytes; a stored body is a range of a file, read only as the
//! socket takes it, so a multi-GB object costs one chunk of memory, never its size. The
//! outbox knows nothing of TLS: it hands plaintext to a `Sink`, which encrypts or not.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// Where plaintext goes: a plain socket, or a TLS session over one.
pub trait Sink {
    /// Bytes of a body file sent per step: by default a few TLS records, one pread.
    const FILE_CHUNK: usize = 64 * 1024;

    /// Send what was accepted earlier and still waits; true once nothing waits.
    fn flush(&mut self) -> io::Result<bool>;

    /// Accept up to `data.len()` bytes; `WouldBlock` when none can be taken now. What
    /// is accepted may wait for `flush`, so that a head and its body leave together.
    fn send(&mut self, data: &[u8]) -> io::Result<usize>;

    /// `send`, with more bytes queued right behind `data`: a plain socket holds a part
    /// of a segment back for them (MSG_MORE), so that a head leaves with the start of
    /// its body instead of in a segment of its own, which the client wakes for alone.
    fn send_with_more(&mut self, data: &[u8]) -> io::Result<usize> {
        self.send(data)
    }

    /// Send bytes [pos, pos + len) of the file `fd`; how many were taken.
    fn send_file(
        &mut self,
        fd: RawFd,
        pos: u64,
        len: usize,
        scratch: &mut Vec<u8>,
    ) -> io::Result<usize> {
        scratch.resize(len, 0);
        let read = pread_some(fd, &mut scratch[..len], pos)?;
        // A partial send leaves the rest to be read again: cheaper than keeping it.
        self.send(&scratch[..read])
    }
}

/// One pread; a file that ends before `pos + buf.len()` is an error: its index row
/// recorded a longer body, and the client must see a cut, never a short success.
pub fn pread_some(fd: RawFd, buf: &mut [u8], pos: u64) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), pos as libc::off_t) };
        if n > 0 {
            return Ok(n as usize);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "a body file is shorter than recorded",
            ));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

enum Item {
    Bytes {
        data: Vec<u8>,
        sent: usize,
    },
    /// A range of a file: a stored body, or a partial one that several clients follow
    /// (`push_shared`), one descriptor for all of its ranges.
    File {
        fd: Arc<OwnedFd>,
        pos: u64,
        end: u64,
    },
}

/// The queue of one connection's output.
#[derive(Default)]
pub struct Outbox {
    items: VecDeque<Item>,
    queued: u64,
    scratch: Vec<u8>,
}

impl Outbox {
    /// Bytes waiting, those of queued file ranges included.
    pub fn queued(&self) -> u64 {
        self.queued
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn push_bytes(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.queued += data.len() as u64;
        // Small writes after bytes still waiting join them: one record, one syscall.
        if let Some(Item::Bytes { data: last, .. }) = self.items.back_mut() {
            last.extend_from_slice(data);
            return;
        }
        self.items.push_back(Item::Bytes {
            data: data.to_vec(),
            sent: 0,
        });
    }

    /// Send `data` after whatever waits: when nothing does, `sink` takes what it can
    /// straight from `data`, and only the rest is copied into the queue (a body of a
    /// few hundred KiB is copied once less on its way to the socket).
    pub fn write<S: Sink>(&mut self, sink: &mut S, data: &[u8]) -> io::Result<()> {
        let mut sent = 0;
        if self.items.is_empty() {
            while sent < data.len() {
                match sink.send(&data[sent..]) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        self.push_bytes(&data[sent..]);
        Ok(())
    }

    /// Queue bytes [start, end) of `fd`, which the outbox owns from now on (closed
    /// once sent, or when the outbox is dropped).
    pub fn push_file(&mut self, fd: OwnedFd, start: u64, end: u64) {
        self.push_shared(&Arc::new(fd), start, end);
    }

    /// Queue bytes [start, end) of a file others read too; a range that goes on where
    /// the last one queued of the same file ends joins it.
    pub fn push_shared(&mut self, fd: &Arc<OwnedFd>, start: u64, end: u64) {
        if end <= start {
            return;
        }
        self.queued += end - start;
        if let Some(Item::File {
            fd: last,
            end: last_end,
            ..
        }) = self.items.back_mut()
        {
            if Arc::ptr_eq(last, fd) && *last_end == start {
                *last_end = end;
                return;
            }
        }
        self.items.push_back(Item::File {
            fd: Arc::clone(fd),
            pos: start,
            end,
        });
    }

    /// Drop everything queued (an aborted connection).
    pub fn clear(&mut self) {
        self.items.clear();
        self.queued = 0;
    }

    /// Send as much as `sink` takes now; true once everything went out.
    pub fn pump<S: Sink>(&mut self, sink: &mut S) -> io::Result<bool> {
        // Whatever the sink still holds leaves before what is sent now, and with it,
        // in one system call (a TLS session's tickets with the response they waited for).
        loop {
            let queued_behind = self.items.len() > 1;
            let Some(front) = self.items.front_mut() else {
                return sink.flush();
            };
            let (taken, done) = match front {
                Item::Bytes { data, sent } => {
                    let rest = &data[*sent..];
                    let taken = if queued_behind {
                        sink.send_with_more(rest)
                    } else {
                        sink.send(rest)
                    };
                    match taken {
                        Ok(n) => {
                            *sent += n;
                            (n, *sent == data.len())
                        }
                        Err(e) => return would_block(e),
                    }
                }
                Item::File { fd, pos, end } => {
                    let len = (*end - *pos).min(S::FILE_CHUNK as u64) as usize;
                    match sink.send_file(fd.as_raw_fd(), *pos, len, &mut self.scratch) {
                        Ok(n) => {
                            *pos += n as u64;
                            (n, *pos == *end)
                        }
                        Err(e) => return would_block(e),
                    }
                }
            };
            self.queued -= taken as u64;
            if done {
                self.items.pop_front();
            }
        }
    }
}

fn would_block(e: io::Error) -> io::Result<bool> {
    if e.kind() == io::ErrorKind::WouldBlock {
        Ok(false)
    } else {
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Write;

    /// Takes at most `room` bytes per call, then blocks until `room` is given again.
    struct Tight {
        got: Vec<u8>,
        room: usize,
        left: usize,
    }

    impl Sink for Tight {
        fn flush(&mut self) -> io::Result<bool> {
            Ok(true)
        }
        fn send(&mut self, data: &[u8]) -> io::Result<usize> {
            if self.left == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = data.len().min(self.room).min(self.left);
            self.left -= n;
            self.got.extend_from_slice(&data[..n]);
            Ok(n)
        }
    }

    /// An open file holding `content`, already unlinked; `name` apart per test, which
    /// run in threads of one process.
    fn body_file(name: &str, content: &[u8]) -> OwnedFd {
        let path = std::env::temp_dir().join(format!("outbox-{name}-{}", std::process::id()));
        let mut file = File::create(&path).unwrap();
        file.write_all(content).unwrap();
        let file = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file.into()
    }

    #[test]
    fn bytes_and_file_ranges_leave_in_order_whatever_the_socket_takes() {
        let content: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut outbox = Outbox::default();
        outbox.push_bytes(b"HEAD ");
        outbox.push_bytes(b"more ");
        outbox.push_file(body_file("order", &content), 10, 150_010);
        outbox.push_bytes(b" next");
        assert_eq!(outbox.queued(), 10 + 150_000 + 5);
        let mut sink = Tight {
            got: Vec::new(),
            room: 7_777,
            left: 0,
        };
        let mut rounds = 0;
        loop {
            sink.left = 20_000;
            if outbox.pump(&mut sink).unwrap() {
                break;
            }
            rounds += 1;
        }
        let mut wanted = b"HEAD more ".to_vec();
        wanted.extend_from_slice(&content[10..150_010]);
        wanted.extend_from_slice(b" next");
        assert_eq!(sink.got, wanted);
        assert!(rounds > 5, "the sink blocked along the way");
        assert_eq!(outbox.queued(), 0);
        assert!(outbox.is_empty());
    }

    /// Takes everything, and remembers which bytes were sent with more to come.
    #[derive(Default)]
    struct Recording {
        sends: Vec<(Vec<u8>, bool)>,
    }

    impl Sink for Recording {
        fn flush(&mut self) -> io::Result<bool> {
            Ok(true)
        }
        fn send(&mut self, data: &[u8]) -> io::Result<usize> {
            self.sends.push((data.to_vec(), false));
            Ok(data.len())
        }
        fn send_with_more(&mut self, data: &[u8]) -> io::Result<usize> {
            self.sends.push((data.to_vec(), true));
            Ok(data.len())
        }
    }

    #[test]
    fn bytes_with_more_queued_behind_them_are_sent_as_more_to_come() {
        let mut outbox = Outbox::default();
        outbox.push_bytes(b"HEAD ");
        outbox.push_file(body_file("more", b"body"), 0, 4);
        outbox.push_bytes(b" tail");
        let mut sink = Recording::default();
        assert!(outbox.pump(&mut sink).unwrap());
        let more: Vec<(&[u8], bool)> = sink.sends.iter().map(|(d, m)| (&d[..], *m)).collect();
        // The file goes through `send` too (the default `send_file` reads it).
        assert_eq!(
            more,
            [
                (&b"HEAD "[..], true),
                (&b"body"[..], false),
                (&b" tail"[..], false)
            ]
        );
    }

    #[test]
    fn bytes_go_straight_to_the_sink_only_while_nothing_waits() {
        let mut outbox = Outbox::default();
        let mut sink = Tight {
            got: Vec::new(),
            room: 1 << 20,
            left: 10,
        };
        outbox.write(&mut sink, b"0123456789abcdef").unwrap();
        assert_eq!(sink.got, b"0123456789");
        assert_eq!(outbox.queued(), 6);
        // Room again, but what waits goes first: the next bytes are queued behind it.
        sink.left = 1 << 20;
        outbox.write(&mut sink, b"XYZ").unwrap();
        assert_eq!(sink.got, b"0123456789");
        assert!(outbox.pump(&mut sink).unwrap());
        assert_eq!(sink.got, b"0123456789abcdefXYZ");
        outbox.write(&mut sink, b"!").unwrap();
        assert_eq!(sink.got, b"0123456789abcdefXYZ!");
        assert!(outbox.is_empty());
    }

    #[test]
    fn ranges_of_a_shared_file_that_follow_each_other_leave_as_one() {
        let content: Vec<u8> = (0..100_000u32).map(|i| (i % 241) as u8).collect();
        let file = Arc::new(body_file("shared", &content));
        let mut outbox = Outbox::default();
        outbox.push_bytes(b"HEAD ");
        outbox.push_shared(&file, 0, 30_000);
        outbox.push_shared(&file, 30_000, 60_000);
        outbox.push_shared(&file, 70_000, 100_000);
        assert_eq!(outbox.items.len(), 3, "the second range joined the first");
        assert_eq!(outbox.queued(), 5 + 90_000);
        let mut sink = Tight {
            got: Vec::new(),
            room: 9_999,
            left: usize::MAX,
        };
        assert!(outbox.pump(&mut sink).unwrap());
        let mut wanted = b"HEAD ".to_vec();
        wanted.extend_from_slice(&content[..60_000]);
        wanted.extend_from_slice(&content[70_000..]);
        assert_eq!(sink.got, wanted);
        assert_eq!(Arc::strong_count(&file), 1, "the outbox let go of the file");
    }

    #[test]
    fn a_file_shorter_than_its_range_is_an_error() {
        let mut outbox = Outbox::default();
        outbox.push_file(body_file("short", b"short"), 0, 100);
        let mut sink = Tight {
            got: Vec::new(),
            room: 1 << 20,
            left: 1 << 20,
        };
        let error = outbox.pump(&mut sink).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(sink.got, b"short");
    }
}
