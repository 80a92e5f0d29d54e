//! A connection's socket and its TLS session (rustls), apart from Python: what arrives,
//! read and decrypted; what waits to be sent (bytes and stored files' ranges), encrypted
//! and sent as the socket takes it; the TLS handshake, a step at a time; and the notices
//! a protocol must hear of them (`Notice`). A stream (`native.Stream`) drives one for
//! Python's protocols on the event loop.

use std::cell::RefCell;
use std::io::{self, Read};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use pyo3::create_exception;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use rustls::Connection;

use crate::wire::outbox::{Outbox, Sink};
use crate::wire::sink::{Socket, TLS_BATCH, Tls};

/// Plaintext handed to the protocol per readable event, at most.
pub(crate) const READ_SIZE: usize = 256 * 1024;
/// Ciphertext read from a socket at once: a TLS session reads 4 KiB at a time, which
/// would be a system call each, straight from the socket.
const CIPHERTEXT_READ: usize = 256 * 1024;

thread_local! {
    /// Where ciphertext lands on its way into a TLS session (streams run on the event
    /// loop's thread, one read at a time).
    static CIPHERTEXT: RefCell<Vec<u8>> = RefCell::new(vec![0; CIPHERTEXT_READ]);
}
/// Bytes waiting to be sent before the protocol is told to pause (asyncio's default
/// is 64 KiB; a stored body file is counted whole).
pub(crate) const DEFAULT_HIGH_WATER: u64 = 256 * 1024;

/// What a handshake step waits for.
pub const HANDSHAKE_DONE: u8 = 0;
pub const WANTS_READ: u8 = 1;
pub const WANTS_WRITE: u8 = 2;

create_exception!(
    sidecar.core.native,
    CertificateRejected,
    PyOSError,
    "The origin's certificate failed verification: the handshake was refused."
);
create_exception!(
    sidecar.core.native,
    Truncated,
    PyOSError,
    "The origin closed the connection without TLS's closure alert: what came before \
     may have been cut (RFC 9112 §9.8)."
);

/// Why an io::Error of the stream is one of the exceptions above.
#[derive(Debug)]
pub(crate) enum Marked {
    Rejected(String),
    Truncated,
}

impl std::fmt::Display for Marked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Rejected(why) => f.write_str(why),
            Self::Truncated => f.write_str("the origin closed without TLS's closure alert"),
        }
    }
}

impl std::error::Error for Marked {}

/// An io::Error of the stream as Python sees it.
pub(crate) fn py_error(error: io::Error) -> PyErr {
    match error.get_ref().and_then(|e| e.downcast_ref::<Marked>()) {
        Some(marked @ Marked::Rejected(_)) => CertificateRejected::new_err(marked.to_string()),
        Some(marked @ Marked::Truncated) => Truncated::new_err(marked.to_string()),
        None => PyErr::from(error),
    }
}

pub(crate) enum Notice {
    Data(Vec<u8>),
    Eof,
    PauseWriting,
    ResumeWriting,
    Lost(Option<io::Error>),
}

/// The stream's state apart from Python objects: everything `Notice`s are made from.
pub(crate) struct Core {
    fd: Option<OwnedFd>,
    pub(crate) tls: Option<Box<Connection>>,
    pub(crate) outbox: Outbox,
    read_buffer: Vec<u8>,
    pub(crate) high: u64,
    pub(crate) low: u64,
    pub(crate) writing_paused: bool,
    pub(crate) closing: bool,
    notified: bool, // the TLS closure alert was queued
    pub(crate) write_eof: bool,
    pub(crate) truncated: bool, // an origin ended the TCP connection without the closure alert
    /// Ciphertext read from the socket that the TLS session has not taken yet.
    unread: Vec<u8>,
    /// Plaintext the session decrypted while reading for the handshake: the next read
    /// takes it without reading the socket, whose bytes came with it.
    decrypted_ahead: bool,
}

impl Core {
    pub(crate) fn new(fd: OwnedFd, tls: Option<Box<Connection>>) -> Self {
        Self {
            fd: Some(fd),
            tls,
            outbox: Outbox::default(),
            read_buffer: Vec::new(),
            high: DEFAULT_HIGH_WATER,
            low: DEFAULT_HIGH_WATER / 4,
            writing_paused: false,
            closing: false,
            notified: false,
            write_eof: false,
            truncated: false,
            unread: Vec::new(),
            decrypted_ahead: false,
        }
    }

