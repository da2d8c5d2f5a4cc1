//! Kernels on any float dtype that compute in f64 as the reference interpreter does,
//! element for element: `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss` over
//! [N, C, d...] (weights, `ignore_index`, every reduction), `GridSample` (nearest,
//! linear, cubic; zeros, border, reflection padding; up to [`MAX_AXES`] spatial axes)
//! and `Dropout` (its counter-based mask, see `crate::ir::ops::random`).
use super::loss::LossReduction;
use crate::ir::ops::grid_sample::reflect;
use crate::tensor::Elem;

/// The NLL of [N, C, inner] scores (log-probabilities, or raw scores whose LogSoftmax
/// over C is taken first when `softmax`) against [N, inner] targets.
#[derive(Debug, Clone)]
pub struct Nll {
    pub n: usize,
    pub classes: usize,
    pub inner: usize,
    pub reduction: LossReduction,
    pub ignore_index: Option<i64>,
    pub softmax: bool,
}

impl Nll {
    /// Writes `loss` ([N, inner] for no reduction, else one value) and, with `softmax`,
    /// the log-probabilities into `log_prob` when given. A target out of range (and not
    /// `ignore_index`) is an error.
    pub fn run<T: Elem, L: Elem>(
        &self,
        x: &[T],
        target: &[L],
        weight: Option<&[T]>,
        loss: &mut [T],
        mut log_prob: Option<&mut [T]>,
    ) -> Result<(), String> {
        let (c, inner) = (self.classes, self.inner);
        let (mut sum, mut weights) = (0.0f64, 0.0f64);
        for n in 0..self.n {
            for d in 0..inner {
                let base = n * c * inner + d;
                let v = |k: usize| x[base + k * inner].to_f64();
                let lse = if self.softmax {
                    let max = (0..c).fold(f64::NEG_INFINITY, |m, k| m.max(v(k)));
                    let lse = (0..c).map(|k| (v(k) - max).exp()).sum::<f64>().ln() + max;
                    if let Some(lp) = log_prob.as_deref_mut() {
                        for k in 0..c {
                            lp[base + k * inner] = T::from_f64(v(k) - lse);
                        }
                    }
                    lse
                } else {
                    0.0
                };
                let at = n * inner + d;
                let t = target[at].to_i64();
                let (l, w) = if Some(t) == self.ignore_index {
                    (0.0, 0.0)
                } else {
                    if t < 0 || t as usize >= c {
                        return Err(format!("target {t} is out of range for {c} classes"));
                    }
                    let w = weight.map_or(1.0, |w| w[t as usize].to_f64());
                    let logp = if self.softmax {
                        v(t as usize) - lse
                    } else {
                        v(t as usize)
                    };
                    (-logp * w, w)
                };
                match self.reduction {
                    LossReduction::None => loss[at] = T::from_f64(l),
                    _ => {
                        sum += l;
                        weights += w;
                    }
                }
            }
        }
        match self.reduction {
            LossReduction::None => {}
            LossReduction::Sum => loss[0] = T::from_f64(sum),
            LossReduction::Mean => loss[0] = T::from_f64(sum / weights),
        }
        Ok(())
    }
}

/// The most spatial axes [`GridSample`] takes.
pub(crate) const MAX_AXES: usize = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GridMode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GridPadding {
    Zeros,
    Border,
    Reflection,
}

/// `GridSample` of X [N, C, dims...] at grid [N, points..., r] into Y [N, C, points...].
#[derive(Debug, Clone)]
pub struct GridSample {
    pub mode: GridMode,
    pub padding: GridPadding,
    pub align_corners: bool,
    pub n: usize,
    pub channels: usize,
    /// X's spatial extents (at most [`MAX_AXES`]).
    pub dims: Vec<usize>,
    /// Output points per image.
    pub points: usize,
}

