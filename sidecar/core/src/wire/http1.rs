//! HTTP/1.1 messages (RFC 9112), read from a buffer, sans I/O: the requests a client
//! sends the lean front end, and the responses an origin sends the sidecar's client.
//!
//! The parser frames messages and refuses what cannot be read; what may be served or
//! relayed is decided in Python (`sidecar.wire.framing`: versions, Host, the transfer
//! codings of a request; the status of a response), which gets each head with the
//! fields its rules read. As strict as llhttp in its strict default (the parser before
//! it, and the reference a differential fuzzer holds it to on every test run:
//! `tests/sidecar/test_parser_differential.py`), on both edges. Refused, with 400 from
//! a client (431 for a head over `MAX_HEAD`) and 502 from an origin, nothing after it
//! read: a bare CR anywhere in a head, a chunk line or a trailer, and a line ended by a
//! bare LF (RFC 9112 §2.2 lets a recipient take a bare LF for a line's end; llhttp does
//! not, but after a request line without a version, nor does this parser, so that no two
//! readers of a relayed message split it into different lines); a request line that is not `method SP target SP HTTP/d.d` (one SP
//! each), with a method llhttp does not know or a target of a form llhttp refuses; a
//! status line that is not `HTTP/1.x SP 3DIGIT [SP reason]`, a status below 100; a
//! field line with whitespace before its colon, an obsolete line folding, or a control
//! character; a Content-Length that is not one number, or given twice; both
//! Content-Length and Transfer-Encoding; chunked applied twice (§6.1: "A sender MUST NOT
//! apply the chunked transfer coding more than once"); a request whose last coding is
//! not chunked (§6.3: the server "MUST respond with the 400"); an empty
//! Transfer-Encoding; a 1xx that announces a body (RFC 9110 §15.2); a chunk size that is
//! not hex or overflows 64 bits, a chunk extension outside §7.1.1's grammar (its BWS
//! too, as llhttp), data past a chunk's size, a trailer line that is no field line.
//!
//! Where it differs from llhttp, on purpose, the fuzzer lists the difference with its
//! reason (`KNOWN_DIFFERENCES` there; the table in `docs/reliability.md`): whitespace
//! after the last transfer coding is optional whitespace (RFC 9110 §5.6.3), so `chunked`
//! and a tab is chunked (llhttp refuses the request, and reads such a response to the
//! close); the parser hands every `HTTP/d.d` of a request line over, for Python to
//! refuse all but 1.x; and it refuses what llhttp lets by, where the RFCs allow it: a
//! bare CR or LF before a request line (only CRLF is skipped, §2.2) and any byte before
//! a status line, more than one SP in a request line (§3), a response that is not
//! HTTP/1.x, a control character in a reason phrase (§4), a status below 100, a 1xx
//! with a body, chunked twice in a response, a chunk extension with an empty value, the
//! method PRI (HTTP/2's preface), and a request that upgrades whose framing is invalid.
//!
//! Written here rather than taken from `httparse` (hyper's and Pingora's head parser,
//! which `cargo test` uses as a second reference for heads): httparse takes a bare LF
//! as a line's end, with no switch to refuse it, takes obs-text in a target and any
//! token as a method, and parses a head but not its framing (Content-Length,
//! Transfer-Encoding, chunks and trailers are its caller's). Made strict, it would be
//! wrapped in checks of every line for the LF and of each part again, and the framing
//! would still be ours: the head's grammar is the small part of this file.

/// Request line and fields together; a larger head is refused with 431 (nginx's default
/// is 8 KiB a line; 64 KiB fits any signed URL and cookie).
pub const MAX_HEAD: usize = 64 * 1024;
/// Bytes of a chunk-size line or of a trailer line.
const MAX_CHUNK_LINE: usize = 4096;

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

/// A response head, with what its framing depends on read out.
#[derive(Debug, PartialEq)]
pub struct ResponseHead {
    /// `1.1` or `1.0`.
    pub version: String,
    pub status: u16,
    pub reason: String,
    /// Names as sent, values without surrounding whitespace, both Latin-1.
    pub fields: Vec<(String, String)>,
    /// The Transfer-Encoding lines joined by ", ".
    pub transfer_encoding: Option<String>,
    /// The connection may carry another exchange after this one, as far as the framing
    /// and the fields say.
    pub keep_alive: bool,
    /// The connection's end delimits the body (RFC 9112 §6.3).
    pub until_close: bool,
}

#[derive(Debug, PartialEq)]
pub enum Event {
    Head(Box<Head>),
    Response(Box<ResponseHead>),
    Body(Vec<u8>),
    End,
    /// The status to answer and why; nothing more is read.
    Refused(u16, String),
    /// An origin sent bytes while no response was expected (after the last one ended:
    /// more than it announced); nothing more is read.
    Unasked,
}

