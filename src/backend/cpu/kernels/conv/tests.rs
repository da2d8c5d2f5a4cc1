//! Both convolution paths against a naive f64 reference on random data.
//!
//! Tolerance: |got − want| ≤ 1e-5·(1 + Σ|x·w| + |bias| + |z|) per output, i.e. relative
//! to the magnitude of the terms summed (f32 accumulation of up to ~2,400 products).
use super::*;
use crate::backend::cpu::isa::{detected, Isa};
use crate::backend::cpu::kernels::Act;
use crate::backend::cpu::pool::Pool;

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// Pre-activation outputs and their error scales, NCHW.
fn reference(
    s: &ConvShape,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    z: Option<&[f32]>,
) -> (Vec<f64>, Vec<f64>) {
    let (icg, ocg) = (s.ic / s.groups, s.oc / s.groups);
    let mut out = vec![0.0; s.n * s.oc * s.oh * s.ow];
    let mut scale = vec![0.0; out.len()];
    for n in 0..s.n {
        for o in 0..s.oc {
            let g = o / ocg;
            for oy in 0..s.oh {
                for ox in 0..s.ow {
                    let i = ((n * s.oc + o) * s.oh + oy) * s.ow + ox;
                    let mut acc = b.map_or(0.0, |b| b[o] as f64);
                    let mut mag = acc.abs();
                    for c in 0..icg {
                        for ky in 0..s.kh {
                            for kx in 0..s.kw {
                                let iy = (oy * s.strides[0] + ky * s.dilations[0]) as isize
                                    - s.pad_top as isize;
                                let ix = (ox * s.strides[1] + kx * s.dilations[1]) as isize
                                    - s.pad_left as isize;
                                if iy < 0 || ix < 0 || iy >= s.ih as isize || ix >= s.iw as isize {
                                    continue;
                                }
                                let xv = x[((n * s.ic + g * icg + c) * s.ih + iy as usize) * s.iw
                                    + ix as usize] as f64;
                                let wv = w[((o * icg + c) * s.kh + ky) * s.kw + kx] as f64;
                                acc += xv * wv;
                                mag += (xv * wv).abs();
                            }
                        }
                    }
                    if let Some(z) = z {
                        acc += z[i] as f64;
                        mag += (z[i] as f64).abs();
                    }
                    out[i] = acc;
                    scale[i] = 1.0 + mag;
                }
            }
        }
    }
    (out, scale)
}

fn check(s: &ConvShape, got: &[f32], want: &[f64], scale: &[f64], act: Act, what: &str) {
    check_tol(s, got, want, scale, act, what, 1e-5);
}

/// [`check`] with a relative tolerance `tol`; returns the largest err/scale seen.
fn check_tol(
    s: &ConvShape,
    got: &[f32],
    want: &[f64],
    scale: &[f64],
    act: Act,
    what: &str,
    tol: f64,
) -> f64 {
    assert_eq!(got.len(), want.len());
    let mut worst = 0.0f64;
    for i in 0..got.len() {
        let mut a = [want[i] as f32];
        act.apply(&mut a);
        let err = (got[i] as f64 - a[0] as f64).abs();
        worst = worst.max(err / scale[i]);
        assert!(
            err <= tol * scale[i],
            "{what} {s:?} at {i}: got {} want {} (err {err:e})",
            got[i],
            a[0]
        );
    }
    worst
}

/// NCHW → NCHW16c with NaN in the pad lanes (they must be ignored).
pub(super) fn block(x: &[f32], n: usize, c: usize, hw: usize) -> Vec<f32> {
    let cb = c.div_ceil(BLOCK);
    let mut out = vec![f32::NAN; n * cb * hw * BLOCK];
    for ni in 0..n {
        for ci in 0..c {
            for p in 0..hw {
                out[((ni * cb + ci / BLOCK) * hw + p) * BLOCK + ci % BLOCK] =
                    x[(ni * c + ci) * hw + p];
            }
        }
    }
    out
}

/// NCHW16c → NCHW; asserts the pad lanes are finite.
pub(super) fn unblock(y: &[f32], n: usize, c: usize, hw: usize) -> Vec<f32> {
    let cb = c.div_ceil(BLOCK);
    assert!(y.iter().all(|v| v.is_finite()), "non-finite output lanes");
    let mut out = vec![0.0; n * c * hw];
    for ni in 0..n {
        for ci in 0..c {
            for p in 0..hw {
                out[(ni * c + ci) * hw + p] =
                    y[((ni * cb + ci / BLOCK) * hw + p) * BLOCK + ci % BLOCK];
            }
        }
    }
    out
}

#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    ic: usize,
    oc: usize,
    hw: [usize; 2],
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 4],
    d: [usize; 2],
    g: usize,
    bias: bool,
    res: bool,
    act: Act,
}

#[allow(clippy::too_many_arguments)]
fn case(
    n: usize,
    ic: usize,
    oc: usize,
    hw: [usize; 2],
    k: usize,
    s: usize,
    p: [usize; 4],
    d: usize,
    g: usize,
    bias: bool,
    res: bool,
    act: Act,
) -> Case {
    Case {
        n,
        ic,
        oc,
        hw,
        k: [k, k],
        s: [s, s],
        p,
        d: [d, d],
        g,
        bias,
        res,
        act,
    }
}

struct Data {
    s: ConvShape,
    x: Vec<f32>,
    w: Vec<f32>,
    b: Option<Vec<f32>>,
    z: Option<Vec<f32>>,
    want: Vec<f64>,
    scale: Vec<f64>,
}

