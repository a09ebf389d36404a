//! Per-GPU capability detection ("peers", spec §4.1): which stream memory operations the device
//! supports, combined with the environment overrides, cached per device ordinal.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use gpudirect_common::{Errno, Result};

use crate::abi::CU_STREAM_BATCH_MEM_OP_RELAXED_ORDERING;
use crate::cuda::*;
use crate::env::Settings;

/// What the device (and the environment) allow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caps {
    pub device: i32,
    pub has_memops: bool,
    pub has_remote_flush: bool,
    pub has_write64: bool,
    pub has_wait_nor: bool,
    /// `CU_STREAM_MEM_OP_WRITE_MEMORY` (never released in public CUDA): always false.
    pub has_inlcpy: bool,
    /// Upstream's extended `MEMORY_BARRIER` memop (never released in public CUDA): always false.
    pub has_membar: bool,
    pub has_weak: bool,
    /// `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER` is accepted: only by the v1 entry points. The v2
    /// ones (CUDA >= 11.7, the only ones usable without `NVreg_EnableStreamMemOPs=1`) reject it
    /// with `CUDA_ERROR_INVALID_VALUE`, so writes then always carry the barrier (stronger ordering).
    pub write_no_barrier: bool,
}

fn attr(cuda: &dyn Cuda, dev: i32, primary: i32, fallback: Option<i32>) -> bool {
    match cuda.device_get_attribute(primary, dev) {
        Ok(v) => v != 0,
        Err(_) => fallback.map(|a| cuda.device_get_attribute(a, dev).map(|v| v != 0).unwrap_or(false)).unwrap_or(false),
    }
}

/// Probes device `dev` (spec §4.1 table).
pub fn detect(cuda: &dyn Cuda, dev: i32, env: &Settings) -> Caps {
    const F: &str = "gds_register_peer";
    let has_memops = cuda.has_v2_memops() || attr(cuda, dev, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, None);
    if !has_memops {
        gds_err!(
            F,
            "GPU {dev}: CUDA stream memory operations are not supported or not enabled (NVreg_EnableStreamMemOPs=1)"
        );
    }
    let has_write64 = attr(
        cuda,
        dev,
        CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
        Some(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1),
    ) && !env.disable_write64;
    let has_wait_nor = attr(
        cuda,
        dev,
        CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR,
        Some(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1),
    ) && !env.disable_wait_nor;
    let has_remote_flush =
        attr(cuda, dev, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, None) && !env.disable_remote_flush;
    // Relaxed ordering is only worth a probe when the user asked for it (it is off by default).
    let has_weak = !env.disable_weak_consistency
        && has_memops
        && cuda.batch_mem_op(0, &mut [], 0).is_ok()
        && cuda.batch_mem_op(0, &mut [], CU_STREAM_BATCH_MEM_OP_RELAXED_ORDERING).is_ok();
    let caps = Caps {
        device: dev,
        has_memops,
        has_remote_flush,
        has_write64,
        has_wait_nor,
        has_inlcpy: false,
        has_membar: false,
        has_weak,
        write_no_barrier: !cuda.has_v2_memops(),
    };
    gds_dbg!(F, "GPU {dev}: {caps:?}");
    caps
}

/// The device ordinal a stream belongs to (spec §4.1 `peer_from_stream`).
pub fn device_of_stream(cuda: &dyn Cuda, stream: usize) -> Result<i32> {
    const F: &str = "gds_peer_from_stream";
    let fail = |what: &str, r: i32| {
        gds_err!(F, "{what} failed: {} ({r})", cuda.error_string(r));
        Errno::EINVAL
    };
    if is_predefined_stream(stream) {
        return cuda.ctx_get_device().map_err(|r| fail("cuCtxGetDevice (no current CUDA context?)", r));
    }
    let current = cuda.ctx_get_current().map_err(|r| fail("cuCtxGetCurrent", r))?;
    let ctx = match cuda.stream_get_ctx(stream) {
        Ok(c) => c,
        Err(CUDA_ERROR_NOT_SUPPORTED) => current, // old driver: assume the current context
        Err(r) => return Err(fail("cuStreamGetCtx", r)),
    };
    if ctx == current {
        return cuda.ctx_get_device().map_err(|r| fail("cuCtxGetDevice", r));
    }
    cuda.ctx_push(ctx).map_err(|r| fail("cuCtxPushCurrent", r))?;
    let dev = cuda.ctx_get_device().map_err(|r| fail("cuCtxGetDevice", r));
    if let Err(r) = cuda.ctx_pop() {
        gds_err!(F, "cuCtxPopCurrent failed: {r}");
    }
    dev
}

/// Capabilities per device ordinal, probed once each.
#[derive(Default)]
pub struct Peers {
    map: Mutex<HashMap<i32, Caps>>,
    /// Decided once, on the first stream submission: see [`Peers::uniform`].
    uniform: OnceLock<Option<Caps>>,
}

