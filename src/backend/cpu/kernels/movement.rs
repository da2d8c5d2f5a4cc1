//! Data movement on raw bytes, for every dtype by element size: one strided N-d copy
//! ([`CopyPlan`]: Concat, Split, Slice, Expand, Tile, Transpose), a copy through
//! per-axis index tables ([`TableCopy`]: Pad in every mode, nearest Resize), row
//! gathers ([`gather`], [`gather_elements`]), the scatter of [`scatter_nd`], and
//! [`cast`] between the numeric dtypes.
use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::pool::Pool;
use crate::tensor::Elem;

/// Copies one element of `elem` bytes (sizes 1, 2, 4 and 8 as single moves).
///
/// # Safety
/// `src` readable and `dst` writable for `elem` bytes.
#[inline(always)]
unsafe fn copy_elem(src: *const u8, dst: *mut u8, elem: usize) {
    // SAFETY: the caller's contract; unaligned accesses are allowed by read/write_unaligned.
    unsafe {
        match elem {
            1 => *dst = *src,
            2 => (dst as *mut u16).write_unaligned((src as *const u16).read_unaligned()),
            4 => (dst as *mut u32).write_unaligned((src as *const u32).read_unaligned()),
            8 => (dst as *mut u64).write_unaligned((src as *const u64).read_unaligned()),
            _ => std::ptr::copy_nonoverlapping(src, dst, elem),
        }
    }
}

/// `len` elements from `src` (stride `src_step` bytes) to `dst` (stride `dst_step`).
///
/// # Safety
/// Every address touched must be valid; the two ranges must not overlap.
#[inline(always)]
unsafe fn copy_run(
    src: *const u8,
    src_step: isize,
    dst: *mut u8,
    dst_step: isize,
    len: usize,
    elem: usize,
) {
    let e = elem as isize;
    if src_step == e && dst_step == e {
        // SAFETY: both runs are contiguous, len·elem bytes from src and from dst, which
        // the contract makes valid and apart.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len * elem) };
        return;
    }
    macro_rules! typed {
        ($T:ty) => {{
            let (s, d) = (src as *const $T, dst as *mut $T);
            let (ss, ds) = (src_step / e, dst_step / e);
            for i in 0..len as isize {
                // SAFETY: element i < len of each run (i steps on) is an address the
                // contract makes valid; `$T` is `elem` bytes, moved unaligned.
                unsafe {
                    d.offset(i * ds)
                        .write_unaligned(s.offset(i * ss).read_unaligned())
                };
            }
        }};
    }
    match elem {
        1 => typed!(u8),
        2 => typed!(u16),
        4 => typed!(u32),
        8 => typed!(u64),
        _ => {
            for i in 0..len as isize {
                let (from, to) = (
                    src.wrapping_offset(i * src_step),
                    dst.wrapping_offset(i * dst_step),
                );
                // SAFETY: element i < len of each run: `elem` bytes at i·step, valid by
                // the contract, one in each of the two non-overlapping runs.
                unsafe { copy_elem(from, to, elem) };
            }
        }
    }
}

/// Fills `len` elements at `dst` with the element `value` (its bytes).
///
/// # Safety
/// `dst` writable for `len · value.len()` bytes.
unsafe fn fill(dst: *mut u8, len: usize, value: &[u8]) {
    // SAFETY: the contract gives len·value.len() writable bytes at dst, which no one
    // else touches meanwhile.
    let out = unsafe { std::slice::from_raw_parts_mut(dst, len * value.len()) };
    if value.iter().all(|&b| b == 0) {
        out.fill(0);
    } else {
        for chunk in out.chunks_exact_mut(value.len()) {
            chunk.copy_from_slice(value);
        }
    }
}

/// Bytes of one piece of a long contiguous row copied by one task.
const PIECE_BYTES: usize = 64 * 1024;

/// One axis of a copy: its size and the source and destination strides (bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Axis {
    size: usize,
    src: isize,
    dst: isize,
}

