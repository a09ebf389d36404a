//! Streams (one worker thread each, executing queued operations in order) and events.

use crate::exec::{self, Elem};
use crate::types::{CUresult, CUstream, err};
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One operation of a stream. Addresses were validated when the operation was queued, and
/// memory they point into is not released while the operation is queued or running (see
/// [`Stream::wait_untouched`]).
pub enum Op {
    Copy {
        dst: u64,
        src: u64,
        len: u64,
    },
    Fill {
        dst: u64,
        count: u64,
        elem: Elem,
    },
    Write32 {
        addr: u64,
        value: u32,
        barrier: bool,
    },
    Write64 {
        addr: u64,
        value: u64,
        barrier: bool,
    },
    Wait32 {
        addr: u64,
        value: u32,
        cond: u32,
        flush: bool,
    },
    Wait64 {
        addr: u64,
        value: u64,
        cond: u32,
        flush: bool,
    },
    /// FLUSH_REMOTE_WRITES and BARRIER: a full fence.
    Fence,
    Record {
        ev: Arc<Event>,
        generation: u64,
    },
    WaitEvent {
        ev: Arc<Event>,
        generation: u64,
    },
    Callback {
        f: unsafe extern "C" fn(CUstream, CUresult, *mut c_void),
        stream: usize,
        data: usize,
    },
    HostFn {
        f: unsafe extern "C" fn(*mut c_void),
        data: usize,
    },
    Batch(Vec<Op>),
}

fn overlap(a: u64, alen: u64, lo: u64, hi: u64) -> bool {
    a < hi && a.saturating_add(alen) > lo
}

impl Op {
    /// True when the operation accesses memory in `[lo, hi)`.
    fn touches(&self, lo: u64, hi: u64) -> bool {
        match self {
            Op::Copy { dst, src, len } => overlap(*dst, *len, lo, hi) || overlap(*src, *len, lo, hi),
            Op::Fill { dst, count, elem } => overlap(*dst, count * elem.size(), lo, hi),
            Op::Write32 { addr, .. } | Op::Wait32 { addr, .. } => overlap(*addr, 4, lo, hi),
            Op::Write64 { addr, .. } | Op::Wait64 { addr, .. } => overlap(*addr, 8, lo, hi),
            Op::Batch(ops) => ops.iter().any(|o| o.touches(lo, hi)),
            _ => false,
        }
    }

    /// Appends the (address, length) spans the operation accesses.
    fn spans(&self, out: &mut Vec<(u64, u64)>) {
        match self {
            Op::Copy { dst, src, len } => out.extend([(*dst, *len), (*src, *len)]),
            Op::Fill { dst, count, elem } => out.push((*dst, count * elem.size())),
            Op::Write32 { addr, .. } | Op::Wait32 { addr, .. } => out.push((*addr, 4)),
            Op::Write64 { addr, .. } | Op::Wait64 { addr, .. } => out.push((*addr, 8)),
            Op::Batch(ops) => ops.iter().for_each(|o| o.spans(out)),
            _ => {}
        }
    }
}

struct Queue {
    ops: VecDeque<Op>,
    submitted: u64,
    completed: u64,
    /// Address spans of the operation being executed (for `wait_untouched`).
    running: Vec<(u64, u64)>,
    /// Sticky error: set by a failed operation; later operations are skipped.
    error: CUresult,
    closing: bool,
    exited: bool,
}

