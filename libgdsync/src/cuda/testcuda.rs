//! A scripted stand-in for libcuda used by the unit tests: records every batch and registration,
//! answers attribute queries from a table, and maps host address `a` to device address
//! `a + DEV_OFFSET` so tests can tell the two apart.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::Mutex;

use crate::abi::BatchMemOpParams;
use crate::cuda::*;

pub const DEV_OFFSET: u64 = 0x7000_0000_0000;

#[derive(Default)]
struct State {
    attrs: HashMap<i32, Result<i32, i32>>,
    streams: HashMap<usize, (usize, i32)>,
    ctx_devices: HashMap<usize, i32>,
    ctx_stack: Vec<usize>,
    batches: Vec<(usize, Vec<BatchMemOpParams>, u32)>,
    fail_batch_call: Option<(usize, i32)>,
    batch_calls: usize,
    registered: Vec<(usize, usize, u32)>,
    unregistered: Vec<usize>,
    register_result: Option<i32>,
    device_count: Option<i32>,
    stream_lookups: usize,
}

pub struct FakeCuda {
    s: Mutex<State>,
}

impl Default for FakeCuda {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeCuda {
    pub fn new() -> FakeCuda {
        let mut st = State::default();
        st.ctx_devices.insert(0xc1, 0);
        st.ctx_stack.push(0xc1);
        st.device_count = Some(1);
        FakeCuda { s: Mutex::new(st) }
    }
    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.s.lock().unwrap()
    }
    pub fn set_attr(&self, a: i32, v: i32) {
        self.st().attrs.insert(a, Ok(v));
    }
    pub fn fail_attr(&self, a: i32) {
        self.st().attrs.insert(a, Err(CUDA_ERROR_INVALID_VALUE));
    }
    /// Declares a user stream living in context `ctx` of device `dev`.
    pub fn stream_ctx(&self, stream: usize, ctx: usize, dev: i32) {
        let mut s = self.st();
        s.streams.insert(stream, (ctx, dev));
        s.ctx_devices.insert(ctx, dev);
    }
    pub fn ctx_depth(&self) -> usize {
        self.st().ctx_stack.len() - 1
    }
    pub fn batches(&self) -> Vec<(usize, Vec<BatchMemOpParams>, u32)> {
        self.st().batches.clone()
    }
    /// Makes the `n`-th batch call (0-based, counting from now) fail with `r`.
    pub fn fail_batch(&self, n: usize, r: i32) {
        let mut s = self.st();
        let base = s.batch_calls;
        s.fail_batch_call = Some((base + n, r));
    }
    pub fn registered(&self) -> Vec<(usize, usize, u32)> {
        self.st().registered.clone()
    }
    pub fn unregistered(&self) -> Vec<usize> {
        self.st().unregistered.clone()
    }
    /// `cuDeviceGetCount`'s answer (`None`: the call fails). Default 1.
    pub fn set_device_count(&self, n: Option<i32>) {
        self.st().device_count = n;
    }
    /// How many `cuStreamGetCtx` calls were made.
    pub fn stream_lookups(&self) -> usize {
        self.st().stream_lookups
    }
    pub fn set_register_result(&self, r: Option<i32>) {
        self.st().register_result = r;
    }
}

impl Cuda for FakeCuda {
    fn has_v2_memops(&self) -> bool {
        true
    }
    fn ctx_get_current(&self) -> CuRes<usize> {
        Ok(*self.st().ctx_stack.last().unwrap())
    }
    fn stream_get_ctx(&self, stream: usize) -> CuRes<usize> {
        let mut s = self.st();
        s.stream_lookups += 1;
        s.streams.get(&stream).map(|s| s.0).ok_or(400)
    }
    fn ctx_push(&self, ctx: usize) -> CuRes<()> {
        self.st().ctx_stack.push(ctx);
        Ok(())
    }
    fn ctx_pop(&self) -> CuRes<()> {
        let mut s = self.st();
        if s.ctx_stack.len() <= 1 {
            return Err(201);
        }
        s.ctx_stack.pop();
        Ok(())
    }
    fn ctx_get_device(&self) -> CuRes<i32> {
        let s = self.st();
        let c = *s.ctx_stack.last().unwrap();
        s.ctx_devices.get(&c).copied().ok_or(201)
    }
    fn device_count(&self) -> CuRes<i32> {
        self.st().device_count.ok_or(CUDA_ERROR_NOT_INITIALIZED)
    }
    fn device_get_attribute(&self, attr: i32, _dev: i32) -> CuRes<i32> {
        self.st().attrs.get(&attr).copied().unwrap_or(Ok(0))
    }
    fn batch_mem_op(&self, stream: usize, ops: &mut [BatchMemOpParams], flags: u32) -> CuRes<()> {
        let mut s = self.st();
        let call = s.batch_calls;
        s.batch_calls += 1;
        if let Some((_, r)) = s.fail_batch_call.filter(|&(n, _)| n == call) {
            return Err(r);
        }
        // Like the driver, an unknown stream handle is refused (CUDA_ERROR_INVALID_HANDLE).
        if !is_predefined_stream(stream) && !s.streams.contains_key(&stream) {
            return Err(400);
        }
        if ops.len() > 255 {
            return Err(CUDA_ERROR_INVALID_VALUE); // the driver's documented limit
        }
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // The v2 entry points reject writes without a memory barrier, as the real driver does.
        if ops.iter().any(|p| matches!(p.operation, 2 | 5) && p.flags & 1 != 0) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !ops.is_empty() {
            s.batches.push((stream, ops.to_vec(), flags));
        }
        Ok(())
    }
    fn mem_host_register(&self, addr: usize, len: usize, flags: u32) -> CuRes<()> {
        let mut s = self.st();
        s.registered.push((addr, len, flags));
        match s.register_result {
            Some(r) => Err(r),
            None => Ok(()),
        }
    }
    fn mem_host_unregister(&self, addr: usize) -> CuRes<()> {
        self.st().unregistered.push(addr);
        Ok(())
    }
    fn mem_host_get_device_pointer(&self, addr: usize) -> CuRes<u64> {
        Ok(addr as u64 + DEV_OFFSET)
    }
    fn mem_alloc(&self, _size: usize) -> CuRes<u64> {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    fn mem_free(&self, _dptr: u64) -> CuRes<()> {
        Ok(())
    }
    fn pointer_set_sync_memops(&self, _dptr: u64) -> CuRes<()> {
        Ok(())
    }
    fn error_string(&self, r: i32) -> String {
        format!("fake error {r}")
    }
}
