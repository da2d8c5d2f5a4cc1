//! The loops: [`driver`] cuts the product into one balanced part per thread, and each
//! part runs the BLIS blocking (NC columns of B, KC-deep slices of K, MC rows of A)
//! with the macro-kernel walking the micro-kernel over the packed panels.
use super::dispatch::Kernel;
use super::epilogue::{epilogue_only, Ep, Tile};
use super::pack::{pack_a, pack_b};
use super::scratch::{with_scratch, Scratch};
use super::{Epilogue, Mat, KC, MC, MR, NC, NR};
use crate::backend::cpu::host;
use crate::backend::cpu::pool::Pool;

/// Floats in a 64-byte cache line.
const LINE_FLOATS: usize = 16;

/// Where the macro-kernel's B panels come from.
#[derive(Clone, Copy)]
pub(super) enum BSrc {
    /// Packed per block into thread-local scratch.
    Mat(Mat),
    /// Pre-packed (see [`PackedB`]): `panels` micro-panels per K slice of `depth` rows
    /// (all of K, or KC); this (sub)problem's column 0 is panel `p0`.
    Packed {
        ptr: *const f32,
        panels: usize,
        depth: usize,
        p0: usize,
    },
}

// SAFETY: a `BSrc` only carries B's address (a matrix or packed panels) that the
// caller keeps alive and unwritten for the call; any thread may read through it.
unsafe impl Send for BSrc {}
// SAFETY: shared `&BSrc`s only copy the address out and read B through it, never write.
unsafe impl Sync for BSrc {}

#[derive(Clone, Copy)]
struct SendMut(*mut f32);
// SAFETY: C outlives the pool run, and each task moved to a thread writes only its
// own part of C.
unsafe impl Send for SendMut {}
// SAFETY: the tasks sharing it each offset it to their own disjoint part of C
// (`driver`'s split) before writing, so no element is written by two threads.
unsafe impl Sync for SendMut {}

/// Splits the problem across `pool` (when worth it) and runs each part serially.
///
/// # Safety
/// As for [`gemm`], with `b` covering k×n.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn driver(
    kern: Kernel,
    pool: Option<&Pool>,
    par_min_work: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: BSrc,
    c: *mut f32,
    ldc: usize,
    ep: &Epilogue,
) {
    if m == 0 || n == 0 {
        return;
    }
    let ep = Ep::new(ep);
    let threads = pool.map_or(1, |p| p.threads());
    let (tm, tn) = split(threads, m, n, k, par_min_work);
    let pool = match pool {
        Some(p) if tm * tn > 1 => p,
        // SAFETY: one part, the whole problem: `serial` asks what `driver` is given.
        _ => return unsafe { serial(kern, m, n, k, a, b, c, ldc, &ep) },
    };
    let (mp, np) = (m.div_ceil(MR), n.div_ceil(NR));
    let cm = SendMut(c);
    pool.run(tm * tn, &|t| {
        // Capture the whole (Sync) views, not their raw-pointer fields.
        let (a, b, ep, cm) = (a, b, ep, cm);
        let (ti, tj) = (t / tn, t % tn);
        let (i0, i1) = ((ti * mp / tm * MR).min(m), ((ti + 1) * mp / tm * MR).min(m));
        let (j0, j1) = ((tj * np / tn * NR).min(n), ((tj + 1) * np / tn * NR).min(n));
        if i0 >= i1 || j0 >= j1 {
            return;
        }
        let a = Mat {
            // SAFETY: `i0 < i1 <= m`: row i0 of the m×k A.
            ptr: unsafe { a.ptr.add(i0 * a.rs) },
            ..a
        };
        let b = match b {
            BSrc::Mat(b) => BSrc::Mat(Mat {
                // SAFETY: `j0 < j1 <= n`: column j0 of the k×n B.
                ptr: unsafe { b.ptr.add(j0 * b.cs) },
                ..b
            }),
            // j0 is a multiple of NR, so a pre-packed B's part starts at panel j0/NR.
            BSrc::Packed {
                ptr,
                panels,
                depth,
                p0,
            } => BSrc::Packed {
                ptr,
                panels,
                depth,
                p0: p0 + j0 / NR,
            },
        };
        // SAFETY: (i0, j0) lies inside the m×n C (row stride ldc) and inside the
        // epilogue's extents, which cover C.
        let (c, ep) = unsafe { (cm.0.add(i0 * ldc + j0), ep.at(i0, j0)) };
        // SAFETY: the part's (i1 - i0)×(j1 - j0) sub-matrices of A, B and C lie in the
        // caller's; the parts are disjoint, so no two tasks write the same C element.
        unsafe { serial(kern, i1 - i0, j1 - j0, k, a, b, c, ldc, &ep) };
    });
}

