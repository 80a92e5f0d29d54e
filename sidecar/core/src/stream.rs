//! One connection, driven by the asyncio event loop: a client connection of the lean
//! front end, or a connection to an origin, a parent or a proxy.
//!
//! The stream owns the socket and its TLS session (rustls) if it has one
//! (`crate::wire::connection::Core`): the server side for an intercepted https tunnel,
//! the client side towards an origin (started by `secure`, after a proxy's CONNECT if
//! there is one). It reads and decrypts, hands the
//! plaintext to its protocol (an `asyncio.Protocol`: the lean HTTP/1.1 server, the
//! client's connection, a relay), and sends what the protocol writes, stored body files
//! included, which never pass through Python. It offers the slice of
//! `asyncio.Transport` its protocols use and calls them as any transport does.
//!
//! The loop says when the socket is readable or writable (`add_reader`, `add_writer`
//! with the stream's own methods): every byte moves inside that one call, on the loop's
//! thread. A thread of our own would have to take the GIL back for each request the
//! protocol decides, and wait for it while the loop runs Python.
//!
//! A stream may forward what it reads to another stream (`forward_to`): a tunnel's or
//! an upgraded connection's bytes, each way, or the body of an origin's response that
//! passes to its client. Those bytes go from one stream's reads to the other's writes
//! without reaching Python, which hears only of the flow control (the other stream's
//! protocol pauses this one's reading while it is full) and of the end.
//!
//! Python is never called while the stream is borrowed: the calls that move bytes
//! return what the protocol must hear (`Notice`), and it is told afterwards, so that it
//! may write from inside `data_received`.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::{PyConnectionResetError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;
use pyo3::{PyTraverseError, PyVisit};
use rustls::ClientConnection;
use rustls_pki_types::ServerName;

use crate::buffer::answers::{Answers, TargetForm};
use crate::clock::{monotonic, now};
use crate::watch::Watcher;
use crate::wire::connection::{
    Core, DEFAULT_HIGH_WATER, Marked, Notice, owned_fd, py_error, session_of,
    waits_for_next_write,
};
use crate::wire::http1::{Event, Head, Parser, ResponseHead};
use crate::wire::tls::ClientTls;

/// Bytes forwarded between streams of bytes in this process (`forward_to`: tunnels and
/// upgraded connections, both ways), for the tunnelled-bytes counter.
static RELAYED: AtomicU64 = AtomicU64::new(0);

#[pyclass(module = "sidecar.core.native")]
pub struct Stream {
    core: Core,
    watcher: Watcher,
    protocol: Option<Py<PyAny>>,
    /// Until the protocol is made, for a client served from its accept on
    /// (`begin_at`): what makes it, and hears of the end of a connection that never
    /// needed one.
    reception: Option<Py<PyAny>>,
    /// Such a connection the table answered is watched for idleness.
    idle_watched: bool,
    /// Requests parsed for the protocol; None: bytes handed over as they come (a
    /// relay after an upgrade, or a protocol of bytes).
    parser: Option<Parser>,
    paused: bool, // the protocol asked for no more
    eof: bool,    // the client ended its side
    eof_told: bool,
    /// The shared table of recorded answers and the URL prefix of this connection's
    /// origin (`answer_from`): requests it answers never reach the protocol.
    answers: Option<(Py<Answers>, Vec<u8>)>,
    /// A request was handed to the protocol and not answered yet (`idle`): what follows
    /// it on the connection waits for the protocol too, so that answers keep its order.
    busy: bool,
    /// The end of a request the table answered comes next: not the protocol's.
    skip_end: bool,
    /// When the table last answered a request on this connection (`monotonic`).
    answered_at: f64,
    /// Where the rest of the current response's body goes instead of the protocol
    /// (`body_into`).
    body_to: Option<BodyTaker>,
    /// Where what is read goes instead of the protocol (`forward_to`).
    forward: Option<Forward>,
    /// Bytes forwarded so far (of a body: without its chunked framing).
    forwarded: u64,
}

/// What takes the body of the response being read instead of the protocol: an object of
/// a layer above the stream's (a fill's tee, `Tee.take_body`), and its function that takes
/// each piece.
pub(crate) struct BodyTaker {
    pub(crate) to: Py<PyAny>,
    pub(crate) take: fn(&Bound<'_, PyAny>, &[u8]) -> PyResult<()>,
}

/// Another stream that gets what this one reads: its bytes, or the body of the response
/// being read, framed in chunks when `chunked`, until the response ends; `head` goes
/// with the first of them (a response head and its first body bytes in one write).
struct Forward {
    to: Py<Stream>,
    chunked: bool,
    head: Vec<u8>,
}

impl Stream {
    /// The stream of a connection whose socket (and TLS session, if any) `core` holds,
    /// and which the loop watches as `watcher` says.
    pub(crate) fn of(core: Core, watcher: Watcher) -> Self {
        Self {
            core,
            watcher,
            protocol: None,
            reception: None,
            idle_watched: false,
            parser: None,
            paused: true,
            eof: false,
            eof_told: false,
            answers: None,
            busy: false,
            skip_end: false,
            answered_at: 0.0,
            body_to: None,
            forward: None,
            forwarded: 0,
        }
    }

