//! What the integration tests share: a deterministic random generator, graph-building
//! shorthands, the finite-difference gradient checker, the real-model list, and the one
//! way a test skips when something it needs is missing (`require`). Each test crate
//! includes it with `mod common;` (benches with `#[path]`); no crate uses all of it.
#![allow(dead_code)]

pub mod control_graphs;
pub mod train_graphs;

use std::path::{Path, PathBuf};

use kiln::autodiff::grad;
use kiln::backend::{backend_with, Device};
use kiln::ir::{text, Attr, Attrs, DType, Graph, Shape, TensorType, Value};
use kiln::passes::CompileOptions;
use kiln::{Dim, Tensor};

// ---------------------------------------------------------------------------------------
// Source files

/// Every `.rs` file under `dir`, recursively, appended to `out`.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Skipping

/// Something a test needs that a machine may lack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// The ONNX node suite (`target/onnx-node`, from `scripts/onnx-node-tests.sh`) and
    /// the real models (`target/real-models`, from `scripts/test-onnx-models.sh`).
    OnnxSuite,
    /// A CPU with AVX-512F, and kiln using it (not `KILN_CPU_ISA=portable`).
    Avx512f,
    /// A usable CUDA device.
    CudaDevice,
    /// NVRTC and ptxas (`eval "$(scripts/cuda-tools.sh)"`).
    CudaTools,
    /// g++, for the CUDA host emulation.
    Gxx,
    /// The contrib-op cases (`target/contrib-cases`, from `scripts/contrib-cases.sh`).
    ContribCases,
    /// The zoo of real models (`target/zoo`, from `scripts/model-zoo.sh`, which needs PyPI).
    Zoo,
    /// Headless Chromium (Debian's `chromium`), to load the pictures Kiln draws.
    Chromium,
    /// Graphviz's `dot` on the PATH (`kiln viz` renders SVG with it).
    Graphviz,
}

impl Need {
    pub const ALL: [Need; 9] = [
        Need::OnnxSuite,
        Need::Avx512f,
        Need::CudaDevice,
        Need::CudaTools,
        Need::Gxx,
        Need::ContribCases,
        Need::Zoo,
        Need::Chromium,
        Need::Graphviz,
    ];

    /// The need's name in `KILN_REQUIRE`.
    pub fn name(self) -> &'static str {
        match self {
            Need::OnnxSuite => "onnx-suite",
            Need::Avx512f => "avx512f",
            Need::CudaDevice => "cuda-device",
            Need::CudaTools => "cuda-tools",
            Need::Gxx => "gxx",
            Need::ContribCases => "contrib-cases",
            Need::Zoo => "zoo",
            Need::Chromium => "chromium",
            Need::Graphviz => "graphviz",
        }
    }
}

/// Whether `list` (the value of `KILN_REQUIRE`: needs separated by commas, or `all`)
/// names `need`; an unknown name is an error, so that a typo cannot turn a required
/// check back into a skip.
pub fn required_by(list: &str, need: Need) -> Result<bool, String> {
    let mut found = false;
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if name == "all" || name == need.name() {
            found = true;
        } else if !Need::ALL.iter().any(|n| n.name() == name) {
            let known: Vec<&str> = Need::ALL.iter().map(|n| n.name()).collect();
            return Err(format!(
                "KILN_REQUIRE names '{name}'; the needs are all, {}",
                known.join(", ")
            ));
        }
    }
    Ok(found)
}

/// Whether a test can go on: true when `found` is `Ok`. Otherwise it prints
/// `SKIPPED <test>: <reason>` and returns false, unless `KILN_REQUIRE` lists `need` (or
/// is `all`): then the missing need fails the test. Every conditional skip goes through
/// here, so that CI can turn each kind of skip into a failure.
#[track_caller]
pub fn require(need: Need, found: Result<(), String>) -> bool {
    let Err(why) = found else {
        return true;
    };
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let list = std::env::var("KILN_REQUIRE").unwrap_or_default();
    match required_by(&list, need) {
        Ok(true) => panic!(
            "{test}: {why} (KILN_REQUIRE={list} requires {})",
            need.name()
        ),
        Ok(false) => {
            println!("SKIPPED {test}: {why}");
            false
        }
        Err(e) => panic!("{e}"),
    }
}

/// `Ok` when `path` exists, else why not and which script writes it.
pub fn exists(path: &Path, written_by: &str) -> Result<(), String> {
    if path.exists() {
        Ok(())
    } else {
        Err(format!(
            "{} is missing ({written_by} writes it)",
            path.display()
        ))
    }
}

