//! Checked against a naive f64 product. Tolerance: each element of C may differ
//! from the reference by 1e-5·(1 + Σ_p |a_ip·b_pj| + |bias| + |residual|), i.e. a
//! relative 1e-5 of the magnitudes summed (f32 accumulation over k terms).
use super::driver::split;
use super::*;

struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

#[derive(Clone, Copy, Debug)]
enum Layout {
    RowMajor,
    Transposed,
    Strided,
}

/// A `rows`×`cols` matrix in `layout`: its buffer and view.
fn operand(rng: &mut Rng, rows: usize, cols: usize, layout: Layout) -> (Vec<f32>, Mat) {
    let (len, rs, cs) = match layout {
        Layout::RowMajor => (rows * cols, cols, 1),
        Layout::Transposed => (rows * cols, 1, rows),
        Layout::Strided => (rows * (2 * cols + 3), 2 * cols + 3, 2),
    };
    let buf = rng.vec(len.max(1));
    let mat = Mat {
        ptr: buf.as_ptr(),
        rs,
        cs,
    };
    (buf, mat)
}

#[derive(Clone, Copy, Debug)]
enum BiasKind {
    None,
    Row,
    Col,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    la: Layout,
    lb: Layout,
    ldc_pad: usize,
    bias: BiasKind,
    residual: bool,
    act: Act,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Plain,
    Packed,
}

fn at(mat: Mat, i: usize, j: usize) -> f32 {
    // SAFETY: tests index inside the operand buffers built by `operand`.
    unsafe { *mat.ptr.add(i * mat.rs + j * mat.cs) }
}

fn check(case: Case, isa: Isa, pool: Option<&Pool>, path: Path, seed: u64) {
    let Case { m, n, k, .. } = case;
    let mut rng = Rng(seed);
    let (_abuf, a) = operand(&mut rng, m, k, case.la);
    let (_bbuf, b) = operand(&mut rng, k, n, case.lb);
    let bias_v = rng.vec(m.max(n).max(1));
    let bias = match case.bias {
        BiasKind::None => Bias::None,
        BiasKind::Row => Bias::PerRow(bias_v.as_ptr()),
        BiasKind::Col => Bias::PerCol(bias_v.as_ptr()),
    };
    let ldr = n + 3;
    let res_v = rng.vec((m * ldr).max(1));
    let ep = Epilogue {
        bias,
        residual: case.residual.then_some((res_v.as_ptr(), ldr)),
        act: case.act,
    };
    let ldc = n + case.ldc_pad;
    const SENTINEL: f32 = 12345.0;
    let mut c = vec![SENTINEL; (m * ldc).max(1)];
    // Kept alive until the product is done: `src` points into it.
    let pb;
    let src = match path {
        Path::Plain => BSrc::Mat(b),
        Path::Packed => {
            // SAFETY: `operand` built `b` as a valid k×n matrix.
            pb = unsafe { PackedB::new(m, k, n, b) };
            pb.src()
        }
    };
    let (kern, cp) = (kernel_for(isa), c.as_mut_ptr());
    // SAFETY: A (m×k) and B (k×n) are `operand`'s buffers, C holds m rows of `ldc`,
    // the bias max(m, n) values and the residual m rows of `ldr`; `c` is not aliased.
    unsafe { driver(kern, pool, 0, m, n, k, a, src, cp, ldc, &ep) };
    for i in 0..m {
        let mut pre = vec![0f32; n];
        let mut tol = vec![0f64; n];
        for j in 0..n {
            let (mut s, mut mag) = (0f64, 1f64);
            for p in 0..k {
                let t = at(a, i, p) as f64 * at(b, p, j) as f64;
                s += t;
                mag += t.abs();
            }
            let bv = match case.bias {
                BiasKind::None => 0.0,
                BiasKind::Row => bias_v[i] as f64,
                BiasKind::Col => bias_v[j] as f64,
            };
            let rv = if case.residual {
                res_v[i * ldr + j] as f64
            } else {
                0.0
            };
            pre[j] = (s + bv + rv) as f32;
            tol[j] = 1e-5 * (mag + bv.abs() + rv.abs());
        }
        case.act.apply(&mut pre);
        for j in 0..n {
            let got = c[i * ldc + j];
            assert!(
                (got as f64 - pre[j] as f64).abs() <= tol[j],
                "{case:?} {isa:?} pool={} {path:?}: C[{i}][{j}] = {got}, want {}",
                pool.is_some(),
                pre[j]
            );
        }
        for j in n..ldc {
            assert_eq!(c[i * ldc + j], SENTINEL, "{case:?}: wrote past n");
        }
    }
}

