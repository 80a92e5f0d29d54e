//! Answers Python gave to plain GETs of stored objects, kept in memory every worker of
//! the sidecar shares, so that any worker's core sends the same answer to the same
//! request again without calling Python.
//!
//! Python decides every hit (`sidecar.proxy.router`); when it answers a GET that
//! carries none of the fields its decision reads (`deciding`: ranges, conditionals,
//! Cache-Control, ...) with a whole stored body, it records the answer here: the URL,
//! the status line and fields as it wrote them up to its `Age`, the body file's path
//! and size, the response's generation time, and the index generation its lookup was
//! valid for. A request for that URL carrying none of those fields has the same answer
//! for as long as the generation stays (any removal or change of a stored object bumps
//! it), with the `Age` of the moment. What the table cannot answer (another URL, a
//! changed generation, a deciding field, a body file gone) goes to Python as before.
//!
//! The table is a region of the sidecar's shared memory file (`sidecar.shared`): slots
//! of `SLOT` bytes in sets of `WAYS`, found by a hash of the URL. Each slot is a
//! sequence lock: its first word is odd while a process writes it, and bumped by two
//! once written; a reader copies the slot out and uses the copy only if the word was
//! even and unchanged around the copy. Every word is read and written as an atomic, so
//! readers racing a writer see a torn copy at worst, and discard it. A writer that dies
//! mid-write leaves its slot odd: that slot is no longer used, and its URLs go to
//! Python.

use std::io;
use std::os::fd::RawFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering, fence};

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

use crate::clock::now;
use crate::http1::Head;

/// Bytes of one slot: seven words, then the URL, the head and the path.
pub const SLOT: usize = 1024;
/// Slots a URL may take: the set its hash names.
pub const WAYS: usize = 4;
const WORDS: usize = SLOT / 8;
const FIXED: usize = 7; // words before the bytes
const ROOM: usize = SLOT - FIXED * 8;

// The fixed words of a slot.
const SEQUENCE: usize = 0;
const HASH: usize = 1;
const GENERATION: usize = 2;
const BORN: usize = 3; // f64 bits; NaN: the answer carries no Age
const SIZE: usize = 4;
const LENGTHS: usize = 5; // URL, head, path: 16 bits each
const RECORDED: usize = 6; // when: the oldest of a full set gives way
/// URLs answered and not yet taken by `touched`, at most: past it, a use goes unheard
/// by the eviction's recency, which is a preference, not a guarantee.
const TOUCHES: usize = 65_536;

/// One recorded answer, copied out of its slot.
#[derive(Debug, PartialEq)]
pub struct Found {
    /// The status line and fields up to `Age`, each line with its CRLF.
    pub head: Vec<u8>,
    pub path: Vec<u8>,
    pub size: u64,
    pub born: Option<f64>,
}

impl Found {
    /// The whole head at `now` (seconds since the epoch): the recorded lines, the `Age`
    /// Python's `stamped` would give (whole seconds to the end of `now`'s second), the
    /// length, and `Connection: close` when the connection ends after it (`close`), in
    /// the order the lean server writes them.
    pub fn head_at(&self, now: f64, close: bool) -> Vec<u8> {
        let mut head = Vec::with_capacity(self.head.len() + 96);
        head.extend_from_slice(&self.head);
        if let Some(born) = self.born {
            let age = (now.floor() + 1.0 - born).trunc().max(0.0) as u64;
            head.extend_from_slice(format!("Age: {age}\r\n").as_bytes());
        }
        head.extend_from_slice(format!("Content-Length: {}\r\n", self.size).as_bytes());
        if close {
            head.extend_from_slice(b"Connection: close\r\n");
        }
        head.extend_from_slice(b"\r\n");
        head
    }
}

/// The table, mapped from the shared memory file.
#[pyclass(module = "sidecar.core.native", frozen)]
pub struct Answers {
    base: *mut u8,
    mapped: usize,
    generation: usize, // byte offset of the index generation word
    slots: usize,      // byte offset of the first slot
    count: usize,      // slots, a multiple of WAYS
    deciding: Vec<Vec<u8>>,
    hits: AtomicU64,
    bytes: AtomicU64,
    /// The URLs answered since `touched` was last asked, when `track_touches`.
    touches: Option<Mutex<Vec<Vec<u8>>>>,
}

// SAFETY: the mapping lives as long as the object, and every access to it is atomic.
unsafe impl Send for Answers {}
unsafe impl Sync for Answers {}