/// A strided N-d copy worked out once: `dst[Σ i·dst_stride] = src[Σ i·src_stride]` over
/// every index of `dims`. Axes of size 1 are dropped and axes that are contiguous in
/// both buffers merged, so most copies become a few long `memcpy` rows; big copies are
/// split over the pool by rows.
#[derive(Debug, Clone)]
pub struct CopyPlan {
    /// The merged outer axes, outermost first.
    outer: Vec<Axis>,
    inner: Axis,
    elem: usize,
    total: usize,
}

impl CopyPlan {
    /// The copy of `dims` with source and destination strides in elements of `elem`
    /// bytes (negative strides walk backwards).
    pub fn new(dims: &[usize], src: &[isize], dst: &[isize], elem: usize) -> CopyPlan {
        let total = dims.iter().product();
        let e = elem as isize;
        let mut axes: Vec<Axis> = dims
            .iter()
            .zip(src.iter().zip(dst))
            .filter(|(&d, _)| d != 1)
            .map(|(&size, (&s, &d))| Axis {
                size,
                src: s * e,
                dst: d * e,
            })
            .collect();
        // Merge axis a into a + 1 when stepping a equals stepping over all of a + 1.
        let mut k = axes.len();
        while k >= 2 {
            let (a, b) = (axes[k - 2], axes[k - 1]);
            let n = b.size as isize;
            if a.src == b.src * n && a.dst == b.dst * n {
                axes[k - 2] = Axis {
                    size: a.size * b.size,
                    src: b.src,
                    dst: b.dst,
                };
                axes.remove(k - 1);
            }
            k -= 1;
        }
        let inner = axes.pop().unwrap_or(Axis {
            size: 1,
            src: e,
            dst: e,
        });
        CopyPlan {
            outer: axes,
            inner,
            elem,
            total,
        }
    }

    /// The plan of copying a contiguous tensor of `dims` into a contiguous one.
    pub fn contiguous_strides(dims: &[usize]) -> Vec<isize> {
        let mut s = vec![1isize; dims.len()];
        for a in (0..dims.len().saturating_sub(1)).rev() {
            s[a] = s[a + 1] * dims[a + 1] as isize;
        }
        s
    }

    /// The source and destination byte offsets of inner row `r`.
    fn row_offsets(&self, mut r: usize) -> (isize, isize) {
        let (mut so, mut dof) = (0isize, 0isize);
        for a in self.outer.iter().rev() {
            let i = (r % a.size) as isize;
            r /= a.size;
            so += i * a.src;
            dof += i * a.dst;
        }
        (so, dof)
    }

    /// How many inner rows the copy has (for tests of the merging).
    pub fn rows(&self) -> usize {
        self.outer.iter().map(|a| a.size).product()
    }

    /// Runs the copy from `src` to `dst` (both at the copy's origin).
    ///
    /// # Safety
    /// Every address the plan reaches from `src` must be readable and from `dst`
    /// writable, and the two must not overlap.
    pub unsafe fn run(&self, src: *const u8, dst: *mut u8, pool: Option<&Pool>) {
        if self.total == 0 {
            return;
        }
        let rows = self.rows();
        let (s, d) = (SyncPtr(src as *mut u8), SyncPtr(dst));
        let row_bytes = self.inner.size * self.elem;
        let e = self.elem as isize;
        if self.inner.src == e && self.inner.dst == e && row_bytes > 2 * PIECE_BYTES {
            // Long contiguous rows (a Concat or Split of whole images is one row per
            // input): cut into pieces, so that a few rows still spread over the threads.
            let pieces = row_bytes.div_ceil(PIECE_BYTES);
            for_ranges(pool, rows * pieces, PIECE_BYTES / 4, &|units| {
                for u in units {
                    let (r, at) = (u / pieces, u % pieces * PIECE_BYTES);
                    let (so, dof) = self.row_offsets(r);
                    let len = PIECE_BYTES.min(row_bytes - at);
                    // SAFETY: piece `at..at + len` of row r lies inside the copy's extent
                    // (the caller's contract).
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            s.get().offset(so).add(at),
                            d.get().offset(dof).add(at),
                            len,
                        )
                    };
                }
            });
            return;
        }
        for_ranges(pool, rows, row_bytes / 4, &|r| {
            // The source and destination offsets of row r.start, then stepped like an
            // odometer.
            let r0 = r.start;
            let mut idx = vec![0usize; self.outer.len()];
            let (mut so, mut dof) = (0isize, 0isize);
            let mut rest = r0;
            for (k, a) in self.outer.iter().enumerate().rev() {
                idx[k] = rest % a.size;
                rest /= a.size;
                so += idx[k] as isize * a.src;
                dof += idx[k] as isize * a.dst;
            }
            for _ in r {
                // SAFETY: the offsets stay inside the copy's extent (the caller's contract).
                unsafe {
                    copy_run(
                        s.get().offset(so),
                        self.inner.src,
                        d.get().offset(dof),
                        self.inner.dst,
                        self.inner.size,
                        self.elem,
                    );
                }
                for (k, a) in self.outer.iter().enumerate().rev() {
                    idx[k] += 1;
                    so += a.src;
                    dof += a.dst;
                    if idx[k] < a.size {
                        break;
                    }
                    idx[k] = 0;
                    so -= a.src * a.size as isize;
                    dof -= a.dst * a.size as isize;
                }
            }
        });
    }
}

