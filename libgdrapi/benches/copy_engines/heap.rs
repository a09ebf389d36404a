//! Ordinary page-aligned host buffers.

/// Ordinary page-aligned heap memory, freed on drop.
pub(crate) struct Heap {
    pub(crate) p: *mut u8,
    pub(crate) layout: std::alloc::Layout,
}

impl Heap {
    pub(crate) fn new(len: usize) -> Heap {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        assert!(!p.is_null(), "out of memory");
        // SAFETY: p is valid for layout.size() bytes; touch every page so first-touch faults are
        // not timed.
        unsafe { std::ptr::write_bytes(p, 0x5a, layout.size()) };
        Heap { p, layout }
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.p, self.layout) }
    }
}