#[derive(Debug, PartialEq)]
enum State {
    Head,
    Length(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkDataEnd,
    Trailer,
    /// A response body that the connection's end delimits: every byte is the body's.
    UntilClose,
    /// Responses: no request is waiting for one.
    Idle,
    /// After an upgrade head, a CONNECT, a message that closes the connection, or a
    /// refusal: nothing more.
    Stopped,
    /// The message's end is to be reported next, then `after` is the state.
    Ending {
        after: Box<State>,
    },
}

/// The parser of one connection's requests (or responses), and what it has not read yet.
pub struct Parser {
    buffer: Vec<u8>,
    start: usize,
    state: State,
    keep_alive: bool,
    /// It reads responses (else requests).
    responses: bool,
    /// Responses: the method of the request the next response answers.
    asked: String,
}

impl Default for Parser {
    /// A parser of requests.
    fn default() -> Self {
        Self {
            buffer: Vec::new(),
            start: 0,
            state: State::Head,
            keep_alive: true,
            responses: false,
            asked: String::new(),
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

/// Optional whitespace (RFC 9110 §5.6.3) taken off both ends; only SP and HTAB are.
fn trim_ows(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    let end = bytes.len()
        - bytes
            .iter()
            .rev()
            .take_while(|&&b| b == b' ' || b == b'\t')
            .count();
    &bytes[start.min(end)..end]
}

fn has_token(value: &str, token: &str) -> bool {
    value
        .split(',')
        .any(|t| t.trim_matches([' ', '\t']).eq_ignore_ascii_case(token))
}

/// Where the first line of `data` ends: the index of its LF, which must follow a CR;
/// None until the LF has come. A CR anywhere else is refused as soon as the byte after
/// it shows it bare, and a bare LF at once: RFC 9112 §2.2 lets a recipient read a bare
/// CR as SP and a bare LF as a line's end, or refuse them; llhttp refuses both, and so
/// does this parser, so that the two readers of a relayed message never disagree on
/// where its lines are.
fn line_end(data: &[u8]) -> Result<Option<usize>, &'static str> {
    for (at, &b) in data.iter().enumerate() {
        match b {
            b'\n' if at > 0 && data[at - 1] == b'\r' => return Ok(Some(at)),
            b'\n' => return Err("a line ends with a bare LF"),
            b'\r' if data.get(at + 1).is_some_and(|&next| next != b'\n') => {
                return Err("a bare CR");
            }
            _ => {}
        }
    }
    Ok(None)
}

impl Parser {
    /// A parser of the responses to the requests `expect` announces.
    pub fn responses() -> Self {
        Self {
            state: State::Idle,
            responses: true,
            ..Self::default()
        }
    }

    /// A parser of requests, or with `responses` of the responses to GETs (the first
    /// expected at once): what the tests feed bytes to (`framed::frame`).
    pub fn of_gets(responses: bool) -> Self {
        if !responses {
            return Self::default();
        }
        let mut parser = Self::responses();
        parser.expect("GET");
        parser
    }

    /// A request with `method` was sent: its response is read next (a response to HEAD
    /// has no body, nor has a 2xx to CONNECT).
    pub fn expect(&mut self, method: &str) {
        self.asked = method.to_string();
        if self.state == State::Idle {
            self.state = State::Head;
        }
    }

    /// Does it read responses (else requests)?
    pub fn reads_responses(&self) -> bool {
        self.responses
    }

    /// The status a refusal answers: 400 to a client, 502 for what an origin sent.
    fn refusal(&self, why: &str) -> Event {
        refuse(if self.reads_responses() { 502 } else { 400 }, why)
    }

    /// Bytes received, in order. Taken over whole when nothing waits before them: a
    /// body's bytes then leave as they came (`body`), never copied.
    pub fn feed(&mut self, data: impl Into<Vec<u8>>) {
        if self.state == State::Stopped {
            return;
        }
        if self.pending().is_empty() {
            self.buffer = data.into();
            self.start = 0;
            return;
        }
        if self.start > 0 && self.start >= self.buffer.len() / 2 {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        self.buffer.extend_from_slice(&data.into());
    }

    /// True once nothing more will be parsed (an upgrade, a closing message, a refusal).
    pub fn stopped(&self) -> bool {
        self.state == State::Stopped
    }

    /// How many of the bytes fed are not read yet.
    pub fn unread(&self) -> usize {
        self.pending().len()
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

    /// The next `take` pending bytes, a body's: the buffer itself when they are all of
    /// it (most of a large body, read after read), else a copy.
    fn body(&mut self, take: usize) -> Vec<u8> {
        if self.start == 0 && take == self.buffer.len() {
            return std::mem::take(&mut self.buffer);
        }
        let body = self.pending()[..take].to_vec();
        self.start += take;
        body
    }

    /// The next event the buffered bytes make, or None until more arrive. After a
    /// refusal the state stays `Stopped`: nothing past it is read.
    pub fn event(&mut self) -> Option<Event> {
        match std::mem::replace(&mut self.state, State::Stopped) {
            State::Head if self.reads_responses() => self.response_head(),
            State::Head => self.head(),
            State::Idle if self.pending().is_empty() => {
                self.state = State::Idle;
                None
            }
            State::Idle => Some(Event::Unasked),
            State::UntilClose => {
                self.state = State::UntilClose;
                let body = self.body(self.pending().len());
                (!body.is_empty()).then_some(Event::Body(body))
            }
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
                let body = self.body(take);
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
                let body = self.body(take);
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

    /// After a message: the next request, or nothing if this one closes the connection;
    /// for responses, waiting for the next request to be sent (Python decides whether
    /// the connection carries one).
    fn ending(&self) -> State {
        let after = if self.reads_responses() {
            State::Idle
        } else if self.keep_alive {
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
        let window = &pending[..pending.len().min(MAX_CHUNK_LINE + 2)];
        let end = match line_end(window) {
            Ok(Some(end)) => end,
            Ok(None) if pending.len() > MAX_CHUNK_LINE => {
                return Some(self.refusal("a chunk line is too long"));
            }
            Ok(None) => {
                self.state = state;
                return None;
            }
            Err(why) => return Some(self.refusal(why)),
        };
        let line = pending[..end - 1].to_vec();
        self.start += end + 1;
        match state {
            State::ChunkDataEnd if line.is_empty() => {
                self.state = State::ChunkSize;
                self.event()
            }
            State::ChunkDataEnd => Some(self.refusal("data past a chunk's size")),
            State::ChunkSize => match chunk_size(&line) {
                Ok(0) => {
                    self.state = State::Trailer;
                    self.event()
                }
                Ok(size) => {
                    self.state = State::ChunkData(size);
                    self.event()
                }
                Err(why) => Some(self.refusal(why)),
            },
            _ if line.is_empty() => {
                self.state = self.ending();
                self.event()
            }
            _ => match parse_field(&line) {
                // A trailer field: read past, never used.
                Ok(_) => {
                    self.state = State::Trailer;
                    self.event()
                }
                Err(why) => Some(self.refusal(why)),
            },
        }
    }

    fn head(&mut self) -> Option<Event> {
        // RFC 9112 §2.2: "a server that is expecting to receive and parse a request-line
        // SHOULD ignore at least one empty line (CRLF) received prior to the
        // request-line"; a bare CR or LF there is refused with the line it starts.
        while self.pending().starts_with(b"\r\n") {
            self.start += 2;
        }
        let head = match self.take_head()? {
            Ok(head) => head,
            Err(refusal) => return Some(refusal),
        };
        match parse_head(&head) {
            Ok(head) => {
                self.keep_alive = head.keep_alive;
                self.state = if head.upgrade || head.method == "CONNECT" {
                    // The bytes after the head are the new protocol's or the tunnel's
                    // (RFC 9110 §9.3.6), as llhttp leaves them.
                    State::Stopped
                } else if head.transfer_encoding.is_some() {
                    // A request whose last coding is not chunked was refused above.
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

    /// The next head (its empty line included) once it is all there, taken from the
    /// buffer; the refusal when its lines cannot be read or it is, or will be, over
    /// `MAX_HEAD` (431 for a request); None until then.
    fn take_head(&mut self) -> Option<Result<Vec<u8>, Event>> {
        let pending = self.pending();
        let too_large = || {
            if self.reads_responses() {
                self.refusal("the origin's response head is larger than 64 KiB")
            } else {
                refuse(431, "the request head is larger than 64 KiB")
            }
        };
        let end = match find_head_end(&pending[..pending.len().min(MAX_HEAD)]) {
            Ok(Some(end)) => end,
            Ok(None) if pending.len() >= MAX_HEAD => return Some(Err(too_large())),
            Ok(None) => {
                self.state = State::Head;
                return None;
            }
            Err(why) => return Some(Err(self.refusal(why))),
        };
        let head = pending[..end].to_vec();
        self.start += end;
        Some(Ok(head))
    }

    fn response_head(&mut self) -> Option<Event> {
        let head = match self.take_head()? {
            Ok(head) => head,
            Err(refusal) => return Some(refusal),
        };
        let (head, framing) = match parse_response(&head) {
            Ok(parsed) => parsed,
            Err(why) => return Some(self.refusal(why)),
        };
        let asked = self.asked.as_str();
        let status = head.status;
        let length = content_length(&head.fields);
        self.state = if status < 100 {
            // RFC 9110 §15: "Values outside the range 100..599 are invalid"; below 100
            // no rule says whether a body follows (llhttp frames one as a final
            // response's), and Python refuses it anyway (`response_head_error`).
            return Some(self.refusal("a status code below 100"));
        } else if status == 101 {
            // Switching protocols (RFC 9110 §15.2.2): what follows is the new protocol's.
            State::Stopped
        } else if status < 200 {
            // RFC 9110 §15.2: a 1xx "cannot contain content or trailers"; one that says
            // it has a body is framed by nobody's rules, and what follows it (another
            // response, perhaps) cannot be trusted.
            if head.transfer_encoding.is_some() || length.is_some_and(|n| n > 0) {
                return Some(self.refusal("a 1xx response announces a body"));
            }
            // Interim: the final response follows.
            State::Head
        } else if asked == "HEAD" || status == 204 || status == 304 {
            self.ending()
        } else if asked == "CONNECT" && status < 300 {
            // The tunnel's bytes follow, read once a request is sent inside it.
            self.ending()
        } else if head.transfer_encoding.is_some() {
            // RFC 9112 §6.3: chunked last, or the connection's end delimits the body.
            if framing.chunked {
                State::ChunkSize
            } else {
                State::UntilClose
            }
        } else {
            match length {
                Some(0) => self.ending(),
                Some(length) => State::Length(length),
                None => State::UntilClose,
            }
        };
        let until_close = self.state == State::UntilClose;
        let head = ResponseHead {
            keep_alive: head.keep_alive && !until_close,
            until_close,
            ..head
        };
        Some(Event::Response(Box::new(head)))
    }
}

/// The length of the head (its empty line included), once it is all there; or why its
/// lines cannot be read.
fn find_head_end(data: &[u8]) -> Result<Option<usize>, &'static str> {
    let mut at = 0;
    while let Some(end) = line_end(&data[at..])? {
        if end == 1 {
            return Ok(Some(at + 2)); // the empty line
        }
        at += end + 1;
    }
    Ok(None)
}

/// The lines of a head without their CRLF, which `find_head_end` found at the end of
/// each, and only there; without the empty line.
fn head_lines(head: &[u8]) -> impl Iterator<Item = &[u8]> {
    let head = head.strip_suffix(b"\r\n\r\n").unwrap_or_default();
    head.split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
}

/// A chunk-size line's size (RFC 9112 §7.1), its extensions checked and ignored.
fn chunk_size(line: &[u8]) -> Result<u64, &'static str> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err("invalid chunk size");
    }
    // "The chunk-size field is a string of hex digits": leading zeros are allowed, so
    // the digits are not counted; the value is (§7.1: "prevent parsing errors due to
    // integer conversion overflows").
    let mut size = 0u64;
    for &digit in &line[..digits] {
        let value = u64::from((digit as char).to_digit(16).unwrap_or_default());
        size = size
            .checked_mul(16)
            .and_then(|size| size.checked_add(value))
            .ok_or("a chunk size over 64 bits")?;
    }
    chunk_extensions(&line[digits..])?;
    Ok(size)
}

/// RFC 9112 §7.1.1: `*( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )`, a
/// name a token and a value a token or a quoted-string. Without the BWS, as llhttp:
/// no sender may send it ("A sender MUST NOT generate BWS").
fn chunk_extensions(mut rest: &[u8]) -> Result<(), &'static str> {
    const INVALID: &str = "an invalid chunk extension";
    while let [b';', after @ ..] = rest {
        let name = after.iter().take_while(|&&b| is_tchar(b)).count();
        if name == 0 {
            return Err(INVALID);
        }
        rest = &after[name..];
        if let [b'=', after @ ..] = rest {
            let value = match after {
                [b'"', ..] => quoted_string(after).ok_or(INVALID)?,
                _ => after.iter().take_while(|&&b| is_tchar(b)).count(),
            };
            if value == 0 {
                return Err(INVALID);
            }
            rest = &after[value..];
        }
    }
    if rest.is_empty() {
        Ok(())
    } else {
        Err(INVALID)
    }
}

/// The length of the quoted-string `data` starts with (RFC 9110 §5.6.4), or None.
fn quoted_string(data: &[u8]) -> Option<usize> {
    let mut at = 1;
    loop {
        match *data.get(at)? {
            b'"' => return Some(at + 1),
            b'\\' => {
                // quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text )
                let escaped = *data.get(at + 1)?;
                if !is_field_char(escaped) {
                    return None;
                }
                at += 2;
            }
            b if is_field_char(b) => at += 1,
            _ => return None,
        }
    }
}

fn content_length(fields: &[(String, String)]) -> Option<u64> {
    fields
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.parse().ok())
}

fn parse_head(head: &[u8]) -> Result<Head, Event> {
    let mut lines = head_lines(head);
    let request_line = lines.next().unwrap_or_default();
    // RFC 9112 §3: "request-line = method SP request-target SP HTTP-version", each
    // separated "by a single SP octet"; a recipient "MAY instead parse on
    // whitespace-delimited word boundaries", which "can result in request smuggling".
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
    if !valid_target(method, target) {
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
    let fields = lines
        .map(parse_field)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|why| refuse(400, why))?;
    frame(method, target.to_vec(), version, fields)
}

/// A request target of one of RFC 9112 §3.2's forms, in the bytes llhttp takes: visible
/// ASCII only (no obs-text, no control, no space), an origin-form or asterisk-form
/// (`/...`, `*`), an absolute-form with a scheme of letters, or CONNECT's
/// authority-form (refused above the parser), each authority without the characters RFC
/// 3986 leaves out of one.
fn valid_target(method: &str, target: &[u8]) -> bool {
    if target.is_empty() || !target.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return false;
    }
    if target[0] == b'/' || target[0] == b'*' {
        return true;
    }
    let authority = if method == "CONNECT" {
        target
    } else {
        let scheme = target
            .iter()
            .take_while(|b| b.is_ascii_alphabetic())
            .count();
        match target[scheme..].strip_prefix(b"://") {
            Some(rest) if scheme > 0 => rest,
            _ => return false,
        }
    };
    authority
        .iter()
        .take_while(|&&b| b != b'/' && b != b'?')
        .all(|b| !b"\"#<>\\^`{|}".contains(b))
}

/// One field line (RFC 9110 §5, RFC 9112 §5) of a head or a trailer section, or why it
/// cannot be read.
fn parse_field(line: &[u8]) -> Result<(String, String), &'static str> {
    if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
        return Err("an obsolete line folding");
    }
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return Err("a field line without a colon");
    };
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    // §5.1: "No whitespace is allowed between the field name and colon."
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return Err("an invalid field name");
    }
    let value = trim_ows(value);
    if !value.iter().all(|&b| is_field_char(b)) {
        return Err("an invalid character in a field value");
    }
    Ok((latin1(name), latin1(value)))
}

/// The framing fields of a message: its Transfer-Encoding lines joined, whether chunked
/// is its last coding, its Connection's tokens, its Host lines, and whether it has an
/// Upgrade; its Content-Length, if any, is one valid number.
struct Framing {
    transfer_encoding: Option<String>,
    chunked: bool,
    connection: String,
    hosts: Vec<String>,
    upgrade_field: bool,
}

fn framing(fields: &[(String, String)]) -> Result<Framing, &'static str> {
    let mut framing = Framing {
        transfer_encoding: None,
        chunked: false,
        connection: String::new(),
        hosts: Vec::new(),
        upgrade_field: false,
    };
    let mut lengths = 0;
    let mut codings = Vec::new();
    for (name, value) in fields {
        match name.to_ascii_lowercase().as_str() {
            "host" => framing.hosts.push(value.clone()),
            "transfer-encoding" => {
                framing.transfer_encoding = Some(match framing.transfer_encoding {
                    Some(before) => format!("{before}, {value}"),
                    None => value.clone(),
                });
                codings.extend(value.split(',').map(|c| c.trim_matches([' ', '\t'])));
            }
            "content-length" => {
                lengths += 1;
                if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                    return Err("an invalid Content-Length");
                }
                if value.parse::<u64>().is_err() {
                    return Err("a Content-Length too large");
                }
            }
            "connection" => {
                framing.connection.push_str(value);
                framing.connection.push(',');
            }
            "upgrade" => framing.upgrade_field = true,
            _ => {}
        }
    }
    if lengths > 1 {
        return Err("more than one Content-Length");
    }
    if framing.transfer_encoding.is_some() {
        // RFC 9112 §6.3 rule 3: a message with both "ought to be handled as an error".
        if lengths == 1 {
            return Err("both Content-Length and Transfer-Encoding");
        }
        if codings.iter().all(|c| c.is_empty()) {
            return Err("an empty Transfer-Encoding");
        }
        let chunked = |c: &&str| c.eq_ignore_ascii_case("chunked");
        // §6.1: "A sender MUST NOT apply the chunked transfer coding more than once".
        if codings.iter().filter(|c| chunked(c)).count() > 1 {
            return Err("chunked is applied more than once");
        }
        // The last element as sent: `chunked,` ends with an empty one, so that no
        // reader takes chunked for the last coding where llhttp does not.
        framing.chunked = codings.last().is_some_and(chunked);
    }
    Ok(framing)
}

