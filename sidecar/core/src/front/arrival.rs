//! A client of the lean front end from its accept until its first request.
//!
//! Before the lean server owns a connection to an intercepted host, the front end
//! waits for the client up to four times: its request head, then (once the CONNECT is
//! answered) its first bytes inside the tunnel, the rest of its ClientHello, the last
//! flight of the TLS handshake. An `Arrival` waits on the loop's readiness callbacks,
//! peeks at what came (MSG_PEEK: bytes it does not take stay in the socket, for
//! mitmproxy or a tunnel) and asks its handler, in Python, what to do:
//!
//! - `request(head)`: the bytes waiting, at most `REQUEST_PEEK`; the handler
//!   answers the CONNECT (`answer_connect`), waits for the rest (`peek_later`), or takes
//!   the socket (`detach`).
//! - `tunnelled(first)`: what came first inside the tunnel (or on a captured
//!   connection, which sends no CONNECT), at most
//!   `HELLO_PEEK`; the handler takes plain bytes as they are (`take_stream`), starts the
//!   server side of TLS (`secure`), waits for the rest of the hello (`peek_later`), or
//!   takes the socket (`detach`).
//! - `secured()`: the handshake is done; the handler takes the stream.
//! - `ended(error)`: the client left, the handshake failed, or the handler raised
//!   `error` itself; the socket is closed.
//!
//! A question is answered by one of those calls before the handler returns: the
//! socket stays readable until its bytes are taken.
//!
//! Every step runs inside the loop's callback: no task, future or reader of Python's
//! per step, a handful of plain calls per connection. Deadlines are the handler's
//! (`abort`).

use std::io;
use std::os::fd::{IntoRawFd, RawFd};

use pyo3::exceptions::{PyConnectionResetError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::{PyTraverseError, PyVisit};
use rustls::ServerConnection;

use crate::stream::Stream;
use crate::watch::Watcher;
use crate::wire::connection::{Core, HANDSHAKE_DONE, WANTS_READ, owned_fd, py_error, session_of};
use crate::wire::tls::TlsConfig;

/// Bytes peeked for a request head: a longer CONNECT head is not the front end's.
pub const REQUEST_PEEK: usize = 8192;
/// Bytes peeked for a ClientHello. Hellos are well under 2 KiB, a post-quantum key
/// share included; one that is not whole within this is left to the handshake.
pub const HELLO_PEEK: usize = 32 * 1024;
const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Request,
    Tunnel,
    Handshake,
    Secured,
    Over,
}

/// What a readiness callback comes to.
enum Step {
    Wait,
    Ask(&'static str, Option<Vec<u8>>),
    End(io::Error),
}

#[pyclass(module = "sidecar.core.native")]
pub struct Arrival {
    /// The socket, and its TLS session once `secure` started it; None once handed on.
    core: Option<Core>,
    phase: Phase,
    watcher: Watcher,
    handler: Option<Py<PyAny>>,
    /// The client shut down its side while the handler waited for more of what it
    /// sent: nothing more will come.
    hung_up: bool,
}

impl Arrival {
    fn fd(&self) -> RawFd {
        self.core.as_ref().map_or(-1, Core::raw)
    }

    /// What the socket's readiness means in this phase.
    fn step(&mut self, py: Python<'_>) -> PyResult<Step> {
        let fd = self.fd();
        let Some(core) = self.core.as_mut() else {
            return Ok(Step::Wait);
        };
        let (limit, question, gone, unfinished) = match self.phase {
            Phase::Request => (
                REQUEST_PEEK,
                "request",
                "closed before its first request",
                "closed its side before its request head was whole",
            ),
            Phase::Tunnel => (
                HELLO_PEEK,
                "tunnelled",
                "closed inside the tunnel before its first byte",
                "closed its side before its ClientHello was whole",
            ),
            Phase::Handshake => {
                return match core.handshake() {
                    Ok(HANDSHAKE_DONE) => {
                        self.phase = Phase::Secured;
                        // Reading goes on, handed to the stream (`take_stream`).
                        self.watcher.writes(py, fd, false)?;
                        Ok(Step::Ask("secured", None))
                    }
                    Ok(wanted) => {
                        self.watcher.reads(py, fd, wanted == WANTS_READ)?;
                        self.watcher.writes(py, fd, wanted != WANTS_READ)?;
                        Ok(Step::Wait)
                    }
                    Err(e) => Ok(Step::End(e)),
                };
            }
            Phase::Secured | Phase::Over => return Ok(Step::Wait),
        };
        if self.hung_up {
            return Ok(Step::End(io::Error::new(
                io::ErrorKind::ConnectionReset,
                unfinished,
            )));
        }
        match peek(fd, limit) {
            Ok(Some(data)) if data.is_empty() => Ok(Step::End(io::Error::new(
                io::ErrorKind::ConnectionReset,
                gone,
            ))),
            Ok(Some(data)) => Ok(Step::Ask(question, Some(data))),
            Ok(None) => {
                self.watcher.reads(py, fd, true)?;
                Ok(Step::Wait)
            }
            Err(e) => Ok(Step::End(e)),
        }
    }

