//! Answers Python gave to plain GETs of stored objects, kept in memory every worker of
//! the sidecar shares, so that any worker's core sends the same answer to the same
//! request again without calling Python.
//!
//! Python decides every hit (`sidecar.proxy.router`); when it answers a GET that
//! carries none of the fields its decision reads (`deciding`: ranges, conditionals,
//! Cache-Control, ...) with a whole stored body, and when a fill commits, it records the
//! answer here under the digest of the object's key (`key`: the index's own, so that a
//! URL signed anew, whose key drops its signature, finds the answer too): the status
//! line and fields as it wrote them up to its `Age`, the body file's name and size, and
//! the response's generation time. A request for a URL of that key carrying none of
//! those fields has the same answer, with the `Age` of the moment, until the object is
//! removed or changed: the buffer's keeper then bumps the index generation and forgets
//! that key's answer (`forget`), and only that one. An answer is recorded only while
//! the index is still at the generation the lookup that made it saw (checked under the
//! writers' lock, which `forget` takes too), so that an answer made from an object just
//! removed is never written after its removal. What the table cannot answer (another
//! key, a deciding field, a body file gone) goes to Python as before.
//!
//! The table is a region of the sidecar's shared memory file (`sidecar.shared`), sized
//! for the objects the buffer may hold (`--index-objects`): a word (the arena's
//! reservations), then entries of `ENTRY` bytes in sets of `WAYS`, found by the key's
//! digest, then an arena of bytes where each answer's head and body file's name (in the
//! buffer's directory of bodies, `bodies`: the same for every answer) are written one
//! after the other, as a ring, behind the half of the digest its entry has no room
//! for. An entry holds the fixed
//! words of an answer and where in the arena its bytes are; the arena lets answers of
//! any length share one budget (the heads of a cloud store are ten times those of a
//! plain server) where fixed slots would have to be sized for the longest.
//!
//! Each entry is a sequence lock: its first word is odd while a process writes it, and
//! bumped by two once written; a reader copies the entry out and uses the copy only if
//! the word was even and unchanged around the copy. The arena is reserved by adding to
//! its first word, the bytes reserved since the table was made: an answer's bytes stay
//! valid until reservations pass them by the arena's size, so a reader that copied them
//! checks the word after the copy, and drops an answer the ring overwrote meanwhile.
//! Every word is read and written as an atomic, so readers racing a writer see a torn
//! copy at worst, and discard it. Writers take the shared file's lock (`lock`), one at a
//! time, while they reserve, write and publish an answer: a writer preempted
//! mid-write while others went a whole lap around the ring would otherwise finish
//! writing into a newer answer's bytes, which no reservation check can see. A writer
//! that dies mid-write leaves its entry odd: that entry is no longer used, and its URLs
//! go to Python; the lock passes to the next writer.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering, fence};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::cache::key::{DIGEST, KeyRules, Rules, digest};
use crate::clock::now;
use crate::shared::lock::SharedLock;
use crate::shared::mapping::{Mapping, python_error};
use crate::wire::http1::Head;

/// Bytes of one entry: seven words.
pub const ENTRY: usize = 56;
/// Bytes before the entries: the arena's reservations.
pub const HEADER: usize = 8;
/// Entries a key may take: the set the first half of its digest names.
pub const WAYS: usize = 8;
/// The longest answer (head and name, behind half a digest) recorded: longer ones stay
/// Python's, so that one answer never takes more than a small part of the arena.
pub const LONGEST: usize = 16 * 1024;
const WORDS: usize = ENTRY / 8;

// The header's word.
const RESERVED: usize = 0; // arena bytes reserved since the table was made

// The words of an entry.
const SEQUENCE: usize = 0;
const HASH: usize = 1; // the first half of the key's digest
const BORN: usize = 2; // f64 bits; NaN: the answer carries no Age
const SIZE: usize = 3;
const LENGTHS: usize = 4; // head, name: 16 bits each; 0: never written, or forgotten
const RECORDED: usize = 5; // when: the oldest of a full set gives way
const AT: usize = 6; // where its bytes start, in bytes reserved since the table was made
/// Keys answered and not yet taken by `touched`, at most: past it, a use goes unheard
/// by the eviction's recency, which is a preference, not a guarantee.
const TOUCHES: usize = 65_536;