fn data(c: &Case, seed: u64) -> Data {
    let s = ConvShape::new(c.n, c.ic, c.hw, c.oc, c.k, c.s, c.p, c.d, c.g).unwrap();
    let mut r = Lcg(seed);
    let x = r.vec(s.n * s.ic * s.ih * s.iw);
    let w = r.vec(s.oc * s.ic / s.groups * s.kh * s.kw);
    let b = c.bias.then(|| r.vec(s.oc));
    let z = c.res.then(|| r.vec(s.n * s.oc * s.oh * s.ow));
    let (want, scale) = reference(&s, &x, &w, b.as_deref(), z.as_deref());
    Data {
        s,
        x,
        w,
        b,
        z,
        want,
        scale,
    }
}

fn isas() -> Vec<Isa> {
    let mut v = vec![Isa::Portable];
    if detected() >= Isa::Avx2 {
        v.push(Isa::Avx2);
    }
    if detected() >= Isa::Avx512 {
        v.push(Isa::Avx512);
    }
    v
}

fn run_blocked(c: &Case, seed: u64) {
    let d = data(c, seed);
    let s = d.s;
    let xb = block(&d.x, s.n, s.ic, s.ih * s.iw);
    let zb = d.z.as_ref().map(|z| block(z, s.n, s.oc, s.oh * s.ow));
    let pool2 = Pool::new(2);
    // A pointwise conv also runs with its pixels re-split into rows.
    let mut geometries = vec![s];
    if s.pointwise_rows(6) != s {
        geometries.push(s.pointwise_rows(6));
    }
    for (geometry, isa) in geometries
        .into_iter()
        .flat_map(|g| isas().into_iter().map(move |i| (g, i)))
    {
        let p = PackedConv::new(geometry, &d.w, d.b.as_deref()).unwrap();
        assert_eq!(xb.len(), p.x_len());
        for pool in [None, Some(&pool2)] {
            let mut y = vec![f32::NAN; p.y_len()];
            let zp = zb.as_ref().map(|z| z.as_ptr());
            // SAFETY: xb holds x_len floats (asserted), y and the blocked z y_len.
            unsafe { conv_blocked_isa(isa, pool, &p, xb.as_ptr(), zp, y.as_mut_ptr(), c.act) };
            let got = unblock(&y, s.n, s.oc, s.oh * s.ow);
            let what = format!(
                "blocked {} pool={} rows {}×{}",
                isa.name(),
                pool.is_some(),
                geometry.oh,
                geometry.ow
            );
            check(&s, &got, &d.want, &d.scale, c.act, &what);
        }
    }
    // A strided 1×1 conv also runs at stride 1 over its input subsampled compact.
    let Some(unit) = s.subsampled() else {
        return;
    };
    let p = PackedConv::new(unit.pointwise_rows(6), &d.w, d.b.as_deref()).unwrap();
    for (isa, pool) in isas()
        .into_iter()
        .flat_map(|i| [None, Some(&pool2)].map(|p| (i, p)))
    {
        let mut compact = vec![f32::NAN; p.x_len()];
        let mut y = vec![f32::NAN; p.y_len()];
        // SAFETY: xb holds the strided conv's blocked input, compact the subsampled
        // one: the packed stride-1 conv's x_len floats.
        unsafe { subsample(pool, &s, xb.as_ptr(), compact.as_mut_ptr()) };
        let (zp, xp) = (zb.as_ref().map(|z| z.as_ptr()), compact.as_ptr());
        // SAFETY: compact holds the stride-1 conv's x_len floats, y and z its y_len.
        unsafe { conv_blocked_isa(isa, pool, &p, xp, zp, y.as_mut_ptr(), c.act) };
        let got = unblock(&y, s.n, s.oc, s.oh * s.ow);
        let what = format!("subsampled {} pool={}", isa.name(), pool.is_some());
        check(&s, &got, &d.want, &d.scale, c.act, &what);
    }
}

/// [`run_blocked`] with a plain NCHW x ([`PackedConv::with_plain_x`]) between NaN
/// guards, so a read outside x shows; y and z stay blocked (z's pad lanes NaN).
fn run_plain_x(c: &Case, seed: u64) {
    let d = data(c, seed);
    let s = d.s;
    let p = PackedConv::new(s, &d.w, d.b.as_deref())
        .unwrap()
        .with_plain_x(true);
    assert!(p.plain_x());
    assert_eq!(d.x.len(), p.x_len());
    const GUARD: usize = 64;
    let mut xg = vec![f32::NAN; GUARD];
    xg.extend_from_slice(&d.x);
    xg.extend(std::iter::repeat_n(f32::NAN, GUARD));
    let zb = d.z.as_ref().map(|z| block(z, s.n, s.oc, s.oh * s.ow));
    let pool2 = Pool::new(2);
    for isa in isas() {
        for pool in [None, Some(&pool2)] {
            let mut y = vec![f32::NAN; p.y_len()];
            let zp = zb.as_ref().map(|z| z.as_ptr());
            // SAFETY: xg holds GUARD floats, then x's x_len (asserted), then more; y and
            // z hold y_len.
            let xp = unsafe { xg.as_ptr().add(GUARD) };
            // SAFETY: xp starts those x_len floats of x; y and z as just said.
            unsafe { conv_blocked_isa(isa, pool, &p, xp, zp, y.as_mut_ptr(), c.act) };
            let got = unblock(&y, s.n, s.oc, s.oh * s.ow);
            let what = format!("plain-x {} pool={} {c:?}", isa.name(), pool.is_some());
            check(&s, &got, &d.want, &d.scale, c.act, &what);
        }
    }
}