/// Runs `f` and returns the panic's message if it panicked.
pub fn panic_of(f: impl FnOnce()) -> Option<String> {
    let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).err()?;
    Some(
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into()),
    )
}

// ---------------------------------------------------------------------------------------
// Random numbers

/// splitmix64: a seed gives the same numbers on every run and machine.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (0 when n is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// One of `items`, uniformly (which must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Uniform in [-1, 1), from 24 bits (exact in f32).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// Uniform in [0, 1), from 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [-1, 1).
    pub fn f64(&mut self) -> f64 {
        self.unit() * 2.0 - 1.0
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// An f32 tensor uniform in [-scale, scale).
    pub fn f32_tensor(&mut self, dims: &[usize], scale: f32) -> Tensor {
        let n = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| self.f32() * scale).collect();
        Tensor::from_vec(dims, v).unwrap()
    }

    /// An f64 tensor uniform in [-1, 1).
    pub fn f64_tensor(&mut self, dims: &[usize]) -> Tensor {
        let n = dims.iter().product();
        Tensor::from_vec(dims, (0..n).map(|_| self.f64()).collect::<Vec<f64>>()).unwrap()
    }

    /// An f64 tensor in ±[lo, 1): away from 0 by `lo` (the kinks of Relu and Abs, the
    /// poles of 1/x).
    pub fn f64_tensor_away_from_zero(&mut self, dims: &[usize], lo: f64) -> Tensor {
        let n = dims.iter().product();
        let v: Vec<f64> = (0..n)
            .map(|_| {
                let r = self.f64();
                r.signum() * (lo + (1.0 - lo) * r.abs())
            })
            .collect();
        Tensor::from_vec(dims, v).unwrap()
    }

    /// A tensor of `dtype`: booleans at random, integers in -100..=100, floats in [-2, 2).
    pub fn tensor_of(&mut self, dtype: DType, dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        match dtype {
            DType::Bool => {
                let v: Vec<bool> = (0..n).map(|_| self.next_u64() & 1 == 1).collect();
                Tensor::from_vec(dims, v).unwrap()
            }
            d if d.is_int() => {
                let v: Vec<i64> = (0..n)
                    .map(|_| (self.next_u64() % 201) as i64 - 100)
                    .collect();
                Tensor::from_i64s(d, dims, &v).unwrap()
            }
            d => {
                let v: Vec<f64> = (0..n).map(|_| self.uniform(-2.0, 2.0)).collect();
                Tensor::from_f64s(d, dims, &v).unwrap()
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Building graphs

pub fn f32_type(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, Shape::fixed(dims))
}

pub fn f64_type(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F64, Shape::fixed(dims))
}

/// An f32 parameter of static shape.
pub fn param(g: &mut Graph, name: &str, dims: &[usize]) -> Value {
    typed_param(g, name, DType::F32, dims)
}

pub fn typed_param(g: &mut Graph, name: &str, dtype: DType, dims: &[usize]) -> Value {
    g.add_parameter(name, TensorType::new(dtype, Shape::fixed(dims)))
        .unwrap()
        .into()
}

/// An unnamed node's first output; a bad node panics with the graph printed.
pub fn op(g: &mut Graph, op: &str, inputs: &[Value], attrs: Attrs) -> Value {
    named_op(g, op, inputs, attrs, "")
}

pub fn named_op(g: &mut Graph, op: &str, inputs: &[Value], attrs: Attrs, name: &str) -> Value {
    g.op(op, inputs, attrs, name)
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)))
        .into()
}

/// A constant named `name`, random f32 in [-1, 1).
pub fn weight(g: &mut Graph, rng: &mut Rng, name: &str, dims: &[usize]) -> Value {
    g.add_constant_value(name, rng.f32_tensor(dims, 1.0))
        .unwrap()
        .into()
}

/// A constant under a fresh name.
pub fn constant(g: &mut Graph, t: Tensor) -> Value {
    let name = g.fresh_name("c");
    g.add_constant_value(&name, t).unwrap().into()
}

/// Integer-list attributes.
pub fn ints(pairs: &[(&str, &[i64])]) -> Attrs {
    pairs
        .iter()
        .fold(Attrs::new(), |a, (k, v)| a.with(k, Attr::Ints(v.to_vec())))
}