impl Drop for Answers {
    fn drop(&mut self) {
        // SAFETY: mapped by `new`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.mapped) };
    }
}

impl Answers {
    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: offsets are checked against the mapping in `new` and 8-aligned.
        unsafe { &*self.base.add(offset).cast::<AtomicU64>() }
    }

    fn slot_word(&self, slot: usize, word: usize) -> &AtomicU64 {
        self.word(self.slots + slot * SLOT + word * 8)
    }

    fn current_generation(&self) -> i64 {
        // SAFETY: as `word`; the generation is a signed word (`sidecar.shared`).
        let word = unsafe { &*self.base.add(self.generation).cast::<AtomicI64>() };
        word.load(Ordering::Acquire)
    }

    /// The first slot of the set `url` hashes to, and the hash.
    fn set_of(&self, url: &[u8]) -> (usize, u64) {
        let hash = fnv1a(url);
        let sets = self.count / WAYS;
        (((hash % sets as u64) as usize) * WAYS, hash)
    }

    /// The slot's words, copied while no writer was in it; None otherwise.
    fn copy(&self, slot: usize) -> Option<[u64; WORDS]> {
        let before = self.slot_word(slot, SEQUENCE).load(Ordering::Acquire);
        if before % 2 == 1 {
            return None;
        }
        let mut words = [0u64; WORDS];
        let load = |words: &mut [u64; WORDS], from: usize, count: usize| {
            for (i, word) in words.iter_mut().enumerate().skip(from).take(count) {
                *word = self.slot_word(slot, i).load(Ordering::Relaxed);
            }
        };
        load(&mut words, 1, FIXED - 1);
        let length = lengths(words[LENGTHS]).iter().sum::<usize>().min(ROOM);
        load(&mut words, FIXED, length.div_ceil(8));
        fence(Ordering::Acquire);
        let after = self.slot_word(slot, SEQUENCE).load(Ordering::Relaxed);
        (before == after).then_some(words)
    }

    /// The answer recorded for `url` under the current generation, if any.
    pub fn find(&self, url: &[u8]) -> Option<Found> {
        let (first, hash) = self.set_of(url);
        let generation = self.current_generation();
        for slot in first..first + WAYS {
            if self.slot_word(slot, HASH).load(Ordering::Relaxed) != hash {
                continue;
            }
            let Some(words) = self.copy(slot) else {
                continue;
            };
            let [url_length, head_length, path_length] = lengths(words[LENGTHS]);
            if words[HASH] != hash
                || words[GENERATION] as i64 != generation
                || url_length + head_length + path_length > ROOM
            {
                continue;
            }
            let used = (url_length + head_length + path_length).div_ceil(8);
            let bytes: Vec<u8> = words[FIXED..FIXED + used]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect();
            if &bytes[..url_length] != url {
                continue;
            }
            let born = f64::from_bits(words[BORN]);
            let head_end = url_length + head_length;
            return Some(Found {
                head: bytes[url_length..head_end].to_vec(),
                path: bytes[head_end..head_end + path_length].to_vec(),
                size: words[SIZE],
                born: (!born.is_nan()).then_some(born),
            });
        }
        None
    }

    /// May a request with this head have a recorded answer? A GET of HTTP/1.1 or 1.0
    /// that has no body, has one Host line and none of the fields a hit's decision
    /// reads, and names its target as its connection's `form` says: exactly the
    /// requests whose answer depends on the URL alone (and on whether the connection
    /// ends after it: `keep_alive`). An absolute target whose Host differs from its
    /// authority in any byte but a letter's case, or a Host that is not plainly an
    /// authority, is Python's to judge (`wire.framing.request_head_error`,
    /// `wire.server.Hosted`).
    pub fn may_answer(&self, head: &Head, form: TargetForm) -> bool {
        let origin_form = head.target.first() == Some(&b'/');
        let target_form = match form {
            TargetForm::Origin => origin_form,
            TargetForm::Absolute => head
                .hosts
                .first()
                .is_some_and(|host| names_authority(&head.target, host)),
            TargetForm::Hosted => {
                origin_form && head.hosts.first().is_some_and(|host| is_authority(host))
            }
        };
        head.method == "GET"
            && (head.version == "1.1" || head.version == "1.0")
            && !head.upgrade
            && !head.has_body
            && head.transfer_encoding.is_none()
            && head.hosts.len() == 1
            && target_form
            && head.target.is_ascii()
            && !head.fields.iter().any(|(name, _)| {
                self.deciding
                    .iter()
                    .any(|deciding| deciding.eq_ignore_ascii_case(name.as_bytes()))
            })
    }

    /// The table in the shared memory file `fd` (see `new`): InvalidInput if it does
    /// not fit the file.
    pub fn map(
        fd: RawFd,
        generation: usize,
        start: usize,
        count: usize,
        deciding: Vec<String>,
        track_touches: bool,
    ) -> io::Result<Self> {
        // SAFETY: a plain fstat of a descriptor the caller owns.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut stat) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mapped = stat.st_size as usize;
        if count == 0
            || count % WAYS != 0
            || generation % 8 != 0
            || start % 8 != 0
            || generation + 8 > mapped
            || start + count * SLOT > mapped
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the table does not fit the shared memory file",
            ));
        }
        // SAFETY: a shared mapping of the whole file, unmapped on drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            base: base.cast(),
            mapped,
            generation,
            slots: start,
            count,
            deciding: deciding.into_iter().map(String::into_bytes).collect(),
            hits: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            touches: track_touches.then(|| Mutex::new(Vec::new())),
        })
    }

    /// Count one answer sent from the table, for `url`.
    pub fn count(&self, url: &[u8], size: u64) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(size, Ordering::Relaxed);
        if let Some(touches) = &self.touches {
            let mut touches = touches
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if touches.len() < TOUCHES {
                touches.push(url.to_vec());
            }
        }
    }

    /// Write an answer into the set of its URL: the slot that holds the URL, else an
    /// empty one, else the one recorded longest ago. False if it does not fit, or another
    /// process is writing that slot.
    pub fn write(&self, url: &[u8], head: &[u8], path: &[u8], answer: &Recorded) -> bool {
        if url.len() + head.len() + path.len() > ROOM {
            return false;
        }
        let (first, hash) = self.set_of(url);
        let slot = (first..first + WAYS)
            .find(|&slot| {
                self.copy(slot).is_some_and(|words| {
                    let url_length = lengths(words[LENGTHS])[0];
                    words[HASH] == hash
                        && words[FIXED..]
                            .iter()
                            .flat_map(|w| w.to_le_bytes())
                            .take(url_length)
                            .eq(url.iter().copied())
                })
            })
            .or_else(|| {
                (first..first + WAYS)
                    .find(|&slot| self.slot_word(slot, LENGTHS).load(Ordering::Relaxed) == 0)
            })
            .unwrap_or_else(|| {
                (first..first + WAYS)
                    .min_by_key(|&slot| self.slot_word(slot, RECORDED).load(Ordering::Relaxed))
                    .unwrap_or(first)
            });
        let sequence = self.slot_word(slot, SEQUENCE);
        let before = sequence.load(Ordering::Relaxed);
        if before % 2 == 1
            || sequence
                .compare_exchange(before, before + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        fence(Ordering::Release);
        let mut bytes = Vec::with_capacity(ROOM);
        bytes.extend_from_slice(url);
        bytes.extend_from_slice(head);
        bytes.extend_from_slice(path);
        bytes.resize(bytes.len().div_ceil(8) * 8, 0);
        for (i, chunk) in bytes.chunks_exact(8).enumerate() {
            let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            self.slot_word(slot, FIXED + i)
                .store(word, Ordering::Relaxed);
        }
        let packed = url.len() as u64 | (head.len() as u64) << 16 | (path.len() as u64) << 32;
        let fixed = [
            (HASH, hash),
            (GENERATION, answer.generation as u64),
            (BORN, answer.born.unwrap_or(f64::NAN).to_bits()),
            (SIZE, answer.size),
            (LENGTHS, packed),
            (RECORDED, now().to_bits()),
        ];
        for (word, value) in fixed {
            self.slot_word(slot, word).store(value, Ordering::Relaxed);
        }
        sequence.store(before + 2, Ordering::Release);
        true
    }
}

