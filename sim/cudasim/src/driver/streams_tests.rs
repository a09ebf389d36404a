//! Tests of streams and events (streams.rs, with the stream workers of `crate::stream`) through
//! the C API: ordering, callbacks, waits racing CPU writers, batch memory operations, events.

use crate::capi::*;
use crate::test_util::*;
use crate::types::*;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

#[test]
fn streams_execute_in_order_with_callbacks() {
    setup();
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    /// Checks that the word at `data` holds the value written before it in the stream.
    ///
    /// # Safety
    /// `data` is the address of a 4-byte aligned device word that stays allocated for the call.
    unsafe extern "C" fn cb(_s: CUstream, status: CUresult, data: *mut c_void) {
        assert_eq!(status, 0);
        // SAFETY: data is the address of a live AtomicU32 device word (see below).
        let word = unsafe { AtomicU32::from_ptr(data as *mut u32) };
        // The callback runs after the write queued before it.
        assert_eq!(word.load(Ordering::SeqCst), 5);
        CALLS.fetch_add(1, Ordering::SeqCst);
    }
    /// Stores 6 in the word at `data`.
    ///
    /// # Safety
    /// As `cb`.
    unsafe extern "C" fn hostfn(data: *mut c_void) {
        // SAFETY: as above.
        unsafe { AtomicU32::from_ptr(data as *mut u32) }.store(6, Ordering::SeqCst);
    }
    // SAFETY: device buffers stay allocated until after synchronisation.
    unsafe {
        let s = stream();
        let p = alloc(4096);
        let host: Vec<u8> = (0..4096).map(|i| i as u8).collect();
        let mut out = vec![0u8; 4096];
        for _ in 0..20 {
            ok(cuMemsetD8Async(p, 0, 4096, s));
            ok(cuMemcpyHtoDAsync_v2(p, host.as_ptr() as *const c_void, 4096, s));
            ok(cuStreamWriteValue32_v2(s, p + 64, 5, 0));
            ok(cuStreamAddCallback(s, Some(cb), (p + 64) as *mut c_void, 0));
            ok(cuLaunchHostFunc(s, Some(hostfn), (p + 64) as *mut c_void));
            ok(cuMemcpyDtoHAsync_v2(out.as_mut_ptr() as *mut c_void, p, 4096, s));
            ok(cuStreamSynchronize(s));
            assert_eq!(&out[..64], &host[..64]);
            assert_eq!(u32::from_ne_bytes(out[64..68].try_into().unwrap()), 6);
            assert_eq!(&out[68..], &host[68..]);
        }
        assert_eq!(CALLS.load(Ordering::SeqCst), 20);
        ok(cuStreamQuery(s));
        let mut c = null_mut();
        ok(cuStreamGetCtx(s, &mut c));
        let mut cur = null_mut();
        ok(cuCtxGetCurrent(&mut cur));
        assert_eq!(c, cur);
        assert_eq!(cuStreamAddCallback(s, None, null_mut(), 0), err::INVALID_VALUE);
        assert_eq!(cuStreamAddCallback(s, Some(cb), null_mut(), 1), err::INVALID_VALUE);
        ok(cuStreamDestroy_v2(s));
        assert_eq!(cuStreamQuery(s), err::INVALID_HANDLE);
        assert_eq!(cuStreamDestroy_v2(s), err::INVALID_HANDLE);
        assert_eq!(cuStreamSynchronize(0x1234_5670 as CUstream), err::INVALID_HANDLE);
        ok(cuStreamSynchronize(CU_STREAM_LEGACY as CUstream));
        ok(cuStreamSynchronize(CU_STREAM_PER_THREAD as CUstream));
        ok(cuMemFree_v2(p));
    }
}

