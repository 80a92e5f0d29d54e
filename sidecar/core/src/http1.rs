//! HTTP/1.1 requests as a client sends them (RFC 9112), read from a buffer, sans I/O.
//!
//! The parser frames messages and refuses what cannot be read; what may be served is
//! decided in Python (`sidecar.wire.framing.request_head_error`: versions, Host, the
//! transfer codings), which gets each head with the fields its rules read. As strict
//! as llhttp, which parsed these requests before: a field line with whitespace before
//! its colon, an obsolete line folding, a control character or a bare CR, a
//! Content-Length that is not one number, both Content-Length and Transfer-Encoding,
//! a method llhttp does not know, a head over `MAX_HEAD`, a malformed chunk: refused.
//! Lines may end with a bare LF (RFC 9112 §2.2 allows it), except a chunked body's.

/// Request line and fields together; a larger head is refused with 431 (nginx's default
/// is 8 KiB a line; 64 KiB fits any signed URL and cookie).
pub const MAX_HEAD: usize = 64 * 1024;
/// Bytes of a chunk-size line or of a trailer line.
const MAX_CHUNK_LINE: usize = 4096;
/// Hex digits of a chunk size: up to 2**64 - 1.
const MAX_SIZE_DIGITS: usize = 16;

/// The methods llhttp reads in HTTP (RFC 9110's, WebDAV's, and the rest of its list);
/// any other is refused, as it was.
const METHODS: &[&str] = &[
    "DELETE",
    "GET",
    "HEAD",
    "POST",
    "PUT",
    "CONNECT",
    "OPTIONS",
    "TRACE",
    "COPY",
    "LOCK",
    "MKCOL",
    "MOVE",
    "PROPFIND",
    "PROPPATCH",
    "SEARCH",
    "UNLOCK",
    "BIND",
    "REBIND",
    "UNBIND",
    "ACL",
    "REPORT",
    "MKACTIVITY",
    "CHECKOUT",
    "MERGE",
    "M-SEARCH",
    "NOTIFY",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "PATCH",
    "PURGE",
    "MKCALENDAR",
    "LINK",
    "UNLINK",
    "SOURCE",
    "QUERY",
];

/// A request head, with what the framing and the origin depend on read out.
#[derive(Debug, PartialEq)]
pub struct Head {
    pub method: String,
    pub target: Vec<u8>,
    /// As the request line gave it: `1.1`, `1.0`, `0.9` for a line without a version.
    pub version: String,
    /// Names as sent, values without surrounding whitespace, both Latin-1.
    pub fields: Vec<(String, String)>,
    pub hosts: Vec<String>,
    /// The Transfer-Encoding lines joined by ", ".
    pub transfer_encoding: Option<String>,
    pub keep_alive: bool,
    /// An upgrade (RFC 9110 §7.8): the bytes after the head are the new protocol's.
    pub upgrade: bool,
    pub has_body: bool,
}

#[derive(Debug, PartialEq)]
pub enum Event {
    Head(Box<Head>),
    Body(Vec<u8>),
    End,
    /// The status to answer and why; nothing more is read.
    Refused(u16, String),
}

#[derive(Debug, PartialEq)]
enum State {
    Head,
    Length(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkDataEnd,
    Trailer,
    /// After an upgrade head, or a message that closes the connection: nothing more.
    Stopped,
    /// The message's end is to be reported next, then `after` is the state.
    Ending {
        after: Box<State>,
    },
}

/// The parser of one connection's requests, and what it has not read yet.
pub struct Parser {
    buffer: Vec<u8>,
    start: usize,
    state: State,
    keep_alive: bool,
}

impl Default for Parser {
    fn default() -> Self {
        Self {
            buffer: Vec::new(),
            start: 0,
            state: State::Head,
            keep_alive: true,
        }
    }
}

fn refuse(status: u16, why: &str) -> Event {
    Event::Refused(status, why.to_string())
}

fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| b as char).collect()
}

