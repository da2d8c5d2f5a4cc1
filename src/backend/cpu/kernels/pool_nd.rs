//! MaxPool (with Indices), AveragePool and LpPool over any number of spatial axes and
//! every dtype they take, as the interpreter computes them (in f64): each output
//! position's taps inside the input are listed at build time ([`PoolTable`]), so a run
//! is one pass over the planes with no index arithmetic beyond a table walk. Covers
//! what the f32 2-D kernels of [`super::pooling`] do not: 1-D and 3-D, auto_pad,
//! dilations, ceil_mode, count_include_pad, storage_order, integer MaxPool.
use crate::ir::ops::conv::Window;
use crate::tensor::Elem;

/// Which pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NdKind {
    Max,
    Average {
        include_pad: bool,
    },
    /// The p-norm of the window.
    Lp(f64),
}

/// Per output position (row-major over the output's spatial axes), its taps inside the
/// input: the input's row-major spatial offset, and the offset Indices reports.
#[derive(Debug, Clone)]
pub struct PoolTable {
    pub starts: Vec<usize>,
    pub taps: Vec<u32>,
    /// Indices' offsets with the spatial axes column-major (storage_order 1), else empty.
    pub col_taps: Vec<u32>,
    /// Per output position, the taps on explicit padding (AveragePool's
    /// count_include_pad counts them as zeros).
    pub pad_taps: Vec<u32>,
    /// Elements per input and output plane.
    pub in_plane: usize,
    pub out_plane: usize,
}

/// Whether tap `k` at output `o` falls within the input or its explicit padding.
fn within_padding(w: &Window, o: usize, k: usize, n: usize) -> bool {
    let p = (o * w.stride + k * w.dilation) as i64 - w.pad_begin as i64;
    p >= -(w.pad_begin as i64) && p < (n + w.pad_end) as i64
}

/// Steps a row-major multi-index within `extents`; false after the last one.
fn next(index: &mut [usize], extents: &[usize]) -> bool {
    for d in (0..index.len()).rev() {
        index[d] += 1;
        if index[d] < extents[d] {
            return true;
        }
        index[d] = 0;
    }
    false
}

impl PoolTable {
    /// The table of windows `wins` over spatial dims `input` with outputs `output`;
    /// `None` when an offset does not fit 32 bits.
    pub fn new(
        wins: &[Window],
        input: &[usize],
        output: &[usize],
        col_major: bool,
    ) -> Option<PoolTable> {
        let in_plane: usize = input.iter().product();
        let out_plane: usize = output.iter().product();
        if in_plane > u32::MAX as usize {
            return None;
        }
        let kernel: Vec<usize> = wins.iter().map(|w| w.kernel).collect();
        let mut t = PoolTable {
            starts: vec![0],
            taps: vec![],
            col_taps: vec![],
            pad_taps: vec![],
            in_plane,
            out_plane,
        };
        if out_plane == 0 {
            return Some(t);
        }
        let k = wins.len();
        let mut o = vec![0; k];
        loop {
            let mut tap = vec![0; k];
            let mut pads = 0;
            loop {
                let (mut off, mut col, mut col_stride, mut inside, mut in_pad) =
                    (0usize, 0usize, 1usize, true, true);
                for d in 0..k {
                    match wins[d].source(o[d], tap[d], input[d]) {
                        Some(p) => {
                            off = off * input[d] + p;
                            col += p * col_stride;
                            col_stride *= input[d];
                        }
                        None => {
                            inside = false;
                            in_pad &= within_padding(&wins[d], o[d], tap[d], input[d]);
                        }
                    }
                }
                if inside {
                    t.taps.push(off as u32);
                    if col_major {
                        t.col_taps.push(col as u32);
                    }
                } else if in_pad {
                    pads += 1;
                }
                if !next(&mut tap, &kernel) {
                    break;
                }
            }
            t.pad_taps.push(pads);
            t.starts.push(t.taps.len());
            if !next(&mut o, output) {
                break;
            }
        }
        Some(t)
    }
}

/// The pool of planes `planes` of `x` (all of it) into `y` (and the flat input index of
/// each maximum into `indices`, for MaxPool), which hold just those planes.
pub fn pool_nd<T: Elem>(
    kind: NdKind,
    t: &PoolTable,
    planes: std::ops::Range<usize>,
    x: &[T],
    y: &mut [T],
    mut indices: Option<&mut [i64]>,
) {
    let first = planes.start;
    for p in planes {
        let xs = &x[p * t.in_plane..(p + 1) * t.in_plane];
        for o in 0..t.out_plane {
            let (from, to) = (t.starts[o], t.starts[o + 1]);
            let taps = &t.taps[from..to];
            let at = (p - first) * t.out_plane + o;
            y[at] = T::from_f64(match kind {
                NdKind::Max => {
                    let (mut best, mut best_at) = (f64::NEG_INFINITY, None);
                    for (j, &tap) in taps.iter().enumerate() {
                        let v = xs[tap as usize].to_f64();
                        if v > best || best_at.is_none() {
                            best = v;
                            best_at = Some(j);
                        }
                    }
                    if let Some(ix) = indices.as_deref_mut() {
                        ix[at] = best_at.map_or(0, |j| {
                            let off = if t.col_taps.is_empty() {
                                taps[j]
                            } else {
                                t.col_taps[from + j]
                            };
                            (p * t.in_plane + off as usize) as i64
                        });
                    }
                    best
                }
                NdKind::Average { include_pad } => {
                    let sum: f64 = taps.iter().map(|&tap| xs[tap as usize].to_f64()).sum();
                    let pads = if include_pad {
                        t.pad_taps[o] as usize
                    } else {
                        0
                    };
                    let count = taps.len() + pads;
                    if count == 0 {
                        f64::NAN
                    } else {
                        sum / count as f64
                    }
                }
                NdKind::Lp(q) => taps
                    .iter()
                    .map(|&tap| xs[tap as usize].to_f64().abs().powf(q))
                    .sum::<f64>()
                    .powf(1.0 / q),
            });
        }
    }
}