const DIMS: [usize; 14] = [0, 1, 2, 5, 6, 7, 13, 16, 17, 31, 33, 64, 100, 257];
const ACTS: [Act; 7] = [
    Act::None,
    Act::Relu,
    Act::LeakyRelu(0.1),
    Act::Sigmoid,
    Act::Gelu,
    Act::Clip(-0.5, 0.5),
    Act::Tanh,
];
const LAYOUTS: [Layout; 3] = [Layout::RowMajor, Layout::Transposed, Layout::Strided];
const BIASES: [BiasKind; 3] = [BiasKind::None, BiasKind::Row, BiasKind::Col];

/// A deterministic spread of (m, n, k) triples over DIMS, every k = 0 edge included.
fn cases() -> Vec<Case> {
    let mut rng = Rng(7);
    let mut triples = vec![(7, 13, 0), (0, 5, 3), (5, 0, 3), (1, 1, 0), (64, 33, 0)];
    for _ in 0..70 {
        let mut pick = || DIMS[((rng.f() + 1.0) * 0.5 * DIMS.len() as f32) as usize % 14];
        triples.push((pick(), pick(), pick()));
    }
    // Crossing every block size: m > MC, k > KC, n > NC.
    triples.extend([
        (257, 257, 257),
        (150, 40, 300),
        (7, NC + 20, 5),
        (6, 16, 256),
        // A short A over several K slices: the packed path runs B column by column.
        (64, 70, 3 * KC + 5),
        // A tall one: several row blocks of it, the last ragged (B packed whole).
        (700, 40, 3 * KC + 5),
        // Deep enough that B is packed in KC slices, with rows for two tiles.
        (30, 20, 2100),
        (13, 33, KC + 1),
    ]);
    triples
        .into_iter()
        .enumerate()
        .map(|(x, (m, n, k))| Case {
            m,
            n,
            k,
            la: LAYOUTS[x % 3],
            lb: LAYOUTS[(x / 3) % 3],
            ldc_pad: [0, 1, 5][(x / 2) % 3],
            bias: BIASES[(x / 5) % 3],
            residual: x % 4 >= 2,
            act: ACTS[x % ACTS.len()],
        })
        .collect()
}

#[test]
fn matches_reference_every_path() {
    let pool = Pool::new(2);
    for (x, case) in cases().into_iter().enumerate() {
        for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
            for pool in [None, Some(&pool)] {
                for path in [Path::Plain, Path::Packed] {
                    check(case, isa, pool, path, 100 + x as u64);
                }
            }
        }
    }
}

#[test]
fn every_epilogue_combination() {
    let pool = Pool::new(2);
    let mut x = 0;
    for bias in BIASES {
        for residual in [false, true] {
            for act in ACTS {
                let case = Case {
                    m: 17,
                    n: 33,
                    k: 31,
                    la: Layout::RowMajor,
                    lb: Layout::RowMajor,
                    ldc_pad: 2,
                    bias,
                    residual,
                    act,
                };
                for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
                    check(case, isa, Some(&pool), Path::Plain, x);
                    check(case, isa, None, Path::Packed, x);
                    x += 1;
                }
            }
        }
    }
}