fn run_plain(c: &Case, seed: u64) {
    let d = data(c, seed);
    let s = d.s;
    let pool2 = Pool::new(2);
    for (path, f) in [
        ("plain", conv_plain as PlainFn),
        ("im2col", conv_im2col as PlainFn),
    ] {
        for pool in [None, Some(&pool2)] {
            let mut y = vec![f32::NAN; s.n * s.oc * s.oh * s.ow];
            let mut scratch = vec![0.0; conv_plain_scratch_len(&s)];
            let (w, b) = (d.w.as_ptr(), d.b.as_ref().map(|b| b.as_ptr()));
            let (x, z) = (d.x.as_ptr(), d.z.as_ref().map(|z| z.as_ptr()));
            let (yp, sp) = (y.as_mut_ptr(), scratch.as_mut_ptr());
            // SAFETY: `data` sizes w, b, x and z for `s`; y holds its NCHW output and
            // scratch `conv_plain_scratch_len(&s)` floats, as conv_plain asks.
            unsafe { f(pool, &s, w, b, x, z, yp, c.act, sp) };
            let what = format!("{path} pool={}", pool.is_some());
            check(&s, &y, &d.want, &d.scale, c.act, &what);
        }
    }
}

/// The direct kernel on every ISA, with and without a pool (output starting NaN, the
/// scratch too: every padded element must be written before it is read).
fn run_direct(c: &Case, seed: u64) {
    let d = data(c, seed);
    let s = d.s;
    assert!(direct_supported(&s), "{c:?}");
    let pool2 = Pool::new(2);
    for isa in isas() {
        for pool in [None, Some(&pool2)] {
            let mut y = vec![f32::NAN; s.n * s.oc * s.oh * s.ow];
            let mut scratch = vec![f32::NAN; conv_direct_scratch_len(&s)];
            let (w, b) = (d.w.as_ptr(), d.b.as_ref().map(|b| b.as_ptr()));
            let (x, z) = (d.x.as_ptr(), d.z.as_ref().map(|z| z.as_ptr()));
            let (yp, sp) = (y.as_mut_ptr(), scratch.as_mut_ptr());
            // SAFETY: `data` sizes w, b, x and z for `s`; y holds its NCHW output and
            // scratch `conv_direct_scratch_len(&s)` floats, as conv_direct asks.
            unsafe { conv_direct_isa(isa, pool, &s, w, b, x, z, yp, c.act, sp) };
            let what = format!("direct {} pool={}", isa.name(), pool.is_some());
            check(&s, &y, &d.want, &d.scale, c.act, &what);
        }
    }
}