    /// `start`, and with `waiting` the bytes known to wait in the socket (an arrival
    /// peeked at them) read on the loop's next turn.
    pub(crate) fn begin(
        slf: &Bound<'_, Self>,
        protocol: Py<PyAny>,
        requests: bool,
        responses: bool,
        waiting: bool,
    ) -> PyResult<()> {
        let py = slf.py();
        {
            let mut stream = slf.borrow_mut();
            stream.protocol = Some(protocol.clone_ref(py));
            let fd = stream.core.raw();
            stream.watcher.bind(slf.as_any(), fd)?;
            stream.parser = if responses {
                Some(Parser::responses())
            } else {
                requests.then(Parser::default)
            };
        }
        Self::introduce(slf, &protocol)?;
        // A request that came with the handshake's last flight is inside the TLS
        // session already, which the socket's readiness does not say.
        let mut stream = slf.borrow_mut();
        let held = waiting || stream.core.holds_plaintext();
        stream.reading_on(py, held)
    }

    /// Serve a client's requests from its first bytes on, which wait in the socket: the
    /// table answers what it can (`answer_from`), and the protocol is made only when it
    /// must hear something. `reception`, in Python, is called for it: `protocol()`
    /// makes the protocol; `closed()` hears that the connection closed without one;
    /// `watch_stream(stream)` and `forget_stream(stream)` start and end the idle watch
    /// of a connection the table answered that stays open.
    pub(crate) fn begin_at(slf: &Bound<'_, Self>, reception: Py<PyAny>) -> PyResult<()> {
        {
            let mut stream = slf.borrow_mut();
            let fd = stream.core.raw();
            stream.watcher.bind(slf.as_any(), fd)?;
            stream.parser = Some(Parser::default());
            stream.reception = Some(reception);
            stream.paused = false;
        }
        Self::readable(slf)
    }

    /// Tell `protocol`, the stream's now, that it is connected. A protocol that cannot
    /// start hears nothing more: the connection closes, and the loop stops watching it.
    fn introduce(slf: &Bound<'_, Self>, protocol: &Py<PyAny>) -> PyResult<()> {
        let py = slf.py();
        let Err(error) = protocol.call_method1(py, "connection_made", (slf,)) else {
            return Ok(());
        };
        let mut stream = slf.borrow_mut();
        let fd = stream.core.raw();
        stream.watcher.stop(py, fd)?;
        stream.core.shut();
        stream.protocol = None;
        Err(error)
    }

    /// The protocol of a stream `begin_at` started, made now: the stream leaves the
    /// reception's watch for idleness (the protocol keeps its own), and a protocol made
    /// while the client's buffer is full hears so.
    fn make_protocol(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let Some(reception) = slf.borrow_mut().reception.take() else {
            return Ok(());
        };
        Self::unwatch_idle(slf, &reception)?;
        let protocol = reception.call_method0(py, "protocol")?;
        slf.borrow_mut().protocol = Some(protocol.clone_ref(py));
        Self::introduce(slf, &protocol)?;
        if slf.borrow().core.writing_paused {
            protocol.call_method0(py, "pause_writing")?;
        }
        Ok(())
    }

    /// After the table answered a client of `begin_at`'s: a connection that stays open
    /// is watched for idleness, as the protocol would watch it.
    fn watch_idle(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let reception = {
            let mut stream = slf.borrow_mut();
            let open = !stream.core.closing && !stream.core.closed();
            let reception = match stream.reception.as_ref() {
                Some(reception) if open && !stream.idle_watched => reception.clone_ref(py),
                _ => return Ok(()),
            };
            stream.idle_watched = true;
            reception
        };
        reception.call_method1(py, "watch_stream", (slf,)).map(drop)
    }

    fn unwatch_idle(slf: &Bound<'_, Self>, reception: &Py<PyAny>) -> PyResult<()> {
        if !std::mem::take(&mut slf.borrow_mut().idle_watched) {
            return Ok(());
        }
        reception.call_method1(slf.py(), "forget_stream", (slf,)).map(drop)
    }