/// What an answer says besides its bytes.
pub struct Recorded {
    pub size: u64,
    pub born: Option<f64>,
    pub generation: i64,
}

#[pymethods]
impl Answers {
    /// The table in the shared memory file `fd`: `count` slots from byte `start`, under
    /// the index generation word at byte `generation`; `deciding`: the names of the
    /// request fields a hit's decision reads (a request with any of them goes to
    /// Python); `track_touches`: remember which URLs it answered, for `touched`.
    #[new]
    #[pyo3(signature = (fd, generation, start, count, deciding, track_touches=false))]
    fn new(
        fd: RawFd,
        generation: usize,
        start: usize,
        count: usize,
        deciding: Vec<String>,
        track_touches: bool,
    ) -> PyResult<Self> {
        Self::map(fd, generation, start, count, deciding, track_touches).map_err(|e| {
            if e.kind() == io::ErrorKind::InvalidInput {
                PyValueError::new_err(e.to_string())
            } else {
                PyOSError::new_err(e.to_string())
            }
        })
    }

    /// Record Python's answer to a GET of `url` that carried no deciding field: `head`
    /// its status line and fields up to `Age` (each line with its CRLF), `path` the
    /// body file, `size` its length, `born` when the origin generated the response
    /// (None: no Age), `generation` the index generation the object was found under.
    /// False if it was not recorded (too long, or the slot busy).
    #[pyo3(signature = (url, head, path, size, born, generation))]
    fn record(
        &self,
        url: &[u8],
        head: &[u8],
        path: &[u8],
        size: u64,
        born: Option<f64>,
        generation: i64,
    ) -> bool {
        self.write(
            url,
            head,
            path,
            &Recorded {
                size,
                born,
                generation,
            },
        )
    }

