//! The sidecar's byte path, under the decisions of its Python packages.
//!
//! `sidecar.core.native` to Python: a client connection's stream (`Stream`, TLS by
//! `TlsConfig` or plain) that moves every byte between the socket and the lean HTTP/1.1
//! server, and sends stored body files to the client without Python touching them.

pub mod http1;
pub mod outbox;
pub mod sink;
pub mod stream;
pub mod tls;

use pyo3::prelude::*;

#[pymodule]
fn native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<stream::Stream>()?;
    module.add_class::<stream::TlsConfig>()?;
    module.add("HANDSHAKE_DONE", stream::HANDSHAKE_DONE)?;
    module.add("WANTS_READ", stream::WANTS_READ)?;
    module.add("WANTS_WRITE", stream::WANTS_WRITE)?;
    Ok(())
}
