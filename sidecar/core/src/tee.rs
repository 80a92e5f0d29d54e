//! A body on its way from the origin into the buffer: its digest taken as it arrives,
//! and sent on at once to the clients of the lean front end that follow it, each the
//! byte range it asked for. A small one (a miss stored from a worker's lease) is kept
//! whole in memory; a larger one is written into its partial file at each piece's
//! place (`Tee(size, fd)`), and its fill hears how far the file has come after each
//! piece (`on_progress`), for the readers that follow the file rather than the tee.
//!
//! The origin's stream feeds it (`Tee.take_body`) instead of handing each piece of
//! the body to Python; the clients' streams send what it gives them as any other bytes
//! (or, for a client that does not keep up with a larger body, as ranges of its file).
//! Python hears of the body's end (`message_complete`), takes its digest, and stores it.

use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::{PyTraverseError, PyVisit};

use crate::buffer::digest::{Digest, hex};
use crate::stream::{BodyTaker, Stream};

/// The body and its digest, apart from Python objects.
pub struct Body {
    /// Its bytes as they came, unless they came whole at once (`arrived_whole`): then
    /// whoever handed them keeps them.
    kept: Vec<u8>,
    received: usize,
    size: usize,
    digest: blake3::Hasher,
}

impl Body {
    pub fn new(size: usize) -> Self {
        Self {
            kept: Vec::new(),
            received: 0,
            size,
            digest: blake3::Hasher::new(),
        }
    }

    /// Keep the next bytes of the body; what lies past its announced size (which the
    /// framing of the origin's responses never lets through) is not kept. The range of
    /// the body they were.
    pub fn append(&mut self, data: &[u8]) -> Range<usize> {
        let arrived = self.pass(data);
        if !arrived.is_empty() && self.kept.capacity() == 0 {
            self.kept.reserve_exact(self.size);
        }
        self.kept.extend_from_slice(&data[..arrived.len()]);
        arrived
    }

    /// Take the digest of the next bytes of the body without keeping them (its file
    /// does), up to its announced size; the range of the body they were.
    pub fn pass(&mut self, data: &[u8]) -> Range<usize> {
        let start = self.received;
        let taken = &data[..data.len().min(self.size - start)];
        self.digest.update(taken);
        self.received += taken.len();
        start..self.received
    }

    /// Take the digest of `data` if it is the whole body, nothing of it having come
    /// before: true, and the caller keeps the bytes (they are not copied).
    pub fn arrived_whole(&mut self, data: &[u8]) -> bool {
        if self.received > 0 || data.len() != self.size {
            return false;
        }
        self.digest.update(data);
        self.received = self.size;
        true
    }

    /// The bytes kept, [0, received) of the body; empty when the caller keeps them.
    pub fn kept(&self) -> &[u8] {
        &self.kept
    }

    pub fn received(&self) -> usize {
        self.received
    }

    pub fn is_whole(&self) -> bool {
        self.received == self.size
    }

    /// The digest of the body (hex, `digest::hex`), once whole.
    pub fn hexdigest(&self) -> Option<String> {
        self.is_whole().then(|| hex(&self.digest))
    }

    /// The digest of the bytes received so far, which may be continued.
    pub fn digest_so_far(&self) -> blake3::Hasher {
        self.digest.clone()
    }
}

/// Write all of `data` at `pos` of the file `fd` (pwrite may write less than asked).
fn pwrite_all(fd: RawFd, mut data: &[u8], mut pos: u64) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: `data` is valid for `data.len()` bytes of reads.
        let n = unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), pos as libc::off_t) };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        data = &data[n as usize..];
        pos += n as u64;
    }
    Ok(())
}

/// Where a larger body goes: its partial file, and what its followers were offered.
struct Written {
    file: Arc<OwnedFd>,
    /// Followers have been offered bytes [0, published) of the body.
    published: usize,
    /// Followers get no byte at or past it until Python publishes it (`publish`): the
    /// fill holds the last byte back until its commit begins.
    cap: usize,
    /// The tee writes no byte at or past it: the end of the body's first segment once
    /// its fill split the rest over other connections (`stop_at`).
    stop: usize,
    /// Why the file could not be written; the tee writes nothing more.
    error: Option<String>,
    /// Told how many bytes the tee has written, after each piece (and once when the
    /// file fails: `error`).
    on_progress: Option<Py<PyAny>>,
}

/// The part of `arrived` (bytes of the body) that a client asking for `wanted` gets:
/// always inside `arrived`, empty at its start when there is none.
pub fn overlap(wanted: &Range<usize>, arrived: &Range<usize>) -> Range<usize> {
    let start = wanted.start.max(arrived.start);
    let end = wanted.end.min(arrived.end);
    if start < end {
        start..end
    } else {
        arrived.start..arrived.start
    }
}