/// One recorded answer, copied out of its entry and the arena.
#[derive(Debug, PartialEq)]
pub struct Found {
    /// The status line and fields up to `Age`, each line with its CRLF.
    pub head: Vec<u8>,
    /// The body file's, in the table's directory of bodies.
    pub name: Vec<u8>,
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

/// The entries of a table for `objects` answers: whole sets, a fifth of them spare, so
/// that those answers fill four fifths of them.
pub fn entries_for(objects: usize) -> usize {
    (objects + objects / 4).div_ceil(WAYS).max(1) * WAYS
}

/// The table, mapped from the shared memory file.
#[pyclass(module = "sidecar.core.native", frozen)]
pub struct Answers {
    _mapping: Mapping, // what `base` points into
    base: *mut u8,     // the file's first byte
    generation: usize, // byte offset of the index generation word
    header: usize,     // byte offset of the table's header
    entries: usize,    // byte offset of the first entry
    count: usize,      // entries, a multiple of WAYS
    arena: usize,      // byte offset of the arena
    arena_size: usize, // its bytes, a multiple of 8
    deciding: Vec<Vec<u8>>,
    keys: Arc<Rules>,
    writing: SharedLock, // held by the one process that writes an answer
    bodies: PathBuf,     // the directory of the bodies answers name
    hits: AtomicU64,
    bytes: AtomicU64,
    displaced: AtomicU64,
    /// The keys answered since `touched` was last asked, when `track_touches`.
    touches: Option<Mutex<Vec<String>>>,
}

// SAFETY: the mapping lives as long as the object, and every access to it is atomic.
unsafe impl Send for Answers {}
unsafe impl Sync for Answers {}

/// An entry's words, as copied.
type Words = [u64; WORDS];

/// A key's digest as the table keeps it: the first half in its entry, the second in
/// front of the answer's bytes.
fn halves(digest: &[u8; DIGEST]) -> (u64, u64) {
    let (first, second) = digest.split_at(8);
    let word = |half: &[u8]| u64::from_le_bytes(half.try_into().expect("eight bytes"));
    (word(first), word(second))
}

impl Answers {
    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: offsets are checked against the mapping in `map` and 8-aligned.
        unsafe { &*self.base.add(offset).cast::<AtomicU64>() }
    }

    fn header_word(&self, word: usize) -> &AtomicU64 {
        self.word(self.header + word * 8)
    }

    fn entry_word(&self, entry: usize, word: usize) -> &AtomicU64 {
        self.word(self.entries + entry * ENTRY + word * 8)
    }

    fn current_generation(&self) -> i64 {
        // SAFETY: as `word`; the generation is a signed word (`sidecar.shared`).
        let word = unsafe { &*self.base.add(self.generation).cast::<AtomicI64>() };
        word.load(Ordering::Acquire)
    }

    /// The first entries of the two sets a key whose digest begins with `hash` may
    /// take (the same twice in a table of one set). Two sets to choose from, the less
    /// full taking a new answer, keep a table of many answers from overflowing one set
    /// while others have room: with one set each, a tenth of the table's sets overflow
    /// at half its capacity; with two, next to none do.
    fn sets_of(&self, hash: u64) -> [usize; 2] {
        let sets = (self.count / WAYS) as u64;
        let first = hash % sets;
        let mut second = hash.rotate_left(32).wrapping_mul(0x9e37_79b9_7f4a_7c15) % sets;
        if second == first {
            second = (first + 1) % sets;
        }
        [first as usize * WAYS, second as usize * WAYS]
    }

    /// The entries a key whose digest begins with `hash` may take: both of its sets'.
    fn entries_of(&self, hash: u64) -> impl Iterator<Item = usize> {
        let [first, second] = self.sets_of(hash);
        let second = (second != first).then_some(second..second + WAYS);
        (first..first + WAYS).chain(second.into_iter().flatten())
    }