#[test]
fn direct_matches_reference() {
    use Act::*;
    let conv = |ic, oc, hw, k, s, p, d, g, res, act| Case {
        n: 1,
        ic,
        oc,
        hw,
        k,
        s,
        p,
        d,
        g,
        bias: true,
        res,
        act,
    };
    let mut cases = vec![
        // basic_pitch's shapes, small: 8→8 3×13, a strided 1-D filter bank row, 32→1.
        conv(
            8,
            8,
            [7, 37],
            [3, 13],
            [1, 1],
            [1, 6, 1, 6],
            [1, 1],
            1,
            true,
            Relu,
        ),
        conv(
            1,
            1,
            [1, 600],
            [1, 64],
            [1, 2],
            [0; 4],
            [1, 1],
            1,
            false,
            None,
        ),
        conv(
            32,
            1,
            [11, 21],
            [7, 3],
            [1, 1],
            [3, 1, 3, 1],
            [1, 1],
            1,
            true,
            None,
        ),
        conv(
            64,
            1,
            [3, 50],
            [1, 1],
            [1, 1],
            [0; 4],
            [1, 1],
            1,
            false,
            Sigmoid,
        ),
        // Stride, dilation and asymmetric pads at once; C_out = 2, 3.
        conv(
            3,
            2,
            [9, 10],
            [3, 3],
            [2, 2],
            [0, 2, 1, 0],
            [2, 2],
            1,
            false,
            Sigmoid,
        ),
        conv(
            4,
            6,
            [8, 19],
            [3, 3],
            [2, 1],
            [1, 0, 2, 1],
            [1, 2],
            2,
            true,
            Tanh,
        ),
        conv(
            5,
            3,
            [6, 33],
            [2, 5],
            [1, 3],
            [0, 4, 1, 3],
            [2, 1],
            1,
            true,
            HardSwish,
        ),
        // The input smaller than the window, rows with no valid tap; C_out = 8.
        conv(
            3,
            8,
            [2, 3],
            [5, 5],
            [1, 1],
            [2; 4],
            [1, 1],
            1,
            true,
            Clip(-0.5, 0.5),
        ),
        conv(
            2,
            8,
            [3, 4],
            [3, 3],
            [1, 1],
            [4, 0, 4, 0],
            [1, 1],
            1,
            false,
            None,
        ),
        // Channel counts split into register blocks: 5 = 4 + 1, 7 = 4 + 3, 6 = 4 + 2.
        conv(
            2,
            5,
            [5, 40],
            [3, 3],
            [1, 1],
            [1; 4],
            [1, 1],
            1,
            false,
            Relu,
        ),
        conv(2, 7, [5, 17], [3, 3], [1, 1], [1; 4], [1, 1], 1, true, None),
        conv(
            4,
            12,
            [4, 23],
            [3, 1],
            [1, 1],
            [1, 0, 1, 0],
            [1, 1],
            2,
            false,
            None,
        ),
        // Groups of 4 and of 1 output channel, rows of many tile widths.
        conv(
            8,
            16,
            [6, 130],
            [3, 3],
            [1, 1],
            [1; 4],
            [1, 1],
            4,
            true,
            Relu,
        ),
        conv(
            6,
            3,
            [4, 71],
            [3, 3],
            [1, 2],
            [1; 4],
            [1, 1],
            3,
            false,
            None,
        ),
        // A 1-D row longer than a task's segment.
        conv(
            3,
            2,
            [1, 2500],
            [1, 5],
            [1, 1],
            [0, 2, 0, 2],
            [1, 1],
            1,
            true,
            None,
        ),
    ];
    // One output channel, several rows per tile (vertical stride and dilation 1): rows
    // without a valid tap (pads of 4 and 3 on a 5-row kernel), a partial last block of
    // rows, horizontal stride and dilation, a 1×1 kernel, groups of one channel.
    cases.extend([
        conv(
            2,
            1,
            [3, 20],
            [5, 3],
            [1, 1],
            [4, 1, 3, 1],
            [1, 1],
            1,
            true,
            Relu,
        ),
        conv(
            3,
            1,
            [9, 70],
            [3, 5],
            [1, 3],
            [1, 2, 1, 2],
            [1, 2],
            1,
            false,
            None,
        ),
        conv(5, 1, [7, 37], [1, 1], [1, 1], [0; 4], [1, 1], 1, true, Tanh),
        conv(
            6,
            3,
            [10, 45],
            [3, 3],
            [1, 1],
            [1; 4],
            [1, 1],
            3,
            true,
            None,
        ),
        // The same channel at vertical stride and dilation 2 (one row per tile).
        conv(
            3,
            1,
            [9, 30],
            [3, 3],
            [2, 1],
            [1; 4],
            [1, 1],
            1,
            false,
            None,
        ),
        conv(
            3,
            1,
            [9, 30],
            [3, 3],
            [1, 1],
            [2, 1, 2, 1],
            [2, 1],
            1,
            true,
            Relu,
        ),
    ]);
    // One output channel with more taps per phase than lanes: chains of taps (on 8-lane
    // paths only for the 11 taps per phase of the grouped case); a row longer than a
    // segment; kernel rows at vertical stride 2; a 4 + 1 channel split; groups of one.
    cases.extend([
        conv(
            1,
            1,
            [1, 900],
            [1, 80],
            [1, 2],
            [0, 40, 0, 39],
            [1, 1],
            1,
            true,
            None,
        ),
        conv(
            1,
            1,
            [1, 2600],
            [1, 256],
            [1, 2],
            [0, 127, 0, 128],
            [1, 1],
            1,
            false,
            None,
        ),
        conv(
            2,
            1,
            [5, 50],
            [2, 37],
            [2, 1],
            [1, 18, 0, 18],
            [1, 1],
            1,
            true,
            Tanh,
        ),
        conv(
            2,
            5,
            [1, 100],
            [1, 40],
            [1, 1],
            [0, 20, 0, 19],
            [1, 1],
            1,
            false,
            Relu,
        ),
        conv(
            4,
            2,
            [1, 300],
            [1, 33],
            [1, 3],
            [0, 5, 0, 5],
            [1, 1],
            2,
            true,
            None,
        ),
        // Dilation 2: no chains, one tap at a time.
        conv(
            1,
            1,
            [1, 300],
            [1, 40],
            [1, 1],
            [0; 4],
            [1, 2],
            1,
            false,
            None,
        ),
    ]);
    cases.push(Case {
        n: 2,
        ..conv(4, 3, [5, 9], [3, 3], [1, 1], [1; 4], [1, 1], 1, true, Relu)
    });
    cases.push(Case {
        n: 2,
        ..conv(3, 1, [6, 40], [3, 3], [1, 1], [1; 4], [1, 1], 1, true, None)
    });
    for (i, c) in cases.iter().enumerate() {
        run_direct(c, 3000 + i as u64);
    }
}

type PlainFn = unsafe fn(
    Option<&Pool>,
    &ConvShape,
    *const f32,
    Option<*const f32>,
    *const f32,
    Option<*const f32>,
    *mut f32,
    Act,
    *mut f32,
);

const P0: [usize; 4] = [0; 4];
const P1: [usize; 4] = [1; 4];
const P3: [usize; 4] = [3; 4];

#[test]
fn shapes_follow_onnx() {
    let s = ConvShape::new(1, 3, [224, 224], 64, [7, 7], [2, 2], P3, [1, 1], 1).unwrap();
    assert_eq!((s.oh, s.ow), (112, 112));
    let s = ConvShape::new(1, 8, [5, 7], 8, [3, 3], [2, 1], [1, 0, 0, 2], [2, 1], 8).unwrap();
    assert_eq!((s.oh, s.ow), (1, 7));
    assert!(ConvShape::new(1, 3, [2, 2], 4, [3, 3], [1, 1], P0, [1, 1], 1).is_err());
    assert!(ConvShape::new(1, 3, [8, 8], 4, [3, 3], [1, 1], P0, [1, 1], 2).is_err());
    assert!(ConvShape::new(1, 4, [8, 8], 4, [3, 3], [0, 1], P0, [1, 1], 1).is_err());
    let s = ConvShape::new(1, 32, [8, 8], 16, [3, 3], [1, 1], P0, [1, 1], 2).unwrap();
    assert!(PackedConv::new(s, &[0.0; 16 * 16 * 9], None).is_err());
    let s = ConvShape::new(1, 32, [8, 8], 16, [3, 3], [1, 1], P0, [1, 1], 1).unwrap();
    assert!(PackedConv::new(s, &[0.0; 10], None).is_err());
}