fn is_tchar(b: u8) -> bool {
    // RFC 9110 §5.6.2
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_field_char(b: u8) -> bool {
    // RFC 9110 §5.5: field-vchar, SP, HTAB, obs-text
    b == b'\t' || b == b' ' || (0x21..=0x7e).contains(&b) || b >= 0x80
}

fn has_token(value: &str, token: &str) -> bool {
    value
        .split(',')
        .any(|t| t.trim_matches([' ', '\t']).eq_ignore_ascii_case(token))
}

impl Parser {
    /// Bytes received, in order.
    pub fn feed(&mut self, data: &[u8]) {
        if self.state == State::Stopped {
            return;
        }
        if self.start > 0 && self.start >= self.buffer.len() / 2 {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        self.buffer.extend_from_slice(data);
    }

    /// True once nothing more will be parsed (an upgrade, a closing message, a refusal).
    pub fn stopped(&self) -> bool {
        self.state == State::Stopped
    }

    /// What was received after an upgrade head: the new protocol's first bytes.
    pub fn take_rest(&mut self) -> Vec<u8> {
        let rest = self.buffer[self.start..].to_vec();
        self.buffer.clear();
        self.start = 0;
        rest
    }

    fn pending(&self) -> &[u8] {
        &self.buffer[self.start..]
    }

    /// The next event the buffered bytes make, or None until more arrive.
    pub fn event(&mut self) -> Option<Event> {
        match std::mem::replace(&mut self.state, State::Stopped) {
            State::Head => self.head(),
            State::Ending { after } => {
                self.state = *after;
                Some(Event::End)
            }
            State::Length(left) => {
                let take = (left as usize).min(self.pending().len());
                if take == 0 {
                    self.state = State::Length(left);
                    return None;
                }
                let body = self.pending()[..take].to_vec();
                self.start += take;
                self.state = if left == take as u64 {
                    self.ending()
                } else {
                    State::Length(left - take as u64)
                };
                Some(Event::Body(body))
            }
            State::ChunkData(left) => {
                let take = (left as usize).min(self.pending().len());
                if take == 0 {
                    self.state = State::ChunkData(left);
                    return None;
                }
                let body = self.pending()[..take].to_vec();
                self.start += take;
                self.state = if left == take as u64 {
                    State::ChunkDataEnd
                } else {
                    State::ChunkData(left - take as u64)
                };
                Some(Event::Body(body))
            }
            state @ (State::ChunkSize | State::ChunkDataEnd | State::Trailer) => {
                self.chunk_line(state)
            }
            State::Stopped => None,
        }
    }

    /// After a message: the next request, or nothing if this one closes the connection.
    fn ending(&self) -> State {
        let after = if self.keep_alive {
            State::Head
        } else {
            State::Stopped
        };
        State::Ending {
            after: Box::new(after),
        }
    }

    /// One line of a chunked body (RFC 9112 §7.1), which must end with CRLF.
    fn chunk_line(&mut self, state: State) -> Option<Event> {
        let pending = self.pending();
        let Some(end) = pending.iter().position(|&b| b == b'\n') else {
            if pending.len() > MAX_CHUNK_LINE {
                return Some(refuse(400, "a chunk line is too long"));
            }
            self.state = state;
            return None;
        };
        if end > MAX_CHUNK_LINE {
            return Some(refuse(400, "a chunk line is too long"));
        }
        let Some(line) = pending[..end].strip_suffix(b"\r") else {
            return Some(refuse(400, "a chunk line does not end with CRLF"));
        };
        let line = line.to_vec();
        self.start += end + 1;
        match state {
            State::ChunkDataEnd if line.is_empty() => {
                self.state = State::ChunkSize;
                self.event()
            }
            State::ChunkDataEnd => Some(refuse(400, "data past a chunk's size")),
            State::ChunkSize => {
                // chunk = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
                let digits = line.split(|&b| b == b';').next().unwrap_or_default();
                let digits = digits.trim_ascii_end();
                if digits.is_empty()
                    || digits.len() > MAX_SIZE_DIGITS
                    || !digits.iter().all(u8::is_ascii_hexdigit)
                {
                    return Some(refuse(400, "invalid chunk size"));
                }
                let size = u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()?;
                self.state = if size == 0 {
                    State::Trailer
                } else {
                    State::ChunkData(size)
                };
                self.event()
            }
            _ if line.is_empty() => {
                self.state = self.ending();
                self.event()
            }
            _ => {
                // A trailer field: read past, never used.
                self.state = State::Trailer;
                self.event()
            }
        }
    }

    fn head(&mut self) -> Option<Event> {
        // RFC 9112 §2.2: empty lines before a request line are ignored.
        while let Some(skip) = [&b"\r\n"[..], b"\n"]
            .iter()
            .find(|eol| self.pending().starts_with(eol))
        {
            self.start += skip.len();
        }
        let pending = self.pending();
        let end = match find_head_end(pending) {
            Some(end) if end <= MAX_HEAD => end,
            Some(_) => return Some(refuse(431, "the request head is larger than 64 KiB")),
            None if pending.len() > MAX_HEAD => {
                return Some(refuse(431, "the request head is larger than 64 KiB"));
            }
            None => {
                self.state = State::Head;
                return None;
            }
        };
        let head = pending[..end].to_vec();
        self.start += end;
        match parse_head(&head) {
            Ok(head) => {
                self.keep_alive = head.keep_alive;
                self.state = if head.upgrade {
                    State::Stopped
                } else if head.transfer_encoding.is_some() {
                    // A request whose last coding is not chunked is refused above it.
                    State::ChunkSize
                } else {
                    match content_length(&head.fields) {
                        Some(length) if length > 0 => State::Length(length),
                        _ => self.ending(),
                    }
                };
                Some(Event::Head(Box::new(head)))
            }
            Err(event) => Some(event),
        }
    }
}

/// The length of the head (its empty line included), once it is all there.
fn find_head_end(data: &[u8]) -> Option<usize> {
    let mut at = 0;
    while let Some(newline) = data[at..].iter().position(|&b| b == b'\n') {
        let line_end = at + newline;
        let line = &data[at..line_end];
        if line.is_empty() || line == b"\r" {
            return Some(line_end + 1);
        }
        at = line_end + 1;
    }
    None
}

fn content_length(fields: &[(String, String)]) -> Option<u64> {
    fields
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.parse().ok())
}

fn parse_head(head: &[u8]) -> Result<Head, Event> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let request_line = lines.next().unwrap_or_default();
    if request_line.contains(&b'\r') {
        return Err(refuse(400, "a bare CR in the request line"));
    }
    let mut parts = request_line.split(|&b| b == b' ');
    let method = parts.next().unwrap_or_default();
    let target = parts.next().unwrap_or_default();
    let version = parts.next();
    if parts.next().is_some() {
        return Err(refuse(400, "the request line has more than three parts"));
    }
    let method = std::str::from_utf8(method).unwrap_or_default();
    if !METHODS.contains(&method) {
        return Err(refuse(400, "an unknown method"));
    }
    if target.is_empty() || target.iter().any(|&b| b <= b' ' || b == 0x7f) {
        return Err(refuse(400, "an invalid request target"));
    }
    let version = match version {
        None => "0.9".to_string(),
        Some(&[b'H', b'T', b'T', b'P', b'/', major, b'.', minor])
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            format!("{}.{}", major as char, minor as char)
        }
        Some(_) => return Err(refuse(400, "an invalid HTTP version")),
    };
    let mut fields = Vec::new();
    for line in lines.filter(|line| !line.is_empty()) {
        if line[0] == b' ' || line[0] == b'\t' {
            return Err(refuse(400, "an obsolete line folding"));
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err(refuse(400, "a field line without a colon"));
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err(refuse(400, "an invalid field name"));
        }
        let value = value.trim_ascii();
        if !value.iter().all(|&b| is_field_char(b)) {
            return Err(refuse(400, "an invalid character in a field value"));
        }
        fields.push((latin1(name), latin1(value)));
    }
    frame(method, target.to_vec(), version, fields)
}