/// Stream waits on a word that a CPU thread updates: for every condition, 32 and 64 bit, the
/// operation queued behind the wait must not run before the condition holds, and must run
/// after it does.
#[test]
fn wait_value_all_conditions_race_cpu_writer() {
    setup();
    // (condition, initial value, blocking values written first, releasing value, reference)
    let cases: [(u32, u64, &[u64], u64, u64); 4] = [
        (CU_STREAM_WAIT_VALUE_GEQ, 0, &[1, 4], 5, 5),
        (CU_STREAM_WAIT_VALUE_EQ, 0, &[6, 8], 7, 7),
        (CU_STREAM_WAIT_VALUE_AND, 0, &[0x0f, 0x20], 0x11, 0x10),
        (CU_STREAM_WAIT_VALUE_NOR, 0xffff_ffff, &[0xffff_ffff, 0x0000_000f], 0x0000_000e, 0xffff_fff0),
    ];
    for wide in [false, true] {
        for (cond, init, blocking, release, reference) in cases {
            // 64-bit NOR: complement the high half too, so that only the low bits decide.
            let (init, blocking, release, reference): (u64, Vec<u64>, u64, u64) =
                if wide && cond == CU_STREAM_WAIT_VALUE_NOR {
                    (
                        u64::MAX,
                        blocking.iter().map(|v| v | 0xffff_ffff_0000_0000).collect(),
                        release | 0xffff_ffff_0000_0000,
                        reference | 0xffff_ffff_0000_0000,
                    )
                } else {
                    (init, blocking.to_vec(), release, reference)
                };
            let s = stream();
            let p = alloc(4096);
            let (flag, done) = (p, p + 256);
            a64(flag).store(init, Ordering::SeqCst);
            a32(done).store(0, Ordering::SeqCst);
            // SAFETY: flag/done are in the live allocation p.
            unsafe {
                if wide {
                    ok(cuStreamWaitValue64_v2(s, flag, reference, cond | CU_STREAM_WAIT_VALUE_FLUSH));
                } else {
                    ok(cuStreamWaitValue32_v2(s, flag, reference as u32, cond));
                }
                ok(cuStreamWriteValue32_v2(s, done, 1, 0));
                assert_eq!(cuStreamQuery(s), err::NOT_READY);
            }
            let what = format!("cond {cond} wide {wide}");
            let writer = std::thread::spawn(move || {
                for v in blocking {
                    if wide {
                        a64(flag).store(v, Ordering::Release)
                    } else {
                        a32(flag).store(v as u32, Ordering::Release)
                    }
                    stays_false("the write behind the wait", || a32(done).load(Ordering::Acquire) == 1);
                }
                if wide {
                    a64(flag).store(release, Ordering::Release)
                } else {
                    a32(flag).store(release as u32, Ordering::Release)
                }
            });
            writer.join().unwrap();
            eventually(&what, || a32(done).load(Ordering::Acquire) == 1);
            drain_and_free(s, p);
        }
    }
}

/// Ping-pong between a CPU thread and a stream, many rounds, through batch memops: checks
/// ordering and visibility of waits and writes under real concurrency.
#[test]
fn batch_ping_pong_with_cpu() {
    setup();
    let s = stream();
    let p = alloc(4096);
    let (ping, pong, pong64) = (p, p + 64, p + 128);
    const ROUNDS: u32 = 1500;
    // SAFETY: the parameter array lives across the call; addresses are in allocation p.
    unsafe {
        for i in 1..=ROUNDS {
            let mut ops: [CUstreamBatchMemOpParams; 4] = std::mem::zeroed();
            ops[0].wait_value = MemOpValueParams {
                operation: memop::WAIT_VALUE_32,
                address: ping,
                v: MemOpValue { value: i },
                flags: CU_STREAM_WAIT_VALUE_EQ,
                alias: 0,
            };
            ops[1].write_value = MemOpValueParams {
                operation: memop::WRITE_VALUE_64,
                address: pong64,
                v: MemOpValue { value64: (i as u64) << 32 | 1 },
                flags: 0,
                alias: 0,
            };
            ops[2].flush_remote_writes = MemOpFlagsParams { operation: memop::FLUSH_REMOTE_WRITES, flags: 0 };
            ops[3].write_value = MemOpValueParams {
                operation: memop::WRITE_VALUE_32,
                address: pong,
                v: MemOpValue { value: i },
                flags: 0,
                alias: 0,
            };
            ok(cuStreamBatchMemOp_v2(s, 4, ops.as_ptr(), 0));
            if i == 1 {
                // The v2 entry points refuse NO_MEMORY_BARRIER, as CUDA 11.7+ does; v1 takes it.
                let mut relaxed = ops[3];
                relaxed.write_value.flags = CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER;
                assert_eq!(cuStreamBatchMemOp_v2(s, 1, &relaxed, 0), err::INVALID_VALUE);
                assert_eq!(
                    cuStreamWriteValue32_v2(s, pong, i, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER),
                    err::INVALID_VALUE
                );
                assert_eq!(
                    cuStreamWriteValue64_v2(s, pong64, 0, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER),
                    err::INVALID_VALUE
                );
            }
        }
    }
    for i in 1..=ROUNDS {
        a32(ping).store(i, Ordering::Release);
        eventually("pong", || a32(pong).load(Ordering::Acquire) == i);
        // The 64-bit write queued before the 32-bit one is visible once the latter is.
        assert_eq!(a64(pong64).load(Ordering::Acquire), (i as u64) << 32 | 1);
    }
    drain_and_free(s, p);
}