    /// The entry's words, copied while no writer was in it; None otherwise.
    fn copy(&self, entry: usize) -> Option<Words> {
        let before = self.entry_word(entry, SEQUENCE).load(Ordering::Acquire);
        if before % 2 == 1 {
            return None;
        }
        let mut words = [0u64; WORDS];
        for (i, word) in words.iter_mut().enumerate().skip(1) {
            *word = self.entry_word(entry, i).load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
        let after = self.entry_word(entry, SEQUENCE).load(Ordering::Relaxed);
        (before == after).then_some(words)
    }

    /// The second half of the digest, the head and the name of a copied entry, from the
    /// arena; None if the ring has overwritten them (or is about to: a writer that
    /// reserved their room).
    fn bytes_of(&self, words: &Words) -> Option<Vec<u8>> {
        let length = 8 + lengths(words[LENGTHS]).iter().sum::<usize>();
        let at = words[AT];
        if words[LENGTHS] == 0 || length > LONGEST {
            return None;
        }
        let start = (at % self.arena_size as u64) as usize;
        let used = length.div_ceil(8);
        if start + used * 8 > self.arena_size {
            return None; // a torn entry: records never wrap
        }
        let mut bytes = Vec::with_capacity(used * 8);
        for i in 0..used {
            let word = self
                .word(self.arena + start + i * 8)
                .load(Ordering::Relaxed);
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        fence(Ordering::Acquire);
        let reserved = self.header_word(RESERVED).load(Ordering::Relaxed);
        (reserved <= at + self.arena_size as u64).then(|| {
            bytes.truncate(length);
            bytes
        })
    }

    /// Is this copied entry's answer one `find` may give: written, not forgotten, and
    /// its bytes not overwritten by the arena's ring?
    fn live(&self, words: &Words) -> bool {
        words[LENGTHS] != 0
            && self.header_word(RESERVED).load(Ordering::Relaxed)
                <= words[AT] + self.arena_size as u64
    }

    /// Does this copied entry hold the answer of the key whose digest has these halves?
    fn holds(&self, words: &Words, (hash, second): (u64, u64)) -> bool {
        words[HASH] == hash
            && self
                .bytes_of(words)
                .is_some_and(|bytes| bytes.starts_with(&second.to_le_bytes()))
    }

    /// The key of a URL and its digest, if the URL is plain (`KeyRules`).
    pub fn key_of(&self, url: &[u8]) -> Option<(String, [u8; DIGEST])> {
        let key = self.keys.plain_key(std::str::from_utf8(url).ok()?)?;
        let digest = digest(key.as_bytes());
        Some((key, digest))
    }

    /// The answer recorded for the key of this digest, if any.
    pub fn find(&self, digest: &[u8; DIGEST]) -> Option<Found> {
        let (hash, second) = halves(digest);
        for entry in self.entries_of(hash) {
            if self.entry_word(entry, HASH).load(Ordering::Relaxed) != hash {
                continue;
            }
            let Some(words) = self.copy(entry) else {
                continue;
            };
            if words[HASH] != hash {
                continue;
            }
            let Some(bytes) = self.bytes_of(&words) else {
                continue;
            };
            let [head_length, name_length] = lengths(words[LENGTHS]);
            if bytes[..8] != second.to_le_bytes() {
                continue;
            }
            let born = f64::from_bits(words[BORN]);
            let head_end = 8 + head_length;
            return Some(Found {
                head: bytes[8..head_end].to_vec(),
                name: bytes[head_end..head_end + name_length].to_vec(),
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
    #[allow(clippy::too_many_arguments)] // the table's place in the file, word by word
    pub fn map(
        fd: RawFd,
        generation: usize,
        lock: usize,
        start: usize,
        size: usize,
        objects: usize,
        bodies: PathBuf,
        deciding: Vec<String>,
        keys: Arc<Rules>,
        track_touches: bool,
    ) -> io::Result<Self> {
        let mapping = Mapping::of(fd)?;
        let count = entries_for(objects);
        let arena_size = size.saturating_sub(HEADER + count * ENTRY) / 8 * 8;
        if arena_size < LONGEST {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the table's arena is under LONGEST bytes",
            ));
        }
        mapping.at(generation, 8, "the index generation")?;
        mapping.at(start, size, "the table")?;
        Ok(Self {
            base: mapping.at(0, 0, "the file")?,
            _mapping: mapping,
            generation,
            header: start,
            entries: start + HEADER,
            count,
            arena: start + HEADER + count * ENTRY,
            arena_size,
            deciding: deciding.into_iter().map(String::into_bytes).collect(),
            keys,
            writing: SharedLock::map(fd, lock, false)?,
            bodies,
            hits: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            displaced: AtomicU64::new(0),
            touches: track_touches.then(|| Mutex::new(Vec::new())),
        })
    }

    /// The body file of an answer found, opened for reading; an error if it is gone
    /// (removed since), or the name is not one file's.
    pub fn open_body(&self, found: &Found) -> io::Result<File> {
        let name = found.name.as_slice();
        if name.is_empty() || name.contains(&b'/') || name.contains(&0) || name == b".." {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "not a body's name"));
        }
        File::open(self.bodies.join(OsStr::from_bytes(name)))
    }

    /// Count one answer sent from the table, for `key`.
    pub fn count(&self, key: String, size: u64) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(size, Ordering::Relaxed);
        if let Some(touches) = &self.touches {
            let mut touches = touches
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if touches.len() < TOUCHES {
                touches.push(key);
            }
        }
    }

    /// Room for `length` bytes in the arena: where they start, in bytes reserved since
    /// the table was made. A record never wraps: one that would is put at the ring's
    /// start, the end's bytes left unused.
    fn reserve(&self, length: usize) -> u64 {
        let reserved = self.header_word(RESERVED);
        let size = self.arena_size as u64;
        let mut current = reserved.load(Ordering::Relaxed);
        loop {
            let offset = current % size;
            let at = if offset + length as u64 > size {
                current + (size - offset)
            } else {
                current
            };
            match reserved.compare_exchange_weak(
                current,
                at + length as u64,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return at,
                Err(now) => current = now,
            }
        }
    }

    /// The entry of a key's sets to write its answer into: the entry that holds the
    /// key, else one that no answer `find` would give uses, in the set with fewer of
    /// those, else the one recorded longest ago. An answer that gives way (pushed out,
    /// or its bytes written over by the arena's ring) is counted as displaced.
    fn entry_for(&self, digest: &[u8; DIGEST]) -> usize {
        let halves = halves(digest);
        let copies: Vec<(usize, Option<Words>)> =
            self.entries_of(halves.0).map(|e| (e, self.copy(e))).collect();
        if let Some(&(entry, _)) = copies
            .iter()
            .find(|(_, c)| c.as_ref().is_some_and(|words| self.holds(words, halves)))
        {
            return entry;
        }
        let free = |(_, copy): &&(usize, Option<Words>)| {
            copy.as_ref().is_some_and(|words| !self.live(words))
        };
        let (first, second) = copies.split_at(WAYS.min(copies.len()));
        let roomier = if second.iter().filter(free).count() > first.iter().filter(free).count() {
            second
        } else {
            first
        };
        if let Some(&(entry, copy)) = roomier.iter().find(free) {
            if copy.is_some_and(|words| words[LENGTHS] != 0) {
                // Still valid but for its bytes, which the arena's ring wrote over: it
                // gave way for want of room as much as one pushed out of a full set.
                self.displaced.fetch_add(1, Ordering::Relaxed);
            }
            return entry;
        }
        self.displaced.fetch_add(1, Ordering::Relaxed);
        copies
            .iter()
            .min_by_key(|(_, copy)| copy.map_or(u64::MAX, |words| words[RECORDED]))
            .map_or(copies[0].0, |&(entry, _)| entry)
    }

    /// Write an answer into the sets of the key of this digest (see `entry_for`),
    /// holding the writers' lock, taken through `wait` (given the blocking call, which
    /// it makes) while another process holds it. False if it is too long, if the index
    /// generation is no longer the answer's (an object was removed or changed since its
    /// lookup: perhaps this one), or if its entry was left mid-write by a writer that
    /// died.
    pub fn write(
        &self,
        digest: &[u8; DIGEST],
        head: &[u8],
        name: &[u8],
        answer: &Recorded,
        wait: impl FnOnce(&(dyn Fn() -> libc::c_int + Sync)) -> libc::c_int,
    ) -> io::Result<bool> {
        let length = 8 + head.len() + name.len();
        if length > LONGEST || head.is_empty() {
            return Ok(false);
        }
        self.writing.lock(wait)?;
        let written = self.write_alone(digest, head, name, answer, length);
        self.writing.unlock()?;
        Ok(written)
    }

    /// `write`, by the one writer that holds the lock.
    fn write_alone(
        &self,
        digest: &[u8; DIGEST],
        head: &[u8],
        name: &[u8],
        answer: &Recorded,
        length: usize,
    ) -> bool {
        if answer.generation != self.current_generation() {
            return false;
        }
        let (hash, second) = halves(digest);
        let entry = self.entry_for(digest);
        let sequence = self.entry_word(entry, SEQUENCE);
        let before = sequence.load(Ordering::Relaxed);
        if before % 2 == 1
            || sequence
                .compare_exchange(before, before + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        let at = self.reserve(length.div_ceil(8) * 8);
        // Readers that see this reservation drop what they copied from its room.
        fence(Ordering::Release);
        let mut bytes = Vec::with_capacity(length.div_ceil(8) * 8);
        bytes.extend_from_slice(&second.to_le_bytes());
        bytes.extend_from_slice(head);
        bytes.extend_from_slice(name);
        bytes.resize(bytes.len().div_ceil(8) * 8, 0);
        let start = self.arena + (at % self.arena_size as u64) as usize;
        for (i, chunk) in bytes.chunks_exact(8).enumerate() {
            let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            self.word(start + i * 8).store(word, Ordering::Relaxed);
        }
        let packed = head.len() as u64 | (name.len() as u64) << 16;
        let fixed = [
            (HASH, hash),
            (BORN, answer.born.unwrap_or(f64::NAN).to_bits()),
            (SIZE, answer.size),
            (LENGTHS, packed),
            (RECORDED, now().to_bits()),
            (AT, at),
        ];
        for (word, value) in fixed {
            self.entry_word(entry, word).store(value, Ordering::Relaxed);
        }
        sequence.store(before + 2, Ordering::Release);
        true
    }

    /// Forget the answer of the key of this digest, holding the writers' lock (taken as
    /// `write` takes it): the keeper calls it once it removed or changed that key's
    /// object and bumped the index generation, so that no answer made before reaches
    /// the table after. False if it held none.
    pub fn forget(
        &self,
        digest: &[u8; DIGEST],
        wait: impl FnOnce(&(dyn Fn() -> libc::c_int + Sync)) -> libc::c_int,
    ) -> io::Result<bool> {
        self.writing.lock(wait)?;
        let halves = halves(digest);
        let mut forgot = false;
        for entry in self.entries_of(halves.0) {
            if !self.copy(entry).is_some_and(|words| self.holds(&words, halves)) {
                continue;
            }
            // The one writer: nobody else changes the word while the lock is held.
            let sequence = self.entry_word(entry, SEQUENCE);
            let before = sequence.load(Ordering::Relaxed);
            sequence.store(before + 1, Ordering::Relaxed);
            fence(Ordering::Release);
            self.entry_word(entry, LENGTHS).store(0, Ordering::Relaxed);
            sequence.store(before + 2, Ordering::Release);
            forgot = true;
        }
        self.writing.unlock()?;
        Ok(forgot)
    }

    /// Answers this process made give way to others while still valid: each is
    /// Python's again until it is recorded anew. More than a few per epoch say the table
    /// is too small for the objects read (`--index-objects`).
    pub fn displaced(&self) -> u64 {
        self.displaced.load(Ordering::Relaxed)
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
    /// The table in the shared memory file `fd`: `size` bytes from byte `start`, with
    /// entries for `objects` answers (whole sets of WAYS) and, past them, the arena their
    /// heads and body files' names share (at least LONGEST bytes), under the index
    /// generation word at byte `generation`, written under the `SharedLock` at byte
    /// `lock`; `bodies`: the directory of the body files;
    /// `deciding`: the names of the request fields a hit's decision reads (a request
    /// with any of them goes to Python); `keys`: the key of a request's URL;
    /// `track_touches`: remember which keys it answered, for `touched`.
    #[new]
    #[pyo3(signature = (
        fd, generation, lock, start, size, objects, bodies, deciding, keys, track_touches=false
    ))]
    #[allow(clippy::too_many_arguments)] // as `map`
    fn new(
        fd: RawFd,
        generation: usize,
        lock: usize,
        start: usize,
        size: usize,
        objects: usize,
        bodies: PathBuf,
        deciding: Vec<String>,
        keys: PyRef<'_, KeyRules>,
        track_touches: bool,
    ) -> PyResult<Self> {
        Self::map(
            fd,
            generation,
            lock,
            start,
            size,
            objects,
            bodies,
            deciding,
            keys.0.clone(),
            track_touches,
        )
        .map_err(python_error)
    }

