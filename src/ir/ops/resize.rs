//! Resize (ONNX 19): nearest, linear and cubic interpolation over any axes, every
//! coordinate transformation mode, antialiasing, `keep_aspect_ratio_policy`.
//!
//! The reference is separable, one 1-D pass per resized axis in f64, and chooses
//! neighbours and weights exactly as the ONNX reference implementation does.
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, Axis, IxDyn};

use super::util::remap;
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::{AttrKind, Attrs, DType, Dim, TensorType};
use crate::match_tensor;
use crate::tensor::{Elem, Tensor};

struct Resize;

const RESIZE: OpSchema = OpSchema {
    name: "Resize",
    family: "resize",
    inputs: &["X", "roi?", "scales?", "sizes?"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("antialias", AttrKind::Int, "0"),
        AttrSpec::opt("axes", AttrKind::Ints, "all axes"),
        AttrSpec::opt(
            "coordinate_transformation_mode",
            AttrKind::String,
            "half_pixel",
        ),
        AttrSpec::opt("cubic_coeff_a", AttrKind::Float, "-0.75"),
        AttrSpec::opt("exclude_outside", AttrKind::Int, "0"),
        AttrSpec::opt("extrapolation_value", AttrKind::Float, "0"),
        AttrSpec::opt("keep_aspect_ratio_policy", AttrKind::String, "stretch"),
        AttrSpec::opt("mode", AttrKind::String, "nearest"),
        AttrSpec::opt("nearest_mode", AttrKind::String, "round_prefer_floor"),
    ],
    doc: "Resizes X by `scales` (output = floor(in * scale)) or to `sizes` (one of the two, \
          per axis in `axes`), interpolating with `mode` nearest | linear | cubic. \
          coordinate_transformation_mode: half_pixel, half_pixel_symmetric, \
          pytorch_half_pixel, align_corners, asymmetric, tf_crop_and_resize (with roi \
          [starts..., ends...] and extrapolation_value). Integer outputs round half to \
          even and saturate.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// What one Resize does to each axis: its scale and output size.
struct Plan {
    axes: Vec<usize>,
    scales: Vec<f64>,
    sizes: Vec<usize>,
}

fn axes_attr(attrs: &Attrs, rank: usize) -> Result<Vec<usize>, String> {
    match attrs.ints("axes")? {
        None => Ok((0..rank).collect()),
        Some(a) => {
            let mut out = vec![];
            for &x in a {
                let ax = crate::ir::shape::norm_axis(x, rank)?;
                if out.contains(&ax) {
                    return Err(format!("axis {x} is repeated in axes"));
                }
                out.push(ax);
            }
            Ok(out)
        }
    }
}

/// The per-axis scales and sizes from `scales` or `sizes`, as the ONNX reference
/// derives them.
fn plan(
    attrs: &Attrs,
    input: &[usize],
    scales: Option<&[f64]>,
    sizes: Option<&[i64]>,
) -> Result<Plan, String> {
    let r = input.len();
    let axes = axes_attr(attrs, r)?;
    let mut all_scales = vec![1.0; r];
    let mut all_sizes = input.to_vec();
    match (scales, sizes) {
        (Some(s), None) => {
            if s.len() != axes.len() {
                return Err(format!(
                    "scales has {} values for {} axes",
                    s.len(),
                    axes.len()
                ));
            }
            for (&a, &v) in axes.iter().zip(s) {
                if v.is_nan() || v <= 0.0 || v.is_infinite() {
                    return Err(format!("scales must be positive, got {v}"));
                }
                all_scales[a] = v;
                let n = (v * input[a] as f64).floor();
                all_sizes[a] = n as usize;
            }
        }
        (None, Some(s)) => {
            if s.len() != axes.len() {
                return Err(format!(
                    "sizes has {} values for {} axes",
                    s.len(),
                    axes.len()
                ));
            }
            for (&a, &v) in axes.iter().zip(s) {
                if v < 0 {
                    return Err(format!("sizes must not be negative, got {v}"));
                }
                all_sizes[a] = v as usize;
                all_scales[a] = v as f64 / input[a] as f64;
            }
            let policy = attrs.string_or("keep_aspect_ratio_policy", "stretch")?;
            let pick = match policy {
                "stretch" => None,
                "not_larger" => Some(f64::min as fn(f64, f64) -> f64),
                "not_smaller" => Some(f64::max as fn(f64, f64) -> f64),
                p => return Err(format!("unknown keep_aspect_ratio_policy '{p}'")),
            };
            if let Some(pick) = pick {
                let scale = axes
                    .iter()
                    .map(|&a| all_scales[a])
                    .reduce(pick)
                    .unwrap_or(1.0);
                for &a in &axes {
                    all_scales[a] = scale;
                    all_sizes[a] = (scale * input[a] as f64 + 0.5) as usize;
                }
            }
        }
        (Some(_), Some(_)) => return Err("give scales or sizes, not both".into()),
        (None, None) => return Err("scales or sizes is required".into()),
    }
    super::util::check_size(&all_sizes)?;
    Ok(Plan {
        axes,
        scales: all_scales,
        sizes: all_sizes,
    })
}

/// `scales`/`sizes` operands; an empty tensor counts as absent (ONNX's "" placeholder
/// of older exporters).
fn operands(
    scales: Option<&Tensor>,
    sizes: Option<&Tensor>,
) -> (Option<Vec<f64>>, Option<Vec<i64>>) {
    (
        scales.filter(|t| !t.is_empty()).map(|t| t.to_f64_vec()),
        sizes.filter(|t| !t.is_empty()).map(|t| t.to_i64_vec()),
    )
}

impl Op for Resize {
    fn schema(&self) -> &OpSchema {
        &RESIZE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        if !x.dtype.is_numeric() {
            return Err(format!("X must be numeric, got {}", x.dtype));
        }
        mode_settings(cx.attrs)?;
        if let Some(s) = cx.opt_input(2) {
            if !s.dtype.is_float() || s.rank() != 1 {
                return Err(format!("scales must be a float vector, got {s}"));
            }
        }
        if let Some(s) = cx.opt_input(3) {
            if s.dtype != DType::I64 || s.rank() != 1 {
                return Err(format!("sizes must be an i64 vector, got {s}"));
            }
        }
        let axes = axes_attr(cx.attrs, x.rank())?;
        let mut shape = x.shape.clone();
        let known = |i: usize| cx.opt_input(i).is_none() || cx.const_input(i).is_some();
        let input = x.static_dims();
        match input {
            Some(input) if known(2) && known(3) => {
                let (s, z) = operands(cx.const_input(2), cx.const_input(3));
                let p = plan(cx.attrs, &input, s.as_deref(), z.as_deref())?;
                for &a in &p.axes {
                    shape.axes[a].dim = Dim::Fixed(p.sizes[a]);
                    shape.axes[a].name = None;
                }
            }
            _ => {
                for &a in &axes {
                    shape.axes[a].dim = cx.fresh_dim(0, a);
                    shape.axes[a].name = None;
                }
            }
        }
        Ok(vec![TensorType::new(x.dtype, shape)])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let xt = cx.input(0)?;
        let r = xt.rank();
        let taps = resize_taps(
            cx.attrs,
            xt.shape(),
            cx.opt_input(1),
            cx.opt_input(2),
            cx.opt_input(3),
        )?;
        if let Some(y) = gather_nearest(xt, &taps.axes, taps.extrapolation)? {
            return Ok(vec![y]);
        }
        let mut y = xt.to_f64_array();
        for (a, t) in &taps.axes {
            y = interpolate_axis(&y, *a, t, taps.extrapolation);
        }
        debug_assert_eq!(y.ndim(), r);
        let d = xt.dtype();
        if d.is_float() {
            return Ok(vec![Tensor::from_f64_array(d, y)]);
        }
        let (lo, hi) = super::quant::range(d);
        // Cast from f64, not through i64: u64 values above 2^63 stay.
        let y = y.mapv(|v| v.round_ties_even().clamp(lo, hi));
        Ok(vec![Tensor::from_f64_array(d, y)])
    }
}

/// How Resize and GridSample interpolate.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Mode {
    Nearest,
    Linear,
    Cubic,
}