/// A stream. `handle` is the opaque `CUstream` value handed to the user.
pub struct Stream {
    pub handle: u64,
    pub ctx: u64,
    pub flags: u32,
    pub priority: i32,
    q: Mutex<Queue>,
    cv: Condvar,
    abort: AtomicBool,
    timeout: Option<Duration>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of our locks leaves consistent data (we never unwind mid-update
    // of a multi-field invariant), so poisoning is ignored.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Stream {
    /// Creates the stream and starts its worker thread.
    pub fn spawn(
        handle: u64,
        ctx: u64,
        flags: u32,
        priority: i32,
        timeout: Option<Duration>,
    ) -> std::io::Result<Arc<Stream>> {
        let s = Arc::new(Stream {
            handle,
            ctx,
            flags,
            priority,
            q: Mutex::new(Queue {
                ops: VecDeque::new(),
                submitted: 0,
                completed: 0,
                running: Vec::new(),
                error: err::SUCCESS,
                closing: false,
                exited: false,
            }),
            cv: Condvar::new(),
            abort: AtomicBool::new(false),
            timeout,
        });
        let w = Arc::clone(&s);
        std::thread::Builder::new().name(format!("cudasim-stream-{handle:x}")).spawn(move || w.worker())?;
        Ok(s)
    }

    /// Queues an operation; returns its sequence number.
    pub fn enqueue(&self, op: Op) -> u64 {
        let mut q = lock(&self.q);
        q.ops.push_back(op);
        q.submitted += 1;
        let seq = q.submitted;
        drop(q);
        self.cv.notify_all();
        seq
    }

    /// Waits until everything queued so far has executed; returns the sticky error.
    pub fn synchronize(&self) -> CUresult {
        let mut q = lock(&self.q);
        let target = q.submitted;
        while q.completed < target && !q.exited {
            q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        q.error
    }

    pub fn query(&self) -> CUresult {
        let q = lock(&self.q);
        if q.error != err::SUCCESS {
            q.error
        } else if q.completed < q.submitted {
            err::NOT_READY
        } else {
            err::SUCCESS
        }
    }

    /// Lets the worker finish queued work and exit (cuStreamDestroy).
    pub fn close(&self) {
        lock(&self.q).closing = true;
        self.cv.notify_all();
    }

    /// Drops queued work, interrupts waits, and waits for the worker to exit (context teardown).
    pub fn abort_and_join(&self) {
        self.abort.store(true, Ordering::SeqCst);
        let mut q = lock(&self.q);
        q.closing = true;
        let dropped = q.ops.len() as u64;
        for op in q.ops.drain(..) {
            // Events recorded behind dropped work still complete, so that nobody waiting on
            // them (cuEventSynchronize, other streams) hangs.
            if let Op::Record { ev, generation } = op {
                ev.complete(generation);
            }
        }
        q.completed += dropped;
        self.cv.notify_all();
        while !q.exited {
            q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Blocks until no queued or running operation accesses `[lo, hi)` (memory release).
    pub fn wait_untouched(&self, lo: u64, hi: u64) {
        let mut q = lock(&self.q);
        loop {
            let busy = q.running.iter().any(|&(a, n)| overlap(a, n, lo, hi)) || q.ops.iter().any(|o| o.touches(lo, hi));
            if !busy || q.exited {
                return;
            }
            q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn worker(self: Arc<Self>) {
        loop {
            let (op, error) = {
                let mut q = lock(&self.q);
                loop {
                    if let Some(op) = q.ops.pop_front() {
                        // Publish what the op touches so that memory release waits for it.
                        q.running.clear();
                        op.spans(&mut q.running);
                        let e = q.error;
                        break (op, e);
                    }
                    if q.closing {
                        q.exited = true;
                        drop(q);
                        self.cv.notify_all();
                        return;
                    }
                    q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let res = self.execute(&op, error);
            drop(op);
            let mut q = lock(&self.q);
            q.running.clear();
            q.completed += 1;
            match res {
                Err(e) if q.error == err::SUCCESS => q.error = e,
                _ => {}
            }
            drop(q);
            self.cv.notify_all();
        }
    }

    fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }

    fn execute(&self, op: &Op, error: CUresult) -> Result<(), CUresult> {
        if self.aborted() {
            return Ok(());
        }
        match op {
            Op::Record { ev, generation } => {
                ev.complete(*generation);
                return Ok(());
            }
            Op::Callback { f, stream, data } => {
                // SAFETY: the user registered this callback with its data pointer; CUDA's
                // contract makes them valid until the callback has run.
                unsafe { f(*stream as CUstream, error, *data as *mut c_void) };
                return Ok(());
            }
            _ => {}
        }
        if error != err::SUCCESS {
            return Ok(()); // sticky error: work after a failure is skipped
        }
        match op {
            // SAFETY: addresses were checked against the range table at enqueue time and the
            // memory cannot be released while this op is pending (wait_untouched).
            Op::Copy { dst, src, len } => unsafe { exec::copy(*dst, *src, *len) },
            // SAFETY: see above; alignment checked at enqueue.
            Op::Fill { dst, count, elem } => unsafe { exec::fill(*dst, *count, *elem) },
            Op::Write32 { addr, value, barrier } => {
                // SAFETY: see above; 4-byte alignment checked at enqueue.
                unsafe { exec::store32(*addr, *value, *barrier) }
            }
            Op::Write64 { addr, value, barrier } => {
                // SAFETY: see above; 8-byte alignment checked at enqueue.
                unsafe { exec::store64(*addr, *value, *barrier) }
            }
            Op::Wait32 { addr, value, cond, flush } => {
                // SAFETY: see above.
                self.spin_until(|| exec::cond32(unsafe { exec::load32(*addr) }, *value, *cond))?;
                if *flush {
                    fence(Ordering::SeqCst);
                }
            }
            Op::Wait64 { addr, value, cond, flush } => {
                // SAFETY: see above.
                self.spin_until(|| exec::cond64(unsafe { exec::load64(*addr) }, *value, *cond))?;
                if *flush {
                    fence(Ordering::SeqCst);
                }
            }
            Op::Fence => fence(Ordering::SeqCst),
            Op::WaitEvent { ev, generation } => ev.wait_gen(*generation, &self.abort, self.timeout)?,
            Op::HostFn { f, data } => {
                // SAFETY: user-registered host function and its argument (cuLaunchHostFunc).
                unsafe { f(*data as *mut c_void) }
            }
            Op::Batch(ops) => {
                for o in ops {
                    self.execute(o, err::SUCCESS)?;
                }
            }
            Op::Record { .. } | Op::Callback { .. } => unreachable!("handled above"),
        }
        Ok(())
    }

    /// Polls `pred` with spin / yield / short-sleep backoff until it holds, the stream is
    /// aborted, or the optional timeout (CUDASIM_WAIT_TIMEOUT_MS) passes.
    fn spin_until(&self, mut pred: impl FnMut() -> bool) -> Result<(), CUresult> {
        let start = Instant::now();
        let mut i: u32 = 0;
        loop {
            if pred() {
                return Ok(());
            }
            i = i.saturating_add(1);
            if i < 256 {
                std::hint::spin_loop();
            } else if i < 4096 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
            if i % 64 == 0 {
                if self.aborted() {
                    return Err(err::CONTEXT_IS_DESTROYED);
                }
                if self.timeout.is_some_and(|t| start.elapsed() > t) {
                    crate::log!("stream {:#x}: wait timed out, stream now in error", self.handle);
                    return Err(err::LAUNCH_TIMEOUT);
                }
            }
        }
    }
}

struct EvState {
    recorded: u64,
    completed: u64,
    time: Option<Instant>,
}

/// An event. Each `cuEventRecord` bumps `recorded`; the stream worker sets `completed` to that
/// generation when it reaches the record.
pub struct Event {
    pub handle: u64,
    pub ctx: u64,
    pub flags: u32,
    st: Mutex<EvState>,
    cv: Condvar,
}

impl Event {
    pub fn new(handle: u64, ctx: u64, flags: u32) -> Event {
        Event {
            handle,
            ctx,
            flags,
            st: Mutex::new(EvState { recorded: 0, completed: 0, time: None }),
            cv: Condvar::new(),
        }
    }

    /// Starts a new record; returns its generation.
    pub fn begin_record(&self) -> u64 {
        let mut s = lock(&self.st);
        s.recorded += 1;
        s.recorded
    }

    /// The generation a `cuStreamWaitEvent` issued now must wait for (0: never recorded).
    pub fn current_gen(&self) -> u64 {
        lock(&self.st).recorded
    }

    fn complete(&self, generation: u64) {
        let mut s = lock(&self.st);
        if generation > s.completed {
            s.completed = generation;
            s.time = Some(Instant::now());
        }
        drop(s);
        self.cv.notify_all();
    }

    pub fn query(&self) -> CUresult {
        let s = lock(&self.st);
        if s.completed >= s.recorded { err::SUCCESS } else { err::NOT_READY }
    }

    pub fn synchronize(&self) {
        let mut s = lock(&self.st);
        let target = s.recorded;
        while s.completed < target {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn wait_gen(&self, generation: u64, abort: &AtomicBool, timeout: Option<Duration>) -> Result<(), CUresult> {
        let start = Instant::now();
        let mut s = lock(&self.st);
        while s.completed < generation {
            if abort.load(Ordering::Relaxed) {
                return Err(err::CONTEXT_IS_DESTROYED);
            }
            if timeout.is_some_and(|t| start.elapsed() > t) {
                return Err(err::LAUNCH_TIMEOUT);
            }
            s = self.cv.wait_timeout(s, Duration::from_millis(5)).unwrap_or_else(|p| p.into_inner()).0;
        }
        Ok(())
    }

    /// Completion time of the latest record; `Err` as cuEventElapsedTime reports it.
    pub fn completed_time(&self) -> Result<Instant, CUresult> {
        let s = lock(&self.st);
        if s.recorded == 0 {
            return Err(err::INVALID_HANDLE);
        }
        if s.completed < s.recorded {
            return Err(err::NOT_READY);
        }
        s.time.ok_or(err::NOT_READY)
    }
}