    /// Record Python's answer to a GET that carried no deciding field, of a URL whose
    /// key has this `digest` (`key_digest`): `head` its status line and fields up to
    /// `Age` (each line with its CRLF), `name` the body file's (in `bodies`), `size` its
    /// length, `born`
    /// when the origin generated the response (None: no Age), `generation` the index
    /// generation the object was found under. False if it was not recorded (too long,
    /// the generation moved on since, or the slot busy).
    #[pyo3(signature = (digest, head, name, size, born, generation))]
    #[allow(clippy::too_many_arguments)] // the answer, field by field
    fn record(
        &self,
        py: Python<'_>,
        digest: &[u8],
        head: &[u8],
        name: &[u8],
        size: u64,
        born: Option<f64>,
        generation: i64,
    ) -> PyResult<bool> {
        let answer = Recorded {
            size,
            born,
            generation,
        };
        // Another process holds the lock for the few microseconds of one answer; a
        // thread of this one that holds it may need the GIL to let go.
        self.write(digest_of(digest)?, head, name, &answer, |wait| py.detach(wait))
            .map_err(python_error)
    }

    /// Forget the answer of the key of this `digest` (`key_digest`), if any: its
    /// object was removed or changed, and the index generation bumped before (see
    /// `forget`). True if there was one.
    #[pyo3(name = "forget")]
    fn py_forget(&self, py: Python<'_>, digest: &[u8]) -> PyResult<bool> {
        self.forget(digest_of(digest)?, |wait| py.detach(wait))
            .map_err(python_error)
    }