#[test]
fn only_strided_unpadded_pointwise_convs_subsample() {
    let conv = |k, s, pads| ConvShape::new(1, 32, [7, 8], 64, [k, k], [s, s], pads, [1, 1], 1);
    let unit = conv(1, 2, [0; 4]).unwrap().subsampled().unwrap();
    assert_eq!((unit.ih, unit.iw, unit.strides), (4, 4, [1, 1]));
    assert_eq!((unit.oh, unit.ow), (4, 4));
    assert!(conv(1, 1, [0; 4]).unwrap().subsampled().is_none());
    assert!(conv(3, 2, [1; 4]).unwrap().subsampled().is_none());
    assert!(conv(1, 2, [1, 1, 0, 0]).unwrap().subsampled().is_none());
    // An output past the input's last row (a bottom pad) has no pixel to copy.
    assert!(conv(1, 2, [0, 0, 2, 0]).unwrap().subsampled().is_none());
}

#[test]
fn pointwise_rows_fill_micro_tiles() {
    let rows = |ic, [h, w]: [usize; 2], k, stride, pads| {
        let s = ConvShape::new(1, ic, [h, w], 16, [k, k], [stride; 2], pads, [1, 1], 1).unwrap();
        let r = s.pointwise_rows(6);
        assert_eq!(r.oh * r.ow, s.oh * s.ow);
        (r.oh, r.ow)
    };
    assert_eq!(rows(16, [7, 7], 1, 1, P0), (1, 49));
    assert_eq!(rows(16, [14, 14], 1, 1, P0), (2, 98));
    assert_eq!(rows(16, [56, 56], 1, 1, P0), (28, 112));
    assert_eq!(rows(16, [6, 12], 1, 1, P0), (6, 12));
    assert_eq!(rows(16, [7, 7], 1, 2, P0), (4, 4));
    assert_eq!(rows(16, [7, 7], 1, 1, P1), (9, 9));
    assert_eq!(rows(16, [7, 7], 3, 1, P1), (7, 7));
    // AVX-512's 12-pixel tiles: 104-pixel rows take 9 calls each (936 in all); the
    // 64-pixel rows that suit 6-pixel tiles would take 1014.
    let s = ConvShape::new(1, 48, [104, 104], 48, [1, 1], [1; 2], P0, [1, 1], 1).unwrap();
    assert_eq!(s.pointwise_rows(12), s);
    assert_eq!(s.pointwise_rows(6).ow, 64);
}

#[test]
fn blocked_matches_reference() {
    use Act::{Relu, Sigmoid};
    let none = Act::None;
    let cases = [
        case(1, 16, 16, [5, 7], 1, 1, P0, 1, 1, false, false, none),
        case(2, 16, 32, [13, 14], 3, 1, P1, 1, 1, true, true, Relu),
        case(1, 32, 16, [14, 13], 3, 2, P1, 1, 1, true, false, Sigmoid),
        case(
            1,
            48,
            48,
            [7, 7],
            5,
            1,
            [1, 2, 0, 1],
            1,
            1,
            true,
            true,
            Relu,
        ),
        case(2, 16, 48, [14, 14], 7, 2, P3, 1, 1, true, true, none),
        case(
            1,
            32,
            32,
            [13, 13],
            3,
            1,
            [2, 2, 2, 2],
            2,
            1,
            true,
            true,
            Sigmoid,
        ),
        case(2, 48, 16, [1, 1], 3, 1, P1, 1, 1, true, true, Relu),
        case(1, 16, 16, [5, 5], 3, 2, P0, 1, 1, false, true, none),
        case(1, 32, 48, [7, 13], 1, 2, P0, 1, 1, true, false, Relu),
        case(1, 16, 32, [1, 7], 1, 1, P0, 1, 1, true, true, Sigmoid),
        case(2, 48, 32, [5, 14], 7, 1, P3, 1, 1, false, false, Relu),
        case(
            1,
            16,
            16,
            [13, 7],
            5,
            2,
            [3, 0, 1, 2],
            2,
            1,
            true,
            true,
            Sigmoid,
        ),
        case(
            1,
            32,
            16,
            [14, 14],
            3,
            1,
            [0, 1, 2, 0],
            1,
            1,
            true,
            false,
            none,
        ),
        // Channel counts that leave pad lanes.
        case(2, 20, 35, [5, 7], 3, 1, P1, 1, 1, true, true, Relu),
        case(1, 3, 5, [13, 13], 7, 2, P3, 1, 1, true, true, Sigmoid),
        // Strided 1×1 (also run subsampled), ragged and with a bottom pad, which
        // `subsampled` declines when an output would read past the input.
        case(2, 20, 32, [8, 9], 1, 2, P0, 1, 1, true, true, Relu),
        case(1, 48, 64, [10, 11], 1, 3, P0, 1, 1, false, true, Sigmoid),
        case(
            1,
            16,
            32,
            [6, 6],
            1,
            2,
            [0, 0, 1, 1],
            1,
            1,
            true,
            false,
            none,
        ),
        // Enough input blocks for several cache chunks.
        case(1, 96, 16, [5, 13], 3, 1, P1, 1, 1, true, true, Sigmoid),
        case(
            1,
            160,
            32,
            [7, 7],
            5,
            1,
            [2, 1, 2, 3],
            1,
            1,
            true,
            true,
            Relu,
        ),
    ];
    for (i, c) in cases.iter().enumerate() {
        run_blocked(c, 1000 + i as u64);
    }
}