/// Every tile shape the wide (12×32) kernels produce: each row count up to two
/// 12-row tiles and one more, column counts around each 16/32 boundary, depths
/// within one KC slice and across two (accumulating), with column-major operands
/// (the packers' transposed paths) and with pre-packed B.
#[test]
fn wide_tile_edges() {
    // On an AVX-512 machine (and compiler) the wide kernel is the one under test.
    #[cfg(target_arch = "x86_64")]
    if isa::detected() == Isa::Avx512 {
        assert_eq!(
            (kernel_for(Isa::Avx512).mr, kernel_for(Isa::Avx512).nr),
            (12, 32)
        );
    }
    let mut x = 0;
    for m in 1..=25 {
        for n in [1, 15, 16, 17, 31, 32, 33, 47, 48, 49] {
            for (k, la, lb) in [
                (1, Layout::RowMajor, Layout::RowMajor),
                (9, Layout::Transposed, Layout::Transposed),
                (KC + 11, Layout::Transposed, Layout::RowMajor),
                (KC + 37, Layout::RowMajor, Layout::Transposed),
            ] {
                let case = Case {
                    m,
                    n,
                    k,
                    la,
                    lb,
                    ldc_pad: x % 3,
                    bias: BIASES[x % 3],
                    residual: x % 2 == 0,
                    act: ACTS[x % ACTS.len()],
                };
                for isa in [Isa::Avx2, Isa::Avx512] {
                    let path = [Path::Plain, Path::Packed][x % 2];
                    check(case, isa, None, path, x as u64);
                }
                x += 1;
            }
        }
    }
}

/// The public entry points (default dispatch and size threshold) against OpenBLAS.
#[cfg(feature = "openblas")]
#[test]
fn public_entry_points_agree_with_openblas() {
    let pool = Pool::new(2);
    let mut rng = Rng(3);
    for (m, n, k) in [(64, 512, 784), (128, 96, 100), (3, 5, 7), (2048, 49, 64)] {
        let a = rng.vec(m * k);
        let b = rng.vec(k * n);
        let bias = rng.vec(n);
        let ep = Epilogue {
            bias: Bias::PerCol(bias.as_ptr()),
            residual: None,
            act: Act::Relu,
        };
        let (am, bm) = (Mat::rows(a.as_ptr(), k), Mat::rows(b.as_ptr(), n));
        let mut want = vec![0f32; m * n];
        let mut got = vec![0f32; m * n];
        let mut got_packed = vec![0f32; m * n];
        use crate::backend::cpu::kernels::blas::gemm_openblas;
        // SAFETY: `a` is m×k and `b` k×n row-major, the bias has n values, and each
        // output vector holds its own m×n C (row stride n).
        unsafe {
            gemm_openblas(m, n, k, am, bm, want.as_mut_ptr(), n, &ep);
            gemm(Some(&pool), m, n, k, am, bm, got.as_mut_ptr(), n, &ep);
            let pb = PackedB::new(m, k, n, bm);
            gemm_packed(None, m, n, k, am, &pb, got_packed.as_mut_ptr(), n, &ep);
        }
        for ((w, g), gp) in want.iter().zip(&got).zip(&got_packed) {
            let tol = 1e-5 * (1.0 + k as f32);
            assert!(
                (w - g).abs() <= tol && (w - gp).abs() <= tol,
                "{w} {g} {gp}"
            );
        }
    }
}

#[test]
fn split_balances_two_threads() {
    // Small M: split N into equal halves.
    assert_eq!(split(2, 64, 512, 784, PAR_MIN_WORK), (1, 2));
    assert_eq!(split(2, 128, 768, 768, PAR_MIN_WORK), (1, 2));
    // Narrow N: split M.
    assert_eq!(split(2, 2048, 49, 512, PAR_MIN_WORK), (2, 1));
    // Tiny problems stay serial.
    assert_eq!(split(2, 8, 8, 8, PAR_MIN_WORK), (1, 1));
    assert_eq!(split(1, 1024, 1024, 1024, PAR_MIN_WORK), (1, 1));
}
