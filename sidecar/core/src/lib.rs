//! The sidecar's byte path, under the decisions of its Python packages.
//!
//! `sidecar.core.native` to Python: a connection's stream (`Stream`: plain, the server
//! side of TLS by `TlsConfig` for the lean front end's clients, or the client side by
//! `ClientTls` towards origins) that moves every byte between the socket and its
//! protocol, and sends stored body files to a client without Python touching them;
//! and the table of answers Python recorded, which any worker's streams send again
//! (`Answers`).

pub mod answers;
pub mod http1;
pub mod outbox;
pub mod sink;
pub mod stream;
pub mod tls;

use pyo3::prelude::*;

#[pymodule]
fn native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<stream::Stream>()?;
    module.add_class::<answers::Answers>()?;
    module.add_class::<stream::TlsConfig>()?;
    module.add_class::<stream::ClientTls>()?;
    module.add("CertificateRejected", module.py().get_type::<stream::CertificateRejected>())?;
    module.add("Truncated", module.py().get_type::<stream::Truncated>())?;
    module.add("ANSWER_SLOT", answers::SLOT)?;
    module.add("HANDSHAKE_DONE", stream::HANDSHAKE_DONE)?;
    module.add("WANTS_READ", stream::WANTS_READ)?;
    module.add("WANTS_WRITE", stream::WANTS_WRITE)?;
    Ok(())
}