/// RFC 9112 §9.3: HTTP/1.1 persists unless closed, HTTP/1.0 only with keep-alive; so does
/// every other version as llhttp reads it (the requests Python refuses).
fn keeps_alive(version: &str, connection: &str) -> bool {
    if version == "1.1" {
        !has_token(connection, "close")
    } else {
        has_token(connection, "keep-alive")
    }
}

/// A response head: `HTTP/1.x SP 3DIGIT [SP reason-phrase]` and its fields, and its
/// framing fields.
fn parse_response(head: &[u8]) -> Result<(ResponseHead, Framing), &'static str> {
    let mut lines = head_lines(head);
    let status_line = lines.next().unwrap_or_default();
    let (version, rest) = match status_line {
        [
            b'H',
            b'T',
            b'T',
            b'P',
            b'/',
            b'1',
            b'.',
            minor @ (b'0' | b'1'),
            rest @ ..,
        ] => (format!("1.{}", *minor as char), rest),
        _ => return Err("the status line has no HTTP/1.x version"),
    };
    let (digits, reason) = match rest {
        [b' ', a, b, c, reason @ ..] if [a, b, c].iter().all(|d| d.is_ascii_digit()) => {
            let reason = match reason {
                [] => &[][..],
                [b' ', reason @ ..] => reason,
                _ => return Err("an invalid status code"),
            };
            ([*a, *b, *c], reason)
        }
        _ => return Err("an invalid status code"),
    };
    if !reason.iter().all(|&b| is_field_char(b)) {
        return Err("an invalid character in the reason phrase");
    }
    let status = digits
        .iter()
        .fold(0u16, |n, &d| n * 10 + u16::from(d - b'0'));
    let fields = lines.map(parse_field).collect::<Result<Vec<_>, _>>()?;
    let framing = framing(&fields)?;
    let head = ResponseHead {
        keep_alive: keeps_alive(&version, &framing.connection),
        until_close: false, // framed by the parser, which knows the request
        version,
        status,
        reason: latin1(reason),
        fields,
        transfer_encoding: framing.transfer_encoding.clone(),
    };
    Ok((head, framing))
}