    /// The URLs this process answered from the table since the last call, in order,
    /// when it tracks them (an eviction by recency counts them as uses).
    fn touched(&self) -> Vec<Vec<u8>> {
        self.touches.as_ref().map_or_else(Vec::new, |touches| {
            std::mem::take(
                &mut *touches
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            )
        })
    }

    /// Requests this process answered from the table.
    #[getter]
    fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Body bytes of those answers.
    #[getter]
    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// How a connection's requests name what they ask for (`Stream.answer_from`'s scope).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TargetForm {
    /// Inside a tunnel: the path, under the tunnel's origin.
    Origin,
    /// To the forward proxy itself: the whole URL.
    Absolute,
    /// On a captured connection: the path, under the origin the Host names.
    Hosted,
}

impl TargetForm {
    /// The form of a scope (`Stream.answer_from`): empty for the forward proxy's
    /// clients, a scheme alone (`http://`) for a captured connection's.
    pub fn of_scope(scope: &[u8]) -> Self {
        if scope.is_empty() {
            Self::Absolute
        } else if scope.ends_with(b"://") {
            Self::Hosted
        } else {
            Self::Origin
        }
    }
}

/// Is `host` plainly an authority: a name or an IP literal and a port, nothing that
/// would make a URL built with it point elsewhere?
fn is_authority(host: &str) -> bool {
    !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~:[]".contains(&b))
}

/// Does the absolute-form `target` (`http://` or `https://`, as clients send it) name
/// `host` as its authority, byte for byte but for letters' case? Narrower than what
/// Python accepts (`wire.framing.authority` drops a default port, for one): what it
/// refuses, Python decides.
fn names_authority(target: &[u8], host: &str) -> bool {
    let rest = if let Some(rest) = target.strip_prefix(b"http://") {
        rest
    } else if let Some(rest) = target.strip_prefix(b"https://") {
        rest
    } else {
        return false;
    };
    let end = rest
        .iter()
        .position(|&b| b == b'/' || b == b'?' || b == b'#')
        .unwrap_or(rest.len());
    let authority = &rest[..end];
    !authority.is_empty()
        && !authority.contains(&b'@')
        && authority.eq_ignore_ascii_case(host.as_bytes())
}

