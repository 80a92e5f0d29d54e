//! The lock of the sidecar's shared memory file (`sidecar.shared`): the one every process
//! takes to change the claims, the leases and the clients' table, several times a miss.
//!
//! A process-shared, robust, recursive pthread mutex in the file itself: taken and given
//! back with an atomic instruction each while nobody else holds it (a futex wait only
//! when another process does), where the `flock` it replaces cost two system calls every
//! time. Robust, because a process may be killed holding it: the next process to lock it
//! is told so (`EOWNERDEAD`), marks it consistent and goes on, as the kernel released a
//! dead process's `flock`; what the lock guards is written so that a change cut short
//! reads as no change (`buffer.claims`). Recursive, as a `flock` held by a process was:
//! taking it again while holding it does not wait.

use std::io;
use std::os::fd::RawFd;

use pyo3::prelude::*;
use pyo3::types::PyAny;

use crate::shared::mapping::{Mapping, python_error};

/// Bytes the lock takes in the file (a `pthread_mutex_t`, with room to spare).
pub const BYTES: usize = 64;
const _: () = assert!(std::mem::size_of::<libc::pthread_mutex_t>() <= BYTES);

/// The lock, mapped from the shared memory file.
#[pyclass(module = "sidecar.core.native", frozen)]
pub struct SharedLock {
    _mapping: Mapping, // what `mutex` points into
    mutex: *mut libc::pthread_mutex_t,
}

// SAFETY: the mutex is made for use by many threads and processes at once.
unsafe impl Send for SharedLock {}
unsafe impl Sync for SharedLock {}

fn check(status: libc::c_int) -> io::Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(status))
    }
}

impl SharedLock {
    /// The lock at byte `at` of the shared memory file `fd`; `create`: make it there
    /// first (once, before any other process maps it).
    pub fn map(fd: RawFd, at: usize, create: bool) -> io::Result<Self> {
        let mapping = Mapping::of(fd)?;
        // 8-aligned, as the mutex's words need.
        let mutex = mapping
            .at(at, BYTES, "the lock")?
            .cast::<libc::pthread_mutex_t>();
        let lock = Self {
            _mapping: mapping,
            mutex,
        };
        if create {
            lock.create()?;
        }
        Ok(lock)
    }

    fn create(&self) -> io::Result<()> {
        // SAFETY: the attributes live on this stack frame and are destroyed before it
        // ends; the mutex's bytes are ours to initialise (`map`'s caller says so).
        unsafe {
            let mut attributes: libc::pthread_mutexattr_t = std::mem::zeroed();
            check(libc::pthread_mutexattr_init(&mut attributes))?;
            let made = check(libc::pthread_mutexattr_setpshared(
                &mut attributes,
                libc::PTHREAD_PROCESS_SHARED,
            ))
            .and_then(|()| {
                check(libc::pthread_mutexattr_setrobust(
                    &mut attributes,
                    libc::PTHREAD_MUTEX_ROBUST,
                ))
            })
            .and_then(|()| {
                check(libc::pthread_mutexattr_settype(
                    &mut attributes,
                    libc::PTHREAD_MUTEX_RECURSIVE,
                ))
            })
            .and_then(|()| check(libc::pthread_mutex_init(self.mutex, &attributes)));
            libc::pthread_mutexattr_destroy(&mut attributes);
            made
        }
    }

    /// Take the lock, waiting for it through `wait` (given the blocking call, which it
    /// makes) if another process holds it; true if its last holder died holding it (the
    /// lock is then made consistent, and held).
    pub fn lock(
        &self,
        wait: impl FnOnce(&(dyn Fn() -> libc::c_int + Sync)) -> libc::c_int,
    ) -> io::Result<bool> {
        // SAFETY: the mutex was initialised by `create` in the file every process maps.
        let mut status = unsafe { libc::pthread_mutex_trylock(self.mutex) };
        if status == libc::EBUSY {
            let mutex = self.mutex as usize;
            // SAFETY: as above; the mapping outlives the wait (`self` is borrowed).
            status =
                wait(&|| unsafe { libc::pthread_mutex_lock(mutex as *mut libc::pthread_mutex_t) });
        }
        if status == libc::EOWNERDEAD {
            // SAFETY: this thread holds the mutex (EOWNERDEAD hands it over).
            check(unsafe { libc::pthread_mutex_consistent(self.mutex) })?;
            return Ok(true);
        }
        check(status).map(|()| false)
    }

    pub fn unlock(&self) -> io::Result<()> {
        // SAFETY: as `lock`; unlocking a mutex this thread does not hold is refused.
        check(unsafe { libc::pthread_mutex_unlock(self.mutex) })
    }
}

#[pymethods]
impl SharedLock {
    /// The lock at byte `at` of the shared memory file `fd` (BYTES of it); `create`:
    /// make it there first, once, before any other process maps it.
    #[new]
    #[pyo3(signature = (fd, at, create=false))]
    fn new(fd: RawFd, at: usize, create: bool) -> PyResult<Self> {
        Self::map(fd, at, create).map_err(python_error)
    }

    /// Take the lock (`with lock:`), waiting without the GIL while another holds it.
    /// Giving it back lets whatever the block raised go on.
    fn __enter__(&self, py: Python<'_>) -> PyResult<()> {
        self.lock(|wait| py.detach(wait))
            .map(|_| ())
            .map_err(python_error)
    }

    fn __exit__(
        &self,
        _kind: &Bound<'_, PyAny>,
        _error: &Bound<'_, PyAny>,
        _trace: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.unlock().map_err(python_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn file() -> OwnedFd {
        // SAFETY: a new memory file, owned at once.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"lock".as_ptr(), 0)) };
        // SAFETY: the descriptor is open.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
        fd
    }

    fn take(lock: &SharedLock) -> bool {
        lock.lock(|wait| wait()).expect("locked")
    }

    #[test]
    fn two_mappings_of_one_file_exclude_each_other_and_it_is_taken_again_by_its_holder() {
        let fd = file();
        let first = Arc::new(SharedLock::map(fd.as_raw_fd(), 64, true).expect("made"));
        let second = Arc::new(SharedLock::map(fd.as_raw_fd(), 64, false).expect("mapped"));
        let inside = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = [first, second]
            .into_iter()
            .map(|lock| {
                let inside = inside.clone();
                std::thread::spawn(move || {
                    for _ in 0..2_000 {
                        assert!(!take(&lock));
                        assert!(!take(&lock), "held: taken again at once");
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        inside.fetch_sub(1, Ordering::SeqCst);
                        lock.unlock().expect("unlocked");
                        lock.unlock().expect("unlocked");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("thread");
        }
    }

    #[test]
    fn a_holder_that_dies_leaves_the_lock_to_the_next() {
        let fd = file();
        let lock = Arc::new(SharedLock::map(fd.as_raw_fd(), 0, true).expect("made"));
        let holder = lock.clone();
        std::thread::spawn(move || assert!(!take(&holder)))
            .join()
            .expect("thread");
        assert!(take(&lock), "told that its holder died");
        lock.unlock().expect("unlocked");
        assert!(!take(&lock), "consistent again");
        lock.unlock().expect("unlocked");
    }

    #[test]
    fn a_lock_that_does_not_fit_the_file_is_refused() {
        let fd = file();
        assert!(SharedLock::map(fd.as_raw_fd(), 4096 - 8, true).is_err());
        assert!(SharedLock::map(fd.as_raw_fd(), 4, true).is_err());
    }
}