/// Where a [`TableCopy`] output index reads: this byte offset, or the fill value.
pub const FILL: isize = isize::MIN;

/// A part of an output row of a [`TableCopy`]: a run of source elements that are
/// consecutive, or of fill.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Piece {
    Run { at: usize, src: isize, len: usize },
    Fill { at: usize, len: usize },
}

/// A copy where each output index along each axis reads a source index given by a
/// table (Pad's reflect/edge/wrap/constant, nearest Resize): the source offset of an
/// element is the sum of its axes' table entries. The last axis is cut into runs of
/// consecutive source elements, copied as rows; an output row reading the same source
/// row as the one before it copies that output row.
#[derive(Debug, Clone)]
pub struct TableCopy {
    /// Per outer axis, the source byte offset of each output index (or [`FILL`]).
    outer: Vec<Vec<isize>>,
    /// The last axis' table, and that table cut into pieces (when they are few).
    inner: Vec<isize>,
    pieces: Option<Vec<Piece>>,
    elem: usize,
    total: usize,
}

impl TableCopy {
    /// `tables[a][i]`: the source offset in elements of output index `i` along axis
    /// `a` (the source index times the source stride), or [`FILL`].
    pub fn new(mut tables: Vec<Vec<isize>>, elem: usize) -> TableCopy {
        let total = tables.iter().map(Vec::len).product();
        // A last axis copied whole (the lanes of a blocked layout) joins the axis before
        // it, so that its rows are longer runs.
        while tables.len() >= 2
            && tables[tables.len() - 1]
                .iter()
                .enumerate()
                .all(|(i, &v)| v == i as isize)
        {
            let last = tables.pop().unwrap_or_default();
            let prev = tables.pop().unwrap_or_default();
            let n = last.len() as isize;
            tables.push(
                prev.iter()
                    .flat_map(|&p| (0..n).map(move |j| if p == FILL { FILL } else { p + j }))
                    .collect(),
            );
        }
        let e = elem as isize;
        let mut outer: Vec<Vec<isize>> = tables
            .into_iter()
            .map(|t| {
                t.into_iter()
                    .map(|v| if v == FILL { FILL } else { v * e })
                    .collect()
            })
            .collect();
        let inner = outer.pop().unwrap_or_else(|| vec![0]);
        let mut pieces: Vec<Piece> = vec![];
        for (at, &src) in inner.iter().enumerate() {
            match (pieces.last_mut(), src) {
                (Some(Piece::Fill { len, .. }), FILL) => *len += 1,
                (Some(Piece::Run { src: s, len, .. }), _)
                    if src != FILL && *s + (*len as isize) * e == src =>
                {
                    *len += 1
                }
                (_, FILL) => pieces.push(Piece::Fill { at, len: 1 }),
                _ => pieces.push(Piece::Run { at, src, len: 1 }),
            }
        }
        // Many short pieces run faster as one element loop.
        let pieces = (pieces.len() * 4 <= inner.len().max(4)).then_some(pieces);
        TableCopy {
            outer,
            inner,
            pieces,
            elem,
            total,
        }
    }