fn lengths(packed: u64) -> [usize; 3] {
    [0, 16, 32].map(|shift| ((packed >> shift) & 0xffff) as usize)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http1::{Event, Parser};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    const SLOTS: usize = 2 * WAYS;

    /// A table in a memory file of its own: the generation word, then the slots.
    fn table() -> (OwnedFd, Answers) {
        // SAFETY: a new memory file, owned at once.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"answers".as_ptr(), 0)) };
        // SAFETY: the descriptor is open.
        assert_eq!(
            unsafe { libc::ftruncate(fd.as_raw_fd(), (8 + SLOTS * SLOT) as i64) },
            0
        );
        let deciding = vec!["range".to_owned(), "if-none-match".to_owned()];
        let answers = Answers::map(fd.as_raw_fd(), 0, 8, SLOTS, deciding, true).expect("mapped");
        (fd, answers)
    }

    fn bump_generation(answers: &Answers) {
        answers.word(0).fetch_add(1, Ordering::Release);
    }

    fn recorded(size: u64, generation: i64) -> Recorded {
        Recorded {
            size,
            born: Some(1_000.5),
            generation,
        }
    }

    fn request(text: &[u8]) -> Head {
        let mut parser = Parser::default();
        parser.feed(text);
        match parser.event() {
            Some(Event::Head(head)) => *head,
            other => panic!("not a head: {other:?}"),
        }
    }

    #[test]
    fn an_answer_is_found_by_its_url_while_the_generation_stays() {
        let (_fd, answers) = table();
        let head = b"HTTP/1.1 200 OK\r\nETag: \"a\"\r\n";
        assert!(answers.write(b"https://h/a", head, b"/b/objects/1", &recorded(5, 0)));
        let found = answers.find(b"https://h/a").expect("recorded");
        assert_eq!(found.head, head);
        assert_eq!(
            (found.path.as_slice(), found.size),
            (&b"/b/objects/1"[..], 5)
        );
        assert_eq!(answers.find(b"https://h/b"), None);
        assert_eq!(answers.find(b"https://h/a?"), None);
        bump_generation(&answers);
        assert_eq!(
            answers.find(b"https://h/a"),
            None,
            "a removal anywhere forgets it"
        );
    }

    #[test]
    fn a_url_recorded_again_takes_its_own_slot_and_a_full_set_forgets_its_oldest() {
        let (_fd, answers) = table();
        // More URLs than one set holds: every set fills, and the oldest give way.
        let urls: Vec<Vec<u8>> = (0..3 * SLOTS)
            .map(|i| format!("https://h/{i}").into_bytes())
            .collect();
        for url in &urls {
            assert!(answers.write(url, b"HTTP/1.1 200 OK\r\n", b"/p", &recorded(1, 0)));
        }
        let kept = urls
            .iter()
            .filter(|url| answers.find(url).is_some())
            .count();
        assert_eq!(kept, SLOTS);
        let last = urls.last().expect("urls");
        assert!(answers.find(last).is_some(), "the newest is kept");
        assert!(answers.write(last, b"HTTP/1.1 200 OK\r\nX: 2\r\n", b"/q", &recorded(2, 0)));
        let found = answers.find(last).expect("still recorded");
        assert_eq!((found.path.as_slice(), found.size), (&b"/q"[..], 2));
        assert_eq!(
            urls.iter()
                .filter(|url| answers.find(url).is_some())
                .count(),
            SLOTS
        );
    }

    #[test]
    fn what_does_not_fit_a_slot_or_is_being_written_is_not_recorded() {
        let (_fd, answers) = table();
        let long = vec![b'x'; ROOM];
        assert!(!answers.write(b"https://h/a", &long, b"/p", &recorded(1, 0)));
        assert!(answers.write(
            b"https://h/a",
            b"HTTP/1.1 200 OK\r\n",
            b"/p",
            &recorded(1, 0)
        ));
        let (first, _) = answers.set_of(b"https://h/a");
        let slot = (first..first + WAYS)
            .find(|&slot| answers.slot_word(slot, LENGTHS).load(Ordering::Relaxed) != 0)
            .expect("written");
        // A writer inside the slot (or one that died there): readers keep out, and the
        // URL is written into another slot of its set.
        answers
            .slot_word(slot, SEQUENCE)
            .fetch_add(1, Ordering::AcqRel);
        assert_eq!(answers.find(b"https://h/a"), None);
        assert!(answers.write(
            b"https://h/a",
            b"HTTP/1.1 200 OK\r\n",
            b"/q",
            &recorded(1, 0)
        ));
        assert_eq!(
            answers.find(b"https://h/a").expect("written again").path,
            b"/q"
        );
        assert_eq!(
            answers.slot_word(slot, SEQUENCE).load(Ordering::Relaxed) % 2,
            1
        );
    }

    #[test]
    fn the_age_counts_to_the_end_of_the_current_second_and_the_head_ends() {
        let found = Found {
            head: b"HTTP/1.1 200 OK\r\n".to_vec(),
            path: vec![],
            size: 7,
            born: Some(1_000.5),
        };
        let head = found.head_at(1_010.2, false);
        assert_eq!(
            head,
            b"HTTP/1.1 200 OK\r\nAge: 10\r\nContent-Length: 7\r\n\r\n"
        );
        assert_eq!(
            found.head_at(1_010.2, true),
            b"HTTP/1.1 200 OK\r\nAge: 10\r\nContent-Length: 7\r\nConnection: close\r\n\r\n"
        );
        let unborn = Found {
            born: None,
            ..found
        };
        assert_eq!(
            unborn.head_at(1_010.2, false),
            b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n"
        );
        let future = Found {
            born: Some(2_000.0),
            ..unborn
        };
        assert!(String::from_utf8_lossy(&future.head_at(1_010.2, false)).contains("Age: 0\r\n"));
    }

    #[test]
    fn the_forward_proxy_answers_absolute_targets_whose_host_is_their_authority() {
        let (_fd, answers) = table();
        for answered in [
            &b"GET http://h/a HTTP/1.1\r\nHost: h\r\n\r\n"[..],
            b"GET http://h:8080/a?q HTTP/1.1\r\nHost: H:8080\r\n\r\n",
            b"GET https://h HTTP/1.1\r\nHost: h\r\n\r\n",
        ] {
            let head = request(answered);
            assert!(
                answers.may_answer(&head, TargetForm::Absolute),
                "{}",
                String::from_utf8_lossy(answered)
            );
        }
        for refused in [
            &b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"[..],
            b"GET http://h/a HTTP/1.1\r\nHost: g\r\n\r\n",
            b"GET http://h/a HTTP/1.1\r\nHost: h:80\r\n\r\n",
            b"GET http://h:80/a HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET ftp://h/a HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET http://u@h/a HTTP/1.1\r\nHost: h\r\n\r\n",
        ] {
            let head = request(refused);
            assert!(
                !answers.may_answer(&head, TargetForm::Absolute),
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
    }

    #[test]
    fn a_captured_connection_answers_origin_form_targets_of_a_plain_host() {
        let (_fd, answers) = table();
        let answered = request(b"GET /a HTTP/1.1\r\nHost: h.example:8080\r\n\r\n");
        assert!(answers.may_answer(&answered, TargetForm::Hosted));
        for refused in [
            &b"GET http://h/a HTTP/1.1\r\nHost: h\r\n\r\n"[..],
            b"GET /a HTTP/1.1\r\nHost: h/x\r\n\r\n",
            b"GET /a HTTP/1.1\r\nHost: u@h\r\n\r\n",
            b"GET /a HTTP/1.0\r\n\r\n",
        ] {
            let head = request(refused);
            assert!(
                !answers.may_answer(&head, TargetForm::Hosted),
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
        assert_eq!(TargetForm::of_scope(b""), TargetForm::Absolute);
        assert_eq!(TargetForm::of_scope(b"http://"), TargetForm::Hosted);
        assert_eq!(TargetForm::of_scope(b"https://h:8443"), TargetForm::Origin);
    }

    #[test]
    fn only_plain_gets_that_carry_no_deciding_field_may_be_answered() {
        let (_fd, answers) = table();
        for answered in [
            &b"GET /a HTTP/1.1\r\nHost: h\r\nAccept: */*\r\n\r\n"[..],
            b"GET /a HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            b"GET /a HTTP/1.0\r\nHost: h\r\n\r\n",
        ] {
            let head = request(answered);
            assert!(
                answers.may_answer(&head, TargetForm::Origin),
                "{}",
                String::from_utf8_lossy(answered)
            );
        }
        for refused in [
            &b"HEAD /a HTTP/1.1\r\nHost: h\r\n\r\n"[..],
            b"GET /a HTTP/2.0\r\nHost: h\r\n\r\n",
            b"GET /a HTTP/1.0\r\n\r\n",
            b"GET /a HTTP/1.1\r\nHost: h\r\nRANGE: bytes=0-1\r\n\r\n",
            b"GET /a HTTP/1.1\r\nHost: h\r\nIf-None-Match: \"a\"\r\n\r\n",
            b"GET /a HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nx",
            b"GET /a HTTP/1.1\r\nHost: h\r\nHost: h\r\n\r\n",
            b"GET https://h/a HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET /a HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        ] {
            let head = request(refused);
            assert!(
                !answers.may_answer(&head, TargetForm::Origin),
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
    }

    #[test]
    fn the_urls_answered_are_taken_once_for_the_eviction_by_recency() {
        let (_fd, answers) = table();
        answers.count(b"https://h/a", 3);
        answers.count(b"https://h/b", 4);
        assert_eq!(
            answers.touched(),
            vec![b"https://h/a".to_vec(), b"https://h/b".to_vec()]
        );
        assert!(answers.touched().is_empty());
        assert_eq!((answers.hits(), answers.bytes()), (2, 7));
    }
}
