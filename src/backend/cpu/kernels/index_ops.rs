//! Index, scan and structured ops over typed slices, each computing what the
//! interpreter's op computes (in f64 where it does, i64 for integer scans): ArgMax /
//! ArgMin, Trilu, CumSum / CumProd, Hardmax, ReverseSequence, GatherND (on raw element
//! bytes), Det, Einsum, DFT and TfIdfVectorizer. Everything a run needs is laid out at
//! build time; these loops allocate nothing.
use std::cmp::Ordering;
use std::f64::consts::PI;

use crate::tensor::Elem;

/// `shape` as `[outer, n, inner]` around `axis`.
pub fn split3(shape: &[usize], axis: usize) -> [usize; 3] {
    [
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    ]
}

/// ArgMax (`max`) or ArgMin along the middle axis of `x` = `[outer, n, inner]` into `y`
/// = `[outer, inner]`, comparing in f64; ties keep the first index unless `last`.
pub fn arg_reduce<T: Elem>(
    x: &[T],
    y: &mut [i64],
    [outer, n, inner]: [usize; 3],
    max: bool,
    last: bool,
) {
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| x[(o * n + k) * inner + i].to_f64();
            let (mut best, mut bv) = (0, at(0));
            for k in 1..n {
                let v = at(k);
                let better = if max { v > bv } else { v < bv };
                if better || (last && v == bv) {
                    best = k;
                    bv = v;
                }
            }
            y[o * inner + i] = best as i64;
        }
    }
}

/// Trilu over matrices `rows` × `cols`: keeps `j - i >= k` (upper) or `<= k`, zeros
/// elsewhere.
pub fn trilu<T: Elem>(x: &[T], y: &mut [T], rows: usize, cols: usize, k: i64, upper: bool) {
    let m = rows * cols;
    if m == 0 {
        return;
    }
    let zero = T::from_i64(0);
    for (xm, ym) in x.chunks_exact(m).zip(y.chunks_exact_mut(m)) {
        for i in 0..rows {
            for j in 0..cols {
                let d = j as i64 - i as i64;
                let keep = if upper { d >= k } else { d <= k };
                ym[i * cols + j] = if keep { xm[i * cols + j] } else { zero };
            }
        }
    }
}

/// How a [`cumulative`] scan runs.
#[derive(Debug, Clone, Copy)]
pub struct Scan {
    pub product: bool,
    pub exclusive: bool,
    pub reverse: bool,
}

/// CumSum / CumProd along the middle axis of `[outer, n, inner]`: floats accumulate in
/// f64, integers in wrapping i64, as the interpreter does.
pub fn cumulative<T: Elem>(x: &[T], y: &mut [T], [outer, n, inner]: [usize; 3], s: Scan) {
    let float = T::DTYPE.is_float();
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * n + k) * inner + i;
            let (mut accf, mut acci) = if s.product { (1.0, 1i64) } else { (0.0, 0i64) };
            for step in 0..n {
                let k = if s.reverse { n - 1 - step } else { step };
                let v = x[at(k)];
                y[at(k)] = if float {
                    let next = if s.product {
                        accf * v.to_f64()
                    } else {
                        accf + v.to_f64()
                    };
                    let out = if s.exclusive { accf } else { next };
                    accf = next;
                    T::from_f64(out)
                } else {
                    let next = if s.product {
                        acci.wrapping_mul(v.to_i64())
                    } else {
                        acci.wrapping_add(v.to_i64())
                    };
                    let out = if s.exclusive { acci } else { next };
                    acci = next;
                    T::from_i64(out)
                };
            }
        }
    }
}

/// Hardmax along the middle axis of `[outer, n, inner]`: 1 at the first maximum, 0
/// elsewhere (a lane of NaNs only is all zeros).
pub fn hardmax<T: Elem>(x: &[T], y: &mut [T], [outer, n, inner]: [usize; 3]) {
    let (one, zero) = (T::from_f64(1.0), T::from_f64(0.0));
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * n + k) * inner + i;
            let max = (0..n).fold(f64::NEG_INFINITY, |m, k| m.max(x[at(k)].to_f64()));
            let first = (0..n).find(|&k| x[at(k)].to_f64() == max);
            for k in 0..n {
                y[at(k)] = if Some(k) == first { one } else { zero };
            }
        }
    }
}