    /// A client of `begin_at`'s closed without its protocol.
    fn leave_reception(slf: &Bound<'_, Self>) -> PyResult<()> {
        let Some(reception) = slf.borrow_mut().reception.take() else {
            return Ok(());
        };
        Self::unwatch_idle(slf, &reception)?;
        reception.call_method0(slf.py(), "closed").map(drop)
    }

    /// The rest of the body of the response being read goes to `taker`, not to the
    /// protocol, which hears of its end as before (`message_complete`).
    pub(crate) fn body_into(&mut self, taker: BodyTaker) -> PyResult<()> {
        if !self.parser.as_ref().is_some_and(Parser::reads_responses) {
            return Err(PyValueError::new_err("the stream does not read responses"));
        }
        self.body_to = Some(taker);
        Ok(())
    }

    fn watch_reads(&mut self, py: Python<'_>, on: bool) -> PyResult<()> {
        self.watcher.reads(py, self.core.raw(), on)
    }

    fn watch_writes(&mut self, py: Python<'_>, on: bool) -> PyResult<()> {
        self.watcher.writes(py, self.core.raw(), on)
    }

    /// Send what waits, watch for writability while some is left, close once a
    /// closing stream has sent everything; what the protocol must hear.
    fn flush(&mut self, py: Python<'_>, notices: &mut Vec<Notice>) -> PyResult<()> {
        if self.core.closed() {
            return Ok(());
        }
        match self.core.pump() {
            Ok(drained) => {
                self.watch_writes(py, !drained)?;
                notices.extend(self.core.water_notice());
                if drained && self.core.closing {
                    self.finish(py, None, notices)?;
                }
            }
            Err(e) => self.finish(py, Some(e), notices)?,
        }
        Ok(())
    }

    /// The end of the connection.
    fn finish(
        &mut self,
        py: Python<'_>,
        error: Option<io::Error>,
        notices: &mut Vec<Notice>,
    ) -> PyResult<()> {
        if self.core.closed() {
            return Ok(());
        }
        self.watcher.stop(py, self.core.raw())?;
        self.core.closing = true;
        self.core.shut();
        notices.push(Notice::Lost(error));
        Ok(())
    }

    /// Reading goes on (the protocol asked for it, or starts). With `held` (bytes wait in
    /// the socket or the TLS session), `readable` runs on the loop's next turn and the
    /// loop watches the socket only if the connection is still open after it
    /// (`keep_watching`): a client that sends its one request and is answered at once (a
    /// new connection per file) never has its socket added to the loop's interest list
    /// and removed again.
    fn reading_on(&mut self, py: Python<'_>, held: bool) -> PyResult<()> {
        if self.core.closing || self.core.closed() || !self.paused {
            return Ok(());
        }
        self.paused = false;
        if held {
            self.watcher.read_later(py, 0.0)
        } else {
            let more_from_socket = !self.eof;
            self.watch_reads(py, more_from_socket)
        }
    }

    /// After `readable`: the loop watches the socket for what comes next, while the
    /// connection is open and its reading goes on.
    fn keep_watching(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.paused || self.eof || self.core.closing || self.core.closed() {
            return Ok(());
        }
        self.watch_reads(py, true)
    }

    /// Send `parts` after what waits, and what the protocol must hear of it.
    pub(crate) fn send_parts(slf: &Bound<'_, Self>, parts: &[&[u8]]) -> PyResult<()> {
        if parts.iter().all(|part| part.is_empty()) {
            return Ok(());
        }
        Self::send_with(slf, |core| core.write(parts))
    }

