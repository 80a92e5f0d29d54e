//! Claims and leases in the sidecar's shared memory file: which worker fetches which key,
//! and the room each may fill alone (`sidecar.buffer.claims` says what each state and
//! counter means, and who changes it).
//!
//! The region's layout: a header (the commits counter, and room to spare), then one
//! lease per worker (four counters: granted, held, spent, stored), then the slots. A
//! claim is a slot of `SLOT` bytes: the key's 16-byte digest, its owner (a worker's
//! index), its state, and room to spare. A key's claim is in one of the `WINDOW` slots
//! from the one its digest names, found by a search of that window rather than by
//! probing until a free slot: so freeing a slot moves no other and leaves no tombstone.
//! A slot is written owner and digest first and state last, and freed state first, so a
//! process killed half way through either leaves a slot that reads as free, and the
//! keeper frees whatever a dead worker owned (`forget`).
//!
//! Every change is made under the file's lock (`SharedLock`), by whichever process it
//! concerns; a lease is read without it, each counter being one aligned word written
//! whole. What the callers pass to run under the lock (an index row's insert, the
//! keeper's settling of a dead worker's room) runs while it is held.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU64, Ordering};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::cache::key::DIGEST;
use crate::shared::lock::SharedLock;
use crate::shared::mapping::{Mapping, python_error};

/// Concurrent claims the table holds: more than the fills one pod's clients run at once.
/// A claim whose window is full is declined (its object passes, unstored): with a few
/// hundred claims at once, the chance that any window is full is below 10^-12.
pub const SLOTS: usize = 4096;
/// Slots a key's claim may take, from the one its digest names.
pub const WINDOW: usize = 32;
/// Bytes of a slot: the digest, the owner (i32), the state (i32), eight to spare.
const SLOT: usize = 32;
const OWNER: usize = DIGEST;
const STATE: usize = DIGEST + 4;
/// Bytes of a lease: four counters.
const LEASE: usize = 32;
/// Bytes before the leases: the commits counter, and room to spare.
const HEADER: usize = 64;

/// A claim's state (`sidecar.buffer.claims.State`).
pub const FREE: i32 = 0;
pub const RUNNING: i32 = 1;
/// A flag on any state but FREE: a write made the fill stale.
pub const INVALIDATED: i32 = 0x100;

/// A lease's counters.
#[derive(Clone, Copy, Default)]
struct Lease {
    granted: i64,
    held: i64,
    spent: i64,
    stored: i64,
}

#[pyclass(module = "sidecar.core.native", frozen)]
pub struct Claims {
    _mapping: Mapping, // what `base` points into
    base: *mut u8,     // the region's first byte
    workers: usize,
    lock: SharedLock,
}

// SAFETY: the mapping lives as long as the object; every access to it is atomic.
unsafe impl Send for Claims {}
unsafe impl Sync for Claims {}

impl Claims {
    /// Bytes of region the table and `workers` leases take.
    pub fn size(workers: usize) -> usize {
        HEADER + workers * LEASE + (SLOTS + WINDOW - 1) * SLOT
    }

    /// The claims in the shared memory file `fd` (see `new`): InvalidInput if the
    /// region does not fit the file.
    pub fn map(fd: RawFd, lock: usize, region: usize, workers: usize) -> io::Result<Self> {
        let mapping = Mapping::of(fd)?;
        let base = mapping.at(region, Self::size(workers), "the claims' region")?;
        Ok(Self {
            _mapping: mapping,
            base,
            workers,
            lock: SharedLock::map(fd, lock, false)?,
        })
    }

    fn word(&self, offset: usize) -> &AtomicI64 {
        // SAFETY: offsets are inside the region (`map` checked its size) and 8-aligned.
        unsafe { &*self.base.add(offset).cast::<AtomicI64>() }
    }

    fn slot(&self, index: usize) -> usize {
        HEADER + self.workers * LEASE + index * SLOT
    }

    fn state_word(&self, slot: usize) -> &AtomicI32 {
        // SAFETY: as `word`; 4-aligned.
        unsafe { &*self.base.add(slot + STATE).cast::<AtomicI32>() }
    }

    fn owner(&self, slot: usize) -> i32 {
        // SAFETY: as `state_word`.
        unsafe { &*self.base.add(slot + OWNER).cast::<AtomicI32>() }.load(Ordering::Relaxed)
    }