/// How many parts to cut M and N into for `threads` threads: one balanced,
/// micro-panel-aligned part per thread along the axis that balances better (N on a
/// tie: each part then packs only its own columns of B).
pub(super) fn split(
    threads: usize,
    m: usize,
    n: usize,
    k: usize,
    par_min_work: usize,
) -> (usize, usize) {
    if threads <= 1 || m.saturating_mul(n).saturating_mul(k.max(1)) < par_min_work {
        return (1, 1);
    }
    let (mp, np) = (m.div_ceil(MR), n.div_ceil(NR));
    let (tm, tn) = (threads.min(mp), threads.min(np));
    // The largest part's element count for each choice (ragged last panels included).
    let cost_n = largest_part(n, NR, tn) * m;
    let cost_m = largest_part(m, MR, tm) * n;
    if cost_n <= cost_m {
        (1, tn)
    } else {
        (tm, 1)
    }
}

/// The widest of `parts` parts of `len` cut at multiples of `unit` as `driver` cuts it.
fn largest_part(len: usize, unit: usize, parts: usize) -> usize {
    let units = len.div_ceil(unit);
    (0..parts)
        .map(|t| ((t + 1) * units / parts * unit).min(len) - (t * units / parts * unit).min(len))
        .max()
        .unwrap_or(len)
}

/// One (sub)problem on this thread: a pre-packed B deeper than one KC slice column by
/// column over row blocks of A ([`columns`]), anything else through the BLIS loops
/// ([`blocked`]).
///
/// # Safety
/// As for [`gemm`], with `b` covering k×n and `ep` positioned at C's (0, 0).
#[allow(clippy::too_many_arguments)]
unsafe fn serial(
    kern: Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: BSrc,
    c: *mut f32,
    ldc: usize,
    ep: &Ep,
) {
    if k == 0 {
        // SAFETY: C and the epilogue cover m×n.
        return unsafe { epilogue_only(m, n, c, ldc, ep) };
    }
    // B that fits half the L2 stays there from call to call (a recurrent layer's
    // weights, step after step): prefetching it again would only cost load slots.
    let half_l2 = host::caches().l2 / 2;
    let stream_b = k * n * std::mem::size_of::<f32>() > half_l2;
    with_scratch(|abuf, bbuf| match b {
        BSrc::Packed {
            ptr,
            panels,
            depth,
            p0,
        } if k > KC => {
            // Row blocks whose A (all of K) fits half the L2, at least MC rows so B,
            // streamed once per block, is reused as much as the blocked loops reuse it.
            let fit = half_l2 / (k * std::mem::size_of::<f32>());
            let rows = fit.max(MC) / kern.mr * kern.mr;
            let mut ic = 0;
            while ic < m {
                let mb = rows.min(m - ic);
                let a = Mat {
                    // SAFETY: `ic < m`: row ic of the m×k A.
                    ptr: unsafe { a.ptr.add(ic * a.rs) },
                    ..a
                };
                // SAFETY: `ic < m`: row ic of C and of the epilogue's extents.
                let (c, ep) = unsafe { (c.add(ic * ldc), &ep.at(ic, 0)) };
                let b = (ptr, panels, depth, p0);
                // SAFETY: rows ic..ic + mb (<= m) of A and C, all of the packed B, and
                // `abuf` this thread's own.
                unsafe { columns(kern, mb, n, k, a, b, c, ldc, ep, stream_b, abuf) };
                ic += mb;
            }
        }
        // SAFETY: the operands as `serial` was given; the buffers are this thread's.
        _ => unsafe { blocked(kern, m, n, k, a, b, c, ldc, ep, stream_b, abuf, bbuf) },
    });
}