/// ReverseSequence on `[d0, d1, inner]` (`batch_first`: d0 is the batch axis, else d1):
/// each batch entry's first `lens[b]` time steps reversed. `lens` were checked.
pub fn reverse_sequence<T: Copy>(
    x: &[T],
    y: &mut [T],
    [d0, d1, inner]: [usize; 3],
    batch_first: bool,
    lens: &[i64],
) {
    for a in 0..d0 {
        for c in 0..d1 {
            let (b, t) = if batch_first { (a, c) } else { (c, a) };
            let len = lens[b] as usize;
            let st = if t < len { len - 1 - t } else { t };
            let (sa, sc) = if batch_first { (a, st) } else { (st, c) };
            let (src, dst) = ((sa * d1 + sc) * inner, (a * d1 + c) * inner);
            y[dst..dst + inner].copy_from_slice(&x[src..src + inner]);
        }
    }
}

/// The sizes of a [`gather_nd`] (element counts; `elem` bytes each).
#[derive(Debug, Clone)]
pub struct GatherNd {
    /// Batch entries (the product of the first `batch_dims` axes).
    pub batch: usize,
    /// Index tuples per batch entry and their length.
    pub tuples: usize,
    pub k: usize,
    /// Data elements per batch entry, per gathered slice, and the dims the tuple's
    /// entries index with their strides (in elements).
    pub batch_len: usize,
    pub slice: usize,
    pub dims: Vec<usize>,
    pub strides: Vec<usize>,
    pub elem: usize,
}

/// GatherND on element bytes; every index is checked before anything is written.
pub fn gather_nd<I: Elem>(g: &GatherNd, x: &[u8], idx: &[I], y: &mut [u8]) -> Result<(), String> {
    let resolve = |v: i64, d: usize| -> Result<usize, String> {
        let j = if v < 0 { v + d as i64 } else { v };
        if (0..d as i64).contains(&j) {
            Ok(j as usize)
        } else {
            Err(format!("index {v} is out of range for an axis of size {d}"))
        }
    };
    for (j, v) in idx.iter().enumerate() {
        resolve(v.to_i64(), g.dims[j % g.k.max(1)])?;
    }
    let row = g.slice * g.elem;
    for b in 0..g.batch {
        for t in 0..g.tuples {
            let tuple = &idx[(b * g.tuples + t) * g.k..][..g.k];
            let mut off = b * g.batch_len;
            for (j, v) in tuple.iter().enumerate() {
                off += resolve(v.to_i64(), g.dims[j])? * g.strides[j];
            }
            let dst = (b * g.tuples + t) * row;
            y[dst..dst + row].copy_from_slice(&x[off * g.elem..off * g.elem + row]);
        }
    }
    Ok(())
}

/// The determinant of each `m` × `m` matrix of `x` into `y`, by LU with partial
/// pivoting in f64 (`work`: m·m f64), as the interpreter computes it.
pub fn det<T: Elem>(x: &[T], y: &mut [T], m: usize, work: &mut [f64]) {
    if m == 0 {
        y.fill(T::from_f64(1.0));
        return;
    }
    for (xm, out) in x.chunks_exact(m * m).zip(y.iter_mut()) {
        for (w, v) in work.iter_mut().zip(xm) {
            *w = v.to_f64();
        }
        *out = T::from_f64(crate::ir::ops::matmul::determinant(work, m));
    }
}

/// An Einsum as a loop over every label combination: per label its extent, and per
/// operand (and the output) its stride for that label (0 where it broadcasts or is
/// absent).
#[derive(Debug, Clone)]
pub struct Contraction {
    pub sizes: Vec<usize>,
    pub strides: Vec<Vec<usize>>,
    pub out_strides: Vec<usize>,
}

/// Runs `c` into `acc` (the output's elements, f64) from the operands as f64.
pub fn contract<T: Elem>(c: &Contraction, ops: &[&[T]], acc: &mut [f64]) {
    acc.fill(0.0);
    let total: usize = c.sizes.iter().product();
    for flat in 0..total {
        let mut rem = flat;
        let mut out = 0;
        let mut prod = 1.0;
        let mut offs = [0usize; 16];
        for l in (0..c.sizes.len()).rev() {
            let i = rem % c.sizes[l];
            rem /= c.sizes[l];
            out += i * c.out_strides[l];
            for (o, s) in offs.iter_mut().zip(&c.strides) {
                *o += i * s[l];
            }
        }
        for (d, &o) in ops.iter().zip(&offs) {
            prod *= d[o].to_f64();
        }
        acc[out] += prod;
    }
}

/// The most operands [`contract`] takes.
pub(crate) const MAX_EINSUM_OPERANDS: usize = 16;

/// A DFT's geometry: the signal is `[pre, size, post, parts]`, the output `[pre, bins,
/// post, out_parts]`, the transform of length `n`.
#[derive(Debug, Clone, Copy)]
pub struct Dft {
    pub pre: usize,
    pub size: usize,
    pub post: usize,
    pub parts: usize,
    pub n: usize,
    pub bins: usize,
    pub inverse: bool,
    /// Inverse of a one-sided spectrum: a real signal out.
    pub real_out: bool,
}