    /// Send `data`, which this stream read, where it forwards it (`forward_to`): false
    /// if it forwards nothing, and the protocol is told of them instead.
    fn forward_piece(slf: &Bound<'_, Self>, data: &[u8]) -> PyResult<bool> {
        let py = slf.py();
        let (to, chunked, head) = {
            let mut guard = slf.borrow_mut();
            let stream = &mut *guard;
            let Some(forward) = stream.forward.as_mut() else {
                return Ok(false);
            };
            stream.forwarded += data.len() as u64;
            if stream.parser.is_none() {
                RELAYED.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            let head = std::mem::take(&mut forward.head);
            (forward.to.clone_ref(py), forward.chunked, head)
        };
        let to = to.bind(py);
        if chunked {
            let size = format!("{:x}\r\n", data.len());
            Self::send_parts(to, &[&head, size.as_bytes(), data, b"\r\n"])?;
        } else {
            Self::send_parts(to, &[&head, data])?;
        }
        Ok(true)
    }

    /// The end of what `forward` forwarded: the head if no byte went with it yet, and
    /// the last chunk of a chunked body.
    fn end_forward(py: Python<'_>, forward: Forward) -> PyResult<()> {
        let last: &[u8] = if forward.chunked { b"0\r\n\r\n" } else { b"" };
        Self::send_parts(forward.to.bind(py), &[&forward.head, last])
    }

    /// Send bytes [pos, pos + data.len()) of a body that is being written into `file`:
    /// from `data` while nothing waits before them, else as a range of the file, read
    /// as the socket takes it, so that a client slower than the origin holds no more
    /// than one piece of the body in memory.
    pub(crate) fn send_written(
        slf: &Bound<'_, Self>,
        data: &[u8],
        file: &Arc<OwnedFd>,
        pos: u64,
    ) -> PyResult<()> {
        if data.is_empty() {
            return Ok(());
        }
        Self::send_with(slf, |core| {
            if core.outbox.is_empty() {
                return core.write(&[data]);
            }
            core.outbox.push_shared(file, pos, pos + data.len() as u64);
            Ok(())
        })
    }

    /// Send `head`, then bytes [start, end) of `file`, which hold them already.
    pub(crate) fn send_range(
        slf: &Bound<'_, Self>,
        head: &[u8],
        file: &Arc<OwnedFd>,
        start: u64,
        end: u64,
    ) -> PyResult<()> {
        if head.is_empty() && end <= start {
            return Ok(());
        }
        Self::send_with(slf, |core| {
            core.outbox.push_bytes(head);
            core.outbox.push_shared(file, start, end);
            Ok(())
        })
    }

    /// Queue what `queue` puts in the outbox, send what the socket takes, and tell the
    /// protocol what it must hear of it.
    fn send_with(
        slf: &Bound<'_, Self>,
        queue: impl FnOnce(&mut Core) -> io::Result<()>,
    ) -> PyResult<()> {
        let mut notices = Vec::new();
        {
            let mut stream = slf.borrow_mut();
            if stream.core.closing || stream.core.closed() {
                return Ok(());
            }
            let py = slf.py();
            match queue(&mut stream.core) {
                Ok(()) => stream.flush(py, &mut notices)?,
                Err(e) => stream.finish(py, Some(e), &mut notices)?,
            }
        }
        deliver(slf, notices)
    }
}

/// Hand the protocol one parsed event of a request or a response, with the stream no
/// longer borrowed.
fn tell(slf: &Bound<'_, Stream>, event: Event) -> PyResult<()> {
    let py = slf.py();
    Stream::make_protocol(slf)?;
    let (protocol, responses, taker, ended) = {
        let mut stream = slf.borrow_mut();
        let responses = stream.parser.as_ref().is_some_and(Parser::reads_responses);
        // A body's end is its taker's and its forward's too: the next response is the
        // protocol's again.
        let (taker, ended) = match event {
            Event::Body(_) => {
                let taker = stream.body_to.as_ref();
                (taker.map(|taker| (taker.to.clone_ref(py), taker.take)), None)
            }
            _ => (stream.body_to.take().map(|taker| (taker.to, taker.take)), stream.forward.take()),
        };
        match stream.protocol.as_ref() {
            Some(protocol) => (protocol.clone_ref(py), responses, taker, ended),
            None => return Ok(()),
        }
    };
    if let (Event::Body(data), Some((to, take))) = (&event, &taker) {
        return take(to.bind(py), data);
    }
    if let Event::Body(data) = &event {
        if Stream::forward_piece(slf, data)? {
            return Ok(());
        }
    }
    if let (Event::End, Some(forward)) = (&event, ended) {
        Stream::end_forward(py, forward)?;
    }
    match event {
        Event::Response(head) => {
            let head: ResponseHead = *head;
            let arguments = (
                head.version,
                head.status,
                head.reason,
                head.fields,
                head.transfer_encoding,
                head.keep_alive,
                head.until_close,
            );
            protocol.call_method1(py, "response_received", arguments)?;
        }
        Event::Unasked => {
            protocol.call_method0(py, "unasked_received")?;
        }
        Event::Refused(_, reason) if responses => {
            protocol.call_method1(py, "response_refused", (reason,))?;
        }
        Event::Head(head) => {
            let Head {
                method,
                target,
                version,
                fields,
                hosts,
                transfer_encoding,
                keep_alive,
                upgrade,
                has_body,
            } = *head;
            let arguments = (
                method,
                PyBytes::new(py, &target),
                version,
                fields,
                hosts,
                transfer_encoding,
                keep_alive,
                upgrade,
                has_body,
            );
            protocol.call_method1(py, "request_received", arguments)?;
        }
        Event::Body(data) => {
            protocol.call_method1(py, "body_received", (PyBytes::new(py, &data),))?;
        }
        Event::End => {
            protocol.call_method0(py, "message_complete")?;
        }
        Event::Refused(status, reason) => {
            protocol.call_method1(py, "request_refused", (status, reason))?;
        }
    }
    Ok(())
}

/// Answer a request from the stream's table of recorded answers (`answer_from`): true
/// if it was, and the protocol never hears of it. Only while the protocol answers
/// nothing and the client keeps up, as the protocol's own immediate hits.
fn answer_from_table(slf: &Bound<'_, Stream>, head: &Head) -> PyResult<bool> {
    let py = slf.py();
    let mut notices = Vec::new();
    {
        let mut stream = slf.borrow_mut();
        let core = &stream.core;
        if stream.busy || core.writing_paused || core.closing || core.closed() {
            return Ok(false);
        }
        let Some((answers, scope)) = stream.answers.as_ref() else {
            return Ok(false);
        };
        let answers = answers.get();
        let form = TargetForm::of_scope(scope);
        if !answers.may_answer(head, form) {
            return Ok(false);
        }
        // A captured connection's scope ends where the authority goes: the Host names it.
        let url = if form == TargetForm::Hosted {
            [scope.as_slice(), head.hosts[0].as_bytes(), head.target.as_slice()].concat()
        } else {
            [scope.as_slice(), head.target.as_slice()].concat()
        };
        let Some((key, digest)) = answers.key_of(&url) else {
            return Ok(false);
        };
        let Some(found) = answers.find(&digest) else {
            return Ok(false);
        };
        // A body removed since its generation was read is Python's to miss.
        let Ok(file) = answers.open_body(&found) else {
            return Ok(false);
        };
        answers.count(key, found.size);
        let close = !head.keep_alive;
        stream.core.outbox.push_bytes(&found.head_at(now(), close));
        stream.core.outbox.push_file(file.into(), 0, found.size);
        stream.answered_at = monotonic();
        stream.skip_end = true;
        if close {
            // As the lean server does after such an answer: sent, then closed.
            stream.core.closing = true;
            stream.watch_reads(py, false)?;
        }
        stream.flush(py, &mut notices)?;
    }
    deliver(slf, notices)?;
    Stream::watch_idle(slf)?;
    Ok(true)
}

/// Tell the protocol, with the stream no longer borrowed.
fn deliver(slf: &Bound<'_, Stream>, notices: Vec<Notice>) -> PyResult<()> {
    let py = slf.py();
    for notice in notices {
        if slf.borrow().reception.is_some() {
            match &notice {
                Notice::Eof => {
                    Stream::close(slf)?;
                    continue;
                }
                Notice::Lost(_) => {
                    Stream::leave_reception(slf)?;
                    continue;
                }
                // Nobody but the table has written.
                Notice::PauseWriting | Notice::ResumeWriting => continue,
                Notice::Data(_) => Stream::make_protocol(slf)?,
            }
        }
        let protocol = match slf.borrow().protocol.as_ref() {
            Some(protocol) => protocol.clone_ref(py),
            None => return Ok(()),
        };
        match notice {
            Notice::Data(data) => {
                if !Stream::forward_piece(slf, &data)? {
                    protocol.call_method1(py, "data_received", (PyBytes::new(py, &data),))?;
                }
            }
            Notice::Eof => {
                let keep_open = protocol.call_method0(py, "eof_received")?;
                if !keep_open.is_truthy(py)? {
                    Stream::close(slf)?;
                }
            }
            Notice::PauseWriting => {
                protocol.call_method0(py, "pause_writing")?;
            }
            Notice::ResumeWriting => {
                protocol.call_method0(py, "resume_writing")?;
            }
            Notice::Lost(error) => {
                let error = error.map(|e| py_error(e).into_value(py));
                let lost = protocol.getattr(py, "connection_lost")?;
                let event_loop = slf.borrow().watcher.event_loop().clone_ref(py);
                // Later, as asyncio's transports do: never inside a write of the protocol's.
                event_loop.call_method1(py, "call_soon", (lost, error))?;
                // The protocol holds the stream: let both go. A tunnel's stream (it parses
                // nothing) lets go of the stream it forwarded to as well, which forwards
                // to it: a cycle only the garbage collector, which the workers run seldom,
                // would free. A response's forward stays for `end_forward` (a body that
                // ended with the connection).
                let mut stream = slf.borrow_mut();
                stream.protocol = None;
                if stream.parser.is_none() {
                    stream.forward = None;
                }
            }
        }
    }
    Ok(())
}

#[pymethods]
impl Stream {
    // The Python objects a stream holds, for the garbage collector: the protocol holds
    // the stream, and the loop its callbacks.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.watcher.traverse(&visit)?;
        visit.call(&self.protocol)?;
        visit.call(&self.reception)?;
        if let Some(taker) = &self.body_to {
            visit.call(&taker.to)?;
        }
        if let Some(forward) = &self.forward {
            visit.call(&forward.to)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.protocol = None;
        self.reception = None;
        self.body_to = None;
        self.forward = None;
        self.watcher.clear();
    }

