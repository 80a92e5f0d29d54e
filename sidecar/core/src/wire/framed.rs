//! The core's HTTP/1.1 parser (`http1`) as Python's tests call it: bytes in, in the
//! pieces a socket might deliver them, framed messages out (`frame`). Nothing of the
//! sidecar calls it; the differential fuzzer (`tests/sidecar/test_parser_differential.py`)
//! compares what it frames with llhttp's framing of the same bytes.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::wire::http1::{Event, Parser};

/// One message as the parser framed it.
#[pyclass(module = "sidecar.core.native", frozen, get_all)]
#[derive(Clone)]
pub struct Message {
    /// A request's (a response's: empty).
    method: String,
    target: Vec<u8>,
    /// As the start line gave it: `1.1`, `1.0`, `0.9` for a request line without one.
    version: String,
    /// A response's (a request's: 0).
    status: u16,
    reason: String,
    fields: Vec<(String, String)>,
    keep_alive: bool,
    /// A request's upgrade; a response's 101.
    upgrade: bool,
    /// A response whose body the connection's end delimits.
    until_close: bool,
    body: Vec<u8>,
    /// The offset in all the bytes fed just past the message's last byte; None while it
    /// has not ended.
    end: Option<usize>,
}

/// What the parser made of the bytes.
#[pyclass(module = "sidecar.core.native", frozen, get_all)]
pub struct Framed {
    messages: Vec<Message>,
    /// The status and the reason of the refusal that ended the reading, if one did.
    refused: Option<(u16, String)>,
    /// Nothing more would be read (an upgrade, a CONNECT, a message that closes the
    /// connection, a refusal).
    stopped: bool,
    /// The bytes not read.
    rest: Vec<u8>,
}

impl Message {
    fn new(
        method: String,
        target: Vec<u8>,
        version: String,
        fields: Vec<(String, String)>,
    ) -> Self {
        Self {
            method,
            target,
            version,
            status: 0,
            reason: String::new(),
            fields,
            keep_alive: false,
            upgrade: false,
            until_close: false,
            body: Vec::new(),
            end: None,
        }
    }
}

/// The requests (or, with `responses`, the responses to GETs, one sent as soon as the
/// response before ended) that `pieces`, received one after the other, make.
#[pyfunction]
#[pyo3(signature = (pieces, responses = false))]
pub fn frame(pieces: Vec<Bound<'_, PyBytes>>, responses: bool) -> Framed {
    let mut parser = Parser::of_gets(responses);
    let (mut messages, mut refused) = (Vec::<Message>::new(), None);
    let (mut fed, mut ignored) = (0, Vec::new());
    for piece in &pieces {
        let piece = piece.as_bytes();
        if parser.stopped() {
            ignored.extend_from_slice(piece);
            continue;
        }
        parser.feed(piece);
        fed += piece.len();
        while let Some(event) = parser.event() {
            let read = fed - parser.unread();
            match event {
                Event::Head(head) => {
                    let mut message =
                        Message::new(head.method, head.target, head.version, head.fields);
                    message.keep_alive = head.keep_alive;
                    message.upgrade = head.upgrade;
                    // An upgrade or a CONNECT: the head is all of the message.
                    message.end = parser.stopped().then_some(read);
                    messages.push(message);
                }
                Event::Response(head) => {
                    let mut message =
                        Message::new(String::new(), Vec::new(), head.version, head.fields);
                    message.status = head.status;
                    message.reason = head.reason;
                    message.keep_alive = head.keep_alive;
                    message.upgrade = head.status == 101;
                    message.until_close = head.until_close;
                    // An interim response or a 101 ends with its head.
                    message.end = (head.status < 200).then_some(read);
                    messages.push(message);
                }
                Event::Body(data) => {
                    if let Some(message) = messages.last_mut() {
                        message.body.extend_from_slice(&data);
                    }
                }
                Event::End => {
                    if let Some(message) = messages.last_mut() {
                        message.end = Some(read);
                    }
                    if responses {
                        parser.expect("GET");
                    }
                }
                Event::Refused(status, why) => refused = Some((status, why)),
                // Never: a GET is announced as soon as each response ends.
                Event::Unasked => refused = Some((502, "unasked".to_string())),
            }
        }
    }
    let stopped = parser.stopped();
    let mut rest = parser.take_rest();
    rest.extend_from_slice(&ignored);
    Framed {
        messages,
        refused,
        stopped,
        rest,
    }
}