    /// The arrival is over: the loop watches its socket no more, and the handler goes.
    fn over(&mut self, py: Python<'_>) -> PyResult<()> {
        let fd = self.fd();
        self.phase = Phase::Over;
        self.handler = None;
        self.watcher.stop(py, fd)
    }

    fn expect(&self, phases: &[Phase], action: &str) -> PyResult<()> {
        if self.core.is_none() || !phases.contains(&self.phase) {
            return Err(PyValueError::new_err(format!("cannot {action} now")));
        }
        Ok(())
    }
}

/// Take a step, and ask or tell the handler what it came to, with the arrival no
/// longer borrowed. A handler that raises (a bug of ours) closes the connection, and
/// hears of its own error as the connection's end.
fn advance(slf: &Bound<'_, Arrival>) -> PyResult<()> {
    let py = slf.py();
    let step = slf.borrow_mut().step(py)?;
    let Some(handler) = slf.borrow().handler.as_ref().map(|h| h.clone_ref(py)) else {
        return Ok(());
    };
    let told = match step {
        Step::Wait => return Ok(()),
        Step::Ask(question, Some(data)) => {
            handler.call_method1(py, question, (PyBytes::new(py, &data),))
        }
        Step::Ask(question, None) => handler.call_method0(py, question),
        Step::End(error) => {
            Arrival::abort(slf)?;
            return handler
                .call_method1(py, "ended", (py_error(error).into_value(py),))
                .map(drop);
        }
    };
    if let Err(e) = told {
        Arrival::abort(slf)?;
        handler.call_method1(py, "ended", (e.into_value(py),))?;
    }
    Ok(())
}

/// The bytes waiting in `fd`, at most `limit`, left there; None when none has come.
pub(crate) fn peek(fd: RawFd, limit: usize) -> io::Result<Option<Vec<u8>>> {
    let mut data: Vec<u8> = Vec::with_capacity(limit);
    // SAFETY: `data` has room for `limit` bytes; recv writes at most that many.
    let n = unsafe { libc::recv(fd, data.as_mut_ptr().cast(), limit, libc::MSG_PEEK) };
    if n < 0 {
        let error = io::Error::last_os_error();
        return match error.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(error),
        };
    }
    // SAFETY: recv initialised the first `n` bytes.
    unsafe { data.set_len(n as usize) };
    Ok(Some(data))
}

