//! Streams and events: creation, lookup of the default stream, submission of validated
//! operations, and draining streams off memory that is being released.

use super::config::R;
use super::state::Driver;
use super::tables::{TAG_EVENT, TAG_STREAM, Tables, lock, new_handle};
use crate::stream::{Event, Op, Stream};
use crate::types::*;
use std::sync::{Arc, Weak};

impl Driver {
    fn track(&self, s: &Arc<Stream>) {
        let mut all = lock(&self.all_streams);
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(s));
    }

    pub fn stream_create(&self, flags: u32, priority: i32) -> R<u64> {
        if flags & !CU_STREAM_NON_BLOCKING != 0 {
            return Err(err::INVALID_VALUE);
        }
        let c = self.current()?;
        let s = Stream::spawn(new_handle(TAG_STREAM), c.handle, flags, priority.clamp(-5, 0), self.cfg.wait_timeout)
            .map_err(|e| {
                crate::log!("cannot start a stream worker thread: {e}");
                err::OUT_OF_MEMORY
            })?;
        self.track(&s);
        let h = s.handle;
        self.tables().streams.insert(h, s);
        Ok(h)
    }

    /// Resolves a `CUstream` value: NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD all mean the
    /// current context's default stream (one worker; see docs/cudasim.md).
    pub fn stream(&self, h: usize) -> R<Arc<Stream>> {
        if h == 0 || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD {
            let c = self.current()?;
            let mut d = lock(&c.default_stream);
            if let Some(s) = d.as_ref() {
                return Ok(Arc::clone(s));
            }
            let s = Stream::spawn(new_handle(TAG_STREAM), c.handle, 0, 0, self.cfg.wait_timeout)
                .map_err(|_| err::OUT_OF_MEMORY)?;
            self.track(&s);
            *d = Some(Arc::clone(&s));
            return Ok(s);
        }
        self.tables().streams.get(&(h as u64)).cloned().ok_or(err::INVALID_HANDLE)
    }

    pub fn stream_destroy(&self, h: usize) -> R<()> {
        let s = self.tables().streams.remove(&(h as u64)).ok_or(err::INVALID_HANDLE)?;
        s.close();
        Ok(())
    }

    /// Validates an operation against the range table and queues it, atomically with respect
    /// to memory release (which removes the range under the same lock, then drains streams).
    pub fn submit(&self, s: &Stream, build: impl FnOnce(&Tables) -> R<Op>) -> R<u64> {
        let t = self.tables();
        let op = build(&t)?;
        Ok(s.enqueue(op))
    }

    pub fn event_create(&self, flags: u32) -> R<u64> {
        if flags & !(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS) != 0 {
            return Err(err::INVALID_VALUE);
        }
        if flags & CU_EVENT_INTERPROCESS != 0 && flags & CU_EVENT_DISABLE_TIMING == 0 {
            return Err(err::INVALID_VALUE);
        }
        let c = self.current()?;
        let e = Arc::new(Event::new(new_handle(TAG_EVENT), c.handle, flags));
        let h = e.handle;
        self.tables().events.insert(h, e);
        Ok(h)
    }

    pub fn event(&self, h: usize) -> R<Arc<Event>> {
        self.tables().events.get(&(h as u64)).cloned().ok_or(err::INVALID_HANDLE)
    }

    pub fn event_destroy(&self, h: usize) -> R<()> {
        self.tables().events.remove(&(h as u64)).map(|_| ()).ok_or(err::INVALID_HANDLE)
    }

    /// Waits until no stream has pending work touching `[lo, hi)`.
    pub(super) fn drain(&self, lo: u64, hi: u64) {
        let streams: Vec<Arc<Stream>> = lock(&self.all_streams).iter().filter_map(Weak::upgrade).collect();
        for s in streams {
            s.wait_untouched(lo, hi);
        }
    }
}