/// Every row length up to 30 interior pixels, so each micro-kernel width and remainder
/// runs (AVX-512: 12 pixels × 2 output blocks and 24 × 1, here both, as 48 output
/// channels are one pair and one single block; AVX2: 6), with ragged input and output
/// blocks, a residual and each kind of activation.
#[test]
fn blocked_covers_every_tile_width() {
    let acts = [Act::Relu, Act::Sigmoid, Act::None];
    for ow in 1..=30 {
        let (oc, act) = ([48, 40, 16][ow % 3], acts[ow % 3]);
        let c = case(1, 20, oc, [2, ow], 3, 1, P1, 1, 1, true, true, act);
        run_blocked(&c, 5000 + ow as u64);
        let c = case(1, 3, oc, [2, ow], 3, 1, P1, 1, 1, ow % 2 == 0, true, act);
        run_plain_x(&c, 6000 + ow as u64);
    }
}

/// Rows too few for the threads (a 1-D signal, as magika's conv) split into column
/// spans; each span's border pixels, tiles and epilogue stay its own.
#[test]
fn blocked_splits_long_rows() {
    use Act::{Relu, Sigmoid};
    let cases = [
        case(1, 16, 40, [1, 300], 3, 1, P1, 1, 1, true, true, Sigmoid),
        case(
            1,
            48,
            32,
            [1, 257],
            5,
            1,
            [4, 2, 4, 2],
            2,
            1,
            true,
            true,
            Relu,
        ),
        case(1, 20, 16, [1, 131], 1, 1, P0, 1, 1, false, true, Act::None),
        case(1, 32, 35, [1, 200], 3, 2, P1, 1, 1, true, false, Relu),
    ];
    for (i, c) in cases.iter().enumerate() {
        run_blocked(c, 7000 + i as u64);
    }
    let c = case(1, 3, 20, [1, 190], 3, 1, P1, 1, 1, true, true, Sigmoid);
    run_plain_x(&c, 7100);
}

#[test]
fn plain_x_blocked_y_matches_reference() {
    use Act::{Relu, Sigmoid};
    let none = Act::None;
    let cases = [
        // The CNN's first layer and ResNet's stem.
        case(2, 1, 32, [28, 28], 3, 1, P1, 1, 1, true, false, Relu),
        case(1, 3, 64, [23, 21], 7, 2, P3, 1, 1, true, false, Relu),
        // Ragged output blocks, residuals with NaN pad lanes, asymmetric pads.
        case(
            2,
            3,
            20,
            [9, 11],
            3,
            2,
            [1, 0, 2, 1],
            1,
            1,
            true,
            true,
            Sigmoid,
        ),
        case(
            1,
            5,
            35,
            [7, 6],
            5,
            1,
            [2, 1, 0, 2],
            2,
            1,
            false,
            true,
            none,
        ),
        case(1, 15, 16, [6, 13], 3, 1, P0, 2, 1, true, false, Relu),
        case(2, 1, 17, [1, 9], 1, 3, P0, 1, 1, true, true, none),
        // Several input blocks (the kernel allows it, the layout pass does not ask).
        case(1, 20, 16, [5, 7], 3, 1, P1, 1, 1, true, true, Relu),
        case(
            1,
            40,
            48,
            [4, 9],
            3,
            2,
            [0, 1, 1, 0],
            1,
            1,
            false,
            false,
            Sigmoid,
        ),
    ];
    for (i, c) in cases.iter().enumerate() {
        run_plain_x(c, 3000 + i as u64);
    }
}

#[test]
fn plain_matches_reference() {
    use Act::{Relu, Sigmoid};
    let none = Act::None;
    let cases = [
        case(2, 3, 8, [7, 7], 3, 1, P1, 1, 1, true, true, Relu),
        case(
            1,
            8,
            8,
            [13, 5],
            5,
            2,
            [1, 2, 3, 0],
            1,
            2,
            true,
            false,
            Sigmoid,
        ),
        case(1, 5, 5, [14, 14], 3, 1, P1, 1, 5, false, true, Relu),
        case(2, 8, 8, [7, 7], 3, 2, P1, 2, 8, true, true, none),
        case(1, 1, 3, [5, 7], 1, 1, P0, 1, 1, true, true, none),
        case(2, 8, 4, [13, 14], 1, 1, P0, 1, 2, true, false, Sigmoid),
        case(1, 3, 8, [13, 14], 7, 2, P3, 1, 1, true, false, Relu),
        case(1, 5, 5, [7, 13], 1, 2, P0, 1, 1, false, true, Relu),
        case(1, 8, 8, [1, 1], 3, 1, P1, 1, 4, true, true, Sigmoid),
        case(1, 3, 5, [5, 5], 1, 1, [0, 1, 1, 0], 1, 1, true, true, none),
        case(
            2,
            8,
            16,
            [14, 13],
            5,
            1,
            [3, 1, 0, 2],
            2,
            8,
            true,
            true,
            Relu,
        ),
        case(
            1,
            1,
            1,
            [5, 14],
            3,
            2,
            [0, 0, 2, 1],
            1,
            1,
            false,
            false,
            none,
        ),
    ];
    for (i, c) in cases.iter().enumerate() {
        run_plain(c, 2000 + i as u64);
        if c.oc / c.g <= DIRECT_MAX_GROUP_OC {
            run_direct(c, 2000 + i as u64);
        }
    }
}

