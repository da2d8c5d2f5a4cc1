//! The packing buffers: a 64-byte-aligned f32 buffer that grows on demand, one pair per
//! thread, reused across calls so the steady state allocates nothing.
use crate::aligned::{alloc_advised, layout_for};
use std::alloc::{dealloc, handle_alloc_error, Layout};
use std::cell::RefCell;

/// A 64-byte-aligned f32 buffer that grows (never shrinks) on demand.
pub(super) struct AlignedBuf {
    pub(super) ptr: *mut f32,
    pub(super) cap: usize,
}

impl AlignedBuf {
    pub(super) const fn new() -> AlignedBuf {
        AlignedBuf {
            ptr: std::ptr::null_mut(),
            cap: 0,
        }
    }

    /// The crate's buffer layout (huge pages for large packed weights).
    fn layout(cap: usize) -> Layout {
        match cap.checked_mul(4).and_then(layout_for) {
            Some(l) => l,
            None => panic!("GEMM scratch of {cap} floats exceeds the address space"),
        }
    }

    /// A pointer to at least `len` floats (contents unspecified).
    pub(super) fn get(&mut self, len: usize) -> *mut f32 {
        if len > self.cap || self.ptr.is_null() {
            let cap = len.max(self.cap * 2).max(64);
            let layout = Self::layout(cap);
            // SAFETY: the layout has non-zero size.
            let p = unsafe { alloc_advised(layout, false) } as *mut f32;
            if p.is_null() {
                handle_alloc_error(layout);
            }
            self.free();
            self.ptr = p;
            self.cap = cap;
        }
        self.ptr
    }

    fn free(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: allocated by `get` with this layout.
            unsafe { dealloc(self.ptr as *mut u8, Self::layout(self.cap)) };
            self.ptr = std::ptr::null_mut();
            self.cap = 0;
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        self.free();
    }
}

thread_local! {
    /// This thread's A and B packing buffers.
    static SCRATCH: RefCell<(AlignedBuf, AlignedBuf)> =
        const { RefCell::new((AlignedBuf::new(), AlignedBuf::new())) };
}

/// Runs `f` with this thread's packing buffers (fresh ones if they are in use, e.g. a
/// re-entrant call from an activation; or if the thread is being torn down).
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut AlignedBuf, &mut AlignedBuf) -> R) -> R {
    let mut f = Some(f);
    let r = SCRATCH.try_with(|s| {
        s.try_borrow_mut().ok().map(|mut g| {
            let (a, b) = &mut *g;
            (f.take().expect("called once"))(a, b)
        })
    });
    match r {
        Ok(Some(r)) => r,
        _ => {
            let (mut a, mut b) = (AlignedBuf::new(), AlignedBuf::new());
            (f.take().expect("not yet called"))(&mut a, &mut b)
        }
    }
}
