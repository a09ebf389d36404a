//! Contexts: the per-thread context stack, primary contexts, cuCtxCreate/Destroy and the
//! teardown that stops a context's streams and frees its memory.

use super::config::R;
use super::state::Driver;
use super::tables::{Context, Range, TAG_CTX, Tables, lock, new_handle};
use crate::stream::Stream;
use crate::types::*;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Context ids start at 1, as the driver's do, and count up for the life of the process.
static NEXT_CTX_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's context stack (top = current), as context handles.
    static CTX_STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

pub fn with_stack<T>(f: impl FnOnce(&mut Vec<u64>) -> T) -> T {
    CTX_STACK.with(|s| f(&mut s.borrow_mut()))
}

impl Driver {
    fn new_context(&self, t: &mut Tables, device: i32, flags: u32, primary: bool) -> Arc<Context> {
        let c = Arc::new(Context {
            handle: new_handle(TAG_CTX),
            id: NEXT_CTX_ID.fetch_add(1, Ordering::Relaxed),
            device,
            flags,
            primary,
            default_stream: Mutex::new(None),
        });
        t.ctxs.insert(c.handle, Arc::clone(&c));
        c
    }

    pub fn context(&self, h: u64) -> R<Arc<Context>> {
        self.tables().ctxs.get(&h).cloned().ok_or(err::INVALID_CONTEXT)
    }

    /// The calling thread's current context.
    pub fn current(&self) -> R<Arc<Context>> {
        let h = with_stack(|s| s.last().copied()).ok_or(err::INVALID_CONTEXT)?;
        self.context(h)
    }

    pub fn primary_retain(&self, dev: CUdevice) -> R<u64> {
        self.check_device(dev)?;
        let mut t = self.tables();
        let slot = &t.primary[dev as usize];
        let (h, flags) = (slot.handle, slot.flags);
        let h = match h {
            Some(h) => h,
            None => {
                let c = self.new_context(&mut t, dev, flags, true);
                t.primary[dev as usize].handle = Some(c.handle);
                c.handle
            }
        };
        t.primary[dev as usize].refs += 1;
        Ok(h)
    }

    pub fn primary_release(&self, dev: CUdevice) -> R<()> {
        self.check_device(dev)?;
        let mut t = self.tables();
        let slot = &mut t.primary[dev as usize];
        if slot.refs == 0 {
            return Err(err::INVALID_CONTEXT);
        }
        slot.refs -= 1;
        if slot.refs > 0 {
            return Ok(());
        }
        let h = slot.handle.take();
        drop(t);
        if let Some(h) = h {
            self.destroy_context(h);
        }
        Ok(())
    }

    pub fn primary_reset(&self, dev: CUdevice) -> R<()> {
        self.check_device(dev)?;
        let mut t = self.tables();
        let slot = &mut t.primary[dev as usize];
        let h = slot.handle.take();
        slot.refs = 0;
        drop(t);
        if let Some(h) = h {
            self.destroy_context(h);
        }
        Ok(())
    }

    pub fn primary_state(&self, dev: CUdevice) -> R<(u32, bool)> {
        self.check_device(dev)?;
        let t = self.tables();
        let s = &t.primary[dev as usize];
        Ok((s.flags, s.handle.is_some()))
    }

    pub fn primary_set_flags(&self, dev: CUdevice, flags: u32) -> R<()> {
        self.check_device(dev)?;
        if flags & !0x1f != 0 {
            return Err(err::INVALID_VALUE);
        }
        self.tables().primary[dev as usize].flags = flags;
        Ok(())
    }

    pub fn ctx_create(&self, flags: u32, dev: CUdevice) -> R<u64> {
        self.check_device(dev)?;
        if flags & !0x1f != 0 {
            return Err(err::INVALID_VALUE);
        }
        let h = self.new_context(&mut self.tables(), dev, flags, false).handle;
        with_stack(|s| s.push(h));
        Ok(h)
    }

    pub fn ctx_destroy(&self, h: u64) -> R<()> {
        let c = self.context(h)?;
        if c.primary {
            return Err(err::INVALID_CONTEXT);
        }
        with_stack(|s| s.retain(|&x| x != h));
        self.destroy_context(h);
        Ok(())
    }

    /// Tears a context down: its streams are stopped (pending work dropped), its events,
    /// allocations and registrations released.
    fn destroy_context(&self, h: u64) {
        let mut t = self.tables();
        let Some(c) = t.ctxs.remove(&h) else { return };
        let mut streams: Vec<Arc<Stream>> = Vec::new();
        t.streams.retain(|_, s| {
            if s.ctx == h {
                streams.push(Arc::clone(s));
                false
            } else {
                true
            }
        });
        streams.extend(lock(&c.default_stream).take());
        t.events.retain(|_, e| e.ctx != h);
        let doomed: Vec<u64> = t.ranges.values().filter(|r| r.ctx == h).map(|r| r.base).collect();
        let ranges: Vec<Range> = doomed.iter().filter_map(|b| t.ranges.remove(b)).collect();
        drop(t);
        for s in &streams {
            s.abort_and_join();
        }
        for r in ranges {
            self.release_range(r);
        }
    }

    pub fn ctx_synchronize(&self, c: &Context) -> CUresult {
        // Streams being destroyed still finish their work: they are in all_streams only.
        let streams: Vec<Arc<Stream>> =
            lock(&self.all_streams).iter().filter_map(Weak::upgrade).filter(|s| s.ctx == c.handle).collect();
        let mut res = err::SUCCESS;
        for s in streams {
            let e = s.synchronize();
            if res == err::SUCCESS {
                res = e;
            }
        }
        res
    }
}
