//! End to end against /dev/gdrdrv and the simulated GPU: pin, map, copy, unmap, unpin, through
//! the C ABI and the safe API. Data written through a gdr mapping must be what the GPU's own view
//! (/dev/gpusim) reads, and the other way round, for many sizes and offsets.

mod common;

use std::ffi::c_void;

use common::*;
use gdrapi::abi::*;

const EINVAL: i32 = libc::EINVAL;

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn info_reports_rounded_ranges() {
    if !devices("info_reports_rounded_ranges") {
        return;
    }
    let sim = GpuSim::open();
    let mem = sim.alloc(8 * GPU_PAGE);
    let g = open();
    // (offset into the allocation, size) → expected (va offset, mapped_size)
    let cases = [
        (0, GPU_PAGE, 0, GPU_PAGE),
        (0, 1, 0, GPU_PAGE),
        (0, GPU_PAGE + 1, 0, 2 * GPU_PAGE),
        (0, 8 * GPU_PAGE, 0, 8 * GPU_PAGE),
        (4096, 100, 0, GPU_PAGE),
        (GPU_PAGE - 8, 16, 0, 2 * GPU_PAGE),
        (3 * GPU_PAGE + 17, 2 * GPU_PAGE, 3 * GPU_PAGE, 3 * GPU_PAGE),
    ];
    for (off, size, va_off, mapped) in cases {
        let h = pin(g, mem.va + off as u64, size).unwrap_or_else(|e| panic!("pin +{off:#x} {size:#x}: {e}"));
        assert_ne!(h.h, 0, "a successful pin never yields h == 0");
        let i = info(g, h).unwrap();
        assert_eq!(i.va, mem.va + va_off as u64, "va for +{off:#x}/{size:#x}");
        assert_eq!(i.mapped_size, mapped as u64, "mapped_size for +{off:#x}/{size:#x}");
        assert_eq!(i.page_size, 65536);
        assert_eq!(i.flag_bits & (INFO_BIT_MAPPED | INFO_BIT_WC), 0, "not mapped yet");
        assert_eq!(i.mapping_type, MappingType::None as u32);
        #[cfg(target_arch = "x86_64")]
        assert!(i.cycles_per_ms > 0, "cycles_per_ms is the driver's tsc_khz on x86");
        // Only 64 KiB-aligned pins can be mapped.
        if off % GPU_PAGE != 0 {
            assert_eq!(map(g, h, 4096, 0).err(), Some(EINVAL), "unaligned pin must not map");
        }
        assert_eq!(capi::gdr_unpin_buffer(g, h), 0);
    }
    // The legacy symbol fills exactly 40 bytes.
    let h = pin(g, mem.va, 2 * GPU_PAGE).unwrap();
    // 48 bytes, aligned like the struct: the library writes through a GdrInfoV1 pointer.
    #[repr(C, align(8))]
    struct Raw([u8; 48]);
    let mut raw = Raw([0xee; 48]);
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_get_info(g, h, (&raw mut raw).cast()) }, 0);
    let raw_bytes = |r: &Raw| r.0;
    let b = raw_bytes(&raw);
    assert!(b[40..].iter().all(|&x| x == 0xee), "gdr_get_info wrote past 40 bytes");
    assert_eq!(u64::from_ne_bytes(b[0..8].try_into().unwrap()), mem.va);
    assert_eq!(u64::from_ne_bytes(b[8..16].try_into().unwrap()), 2 * GPU_PAGE as u64);
    assert_eq!(b[36] & 3, 0, "v1 bits: not mapped");
    let va = map(g, h, 2 * GPU_PAGE, 0).unwrap();
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_get_info(g, h, (&raw mut raw).cast()) }, 0);
    assert_eq!(raw_bytes(&raw)[36] & 3, 3, "v1 bits: mapped, write-combined");
    // Foreign bits of the bit-field unit are preserved, as upstream (it assigns only two bits).
    let mut i = GdrInfoV2 { flag_bits: 0xf0, ..Default::default() };
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_get_info_v2(g, h, &mut i) }, 0);
    assert_eq!(i.flag_bits, 0xf3);
    assert_eq!(i.mapping_type, MappingType::WriteCombined as u32);
    assert_eq!(capi::gdr_unmap(g, h, va.cast(), 2 * GPU_PAGE), 0);
    assert_eq!(capi::gdr_close(g), 0);
}

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn mapping_types_on_this_platform() {
    if !devices("mapping_types_on_this_platform") {
        return;
    }
    let sim = GpuSim::open();
    let mem = sim.alloc(GPU_PAGE);
    let g = open();
    let h = pin(g, mem.va, GPU_PAGE).unwrap();
    for bad in [4, -1, 1000] {
        assert_eq!(map(g, h, GPU_PAGE, bad).err(), Some(EINVAL), "flags {bad}");
    }
    if cfg!(target_arch = "x86_64") {
        // x86 CPUs cannot cache GPU BAR mappings, and device mappings are arm64-only.
        assert_eq!(map(g, h, GPU_PAGE, GDR_MAP_FLAG_REQ_CACHE_MAPPING).err(), Some(libc::EOPNOTSUPP));
        assert_eq!(map(g, h, GPU_PAGE, GDR_MAP_FLAG_REQ_DEVICE_MAPPING).err(), Some(libc::EOPNOTSUPP));
    }
    // The default after a refused request is WC again (DEFAULT resets the request).
    for flags in [GDR_MAP_FLAG_DEFAULT, GDR_MAP_FLAG_REQ_WC_MAPPING] {
        let va = map(g, h, GPU_PAGE, flags).unwrap();
        let i = info(g, h).unwrap();
        if cfg!(target_arch = "x86_64") {
            assert_eq!(i.mapping_type, MappingType::WriteCombined as u32, "flags {flags}");
            assert_eq!(i.flag_bits & 3, 3);
        }
        // A second mapping of the same handle is refused.
        assert_eq!(map(g, h, GPU_PAGE, flags).err(), Some(libc::EAGAIN));
        assert_eq!(capi::gdr_unmap(g, h, va.cast(), GPU_PAGE), 0);
        assert_eq!(capi::gdr_unmap(g, h, va.cast(), GPU_PAGE), EINVAL, "double unmap");
    }
    // More than was pinned cannot be mapped.
    assert_eq!(map(g, h, 2 * GPU_PAGE, 0).err(), Some(EINVAL));
    // Force-PCIe pins work exactly when the driver says it supports them.
    let force = attribute(g, GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE).unwrap();
    let mut hf = GdrMh { h: 0 };
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    let rc = unsafe { capi::gdr_pin_buffer_v2(g, mem.va as _, GPU_PAGE, GDR_PIN_FLAG_FORCE_PCIE, &mut hf) };
    assert_eq!(rc, if force != 0 { 0 } else { EINVAL }, "FORCE_PCIE with attribute {force}");
    if rc == 0 {
        let va = map(g, hf, GPU_PAGE, 0).unwrap();
        assert_eq!(info(g, hf).unwrap().mapping_type, MappingType::WriteCombined as u32, "force-PCIe is never cached");
        unmap_unpin(g, hf, va, GPU_PAGE);
    }
    assert_eq!(capi::gdr_unpin_buffer(g, h), 0);
    assert_eq!(capi::gdr_close(g), 0);
}