impl Peers {
    /// The capabilities, when every GPU of the process has the same ones (one GPU, or a node of
    /// identical GPUs under one driver: the usual case). Then which device a stream belongs to
    /// cannot change what is emitted, and the per-call stream → context → device resolution
    /// (three driver calls and a lock) is skipped; `device` is the first ordinal's. `None` when
    /// the GPUs differ or cannot be counted: every call resolves its stream, as upstream.
    ///
    /// Capabilities are fixed for the life of the process (device attributes and the
    /// environment are read once), so deciding this once is exact, not a heuristic.
    pub fn uniform(&self, cuda: &dyn Cuda, env: &Settings) -> Option<Caps> {
        *self.uniform.get_or_init(|| {
            let n = cuda.device_count().ok().filter(|&n| n > 0)?;
            let first = self.caps(cuda, env, 0);
            let same = (1..n).all(|d| Caps { device: 0, ..self.caps(cuda, env, d) } == first);
            gds_dbg!("gds_register_peer", "{n} GPU(s), capabilities {}", if same { "uniform" } else { "differ" });
            same.then_some(first)
        })
    }

    pub fn caps(&self, cuda: &dyn Cuda, env: &Settings, dev: i32) -> Caps {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry(dev).or_insert_with(|| detect(cuda, dev, env))
    }

    pub fn from_stream(&self, cuda: &dyn Cuda, env: &Settings, stream: usize) -> Result<Caps> {
        let dev = device_of_stream(cuda, stream)?;
        Ok(self.caps(cuda, env, dev))
    }
}

/// The process-wide peer table.
pub fn peers() -> &'static Peers {
    static P: OnceLock<Peers> = OnceLock::new();
    P.get_or_init(Peers::default)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testcuda::FakeCuda;

    #[test]
    fn env_overrides_device_attributes() {
        let cuda = FakeCuda::new();
        cuda.set_attr(122, 1);
        cuda.set_attr(123, 1);
        cuda.set_attr(98, 1);
        let c = detect(&cuda, 0, &Settings::default());
        assert!(c.has_memops && c.has_write64 && c.has_remote_flush);
        assert!(!c.has_wait_nor, "NOR stays off by default");
        let env = Settings::from_lookup(|n| match n {
            "GDS_DISABLE_WAIT_NOR" => Some("0".into()),
            "GDS_DISABLE_WRITE64" => Some("1".into()),
            "GDS_DISABLE_REMOTE_FLUSH" => Some("1".into()),
            _ => None,
        });
        let c = detect(&cuda, 0, &env);
        assert!(c.has_wait_nor && !c.has_write64 && !c.has_remote_flush);
    }

    #[test]
    fn old_attribute_numbers_are_the_fallback() {
        let cuda = FakeCuda::new();
        cuda.fail_attr(122);
        cuda.set_attr(93, 1);
        assert!(detect(&cuda, 0, &Settings::default()).has_write64);
        cuda.set_attr(93, 0);
        assert!(!detect(&cuda, 0, &Settings::default()).has_write64);
    }

    #[test]
    fn uniform_caps_only_when_every_gpu_agrees() {
        let env = Settings::default();
        let cuda = FakeCuda::new();
        cuda.set_attr(122, 1);
        cuda.set_device_count(Some(4));
        let p = Peers::default();
        let u = p.uniform(&cuda, &env).expect("four identical GPUs");
        assert!(u.has_write64 && u.device == 0);
        // The decision is made once and kept (capabilities cannot change later).
        cuda.set_attr(122, 0);
        assert_eq!(p.uniform(&cuda, &env), Some(u));
        // GPUs that differ (device 1 already probed with 64-bit memops, device 0 without): no shortcut.
        let cuda = FakeCuda::new();
        cuda.set_device_count(Some(2));
        let p = Peers::default();
        p.map.lock().unwrap().insert(1, Caps { device: 1, has_write64: true, ..detect(&cuda, 1, &env) });
        assert_eq!(p.uniform(&cuda, &env), None);
        // The count cannot be read: no shortcut.
        let cuda = FakeCuda::new();
        cuda.set_device_count(None);
        assert_eq!(Peers::default().uniform(&cuda, &env), None);
    }

    #[test]
    fn stream_in_another_context_is_resolved_with_push_pop() {
        let cuda = FakeCuda::new();
        cuda.stream_ctx(0x1000, 0xc2, 3);
        assert_eq!(device_of_stream(&cuda, 0x1000).unwrap(), 3);
        assert_eq!(cuda.ctx_depth(), 0, "push and pop balance");
        assert_eq!(device_of_stream(&cuda, 0).unwrap(), 0, "predefined stream: current context");
        assert_eq!(device_of_stream(&cuda, 0x2000), Err(Errno::EINVAL), "unknown stream");
    }
}