    /// Runs the copy; `value` is the fill element's bytes.
    ///
    /// # Safety
    /// Every source offset in the tables (summed over the axes) must be readable from
    /// `src`; `dst` writable for the output; no overlap.
    pub unsafe fn run(&self, src: *const u8, dst: *mut u8, value: &[u8], pool: Option<&Pool>) {
        if self.total == 0 {
            return;
        }
        debug_assert_eq!(value.len(), self.elem);
        let es = self.elem;
        let row_bytes = self.inner.len() * es;
        let rows = self.total / self.inner.len();
        let (s, d) = (SyncPtr(src as *mut u8), SyncPtr(dst));
        for_ranges(pool, rows, row_bytes / 4, &|r| {
            let mut prev: Option<(usize, isize)> = None;
            for row in r {
                let (mut rest, mut off) = (row, 0isize);
                for t in self.outer.iter().rev() {
                    let v = t[rest % t.len()];
                    rest /= t.len();
                    off = if v == FILL || off == FILL {
                        FILL
                    } else {
                        off + v
                    };
                }
                // Each row writes its own row_bytes of `dst`.
                // SAFETY: output row `row` < rows starts row·row_bytes into dst, which
                // holds all rows (the contract).
                let out = unsafe { d.get().add(row * row_bytes) };
                if off == FILL {
                    // SAFETY: the row's inner.len() elements of es bytes at `out`.
                    unsafe { fill(out, self.inner.len(), value) };
                    continue;
                }
                if let Some((p, o)) = prev.filter(|&(_, o)| o == off) {
                    let done = d.get().wrapping_add(p * row_bytes);
                    // SAFETY: row p < row, finished by this task, and this row are two
                    // distinct rows of dst, row_bytes each.
                    unsafe { std::ptr::copy_nonoverlapping(done, out, row_bytes) };
                    prev = Some((row, o));
                    continue;
                }
                prev = Some((row, off));
                // SAFETY: `off` sums one entry of each outer table: inside the source by
                // the contract.
                let base = unsafe { s.get().offset(off) };
                match &self.pieces {
                    Some(pieces) => {
                        for p in pieces {
                            match *p {
                                // SAFETY: a run's len elements from inner offset `src` of
                                // the row's source and to element `at` of its output.
                                Piece::Run { at, src, len } => unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        base.offset(src),
                                        out.add(at * es),
                                        len * es,
                                    )
                                },
                                // SAFETY: elements at..at + len of this output row.
                                Piece::Fill { at, len } => unsafe {
                                    fill(out.add(at * es), len, value)
                                },
                            }
                        }
                    }
                    // SAFETY: `base` is the row's source, `out` its output row.
                    None => unsafe { self.gather_row(base, out, value) },
                }
            }
        });
    }

    /// One output row element by element.
    ///
    /// # Safety
    /// As [`TableCopy::run`], for one row.
    #[inline(always)]
    unsafe fn gather_row(&self, base: *const u8, out: *mut u8, value: &[u8]) {
        macro_rules! typed {
            ($T:ty) => {{
                let o = out as *mut $T;
                // SAFETY: `value` is one element, elem = size_of::<$T>() bytes (`run`
                // debug-asserts its length).
                let fill = unsafe { (value.as_ptr() as *const $T).read_unaligned() };
                for (i, &v) in self.inner.iter().enumerate() {
                    let x = if v == FILL {
                        fill
                    } else {
                        // SAFETY: inner offset v of the row's source, readable by the
                        // contract, read unaligned.
                        unsafe { (base.offset(v) as *const $T).read_unaligned() }
                    };
                    // SAFETY: element i < inner.len() of the output row at `out`.
                    unsafe { o.add(i).write_unaligned(x) };
                }
            }};
        }
        match self.elem {
            1 => typed!(u8),
            2 => typed!(u16),
            4 => typed!(u32),
            8 => typed!(u64),
            es => {
                for (i, &v) in self.inner.iter().enumerate() {
                    if v == FILL {
                        // SAFETY: element i < inner.len() of the output row, es bytes.
                        unsafe { fill(out.add(i * es), 1, value) };
                    } else {
                        // SAFETY: source element at inner offset v (readable by the
                        // contract) to output element i of the row.
                        unsafe { copy_elem(base.offset(v), out.add(i * es), es) };
                    }
                }
            }
        }
    }
}

