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
//! (`Answers`), found by the buffer's key of a URL (`KeyRules`, `key_digest`); what a
//! fill keeps of an origin's common response (`JudgeRules`); which worker fetches which
//! key, and the room each fills alone (`Claims`); a small
//! body on its way from an origin into the buffer, which the origin's stream feeds and
//! the clients' streams send on as it comes (`Tee`); the
//! digest stored bodies are checked against (`Digest`); the lock every process takes to
//! change what they share (`SharedLock`); and, for the tests, the HTTP/1.1 parser
//! framing the bytes it is given (`frame`).

// Bottom to top: what every layer uses, the wire, the cache's rules, the shared memory,
// the buffer, the stream, the tee, the front end. Each module uses only those at or below
// its layer.
pub mod clock;
pub mod watch;
pub mod wire;
pub mod cache;
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
    module.add_class::<buffer::claims::Claims>()?;
    module.add_class::<cache::key::KeyRules>()?;
    module.add_class::<cache::judge::JudgeRules>()?;
    module.add_class::<shared::lock::SharedLock>()?;
    module.add_class::<wire::tls::TlsConfig>()?;
    module.add_class::<wire::tls::ClientTls>()?;
    module.add_class::<tee::Tee>()?;
    module.add_class::<buffer::digest::Digest>()?;
    module.add_class::<wire::framed::Framed>()?;
    module.add_class::<wire::framed::Message>()?;
    module.add_function(wrap_pyfunction!(front::arrival::accept, module)?)?;
    module.add_function(wrap_pyfunction!(front::door::forwarded_request, module)?)?;
    module.add_function(wrap_pyfunction!(cache::key::py_key_digest, module)?)?;
    module.add_function(wrap_pyfunction!(buffer::digest::body_matches, module)?)?;
    module.add_function(wrap_pyfunction!(buffer::digest::bodies_match, module)?)?;
    module.add_function(wrap_pyfunction!(stream::relayed_bytes, module)?)?;
    module.add_function(wrap_pyfunction!(wire::framed::frame, module)?)?;
    let py = module.py();
    module.add("CertificateRejected", py.get_type::<wire::connection::CertificateRejected>())?;
    module.add("Truncated", py.get_type::<wire::connection::Truncated>())?;
    module.add("SHARED_LOCK_BYTES", shared::lock::BYTES)?;
    module.add("CLAIM_SLOTS", buffer::claims::SLOTS)?;
    module.add("CLAIM_WINDOW", buffer::claims::WINDOW)?;
    module.add("HELLO_PEEK", front::arrival::HELLO_PEEK)?;
    module.add("REQUEST_PEEK", front::arrival::REQUEST_PEEK)?;
    module.add("TLS_HANDSHAKE_RECORD", [front::door::TLS_HANDSHAKE_RECORD].as_slice())?;
    module.add("HANDSHAKE_DONE", wire::connection::HANDSHAKE_DONE)?;
    module.add("WANTS_READ", wire::connection::WANTS_READ)?;
    module.add("WANTS_WRITE", wire::connection::WANTS_WRITE)?;
    Ok(())
}

#[cfg(test)]
mod layers {
    use std::path::Path;

    /// The crate's modules, bottom to top, as declared above.
    const LAYERS: [&[&str]; 8] = [
        &["clock", "watch"],
        &["wire"],
        &["cache"],
        &["shared"],
        &["buffer"],
        &["stream"],
        &["tee"],
        &["front"],
    ];

    fn layer(module: &str) -> usize {
        LAYERS
            .iter()
            .position(|modules| modules.contains(&module))
            .unwrap_or_else(|| panic!("{module} is in no layer"))
    }

    /// Each `crate::MODULE` that `text` names.
    fn named(text: &str) -> impl Iterator<Item = &str> {
        text.split("crate::").skip(1).map(|rest| {
            let end = rest.find(|c: char| !c.is_ascii_alphanumeric() && c != '_');
            &rest[..end.unwrap_or(rest.len())]
        })
    }

    #[test]
    fn each_module_uses_only_those_at_or_below_its_layer() {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![source.clone()];
        let mut checked = 0;
        while let Some(path) = files.pop() {
            if path.is_dir() {
                files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            let relative = path.strip_prefix(&source).unwrap();
            if path.extension().is_none_or(|e| e != "rs") || relative == Path::new("lib.rs") {
                continue;
            }
            let top = relative.components().next().unwrap().as_os_str().to_str().unwrap();
            let own = layer(top.trim_end_matches(".rs"));
            let text = std::fs::read_to_string(&path).unwrap();
            for module in named(&text) {
                assert!(layer(module) <= own, "{} uses crate::{module}", relative.display());
            }
            checked += 1;
        }
        assert!(checked > 10, "only {checked} modules found");
    }
}