/// The `mode` attribute (`default` when absent).
pub(super) fn interpolation_mode(attrs: &Attrs, default: &str) -> Result<Mode, String> {
    Ok(match attrs.string_or("mode", default)? {
        "nearest" => Mode::Nearest,
        "linear" => Mode::Linear,
        "cubic" => Mode::Cubic,
        m => return Err(format!("mode must be nearest, linear or cubic, got '{m}'")),
    })
}

/// Keys' cubic convolution weights (coefficient `a`) of the four taps around a point
/// `t` past a pixel (t = 1 on a pixel).
pub(super) fn cubic_weights(t: f64, a: f64) -> [f64; 4] {
    let far = |x: f64| ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    let near = |x: f64| ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

#[derive(Clone, Copy, PartialEq)]
enum Nearest {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
}

struct Settings<'a> {
    mode: Mode,
    nearest: Nearest,
    transform: &'a str,
    antialias: bool,
    cubic_a: f64,
    exclude_outside: bool,
    extrapolation: f64,
}

fn mode_settings(attrs: &Attrs) -> Result<Settings<'_>, String> {
    let mode = interpolation_mode(attrs, "nearest")?;
    let nearest = match attrs.string_or("nearest_mode", "round_prefer_floor")? {
        "round_prefer_floor" => Nearest::RoundPreferFloor,
        "round_prefer_ceil" => Nearest::RoundPreferCeil,
        "floor" => Nearest::Floor,
        "ceil" => Nearest::Ceil,
        m => return Err(format!("unknown nearest_mode '{m}'")),
    };
    let transform = attrs.string_or("coordinate_transformation_mode", "half_pixel")?;
    if !matches!(
        transform,
        "half_pixel"
            | "half_pixel_symmetric"
            | "pytorch_half_pixel"
            | "align_corners"
            | "asymmetric"
            | "tf_crop_and_resize"
    ) {
        return Err(format!(
            "unknown coordinate_transformation_mode '{transform}'"
        ));
    }
    let antialias = attrs.int_or("antialias", 0)? != 0;
    if antialias && mode == Mode::Nearest {
        return Err("antialias applies to linear and cubic modes only".into());
    }
    Ok(Settings {
        mode,
        nearest,
        transform,
        antialias,
        cubic_a: attrs.float_or("cubic_coeff_a", -0.75)?,
        exclude_outside: attrs.int_or("exclude_outside", 0)? != 0,
        extrapolation: attrs.float_or("extrapolation_value", 0.0)?,
    })
}