/// A client connection that follows the body, and the bytes it still waits for.
struct Follower {
    stream: Py<Stream>,
    wanted: Range<usize>,
}

#[pyclass(module = "sidecar.core.native")]
pub struct Tee {
    body: Body,
    /// The whole body, when it came at once as these bytes (`write`): kept as they are.
    whole: Option<Py<PyBytes>>,
    /// A larger body's file; None: the body is kept in memory.
    written: Option<Written>,
    followers: Vec<Follower>,
}

/// A follower's stream, and the part of the body to send it.
type Part = (Py<Stream>, Range<usize>);

impl Tee {
    /// `feed`, for the stream that takes the body (`take_body`).
    fn feed_any(tee: &Bound<'_, PyAny>, data: &[u8]) -> PyResult<()> {
        Self::feed(tee.cast::<Self>()?, data)
    }

    /// Take the next bytes of the body, and send every follower its part of them.
    fn feed(slf: &Bound<'_, Self>, data: &[u8]) -> PyResult<()> {
        if slf.borrow().written.is_some() {
            return Self::write_piece(slf, data);
        }
        let arrived = slf.borrow_mut().body.append(data);
        Self::send_on(slf, data, arrived)
    }

    /// Send every follower its part of `data`, which are bytes `arrived` of a body kept
    /// in memory.
    fn send_on(slf: &Bound<'_, Self>, data: &[u8], arrived: Range<usize>) -> PyResult<()> {
        let py = slf.py();
        let sends = {
            let mut tee = slf.borrow_mut();
            let received = tee.body.received();
            tee.sends(py, &arrived, received)
        };
        // The tee is not borrowed while a stream tells its protocol what happened.
        for (stream, part) in sends {
            let offset = arrived.start;
            Stream::send_parts(
                stream.bind(py),
                &[&data[part.start - offset..part.end - offset]],
            )?;
        }
        Ok(())
    }

    /// Write the next bytes of a larger body into its file, send followers what may be
    /// published of them, and tell the fill how far the file has come.
    fn write_piece(slf: &Bound<'_, Self>, data: &[u8]) -> PyResult<()> {
        let py = slf.py();
        let (sends, file, start, told) = {
            let mut guard = slf.borrow_mut();
            let tee = &mut *guard;
            let Some(written) = tee.written.as_mut() else {
                return Ok(());
            };
            let start = tee.body.received();
            let take = data.len().min(written.stop.saturating_sub(start));
            if take == 0 || written.error.is_some() {
                return Ok(());
            }
            let told = written.on_progress.as_ref().map(|told| told.clone_ref(py));
            let file = Arc::clone(&written.file);
            if let Err(error) = pwrite_all(file.as_raw_fd(), &data[..take], start as u64) {
                written.error = Some(error.to_string());
                (Vec::new(), file, start, told)
            } else {
                tee.body.pass(&data[..take]);
                let upto = tee.body.received().min(written.cap);
                let offered = written.published..upto.max(written.published);
                written.published = offered.end;
                (tee.sends(py, &offered, offered.end), file, start, told)
            }
        };
        for (stream, part) in sends {
            // Every byte offered is in this piece: what came before it was offered then.
            let piece = &data[part.start - start..part.end - start];
            Stream::send_written(stream.bind(py), piece, &file, part.start as u64)?;
        }
        if let Some(told) = told {
            let received = slf.borrow().body.received();
            told.call1(py, (received,))?;
        }
        Ok(())
    }

    /// The followers' parts of bytes `offered` of the body; only those that wait for
    /// bytes past `done` stay followers.
    fn sends(&mut self, py: Python<'_>, offered: &Range<usize>, done: usize) -> Vec<Part> {
        let sends = self
            .followers
            .iter()
            .map(|follower| {
                let part = overlap(&follower.wanted, offered);
                (follower.stream.clone_ref(py), part)
            })
            .filter(|(_, part)| !part.is_empty())
            .collect();
        self.followers.retain(|follower| follower.wanted.end > done);
        sends
    }
}

#[pymethods]
impl Tee {
    /// The rest of the body of the response `stream` is reading comes into this tee,
    /// not to the stream's protocol, which hears of its end as before.
    fn take_body(slf: &Bound<'_, Self>, stream: &Bound<'_, Stream>) -> PyResult<()> {
        let to = slf.clone().into_any().unbind();
        stream.borrow_mut().body_into(BodyTaker { to, take: Self::feed_any })
    }