fn frame(
    method: &str,
    target: Vec<u8>,
    version: String,
    fields: Vec<(String, String)>,
) -> Result<Head, Event> {
    let Framing {
        transfer_encoding,
        chunked,
        connection,
        hosts,
        upgrade_field,
    } = framing(&fields).map_err(|why| refuse(400, why))?;
    // RFC 9112 §6.3: "If a Transfer-Encoding header field is present in a request and
    // the chunked transfer coding is not the final encoding, the message body length
    // cannot be determined reliably; the server MUST respond with the 400 (Bad Request)
    // status code and then close the connection."
    if transfer_encoding.is_some() && !chunked {
        return Err(refuse(
            400,
            "chunked is not the request's last transfer coding",
        ));
    }
    let keep_alive = keeps_alive(&version, &connection);
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
    use proptest::prelude::*;

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
              PUT /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\t\r\n\r\n\
              0005;ext=1;e=\"q\\\"\"\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n\
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
            parser.feed([*byte]);
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
    fn a_bare_cr_or_lf_anywhere_is_refused_at_once() {
        for data in [
            &b"GET /x HTTP/1.1\nHost: h\n\n"[..],
            b"GET /x HTTP/1.1\r\nHost: h\n\r\n",
            b"GET /x HTTP/1.1\r\nHost: h\r\n\n",
            b"GET /x\rHTTP/1.1\r\n\r\n",
            b"\nGET /x HTTP/1.1\r\n\r\n",
            b"\rGET /x HTTP/1.1\r\n\r\n",
            // Before the head is whole: what follows cannot make it valid.
            b"GET /x HTTP/1.1\r\nX: a\rb",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;a\rb\r\nhello\r\n0\r\n\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: y\n\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\n",
        ] {
            assert_eq!(refused(data), 400, "{}", String::from_utf8_lossy(data));
        }
        let got = responses(&["GET"], b"HTTP/1.1 200 OK\nContent-Length: 0\n\n");
        assert!(matches!(&got[..], [Event::Refused(502, _)]), "{got:?}");
    }

    #[test]
    fn every_framing_ambiguity_is_refused() {
        for data in [
            // RFC 9112 §6.1: chunked at most once, in one line or two.
            &b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n"[..],
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            // §6.3: a request's last coding is chunked, or its length is unknowable.
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked,\r\n\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked;q=1\r\n\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding:\r\n\r\n",
            b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"POST /x HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello",
            b"POST /x HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            // §7.1: sizes in hex digits only, below 2**64; extensions by §7.1.1.
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;\r\nhello\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5; a=b\r\nhello\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;a=\r\nhello\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;a=\"b\r\nhello\r\n",
            // Trailers are field lines.
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX : y\r\n\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: y\r\n z\r\n\r\n",
            // §3: one SP between a request line's parts.
            b"GET  /x HTTP/1.1\r\n\r\n",
            b"GET /x\tHTTP/1.1\r\n\r\n",
            b"GET x HTTP/1.1\r\n\r\n",
            b"GET /\x80 HTTP/1.1\r\n\r\n",
            b"GET http://a\"b/ HTTP/1.1\r\n\r\n",
            b"CONNECT \"a:443 HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\x0c\r\n\r\n",
        ] {
            assert_eq!(refused(data), 400, "{}", String::from_utf8_lossy(data));
        }
        for data in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n\r\n",
            b"HTTP/1.1 199 Hm\r\nContent-Length: 2\r\n\r\nhi",
            b"HTTP/1.1 103 Early\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"HTTP/1.1 000 OK\r\n\r\n",
            b"HTTP/1.1 099 OK\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a\rb\r\nhello\r\n",
        ] {
            let got = responses(&["GET"], data);
            assert!(
                matches!(got.last(), Some(Event::Refused(502, _))),
                "{}: {got:?}",
                String::from_utf8_lossy(data)
            );
        }
    }

    #[test]
    fn a_connect_stops_the_parser_and_leaves_the_tunnel_s_bytes() {
        let mut parser = Parser::default();
        parser.feed(b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n\x16\x03\x01");
        assert_eq!(head(&parser.event().unwrap()).method, "CONNECT");
        assert!(parser.stopped() && parser.event().is_none());
        assert_eq!(parser.take_rest(), b"\x16\x03\x01");
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

    /// The events of responses to requests with `methods`, each expected as soon as the
    /// one before ended.
    fn responses(methods: &[&str], data: &[u8]) -> Vec<Event> {
        let mut parser = Parser::responses();
        let mut methods = methods.iter();
        parser.expect(methods.next().unwrap());
        parser.feed(data);
        let mut got = Vec::new();
        while let Some(event) = parser.event() {
            let ended = event == Event::End;
            got.push(event);
            if ended {
                if let Some(method) = methods.next() {
                    parser.expect(method);
                }
            }
        }
        got
    }

    fn response(event: &Event) -> &ResponseHead {
        match event {
            Event::Response(head) => head,
            other => panic!("not a response: {other:?}"),
        }
    }

    #[test]
    fn responses_are_framed_by_the_request_their_status_and_their_fields() {
        let got = responses(
            &["GET", "HEAD", "GET", "GET"],
            b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n\
              HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello\
              HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n\
              HTTP/1.1 304 Not Modified\r\n\r\n\
              HTTP/1.1 200\r\nTransfer-Encoding: gzip, chunked\t\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        );
        assert_eq!(got.len(), 11, "{got:?}");
        assert_eq!(response(&got[0]).status, 103);
        let ok = response(&got[1]);
        assert_eq!(
            (ok.status, ok.reason.as_str(), ok.version.as_str()),
            (200, "OK", "1.1")
        );
        assert!(ok.keep_alive);
        assert_eq!(got[2], Event::Body(b"hello".to_vec()));
        assert_eq!(got[3], Event::End);
        // No body after a response to HEAD, nor after a 304, whatever the fields say.
        assert_eq!((response(&got[4]).status, &got[5]), (200, &Event::End));
        assert_eq!((response(&got[6]).status, &got[7]), (304, &Event::End));
        // A tab after the last coding is optional whitespace: chunked all the same.
        assert_eq!(response(&got[8]).reason, "");
        assert_eq!(got[9], Event::Body(b"abc".to_vec()));
        assert_eq!(got[10], Event::End);
    }

    #[test]
    fn a_body_without_a_length_ends_with_the_connection() {
        for data in [
            &b"HTTP/1.0 200 OK\r\n\r\nto the end"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nto the end",
        ] {
            let got = responses(&["GET"], data);
            assert!(!response(&got[0]).keep_alive && response(&got[0]).until_close);
            assert_eq!(got[1..], [Event::Body(b"to the end".to_vec())]);
        }
    }

    #[test]
    fn a_body_read_after_its_head_leaves_as_it_came_without_a_copy() {
        let mut parser = Parser::responses();
        parser.expect("GET");
        parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab".to_vec());
        assert!(matches!(parser.event(), Some(Event::Response(_))));
        assert_eq!(parser.event(), Some(Event::Body(b"ab".to_vec())));
        let read = b"cdefgh".to_vec();
        let at = read.as_ptr();
        parser.feed(read);
        match parser.event() {
            Some(Event::Body(body)) => {
                assert_eq!((body.as_slice(), body.as_ptr()), (&b"cdefgh"[..], at))
            }
            other => panic!("{other:?}"),
        }
        // Past the body's end: the part that is its own is copied, the rest kept.
        parser.feed(b"ijHTTP".to_vec());
        assert_eq!(parser.event(), Some(Event::Body(b"ij".to_vec())));
        assert_eq!(parser.event(), Some(Event::End));
        assert_eq!(parser.event(), Some(Event::Unasked));
    }

    #[test]
    fn what_an_origin_sends_past_its_response_is_unasked() {
        let got = responses(
            &["GET"],
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiFORGED",
        );
        assert_eq!(
            got[1..],
            [Event::Body(b"hi".to_vec()), Event::End, Event::Unasked]
        );
        let mut parser = Parser::responses();
        parser.feed(b"HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(parser.event(), Some(Event::Unasked)); // nothing was asked
        // A tunnel's answer: what follows is the tunnel's, read once a request is sent.
        let got = responses(&["CONNECT"], b"HTTP/1.1 200 Connection established\r\n\r\n");
        assert_eq!(got[1..], [Event::End]);
    }

    #[test]
    fn a_switch_of_protocols_stops_the_parser_and_leaves_what_follows() {
        let mut parser = Parser::responses();
        parser.expect("GET");
        parser.feed(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x02hi");
        assert_eq!(response(&parser.event().unwrap()).status, 101);
        assert!(parser.stopped() && parser.event().is_none());
        assert_eq!(parser.take_rest(), b"\x81\x02hi");
    }

    #[test]
    fn what_llhttp_refused_in_a_response_is_a_502() {
        for data in [
            &b"HTTP/2.0 200 OK\r\n\r\n"[..],
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 200OK\r\n\r\n",
            // Stricter than llhttp, which takes any byte but CR and LF: RFC 9112 §4.
            b"HTTP/1.1 200 O\x00K\r\n\r\n",
            b"ICY 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 0x5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX : y\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n",
        ] {
            let got = responses(&["GET"], data);
            assert!(
                matches!(got.last(), Some(Event::Refused(502, _))),
                "{}: {got:?}",
                String::from_utf8_lossy(data)
            );
        }
        let mut long = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        long.resize(MAX_HEAD + 10, b'a');
        let got = responses(&["GET"], &long);
        assert!(matches!(&got[..], [Event::Refused(502, why)] if why.contains("64 KiB")));
    }

    /// The events of `data` fed in pieces ending at `cuts` (then the rest), a body's
    /// consecutive pieces joined: how a body is cut depends on how it arrived, nothing
    /// else may. Responses answer GETs, each expected once the one before ended.
    fn fed(responses: bool, data: &[u8], cuts: &[usize]) -> Vec<Event> {
        let mut parser = Parser::of_gets(responses);
        let mut got: Vec<Event> = Vec::new();
        let mut from = 0;
        for &to in cuts.iter().chain([data.len()].iter()) {
            parser.feed(&data[from..to]);
            from = to;
            while let Some(event) = parser.event() {
                if responses && event == Event::End {
                    parser.expect("GET");
                }
                match (got.last_mut(), event) {
                    (Some(Event::Body(body)), Event::Body(more)) => body.extend(more),
                    (_, event) => got.push(event),
                }
            }
        }
        got
    }

    /// The bytes that turn framing, which mutations put in.
    const TURNING: &[u8] = b"\r\n :;=\"\t0123456789abcdefxX,-+\x00\x0b\x0c\x7f\x80\xff";

    /// `data` changed by `changes`: at a place (a fraction of its length), a byte of
    /// `TURNING` put in its place, inserted, or the byte removed, or the whole cut short.
    fn mutate(data: &[u8], changes: &[(f64, u8, usize)]) -> Vec<u8> {
        let mut out = data.to_vec();
        for &(place, kind, byte) in changes {
            let at = ((out.len() as f64) * place) as usize;
            let byte = TURNING[byte % TURNING.len()];
            match kind % 7 {
                0..=2 if at < out.len() => out[at] = byte,
                3 | 4 => out.insert(at.min(out.len()), byte),
                5 if at < out.len() => {
                    out.remove(at);
                }
                6 => out.truncate(at),
                _ => {}
            }
        }
        out
    }

    fn changes() -> impl Strategy<Value = Vec<(f64, u8, usize)>> {
        prop::collection::vec((0.0..1.0f64, any::<u8>(), any::<usize>()), 0..4)
    }

    /// A message as RFC 9112 builds it, to be encoded (`encode`) and read back.
    #[derive(Clone, Debug)]
    struct Built {
        /// A request line or a status line.
        start: String,
        fields: Vec<(String, String)>,
        body: Vec<u8>,
        /// The sizes of its chunks (their extensions and a trailer with them), or None
        /// for a Content-Length.
        chunks: Option<Vec<usize>>,
    }

    /// The bytes of `built` (RFC 9112 §2.1): its start line, its fields, the framing
    /// field, an empty line, and its body by length or in chunks.
    fn encode(built: &Built) -> Vec<u8> {
        let mut out = format!("{}\r\n", built.start).into_bytes();
        for (name, value) in &built.fields {
            out.extend(format!("{name}: {value}\r\n").bytes());
        }
        match &built.chunks {
            None => out.extend(format!("Content-Length: {}\r\n\r\n", built.body.len()).bytes()),
            Some(_) => out.extend(b"Transfer-Encoding: chunked\r\n\r\n"),
        }
        let Some(sizes) = &built.chunks else {
            out.extend(&built.body);
            return out;
        };
        let mut at = 0;
        for &size in sizes {
            let size = size.min(built.body.len() - at);
            if size == 0 {
                continue;
            }
            out.extend(format!("{size:X};n=v;q=\"a \\\" b\"\r\n").bytes());
            out.extend(&built.body[at..at + size]);
            out.extend(b"\r\n");
            at += size;
        }
        if at < built.body.len() {
            out.extend(format!("{:x}\r\n", built.body.len() - at).bytes());
            out.extend(&built.body[at..]);
            out.extend(b"\r\n");
        }
        out.extend(b"0\r\nExpires: 0\r\n\r\n");
        out
    }

    fn tokens() -> impl Strategy<Value = String> {
        "[!#$%&'*+.^_`|~0-9A-Za-z-]{1,10}"
    }

    /// Field lines other than the framing ones: a token and a value of visible ASCII
    /// with inner spaces and tabs (RFC 9110 §5.5).
    fn field_lines() -> impl Strategy<Value = Vec<(String, String)>> {
        let value = "([!-~]([!-~ \t]{0,10}[!-~])?)?";
        prop::collection::vec((tokens(), value), 0..5).prop_map(|fields| {
            fields
                .into_iter()
                .filter(|(name, _)| {
                    let name = name.to_ascii_lowercase();
                    ![
                        "content-length",
                        "transfer-encoding",
                        "connection",
                        "upgrade",
                    ]
                    .contains(&name.as_str())
                })
                .collect()
        })
    }

    fn framed_bodies() -> impl Strategy<Value = (Vec<u8>, Option<Vec<usize>>)> {
        (
            prop::collection::vec(any::<u8>(), 0..300),
            prop::option::of(prop::collection::vec(1..100usize, 0..5)),
        )
    }

    fn requests() -> impl Strategy<Value = Built> {
        let methods = prop::sample::select(vec!["GET", "POST", "PUT", "DELETE", "PATCH", "QUERY"]);
        let targets = "/[!-~]{0,20}|http://[a-z0-9.]{1,10}(:[0-9]{1,5})?/[!-~]{0,10}";
        let versions = prop::sample::select(vec!["1.1", "1.0"]);
        (methods, targets, versions, field_lines(), framed_bodies()).prop_map(
            |(method, target, version, fields, (body, chunks))| Built {
                start: format!("{method} {target} HTTP/{version}"),
                fields,
                body,
                chunks,
            },
        )
    }

    fn responses_built() -> impl Strategy<Value = Built> {
        let statuses =
            (200..600u16).prop_filter("a status with a body", |s| ![204, 304].contains(s));
        let reasons = "([!-~\t ]{0,12}[!-~])?";
        (statuses, reasons, field_lines(), framed_bodies()).prop_map(
            |(status, reason, fields, (body, chunks))| Built {
                start: format!("HTTP/1.1 {status} {reason}"),
                fields,
                body,
                chunks,
            },
        )
    }

    /// `fed`'s events of a message made of `head`, `body` and an end.
    fn parsed_as(events: &[Event], fields: &[(String, String)], body: &[u8]) -> bool {
        let head_fields = match events.first() {
            Some(Event::Head(head)) => &head.fields,
            Some(Event::Response(head)) => &head.fields,
            _ => return false,
        };
        let rest: Vec<&Event> = events[1..].iter().collect();
        let (got, end) = match rest[..] {
            [Event::End] => (&[][..], true),
            [Event::Body(got), Event::End] => (&got[..], true),
            _ => (&[][..], false),
        };
        end && got == body && head_fields[..fields.len()] == *fields
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Encoded by RFC 9112's rules, a valid request or response is read back as it
        /// was built, its body's bytes and its end where they were put, however its
        /// bytes are cut.
        #[test]
        fn an_encoded_message_is_read_back_as_it_was_built(
            built in prop_oneof![requests().prop_map(|b| (b, false)), responses_built().prop_map(|b| (b, true))],
            cut in 0.0..1.0f64,
        ) {
            let (built, is_response) = built;
            let data = encode(&built);
            let cut = ((data.len() as f64) * cut) as usize;
            for cuts in [&[][..], &[cut]] {
                let got = fed(is_response, &data, cuts);
                prop_assert!(parsed_as(&got, &built.fields, &built.body), "{:?}: {got:?}", String::from_utf8_lossy(&data));
            }
        }

        /// Any bytes (messages built, then changed a little) make the same events
        /// however they arrive, cut anywhere or a byte at a time: how a body is cut
        /// depends on how it arrived, nothing else may; and no bytes make it panic.
        #[test]
        fn any_bytes_frame_the_same_however_they_arrive(
            built in prop_oneof![requests().prop_map(|b| (b, false)), responses_built().prop_map(|b| (b, true))],
            changes in changes(),
            cuts in prop::collection::vec(0.0..1.0f64, 0..4),
            every_byte in prop::bool::weighted(0.05),
        ) {
            let (built, is_response) = built;
            let data = mutate(&encode(&built), &changes);
            let mut cuts: Vec<usize> = if every_byte {
                (1..data.len()).collect()
            } else {
                cuts.iter().map(|cut| ((data.len() as f64) * cut) as usize).collect()
            };
            cuts.sort_unstable();
            prop_assert_eq!(fed(is_response, &data, &cuts), fed(is_response, &data, &[]), "{:?} cut at {:?}", String::from_utf8_lossy(&data), cuts);
        }

        /// httparse (hyper's and Pingora's head parser, its leniencies off: its
        /// defaults) reads every request head this parser reads, the same; and refuses
        /// every one it refuses, but where httparse has leniencies it cannot switch
        /// off (a bare LF, any token as a method, obs-text or any form of target) and
        /// for the framing fields, which it does not read.
        #[test]
        fn request_heads_are_read_as_httparse_reads_them(built in requests(), changes in changes()) {
            let data = mutate(&encode(&built), &changes);
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut theirs = httparse::Request::new(&mut headers);
            let parsed = theirs.parse(&data);
            match events(&data).first() {
                Some(Event::Head(head)) if ["1.0", "1.1"].contains(&head.version.as_str()) => {
                    let length = head_length(&data);
                    prop_assert_eq!(parsed, Ok(httparse::Status::Complete(length)));
                    prop_assert_eq!(theirs.method, Some(head.method.as_str()));
                    prop_assert_eq!(theirs.path.map(str::as_bytes), Some(&head.target[..]));
                    prop_assert_eq!(theirs.version.map(|v| format!("1.{v}")), Some(head.version.clone()));
                    prop_assert_eq!(httparse_fields(theirs.headers), head.fields.clone());
                }
                Some(Event::Refused(_, why)) if !HTTPARSE_LENIENT.contains(&why.as_str()) && !FRAMING.contains(&why.as_str()) => {
                    prop_assert!(parsed.is_err(), "{:?}: {why}", String::from_utf8_lossy(&data));
                }
                _ => {}
            }
        }

        /// The same for response heads.
        #[test]
        fn response_heads_are_read_as_httparse_reads_them(built in responses_built(), changes in changes()) {
            let data = mutate(&encode(&built), &changes);
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut theirs = httparse::Response::new(&mut headers);
            let parsed = theirs.parse(&data);
            match responses(&["GET"], &data).first() {
                Some(Event::Response(head)) => {
                    prop_assert_eq!(parsed, Ok(httparse::Status::Complete(head_length(&data))));
                    prop_assert_eq!(theirs.code, Some(head.status));
                    // httparse gives a reason with obs-text as empty.
                    if head.reason.is_ascii() {
                        prop_assert_eq!(theirs.reason, Some(head.reason.as_str()));
                    }
                    prop_assert_eq!(theirs.version.map(|v| format!("1.{v}")), Some(head.version.clone()));
                    prop_assert_eq!(httparse_fields(theirs.headers), head.fields.clone());
                }
                Some(Event::Refused(_, why)) if !HTTPARSE_LENIENT.contains(&why.as_str()) && !FRAMING.contains(&why.as_str()) => {
                    prop_assert!(parsed.is_err(), "{:?}: {why}", String::from_utf8_lossy(&data));
                }
                _ => {}
            }
        }
    }

    /// The refusals of what httparse lets by with no switch to refuse it.
    const HTTPARSE_LENIENT: &[&str] = &[
        "a line ends with a bare LF",
        "an unknown method",
        "an invalid request target",
        // httparse reads any byte but CR and LF as the reason's (obs-text read as none).
        "an invalid character in the reason phrase",
        // Any three digits are a status to httparse.
        "a status code below 100",
    ];

    /// The refusals of framing fields, which httparse does not read.
    const FRAMING: &[&str] = &[
        "an invalid Content-Length",
        "a Content-Length too large",
        "more than one Content-Length",
        "both Content-Length and Transfer-Encoding",
        "an empty Transfer-Encoding",
        "chunked is applied more than once",
        "chunked is not the request's last transfer coding",
        "a 1xx response announces a body",
    ];

    /// Where the head of `data` ends, its empty line included.
    fn head_length(data: &[u8]) -> usize {
        data.windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(0, |at| at + 4)
    }

    fn httparse_fields(headers: &[httparse::Header<'_>]) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|h| (h.name.to_string(), latin1(trim_ows(h.value))))
            .collect()
    }
}