/// Winograd's relative tolerance: its transforms add rounding of products of size
/// |x|·|w| scaled by the transform matrices' entries (up to 8·5 for F(4,3)), so the
/// error is still bounded by a multiple of Σ|x·w|, but a larger one than direct
/// convolution's.
const WINO_TOL: f64 = 1e-4;

/// Runs one case through both tile sizes, both ISA paths, with and without a pool, and
/// (with a residual) in place; returns the largest relative error per tile size.
fn run_winograd(c: &Case, seed: u64) -> [f64; 2] {
    let d = data(c, seed);
    let s = d.s;
    assert!(winograd_supported(&s), "{s:?}");
    let xb = block(&d.x, s.n, s.ic, s.ih * s.iw);
    let zb = d.z.as_ref().map(|z| block(z, s.n, s.oc, s.oh * s.ow));
    let pool2 = Pool::new(2);
    let mut worst = [0.0f64; 2];
    for (mi, m) in [2, 4].into_iter().enumerate() {
        let p = PackedWinograd::new(s, m, &d.w, d.b.as_deref()).unwrap();
        assert_eq!(xb.len(), p.x_len());
        for isa in isas() {
            for pool in [None, Some(&pool2)] {
                let threads = pool.map_or(1, |p| p.threads());
                // Scratch garbage must not matter.
                let mut scratch = vec![f32::NAN; p.scratch_len(threads) + 16];
                let off = scratch.as_ptr().align_offset(64);
                let sp = scratch[off..].as_mut_ptr();
                let modes: &[bool] = if zb.is_some() {
                    &[false, true]
                } else {
                    &[false]
                };
                for &aliased in modes {
                    let mut y = match (&zb, aliased) {
                        (Some(z), true) => z.clone(),
                        _ => vec![f32::NAN; p.y_len()],
                    };
                    let z = match (&zb, aliased) {
                        (Some(_), true) => Some(y.as_ptr()),
                        (Some(z), false) => Some(z.as_ptr()),
                        (None, _) => None,
                    };
                    // SAFETY: buffers sized by the packed conv's own lengths; y is
                    // exactly z when aliased.
                    unsafe {
                        conv_winograd_isa(isa, pool, &p, xb.as_ptr(), z, y.as_mut_ptr(), c.act, sp)
                    };
                    let got = unblock(&y, s.n, s.oc, s.oh * s.ow);
                    let what = format!(
                        "winograd m={m} {} pool={} in-place={aliased}",
                        isa.name(),
                        pool.is_some()
                    );
                    let e = check_tol(&s, &got, &d.want, &d.scale, c.act, &what, WINO_TOL);
                    worst[mi] = worst[mi].max(e);
                }
            }
        }
    }
    worst
}

#[test]
fn winograd_matches_reference() {
    use Act::{Relu, Sigmoid};
    let none = Act::None;
    let cases = [
        case(1, 16, 16, [8, 8], 3, 1, P1, 1, 1, false, false, none),
        case(2, 17, 33, [13, 13], 3, 1, P1, 1, 1, true, true, Relu),
        case(1, 5, 5, [7, 7], 3, 1, P0, 1, 1, true, false, Sigmoid),
        case(2, 33, 17, [1, 1], 3, 1, P1, 1, 1, true, true, Relu),
        case(
            1,
            16,
            32,
            [3, 7],
            3,
            1,
            [2, 0, 1, 2],
            1,
            1,
            false,
            true,
            Sigmoid,
        ),
        case(
            1,
            32,
            16,
            [13, 3],
            3,
            1,
            [0, 2, 2, 1],
            1,
            1,
            true,
            true,
            none,
        ),
        case(
            2,
            5,
            17,
            [7, 13],
            3,
            1,
            [1, 0, 0, 1],
            1,
            1,
            true,
            false,
            Relu,
        ),
        case(1, 48, 48, [14, 14], 3, 1, P1, 1, 1, true, true, Relu),
        case(
            1,
            64,
            40,
            [5, 9],
            3,
            1,
            [2, 2, 2, 2],
            1,
            1,
            true,
            true,
            Sigmoid,
        ),
        case(
            1,
            3,
            20,
            [1, 7],
            3,
            1,
            [1, 1, 1, 1],
            1,
            1,
            false,
            false,
            Relu,
        ),
        // Many tiles: several batches and both parallel schemes.
        case(1, 16, 16, [40, 37], 3, 1, P1, 1, 1, true, true, Relu),
        case(2, 96, 80, [7, 7], 3, 1, P1, 1, 1, true, true, none),
        // Odd tile counts (49 and 169 tiles: ragged last micro-kernel calls), an odd
        // number of output blocks (AVX-512's pairs plus a single block), OC % 16 ≠ 0.
        case(1, 24, 40, [26, 26], 3, 1, P1, 1, 1, true, true, Sigmoid),
        case(1, 20, 72, [22, 30], 3, 1, P1, 1, 1, false, true, Relu),
    ];
    let mut worst = [0.0f64; 2];
    for (i, c) in cases.iter().enumerate() {
        let e = run_winograd(c, 3000 + i as u64);
        worst = [worst[0].max(e[0]), worst[1].max(e[1])];
    }
    // Visible with --nocapture: the largest |err| / (1 + Σ|terms|) per tile size.
    println!(
        "winograd worst relative error: F(2,3) {:e}, F(4,3) {:e}",
        worst[0], worst[1]
    );
}

