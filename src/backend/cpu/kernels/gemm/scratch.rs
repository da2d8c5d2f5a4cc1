//! The packing buffers: a 64-byte-aligned f32 buffer that grows on demand, one pair per
//! thread, reused across calls so the steady state allocates nothing.
use std::cell::RefCell;

use crate::aligned::AlignedBuf;

/// A growable f32 view of the crate's [`AlignedBuf`] (never shrinks).
pub(super) struct Scratch {
    buf: Option<AlignedBuf>,
}

impl Scratch {
    pub(super) const fn new() -> Scratch {
        Scratch { buf: None }
    }

    /// A pointer to at least `len` floats (contents unspecified).
    ///
    /// Out of memory panics, with the size, rather than aborting: the sizes come from
    /// the model's shapes, and a panic becomes `KILN_STATUS_INTERNAL` at the C boundary
    /// (the worker pool re-raises it on the caller) instead of killing the host.
    pub(super) fn get(&mut self, len: usize) -> *mut f32 {
        let cap = self.buf.as_ref().map_or(0, |b| b.len() / 4);
        if len > cap || self.buf.is_none() {
            let want = len.max(cap.saturating_mul(2)).max(64);
            // Free the old buffer first: its contents are not kept.
            self.buf = None;
            let buf = want
                .checked_mul(4)
                .ok_or_else(|| format!("{want} floats exceed the address space"))
                .and_then(|bytes| AlignedBuf::try_zeroed(bytes).map_err(|e| e.to_string()));
            match buf {
                Ok(b) => self.buf = Some(b),
                Err(e) => panic!("GEMM packing buffer of {want} floats: {e}"),
            }
        }
        self.buf
            .as_mut()
            .map_or(std::ptr::null_mut(), |b| b.as_mut_ptr().cast())
    }

    /// The buffer's start (null before the first `get`).
    pub(super) fn as_ptr(&self) -> *const f32 {
        self.buf
            .as_ref()
            .map_or(std::ptr::null(), |b| b.as_ptr().cast())
    }
}

thread_local! {
    /// This thread's A and B packing buffers.
    static SCRATCH: RefCell<(Scratch, Scratch)> =
        const { RefCell::new((Scratch::new(), Scratch::new())) };
}

/// Runs `f` with this thread's packing buffers (fresh ones if they are in use, e.g. a
/// re-entrant call from an activation; or if the thread is being torn down).
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut Scratch, &mut Scratch) -> R) -> R {
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
            let (mut a, mut b) = (Scratch::new(), Scratch::new());
            (f.take().expect("not yet called"))(&mut a, &mut b)
        }
    }
}
