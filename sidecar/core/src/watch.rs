//! What the event loop watches a socket for, and whom it calls: the owner's own
//! `readable` and `writable`, registered with `add_reader` and `add_writer` only while
//! they are wanted.

use std::os::fd::RawFd;

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

pub struct Watcher {
    event_loop: Py<PyAny>,
    // The owner's bound methods: they hold the owner, so they are dropped at its end,
    // which breaks the cycle through the loop.
    on_readable: Option<Py<PyAny>>,
    on_writable: Option<Py<PyAny>>,
    reading: bool,
    writing: bool,
}

impl Watcher {
    pub fn new(event_loop: Py<PyAny>) -> Self {
        Self {
            event_loop,
            on_readable: None,
            on_writable: None,
            reading: false,
            writing: false,
        }
    }

    /// The owner's `readable` and `writable` methods, which the loop calls.
    pub fn bind(&mut self, owner: &Bound<'_, PyAny>) -> PyResult<()> {
        self.on_readable = Some(owner.getattr("readable")?.unbind());
        self.on_writable = Some(owner.getattr("writable")?.unbind());
        Ok(())
    }

    pub fn event_loop(&self) -> &Py<PyAny> {
        &self.event_loop
    }

    /// Have the loop call `readable` (`on`) when `fd` is readable, or no more.
    pub fn reads(&mut self, py: Python<'_>, fd: RawFd, on: bool) -> PyResult<()> {
        if on == self.reading || fd < 0 || (on && self.on_readable.is_none()) {
            return Ok(());
        }
        self.reading = on;
        let names = ("add_reader", "remove_reader");
        self.tell_loop(py, fd, on, self.on_readable.as_ref(), names)
    }

    /// Have the loop call `writable` (`on`) when `fd` is writable, or no more.
    pub fn writes(&mut self, py: Python<'_>, fd: RawFd, on: bool) -> PyResult<()> {
        if on == self.writing || fd < 0 || (on && self.on_writable.is_none()) {
            return Ok(());
        }
        self.writing = on;
        let names = ("add_writer", "remove_writer");
        self.tell_loop(py, fd, on, self.on_writable.as_ref(), names)
    }

    /// Call `readable` on the loop's next turn, and no sooner than `delay` seconds.
    pub fn read_later(&self, py: Python<'_>, delay: f64) -> PyResult<()> {
        let callback = self.on_readable.as_ref().map(|c| c.clone_ref(py));
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
        visit.call(&self.on_readable)?;
        visit.call(&self.on_writable)?;
        Ok(())
    }

    pub fn clear(&mut self) {
        self.on_readable = None;
        self.on_writable = None;
    }

    fn tell_loop(
        &self,
        py: Python<'_>,
        fd: RawFd,
        on: bool,
        callback: Option<&Py<PyAny>>,
        (add, remove): (&str, &str),
    ) -> PyResult<()> {
        if on {
            self.event_loop.call_method1(py, add, (fd, callback))?;
        } else {
            self.event_loop.call_method1(py, remove, (fd,))?;
        }
        Ok(())
    }
}