    fn set_owner(&self, slot: usize, owner: i32) {
        // SAFETY: as `state_word`.
        unsafe { &*self.base.add(slot + OWNER).cast::<AtomicI32>() }
            .store(owner, Ordering::Relaxed);
    }

    fn digest_words(&self, slot: usize) -> [&AtomicU64; 2] {
        // SAFETY: as `word`.
        [0, 8].map(|at| unsafe { &*self.base.add(slot + at).cast::<AtomicU64>() })
    }

    fn digest_of(&self, slot: usize) -> [u64; 2] {
        self.digest_words(slot).map(|word| word.load(Ordering::Relaxed))
    }

    fn state(&self, slot: usize) -> i32 {
        self.state_word(slot).load(Ordering::Acquire)
    }

    /// The live slot of this digest, or (`free`) a free slot in its window.
    fn find(&self, digest: &[u8; DIGEST], free: bool) -> Option<usize> {
        let first = u32::from_le_bytes(digest[..4].try_into().expect("four bytes")) as usize;
        let wanted = if free { [0, 0] } else { words(digest) };
        (first % SLOTS..first % SLOTS + WINDOW)
            .map(|index| self.slot(index))
            .find(|&slot| self.digest_of(slot) == wanted && (self.state(slot) == FREE) == free)
    }

    /// `claim`, by the holder of the lock.
    fn claim_held(&self, digest: &[u8; DIGEST], worker: i32) -> Option<(i32, i32)> {
        if let Some(found) = self.find(digest, false) {
            return Some((self.state(found), self.owner(found)));
        }
        let free = self.find(digest, true)?;
        self.set_owner(free, worker);
        for (word, value) in self.digest_words(free).into_iter().zip(words(digest)) {
            word.store(value, Ordering::Relaxed);
        }
        self.state_word(free).store(RUNNING, Ordering::Release);
        Some((FREE, worker))
    }

    fn release_slot(&self, slot: usize) {
        self.state_word(slot).store(FREE, Ordering::Release);
        self.set_owner(slot, 0);
        for word in self.digest_words(slot) {
            word.store(0, Ordering::Relaxed);
        }
    }

    /// Is `slot` `worker`'s, in `state` exactly (None: RUNNING, invalidated or not)?
    fn owned(&self, slot: usize, worker: i32, state: Option<i32>) -> bool {
        let found = self.state(slot);
        self.owner(slot) == worker
            && match state {
                None => found & !INVALIDATED == RUNNING,
                Some(state) => found == state,
            }
    }

    fn lease_at(&self, worker: usize) -> usize {
        HEADER + worker * LEASE
    }

    fn lease(&self, worker: usize) -> Lease {
        let at = self.lease_at(worker);
        let read = |i: usize| self.word(at + i * 8).load(Ordering::Acquire);
        Lease {
            granted: read(0),
            held: read(1),
            spent: read(2),
            stored: read(3),
        }
    }

    fn set_lease(&self, worker: usize, lease: Lease) {
        let at = self.lease_at(worker);
        let values = [lease.granted, lease.held, lease.spent, lease.stored];
        for (i, value) in values.into_iter().enumerate() {
            self.word(at + i * 8).store(value, Ordering::Release);
        }
    }

    fn add(&self, worker: usize, change: Lease) {
        let was = self.lease(worker);
        self.set_lease(
            worker,
            Lease {
                granted: was.granted + change.granted,
                held: was.held + change.held,
                spent: was.spent + change.spent,
                stored: was.stored + change.stored,
            },
        );
    }

    fn bump_commits(&self) {
        self.word(0).fetch_add(1, Ordering::Release);
    }

    /// Fold every worker's spent bytes and stored objects out of its lease: their sums.
    fn fold_all(&self) -> (i64, i64) {
        let (mut spent, mut stored) = (0, 0);
        for worker in 0..self.workers {
            let lease = self.lease(worker);
            self.add(
                worker,
                Lease {
                    granted: -lease.spent,
                    spent: -lease.spent,
                    stored: -lease.stored,
                    ..Lease::default()
                },
            );
            spent += lease.spent;
            stored += lease.stored;
        }
        (spent, stored)
    }

