//! A listener's door for plain HTTP: a client whose first bytes are a plain-HTTP request
//! for the lean server is served by a stream from its accept on, the table of answers
//! first, and Python makes nothing for it until it must.
//!
//! A new connection per file is the data loader's other shape: each one took a Python
//! arrival, its questions, and the lean server's protocol before the core answered its
//! one request from the table. At the door, the core decides what the arrival would
//! (`forwarded_request` on the forward proxy, the first byte on a captured listener), and
//! the stream has its protocol made only when the table cannot answer
//! (`Stream::begin_at`).
//!
//! Anything else (a CONNECT, TLS on a captured listener, a request for mitmproxy, bytes
//! not come yet) is left where it is: the socket unread, for the Python arrival.

use std::os::fd::RawFd;

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::buffer::answers::Answers;
use crate::front::arrival::{REQUEST_PEEK, peek};
use crate::stream::Stream;
use crate::watch::Watcher;
use crate::wire::connection::{Core, owned_fd};

/// The first byte of every TLS connection: a handshake record (RFC 8446 §5.1).
pub const TLS_HANDSHAKE_RECORD: u8 = 0x16;

#[pyclass(module = "sidecar.core.native", frozen)]
pub struct Door {
    event_loop: Py<PyAny>,
    /// A captured listener's (hostAliases, transparent): clients send no CONNECT, and
    /// what is not TLS is plain HTTP named by its Host.
    captured: bool,
    answers: Py<Answers>,
    scope: Vec<u8>,
    /// What the streams call in Python (`Stream::begin_at`).
    reception: Py<PyAny>,
}

impl Door {
    /// Whether what a client sent first (`first`, peeked) is a plain-HTTP request for
    /// the lean server.
    fn serves(&self, first: &[u8]) -> bool {
        if self.captured {
            return first.first().is_some_and(|&byte| byte != TLS_HANDSHAKE_RECORD);
        }
        let connect = b"CONNECT";
        let compared = first.len().min(connect.len());
        first[..compared] != connect[..compared] && forwarded(first) == Some(true)
    }
}

/// Is what came first on the proxy port a request for the proxy itself to forward, the
/// lean server's? Anything but a request whose target is in origin form or asterisk
/// form (`GET /path`, `OPTIONS *`: what a proxy is not asked, RFC 9112 §3.2), which
/// mitmproxy answers: an absolute-form request (`GET http://host/path`), or bytes whose
/// request line the core's parser refuses, as strictly as any request's. None while
/// what came is a method (letters) and no target has begun.
pub fn forwarded(head: &[u8]) -> Option<bool> {
    let line = head.split(|&byte| byte == b'\n').next().unwrap_or_default();
    let blank = |byte: &u8| *byte == b' ' || *byte == b'\t';
    let (method, rest) = match line.iter().position(blank) {
        Some(at) => (&line[..at], &line[at + 1..]),
        None => (line, &line[line.len()..]),
    };
    let Some(start) = rest.iter().position(|byte| !blank(byte)) else {
        let waiting = !head.contains(&b'\n') && head.len() < REQUEST_PEEK;
        let a_method = method.iter().all(u8::is_ascii_alphabetic);
        return if waiting && a_method { None } else { Some(true) };
    };
    Some(!matches!(rest[start], b'/' | b'*'))
}

#[pyfunction]
#[pyo3(name = "forwarded_request")]
pub fn forwarded_request(head: &[u8]) -> Option<bool> {
    forwarded(head)
}

#[pymethods]
impl Door {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.event_loop)?;
        visit.call(&self.answers)?;
        visit.call(&self.reception)?;
        Ok(())
    }

    /// A door for the clients of one listener (`captured`: hostAliases or
    /// transparent), whose requests `answers` answers under `scope`
    /// (`Stream.answer_from`); `reception` is what their streams call in Python
    /// (`native.pyi` says what).
    #[new]
    fn new(
        event_loop: Py<PyAny>,
        captured: bool,
        answers: Py<Answers>,
        scope: &[u8],
        reception: Py<PyAny>,
    ) -> Self {
        Self {
            event_loop,
            captured,
            answers,
            scope: scope.to_vec(),
            reception,
        }
    }

    /// Serve the accepted client `fd` if what it sent first is plain HTTP for the lean
    /// server: true if its stream took the socket over (and may have answered already);
    /// false, the socket untouched and still the caller's, for anything else.
    fn serve(slf: &Bound<'_, Self>, fd: RawFd) -> PyResult<bool> {
        let py = slf.py();
        let door = slf.get();
        match peek(fd, REQUEST_PEEK) {
            Ok(Some(first)) if door.serves(&first) => {}
            _ => return Ok(false),
        }
        let core = Core::new(owned_fd(fd)?, None);
        let mut stream = Stream::of(core, Watcher::new(door.event_loop.clone_ref(py)));
        stream.answer_from(door.answers.clone_ref(py), &door.scope);
        Stream::begin_at(&Bound::new(py, stream)?, door.reception.clone_ref(py))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::forwarded;

    #[test]
    fn absolute_form_and_refusals_are_forwarded_origin_form_is_not() {
        assert_eq!(forwarded(b"GET http://h/f HTTP/1.1\r\n"), Some(true));
        assert_eq!(forwarded(b"GET\t http://h/f HTTP/1.1\r\n"), Some(true));
        assert_eq!(forwarded(b"GET /f HTTP/1.1\r\n"), Some(false));
        assert_eq!(forwarded(b"OPTIONS * HTTP/1.1\r\n"), Some(false));
        // Not HTTP at all: the lean server refuses it.
        assert_eq!(forwarded(b"\x16\x03\x01\x02\x00"), Some(true));
        assert_eq!(forwarded(b"GET\r\n"), Some(true));
    }

    #[test]
    fn a_method_alone_waits_for_its_target() {
        assert_eq!(forwarded(b""), None);
        assert_eq!(forwarded(b"GE"), None);
        assert_eq!(forwarded(b"GET "), None);
        assert_eq!(forwarded(&vec![b'G'; super::REQUEST_PEEK]), Some(true));
    }
}