/// `cos` and `sin` of `2 pi m / n` for `m` in `0..n`.
pub fn twiddles(n: usize) -> Vec<(f64, f64)> {
    (0..n)
        .map(|m| {
            let a = 2.0 * PI * m as f64 / n as f64;
            (a.cos(), a.sin())
        })
        .collect()
}

/// The DFT of `x` into `y`, as the interpreter's direct sums; `tw(m)` is
/// `(cos, sin)(2 pi m / n)` for `m < n`.
pub fn dft<T: Elem>(d: &Dft, x: &[T], y: &mut [T], tw: &dyn Fn(usize) -> (f64, f64)) {
    let n = d.n;
    let op = if d.real_out { 1 } else { 2 };
    for p in 0..d.pre {
        for q in 0..d.post {
            let bin = |i: usize| -> (f64, f64) {
                if i >= d.size {
                    return (0.0, 0.0);
                }
                let at = ((p * d.size + i) * d.post + q) * d.parts;
                let im = if d.parts == 2 {
                    x[at + 1].to_f64()
                } else {
                    0.0
                };
                (x[at].to_f64(), im)
            };
            let out = |k: usize| ((p * d.bins + k) * d.post + q) * op;
            if d.real_out {
                let half = n / 2 + 1;
                for t in 0..n {
                    let mut sum = bin(0).0;
                    for k in 1..half {
                        let (re, im) = bin(k);
                        let (c, s) = tw((k * t) % n);
                        let term = re * c - im * s;
                        sum += if n.is_multiple_of(2) && k == n / 2 {
                            term
                        } else {
                            2.0 * term
                        };
                    }
                    y[out(t)] = T::from_f64(sum / n as f64);
                }
                continue;
            }
            let sign = if d.inverse { 1.0 } else { -1.0 };
            let norm = if d.inverse { n as f64 } else { 1.0 };
            for k in 0..d.bins {
                let (mut re, mut im) = (0.0, 0.0);
                for t in 0..d.size.min(n) {
                    let (xr, xi) = bin(t);
                    let (c, s) = tw((k * t) % n);
                    let s = sign * s;
                    re += xr * c - xi * s;
                    im += xr * s + xi * c;
                }
                let o = out(k);
                y[o] = T::from_f64(re / norm);
                y[o + 1] = T::from_f64(im / norm);
            }
        }
    }
}

/// TfIdfVectorizer's pool: per n-gram length (index n-1) its n-grams sorted, each with
/// its output column.
#[derive(Debug, Clone)]
pub struct NGrams {
    pub grams: Vec<Vec<(Vec<i64>, usize)>>,
    pub columns: usize,
    pub min: usize,
    pub max: usize,
    pub max_skip: usize,
    /// 0 TF, 1 IDF, 2 TFIDF.
    pub mode: u8,
    pub weights: Vec<f64>,
}

/// Counts `g`'s n-grams in each row of `x` (`rows` × `width`) into `y` (`rows` ×
/// columns), then weighs them by the mode.
pub fn tf_idf<T: Elem>(g: &NGrams, x: &[T], rows: usize, width: usize, y: &mut [f32]) {
    y.fill(0.0);
    if g.columns == 0 {
        return;
    }
    for r in 0..rows {
        let row = &x[r * width..(r + 1) * width];
        let counts = &mut y[r * g.columns..(r + 1) * g.columns];
        for skip in 1..=g.max_skip + 1 {
            let smallest = if skip > 1 { g.min.max(2) } else { g.min };
            for start in 0..row.len() {
                for n in smallest..=g.max {
                    if start + skip * (n - 1) >= row.len() {
                        break;
                    }
                    let Some(pool) = g.grams.get(n - 1) else {
                        continue;
                    };
                    let key = (0..n).map(|k| row[start + skip * k].to_i64());
                    let found = pool.binary_search_by(|(gram, _)| -> Ordering {
                        gram.iter().copied().cmp(key.clone())
                    });
                    if let Ok(i) = found {
                        counts[pool[i].1] += 1.0;
                    }
                }
            }
        }
    }
    let weight = |c: usize| g.weights.get(c).copied().unwrap_or(1.0);
    for (i, v) in y.iter_mut().enumerate() {
        let c = i % g.columns;
        let n = *v as f64;
        *v = match g.mode {
            0 => n,
            1 if n > 0.0 => weight(c),
            1 => 0.0,
            _ => n * weight(c),
        } as f32;
    }
}