    /// A body of `size` bytes: kept in memory (only for small ones), or written into
    /// the file `fd` at each piece's place, its followers offered no byte at or past
    /// `cap` until `publish` (the whole body when None).
    #[new]
    #[pyo3(signature = (size, fd=None, cap=None))]
    fn new(size: usize, fd: Option<RawFd>, cap: Option<usize>) -> PyResult<Self> {
        let written = match fd {
            None => None,
            Some(fd) if fd < 0 => return Err(PyValueError::new_err("not a file")),
            Some(fd) => {
                // SAFETY: the caller keeps `fd` open for this call; the tee has its own.
                let file = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
                Some(Written {
                    file: Arc::new(file),
                    published: 0,
                    cap: cap.unwrap_or(size).min(size),
                    stop: size,
                    error: None,
                    on_progress: None,
                })
            }
        };
        Ok(Self {
            body: Body::new(size),
            whole: None,
            written,
            followers: Vec::new(),
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for follower in &self.followers {
            visit.call(&follower.stream)?;
        }
        visit.call(&self.whole)?;
        if let Some(written) = &self.written {
            visit.call(&written.on_progress)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.followers.clear();
        self.whole = None;
        if let Some(written) = self.written.as_mut() {
            written.on_progress = None;
        }
    }

    /// Bytes of the body that came before the origin's stream fed the tee itself: all
    /// of a small body, most often, which the tee then keeps as it is rather than
    /// copying it.
    fn write(slf: &Bound<'_, Self>, data: Bound<'_, PyBytes>) -> PyResult<()> {
        let bytes = data.as_bytes();
        let mut tee = slf.borrow_mut();
        if tee.written.is_none() && tee.body.arrived_whole(bytes) {
            tee.whole = Some(data.clone().unbind());
            drop(tee);
            return Self::send_on(slf, bytes, 0..bytes.len());
        }
        drop(tee);
        Self::feed(slf, bytes)
    }

    /// Send `head` on `stream`, then bytes [start, end) of the body: what has arrived
    /// (or been published) now, the rest as it does.
    fn follow(
        slf: &Bound<'_, Self>,
        stream: Bound<'_, Stream>,
        head: &[u8],
        start: usize,
        end: usize,
    ) -> PyResult<()> {
        let py = slf.py();
        let mut tee = slf.borrow_mut();
        let (offered, file) = match &tee.written {
            Some(written) => (written.published, Some(Arc::clone(&written.file))),
            None => (tee.body.received(), None),
        };
        let wanted = start..end.min(tee.body.size);
        let part = overlap(&wanted, &(0..offered));
        if wanted.end > offered {
            tee.followers.push(Follower {
                stream: stream.clone().unbind(),
                wanted,
            });
        }
        if let Some(file) = file {
            drop(tee);
            return Stream::send_range(&stream, head, &file, part.start as u64, part.end as u64);
        }
        // A copy: the stream may call Python, which may use the tee meanwhile.
        let arrived = match &tee.whole {
            Some(whole) => whole.as_bytes(py)[part].to_vec(),
            None => tee.body.kept()[part].to_vec(),
        };
        drop(tee);
        Stream::send_parts(&stream, &[head, &arrived])
    }

    /// Followers may have the body's bytes up to `n`, which its file holds: the last
    /// byte once the commit begins, or bytes that other connections wrote into the file
    /// (a body split over several). Nothing changes for a body kept in memory, whose
    /// followers get all that arrives.
    fn publish(slf: &Bound<'_, Self>, n: usize) -> PyResult<()> {
        let py = slf.py();
        let (sends, file) = {
            let mut guard = slf.borrow_mut();
            let tee = &mut *guard;
            let size = tee.body.size;
            let Some(written) = tee.written.as_mut() else {
                return Ok(());
            };
            written.cap = written.cap.max(n.min(size));
            let upto = n.min(size);
            if upto <= written.published {
                return Ok(());
            }
            let offered = written.published..upto;
            written.published = upto;
            let file = Arc::clone(&written.file);
            (tee.sends(py, &offered, upto), file)
        };
        for (stream, part) in sends {
            Stream::send_range(
                stream.bind(py),
                b"",
                &file,
                part.start as u64,
                part.end as u64,
            )?;
        }
        Ok(())
    }

    /// The tee writes no byte of the body at or past `n` (its fill split the rest over
    /// other connections).
    fn stop_at(&mut self, n: usize) {
        if let Some(written) = self.written.as_mut() {
            written.stop = n.min(written.stop);
        }
    }

    /// Told how many bytes are written, after each piece the tee writes (a larger body).
    #[getter]
    fn on_progress(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        let written = self.written.as_ref()?;
        written.on_progress.as_ref().map(|told| told.clone_ref(py))
    }

    #[setter]
    fn set_on_progress(&mut self, told: Option<Py<PyAny>>) {
        if let Some(written) = self.written.as_mut() {
            written.on_progress = told;
        }
    }

    /// How many bytes of the body have arrived (of a larger body: been written).
    #[getter]
    fn received(&self) -> usize {
        self.body.received()
    }

    /// How many bytes of the body its followers have been offered.
    #[getter]
    fn published(&self) -> usize {
        match &self.written {
            Some(written) => written.published,
            None => self.body.received(),
        }
    }

    /// Why the body's file could not be written, if it could not.
    #[getter]
    fn error(&self) -> Option<String> {
        self.written
            .as_ref()
            .and_then(|written| written.error.clone())
    }

    /// The whole body, or None while some is missing, or when its file holds it.
    fn body<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        if self.written.is_some() {
            return None;
        }
        match &self.whole {
            Some(whole) => Some(whole.bind(py).clone()),
            None => self
                .body
                .is_whole()
                .then(|| PyBytes::new(py, self.body.kept())),
        }
    }

    /// The digest of the whole body (hex), or None while some is missing.
    fn hexdigest(&self) -> Option<String> {
        self.body.hexdigest()
    }

    /// The digest of the bytes received so far, to be continued with the rest.
    fn digest(&self) -> Digest {
        Digest::of(self.body.digest_so_far())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BLAKE3's own digest of `data`, as a whole body's `hexdigest`.
    fn digest_of(data: &[u8]) -> Option<String> {
        Some(blake3::hash(data).to_hex().to_string())
    }

    #[test]
    fn the_digest_is_of_the_whole_body_however_it_came() {
        let mut body = Body::new(3);
        assert_eq!(body.append(b"a"), 0..1);
        assert_eq!(body.hexdigest(), None);
        assert_eq!(body.append(b"bc"), 1..3);
        assert_eq!(body.hexdigest(), digest_of(b"abc"));
    }

    #[test]
    fn a_body_that_arrives_whole_at_once_is_hashed_and_left_with_its_caller() {
        let mut body = Body::new(3);
        assert!(!body.arrived_whole(b"ab"));
        assert!(body.arrived_whole(b"abc"));
        assert!(body.is_whole() && body.kept().is_empty());
        assert_eq!(body.hexdigest(), digest_of(b"abc"));
        let mut started = Body::new(3);
        started.append(b"a");
        assert!(!started.arrived_whole(b"abc"));
    }

    #[test]
    fn a_body_in_its_file_is_hashed_and_not_kept() {
        let mut body = Body::new(5);
        assert_eq!(body.pass(b"abc"), 0..3);
        assert_eq!(body.pass(b"defg"), 3..5);
        assert!(body.is_whole() && body.kept().is_empty());
        assert_eq!(body.hexdigest(), digest_of(b"abcde"));
        // What the tee took goes on elsewhere (a body split over other connections).
        let mut started = Body::new(3);
        started.pass(b"ab");
        let mut rest = started.digest_so_far();
        rest.update(b"c");
        assert_eq!(rest.finalize(), blake3::hash(b"abc"));
    }

    #[test]
    fn pieces_land_at_their_place_in_the_file() {
        let path = std::env::temp_dir().join(format!("tee-pieces-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        pwrite_all(file.as_raw_fd(), b"world", 6).unwrap();
        pwrite_all(file.as_raw_fd(), b"hello ", 0).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"hello world");
        std::fs::remove_file(&path).unwrap();
        assert!(pwrite_all(-1, b"x", 0).is_err());
    }

    #[test]
    fn bytes_past_the_announced_size_are_not_kept() {
        let mut body = Body::new(2);
        assert_eq!(body.append(b"abc"), 0..2);
        assert_eq!(body.append(b"d"), 2..2);
        assert!(body.is_whole());
        assert_eq!(body.received(), 2);
    }

    #[test]
    fn a_follower_gets_only_the_part_of_what_arrived_that_it_asked_for() {
        assert_eq!(overlap(&(0..10), &(0..4)), 0..4);
        assert_eq!(overlap(&(2..6), &(4..8)), 4..6);
        // None of it: an empty range where the body's bytes can still be sliced.
        assert_eq!(overlap(&(6..8), &(0..4)), 0..0);
        assert_eq!(overlap(&(0..2), &(4..8)), 4..4);
        assert_eq!(overlap(&(30..50), &(0..0)), 0..0);
    }
}
