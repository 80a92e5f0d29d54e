//! A small body on its way from the origin into the buffer (a miss stored from a
//! worker's lease): kept whole in memory with its digest taken as it arrives, and sent
//! on at once to the clients of the lean front end that follow it, each the byte range
//! it asked for.
//!
//! The origin's stream feeds it (`Stream.body_into`) instead of handing each piece of
//! the body to Python; the clients' streams send what it gives them as any other bytes.
//! Python hears of the body at its end only (`message_complete`), takes it whole with
//! its digest, and stores it.

use std::ops::Range;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::{PyTraverseError, PyVisit};

use crate::digest::hex;
use crate::stream::Stream;

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
        let start = self.received;
        let kept = &data[..data.len().min(self.size - start)];
        if !kept.is_empty() && self.kept.capacity() == 0 {
            self.kept.reserve_exact(self.size);
        }
        self.kept.extend_from_slice(kept);
        self.digest.update(kept);
        self.received += kept.len();
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
    followers: Vec<Follower>,
}

impl Tee {
    /// Keep the next bytes of the body, and send every follower its part of them.
    pub(crate) fn feed(slf: &Bound<'_, Self>, data: &[u8]) -> PyResult<()> {
        let arrived = slf.borrow_mut().body.append(data);
        Self::send_on(slf, data, arrived)
    }

    /// Send every follower its part of `data`, which are bytes `arrived` of the body.
    fn send_on(slf: &Bound<'_, Self>, data: &[u8], arrived: Range<usize>) -> PyResult<()> {
        let py = slf.py();
        let sends = {
            let mut tee = slf.borrow_mut();
            let offset = arrived.start;
            let sends: Vec<(Py<Stream>, Range<usize>)> = tee
                .followers
                .iter()
                .map(|follower| {
                    let part = overlap(&follower.wanted, &arrived);
                    (
                        follower.stream.clone_ref(py),
                        part.start - offset..part.end - offset,
                    )
                })
                .filter(|(_, part)| !part.is_empty())
                .collect();
            let received = tee.body.received();
            tee.followers
                .retain(|follower| follower.wanted.end > received);
            sends
        };
        // The tee is not borrowed while a stream tells its protocol what happened.
        for (stream, part) in sends {
            Stream::send_parts(stream.bind(py), &[&data[part]])?;
        }
        Ok(())
    }
}

#[pymethods]
impl Tee {
    /// A body of `size` bytes, kept in memory: only for small ones.
    #[new]
    fn new(size: usize) -> Self {
        Self {
            body: Body::new(size),
            whole: None,
            followers: Vec::new(),
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for follower in &self.followers {
            visit.call(&follower.stream)?;
        }
        visit.call(&self.whole)?;
        Ok(())
    }

    fn __clear__(&mut self) {
        self.followers.clear();
        self.whole = None;
    }

    /// Bytes of the body that came before the origin's stream fed the tee itself: all
    /// of it, most often, which the tee then keeps as it is rather than copying it.
    fn write(slf: &Bound<'_, Self>, data: Bound<'_, PyBytes>) -> PyResult<()> {
        let bytes = data.as_bytes();
        if slf.borrow_mut().body.arrived_whole(bytes) {
            slf.borrow_mut().whole = Some(data.clone().unbind());
            return Self::send_on(slf, bytes, 0..bytes.len());
        }
        Self::feed(slf, bytes)
    }

    /// Send `head` on `stream`, then bytes [start, end) of the body: what has arrived
    /// now, the rest as it arrives.
    fn follow(
        slf: &Bound<'_, Self>,
        stream: Bound<'_, Stream>,
        head: &[u8],
        start: usize,
        end: usize,
    ) -> PyResult<()> {
        let py = slf.py();
        let arrived = {
            let mut tee = slf.borrow_mut();
            let wanted = start..end.min(tee.body.size);
            let part = overlap(&wanted, &(0..tee.body.received()));
            if wanted.end > tee.body.received() {
                tee.followers.push(Follower {
                    stream: stream.clone().unbind(),
                    wanted,
                });
            }
            // A copy: the stream may call Python, which may use the tee meanwhile.
            match &tee.whole {
                Some(whole) => whole.as_bytes(py)[part].to_vec(),
                None => tee.body.kept()[part].to_vec(),
            }
        };
        Stream::send_parts(&stream, &[head, &arrived])
    }

    /// How many bytes of the body have arrived.
    #[getter]
    fn received(&self) -> usize {
        self.body.received()
    }

    /// The whole body, or None while some is missing.
    fn body<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_of_the_whole_body_however_it_came() {
        let mut body = Body::new(3);
        assert_eq!(body.append(b"a"), 0..1);
        assert_eq!(body.hexdigest(), None);
        assert_eq!(body.append(b"bc"), 1..3);
        assert_eq!(
            body.hexdigest(),
            Some(blake3::hash(b"abc").to_hex().to_string())
        );
    }

    #[test]
    fn a_body_that_arrives_whole_at_once_is_hashed_and_left_with_its_caller() {
        let mut body = Body::new(3);
        assert!(!body.arrived_whole(b"ab"));
        assert!(body.arrived_whole(b"abc"));
        assert!(body.is_whole() && body.kept().is_empty());
        assert_eq!(
            body.hexdigest(),
            Some(blake3::hash(b"abc").to_hex().to_string())
        );
        let mut started = Body::new(3);
        started.append(b"a");
        assert!(!started.arrived_whole(b"abc"));
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