fn frame(
    method: &str,
    target: Vec<u8>,
    version: String,
    fields: Vec<(String, String)>,
) -> Result<Head, Event> {
    let mut hosts = Vec::new();
    let mut transfer_encoding: Option<String> = None;
    let mut lengths = 0;
    let mut connection = String::new();
    let mut upgrade_field = false;
    for (name, value) in &fields {
        match name.to_ascii_lowercase().as_str() {
            "host" => hosts.push(value.clone()),
            "transfer-encoding" => {
                transfer_encoding = Some(match transfer_encoding {
                    Some(before) => format!("{before}, {value}"),
                    None => value.clone(),
                });
            }
            "content-length" => {
                lengths += 1;
                if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(refuse(400, "an invalid Content-Length"));
                }
                if value.parse::<u64>().is_err() {
                    return Err(refuse(400, "a Content-Length too large"));
                }
            }
            "connection" => {
                connection.push_str(value);
                connection.push(',');
            }
            "upgrade" => upgrade_field = true,
            _ => {}
        }
    }
    if lengths > 1 {
        return Err(refuse(400, "more than one Content-Length"));
    }
    // RFC 9112 §6.1: a request with both "ought to be handled as an error".
    if lengths == 1 && transfer_encoding.is_some() {
        return Err(refuse(400, "both Content-Length and Transfer-Encoding"));
    }
    let keep_alive = if version == "1.0" {
        has_token(&connection, "keep-alive")
    } else {
        !has_token(&connection, "close")
    };
    let upgrade = upgrade_field && has_token(&connection, "upgrade") && method != "CONNECT";
    let has_body = transfer_encoding.is_some() || content_length(&fields).is_some_and(|n| n > 0);
    Ok(Head {
        method: method.to_string(),
        target,
        version,
        fields,
        hosts,
        transfer_encoding,
        keep_alive,
        upgrade,
        has_body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(data: &[u8]) -> Vec<Event> {
        let mut parser = Parser::default();
        parser.feed(data);
        std::iter::from_fn(|| parser.event()).collect()
    }

    fn head(event: &Event) -> &Head {
        match event {
            Event::Head(head) => head,
            other => panic!("not a head: {other:?}"),
        }
    }

    fn refused(data: &[u8]) -> u16 {
        match events(data).pop() {
            Some(Event::Refused(status, _)) => status,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn pipelined_requests_with_bodies_are_framed_one_after_the_other() {
        let got = events(
            b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n\
              POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello\
              PUT /c HTTP/1.1\nHost: h\nTransfer-Encoding: chunked\t\n\n\
              5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n\
              HEAD /d HTTP/1.0\r\n\r\n",
        );
        assert_eq!(got.len(), 11, "{got:?}");
        let first = head(&got[0]);
        assert_eq!(
            (first.method.as_str(), &first.target[..]),
            ("GET", &b"/a"[..])
        );
        assert_eq!(first.hosts, ["h"]);
        assert!(first.keep_alive && !first.has_body);
        assert_eq!(got[1], Event::End);
        assert!(head(&got[2]).has_body);
        assert_eq!(got[3], Event::Body(b"hello".to_vec()));
        assert_eq!(got[4], Event::End);
        // A tab after `chunked` is optional whitespace (RFC 9110 §5.6.3).
        assert_eq!(head(&got[5]).transfer_encoding.as_deref(), Some("chunked"));
        assert_eq!(got[6], Event::Body(b"hello".to_vec()));
        assert_eq!(got[7], Event::Body(b" world".to_vec()));
        assert_eq!(got[8], Event::End);
        let last = head(&got[9]);
        assert_eq!(last.version, "1.0");
        assert!(!last.keep_alive);
        assert_eq!(got[10], Event::End);
    }

    #[test]
    fn a_request_arriving_a_byte_at_a_time_is_the_same() {
        let data = b"POST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n\
                     3\r\nabc\r\n0\r\n\r\n";
        let mut parser = Parser::default();
        let mut got = Vec::new();
        for byte in data {
            parser.feed(&[*byte]);
            got.extend(std::iter::from_fn(|| parser.event()));
        }
        let body: Vec<u8> = got
            .iter()
            .filter_map(|e| match e {
                Event::Body(b) => Some(b.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(body, b"abc");
        assert_eq!(got.last(), Some(&Event::End));
    }

    #[test]
    fn versions_are_handed_over_for_python_to_judge() {
        assert_eq!(head(&events(b"GET /x\r\n\r\n")[0]).version, "0.9");
        assert_eq!(head(&events(b"GET /x HTTP/2.0\r\n\r\n")[0]).version, "2.0");
        assert_eq!(refused(b"GET /x HTTP/1.1 x\r\n\r\n"), 400);
        assert_eq!(refused(b"GET /x HTTP/11\r\n\r\n"), 400);
    }

    #[test]
    fn what_llhttp_refused_is_refused() {
        for data in [
            &b"G\x00T /x HTTP/1.1\r\n\r\n"[..],
            b"BREW /x HTTP/1.1\r\n\r\n",
            b"GET /x y HTTP/1.1\r\n\r\n",
            b"GET /x HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n",
            b"GET /x HTTP/1.1\r\nA: b\r\n folded: line\r\n\r\n",
            b"GET /x HTTP/1.1\r\nX: a\rb\r\n\r\n",
            b"GET /x HTTP/1.1\r\nX: \x00\r\n\r\n",
            b"GET /x HTTP/1.1\r\nno colon\r\n\r\n",
            b"POST /x HTTP/1.1\r\nContent-Length: 1, 2\r\n\r\n",
            b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\rhello\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello, more\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
        ] {
            assert_eq!(refused(data), 400, "{}", String::from_utf8_lossy(data));
        }
    }

    #[test]
    fn a_head_over_the_limit_is_refused_with_431_even_unfinished() {
        let mut long = b"GET /x HTTP/1.1\r\nX: ".to_vec();
        long.resize(MAX_HEAD + 10, b'a');
        assert_eq!(refused(&long), 431);
        long.extend_from_slice(b"\r\n\r\n");
        assert_eq!(refused(&long), 431);
    }

    #[test]
    fn an_upgrade_stops_the_parser_and_leaves_what_follows() {
        let mut parser = Parser::default();
        parser.feed(b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nhi");
        assert!(head(&parser.event().unwrap()).upgrade);
        assert!(parser.stopped() && parser.event().is_none());
        assert_eq!(parser.take_rest(), b"hi");
    }

    #[test]
    fn nothing_is_read_after_a_message_that_closes_the_connection() {
        let got = events(b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\nGET /b HTTP/1.1\r\n\r\n");
        assert_eq!(got.len(), 2);
        assert!(!head(&got[0]).keep_alive);
        assert_eq!(got[1], Event::End);
    }
}