    /// Take the connected socket `fd` over (the stream closes it): plain bytes, which
    /// `secure` may put under the client side of TLS.
    #[new]
    fn new(fd: RawFd, event_loop: Py<PyAny>) -> PyResult<Self> {
        let core = Core::new(owned_fd(fd)?, None);
        Ok(Self::of(core, Watcher::new(event_loop)))
    }

    /// Start the client side of TLS towards `server_name` (a DNS name or an IP
    /// address, which the certificate must name), on a plain stream that has nothing
    /// queued; `handshake` then completes it.
    fn secure(&mut self, config: PyRef<'_, ClientTls>, server_name: &str) -> PyResult<()> {
        if self.core.tls.is_some() || self.core.closed() || self.core.outbox.queued() > 0 {
            return Err(PyValueError::new_err("only an open plain stream can be secured"));
        }
        let name = ServerName::try_from(server_name.to_owned())
            .map_err(|_| PyValueError::new_err(format!("not a server name: {server_name:?}")))?;
        let session = ClientConnection::new(config.config.clone(), name)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        self.core.tls = Some(session_of(session.into()));
        Ok(())
    }

    /// One step of the TLS handshake: 0 once done, 1 to call again when the socket is
    /// readable, 2 when writable. OSError when it fails (CertificateRejected when the
    /// origin's certificate does not verify).
    fn handshake(&mut self) -> PyResult<u8> {
        if self.core.closed() {
            return Err(PyConnectionResetError::new_err("the stream is closed"));
        }
        self.core.handshake().map_err(py_error)
    }

