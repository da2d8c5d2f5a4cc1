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

// SAFETY: read-only views of buffers kept alive for the call.
unsafe impl Send for BSrc {}
// SAFETY: as for `Send` above.
unsafe impl Sync for BSrc {}

#[derive(Clone, Copy)]
struct SendMut(*mut f32);
// SAFETY: tasks write disjoint sub-matrices of C.
unsafe impl Send for SendMut {}
// SAFETY: as for `Send` above.
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
        // SAFETY: the caller's contract.
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
        // SAFETY: (i0, j0) lies inside A's rows, B's columns and C; the parts are
        // disjoint, so the writes to C do not overlap; j0 is a multiple of NR, so a
        // pre-packed B's part starts at panel j0/NR.
        unsafe {
            let a = Mat {
                ptr: a.ptr.add(i0 * a.rs),
                ..a
            };
            let b = match b {
                BSrc::Mat(b) => BSrc::Mat(Mat {
                    ptr: b.ptr.add(j0 * b.cs),
                    ..b
                }),
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
            let c = cm.0.add(i0 * ldc + j0);
            serial(kern, i1 - i0, j1 - j0, k, a, b, c, ldc, &ep.at(i0, j0));
        }
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
                // SAFETY: rows ic..ic + mb of A and C; the epilogue positioned there.
                unsafe {
                    let a = Mat {
                        ptr: a.ptr.add(ic * a.rs),
                        ..a
                    };
                    let (c, ep) = (c.add(ic * ldc), &ep.at(ic, 0));
                    let b = (ptr, panels, depth, p0);
                    columns(kern, mb, n, k, a, b, c, ldc, ep, stream_b, abuf);
                }
                ic += mb;
            }
        }
        // SAFETY: the caller's contract.
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
                // SAFETY: (0, pc) lies inside A, (pc, jc + jb) inside B; `ap` and
                // `dst` hold the rounded-up blocks; every tile lies inside C.
                unsafe {
                    pack_a(kern, m, kc, a.ptr.add(pc * a.cs), a.rs, a.cs, ap);
                    let mut jb = 0;
                    while jb < nc {
                        let w = kern.nr.min(nc - jb);
                        let col = jc + jb;
                        pack_b(
                            kern,
                            kc,
                            w,
                            b.ptr.add(pc * b.rs + col * b.cs),
                            b.rs,
                            b.cs,
                            dst,
                        );
                        // The next panel's columns are read while this one's
                        // tiles run (a run-time B comes from L3: the forward GEMMs
                        // of the MLP training step run ~8% faster this way).
                        if jb + w < nc {
                            prefetch_block(
                                b.ptr.add(pc * b.rs + (col + w) * b.cs),
                                kc,
                                kern.nr.min(nc - jb - w),
                                b.rs,
                                b.cs,
                            );
                        }
                        macro_kernel(
                            kern,
                            m,
                            w,
                            kc,
                            ap,
                            dst,
                            c.add(col),
                            ldc,
                            pc > 0,
                            pc + kc == k,
                            &ep.at(0, col),
                            false,
                            (std::ptr::null(), 0),
                        );
                        jb += w;
                    }
                }
                pc += kc;
                continue;
            }
            // SAFETY: (pc, jc) lies inside B; the scratch holds the kc×nc block
            // rounded up to whole micro-panels; a pre-packed B (K one slice, so kc = k
            // = its depth) holds `panels` panels of kc×16 for this slice.
            let bp: *const f32 = unsafe {
                match b {
                    BSrc::Mat(b) => {
                        let dst = bbuf.get(kc * nc.div_ceil(NR) * NR);
                        let src = b.ptr.add(pc * b.rs + jc * b.cs);
                        pack_b(kern, kc, nc, src, b.rs, b.cs, dst);
                        dst
                    }
                    BSrc::Packed {
                        ptr, panels, p0, ..
                    } => ptr.add(pc * panels * NR + (p0 + jc / NR) * kc * NR),
                }
            };
            let mut ic = 0;
            while ic < m {
                let mc = MC.min(m - ic);
                let ap = abuf.get(kc * mc.div_ceil(MR) * MR + 8);
                // SAFETY: (ic, pc) lies inside A; `ap` holds the mc×kc block rounded
                // up to whole micro-panels; every tile lies inside C.
                unsafe {
                    pack_a(
                        kern,
                        mc,
                        kc,
                        a.ptr.add(ic * a.rs + pc * a.cs),
                        a.rs,
                        a.cs,
                        ap,
                    );
                    let tile_ep = ep.at(ic, jc);
                    macro_kernel(
                        kern,
                        mc,
                        nc,
                        kc,
                        ap,
                        bp,
                        c.add(ic * ldc + jc),
                        ldc,
                        pc > 0,
                        pc + kc == k,
                        &tile_ep,
                        stream_b,
                        (std::ptr::null(), 0),
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
/// request per cache line of its contiguous runs.
///
/// # Safety
/// `b` addresses a kc×w matrix.
unsafe fn prefetch_block(b: *const f32, kc: usize, w: usize, rs: usize, cs: usize) {
    // SAFETY: callers uphold this unsafe fn's contract: pointers valid for the lengths
    // used, and the CPU features it is compiled for.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
            let (runs, len, step) = if cs == 1 { (kc, w, rs) } else { (w, kc, cs) };
            for r in 0..runs {
                let row = b.add(r * step);
                let mut e = 0;
                while e < len {
                    _mm_prefetch::<_MM_HINT_T1>(row.add(e) as *const i8);
                    e += 16;
                }
            }
        }
    }
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
    // SAFETY: slice pc of A (rows of A, columns pc..pc + kc) packs into kc·mpad floats
    // at ap + pc·mpad, inside the k·mpad asked for; every panel and tile lies inside
    // the packed B and C.
    unsafe {
        let mut pc = 0;
        while pc < k {
            let kc = depth.min(k - pc);
            pack_a(
                kern,
                m,
                kc,
                a.ptr.add(pc * a.cs),
                a.rs,
                a.cs,
                ap.add(pc * mpad),
            );
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
                macro_kernel(
                    kern,
                    m,
                    nr,
                    kc,
                    ap.add(pc * mpad),
                    panel(pc, jr),
                    c.add(jr),
                    ldc,
                    pc > 0,
                    pc + kc == k,
                    &ep.at(0, jr),
                    stream_b,
                    then,
                );
                pc += kc;
            }
            jr += nr;
        }
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
            // SAFETY: panels ir/MR.. of the packed A block; the tile (ir, jr) lies in C.
            unsafe {
                let e = ep.at(ir, jr);
                let t = Tile {
                    c: c.add(ir * ldc + jr),
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
                (kern.micro)(kc, ap.add(ir * kc), bpanel, &t);
            }
            ir += kern.mr;
        }
        jr += kern.nr;
    }
}
