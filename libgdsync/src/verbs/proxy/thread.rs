//! The proxy thread: one per process, started by the first QP, looking at every QP's trigger
//! word and CQs ([`ProxyQp::service`]); it spins a little after work, then backs off so an idle
//! process does not burn a core. A panic in it is contained ([`fail`]).

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::sync::lock;
use crate::verbs::proxy::cq::{FAILED, ProxyCq, cqs};
use crate::verbs::proxy::qp::{ProxyQp, qps};

/// The proxy thread, started once; `None` (reported once) if it could not be started.
fn proxy_thread() -> Option<&'static std::thread::Thread> {
    static T: OnceLock<Option<std::thread::Thread>> = OnceLock::new();
    T.get_or_init(|| match std::thread::Builder::new().name("gds-proxy".into()).spawn(run) {
        Ok(h) => Some(h.thread().clone()),
        Err(e) => {
            gds_err!("gds_proxy", "cannot start the proxy thread: {e}");
            None
        }
    })
    .as_ref()
}

static STARTED: AtomicBool = AtomicBool::new(false);

pub(super) fn wake() {
    if STARTED.load(Ordering::Acquire)
        && let Some(t) = proxy_thread()
    {
        t.unpark();
    }
}

fn run() {
    let mut idle = 0u32;
    loop {
        let list: Vec<Arc<ProxyQp>> = lock(qps()).values().cloned().collect();
        if list.is_empty() {
            std::thread::park_timeout(Duration::from_millis(100));
            continue;
        }
        let mut busy = false;
        for q in &list {
            let mut why = None;
            match gpudirect_common::boundary::guard(None, |m| why = Some(m.to_owned()), || Some(q.service())) {
                Some(b) => busy |= b,
                None => {
                    drop(list);
                    fail(why.unwrap_or_default());
                    return;
                }
            }
        }
        drop(list);
        if busy {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        // Spin a little (a stream write lands any moment), then back off to at most 200 µs
        // between looks so an idle process does not burn a core.
        if idle < 64 {
            std::hint::spin_loop();
        } else if idle < 256 {
            std::thread::yield_now();
        } else {
            let us = ((idle - 256) as u64 * 2).clamp(5, 200);
            std::thread::park_timeout(Duration::from_micros(us));
        }
    }
}

/// Starts the proxy thread for a QP about to be created, if it is not running yet; false when it
/// cannot be started (reported once).
pub(super) fn start() -> bool {
    if proxy_thread().is_none() {
        return false;
    }
    STARTED.store(true, Ordering::Release);
    true
}

/// The proxy thread is gone (a panic): release every prepared stream wait, fail later calls.
fn fail(why: String) {
    FAILED.store(true, Ordering::Release);
    gds_err!(
        "gds_proxy",
        "the CPU-proxy thread failed ({why}): stream waits on proxy CQs are released, their ibv_poll_cq returns an error, and gds calls on proxy QPs fail with EIO from now on"
    );
    let list: Vec<Arc<ProxyCq>> = lock(cqs()).values().cloned().collect();
    for c in list {
        c.release_all_waits();
    }
}