    /// The application protocol the handshake chose, if any.
    fn alpn(&self) -> Option<Vec<u8>> {
        self.core.tls.as_ref()?.alpn_protocol().map(<[u8]>::to_vec)
    }

    /// Tell `protocol` it is connected, then feed it what arrives: with `requests`, the
    /// requests parsed from it (`request_received`, `body_received`,
    /// `message_complete`, `request_refused`); with `responses`, the responses to the
    /// requests `expect_response` announces (`response_received`, `body_received`,
    /// `message_complete`, `response_refused`, `unasked_received`); else its bytes
    /// (`data_received`).
    #[pyo3(signature = (protocol, requests=false, responses=false))]
    fn start(
        slf: &Bound<'_, Self>,
        protocol: Py<PyAny>,
        requests: bool,
        responses: bool,
    ) -> PyResult<()> {
        Self::begin(slf, protocol, requests, responses, false)
    }

    /// The loop's reader callback: read what arrived, then hand over what it makes.
    fn readable(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let mut notices = Vec::new();
        {
            let mut stream = slf.borrow_mut();
            if stream.paused || stream.core.closed() {
                return Ok(());
            }
            if !stream.eof {
                match stream.core.read() {
                    Ok((data, ended)) => {
                        match stream.parser.as_mut() {
                            Some(parser) => parser.feed(data),
                            None if !data.is_empty() => notices.push(Notice::Data(data)),
                            None => {}
                        }
                        if ended {
                            stream.eof = true;
                            stream.watch_reads(py, false)?;
                        } else if stream.core.holds_unread() {
                            stream.watcher.read_later(py, 0.0)?;
                        }
                        // Reading may have made the session want to write (an answer
                        // to a key update). It goes now, unless it may leave with the
                        // next response (our server side of TLS 1.3).
                        if stream
                            .core
                            .tls
                            .as_deref()
                            .is_some_and(|s| s.wants_write() && !waits_for_next_write(s))
                        {
                            stream.flush(py, &mut notices)?;
                        }
                    }
                    Err(e) => stream.finish(py, Some(e), &mut notices)?,
                }
            }
        }
        deliver(slf, notices)?;
        // Requests one at a time: the protocol may pause between two.
        loop {
            let event = {
                let mut stream = slf.borrow_mut();
                if stream.paused || stream.core.closed() {
                    return Ok(());
                }
                match stream.parser.as_mut().and_then(Parser::event) {
                    Some(event) => event,
                    None => break,
                }
            };
            match &event {
                Event::End if slf.borrow().skip_end => {
                    slf.borrow_mut().skip_end = false;
                    continue;
                }
                Event::Head(head) => {
                    if answer_from_table(slf, head)? {
                        continue;
                    }
                    slf.borrow_mut().busy = true;
                }
                _ => {}
            }
            // An upgrade request, or the origin's switch to the protocol it asked for.
            let upgrade = matches!(&event, Event::Head(head) if head.upgrade)
                || matches!(&event, Event::Response(head) if head.status == 101);
            tell(slf, event)?;
            if upgrade {
                // From here on the connection carries the new protocol's bytes: what
                // came after the head first, as `data_received`, like all that follows.
                let early = {
                    let mut stream = slf.borrow_mut();
                    let early = stream.parser.as_mut().map(Parser::take_rest);
                    stream.parser = None;
                    early.unwrap_or_default()
                };
                if !early.is_empty() {
                    deliver(slf, vec![Notice::Data(early)])?;
                }
                break;
            }
        }
        let eof_now = {
            let mut stream = slf.borrow_mut();
            let now = stream.eof && !stream.eof_told && !stream.core.closed();
            stream.eof_told |= now;
            now
        };
        if eof_now {
            // After every message the bytes made: an origin's end without the closure
            // alert is a loss of the connection, which may have cut the last of them.
            let mut notices = Vec::new();
            if slf.borrow().core.truncated {
                let cut = io::Error::new(io::ErrorKind::UnexpectedEof, Marked::Truncated);
                slf.borrow_mut().finish(py, Some(cut), &mut notices)?;
            } else {
                notices.push(Notice::Eof);
            }
            deliver(slf, notices)?;
        }
        slf.borrow_mut().keep_watching(py)
    }