#[test]
fn batch_memop_validation_is_all_or_nothing() {
    setup();
    let s = stream();
    let p = alloc(4096);
    // SAFETY: parameter arrays are local; addresses in allocation p.
    unsafe {
        let mut ops: [CUstreamBatchMemOpParams; 3] = std::mem::zeroed();
        ops[0].write_value = MemOpValueParams {
            operation: memop::WRITE_VALUE_32,
            address: p,
            v: MemOpValue { value: 9 },
            flags: 0,
            alias: 0,
        };
        ops[1].memory_barrier =
            MemOpFlagsParams { operation: memop::BARRIER, flags: CU_STREAM_MEMORY_BARRIER_TYPE_SYS };
        ops[2].write_value = MemOpValueParams {
            operation: memop::WRITE_VALUE_64,
            address: p + 4,
            v: MemOpValue { value64: 1 },
            flags: 0,
            alias: 0,
        };
        // Device memory is not zeroed (a freed neighbour's slot may be reused).
        ok(cuMemsetD8_v2(p, 0, 16));
        assert_eq!(cuStreamBatchMemOp_v2(s, 3, ops.as_ptr(), 0), err::INVALID_VALUE, "misaligned 64-bit write");
        ok(cuStreamSynchronize(s));
        assert_eq!(a32(p).load(Ordering::SeqCst), 0, "nothing of a rejected batch runs");
        ops[2].write_value.address = p + 8;
        ok(cuStreamBatchMemOp_v2(s, 3, ops.as_ptr(), 0));
        ok(cuStreamSynchronize(s));
        assert_eq!((a32(p).load(Ordering::SeqCst), a64(p + 8).load(Ordering::SeqCst)), (9, 1));
        // Zero-length batches succeed (libgdsync probes with them); flags are rejected.
        ok(cuStreamBatchMemOp_v2(null_mut(), 0, std::ptr::null(), 0));
        assert_eq!(cuStreamBatchMemOp_v2(null_mut(), 0, std::ptr::null(), 1), err::INVALID_VALUE);
        assert_eq!(cuStreamBatchMemOp_v2(s, 1, std::ptr::null(), 0), err::INVALID_VALUE);
        let mut bad: [CUstreamBatchMemOpParams; 1] = std::mem::zeroed();
        bad[0].operation = 42;
        assert_eq!(cuStreamBatchMemOp(s, 1, bad.as_ptr(), 0), err::INVALID_VALUE);
        bad[0].flush_remote_writes = MemOpFlagsParams { operation: memop::FLUSH_REMOTE_WRITES, flags: 1 };
        assert_eq!(cuStreamBatchMemOp(s, 1, bad.as_ptr(), 0), err::INVALID_VALUE);
        // Single-op validation.
        assert_eq!(cuStreamWriteValue32_v2(s, p + 2, 1, 0), err::INVALID_VALUE);
        assert_eq!(cuStreamWriteValue32_v2(s, p, 1, 2), err::INVALID_VALUE);
        assert_eq!(cuStreamWaitValue32_v2(s, p, 1, 4), err::INVALID_VALUE);
        assert_eq!(cuStreamWaitValue64_v2(s, p + 4, 1, 0), err::INVALID_VALUE);
        assert_eq!(cuStreamWriteValue64_v2(s, 0x1000, 1, 0), err::INVALID_VALUE, "not device memory");
        // The first slot past `p` that no allocation holds is refused: other tests' allocations
        // may follow `p` back to back (adjacent ranges), so skip over them, with allocations held
        // off so that the answer stands until the call.
        {
            let _layout = DEVICE_LAYOUT.lock().unwrap_or_else(|e| e.into_inner());
            let slot_after = |end: CUdeviceptr| end.next_multiple_of(super::config::SUBALLOC_ALIGN);
            let (mut past, mut base, mut size) = (slot_after(p + 4096), 0, 0);
            while cuMemGetAddressRange_v2(&mut base, &mut size, past) == err::SUCCESS {
                past = slot_after(base + size as CUdeviceptr);
            }
            assert_eq!(cuStreamWriteValue32_v2(s, past, 1, 0), err::INVALID_VALUE, "past the allocation");
        }
        ok(cuStreamDestroy_v2(s));
        ok(cuMemFree_v2(p));
    }
}

