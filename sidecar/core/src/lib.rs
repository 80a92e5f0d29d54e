//! The sidecar's byte path, under the decisions of its Python packages.
//!
//! `sidecar.core.native` to Python: a listener's plain-HTTP clients served from their
//! accept on (`Door`); any other client of the front end from its accept (`accept`)
//! until its first request (`Arrival`: the CONNECT answered, the ClientHello peeked, the
//! TLS handshake); a
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

// Bottom to top: what every layer uses, the wire, the shared memory, the buffer, the
// stream, the tee, the front end. Each module uses only those at or below its layer.
pub mod clock;
pub mod watch;
pub mod wire;
pub mod shared;
pub mod buffer;
pub mod stream;
pub mod tee;
pub mod front;

use pyo3::prelude::*;

#[pymodule]
fn native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<stream::Stream>()?;
    module.add_class::<front::arrival::Arrival>()?;
    module.add_class::<front::door::Door>()?;
    module.add_class::<buffer::answers::Answers>()?;
    module.add_class::<shared::lock::SharedLock>()?;
    module.add_class::<wire::tls::TlsConfig>()?;
    module.add_class::<wire::tls::ClientTls>()?;
    module.add_class::<tee::Tee>()?;
    module.add_class::<buffer::digest::Digest>()?;
    module.add_class::<wire::framed::Framed>()?;
    module.add_class::<wire::framed::Message>()?;
    module.add_function(wrap_pyfunction!(front::arrival::accept, module)?)?;
    module.add_function(wrap_pyfunction!(front::door::forwarded_request, module)?)?;
    module.add_function(wrap_pyfunction!(stream::relayed_bytes, module)?)?;
    module.add_function(wrap_pyfunction!(wire::framed::frame, module)?)?;
    let py = module.py();
    module.add("CertificateRejected", py.get_type::<wire::connection::CertificateRejected>())?;
    module.add("Truncated", py.get_type::<wire::connection::Truncated>())?;
    module.add("SHARED_LOCK_BYTES", shared::lock::BYTES)?;
    module.add("HELLO_PEEK", front::arrival::HELLO_PEEK)?;
    module.add("REQUEST_PEEK", front::arrival::REQUEST_PEEK)?;
    module.add("TLS_HANDSHAKE_RECORD", [front::door::TLS_HANDSHAKE_RECORD].as_slice())?;
    module.add("HANDSHAKE_DONE", wire::connection::HANDSHAKE_DONE)?;
    module.add("WANTS_READ", wire::connection::WANTS_READ)?;
    module.add("WANTS_WRITE", wire::connection::WANTS_WRITE)?;
    Ok(())
}