    /// A request with `method` is about to be sent: its response is parsed next.
    fn expect_response(&mut self, method: &str) -> PyResult<()> {
        match self.parser.as_mut() {
            Some(parser) if parser.reads_responses() => {
                parser.expect(method);
                self.body_to = None;
                self.forward = None;
                Ok(())
            }
            _ => Err(PyValueError::new_err("the stream does not read responses")),
        }
    }

    /// What this stream reads goes to `to` from here on, not to the protocol, after
    /// `head` (sent with the first of it): on a stream of bytes, all of it; on one that
    /// reads responses, the rest of the body of the response being read, in chunks of
    /// its own framing when `chunked` (the last chunk sent at its end, or by
    /// `end_forward`), and the protocol hears of its end as before (`message_complete`).
    /// The protocol of `to` pauses this stream's reading while `to` has too much to
    /// send (`pause_writing`).
    #[pyo3(signature = (to, chunked=false, head=None))]
    fn forward_to(
        &mut self,
        to: Py<Stream>,
        chunked: bool,
        head: Option<PyBackedBytes>,
    ) -> PyResult<()> {
        let responses = self.parser.as_ref().is_some_and(Parser::reads_responses);
        if self.parser.is_some() && !responses {
            return Err(PyValueError::new_err("the stream reads requests"));
        }
        if chunked && !responses {
            return Err(PyValueError::new_err("only a response's body is chunked"));
        }
        let head = head.map_or_else(Vec::new, |head| head.to_vec());
        self.forward = Some(Forward { to, chunked, head });
        Ok(())
    }

    /// The body being forwarded ended where only the protocol hears of it (with the
    /// connection): what `forward_to` still owes `to` is sent now.
    #[pyo3(name = "end_forward")]
    fn end_forward_now(slf: &Bound<'_, Self>) -> PyResult<()> {
        let forward = slf.borrow_mut().forward.take();
        match forward {
            Some(forward) => Self::end_forward(slf.py(), forward),
            None => Ok(()),
        }
    }

    /// Bytes this stream has forwarded (`forward_to`), a body's without its framing.
    #[getter]
    fn forwarded(&self) -> u64 {
        self.forwarded
    }

    /// Answer this connection's requests from `answers` where it can (`Answers`):
    /// `scope` is the URL of its origin up to the path (`https://host[:port]`); its
    /// scheme alone (`http://`) for a captured connection, whose requests' Host names
    /// their origin; or empty for a client of the forward proxy itself, whose targets
    /// are whole URLs.
    pub(crate) fn answer_from(&mut self, answers: Py<Answers>, scope: &[u8]) {
        self.answers = Some((answers, scope.to_vec()));
    }

    /// The protocol has answered every request it was handed: the table may answer
    /// the next one.
    fn idle(&mut self) {
        self.busy = false;
    }

    /// When the table last answered a request on this connection, on the clock of
    /// Python's `time.monotonic()` (0.0: never): the protocol's idle timer counts it.
    #[getter]
    fn answered_at(&self) -> f64 {
        self.answered_at
    }

    /// The loop's writer callback.
    fn writable(slf: &Bound<'_, Self>) -> PyResult<()> {
        let mut notices = Vec::new();
        slf.borrow_mut().flush(slf.py(), &mut notices)?;
        deliver(slf, notices)
    }

    fn write(slf: &Bound<'_, Self>, data: &[u8]) -> PyResult<()> {
        Self::send_parts(slf, &[data])
    }