/// Random f32 inputs in [-scale, scale) for `g`'s parameters, symbolic dims being `sym`.
pub fn random_inputs(g: &Graph, rng: &mut Rng, sym: usize, scale: f32) -> Vec<Tensor> {
    g.inputs()
        .iter()
        .map(|&id| {
            let dims: Vec<usize> = g.node(id).outputs[0]
                .shape
                .axes
                .iter()
                .map(|a| match a.dim {
                    Dim::Fixed(n) => n,
                    Dim::Sym(_) => sym,
                })
                .collect();
            rng.f32_tensor(&dims, scale)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Gradients

/// The gradients of the scalar `loss` with respect to `params` (the values of param `p`
/// being `values[first_param + p]`; the values before are undifferentiated inputs)
/// against central differences, element by element, on the reference interpreter:
/// relative error ≤ 1e-6 (absolute below magnitudes of 1e-2). Outputs `g` already has
/// are computed too and ignored. Returns the worst error.
pub fn check_gradients(
    g: &Graph,
    loss: Value,
    params: &[Value],
    values: &[Tensor],
    first_param: usize,
) -> f64 {
    let mut g = g.clone();
    let skip = g.outputs().len();
    let grads = grad(&mut g, loss, params).unwrap_or_else(|e| panic!("{e}\n{}", text::print(&g)));
    g.add_output("loss", loss).unwrap();
    for (i, gv) in grads.iter().enumerate() {
        g.add_output(&format!("grad{i}"), *gv).unwrap();
    }
    let exe = backend_with(Device::Interp, CompileOptions::default())
        .unwrap()
        .compile(&g)
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(&g)));
    let run = |vals: &[Tensor]| {
        exe.run(vals)
            .unwrap_or_else(|e| panic!("{e}\n{}", text::print(&g)))
    };
    let base = run(values);
    let h = 1e-5;
    let mut worst = 0.0f64;
    for p in 0..params.len() {
        let value = &values[first_param + p];
        assert_eq!(
            base[skip + 1 + p].shape(),
            value.shape(),
            "gradient {p}'s shape"
        );
        let x = value.to_f64_vec();
        for (k, &ana) in base[skip + 1 + p].to_f64_vec().iter().enumerate() {
            let at = |d: f64| {
                let mut xs = x.clone();
                xs[k] += d;
                let mut vals = values.to_vec();
                vals[first_param + p] = Tensor::from_vec(value.shape(), xs).unwrap();
                run(&vals)[skip].to_f64_vec()[0]
            };
            let numeric = (at(h) - at(-h)) / (2.0 * h);
            let err = (ana - numeric).abs() / ana.abs().max(numeric.abs()).max(1e-2);
            worst = worst.max(err);
            assert!(
                err <= 1e-6,
                "{}: d loss / d p{p}[{k}]: {ana} by the rules, {numeric} by differences (rel {err:.1e})\n{}",
                g.name,
                text::print(&g)
            );
        }
    }
    worst
}

// ---------------------------------------------------------------------------------------
// Models

/// A graph file (`.kir` or ONNX) and the sizes of its symbolic dims.
pub type Model = (PathBuf, Vec<(&'static str, usize)>);

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `target/real-models/<name>/model.onnx`, or `None` after `require(Need::OnnxSuite)`
/// (which fails the test when the suite is required).
pub fn real_model(name: &str) -> Option<PathBuf> {
    let p = root()
        .join("target/real-models")
        .join(name)
        .join("model.onnx");
    require(Need::OnnxSuite, exists(&p, "scripts/test-onnx-models.sh")).then_some(p)
}

/// The repository's test graphs, then the real models with small dims (each skipped
/// through `require` when missing).
pub fn test_graphs_and_real_models() -> Vec<Model> {
    let mut out: Vec<Model> = vec![
        (
            root().join("tests/graphs/attention.kir"),
            vec![("B", 2), ("H", 3), ("Q", 5), ("K", 7)],
        ),
        (root().join("tests/graphs/convnet.kir"), vec![("N", 2)]),
        (root().join("examples/graphs/mlp.kir"), vec![("N", 3)]),
    ];
    let suite = [
        ("mlp", vec![("N", 2)]),
        ("small_cnn", vec![("N", 2)]),
        ("resnet18", vec![("N", 1), ("H", 32), ("W", 32)]),
        ("resnet50", vec![("N", 1), ("H", 32), ("W", 32)]),
        ("bert_encoder", vec![("B", 1), ("S", 16)]),
    ];
    for (name, dims) in suite {
        if let Some(p) = real_model(name) {
            out.push((p, dims));
        }
    }
    out
}