/// Whether the peer of `fd` has shut down its side (its FIN came, or the connection
/// broke): the bytes waiting there are all that will ever come. A peek cannot tell,
/// since it returns them until they are read.
fn peer_hung_up(fd: RawFd) -> bool {
    let mut polled = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd, valid for the call; a timeout of 0 does not block.
    let ready = unsafe { libc::poll(&raw mut polled, 1, 0) };
    ready > 0 && polled.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Accept a client on the listening socket `listener`: its descriptor, non-blocking and
/// close-on-exec (with the listener's options, Nagle's delay off among them:
/// `sidecar.proxy.listeners`). No socket object of Python's per connection: the arrival
/// takes the descriptor.
#[pyfunction]
pub fn accept(listener: RawFd) -> PyResult<RawFd> {
    Ok(accept_client(listener)?)
}

fn accept_client(listener: RawFd) -> io::Result<RawFd> {
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: no peer address is asked for.
    let fd = unsafe { libc::accept4(listener, std::ptr::null_mut(), std::ptr::null_mut(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

#[pymethods]
impl Arrival {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.watcher.traverse(&visit)?;
        visit.call(&self.handler)?;
        Ok(())
    }

    fn __clear__(&mut self) {
        self.handler = None;
        self.watcher.clear();
    }

    /// Take the accepted socket `fd` over, and wait for its request head; `handler` is
    /// asked at every step. A `captured` connection (the hostAliases and transparent
    /// listeners) sends no CONNECT: what it sends first is the client's own, TLS or
    /// plain HTTP, and `tunnelled(first)` is the first question.
    #[new]
    #[pyo3(signature = (fd, event_loop, handler, captured=false))]
    fn new(fd: RawFd, event_loop: Py<PyAny>, handler: Py<PyAny>, captured: bool) -> PyResult<Self> {
        Ok(Self {
            core: Some(Core::new(owned_fd(fd)?, None)),
            phase: if captured { Phase::Tunnel } else { Phase::Request },
            watcher: Watcher::new(event_loop),
            handler: Some(handler),
            hung_up: false,
        })
    }

    /// Look at what has come (a client sends its request head at once), and watch
    /// for the rest.
    fn start(slf: &Bound<'_, Self>) -> PyResult<()> {
        let fd = slf.borrow().fd();
        slf.borrow_mut().watcher.bind(slf.as_any(), fd)?;
        advance(slf)
    }

    /// The loop's reader callback.
    fn readable(slf: &Bound<'_, Self>) -> PyResult<()> {
        advance(slf)
    }

    /// The loop's writer callback (a handshake flight the socket did not take at once).
    fn writable(slf: &Bound<'_, Self>) -> PyResult<()> {
        advance(slf)
    }

    /// Peek again in `delay` seconds: part of what the handler needs has come, and
    /// the socket stays readable until it is read. A client that has shut down its
    /// side will send no more: the arrival ends at once instead, as if it had left.
    fn peek_later(&mut self, py: Python<'_>, delay: f64) -> PyResult<()> {
        self.expect(&[Phase::Request, Phase::Tunnel], "peek")?;
        let fd = self.fd();
        self.watcher.reads(py, fd, false)?;
        self.hung_up = peer_hung_up(fd);
        self.watcher
            .read_later(py, if self.hung_up { 0.0 } else { delay })
    }

    /// Take the CONNECT head, `head_length` bytes, answer it, and wait for what comes
    /// first inside the tunnel.
    fn answer_connect(&mut self, py: Python<'_>, head_length: usize) -> PyResult<()> {
        self.expect(&[Phase::Request], "answer a CONNECT")?;
        let fd = self.fd();
        let mut head = vec![0u8; head_length];
        // SAFETY: `head` has room for `head_length` bytes.
        let taken = unsafe { libc::recv(fd, head.as_mut_ptr().cast(), head_length, 0) };
        // SAFETY: `ESTABLISHED` is valid for its length.
        let sent = unsafe {
            libc::send(
                fd,
                ESTABLISHED.as_ptr().cast(),
                ESTABLISHED.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        // The head was peeked, so it is all there; a fresh socket takes 39 bytes.
        if taken != head_length as isize || sent != ESTABLISHED.len() as isize {
            return Err(PyConnectionResetError::new_err(
                "the client went away while its CONNECT was answered",
            ));
        }
        self.phase = Phase::Tunnel;
        self.watcher.reads(py, fd, true)
    }

    /// Start the server side of TLS with `config` on the hello that came (left in the
    /// socket), and complete the handshake: `secured` or `ended` follows.
    fn secure(slf: &Bound<'_, Self>, config: PyRef<'_, TlsConfig>) -> PyResult<()> {
        {
            let mut arrival = slf.borrow_mut();
            arrival.expect(&[Phase::Tunnel], "start TLS")?;
            let session = ServerConnection::new(config.config.clone())
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            if let Some(core) = arrival.core.as_mut() {
                core.tls = Some(session_of(session.into()));
            }
            arrival.phase = Phase::Handshake;
        }
        advance(slf)
    }

    /// The connection as a stream (plain inside the tunnel, or secured; or, before any
    /// CONNECT, a client of the forward proxy itself, its first request still unread), started with
    /// `protocol` as `Stream.start` starts one. The loop's watch of the socket goes
    /// over to it as it is (no change the kernel sees), so the stream starts here and
    /// now: a stream that never started would leave the loop watching its socket.
    #[pyo3(signature = (protocol, requests=false))]
    fn take_stream(
        slf: &Bound<'_, Self>,
        protocol: Py<PyAny>,
        requests: bool,
    ) -> PyResult<Py<Stream>> {
        let py = slf.py();
        let (stream, waiting) = {
            let mut arrival = slf.borrow_mut();
            arrival.expect(&[Phase::Request, Phase::Tunnel, Phase::Secured], "make a stream")?;
            // What came first is still in the socket, unless the handshake read it.
            let waiting = arrival.phase != Phase::Secured;
            let watcher = arrival.watcher.hand_over(py);
            arrival.over(py)?;
            let core = arrival.core.take().expect("checked above");
            (Bound::new(py, Stream::of(core, watcher))?, waiting)
        };
        Stream::begin(&stream, protocol, requests, false, waiting)?;
        Ok(stream.unbind())
    }

    /// The socket, with whatever the client sent still in it, for someone else (the
    /// caller closes it).
    fn detach(&mut self, py: Python<'_>) -> PyResult<RawFd> {
        self.expect(&[Phase::Request, Phase::Tunnel], "detach")?;
        self.over(py)?;
        let core = self.core.take().expect("checked above");
        Ok(core.into_fd().map_or(-1, IntoRawFd::into_raw_fd))
    }

    /// Close the connection now (its deadline passed); the handler hears nothing more.
    fn abort(slf: &Bound<'_, Self>) -> PyResult<()> {
        let mut arrival = slf.borrow_mut();
        arrival.over(slf.py())?;
        if let Some(mut core) = arrival.core.take() {
            core.shut();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{accept_client, peek};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_peek_leaves_the_bytes_and_tells_nothing_yet_from_an_end() {
        let (mut near, mut far) = UnixStream::pair().unwrap();
        far.set_nonblocking(true).unwrap();
        let fd = far.as_raw_fd();
        assert_eq!(peek(fd, 16).unwrap(), None);
        near.write_all(b"CONNECT a:443 HTTP/1.1\r\n").unwrap();
        assert_eq!(peek(fd, 7).unwrap().as_deref(), Some(&b"CONNECT"[..]));
        let mut all = [0u8; 24];
        far.read_exact(&mut all).unwrap();
        assert_eq!(&all, b"CONNECT a:443 HTTP/1.1\r\n");
        drop(near);
        assert_eq!(peek(fd, 16).unwrap(), Some(Vec::new()));
    }

    /// Nagle's delay of a socket: on (1) or off (0).
    fn nodelay(fd: super::RawFd) -> libc::c_int {
        let mut on: libc::c_int = 0;
        let mut length = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `on` and `length` are valid for the option's size.
        let got = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&raw mut on).cast(),
                &raw mut length,
            )
        };
        assert_eq!(got, 0);
        on
    }

    #[test]
    fn an_accepted_client_is_non_blocking_close_on_exec_with_its_listeners_options() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let on: libc::c_int = 1;
        // SAFETY: the listener is open and `on` outlives the call.
        let set = unsafe {
            libc::setsockopt(
                listener.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&raw const on).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0);
        let error = accept_client(listener.as_raw_fd()).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::WouldBlock);
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let fd = accept_client(listener.as_raw_fd()).unwrap();
        // SAFETY: `fd` was just accepted, and is closed by this owner only.
        let accepted = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain queries of an open descriptor.
        let (status, descriptor) = unsafe {
            (
                libc::fcntl(fd, libc::F_GETFL),
                libc::fcntl(fd, libc::F_GETFD),
            )
        };
        assert_ne!(status & libc::O_NONBLOCK, 0);
        assert_ne!(descriptor & libc::FD_CLOEXEC, 0);
        // The listener's Nagle's delay, off: the sidecar's listeners set it once.
        assert_eq!(nodelay(fd), 1);
        drop(accepted);
    }
}