    /// Write `parts` in order, as one write: a response head and its first body bytes
    /// leave together, neither copied into the other first.
    fn writelines(slf: &Bound<'_, Self>, parts: Vec<PyBackedBytes>) -> PyResult<()> {
        let parts: Vec<&[u8]> = parts.iter().map(|part| &part[..]).collect();
        Self::send_parts(slf, &parts)
    }

    /// Send `head`, then bytes [start, end) of the file `fd`, which the stream takes
    /// over (it closes it once sent, or with the connection). The file is read as the
    /// client takes it, in chunks: its bytes never reach Python.
    fn send_file(
        slf: &Bound<'_, Self>,
        head: &[u8],
        fd: RawFd,
        start: u64,
        end: u64,
    ) -> PyResult<()> {
        if fd < 0 || end < start {
            return Err(PyValueError::new_err("not a file range"));
        }
        // SAFETY: the caller hands the descriptor over.
        let file = unsafe { OwnedFd::from_raw_fd(fd) };
        Self::send_with(slf, |core| {
            core.outbox.push_bytes(head);
            core.outbox.push_file(file, start, end);
            Ok(())
        })
    }

    fn pause_reading(&mut self, py: Python<'_>) -> PyResult<()> {
        self.paused = true;
        self.watch_reads(py, false)
    }

    fn resume_reading(slf: &Bound<'_, Self>) -> PyResult<()> {
        // What was read and not handed over yet (requests parsed ahead, the client's
        // end) makes the socket no more readable.
        slf.borrow_mut().reading_on(slf.py(), true)
    }

    fn is_reading(&self) -> bool {
        !self.paused
    }

    /// Send what is queued, then TLS's closure alert, then close.
    fn close(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let mut notices = Vec::new();
        {
            let mut stream = slf.borrow_mut();
            if stream.core.closing || stream.core.closed() {
                return Ok(());
            }
            stream.core.closing = true;
            stream.watch_reads(py, false)?;
            stream.flush(py, &mut notices)?;
        }
        deliver(slf, notices)
    }

    /// Close at once, dropping what is queued: the client sees a cut connection.
    fn abort(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let mut notices = Vec::new();
        {
            let mut stream = slf.borrow_mut();
            stream.core.outbox.clear();
            stream.finish(py, None, &mut notices)?;
        }
        deliver(slf, notices)
    }

    fn is_closing(&self) -> bool {
        self.core.closing || self.core.closed()
    }

    fn can_write_eof(&self) -> bool {
        // A TLS connection cannot stay half-open.
        self.core.tls.is_none()
    }

    /// Close the sending side once what is queued went out (plain TCP only).
    fn write_eof(slf: &Bound<'_, Self>) -> PyResult<()> {
        let mut notices = Vec::new();
        {
            let mut stream = slf.borrow_mut();
            if stream.core.tls.is_some() {
                return Err(PyOSError::new_err("a TLS stream cannot be half-closed"));
            }
            if stream.core.closed() || stream.core.write_eof {
                return Ok(());
            }
            stream.core.write_eof = true;
            let py = slf.py();
            stream.flush(py, &mut notices)?;
        }
        deliver(slf, notices)
    }

    /// Hand the connection to another protocol (a relay after an upgrade), which gets
    /// bytes: what was received after the upgrade's head first.
    fn set_protocol(&mut self, protocol: Py<PyAny>) {
        self.protocol = Some(protocol);
        self.parser = None;
    }

    fn get_protocol(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.protocol.as_ref().map(|p| p.clone_ref(py))
    }

    #[pyo3(signature = (high=None, low=None))]
    fn set_write_buffer_limits(&mut self, high: Option<u64>, low: Option<u64>) {
        self.core.high = high.unwrap_or(DEFAULT_HIGH_WATER);
        self.core.low = low.unwrap_or(self.core.high / 4);
    }

    fn get_write_buffer_size(&self) -> u64 {
        self.core.outbox.queued()
    }

    #[pyo3(signature = (name, default=None))]
    fn get_extra_info(&self, py: Python<'_>, name: &str, default: Option<Py<PyAny>>) -> Py<PyAny> {
        match name {
            "fileno" if !self.core.closed() => self
                .core
                .raw()
                .into_pyobject(py)
                .unwrap()
                .into_any()
                .unbind(),
            _ => default.unwrap_or_else(|| py.None()),
        }
    }

    fn fileno(&self) -> RawFd {
        self.core.raw()
    }
}

/// Bytes this process's streams of bytes forwarded to one another (`Stream.forward_to`):
/// those of tunnels and upgraded connections, both ways.
#[pyfunction]
pub fn relayed_bytes() -> u64 {
    RELAYED.load(Ordering::Relaxed)
}