    /// Run `work` holding the lock (waited for without the GIL), and let it go however
    /// `work` ends.
    fn locked<T>(&self, py: Python<'_>, work: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
        self.lock.lock(|wait| py.detach(wait)).map_err(python_error)?;
        let result = work();
        self.lock.unlock().map_err(python_error)?;
        result
    }

    fn worker(&self, worker: usize) -> PyResult<usize> {
        if worker < self.workers {
            Ok(worker)
        } else {
            Err(PyValueError::new_err(format!("no worker {worker}")))
        }
    }
}

fn words(digest: &[u8; DIGEST]) -> [u64; 2] {
    [0, 8].map(|at| u64::from_le_bytes(digest[at..at + 8].try_into().expect("eight bytes")))
}

fn digest_of(bytes: &[u8]) -> PyResult<[u8; DIGEST]> {
    bytes
        .try_into()
        .map_err(|_| PyValueError::new_err("a key's digest is 16 bytes"))
}

#[pymethods]
impl Claims {
    /// The claims and leases of `workers` workers in the region from byte `region` of
    /// the shared memory file `fd` (`size(workers)` bytes), changed under the
    /// `SharedLock` at byte `lock`.
    #[new]
    fn new(fd: RawFd, lock: usize, region: usize, workers: usize) -> PyResult<Self> {
        Self::map(fd, lock, region, workers).map_err(python_error)
    }

    /// Bytes of region the table and `workers` leases take.
    #[staticmethod]
    #[pyo3(name = "size")]
    fn py_size(workers: usize) -> usize {
        Self::size(workers)
    }

    /// New objects indexed so far.
    #[getter]
    fn commits(&self) -> i64 {
        self.word(0).load(Ordering::Acquire)
    }

    /// Claim the key of `digest` for `worker`: (FREE, worker) when it got it, the
    /// (state, owner) of the claim found otherwise, None when its window is full.
    fn claim(&self, py: Python<'_>, digest: &[u8], worker: i32) -> PyResult<Option<(i32, i32)>> {
        let digest = digest_of(digest)?;
        self.locked(py, || Ok(self.claim_held(&digest, worker)))
    }

    /// The state of the claim of the key of `digest` (FREE: none).
    #[pyo3(name = "state")]
    fn py_state(&self, py: Python<'_>, digest: &[u8]) -> PyResult<i32> {
        let digest = digest_of(digest)?;
        self.locked(py, || Ok(self.find(&digest, false).map_or(FREE, |s| self.state(s))))
    }

    /// `worker` is done with its RUNNING claim (invalidated or not), unstored; the
    /// `held` bytes its fill took from its lease are free again.
    fn release(&self, py: Python<'_>, digest: &[u8], worker: i32, held: i64) -> PyResult<()> {
        let digest = digest_of(digest)?;
        let index = self.worker(worker as usize)?;
        self.locked(py, || {
            if let Some(found) = self.find(&digest, false) {
                if self.owned(found, worker, None) {
                    self.release_slot(found);
                }
            }
            if held != 0 {
                let change = Lease {
                    held: -held,
                    ..Lease::default()
                };
                self.add(index, change);
            }
            Ok(())
        })
    }

    /// Store the small fill of `worker`'s RUNNING claim, which holds `held` bytes of
    /// its lease: `insert()` its index row, count it, free the claim. False if a write
    /// invalidated it (nothing inserted); what `insert` raises.
    fn commit(
        &self,
        py: Python<'_>,
        digest: &[u8],
        worker: i32,
        held: i64,
        insert: Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let digest = digest_of(digest)?;
        let index = self.worker(worker as usize)?;
        self.locked(py, || {
            let Some(found) = self.find(&digest, false) else {
                return Ok(false);
            };
            if !self.owned(found, worker, Some(RUNNING)) {
                return Ok(false);
            }
            insert.call0()?;
            self.bump_commits();
            let change = Lease {
                held: -held,
                spent: held,
                stored: 1,
                ..Lease::default()
            };
            self.add(index, change);
            self.release_slot(found);
            Ok(true)
        })
    }

    /// (The keeper.) `worker`'s RUNNING claim is now a fill of `state`; False if it
    /// was invalidated (or is not that worker's).
    fn announce(&self, py: Python<'_>, digest: &[u8], worker: i32, state: i32) -> PyResult<bool> {
        let digest = digest_of(digest)?;
        self.locked(py, || {
            let Some(found) = self.find(&digest, false) else {
                return Ok(false);
            };
            if !self.owned(found, worker, Some(RUNNING)) {
                return Ok(false);
            }
            self.state_word(found).store(state, Ordering::Release);
            Ok(true)
        })
    }