/// The BLIS loops over one (sub)problem; a pre-packed B only when K is one slice.
///
/// # Safety
/// As for [`serial`], with the thread's packing buffers.
#[allow(clippy::too_many_arguments)]
unsafe fn blocked(
    kern: Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: BSrc,
    c: *mut f32,
    ldc: usize,
    ep: &Ep,
    stream_b: bool,
    abuf: &mut Scratch,
    bbuf: &mut Scratch,
) {
    let mut jc = 0;
    while jc < n {
        let nc = NC.min(n - jc);
        let mut pc = 0;
        while pc < k {
            let kc = KC.min(k - pc);
            if let (true, BSrc::Mat(b)) = (m <= MC, b) {
                // One A block: pack it once, then pack each B micro-panel just before
                // its tiles run, so it goes from memory to L1 and is used there
                // (instead of a kc×nc block round-tripping through L3).
                let ap = abuf.get(kc * m.div_ceil(MR) * MR + 8);
                let dst = bbuf.get(kc * kern.nr);
                // SAFETY: `pc < k`: A's columns pc..pc + kc, all m rows, pack into
                // `ap`'s ⌈m/6⌉·6·kc floats plus 8 of slack.
                unsafe { pack_a(kern, m, kc, a.ptr.add(pc * a.cs), a.rs, a.cs, ap) };
                let mut jb = 0;
                while jb < nc {
                    let w = kern.nr.min(nc - jb);
                    let col = jc + jb;
                    // SAFETY: rows pc..pc + kc and columns col..col + w (col + w <= n)
                    // of B pack into `dst`'s kc·kern.nr floats (w <= kern.nr).
                    unsafe {
                        let src = b.ptr.add(pc * b.rs + col * b.cs);
                        pack_b(kern, kc, w, src, b.rs, b.cs, dst);
                    }
                    // The next panel's columns are read while this one's
                    // tiles run (a run-time B comes from L3: the forward GEMMs
                    // of the MLP training step run ~8% faster this way).
                    if jb + w < nc {
                        prefetch_block(
                            b.ptr.wrapping_add(pc * b.rs + (col + w) * b.cs),
                            kc,
                            kern.nr.min(nc - jb - w),
                            b.rs,
                            b.cs,
                        );
                    }
                    // SAFETY: `ap` and `dst` hold the packed m×kc A and kc×w B; the m×w
                    // block of C at column col < n, and the epilogue there, lie in C's.
                    unsafe {
                        let (c, ep) = (c.add(col), ep.at(0, col));
                        let (acc, last) = (pc > 0, pc + kc == k);
                        let then = (std::ptr::null(), 0);
                        macro_kernel(kern, m, w, kc, ap, dst, c, ldc, acc, last, &ep, false, then);
                    }
                    jb += w;
                }
                pc += kc;
                continue;
            }
            let bp: *const f32 = match b {
                BSrc::Mat(b) => {
                    let dst = bbuf.get(kc * nc.div_ceil(NR) * NR);
                    // SAFETY: (pc, jc) lies inside B, and the kc×nc block from there;
                    // the scratch holds it rounded up to whole micro-panels.
                    unsafe {
                        let src = b.ptr.add(pc * b.rs + jc * b.cs);
                        pack_b(kern, kc, nc, src, b.rs, b.cs, dst);
                    }
                    dst
                }
                BSrc::Packed {
                    ptr, panels, p0, ..
                } => {
                    // SAFETY: a pre-packed B here has K one slice (kc = k = its depth)
                    // of `panels` panels of kc×16; panel p0 + jc/16 is this block's first.
                    unsafe { ptr.add(pc * panels * NR + (p0 + jc / NR) * kc * NR) }
                }
            };
            let mut ic = 0;
            while ic < m {
                let mc = MC.min(m - ic);
                let ap = abuf.get(kc * mc.div_ceil(MR) * MR + 8);
                // SAFETY: (ic, pc) lies inside A, and the mc×kc block from there;
                // `ap` holds it rounded up to whole micro-panels, plus 8 floats of slack.
                unsafe {
                    let src = a.ptr.add(ic * a.rs + pc * a.cs);
                    pack_a(kern, mc, kc, src, a.rs, a.cs, ap);
                }
                // SAFETY: `ap` and `bp` hold the packed mc×kc and kc×nc blocks; the
                // mc×nc block of C at (ic, jc), and the epilogue there, lie in C's.
                unsafe {
                    let (c, tile_ep) = (c.add(ic * ldc + jc), ep.at(ic, jc));
                    let (acc, last, then) = (pc > 0, pc + kc == k, (std::ptr::null(), 0));
                    macro_kernel(
                        kern, mc, nc, kc, ap, bp, c, ldc, acc, last, &tile_ep, stream_b, then,
                    );
                }
                ic += mc;
            }
            pc += kc;
        }
        jc += nc;
    }
}

