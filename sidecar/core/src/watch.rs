//! What the event loop watches a socket for, and whom it calls: the owner's own
//! `readable` and `writable`, registered with `add_reader` and `add_writer` only while
//! they are wanted.

use std::os::fd::RawFd;

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

/// A readiness the loop can watch for.
#[derive(Clone, Copy)]
enum Readiness {
    Read,
    Write,
}

impl Readiness {
    /// The owner's method the loop calls, and the loop's methods that start and stop it.
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::Read => ("readable", "add_reader", "remove_reader"),
            Self::Write => ("writable", "add_writer", "remove_writer"),
        }
    }
}

/// One readiness's watch: the owner's bound method (it holds the owner, so it is
/// dropped at the owner's end, which breaks the cycle through the loop), and whether
/// the loop calls it.
#[derive(Default)]
struct Watch {
    callback: Option<Py<PyAny>>,
    on: bool,
}

pub struct Watcher {
    event_loop: Py<PyAny>,
    read: Watch,
    write: Watch,
}

impl Watcher {
    pub fn new(event_loop: Py<PyAny>) -> Self {
        Self {
            event_loop,
            read: Watch::default(),
            write: Watch::default(),
        }
    }

    /// The owner's `readable` and `writable` methods, which the loop calls; what the
    /// loop already watches `fd` for (a watch handed over) calls them from now on.
    pub fn bind(&mut self, owner: &Bound<'_, PyAny>, fd: RawFd) -> PyResult<()> {
        let py = owner.py();
        for readiness in [Readiness::Read, Readiness::Write] {
            let (method, add, _) = readiness.names();
            let callback = owner.getattr(method)?.unbind();
            if self.watch(readiness).on {
                // The loop swaps the callback of a registered descriptor in its own
                // table: no system call.
                let handed = callback.clone_ref(py);
                self.event_loop.call_method1(py, add, (fd, handed))?;
            }
            self.watch_mut(readiness).callback = Some(callback);
        }
        Ok(())
    }

    /// What the loop watches for, for a new owner of the socket (`bind`): handing the
    /// registration over instead of removing and adding it spares the kernel two
    /// changes of its interest list. This watcher watches nothing any more.
    pub fn hand_over(&mut self, py: Python<'_>) -> Self {
        let taken = |watch: &mut Watch| Watch {
            callback: None,
            on: std::mem::take(&mut watch.on),
        };
        let next = Self {
            event_loop: self.event_loop.clone_ref(py),
            read: taken(&mut self.read),
            write: taken(&mut self.write),
        };
        self.clear();
        next
    }

    pub fn event_loop(&self) -> &Py<PyAny> {
        &self.event_loop
    }

    /// Have the loop call `readable` (`on`) when `fd` is readable, or no more.
    pub fn reads(&mut self, py: Python<'_>, fd: RawFd, on: bool) -> PyResult<()> {
        self.set(py, fd, Readiness::Read, on)
    }

    /// Have the loop call `writable` (`on`) when `fd` is writable, or no more.
    pub fn writes(&mut self, py: Python<'_>, fd: RawFd, on: bool) -> PyResult<()> {
        self.set(py, fd, Readiness::Write, on)
    }

    /// Call `readable` on the loop's next turn, and no sooner than `delay` seconds.
    pub fn read_later(&self, py: Python<'_>, delay: f64) -> PyResult<()> {
        let callback = self.read.callback.as_ref().map(|c| c.clone_ref(py));
        if delay > 0.0 {
            self.event_loop
                .call_method1(py, "call_later", (delay, callback))?;
        } else {
            self.event_loop.call_method1(py, "call_soon", (callback,))?;
        }
        Ok(())
    }

    /// Watch `fd` no more, and let the callbacks go.
    pub fn stop(&mut self, py: Python<'_>, fd: RawFd) -> PyResult<()> {
        self.reads(py, fd, false)?;
        self.writes(py, fd, false)?;
        self.clear();
        Ok(())
    }

    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.event_loop)?;
        visit.call(&self.read.callback)?;
        visit.call(&self.write.callback)?;
        Ok(())
    }

    pub fn clear(&mut self) {
        self.read.callback = None;
        self.write.callback = None;
    }

    fn watch(&self, readiness: Readiness) -> &Watch {
        match readiness {
            Readiness::Read => &self.read,
            Readiness::Write => &self.write,
        }
    }

    fn watch_mut(&mut self, readiness: Readiness) -> &mut Watch {
        match readiness {
            Readiness::Read => &mut self.read,
            Readiness::Write => &mut self.write,
        }
    }

    fn set(&mut self, py: Python<'_>, fd: RawFd, readiness: Readiness, on: bool) -> PyResult<()> {
        let watch = self.watch(readiness);
        if on == watch.on || fd < 0 || (on && watch.callback.is_none()) {
            return Ok(());
        }
        let (_, add, remove) = readiness.names();
        if on {
            let callback = watch.callback.as_ref().map(|c| c.clone_ref(py));
            self.event_loop.call_method1(py, add, (fd, callback))?;
        } else {
            self.event_loop.call_method1(py, remove, (fd,))?;
        }
        self.watch_mut(readiness).on = on;
        Ok(())
    }
}