/// Keys' cubic convolution weights (a = -0.75 here) of the four taps around `t`.
fn cubic_weights(t: f64, a: f64) -> [f64; 4] {
    let far = |x: f64| ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    let near = |x: f64| ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

impl GridSample {
    /// Samples `x` at `grid` (its coordinates as f64) into `y`.
    pub fn run<T: Elem>(&self, x: &[T], grid: &[f64], y: &mut [T]) {
        let r = self.dims.len();
        let dims = &self.dims;
        let plane: usize = dims.iter().product();
        let mut strides = [0usize; MAX_AXES];
        let mut s = 1;
        for i in (0..r).rev() {
            strides[i] = s;
            s *= dims[i];
        }
        let bounds = |i: usize| {
            let d = dims[i] as f64;
            if self.align_corners {
                (0.0, d - 1.0)
            } else {
                (-0.5, d - 0.5)
            }
        };
        // Per axis: the taps' element offsets (None: a zero pad) and weights.
        let mut taps = [[(None::<usize>, 0.0f64); 4]; MAX_AXES];
        let mut counts = [0usize; MAX_AXES];
        for n in 0..self.n {
            for p in 0..self.points {
                let g = &grid[(n * self.points + p) * r..][..r];
                for i in 0..r {
                    let v = g[r - 1 - i];
                    let len = dims[i] as f64;
                    let mut v = if self.align_corners {
                        (v + 1.0) / 2.0 * (len - 1.0)
                    } else {
                        ((v + 1.0) * len - 1.0) / 2.0
                    };
                    if self.mode == GridMode::Nearest {
                        v = v.round_ties_even();
                    }
                    let (lo, hi) = bounds(i);
                    if v < lo || v > hi {
                        match self.padding {
                            GridPadding::Border => v = v.clamp(0.0, len - 1.0),
                            GridPadding::Reflection => v = reflect(v, lo, hi),
                            GridPadding::Zeros => {}
                        }
                    }
                    let base = v.floor();
                    let t = v - base;
                    let b = base as i64;
                    let mut axis = [(0i64, 0.0f64); 4];
                    let count = match self.mode {
                        GridMode::Nearest => {
                            axis[0] = (v as i64, 1.0);
                            1
                        }
                        GridMode::Linear => {
                            axis[0] = (b, 1.0 - t);
                            axis[1] = (b + 1, t);
                            2
                        }
                        GridMode::Cubic => {
                            let w = cubic_weights(t, -0.75);
                            for (k, tap) in axis.iter_mut().enumerate() {
                                *tap = (b - 1 + k as i64, w[k]);
                            }
                            4
                        }
                    };
                    let d = dims[i] as i64;
                    for k in 0..count {
                        let (idx, w) = axis[k];
                        let idx = match self.padding {
                            GridPadding::Zeros if idx < 0 || idx >= d => None,
                            GridPadding::Zeros => Some(idx),
                            GridPadding::Border => Some(idx.clamp(0, d - 1)),
                            GridPadding::Reflection => {
                                Some((reflect(idx as f64, lo, hi) as i64).clamp(0, d - 1))
                            }
                        };
                        taps[i][k] = (idx.map(|j| j as usize * strides[i]), w);
                    }
                    counts[i] = count;
                }
                for c in 0..self.channels {
                    let image = &x[(n * self.channels + c) * plane..][..plane];
                    let mut sum = 0.0;
                    let mut combo = [0usize; MAX_AXES];
                    'tap: loop {
                        let mut weight = 1.0;
                        let mut at = 0;
                        let mut inside = true;
                        for i in 0..r {
                            let (off, w) = taps[i][combo[i]];
                            weight *= w;
                            match off {
                                Some(o) => at += o,
                                None => {
                                    inside = false;
                                    break;
                                }
                            }
                        }
                        if inside {
                            sum += weight * image[at].to_f64();
                        }
                        // The next combination, the last axis fastest.
                        let mut i = r;
                        loop {
                            if i == 0 {
                                break 'tap;
                            }
                            i -= 1;
                            combo[i] += 1;
                            if combo[i] < counts[i] {
                                break;
                            }
                            combo[i] = 0;
                        }
                    }
                    y[(n * self.channels + c) * self.points + p] = T::from_f64(sum);
                }
            }
        }
    }
}

/// `Dropout`: in training (`train` = the stream key and ratio), y = x · mask / (1 −
/// ratio) with mask[i] = `keep(key, i, ratio)` and a dropped element x · 0 (NaN stays
/// NaN); otherwise y = x and the mask all true.
pub fn dropout<T: Elem>(
    x: &[T],
    y: &mut [T],
    mask: Option<&mut [bool]>,
    train: Option<(u64, f64)>,
) {
    use crate::ir::ops::random::keep;
    match train {
        None => {
            y.copy_from_slice(x);
            if let Some(m) = mask {
                m.fill(true);
            }
        }
        Some((key, ratio)) => {
            let scale = 1.0 / (1.0 - ratio);
            let mut mask = mask;
            for (i, (o, &v)) in y.iter_mut().zip(x).enumerate() {
                let k = keep(key, i as u64, ratio);
                let v = v.to_f64();
                *o = T::from_f64(if k { v * scale } else { v * 0.0 });
                if let Some(m) = mask.as_deref_mut() {
                    m[i] = k;
                }
            }
        }
    }
}
