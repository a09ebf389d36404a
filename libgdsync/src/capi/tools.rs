//! `gdsync/tools.h`: memory with a CPU mapping (GPU memory through gdrcopy, or registered host
//! memory), and the API 2.1 stream helpers the header declares under `GDS_ENABLE_LEGACY_API_2_1`.

use std::ffi::{c_int, c_void};

use gpudirect_common::Result;

use crate::abi::*;
use crate::capi::hooks::Gds;
use crate::capi::parse::*;
use crate::capi::post::{post, post_plain};
use crate::cuda::cuda;
use crate::engine::memmgr::memmgr;
use crate::engine::memops::{self, Desc};
use crate::engine::post_line::process_line;

gpudirect_common::export! {
    library = Gds;

    /// `int gds_alloc_mapped_memory(gds_mem_desc_t *, size_t size, int flags)`
    ///
    /// # Safety
    /// `desc` is NULL or writable.
    pub unsafe fn gds_alloc_mapped_memory(desc: *mut MemDesc, size: usize, flags: c_int) -> c_int {
        const F: &str = "gds_alloc_mapped_memory";
        if size == 0 {
            gds_warn!(F, "size is 0, nothing allocated");
            return Ok(());
        }
        // SAFETY: NULL or writable.
        let d = unsafe { desc.as_mut() }.ok_or_else(|| einval(F, "NULL descriptor"))?;
        let m = match flags & GDS_MEMORY_MASK {
            GDS_MEMORY_GPU => crate::engine::mapped::alloc_gpu(cuda()?, crate::cuda::gdr::gdr()?, size)?,
            GDS_MEMORY_HOST => crate::engine::mapped::alloc_host(cuda()?, memmgr(), size)?,
            t => return Err(einval(F, &format!("unsupported memory type {t:#x}"))),
        };
        *d = MemDesc {
            d_ptr: m.d_ptr,
            h_ptr: m.h_ptr as *mut c_void,
            bar_ptr: m.bar_ptr as *mut c_void,
            flags,
            alloc_size: m.alloc_size,
            mh: m.mh,
        };
        Ok(())
    }

    /// `int gds_free_mapped_memory(gds_mem_desc_t *)`
    ///
    /// # Safety
    /// `desc` is NULL or a descriptor filled by `gds_alloc_mapped_memory`.
    pub unsafe fn gds_free_mapped_memory(desc: *mut MemDesc) -> c_int {
        const F: &str = "gds_free_mapped_memory";
        // SAFETY: NULL or writable.
        let d = unsafe { desc.as_mut() }.ok_or_else(|| einval(F, "NULL descriptor"))?;
        match d.flags & GDS_MEMORY_MASK {
            GDS_MEMORY_GPU => {
                if d.d_ptr == 0 || d.h_ptr.is_null() || d.alloc_size == 0 || d.mh.h == 0 || d.bar_ptr.is_null() {
                    return Err(einval(F, "incomplete GPU descriptor"));
                }
                let m = crate::engine::mapped::Mapped {
                    d_ptr: d.d_ptr,
                    h_ptr: d.h_ptr as usize,
                    bar_ptr: d.bar_ptr as usize,
                    alloc_size: d.alloc_size,
                    mh: d.mh,
                };
                crate::engine::mapped::free_gpu(cuda()?, crate::cuda::gdr::gdr()?, &m)?;
                d.d_ptr = 0;
                d.h_ptr = std::ptr::null_mut();
                d.bar_ptr = std::ptr::null_mut();
                d.alloc_size = 0;
                d.mh = GdrMh::default();
                Ok(())
            }
            GDS_MEMORY_HOST => {
                if d.d_ptr == 0 || d.h_ptr.is_null() {
                    return Err(einval(F, "incomplete host descriptor"));
                }
                crate::engine::mapped::free_host(cuda().ok(), memmgr(), d.h_ptr as usize);
                d.h_ptr = std::ptr::null_mut();
                d.d_ptr = 0;
                d.alloc_size = 0;
                Ok(())
            }
            t => Err(einval(F, &format!("unsupported memory type {t:#x}"))),
        }
    }

    // ---------------------------------------------------------------------------------------------
    // API 2.1 stream helpers: upstream 2.2 removed them from its headers; ours declare them under
    // GDS_ENABLE_LEGACY_API_2_1, and the library still exports them for old binaries

    /// `int gds_stream_post_poll_dword(CUstream, uint32_t *ptr, uint32_t magic, gds_wait_cond_flag_t, int flags)`
    ///
    /// # Safety
    /// `stream` live or predefined.
    unguarded pub unsafe fn gds_stream_post_poll_dword(
        stream: CuStream,
        ptr: *mut u32,
        magic: u32,
        cond_flag: u32,
        flags: c_int,
    ) -> c_int {
        let v = memops::ValueDesc::Wait { ptr: ptr as usize, value: magic, cond: cond_flag, flags };
        post_plain(stream, std::iter::once(Some(v)))
            .unwrap_or_else(|| post_one_value("gds_stream_post_poll_dword", stream, v))
    }

    /// `int gds_stream_post_poke_dword(CUstream, uint32_t *ptr, uint32_t value, int flags)`
    ///
    /// # Safety
    /// `stream` live or predefined.
    unguarded pub unsafe fn gds_stream_post_poke_dword(
        stream: CuStream,
        ptr: *mut u32,
        value: u32,
        flags: c_int,
    ) -> c_int {
        let v = memops::ValueDesc::Write { ptr: ptr as usize, value, flags };
        post_plain(stream, std::iter::once(Some(v)))
            .unwrap_or_else(|| post_one_value("gds_stream_post_poke_dword", stream, v))
    }
}

