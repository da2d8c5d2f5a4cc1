//! Heap memory aligned for vector loads: the one buffer type behind arenas, packed
//! constants, variables and C-owned tensors. Allocation is fallible, so running out of
//! memory is an error for the caller to report, never an abort of the host process.
//!
//! Large buffers are aligned to 2 MiB and, on Linux, advised to use transparent huge
//! pages before their first touch: a kernel streaming a 16 MiB weight matrix through
//! 4 KiB pages misses the TLB on every page (a 1024×4096×1024 GEMM ran ~15 % faster on
//! huge pages, on a host whose THP mode is `madvise`).
use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};
use std::fmt;
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// The alignment of every [`AlignedBuf`]: a cache line, and one AVX-512 vector.
pub const ALIGN: usize = 64;

/// A huge page (x86-64 and AArch64 with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// Buffers from this size on get huge pages: rounding up to whole huge pages then
/// wastes at most a third.
const HUGE_MIN: usize = 2 * HUGE_PAGE;

/// The layout for `len` bytes: [`ALIGN`]-aligned and padded to whole `ALIGN` blocks (at
/// least one), or whole huge pages from [`HUGE_MIN`] on. None past the address space.
pub(crate) fn layout_for(len: usize) -> Option<Layout> {
    let (size, align) = if len >= HUGE_MIN {
        (len.checked_next_multiple_of(HUGE_PAGE)?, HUGE_PAGE)
    } else {
        (len.max(1).checked_next_multiple_of(ALIGN)?, ALIGN)
    };
    Layout::from_size_align(size, align).ok()
}

/// Allocates `layout` (from [`layout_for`]), zeroed if `zeroed`: huge-page layouts are
/// advised to use huge pages before anything touches them. Null when out of memory.
///
/// # Safety
/// As for [`std::alloc::alloc`]: the layout's size is non-zero.
pub(crate) unsafe fn alloc_advised(layout: Layout, zeroed: bool) -> *mut u8 {
    if layout.align() < HUGE_PAGE {
        return if zeroed {
            // SAFETY: `layout` has a non-zero size (this function's contract).
            unsafe { alloc_zeroed(layout) }
        } else {
            // SAFETY: `layout` has a non-zero size, as `alloc` asks (the contract).
            unsafe { alloc(layout) }
        };
    }
    // SAFETY: a huge-page layout is at least `HUGE_MIN` bytes, and never zero-sized.
    let p = unsafe { alloc(layout) };
    if !p.is_null() {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: only advice, on the `layout.size()` bytes just allocated at `p`;
            // where THP is off or unsupported this fails harmlessly.
            unsafe { libc::madvise(p.cast(), layout.size(), libc::MADV_HUGEPAGE) };
        }
        if zeroed {
            // SAFETY: `p` is a live allocation of `layout.size()` bytes, all writable.
            unsafe { std::ptr::write_bytes(p, 0, layout.size()) };
        }
    }
    p
}

/// Out of memory (or a size beyond the address space): an error the caller reports.
fn cannot_allocate(len: usize) -> Error {
    Error::Runtime(format!("cannot allocate {len} bytes"))
}

/// `len` zero-initialised bytes aligned to [`ALIGN`]. The allocation is padded to a
/// whole number of `ALIGN` blocks (at least one, so the pointer is never dangling), and
/// the padding is zeroed too: a vector load that starts inside the buffer stays inside
/// the allocation.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer owns its memory exclusively, like a `Vec<u8>`; shared access only
// hands out `&[u8]` or raw pointers whose use the caller must synchronise.
unsafe impl Send for AlignedBuf {}
// SAFETY: as for Send: `&AlignedBuf` allows only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zeroed bytes.
    pub fn try_zeroed(len: usize) -> Result<AlignedBuf> {
        let failed = || cannot_allocate(len);
        let layout = layout_for(len).ok_or_else(failed)?;
        // SAFETY: the layout's size is non-zero.
        let ptr = NonNull::new(unsafe { alloc_advised(layout, true) }).ok_or_else(failed)?;
        Ok(AlignedBuf { ptr, len, layout })
    }

    /// A copy of `bytes`.
    pub fn try_from_bytes(bytes: &[u8]) -> Result<AlignedBuf> {
        let mut buf = AlignedBuf::try_zeroed(bytes.len())?;
        buf.as_mut_bytes().copy_from_slice(bytes);
        Ok(buf)
    }

    /// The bytes asked for (the allocation may be longer).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: the allocation holds at least `len` initialised bytes, and `&self`
        // lets nothing write them while the slice lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        // SAFETY: the allocation holds at least `len` initialised (zeroed or written)
        // bytes, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `try_zeroed` with this layout, freed only here.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_padded() {
        for len in [0, 1, 63, 64, 65, 1000] {
            let mut b = AlignedBuf::try_zeroed(len).unwrap();
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            assert!(b.as_mut_bytes().iter().all(|&x| x == 0));
            assert!(b.layout.size() >= len.max(1) && b.layout.size().is_multiple_of(ALIGN));
            b.as_mut_bytes().fill(7);
        }
        let mut b = AlignedBuf::try_from_bytes(&[1, 2, 3]).unwrap();
        assert_eq!(b.as_mut_bytes(), &[1, 2, 3]);
    }

    #[test]
    fn large_buffers_take_whole_huge_pages() {
        let len = HUGE_MIN + 3;
        let mut b = AlignedBuf::try_zeroed(len).unwrap();
        assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(b.layout.size(), 3 * HUGE_PAGE);
        assert!(b.as_mut_bytes().iter().all(|&x| x == 0));
        assert_eq!(layout_for(HUGE_MIN - 1).unwrap().align(), ALIGN);
    }

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        // The last is a valid layout that no machine can back.
        for len in [
            usize::MAX,
            isize::MAX as usize,
            isize::MAX as usize - 10,
            1 << 60,
        ] {
            let e = AlignedBuf::try_zeroed(len).unwrap_err();
            assert_eq!(e, Error::Runtime(format!("cannot allocate {len} bytes")));
        }
    }
}