/// Reads index `k` of an i32 or i64 index buffer.
///
/// # Safety
/// `indices` must hold more than `k` elements of the given width.
#[inline(always)]
unsafe fn index_at(indices: *const u8, wide: bool, k: usize) -> i64 {
    // SAFETY: element k of the index buffer exists (the contract), read unaligned as
    // the width says.
    unsafe {
        if wide {
            (indices as *const i64).add(k).read_unaligned()
        } else {
            (indices as *const i32).add(k).read_unaligned() as i64
        }
    }
}

/// An index resolved against an axis of size `d` (negatives count from the end), or
/// the error naming it.
#[inline(always)]
fn resolve(i: i64, d: usize) -> Result<usize, String> {
    let d = d as i64;
    let j = if i < 0 { i + d } else { i };
    if (0..d).contains(&j) {
        Ok(j as usize)
    } else {
        Err(format!("index {i} is out of range for an axis of size {d}"))
    }
}

/// The sizes of a [`gather`]: `data` is `[outer, axis, inner]` and the output
/// `[outer, indices, inner]` (inner in elements).
#[derive(Debug, Clone, Copy)]
pub struct GatherDims {
    pub outer: usize,
    pub axis: usize,
    pub inner: usize,
    pub indices: usize,
    /// Bytes per element, and whether the indices are i64 (else i32).
    pub elem: usize,
    pub wide: bool,
}

/// `Gather`: `out[o, k, :] = data[o, indices[k], :]`. Every index is checked before
/// anything is written; one out of range is an error naming it.
///
/// # Safety
/// `data`, `indices` and `out` must hold the sizes `g` describes; `out` overlaps neither.
pub unsafe fn gather(
    g: &GatherDims,
    data: *const u8,
    indices: *const u8,
    out: *mut u8,
    pool: Option<&Pool>,
) -> Result<(), String> {
    for k in 0..g.indices {
        // SAFETY: k < the index count.
        resolve(unsafe { index_at(indices, g.wide, k) }, g.axis)?;
    }
    let row = g.inner * g.elem;
    let (s, d, ip) = (
        SyncPtr(data as *mut u8),
        SyncPtr(out),
        SyncPtr(indices as *mut u8),
    );
    for_ranges(pool, g.outer * g.indices, row / 4, &|r| {
        for t in r {
            let (o, k) = (t / g.indices, t % g.indices);
            // SAFETY: the index was checked above; each t writes its own row of `out`.
            unsafe {
                let i = resolve(index_at(ip.get(), g.wide, k), g.axis).unwrap_or(0);
                std::ptr::copy_nonoverlapping(
                    s.get().add((o * g.axis + i) * row),
                    d.get().add(t * row),
                    row,
                );
            }
        }
    });
    Ok(())
}

/// The shapes of a [`gather_elements`]: `out` and `indices` have the shape `index`,
/// `data` the shape `data` (same rank, each index dim at most the data's, except along
/// `axis`).
#[derive(Debug, Clone)]
pub struct ElementsDims {
    pub data: Vec<usize>,
    pub index: Vec<usize>,
    pub axis: usize,
    /// Bytes per element, and whether the indices are i64 (else i32).
    pub elem: usize,
    pub wide: bool,
}