/// One value descriptor's post under the guard (as `origin`), out of line so that the exports
/// keep no landing pad: the value path where the GPUs are alike, the general one otherwise (as
/// `gds_stream_post_descriptors` with one descriptor).
#[inline(never)]
fn post_one_value(origin: &'static str, stream: CuStream, v: memops::ValueDesc) -> c_int {
    gpudirect_common::guarded!(Gds, origin, -> c_int { post_one_value_in(stream, v) })
}

fn post_one_value_in(stream: CuStream, v: memops::ValueDesc) -> Result<()> {
    if let Some(line) = process_line()? {
        return memops::post_values(line, stream as usize, std::iter::once(v));
    }
    post(stream, vec![v.into()])
}

gpudirect_common::export! {
    library = Gds;

    /// `int gds_stream_post_inline_copy(CUstream, void *ptr, void *src, size_t nbytes, int flags)`
    ///
    /// # Safety
    /// `stream` live or predefined.
    pub unsafe fn gds_stream_post_inline_copy(
        stream: CuStream,
        ptr: *mut c_void,
        src: *mut c_void,
        nbytes: usize,
        flags: c_int,
    ) -> c_int {
        post(stream, vec![Desc::WriteMemory { dest: ptr as usize, src: src as usize, count: nbytes, flags }])
    }
}

/// Reads `n` elements of a C array, NULL allowed only when `n` is 0.
///
/// # Safety
/// `p` is NULL or points to `n` elements.
unsafe fn arr<'a, T>(origin: &str, p: *const T, n: usize) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(einval(origin, "NULL array"));
    }
    // SAFETY: non-NULL, `n` elements per the contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// # Safety
/// Each array is NULL or has `n_polls` elements.
unsafe fn poll_descs(
    origin: &str,
    n_polls: usize,
    ptrs: *const *mut u32,
    magics: *const u32,
    cond_flags: *const u32,
    poll_flags: *const c_int,
) -> Result<Vec<Desc>> {
    // SAFETY: forwarded contract (all four arrays).
    let (p, m, c, f) = unsafe {
        (
            arr(origin, ptrs, n_polls)?,
            arr(origin, magics, n_polls)?,
            arr(origin, cond_flags, n_polls)?,
            arr(origin, poll_flags, n_polls)?,
        )
    };
    Ok((0..n_polls).map(|i| Desc::WaitValue32 { ptr: p[i] as usize, value: m[i], cond: c[i], flags: f[i] }).collect())
}

gpudirect_common::export! {
    library = Gds;

    /// `int gds_stream_post_polls_and_pokes(CUstream, size_t n_polls, uint32_t *ptrs[], uint32_t magics[],
    /// gds_wait_cond_flag_t cond_flags[], int poll_flags[], size_t n_pokes, uint32_t *poke_ptrs[],
    /// uint32_t poke_values[], int poke_flags[])`
    ///
    /// # Safety
    /// Each array is NULL or has the length its count says; `stream` live or predefined.
    pub unsafe fn gds_stream_post_polls_and_pokes(
        stream: CuStream,
        n_polls: usize,
        ptrs: *mut *mut u32,
        magics: *mut u32,
        cond_flags: *mut u32,
        poll_flags: *mut c_int,
        n_pokes: usize,
        poke_ptrs: *mut *mut u32,
        poke_values: *mut u32,
        poke_flags: *mut c_int,
    ) -> c_int {
        const F: &str = "gds_stream_post_polls_and_pokes";
        // SAFETY: forwarded contract.
        let mut d = unsafe { poll_descs(F, n_polls, ptrs, magics, cond_flags, poll_flags) }?;
        // SAFETY: forwarded contract.
        let (p, v, f) =
            unsafe { (arr(F, poke_ptrs, n_pokes)?, arr(F, poke_values, n_pokes)?, arr(F, poke_flags, n_pokes)?) };
        d.extend((0..n_pokes).map(|i| Desc::WriteValue32 { ptr: p[i] as usize, value: v[i], flags: f[i] }));
        post(stream, d)
    }

    /// `int gds_stream_post_polls_and_immediate_copies(CUstream, size_t n_polls, uint32_t *ptrs[],
    /// uint32_t magics[], gds_wait_cond_flag_t cond_flags[], int poll_flags[], size_t n_imms,
    /// void *imm_ptrs[], void *imm_datas[], size_t imm_bytes[], int imm_flags[])`
    ///
    /// # Safety
    /// As `gds_stream_post_polls_and_pokes`.
    pub unsafe fn gds_stream_post_polls_and_immediate_copies(
        stream: CuStream,
        n_polls: usize,
        ptrs: *mut *mut u32,
        magics: *mut u32,
        cond_flags: *mut u32,
        poll_flags: *mut c_int,
        n_imms: usize,
        imm_ptrs: *mut *mut c_void,
        imm_datas: *mut *mut c_void,
        imm_bytes: *mut usize,
        imm_flags: *mut c_int,
    ) -> c_int {
        const F: &str = "gds_stream_post_polls_and_immediate_copies";
        // SAFETY: forwarded contract.
        let mut d = unsafe { poll_descs(F, n_polls, ptrs, magics, cond_flags, poll_flags) }?;
        // SAFETY: forwarded contract.
        let (p, s, b, f) = unsafe {
            (
                arr(F, imm_ptrs, n_imms)?,
                arr(F, imm_datas, n_imms)?,
                arr(F, imm_bytes, n_imms)?,
                arr(F, imm_flags, n_imms)?,
            )
        };
        d.extend((0..n_imms).map(|i| Desc::WriteMemory {
            dest: p[i] as usize,
            src: s[i] as usize,
            count: b[i],
            flags: f[i],
        }));
        post(stream, d)
    }
}