    /// The socket, given up: the stream no longer closes it.
    pub(crate) fn into_fd(mut self) -> Option<OwnedFd> {
        self.fd.take()
    }

    pub(crate) fn raw(&self) -> RawFd {
        use std::os::fd::AsRawFd;
        self.fd.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    pub(crate) fn closed(&self) -> bool {
        self.fd.is_none()
    }

    /// One step of the TLS handshake; what it waits for next.
    pub(crate) fn handshake(&mut self) -> io::Result<u8> {
        let socket = self.raw();
        let Some(session) = self.tls.as_deref_mut() else {
            return Ok(HANDSHAKE_DONE);
        };
        loop {
            if !session.is_handshaking() && waits_for_next_write(session) {
                return Ok(HANDSHAKE_DONE);
            }
            let mut sent = false;
            while session.wants_write() {
                match session.write_tls(&mut Socket(socket)) {
                    Ok(_) => sent = true,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(WANTS_WRITE),
                    Err(e) => return Err(e),
                }
            }
            if !session.is_handshaking() {
                return Ok(HANDSHAKE_DONE);
            }
            if sent {
                // The peer answers the flight just sent: nothing of that answer can be
                // there yet, and the socket's readiness says when it is.
                return Ok(WANTS_READ);
            }
            match session.read_tls(&mut Socket(socket)) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "closed during the TLS handshake",
                    ));
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(WANTS_READ),
                Err(e) => return Err(e),
            }
            if let Err(e) = session.process_new_packets() {
                // The alert goes out if it can; the handshake has failed either way.
                let _ = session.write_tls(&mut Socket(socket));
                return Err(handshake_error(e, is_client(session)));
            }
        }
    }

    /// Whether the TLS session holds plaintext (or the peer's closure) it decrypted
    /// while reading for the handshake; an error there is for `read` to tell.
    pub(crate) fn holds_plaintext(&mut self) -> bool {
        self.decrypted_ahead = self.tls.as_deref_mut().is_some_and(|session| {
            session.process_new_packets().map_or(true, |state| {
                state.plaintext_bytes_to_read() > 0 || state.peer_has_closed()
            })
        });
        self.decrypted_ahead
    }

    /// Read what has arrived: plaintext for the protocol, and whether the client ended.
    pub(crate) fn read(&mut self) -> io::Result<(Vec<u8>, bool)> {
        self.read_at_most(READ_SIZE)
    }

    /// `read`, stopping once `limit` bytes of plaintext are in hand.
    fn read_at_most(&mut self, limit: usize) -> io::Result<(Vec<u8>, bool)> {
        let socket = self.raw();
        let Some(session) = self.tls.as_deref_mut() else {
            self.read_buffer.resize(limit, 0);
            return match Socket(socket).read(&mut self.read_buffer) {
                Ok(0) => Ok((Vec::new(), true)),
                Ok(n) => Ok((self.read_buffer[..n].to_vec(), false)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok((Vec::new(), false)),
                Err(e) => Err(e),
            };
        };
        let unread = std::mem::take(&mut self.unread);
        let drained = std::mem::take(&mut self.decrypted_ahead) && unread.is_empty();
        let (plain, ended, rest) = CIPHERTEXT.with_borrow_mut(|buffer| {
            decrypt_arrived(session, Socket(socket), unread, buffer, limit, drained)
        })?;
        self.unread = rest;
        if ended.is_some_and(|closure_alert| !closure_alert) {
            // A TCP end without TLS's closure alert: a client is gone all the same; an
            // origin may have cut a body that only the connection's end delimits.
            self.truncated = is_client(session);
        }
        Ok((plain, ended.is_some()))
    }

    /// Whether ciphertext was read that the TLS session has not taken: the socket's
    /// readiness no longer announces it.
    pub(crate) fn holds_unread(&self) -> bool {
        !self.unread.is_empty()
    }

    /// Queue `parts` after what waits; while nothing does, the socket (or the TLS
    /// session) takes what it can of them at once, without a copy in between.
    pub(crate) fn write(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        let socket = Socket(self.raw());
        match self.tls.as_deref_mut() {
            Some(session) => {
                let mut sink = Tls::new(session, socket);
                for part in parts {
                    self.outbox.write(&mut sink, part)?;
                }
            }
            None => {
                let mut socket = socket;
                for part in parts {
                    self.outbox.write(&mut socket, part)?;
                }
            }
        }
        Ok(())
    }

    /// Send what the socket takes; true once nothing waits. A closing TLS stream ends
    /// with the closure alert, sent like the rest: it tells the client that what it got
    /// is all there is (RFC 9112 §9.8), so it never goes after a failure or an abort.
    pub(crate) fn pump(&mut self) -> io::Result<bool> {
        let socket = Socket(self.raw());
        let drained = match self.tls.as_deref_mut() {
            Some(session) => {
                let mut sink = Tls::new(session, socket);
                let mut drained = self.outbox.pump(&mut sink)?;
                if drained && self.closing && !self.notified {
                    self.notified = true;
                    sink.session().send_close_notify();
                    drained = Sink::flush(&mut sink)?;
                }
                drained
            }
            None => {
                let mut socket = socket;
                self.outbox.pump(&mut socket)?
            }
        };
        if drained && self.write_eof && self.tls.is_none() {
            // SAFETY: the descriptor is open.
            unsafe { libc::shutdown(self.raw(), libc::SHUT_WR) };
        }
        Ok(drained)
    }

    pub(crate) fn water_notice(&mut self) -> Option<Notice> {
        let queued = self.outbox.queued();
        if !self.writing_paused && queued > self.high {
            self.writing_paused = true;
            return Some(Notice::PauseWriting);
        }
        if self.writing_paused && queued <= self.low {
            self.writing_paused = false;
            return Some(Notice::ResumeWriting);
        }
        None
    }

    /// Close the socket now, dropping whatever waits.
    pub(crate) fn shut(&mut self) {
        if !self.closed() {
            // SAFETY: the descriptor is open; closing it is left to OwnedFd.
            unsafe { libc::shutdown(self.raw(), libc::SHUT_RDWR) };
        }
        self.fd = None;
        self.outbox.clear();
        self.unread = Vec::new();
    }
}

