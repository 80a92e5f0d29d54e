//! The sidecar's shared memory file (`sidecar.shared`), mapped whole into this process:
//! what the core's table of answers and the file's lock live in.

use std::io;
use std::os::fd::RawFd;

use pyo3::PyErr;
use pyo3::exceptions::{PyOSError, PyValueError};

/// A shared mapping of a whole file, unmapped when dropped.
pub struct Mapping {
    base: *mut u8,
    len: usize,
}

impl Mapping {
    /// The whole of the file `fd`, read and written by every process that maps it.
    pub fn of(fd: RawFd) -> io::Result<Self> {
        // SAFETY: a plain fstat of a descriptor the caller owns.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut stat) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let len = stat.st_size as usize;
        // SAFETY: a shared mapping of the whole file, unmapped on drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
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
            len,
        })
    }

    /// Where byte `offset` of the file is, or InvalidInput naming `what` if `bytes` from
    /// there do not fit the file or `offset` is not 8-aligned.
    pub fn at(&self, offset: usize, bytes: usize, what: &str) -> io::Result<*mut u8> {
        if offset % 8 != 0 || offset.checked_add(bytes).is_none_or(|end| end > self.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what} does not fit the shared memory file"),
            ));
        }
        // SAFETY: inside the mapping (checked above).
        Ok(unsafe { self.base.add(offset) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `of`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// What Python is told of a mapping's error: ValueError for what does not fit the file
/// (the caller's offsets), OSError for what the system refused.
pub fn python_error(error: io::Error) -> PyErr {
    if error.kind() == io::ErrorKind::InvalidInput {
        PyValueError::new_err(error.to_string())
    } else {
        PyOSError::new_err(error.to_string())
    }
}