/// Copies in both directions at many sizes and offsets, checked against the GPU's own view,
/// with poison around the target range on both sides.
#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn copies_match_the_gpu_view_at_many_sizes_and_offsets() {
    if !devices("copies_match_the_gpu_view_at_many_sizes_and_offsets") {
        return;
    }
    let size = 16 * GPU_PAGE;
    let sim = GpuSim::open();
    let mem = sim.alloc(size);
    let g = open();
    let (h, va) = pin_map(g, mem.va, size);
    let mut rng = Rng::new(0x6764_7261_7069);
    let sizes = [
        1usize, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 1000, 4095, 4096, 4097,
        65535, 65536, 65537, 200_001, size,
    ];
    let offsets = [0usize, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 4095, 4096, 65535, 65536];
    let mut cases = Vec::new();
    for &n in &sizes {
        for &off in &offsets {
            if off + n <= size {
                cases.push((off, n));
            }
        }
    }
    for _ in 0..200 {
        let n = 1 + rng.below(3 * GPU_PAGE);
        cases.push((rng.below(size - n + 1), n));
    }
    for (off, n) in cases {
        // host → GPU, with poison on the bytes around the target range
        let lo = off.saturating_sub(1);
        let hi = (off + n + 1).min(size);
        mem.write(lo, &vec![0xa5; hi - lo]);
        let data = rng.bytes(n);
        let host_off = rng.below(64);
        let mut src = vec![0u8; n + 64];
        src[host_off..host_off + n].copy_from_slice(&data);
        // SAFETY: off + n <= size, so the pointer stays inside the mapping.
        let dst = unsafe { va.add(off) };
        assert_eq!(copy_to(h, dst, &src[host_off..host_off + n]), 0, "copy_to +{off} {n}");
        assert_eq!(mem.read(off, n), data, "GPU view after copy_to +{off} {n}");
        if off > 0 {
            assert_eq!(mem.read(off - 1, 1), [0xa5], "byte before +{off} {n} clobbered");
        }
        if off + n < size {
            assert_eq!(mem.read(off + n, 1), [0xa5], "byte after +{off} {n} clobbered");
        }
        // GPU → host
        let data = rng.bytes(n);
        mem.write(off, &data);
        let mut dst_host = vec![0x5au8; n + 128];
        let ho = rng.below(64);
        assert_eq!(copy_from(h, &mut dst_host[ho..ho + n], dst), 0, "copy_from +{off} {n}");
        assert_eq!(&dst_host[ho..ho + n], &data[..], "copy_from +{off} {n}");
        assert!(dst_host[..ho].iter().all(|&b| b == 0x5a), "host bytes before the copy clobbered");
        assert!(dst_host[ho + n..].iter().all(|&b| b == 0x5a), "host bytes after the copy clobbered");
    }
    // Plain CPU stores through the mapping reach the GPU too.
    for i in 0..1000usize {
        let off = (i * 4099) % (size - 4);
        // SAFETY: inside the mapping; a 4-byte volatile store to device memory.
        unsafe { std::ptr::write_volatile(va.add(off & !3).cast::<u32>(), i as u32) };
        assert_eq!(mem.read(off & !3, 4), (i as u32).to_ne_bytes());
    }
    // Copies never leave the mapping.
    let buf = [0u8; 32];
    // SAFETY: size - 16 is inside the mapping; the library refuses the copy before touching it.
    assert_eq!(copy_to(h, unsafe { va.add(size - 16) }, &buf), EINVAL);
    assert_eq!(copy_to(h, va.wrapping_sub(1), &buf[..1]), EINVAL);
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_copy_to_mapping(h, va.cast(), std::ptr::null(), 8) }, EINVAL);
    assert_eq!(copy_to(h, va, &[]), 0, "size 0 is a no-op");
    // Unmap needs the mapping's own address and size; copies after it are refused.
    assert_eq!(capi::gdr_unmap(g, h, va.wrapping_add(4096).cast(), size - 4096), EINVAL);
    assert_eq!(capi::gdr_unmap(g, h, va.cast(), size + GPU_PAGE), EINVAL);
    assert_eq!(capi::gdr_unmap(g, h, va.cast(), size - 1), 0, "sizes round up to host pages");
    assert_eq!(copy_to(h, va, &buf), EINVAL);
    assert_eq!(capi::gdr_unpin_buffer(g, h), 0);
    assert_eq!(capi::gdr_close(g), 0);
}

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn partial_and_repeated_mappings() {
    if !devices("partial_and_repeated_mappings") {
        return;
    }
    let sim = GpuSim::open();
    let mem = sim.alloc(4 * GPU_PAGE);
    mem.fill(0);
    let g = open();
    let h = pin(g, mem.va, 4 * GPU_PAGE).unwrap();
    for (round, len) in [8usize, 4096, 4097, GPU_PAGE, 3 * GPU_PAGE + 5, 4 * GPU_PAGE].into_iter().enumerate() {
        let va = map(g, h, len, 0).unwrap();
        let data = vec![round as u8 + 1; len];
        assert_eq!(copy_to(h, va, &data), 0);
        assert_eq!(mem.read(0, len), data, "mapping of {len} bytes starts at the pinned address");
        assert_eq!(capi::gdr_unmap(g, h, va.cast(), len), 0);
    }
    // Two pins of the same memory, mapped at once, see each other's writes.
    let h2 = pin(g, mem.va, 4 * GPU_PAGE).unwrap();
    assert_ne!(h.h, h2.h);
    let a = map(g, h, 4 * GPU_PAGE, 0).unwrap();
    let b = map(g, h2, 4 * GPU_PAGE, 0).unwrap();
    assert_eq!(copy_to(h, a, b"through a"), 0);
    let mut back = [0u8; 9];
    assert_eq!(copy_from(h2, &mut back, b), 0);
    assert_eq!(&back, b"through a");
    // A copy through one handle's mapping with the other handle is outside that handle's mapping.
    assert_eq!(copy_to(h2, a, b"x"), EINVAL);
    // Stale handle after unpin (while mapped: the kernel zaps the pages).
    assert_eq!(capi::gdr_unpin_buffer(g, h2), 0);
    assert_eq!(capi::gdr_unpin_buffer(g, h2), EINVAL);
    assert_eq!(info(g, h2).err(), Some(EINVAL));
    assert_eq!(copy_from(h2, &mut back, b), EINVAL);
    assert_eq!(capi::gdr_unmap(g, h2, b.cast(), 4 * GPU_PAGE), EINVAL);
    // SAFETY: the user still owns the VMA of a mapping whose handle was unpinned.
    unsafe { libc::munmap(b.cast::<c_void>(), 4 * GPU_PAGE) };
    unmap_unpin(g, h, a, 4 * GPU_PAGE);
    assert_eq!(capi::gdr_close(g), 0);
}

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn foreign_and_closed_instances() {
    if !devices("foreign_and_closed_instances") {
        return;
    }
    let sim = GpuSim::open();
    let mem = sim.alloc(GPU_PAGE);
    let g1 = open();
    let g2 = open();
    let (h, va) = pin_map(g1, mem.va, GPU_PAGE);
    // h belongs to g1.
    assert_eq!(info(g2, h).err(), Some(EINVAL));
    assert_eq!(callback_flag(g2, h), Err(EINVAL));
    assert_eq!(map(g2, h, GPU_PAGE, 0).err(), Some(EINVAL));
    assert_eq!(capi::gdr_unmap(g2, h, va.cast(), GPU_PAGE), EINVAL);
    assert_eq!(capi::gdr_unpin_buffer(g2, h), EINVAL);
    assert_eq!(callback_flag(g1, h), Ok(0));
    // Close with a live pin and mapping: both released; g1 and h become stale.
    assert_eq!(capi::gdr_close(g1), 0);
    assert_eq!(info(g1, h).err(), Some(EINVAL));
    assert_eq!(copy_to(h, va, b"x"), EINVAL);
    assert_eq!(capi::gdr_close(g1), EINVAL);
    // SAFETY: the VMA outlives gdr_close (upstream behaviour); the user unmaps it.
    unsafe { libc::munmap(va.cast::<c_void>(), GPU_PAGE) };
    // g2 is unaffected and can pin the same memory.
    let h2 = pin(g2, mem.va, GPU_PAGE).unwrap();
    assert_eq!(capi::gdr_unpin_buffer(g2, h2), 0);
    assert_eq!(capi::gdr_close(g2), 0);
}

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn safe_api_round_trip_and_raii() {
    if !devices("safe_api_round_trip_and_raii") {
        return;
    }
    let sim = GpuSim::open();
    let mem = sim.alloc(4 * GPU_PAGE);
    let gdr = gdrapi::Gdr::open().expect("Gdr::open");
    assert_eq!(gdrapi::Gdr::runtime_version(), (2, 6));
    assert_eq!(gdr.driver_version().unwrap(), (2, 6));
    assert_eq!(gdr.attribute(gdrapi::Attribute::UsingDmaBufMmap).unwrap(), 0);
    {
        let buf = gdr.pin(mem.va, 4 * GPU_PAGE as u64).unwrap();
        let facts = buf.info().unwrap();
        assert_eq!((facts.va, facts.mapped_size, facts.page_size), (mem.va, 4 * GPU_PAGE as u64, 65536));
        assert!(!buf.invalidated().unwrap());
        let mut m = buf.map().unwrap();
        assert_eq!(m.len(), 4 * GPU_PAGE);
        if cfg!(target_arch = "x86_64") {
            assert_eq!(m.mapping_type(), gdrapi::MappingType::WriteCombined);
        }
        let mut rng = Rng::new(7);
        for _ in 0..50 {
            let n = 1 + rng.below(GPU_PAGE);
            let off = rng.below(4 * GPU_PAGE - n);
            let data = rng.bytes(n);
            m.write(off, &data).unwrap();
            assert_eq!(mem.read(off, n), data);
            let mut back = vec![0u8; n];
            m.read(off, &mut back).unwrap();
            assert_eq!(back, data);
        }
        assert_eq!(m.write(4 * GPU_PAGE - 1, b"ab").err(), Some(gdrapi::Errno::EINVAL));
        assert_eq!(m.read(usize::MAX, &mut [0u8; 1]).err(), Some(gdrapi::Errno::EINVAL));
        assert_eq!(buf.map_as(GPU_PAGE, 0).err(), Some(gdrapi::Errno::EAGAIN), "one mapping per pin");
        drop(m);
        assert_eq!(buf.info().unwrap().mapping_type, gdrapi::MappingType::None, "dropping the Mapping unmaps");
        let _m2 = buf.map_as(8, GDR_MAP_FLAG_REQ_WC_MAPPING).unwrap();
        // Dropping the buffer with a live mapping: the Mapping borrows the buffer, so it goes first.
    }
    // Everything was unpinned: the allocation can be pinned and mapped again from scratch.
    let buf = gdr.pin(mem.va, GPU_PAGE as u64).unwrap();
    let m = buf.map().unwrap();
    drop(m);
    drop(buf);
    drop(gdr);
}

/// Two 8-byte pins inside one GPU page: both pin, only the aligned one maps (upstream sanity
/// `basic_small_buffers_mapping`, regression for upstream issue 244).
#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn small_buffers_in_one_page() {
    if !devices("small_buffers_in_one_page") {
        return;
    }
    let sim = GpuSim::open();
    let mem = sim.alloc(GPU_PAGE);
    let g = open();
    let h1 = pin(g, mem.va, 8).unwrap();
    let h2 = pin(g, mem.va + 8, 8).unwrap();
    assert_ne!(h1.h, h2.h);
    let va = map(g, h1, 8, 0).unwrap();
    assert_eq!(map(g, h2, 8, 0).err(), Some(EINVAL));
    assert_eq!(copy_to(h1, va, &[9u8; 8]), 0);
    assert_eq!(mem.read(0, 8), [9u8; 8]);
    unmap_unpin(g, h1, va, 8);
    assert_eq!(capi::gdr_unpin_buffer(g, h2), 0);
    assert_eq!(capi::gdr_close(g), 0);
}