/// Decrypt what has arrived on `socket` for `session`, starting with `unread` (ciphertext
/// an earlier call read and left), reading the socket into `buffer` in large reads:
/// the plaintext, whether the peer ended (`Some(true)`: with TLS's closure alert,
/// `Some(false)`: the TCP connection only) and the ciphertext read and not taken,
/// which is left when `limit` bytes of plaintext are reached first. `drained`: the
/// socket holds nothing more for now (what came was read), so it is not read at first.
fn decrypt_arrived(
    session: &mut Connection,
    mut socket: Socket,
    unread: Vec<u8>,
    buffer: &mut [u8],
    limit: usize,
    mut drained: bool,
) -> io::Result<(Vec<u8>, Option<bool>, Vec<u8>)> {
    let mut plain = Vec::new();
    buffer[..unread.len()].copy_from_slice(&unread);
    let (mut taken, mut filled) = (0, unread.len());
    // A read shorter than the buffer took all there was, so the next would find
    // nothing: the socket's readiness says when more comes.
    let mut tcp_ended = false;
    loop {
        if taken == filled && !drained && !tcp_ended {
            (taken, filled) = (0, 0);
            match socket.read(buffer) {
                Ok(0) => tcp_ended = true,
                Ok(n) => (filled, drained) = (n, n < buffer.len()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => drained = true,
                Err(e) => return Err(e),
            }
        }
        if taken < filled {
            match session.read_tls(&mut &buffer[taken..filled])? {
                0 => {
                    let stuck = "the TLS session took none of the bytes that arrived";
                    return Err(io::Error::new(io::ErrorKind::InvalidData, stuck));
                }
                n => taken += n,
            }
        }
        let state = session.process_new_packets().map_err(|e| {
            let _ = session.write_tls(&mut socket);
            io::Error::new(io::ErrorKind::InvalidData, e)
        })?;
        let available = state.plaintext_bytes_to_read();
        let closure_alert = state.peer_has_closed();
        if available > 0 {
            let start = plain.len();
            plain.resize(start + available, 0);
            session.reader().read_exact(&mut plain[start..])?;
        }
        let all_taken = taken == filled;
        if closure_alert || (tcp_ended && all_taken) {
            return Ok((plain, Some(closure_alert), Vec::new()));
        }
        if (drained && all_taken) || plain.len() >= limit {
            return Ok((plain, None, buffer[taken..filled].to_vec()));
        }
    }
}

/// A descriptor Python hands over (`socket.detach()`), closed when dropped.
pub(crate) fn owned_fd(fd: RawFd) -> PyResult<OwnedFd> {
    if fd < 0 {
        return Err(PyValueError::new_err("not a socket"));
    }
    // SAFETY: the caller gives the open descriptor up; nothing else closes it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A session with room for a batch of records made while the last ones wait to leave:
/// what a client that reads slowly holds of ciphertext, at most.
pub(crate) fn session_of(mut session: Connection) -> Box<Connection> {
    session.set_buffer_limit(Some(2 * TLS_BATCH));
    Box::new(session)
}

/// Whether what `session` wants to write may wait for the next response: on our server
/// side of TLS 1.3, once the handshake is done, that is only its session tickets or a
/// key update, neither of which the client waits for (RFC 8446 §4.6.1, §4.6.3). They
/// leave with the response, in its system call, instead of one of their own.
pub(crate) fn waits_for_next_write(session: &Connection) -> bool {
    !is_client(session) && session.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3)
}

fn is_client(session: &Connection) -> bool {
    matches!(session, Connection::Client(_))
}

/// A failed handshake as an OSError whose message says what the peer did: an alert it
/// sent is named as the TLS specification spells it ("the client sent alert unknown ca"),
/// which is how the wire layer tells a client that refused our certificate. A client
/// session's verification failure is marked: the caller must not try another address.
fn handshake_error(error: rustls::Error, client: bool) -> io::Error {
    let peer = if client { "origin" } else { "client" };
    let message = match &error {
        rustls::Error::AlertReceived(alert) => {
            format!(
                "the {peer} sent alert {}",
                alert_name(&format!("{alert:?}"))
            )
        }
        rustls::Error::InvalidCertificate(why) if client => {
            return io::Error::new(
                io::ErrorKind::InvalidData,
                Marked::Rejected(why.to_string()),
            );
        }
        other => other.to_string(),
    };
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// `UnknownCA` -> `unknown ca`: words at each lower-to-upper case step, in lower case.
fn alert_name(variant: &str) -> String {
    let mut name = String::with_capacity(variant.len() + 4);
    let mut previous_lower = false;
    for c in variant.chars() {
        if c.is_uppercase() && previous_lower {
            name.push(' ');
        }
        previous_lower = c.is_lowercase();
        name.extend(c.to_lowercase());
    }
    name
}

#[cfg(test)]
mod tests {
    #[test]
    fn alerts_are_named_as_the_specification_spells_them() {
        use super::alert_name;
        assert_eq!(alert_name("UnknownCA"), "unknown ca");
        assert_eq!(alert_name("BadCertificate"), "bad certificate");
        assert_eq!(alert_name("CertificateUnknown"), "certificate unknown");
        let error = super::handshake_error(
            rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA),
            false,
        );
        assert_eq!(error.to_string(), "the client sent alert unknown ca");
    }

    use super::*;
    use crate::wire::tls::tests::{CA, CHAIN, KEY};
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConnection};
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    fn core(fd: OwnedFd) -> Core {
        let config = crate::wire::tls::server_config(CHAIN, KEY).unwrap();
        Core::new(
            fd,
            Some(session_of(ServerConnection::new(config).unwrap().into())),
        )
    }

    #[test]
    fn a_request_in_and_a_stored_body_out_over_tls() {
        let (server_side, client_side) = UnixStream::pair().unwrap();
        server_side.set_nonblocking(true).unwrap();
        let mut server = core(server_side.into());
        let body: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
        let path = std::env::temp_dir().join(format!("stream-{}", std::process::id()));
        std::fs::write(&path, &body).unwrap();
        let file: OwnedFd = std::fs::File::open(&path).unwrap().into();
        std::fs::remove_file(&path).unwrap();

        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(CA).unwrap())
            .unwrap();
        let client = std::thread::spawn(move || {
            let mut config = ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
            config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            let session = ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap());
            let mut tls = rustls::StreamOwned::new(session.unwrap(), client_side);
            tls.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            let mut received = Vec::new();
            tls.read_to_end(&mut received).unwrap();
            received
        });

        // Driven as the event loop would, polling instead of waiting for readiness.
        while server.handshake().unwrap() != HANDSHAKE_DONE {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            server.tls.as_ref().unwrap().alpn_protocol(),
            Some(&b"http/1.1"[..])
        );
        let mut request = Vec::new();
        while !request.ends_with(b"\r\n\r\n") {
            let (data, ended) = server.read().unwrap();
            assert!(!ended);
            request.extend_from_slice(&data);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(request, b"GET / HTTP/1.1\r\n\r\n");
        server.outbox.push_bytes(b"HEAD\r\n");
        server.outbox.push_file(file, 100, 900_100);
        server.closing = true; // the closure alert follows the body
        while !server.pump().unwrap() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        server.shut();
        let received = client.join().unwrap();
        assert_eq!(&received[..6], b"HEAD\r\n");
        assert_eq!(&received[6..], &body[100..900_100]);
    }

    /// A client session to a rustls server in a thread that sends `reply`, then its
    /// closure alert (`notify`) or only the TCP end; what the stream reads, and whether
    /// it saw the end as a cut.
    fn from_origin(name: &str, reply: &'static [u8], notify: bool) -> io::Result<(Vec<u8>, bool)> {
        from_origin_reading(name, reply, notify, READ_SIZE, |_| {})
    }

    /// `from_origin`, with `after_read` shown the stream after each of its reads.
    fn from_origin_reading(
        name: &str,
        reply: &'static [u8],
        notify: bool,
        limit: usize,
        mut after_read: impl FnMut(&Core),
    ) -> io::Result<(Vec<u8>, bool)> {
        let (near, far) = UnixStream::pair().unwrap();
        near.set_nonblocking(true).unwrap();
        let origin = std::thread::spawn(move || {
            let config = crate::wire::tls::server_config(CHAIN, KEY).unwrap();
            let mut tls = rustls::StreamOwned::new(ServerConnection::new(config).unwrap(), far);
            if tls.write_all(reply).is_err() {
                return; // the client refused the certificate
            }
            if notify {
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        });
        let config = crate::wire::tls::client_config(CA, &[]).unwrap();
        let session = ClientConnection::new(config, name.to_owned().try_into().unwrap());
        let mut client = Core::new(near.into(), Some(session_of(session.unwrap().into())));
        let outcome = (|| {
            while client.handshake()? != HANDSHAKE_DONE {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let mut received = Vec::new();
            loop {
                let (data, ended) = client.read_at_most(limit)?;
                after_read(&client);
                received.extend_from_slice(&data);
                if ended {
                    return Ok((received, client.truncated));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })();
        drop(client);
        origin.join().unwrap();
        outcome
    }

    #[test]
    fn an_origin_is_verified_and_its_end_told_from_a_cut() {
        let reply = b"HTTP/1.1 200 OK\r\n\r\nbody";
        assert_eq!(
            from_origin("localhost", reply, true).unwrap(),
            (reply.to_vec(), false)
        );
        assert_eq!(
            from_origin("localhost", reply, false).unwrap(),
            (reply.to_vec(), true)
        );
    }

    #[test]
    fn a_reply_larger_than_a_read_arrives_whole_what_a_read_leaves_read_next() {
        let reply: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
        let reply: &'static [u8] = Box::leak(reply.into_boxed_slice());
        let mut reads_left_ciphertext = 0;
        // Less than the socket holds at once, so that reads stop mid-way through it.
        let limit = 16 * 1024;
        let (received, cut) = from_origin_reading("localhost", reply, true, limit, |client| {
            assert!(client.unread.len() <= CIPHERTEXT_READ);
            reads_left_ciphertext += usize::from(client.holds_unread());
        })
        .unwrap();
        assert!(received == reply && !cut);
        // Reads stop at their limit of plaintext, mid-way through what the socket gave.
        assert!(reads_left_ciphertext > 0);
    }

    #[test]
    fn an_origin_certificate_for_another_name_is_rejected() {
        let error = from_origin("elsewhere.test", b"", true).unwrap_err();
        assert!(
            matches!(
                error.get_ref().and_then(|e| e.downcast_ref::<Marked>()),
                Some(Marked::Rejected(why)) if why.contains("elsewhere.test")
            ),
            "{error}"
        );
    }
}