#[test]
fn a_wait_blocks_only_its_own_stream_and_events_link_streams() {
    setup();
    let (s1, s2, s3) = (stream(), stream(), stream());
    let p = alloc(4096);
    let (flag, a, b, c) = (p, p + 8, p + 16, p + 24);
    // SAFETY: handles from the API; addresses in allocation p.
    unsafe {
        let (mut ev, mut t0) = (null_mut(), null_mut());
        ok(cuEventCreate(&mut ev, 0));
        ok(cuEventCreate(&mut t0, 0));
        ok(cuEventRecord(t0, s1));
        ok(cuStreamWaitValue32_v2(s1, flag, 1, CU_STREAM_WAIT_VALUE_EQ));
        ok(cuStreamWriteValue32_v2(s1, a, 1, 0));
        ok(cuEventRecord(ev, s1));
        ok(cuStreamWaitEvent(s2, ev, 0));
        ok(cuStreamWriteValue32_v2(s2, b, 1, 0));
        ok(cuStreamWriteValue32_v2(s3, c, 1, 0)); // independent stream
        ok(cuStreamSynchronize(s3));
        assert_eq!(a32(c).load(Ordering::SeqCst), 1, "another stream is not blocked");
        assert_eq!(cuEventQuery(ev), err::NOT_READY);
        assert_eq!(cuStreamQuery(s2), err::NOT_READY);
        let mut ms = 0f32;
        assert_eq!(cuEventElapsedTime(&mut ms, t0, ev), err::NOT_READY);
        stays_false("stream 2 passing the event", || a32(b).load(Ordering::SeqCst) == 1);
        std::thread::sleep(Duration::from_millis(20));
        a32(flag).store(1, Ordering::SeqCst);
        ok(cuEventSynchronize(ev));
        assert_eq!(a32(a).load(Ordering::SeqCst), 1);
        ok(cuStreamSynchronize(s2));
        assert_eq!(a32(b).load(Ordering::SeqCst), 1);
        ok(cuEventQuery(ev));
        ok(cuEventElapsedTime(&mut ms, t0, ev));
        assert!(ms >= 15.0, "elapsed {ms} ms covers the 20 ms wait");
        // Waiting on a never-recorded event is a no-op; timing-disabled events have no time.
        let mut fresh = null_mut();
        ok(cuEventCreate(&mut fresh, CU_EVENT_DISABLE_TIMING));
        ok(cuEventQuery(fresh));
        ok(cuStreamWaitEvent(s2, fresh, 0));
        ok(cuStreamSynchronize(s2));
        ok(cuEventRecord(fresh, s2));
        ok(cuEventSynchronize(fresh));
        assert_eq!(cuEventElapsedTime(&mut ms, t0, fresh), err::INVALID_HANDLE);
        assert_eq!(cuEventCreate(&mut fresh, CU_EVENT_INTERPROCESS), err::INVALID_VALUE);
        ok(cuEventDestroy_v2(ev));
        assert_eq!(cuEventQuery(ev), err::INVALID_HANDLE);
        ok(cuEventDestroy_v2(t0));
        ok(cuEventDestroy_v2(fresh));
        for s in [s1, s2, s3] {
            ok(cuStreamDestroy_v2(s));
        }
        ok(cuMemFree_v2(p));
    }
}

/// Several threads allocate, queue work on their own streams, synchronise and free at once:
/// the shared tables and per-stream queues must stay consistent.
#[test]
fn threads_hammer_the_driver_concurrently() {
    let ctx = setup() as usize;
    let workers: Vec<_> = (0..4u32)
        .map(|t| {
            std::thread::spawn(move || {
                // SAFETY: handles from the API; buffers are live until freed at the end.
                unsafe {
                    ok(cuCtxSetCurrent(ctx as CUcontext));
                    let s = stream();
                    for i in 0..50u32 {
                        let p = alloc(8192 + (i as usize) * 64);
                        let v = t << 16 | i;
                        ok(cuMemsetD32Async(p, v, 2048, s));
                        ok(cuStreamWriteValue64_v2(s, p + 8, (v as u64) << 32, 0));
                        ok(cuStreamWaitValue32_v2(s, p + 12, v, CU_STREAM_WAIT_VALUE_EQ));
                        let mut out = [0u32; 4];
                        ok(cuMemcpyDtoHAsync_v2(out.as_mut_ptr() as *mut c_void, p, 16, s));
                        ok(cuStreamSynchronize(s));
                        assert_eq!(out, [v, v, 0, v]);
                        ok(cuMemFree_v2(p));
                    }
                    ok(cuStreamDestroy_v2(s));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
}