/// `GatherElements` along `axis`: `out[i] = data[i with i[axis] = indices[i]]`.
///
/// # Safety
/// The buffers must hold their shapes' elements; `out` overlaps neither input.
pub unsafe fn gather_elements(
    dims: &ElementsDims,
    data: *const u8,
    indices: *const u8,
    out: *mut u8,
) -> Result<(), String> {
    let ElementsDims {
        data: data_dims,
        index: index_dims,
        axis,
        elem,
        wide,
    } = dims;
    let (axis, elem, wide) = (*axis, *elem, *wide);
    let r = index_dims.len();
    let total: usize = index_dims.iter().product();
    if total == 0 {
        return Ok(());
    }
    let strides = CopyPlan::contiguous_strides(data_dims);
    let mut idx = vec![0usize; r];
    for e in 0..total {
        // SAFETY: e < total elements of indices and out; the offset is inside data (every
        // coordinate below its data dim, the indexed one resolved against it).
        unsafe {
            let i = resolve(index_at(indices, wide, e), data_dims[axis])?;
            let mut off = 0isize;
            for a in 0..r {
                let c = if a == axis { i } else { idx[a] };
                off += c as isize * strides[a];
            }
            copy_elem(data.offset(off * elem as isize), out.add(e * elem), elem);
        }
        for a in (0..r).rev() {
            idx[a] += 1;
            if idx[a] < index_dims[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    Ok(())
}

/// How `ScatterND` combines an update with the value it lands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

impl Reduction {
    pub fn parse(s: &str) -> Option<Reduction> {
        Some(match s {
            "none" => Reduction::None,
            "add" => Reduction::Add,
            "mul" => Reduction::Mul,
            "max" => Reduction::Max,
            "min" => Reduction::Min,
            _ => return None,
        })
    }
}

/// A numeric element `ScatterND` can combine, in its own type (f32 adds in f32).
pub trait Combine: Copy {
    fn combine(self, u: Self, how: Reduction) -> Self;
}

macro_rules! combine_int {
    ($($t:ty),*) => {$(
        impl Combine for $t {
            fn combine(self, u: $t, how: Reduction) -> $t {
                match how {
                    Reduction::None => u,
                    Reduction::Add => self.wrapping_add(u),
                    Reduction::Mul => self.wrapping_mul(u),
                    Reduction::Max => self.max(u),
                    Reduction::Min => self.min(u),
                }
            }
        }
    )*};
}
combine_int!(i8, u8, i16, u16, i32, u32, i64, u64);

macro_rules! combine_float {
    ($($t:ty),*) => {$(
        impl Combine for $t {
            fn combine(self, u: $t, how: Reduction) -> $t {
                match how {
                    Reduction::None => u,
                    Reduction::Add => self + u,
                    Reduction::Mul => self * u,
                    Reduction::Max => self.max(u),
                    Reduction::Min => self.min(u),
                }
            }
        }
    )*};
}
combine_float!(f32, f64);

/// `ScatterND` over `out`, which already holds `data` (of shape `data_dims`): each of the
/// `count` index tuples of `k` i64 coordinates names a slice of the trailing
/// `data_dims[k..]`, which receives (or is combined with) its slice of `updates`, in
/// index order. Every tuple is checked before anything is written.
///
/// # Safety
/// `indices` holds `count · k` i64, `updates` `count` slices, `out` the data.
pub unsafe fn scatter_nd<T: Combine>(
    data_dims: &[usize],
    k: usize,
    count: usize,
    how: Reduction,
    indices: *const i64,
    updates: *const T,
    out: *mut T,
) -> Result<(), String> {
    let strides = CopyPlan::contiguous_strides(data_dims);
    let slice: usize = data_dims[k..].iter().product();
    let offset = |p: usize| -> Result<usize, String> {
        let mut off = 0usize;
        for (a, &d) in data_dims.iter().enumerate().take(k) {
            // SAFETY: p < count, a < k.
            let i = unsafe { indices.add(p * k + a).read_unaligned() };
            off += resolve(i, d)? * strides[a] as usize;
        }
        Ok(off)
    };
    for p in 0..count {
        offset(p)?;
    }
    for p in 0..count {
        let at = offset(p)?;
        // SAFETY: the offset and its slice lie inside the data; updates hold count slices.
        unsafe {
            let (u, o) = (updates.add(p * slice), out.add(at));
            if how == Reduction::None {
                std::ptr::copy_nonoverlapping(u, o, slice);
            } else {
                for j in 0..slice {
                    *o.add(j) = (*o.add(j)).combine(*u.add(j), how);
                }
            }
        }
    }
    Ok(())
}

/// `out[i] = src[i]` converted as the interpreter's `Cast` does (through f64 when either
/// side is a float, through i64 otherwise); `out` may be `src`'s buffer when the element
/// sizes are equal (each element is read before it is written).
///
/// # Safety
/// `src` and `out` must hold `len` elements.
pub unsafe fn cast<S: Elem, D: Elem>(src: *const S, out: *mut D, len: usize, pool: Option<&Pool>) {
    let floating = |d: crate::ir::DType| d.is_float() || d.is_minifloat();
    let via_float = floating(S::DTYPE) || floating(D::DTYPE);
    let (s, o) = (SyncPtr(src as *mut S), SyncPtr(out));
    let chunk = 16 * 1024;
    for_ranges(pool, len.div_ceil(chunk), chunk, &|r| {
        for i in r.start * chunk..(r.end * chunk).min(len) {
            // SAFETY: i < len; each range writes its own elements.
            unsafe {
                let v = s.get().add(i).read();
                let w = if via_float {
                    D::from_f64(v.to_f64())
                } else {
                    D::from_i64(v.to_i64())
                };
                o.get().add(i).write(w);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::testutil::pools;
    use super::*;

    /// A transpose, a reversed slice and a broadcast, each against an index-by-index copy.
    #[test]
    fn strided_copies_match_index_arithmetic() {
        let dims = [3usize, 4, 5];
        let src: Vec<u32> = (0..60).collect();
        let cases: Vec<(Vec<usize>, Vec<isize>, isize)> = vec![
            // transpose [2, 0, 1]
            (vec![5, 3, 4], vec![1, 20, 5], 0),
            // x[:, ::-1, 1::2]
            (vec![3, 4, 2], vec![20, -5, 2], 15 + 1),
            // x[0:1, 0:1, :] broadcast over 7 rows
            (vec![7, 5], vec![0, 1], 0),
            // the whole tensor (one row)
            (dims.to_vec(), vec![20, 5, 1], 0),
        ];
        for pool in pools() {
            for (out_dims, strides, base) in &cases {
                let n: usize = out_dims.iter().product();
                let mut got = vec![0u32; n];
                let plan = CopyPlan::new(
                    out_dims,
                    strides,
                    &CopyPlan::contiguous_strides(out_dims),
                    4,
                );
                // SAFETY: the plan stays inside src (checked by the reference below).
                unsafe {
                    plan.run(
                        src.as_ptr().offset(*base) as *const u8,
                        got.as_mut_ptr() as *mut u8,
                        pool.as_ref(),
                    )
                };
                let want: Vec<u32> = (0..n)
                    .map(|o| {
                        let (mut rest, mut off) = (o, *base);
                        for a in (0..out_dims.len()).rev() {
                            off += (rest % out_dims[a]) as isize * strides[a];
                            rest /= out_dims[a];
                        }
                        src[off as usize]
                    })
                    .collect();
                assert_eq!(got, want, "{out_dims:?} {strides:?}");
            }
        }
        let whole = CopyPlan::new(&dims, &[20, 5, 1], &[20, 5, 1], 4);
        assert_eq!(whole.rows(), 1, "a contiguous copy is one row");
    }

    /// Rows longer than two pieces (a channel Concat of whole images): cut into pieces
    /// over the threads, every element where the row-by-row copy puts it.
    #[test]
    fn long_rows_copy_in_pieces() {
        let (rows, len) = (3usize, 40_003usize);
        let src: Vec<u32> = (0..(rows * len) as u32).collect();
        let plan = CopyPlan::new(&[rows, len], &[len as isize, 1], &[2 * len as isize, 1], 4);
        for pool in pools() {
            let mut got = vec![u32::MAX; rows * 2 * len];
            // SAFETY: the plan reads src's rows × len and writes the first half of each of
            // got's rows of 2·len.
            unsafe {
                plan.run(
                    src.as_ptr() as *const u8,
                    got.as_mut_ptr() as *mut u8,
                    pool.as_ref(),
                )
            };
            for r in 0..rows {
                assert_eq!(got[r * 2 * len..][..len], src[r * len..][..len]);
                assert!(got[r * 2 * len + len..][..len]
                    .iter()
                    .all(|&v| v == u32::MAX));
            }
        }
    }

    #[test]
    fn table_copies_fill_and_repeat_rows() {
        let src: Vec<u16> = (0..12).collect(); // 3 x 4
                                               // Rows: fill, 0, 0, 2; columns: 3, 0, 1, 2, 3, fill (wrap-like and constant).
        let tables = vec![vec![FILL, 0, 0, 8], vec![3, 0, 1, 2, 3, FILL]];
        let copy = TableCopy::new(tables, 2);
        let mut got = vec![0u16; 24];
        let value = 99u16.to_le_bytes();
        for pool in pools() {
            // SAFETY: every table offset is inside src; got holds 4 x 6.
            unsafe {
                copy.run(
                    src.as_ptr() as *const u8,
                    got.as_mut_ptr() as *mut u8,
                    &value,
                    pool.as_ref(),
                )
            };
            let row = |r: u16| [r + 3, r, r + 1, r + 2, r + 3, 99];
            let want: Vec<u16> = [[99; 6], row(0), row(0), row(8)].concat();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn gathers_check_indices() {
        let data: Vec<f32> = (0..24).map(|v| v as f32).collect(); // [2, 3, 4]
        let idx: Vec<i64> = vec![2, -3, 1];
        let g = GatherDims {
            outer: 2,
            axis: 3,
            inner: 4,
            indices: 3,
            elem: 4,
            wide: true,
        };
        let mut out = vec![0f32; 24];
        // SAFETY: buffers of the sizes g describes.
        unsafe {
            gather(
                &g,
                data.as_ptr() as *const u8,
                idx.as_ptr() as *const u8,
                out.as_mut_ptr() as *mut u8,
                None,
            )
        }
        .unwrap();
        assert_eq!(&out[..8], &[8., 9., 10., 11., 0., 1., 2., 3.]);
        assert_eq!(&out[12..16], &[20., 21., 22., 23.]);
        let bad: Vec<i64> = vec![0, 3, 0];
        // SAFETY: `bad` has g's 3 indices (one out of range, which gather reports before
        // it copies anything); data and out as in the first call.
        let err = unsafe {
            gather(
                &g,
                data.as_ptr() as *const u8,
                bad.as_ptr() as *const u8,
                out.as_mut_ptr() as *mut u8,
                None,
            )
        };
        assert!(err.unwrap_err().contains("index 3 is out of range"));
    }

    #[test]
    fn casts_follow_the_interpreter() {
        let src = [1.7f32, -1.7, 0.0, -0.0, 3e9, f32::NAN];
        let mut ints = [7i32; 6];
        // SAFETY: 6 elements each.
        unsafe { cast(src.as_ptr(), ints.as_mut_ptr(), 6, None) };
        assert_eq!(ints, [1, -1, 0, 0, i32::MAX, 0]);
        let mut bools = [false; 6];
        // SAFETY: src and bools hold 6 elements each.
        unsafe { cast(src.as_ptr(), bools.as_mut_ptr(), 6, None) };
        assert_eq!(bools, [true, true, false, false, true, true]);
        let big = [u64::MAX, 5];
        let mut narrow = [0u8; 2];
        // SAFETY: 2 elements each.
        unsafe { cast(big.as_ptr(), narrow.as_mut_ptr(), 2, None) };
        assert_eq!(narrow, [255, 5]);
    }
}