/// The interpolation weights of the neighbours of a point `ratio` past an input index
/// (`ratio` is 1 for a point on an index).
fn coefficients(s: &Settings, ratio: f64, scale: f64) -> Vec<f64> {
    let a = s.cubic_a;
    let on_index = ratio == ratio.trunc();
    match s.mode {
        Mode::Nearest => {
            if on_index {
                return vec![0.0, 1.0];
            }
            let upper = match s.nearest {
                Nearest::RoundPreferFloor => ratio > 0.5,
                Nearest::RoundPreferCeil => ratio >= 0.5,
                Nearest::Floor => false,
                Nearest::Ceil => true,
            };
            vec![(!upper) as u8 as f64, upper as u8 as f64]
        }
        Mode::Linear if !s.antialias => vec![1.0 - ratio, ratio],
        Mode::Linear => {
            let scale = scale.min(1.0);
            let start = (-1.0 / scale).floor() as i64 + 1;
            let footprint = 2 - 2 * start;
            let c: Vec<f64> = (start..start + footprint)
                .map(|i| (1.0 - ((i as f64 - ratio) * scale).abs()).clamp(0.0, 1.0))
                .collect();
            normalized(c)
        }
        Mode::Cubic if !s.antialias => cubic_weights(ratio, a).to_vec(),
        Mode::Cubic => {
            let scale = scale.min(1.0);
            let kernel = |x: f64| {
                let x = x.abs();
                let (x2, x3) = (x * x, x * x * x);
                if x <= 1.0 {
                    (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
                } else if x < 2.0 {
                    a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
                } else {
                    0.0
                }
            };
            let start = (-2.0 / scale).floor() as i64 + 1;
            let end = 2 - start;
            normalized(
                (start..end)
                    .map(|i| kernel(scale * (i as f64 - ratio)))
                    .collect(),
            )
        }
    }
}

fn normalized(c: Vec<f64>) -> Vec<f64> {
    let sum: f64 = c.iter().sum();
    c.into_iter().map(|v| v / sum).collect()
}

/// The input coordinate of output index `o`, or `None` where tf_crop_and_resize
/// extrapolates.
fn source_coordinate(
    s: &Settings,
    o: usize,
    scale: f64,
    input: usize,
    output: usize,
    roi: Option<(f64, f64)>,
) -> Result<Option<f64>, String> {
    let (y, w_in) = (o as f64, input as f64);
    let w_out = scale * w_in;
    Ok(Some(match s.transform {
        "align_corners" if w_out == 1.0 => 0.0,
        "align_corners" => y * (w_in - 1.0) / (w_out - 1.0),
        "asymmetric" => y / scale,
        "tf_crop_and_resize" => {
            let (start, end) = roi.ok_or("tf_crop_and_resize needs roi")?;
            let x = if w_out == 1.0 {
                (end - start) * (w_in - 1.0) / 2.0
            } else {
                y * (end - start) * (w_in - 1.0) / (w_out - 1.0)
            } + start * (w_in - 1.0);
            if x < 0.0 || x > w_in - 1.0 {
                return Ok(None);
            }
            x
        }
        "pytorch_half_pixel" if w_out == 1.0 => -0.5,
        "pytorch_half_pixel" | "half_pixel" => (y + 0.5) / scale - 0.5,
        _ => {
            // half_pixel_symmetric: centred on the input when sizes round the scale.
            let adjustment = output as f64 / w_out;
            let offset = w_in / 2.0 * (1.0 - adjustment);
            offset + (y + 0.5) / scale - 0.5
        }
    }))
}

/// Per output index along one axis: its neighbours (clamped to the input: edge padding)
/// and their weights, or `None` where tf_crop_and_resize extrapolates.
pub(crate) type AxisTaps = Vec<Option<Vec<(usize, f64)>>>;

/// What a Resize does, axis by axis: the changed axes in the order the reference
/// interpolates them, with their taps, and the value extrapolated points take.
pub(crate) struct ResizeTaps {
    pub axes: Vec<(usize, AxisTaps)>,
    pub extrapolation: f64,
}

/// The taps of a Resize with these attributes on an input of dims `input`, given its
/// `roi`, `scales` and `sizes` operands (the backends interpolate with them as the
/// reference does).
pub(crate) fn resize_taps(
    attrs: &Attrs,
    input: &[usize],
    roi: Option<&Tensor>,
    scales: Option<&Tensor>,
    sizes: Option<&Tensor>,
) -> Result<ResizeTaps, String> {
    let (s, z) = operands(scales, sizes);
    let p = plan(attrs, input, s.as_deref(), z.as_deref())?;
    let settings = mode_settings(attrs)?;
    let roi = roi.filter(|t| !t.is_empty()).map(|t| t.to_f64_vec());
    // roi lists starts then ends, for `axes` (or all axes).
    let roi_of = |a: usize| -> Result<Option<(f64, f64)>, String> {
        let Some(roi) = &roi else { return Ok(None) };
        let n = p.axes.len();
        if roi.len() != 2 * n {
            return Err(format!("roi has {} values, expected {}", roi.len(), 2 * n));
        }
        let i = p.axes.iter().position(|&x| x == a).unwrap_or(0);
        Ok(Some((roi[i], roi[n + i])))
    };
    let mut axes = vec![];
    for &a in &p.axes {
        let roi = roi_of(a)?;
        let unchanged = (p.scales[a] - 1.0).abs() < 1e-9
            && p.sizes[a] == input[a]
            && roi.is_none_or(|(s, e)| s.abs() < 1e-9 && (e - 1.0).abs() < 1e-9);
        if unchanged {
            continue;
        }
        let taps = axis_taps(input[a], p.scales[a], p.sizes[a], roi, &settings)
            .map_err(|e| format!("axis {a}: {e}"))?;
        axes.push((a, taps));
    }
    Ok(ResizeTaps {
        axes,
        extrapolation: settings.extrapolation,
    })
}

/// The taps of one axis of size `input` resized to `output`.
fn axis_taps(
    input: usize,
    scale: f64,
    output: usize,
    roi: Option<(f64, f64)>,
    s: &Settings,
) -> Result<AxisTaps, String> {
    if input == 0 && output > 0 {
        return Err(format!("cannot resize an empty axis to {output}"));
    }
    let mut taps: AxisTaps = Vec::with_capacity(output);
    for o in 0..output {
        let Some(xo) = source_coordinate(s, o, scale, input, output, roi)? else {
            taps.push(None);
            continue;
        };
        let floor = xo.floor();
        let ratio = if xo == floor { 1.0 } else { xo - floor };
        let mut c = coefficients(s, ratio, scale);
        let n = c.len() as i64;
        let pad = (n + 1) / 2;
        let xp = xo + pad as f64;
        let p = xp.floor() as i64;
        let frac = xp - xp.floor();
        let offset = if n % 2 == 0 {
            if frac == 0.0 {
                -(n / 2)
            } else {
                -(n / 2) + 1
            }
        } else if frac <= 0.5 {
            -((n - 1) / 2)
        } else {
            -((n - 1) / 2) + 1
        };
        let first = p + offset - pad;
        if s.exclude_outside {
            for (k, w) in c.iter_mut().enumerate() {
                let i = first + k as i64;
                if i < 0 || i >= input as i64 {
                    *w = 0.0;
                }
            }
            let sum: f64 = c.iter().sum();
            let sum = if sum == 0.0 { 1.0 } else { sum };
            c.iter_mut().for_each(|w| *w /= sum);
        }
        let clamp = |i: i64| i.clamp(0, input as i64 - 1) as usize;
        taps.push(Some(
            c.iter()
                .enumerate()
                .map(|(k, &w)| (clamp(first + k as i64), w))
                .collect(),
        ));
    }
    Ok(taps)
}

/// The resize as an exact gather when every output point has one tap of weight 1 besides
/// zero ones (or none: the extrapolation value): nearest mode copies input values, so no dtype's
/// values (u64 above 2^53, say) may pass through f64.
fn gather_nearest(
    x: &Tensor,
    axes: &[(usize, AxisTaps)],
    extrapolation: f64,
) -> Result<Option<Tensor>, String> {
    let mut shape = x.shape().to_vec();
    let mut pick: Vec<Option<Vec<Option<usize>>>> = vec![None; shape.len()];
    for (a, taps) in axes {
        let mut axis = vec![];
        for t in taps {
            axis.push(match t {
                None => None,
                Some(t) => {
                    let mut live = t.iter().filter(|p| p.1 != 0.0);
                    match (live.next(), live.next()) {
                        (Some(&(i, 1.0)), None) => Some(i),
                        _ => return Ok(None),
                    }
                }
            });
        }
        shape[*a] = axis.len();
        pick[*a] = Some(axis);
    }
    let y = match_tensor!(x, a => remap(a, &shape, Elem::from_f64(extrapolation), |o, src| {
        for (d, &i) in o.iter().enumerate() {
            match &pick[d] {
                None => src.push(i),
                Some(axis) => match axis[i] {
                    Some(j) => src.push(j),
                    None => return false,
                },
            }
        }
        true
    }));
    Ok(Some(y))
}

/// One 1-D interpolation pass along `axis` with its taps.
fn interpolate_axis(
    x: &ArrayD<f64>,
    axis: usize,
    taps: &AxisTaps,
    extrapolation: f64,
) -> ArrayD<f64> {
    let mut shape = x.shape().to_vec();
    shape[axis] = taps.len();
    let mut y = ArrayD::<f64>::zeros(IxDyn(&shape));
    for (mut out_lane, in_lane) in y.lanes_mut(Axis(axis)).into_iter().zip(x.lanes(Axis(axis))) {
        for (o, t) in taps.iter().enumerate() {
            out_lane[o] = match t {
                None => extrapolation,
                Some(t) => t.iter().map(|&(i, w)| w * in_lane[i]).sum(),
            };
        }
    }
    y
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(Resize)]
}
