//! The sidecar's byte path, under the decisions of its Python packages.
//!
//! `sidecar.core.native` to Python: a client of the front end from its accept
//! (`accept`) until its first request (`Arrival`: the CONNECT answered, the ClientHello peeked, the TLS handshake), a
//! connection's stream (`Stream`: plain, the server
//! side of TLS by `TlsConfig` for the lean front end's clients, or the client side by
//! `ClientTls` towards origins) that moves every byte between the socket and its
//! protocol, sends stored body files to a client without Python touching them, and
//! forwards what it reads to another stream (tunnels, upgrades, bodies that pass);
//! the table of answers Python recorded, which any worker's streams send again
//! (`Answers`); and a small body on its way from an origin into the buffer, which the
//! origin's stream feeds and the clients' streams send on as it comes (`Tee`); the
//! digest stored bodies are checked against (`Digest`); the lock every process takes to
//! change what they share (`SharedLock`); and, for the tests, the HTTP/1.1 parser
//! framing the bytes it is given (`frame`).

pub mod answers;
pub mod arrival;
pub mod clock;
pub mod digest;
pub mod door;
pub mod framed;
pub mod http1;
pub mod lock;
pub mod mapping;
pub mod outbox;
pub mod sink;
pub mod stream;
pub mod tee;
pub mod tls;
pub mod watch;

use pyo3::prelude::*;

#[pymodule]
fn native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<stream::Stream>()?;
    module.add_class::<arrival::Arrival>()?;
    module.add_class::<door::Door>()?;
    module.add_class::<answers::Answers>()?;
    module.add_class::<lock::SharedLock>()?;
    module.add_class::<stream::TlsConfig>()?;
    module.add_class::<stream::ClientTls>()?;
    module.add_class::<tee::Tee>()?;
    module.add_class::<digest::Digest>()?;
    module.add_class::<framed::Framed>()?;
    module.add_class::<framed::Message>()?;
    module.add_function(wrap_pyfunction!(arrival::accept, module)?)?;
    module.add_function(wrap_pyfunction!(door::forwarded_request, module)?)?;
    module.add_function(wrap_pyfunction!(stream::relayed_bytes, module)?)?;
    module.add_function(wrap_pyfunction!(framed::frame, module)?)?;
    module.add("CertificateRejected", module.py().get_type::<stream::CertificateRejected>())?;
    module.add("Truncated", module.py().get_type::<stream::Truncated>())?;
    module.add("SHARED_LOCK_BYTES", lock::BYTES)?;
    module.add("HELLO_PEEK", arrival::HELLO_PEEK)?;
    module.add("REQUEST_PEEK", arrival::REQUEST_PEEK)?;
    module.add("TLS_HANDSHAKE_RECORD", [door::TLS_HANDSHAKE_RECORD].as_slice())?;
    module.add("HANDSHAKE_DONE", stream::HANDSHAKE_DONE)?;
    module.add("WANTS_READ", stream::WANTS_READ)?;
    module.add("WANTS_WRITE", stream::WANTS_WRITE)?;
    Ok(())
}