    /// (The keeper.) The fills of these keys may not commit, nor be joined.
    fn invalidate(&self, py: Python<'_>, digests: Vec<Vec<u8>>) -> PyResult<()> {
        let digests = digests
            .iter()
            .map(|digest| digest_of(digest))
            .collect::<PyResult<Vec<_>>>()?;
        self.locked(py, || {
            for digest in &digests {
                if let Some(found) = self.find(digest, false) {
                    self.state_word(found)
                        .fetch_or(INVALIDATED, Ordering::AcqRel);
                }
            }
            Ok(())
        })
    }

    /// (The keeper.) Free `worker`'s claim, whatever its state; first, if given,
    /// `commit()` the fill's index row and count it. False, and the claim left as it
    /// is, if a write invalidated it (nothing committed); what `commit` raises.
    #[pyo3(signature = (digest, worker, commit=None))]
    fn end(
        &self,
        py: Python<'_>,
        digest: &[u8],
        worker: i32,
        commit: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let digest = digest_of(digest)?;
        self.locked(py, || {
            let found = self.find(&digest, false);
            if let Some(commit) = commit {
                if found.is_some_and(|slot| self.state(slot) & INVALIDATED != 0) {
                    return Ok(false);
                }
                commit.call0()?;
                self.bump_commits();
            }
            if let Some(slot) = found.filter(|&slot| self.owner(slot) == worker) {
                self.release_slot(slot);
            }
            Ok(true)
        })
    }

    /// How many claims there are (fills in progress).
    fn running(&self, py: Python<'_>) -> PyResult<usize> {
        self.locked(py, || {
            let slots = (0..SLOTS + WINDOW - 1).map(|index| self.slot(index));
            Ok(slots.filter(|&slot| self.state(slot) != FREE).count())
        })
    }

    /// `worker`'s lease: granted, held, spent, stored (read without the lock).
    #[pyo3(name = "lease")]
    fn py_lease(&self, worker: usize) -> PyResult<(i64, i64, i64, i64)> {
        let lease = self.lease(self.worker(worker)?);
        Ok((lease.granted, lease.held, lease.spent, lease.stored))
    }

    /// Hold `charged` bytes of `worker`'s lease for a small fill: the bytes it has idle
    /// then; None, and nothing held, if it has not that many.
    fn take(&self, py: Python<'_>, worker: usize, charged: i64) -> PyResult<Option<i64>> {
        let worker = self.worker(worker)?;
        self.locked(py, || {
            let lease = self.lease(worker);
            let idle = lease.granted - lease.spent - lease.held - charged;
            if idle < 0 {
                return Ok(None);
            }
            let change = Lease {
                held: charged,
                ..Lease::default()
            };
            self.add(worker, change);
            Ok(Some(idle))
        })
    }

    /// (The keeper.) Lend `worker` `amount` more bytes.
    fn grant(&self, py: Python<'_>, worker: usize, amount: i64) -> PyResult<()> {
        let worker = self.worker(worker)?;
        let change = Lease {
            granted: amount,
            ..Lease::default()
        };
        self.locked(py, || {
            self.add(worker, change);
            Ok(())
        })
    }

    /// (The keeper.) The bytes and objects workers committed since the last fold,
    /// taken out of their leases.
    fn fold(&self, py: Python<'_>) -> PyResult<(i64, i64)> {
        self.locked(py, || Ok(self.fold_all()))
    }

    /// (The keeper.) Take back every idle byte of every lease; how many.
    fn revoke(&self, py: Python<'_>) -> PyResult<i64> {
        self.locked(py, || {
            let mut revoked = 0;
            for worker in 0..self.workers {
                let lease = self.lease(worker);
                let idle = lease.granted - lease.spent - lease.held;
                let change = Lease {
                    granted: -idle,
                    ..Lease::default()
                };
                self.add(worker, change);
                revoked += idle;
            }
            Ok(revoked)
        })
    }