    /// The keys this process answered from the table since the last call, in order,
    /// when it tracks them (an eviction by recency counts them as uses).
    fn touched(&self) -> Vec<String> {
        self.touches.as_ref().map_or_else(Vec::new, |touches| {
            std::mem::take(
                &mut *touches
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            )
        })
    }

    /// Answers this process made give way to others while still valid.
    #[getter(displaced)]
    fn py_displaced(&self) -> u64 {
        self.displaced()
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

/// A key's digest as Python passes it (`key_digest`).
fn digest_of(bytes: &[u8]) -> PyResult<&[u8; DIGEST]> {
    bytes
        .try_into()
        .map_err(|_| PyValueError::new_err("a key's digest is 16 bytes"))
}

fn lengths(packed: u64) -> [usize; 2] {
    [0, 16].map(|shift| ((packed >> shift) & 0xffff) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::key;
    use crate::shared::lock;
    use crate::wire::http1::{Event, Parser};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    const SLOTS: usize = 2 * WAYS;

    /// A table in a memory file of its own: the generation word, the writers' lock, then
    /// `objects` entries and an arena of `arena` bytes.
    fn sized(objects: usize, arena: usize) -> (OwnedFd, Answers) {
        // SAFETY: a new memory file, owned at once.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"answers".as_ptr(), 0)) };
        let size = HEADER + entries_for(objects) * ENTRY + arena;
        let start = 8 + lock::BYTES;
        // SAFETY: the descriptor is open.
        assert_eq!(
            unsafe { libc::ftruncate(fd.as_raw_fd(), (start + size) as i64) },
            0
        );
        SharedLock::map(fd.as_raw_fd(), 8, true).expect("lock made");
        let deciding = vec!["range".to_owned(), "if-none-match".to_owned()];
        let keys = Arc::new(key::rules_for_tests());
        let bodies = std::env::temp_dir();
        let answers = Answers::map(
            fd.as_raw_fd(),
            0,
            8,
            start,
            size,
            objects,
            bodies,
            deciding,
            keys,
            true,
        )
        .expect("mapped");
        (fd, answers)
    }

    /// Write the answer for `key`, waiting for the lock as long as it takes.
    fn put(answers: &Answers, key: &[u8], head: &[u8], name: &[u8], answer: &Recorded) -> bool {
        answers
            .write(&digest(key), head, name, answer, |wait| wait())
            .expect("the lock")
    }

    fn find(answers: &Answers, key: &[u8]) -> Option<Found> {
        answers.find(&digest(key))
    }

    fn table() -> (OwnedFd, Answers) {
        sized(SLOTS, 4 * LONGEST)
    }

    /// The entry of `key`'s sets that holds it.
    fn entry_of(answers: &Answers, key: &[u8]) -> usize {
        let (hash, _) = halves(&digest(key));
        answers
            .entries_of(hash)
            .find(|&entry| answers.entry_word(entry, HASH).load(Ordering::Relaxed) == hash)
            .expect("written")
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
    fn an_answer_is_found_by_its_key_until_it_is_forgotten() {
        let (_fd, answers) = table();
        let head = b"HTTP/1.1 200 OK\r\nETag: \"a\"\r\n";
        assert!(put(
            &answers,
            b"https://h/a",
            head,
            b"/b/objects/1",
            &recorded(5, 0)
        ));
        let found = find(&answers, b"https://h/a").expect("recorded");
        assert_eq!(found.head, head);
        assert_eq!(
            (found.name.as_slice(), found.size),
            (&b"/b/objects/1"[..], 5)
        );
        assert_eq!(find(&answers, b"https://h/b"), None);
        assert_eq!(find(&answers, b"https://h/a?"), None);
        assert!(put(
            &answers,
            b"https://h/b",
            head,
            b"/b/objects/2",
            &recorded(6, 0)
        ));
        // Another object removed: this answer stays; its own removal forgets it alone.
        bump_generation(&answers);
        assert!(find(&answers, b"https://h/a").is_some());
        let forget = |key: &[u8]| answers.forget(&digest(key), |wait| wait()).expect("lock");
        assert!(forget(b"https://h/a"));
        assert_eq!(find(&answers, b"https://h/a"), None);
        assert!(!forget(b"https://h/a"), "forgotten once");
        assert_eq!(find(&answers, b"https://h/b").expect("kept").size, 6);
    }

    #[test]
    fn an_answer_made_before_the_generation_moved_is_not_recorded() {
        let (_fd, answers) = table();
        bump_generation(&answers);
        let write_under = |generation| {
            let head = b"HTTP/1.1 200 OK\r\n";
            put(&answers, b"https://h/a", head, b"p", &recorded(1, generation))
        };
        // Looked up before a removal (perhaps of this object), written after it.
        assert!(!write_under(0));
        assert_eq!(find(&answers, b"https://h/a"), None);
        assert!(write_under(1));
        assert!(find(&answers, b"https://h/a").is_some());
    }

    #[test]
    fn a_url_recorded_again_takes_its_own_slot_and_a_full_set_forgets_its_oldest() {
        let (_fd, answers) = table();
        // More URLs than one set holds: every set fills, and the oldest give way.
        let urls: Vec<Vec<u8>> = (0..3 * SLOTS)
            .map(|i| format!("https://h/{i}").into_bytes())
            .collect();
        for url in &urls {
            assert!(put(
                &answers,
                url,
                b"HTTP/1.1 200 OK\r\n",
                b"/p",
                &recorded(1, 0)
            ));
        }
        let kept = urls
            .iter()
            .filter(|url| find(&answers, url).is_some())
            .count();
        // Every entry holds an answer, each of another URL; every answer recorded after
        // they were all taken displaced one.
        assert_eq!(kept, answers.count);
        assert_eq!(answers.displaced(), (3 * SLOTS - answers.count) as u64);
        let last = urls.last().expect("urls");
        assert!(find(&answers, last).is_some(), "the newest is kept");
        assert!(put(
            &answers,
            last,
            b"HTTP/1.1 200 OK\r\nX: 2\r\n",
            b"/q",
            &recorded(2, 0)
        ));
        let found = find(&answers, last).expect("still recorded");
        assert_eq!((found.name.as_slice(), found.size), (&b"/q"[..], 2));
        assert_eq!(
            urls.iter()
                .filter(|url| find(&answers, url).is_some())
                .count(),
            answers.count
        );
    }

    #[test]
    fn a_table_holds_as_many_answers_as_it_was_made_for() {
        let objects = 20_000;
        let (_fd, answers) = sized(objects, objects * 128);
        for i in 0..objects {
            let url = format!("https://datasets.example.org/train/{i:08}.jpg");
            assert!(put(
                &answers,
                url.as_bytes(),
                b"HTTP/1.1 200 OK\r\n",
                b"/p",
                &recorded(1, 0)
            ));
        }
        // Four fifths full, two sets of eight to choose from: one answer in thousands
        // finds both full (3 here) and displaces another.
        let displaced = answers.displaced() as usize;
        assert!(displaced <= objects / 1000, "{displaced}");
        let found = (0..objects)
            .filter(|i| {
                let url = format!("https://datasets.example.org/train/{i:08}.jpg");
                find(&answers, url.as_bytes()).is_some()
            })
            .count();
        assert_eq!(found, objects - displaced);
    }

    #[test]
    fn what_is_too_long_or_is_being_written_is_not_recorded() {
        let (_fd, answers) = table();
        let long = vec![b'x'; LONGEST];
        assert!(!put(
            &answers,
            b"https://h/a",
            &long,
            b"/p",
            &recorded(1, 0)
        ));
        assert!(put(
            &answers,
            b"https://h/a",
            b"HTTP/1.1 200 OK\r\n",
            b"/p",
            &recorded(1, 0)
        ));
        let entry = entry_of(&answers, b"https://h/a");
        // A writer inside the entry (or one that died there): readers keep out, and the
        // URL is written into another entry of its set.
        answers
            .entry_word(entry, SEQUENCE)
            .fetch_add(1, Ordering::AcqRel);
        assert_eq!(find(&answers, b"https://h/a"), None);
        assert!(put(
            &answers,
            b"https://h/a",
            b"HTTP/1.1 200 OK\r\n",
            b"/q",
            &recorded(1, 0)
        ));
        assert_eq!(
            find(&answers, b"https://h/a").expect("written again").name,
            b"/q"
        );
        assert_eq!(
            answers.entry_word(entry, SEQUENCE).load(Ordering::Relaxed) % 2,
            1
        );
    }

    #[test]
    fn answers_the_arena_has_written_over_are_no_longer_found() {
        // Room in the entries for every URL, in the arena for the last few only.
        let (_fd, answers) = sized(64 * WAYS, LONGEST);
        let head = vec![b'h'; 1000];
        let urls: Vec<Vec<u8>> = (0..40)
            .map(|i| format!("https://h/{i}").into_bytes())
            .collect();
        for url in &urls {
            assert!(put(&answers, url, &head, b"/p", &recorded(1, 0)));
        }
        let found: Vec<bool> = urls.iter().map(|url| find(&answers, url).is_some()).collect();
        // 1,016-byte records, 16 of them in 16 KiB: the ring holds the last 15 whole.
        assert!(found[..24].iter().all(|&f| !f), "{found:?}");
        assert!(found[25..].iter().all(|&f| f), "{found:?}");
        for url in &urls[25..] {
            let answer = find(&answers, url).expect("kept");
            assert_eq!(
                (answer.head.as_slice(), answer.name.as_slice()),
                (&head[..], &b"/p"[..])
            );
        }
        // An entry whose bytes were overwritten is free for the next key of its sets,
        // and counted as displaced when it is taken: never more of them than the ring
        // wrote over.
        assert!(answers.displaced() <= 24, "{}", answers.displaced());
    }

    #[test]
    fn a_writer_waits_while_another_writes_so_that_none_is_lapped_mid_write() {
        let (_fd, answers) = table();
        let answers = std::sync::Arc::new(answers);
        // Another process's writer, mid-write.
        assert!(!answers.writing.lock(|wait| wait()).expect("locked"));
        let writer = {
            let answers = answers.clone();
            std::thread::spawn(move || {
                put(
                    &answers,
                    b"https://h/a",
                    b"HTTP/1.1 200 OK\r\n",
                    b"/p",
                    &recorded(1, 0),
                )
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            !writer.is_finished(),
            "the second writer waits for the first"
        );
        assert!(find(&answers, b"https://h/a").is_none());
        answers.writing.unlock().expect("unlocked");
        assert!(writer.join().expect("writer"));
        assert!(find(&answers, b"https://h/a").is_some());
    }

    #[test]
    fn readers_racing_writers_find_whole_answers_or_none() {
        let (_fd, answers) = sized(4 * WAYS, 2 * LONGEST);
        let answers = std::sync::Arc::new(answers);
        let urls: Vec<Vec<u8>> = (0..64)
            .map(|i| format!("https://h/{i}").into_bytes())
            .collect();
        // Each URL's head and path name it, so a torn answer shows.
        let answer_of = |url: &[u8]| {
            let name = String::from_utf8_lossy(url).into_owned();
            (
                format!("HTTP/1.1 200 OK\r\nX: {}\r\n", name.repeat(8)),
                format!("/o/{name}"),
            )
        };
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let answers = answers.clone();
                let urls = urls.clone();
                std::thread::spawn(move || {
                    for round in 0..300 {
                        for url in urls.iter().skip(w).step_by(2) {
                            let (head, path) = answer_of(url);
                            put(
                                &answers,
                                url,
                                head.as_bytes(),
                                path.as_bytes(),
                                &recorded(round, 0),
                            );
                        }
                    }
                })
            })
            .collect();
        let mut seen = 0;
        while !writers.iter().all(|w| w.is_finished()) {
            for url in &urls {
                if let Some(found) = find(&answers, url) {
                    let (head, path) = answer_of(url);
                    assert_eq!(
                        (found.head, found.name),
                        (head.into_bytes(), path.into_bytes())
                    );
                    seen += 1;
                }
            }
        }
        for writer in writers {
            writer.join().expect("writer");
        }
        assert!(seen > 0);
    }

    #[test]
    fn a_body_is_opened_by_its_name_in_the_directory_of_bodies_and_nothing_else() {
        use std::io::Read;
        let (_fd, answers) = table(); // its bodies: the temporary directory
        let name = format!("answers-body-{}", std::process::id());
        let path = std::env::temp_dir().join(&name);
        std::fs::write(&path, b"body").expect("written");
        let found = |name: &[u8]| Found {
            head: vec![],
            name: name.to_vec(),
            size: 4,
            born: None,
        };
        let mut body = String::new();
        answers
            .open_body(&found(name.as_bytes()))
            .expect("opened")
            .read_to_string(&mut body)
            .expect("read");
        assert_eq!(body, "body");
        std::fs::remove_file(&path).expect("removed");
        assert!(answers.open_body(&found(name.as_bytes())).is_err(), "gone");
        for refused in [&b""[..], b"../etc/passwd", b"a\0b", b".."] {
            assert!(answers.open_body(&found(refused)).is_err());
        }
    }

    #[test]
    fn the_age_counts_to_the_end_of_the_current_second_and_the_head_ends() {
        let found = Found {
            head: b"HTTP/1.1 200 OK\r\n".to_vec(),
            name: vec![],
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
    fn the_keys_answered_are_taken_once_for_the_eviction_by_recency() {
        let (_fd, answers) = table();
        answers.count("https://h/a".to_owned(), 3);
        answers.count("https://h/b".to_owned(), 4);
        assert_eq!(answers.touched(), vec!["https://h/a", "https://h/b"]);
        assert!(answers.touched().is_empty());
        assert_eq!((answers.hits(), answers.bytes()), (2, 7));
    }
}
