//! Bytes on the wire, apart from what they mean to a cache: HTTP/1.1's framing
//! (`http1`, and `framed` for the tests), TLS's configurations (`tls`), a connection's
//! socket and TLS session (`connection`), and what waits to be sent (`outbox`) into a
//! plain or TLS socket (`sink`).

pub mod connection;
pub mod framed;
pub mod http1;
pub mod outbox;
pub mod sink;
pub mod tls;