    /// (The keeper.) `worker` died: fold every lease, free every claim it held and zero
    /// its lease, then `settle(lent, spent, stored)` under the same lock.
    fn forget(&self, py: Python<'_>, worker: i32, settle: Bound<'_, PyAny>) -> PyResult<()> {
        let index = self.worker(worker as usize)?;
        self.locked(py, || {
            let (spent, stored) = self.fold_all();
            let lent = self.lease(index).granted;
            self.set_lease(index, Lease::default());
            for slot in (0..SLOTS + WINDOW - 1).map(|i| self.slot(i)) {
                // Its half-written claims too: owner and digest set, state still FREE.
                if self.owner(slot) == worker {
                    self.release_slot(slot);
                }
            }
            settle.call1((lent, spent, stored))?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::lock;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    const WORKERS: usize = 2;

    /// The lock, then a region for two workers, in a memory file of its own.
    fn claims() -> (OwnedFd, Claims) {
        // SAFETY: a new memory file, owned at once.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"claims".as_ptr(), 0)) };
        let region = lock::BYTES;
        let size = region + Claims::size(WORKERS);
        // SAFETY: the descriptor is open.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), size as i64) }, 0);
        SharedLock::map(fd.as_raw_fd(), 0, true).expect("lock made");
        let claims = Claims::map(fd.as_raw_fd(), 0, region, WORKERS).expect("mapped");
        (fd, claims)
    }

    /// A digest whose window starts at slot `first`.
    fn digest(first: u32, tag: u8) -> [u8; DIGEST] {
        let mut digest = [tag; DIGEST];
        digest[..4].copy_from_slice(&first.to_le_bytes());
        digest
    }

    /// Claim the key of `digest` for `worker` (as the only process): its slot.
    fn take_slot(claims: &Claims, digest: &[u8; DIGEST], worker: i32) -> Option<usize> {
        match claims.claim_held(digest, worker)? {
            (FREE, owner) if owner == worker => claims.find(digest, false),
            _ => None,
        }
    }

    #[test]
    fn a_claim_is_found_in_its_window_and_a_freed_slot_serves_the_next() {
        let (_fd, claims) = claims();
        // Keys whose windows start at the same slot fill that window, then are declined.
        let taken: Vec<usize> = (0..WINDOW as u8)
            .map(|tag| take_slot(&claims, &digest(7, tag + 1), 0).expect("room"))
            .collect();
        assert_eq!(taken, (7..7 + WINDOW).map(|i| claims.slot(i)).collect::<Vec<_>>());
        let declined = digest(7, 200);
        assert_eq!(claims.find(&declined, true), None);
        assert_eq!(claims.find(&digest(7, 3), false), Some(claims.slot(9)));
        // Freeing one moves no other: every other claim is still where it was.
        claims.release_slot(claims.slot(9));
        assert_eq!(claims.find(&digest(7, 3), false), None);
        assert_eq!(claims.find(&digest(7, 4), false), Some(claims.slot(10)));
        assert_eq!(take_slot(&claims, &declined, 1), Some(claims.slot(9)));
        assert!(claims.owned(claims.slot(9), 1, Some(RUNNING)));
    }

    #[test]
    fn a_half_written_claim_is_neither_found_nor_free() {
        let (_fd, claims) = claims();
        let key = digest(0, 9);
        // Owner and digest written, state not yet: a process killed there.
        let slot = claims.slot(0);
        claims.set_owner(slot, 1);
        for (word, value) in claims.digest_words(slot).into_iter().zip(words(&key)) {
            word.store(value, Ordering::Relaxed);
        }
        assert_eq!(claims.find(&key, false), None);
        assert_eq!(claims.find(&key, true), Some(claims.slot(1)));
    }

    #[test]
    fn leases_fold_what_was_spent_and_stored() {
        let (_fd, claims) = claims();
        let change = |granted, held, spent, stored| Lease {
            granted,
            held,
            spent,
            stored,
        };
        claims.add(0, change(1000, 0, 0, 0));
        claims.add(0, change(0, 100, 0, 0));
        claims.add(0, change(0, -100, 100, 1));
        claims.add(1, change(500, 0, 40, 2));
        assert_eq!(claims.fold_all(), (140, 3));
        let lease = claims.lease(0);
        assert_eq!((lease.granted, lease.held, lease.spent, lease.stored), (900, 0, 0, 0));
        assert_eq!(claims.fold_all(), (0, 0));
    }
}