/// The work split of a Winograd call: every tile in exactly one range, none longer than
/// the batch the scratch holds; small images split by output blocks, large ones by tiles.
#[test]
fn winograd_schedule_covers_and_balances() {
    use winograd::{schedule, tile_range};
    for n in 1..4 {
        for tiles in (1..400).step_by(7) {
            for batch in [24, 48, 96] {
                let batch = batch.min(tiles);
                for ocb in 1..8 {
                    for threads in 1..5 {
                        let (batches, splits) = schedule(n, tiles, batch, 4, ocb, threads);
                        assert!(batches >= tiles.div_ceil(batch) && (1..=ocb).contains(&splits));
                        let mut next = 0;
                        for b in 0..batches {
                            let (t0, t1) = tile_range(tiles, batches, b);
                            assert!(t0 == next && t1 - t0 <= batch, "{tiles} {batches} {b}");
                            next = t1;
                        }
                        assert_eq!(next, tiles);
                    }
                }
            }
        }
    }
    // YOLOv8n's 20×20 layers, 64 channels: 25 tiles of F(4,3); two threads take two
    // output blocks each.
    assert_eq!(schedule(1, 25, 25, 4, 4, 2), (1, 2));
    // ddddocr's 52×52 layers, 48 channels: 169 tiles in batches of 84, split by tiles.
    assert_eq!(schedule(1, 169, 84, 3, 3, 2).1, 1);
    assert_eq!(schedule(1, 169, 84, 3, 3, 1), (3, 1));
}

/// The tile-product micro-kernels of every ISA, for every tile count and output-block
/// count a call may have, against an f64 product (including IC remainders of the
/// 4-unrolled loop).
#[test]
fn winograd_tile_products_match_reference() {
    use winograd::{gemm_tiles, Tiles, K_AVX2, K_AVX512, K_PORTABLE, UR, UR512};
    let mut r = Lcg(77);
    for isa in isas() {
        let (rows_max, nb_max) = if isa == Isa::Avx512 {
            (UR512, 2)
        } else {
            (UR, 1)
        };
        for k in [1, 3, 4, 17, 48] {
            for rows in 1..=rows_max {
                for nb in 1..=nb_max {
                    let (lda, ldb, ldo) = (k + 3, k * BLOCK + 32, 3 * BLOCK);
                    let obs = rows * ldo + BLOCK;
                    let a = r.vec(rows * lda);
                    let b = r.vec(nb * ldb);
                    let mut out = vec![f32::NAN; nb * obs];
                    let t = Tiles {
                        rows,
                        k,
                        a: a.as_ptr(),
                        lda,
                        nb,
                        b: b.as_ptr(),
                        ldb,
                        out: out.as_mut_ptr(),
                        ldo,
                        obs,
                    };
                    // SAFETY: the buffers hold what `t` describes; each kernel runs only
                    // when isas() says the CPU has its ISA.
                    unsafe {
                        match isa {
                            Isa::Portable => gemm_tiles::<K_PORTABLE>(&t),
                            Isa::Avx2 => gemm_tiles::<K_AVX2>(&t),
                            Isa::Avx512 => gemm_tiles::<K_AVX512>(&t),
                        }
                    }
                    for j in 0..nb {
                        for row in 0..rows {
                            for l in 0..BLOCK {
                                let terms = (0..k).map(|p| {
                                    a[row * lda + p] as f64 * b[j * ldb + p * BLOCK + l] as f64
                                });
                                let want: f64 = terms.clone().sum();
                                let mag: f64 = terms.map(f64::abs).sum();
                                let got = out[j * obs + row * ldo + l] as f64;
                                assert!(
                                    (got - want).abs() <= 1e-5 * (1.0 + mag),
                                    "{} k={k} rows={rows} nb={nb} block {j} row {row} lane {l}: {got} vs {want}",
                                    isa.name()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn winograd_rejects_other_shapes() {
    let ok = ConvShape::new(1, 8, [8, 8], 8, [3, 3], [1, 1], P1, [1, 1], 1).unwrap();
    assert!(winograd_supported(&ok));
    let w = vec![0.0; 8 * 8 * 9];
    assert!(PackedWinograd::new(ok, 2, &w, None).is_ok());
    assert!(PackedWinograd::new(ok, 3, &w, None).is_err());
    assert!(PackedWinograd::new(ok, 4, &w[1..], None).is_err());
    assert!(PackedWinograd::new(ok, 4, &w, Some(&[0.0; 7])).is_err());
    let bad = [
        ConvShape::new(1, 8, [8, 8], 8, [3, 3], [2, 2], P1, [1, 1], 1),
        ConvShape::new(1, 8, [8, 8], 8, [1, 1], [1, 1], P0, [1, 1], 1),
        ConvShape::new(1, 8, [8, 8], 8, [3, 3], [1, 1], P1, [1, 1], 2),
        ConvShape::new(1, 8, [8, 8], 8, [3, 3], [1, 1], P1, [2, 2], 1),
        ConvShape::new(1, 8, [8, 8], 8, [3, 3], [1, 1], P3, [1, 1], 1),
        ConvShape::new(1, 8, [8, 8], 8, [5, 5], [1, 1], P1, [1, 1], 1),
    ];
    for s in bad {
        let s = s.unwrap();
        assert!(!winograd_supported(&s), "{s:?}");
        let w = vec![0.0; s.oc * s.ic / s.groups * s.kh * s.kw];
        assert!(PackedWinograd::new(s, 4, &w, None).is_err(), "{s:?}");
    }
}