/// Asks for the kc×w block of B at `b` (strides rs, cs) to be brought into L2, one
/// request per cache line of its contiguous runs. Safe: a prefetch only hints the
/// cache and never faults, so the addresses are computed with wrapping arithmetic.
fn prefetch_block(b: *const f32, kc: usize, w: usize, rs: usize, cs: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let (runs, len, step) = if cs == 1 { (kc, w, rs) } else { (w, kc, cs) };
        for r in 0..runs {
            let row = b.wrapping_add(r * step);
            let mut e = 0;
            while e < len {
                // SAFETY: `_mm_prefetch` needs only SSE, which every x86_64 CPU has.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(e) as *const i8) };
                e += 16;
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (b, kc, w, rs, cs);
}

/// A block of A's rows against a pre-packed B, column by column: each column of B
/// panels runs through all of K before the next, so C is written once and its tiles
/// stay in L1 meanwhile. A B packed whole (see [`packed_depth`]) runs all of K in one
/// micro-kernel call per tile, one packed in KC slices slice by slice. A recurrent
/// layer's step (64 rows against a 16 MiB weight matrix) and its input projection
/// (1,024 rows) both run faster so than through the KC-slice loops, which load and
/// store each C tile once per slice.
///
/// # Safety
/// As for [`serial`], with `abuf` free for A and the pre-packed B's (ptr, panels,
/// depth, p0) (see [`BSrc::Packed`]).
#[allow(clippy::too_many_arguments)]
unsafe fn columns(
    kern: Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    (ptr, panels, depth, p0): (*const f32, usize, usize, usize),
    c: *mut f32,
    ldc: usize,
    ep: &Ep,
    stream_b: bool,
    abuf: &mut Scratch,
) {
    let mpad = m.div_ceil(MR) * MR;
    let ap = abuf.get(k * mpad + 8);
    // The panel of B's slice at row pc and column col (a multiple of NR).
    let panel = |pc: usize, col: usize| {
        ptr.wrapping_add(pc * panels * NR + (p0 + col / NR) * depth.min(k - pc) * NR)
    };
    let mut pc = 0;
    while pc < k {
        let kc = depth.min(k - pc);
        // SAFETY: slice pc of A (all m rows, columns pc..pc + kc <= k) packs into
        // kc·mpad floats at ap + pc·mpad, inside the k·mpad + 8 asked for.
        unsafe {
            let (src, dst) = (a.ptr.add(pc * a.cs), ap.add(pc * mpad));
            pack_a(kern, m, kc, src, a.rs, a.cs, dst);
        }
        pc += kc;
    }
    let mut jr = 0;
    while jr < n {
        let nr = kern.nr.min(n - jr);
        let mut pc = 0;
        while pc < k {
            let kc = depth.min(k - pc);
            // Prefetched while this slice runs: the column's next slice, or the
            // next column's first.
            let then = if pc + kc < k {
                (panel(pc + kc, jr), nr * depth.min(k - pc - kc))
            } else if jr + nr < n {
                (panel(0, jr + nr), kern.nr.min(n - jr - nr) * depth.min(k))
            } else {
                (std::ptr::null(), 0)
            };
            // SAFETY: A's slice pc was packed at ap + pc·mpad above; `panel(pc, jr)` is
            // the packed B's (slice pc, column jr < n) panel; the m×nr block of C at
            // column jr, and the epilogue there, lie in C's.
            unsafe {
                let (ap, bp) = (ap.add(pc * mpad), panel(pc, jr));
                let (c, ep, acc, last) = (c.add(jr), ep.at(0, jr), pc > 0, pc + kc == k);
                macro_kernel(
                    kern, m, nr, kc, ap, bp, c, ldc, acc, last, &ep, stream_b, then,
                );
            }
            pc += kc;
        }
        jr += nr;
    }
}

/// The depth of the K slices of a B packed for an A of `m` rows: all of K when a
/// 32-column tile's two panels of it fit an eighth of the L2 and A has two 12-row
/// tiles or more, so each tile's C is loaded and stored once and the next column's
/// panels are prefetched over the whole column's run (an LSTM's 64-row steps ran 3–5 %
/// faster so); else KC, so a slice's panels stay in L1 over the column's tiles (each
/// tile reads whole-K panels from L2: 8 % slower with 16 rows, or 2,048-deep weights).
pub(super) fn packed_depth(m: usize, k: usize) -> usize {
    if m >= 24 && k * 2 * NR * std::mem::size_of::<f32>() <= host::caches().l2 / 8 {
        k.max(1)
    } else {
        KC
    }
}

/// Runs the micro-kernel over packed mc×kc A and kc×nc B blocks.
///
/// # Safety
/// The panels hold the rounded-up blocks; C and `ep` (positioned at the block's (0, 0))
/// cover mc×nc.
#[allow(clippy::too_many_arguments)]
unsafe fn macro_kernel(
    kern: Kernel,
    mc: usize,
    nc: usize,
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    last: bool,
    ep: &Ep,
    prefetch_next: bool,
    then: (*const f32, usize),
) {
    let mut jr = 0;
    while jr < nc {
        let nr = kern.nr.min(nc - jr);
        // SAFETY: panel jr/NR of the packed B block.
        let bpanel = unsafe { bp.add(jr * kc) };
        // The next panel's lines (after the last column, the `then` panel of that many
        // floats), prefetched a share per tile of this column, so it arrives from L3
        // spread over these tiles instead of stalling the first of the next column.
        let (next_panel, next_floats) = if jr + nr < nc {
            (
                bpanel.wrapping_add(nr * kc),
                (nc - jr - nr).min(kern.nr) * kc,
            )
        } else {
            then
        };
        let next = if prefetch_next {
            next_floats / LINE_FLOATS
        } else {
            0
        };
        let tiles = mc.div_ceil(kern.mr);
        let mut ir = 0;
        while ir < mc {
            let mr = kern.mr.min(mc - ir);
            let tile = ir / kern.mr;
            let (l0, l1) = (tile * next / tiles, (tile + 1) * next / tiles);
            // SAFETY: `ir < mc`, `jr < nc`: (ir, jr) lies in the mc×nc block of C and of
            // the epilogue's extents.
            let (e, c) = unsafe { (ep.at(ir, jr), c.add(ir * ldc + jr)) };
            let t = Tile {
                c,
                ldc,
                mr,
                nr,
                accumulate,
                last,
                bias_row: e.bias_row,
                bias_col: e.bias_col,
                res: e.res,
                ldr: e.ldr,
                relu: e.relu,
                act: e.act,
                prefetch: next_panel.wrapping_add(l0 * LINE_FLOATS),
                prefetch_lines: l1 - l0,
            };
            // SAFETY: A's panels from ir/6 (⌈mr/6⌉ of them, kc·6 floats each, at ir·kc)
            // and B's from jr/16 (`bpanel`) hold the packed blocks; `t` is the mr×nr
            // tile at (ir, jr), inside C; `kern.micro` suits this CPU (`kernel_for`).
            unsafe { (kern.micro)(kc, ap.add(ir * kc), bpanel, &t) };
            ir += kern.mr;
        }
        jr += kern.nr;
    }
}
