//! The CUDA backend on a device against the reference interpreter: one test per op
//! family (cuBLAS GEMMs with transposes, batches and broadcasts; fused GEMM epilogues;
//! generated elementwise/broadcast chains, reductions, softmax, layernorm, gelu,
//! convolutions, pooling; views), per-shape programs for symbolic inputs, concurrent
//! runs, and the errors. Without a usable device each test skips through
//! `common::require` (`KILN_REQUIRE=cuda-device` makes that a failure, for a machine
//! that has a GPU).
#![cfg(feature = "cuda")]

use crate::common;

use kiln::backend::registered::{CudaKernel, Kernels, RawTensor};
use kiln::backend::{backend_with, device_available, Device, Executable};
use kiln::ir::{text, Attr, Attrs, Graph, TensorType, Value};
use kiln::passes::CompileOptions;
use kiln::{Error, Tensor};

use common::{ints, op, param, random_inputs, require, weight, Need, Rng};

/// Whether cuda:0 can be used; otherwise the test skips (`Need::CudaDevice`).
fn device() -> bool {
    require(
        Need::CudaDevice,
        device_available(Device::Cuda(0)).map_err(|e| format!("no CUDA device ({e})")),
    )
}

fn cuda_exe(g: &Graph) -> Box<dyn Executable> {
    backend_with(Device::Cuda(0), CompileOptions::default())
        .unwrap()
        .compile(g)
        .unwrap_or_else(|e| panic!("compiling for cuda:0: {e}\n{}", text::print(g)))
}

/// `g` on cuda:0 gives the interpreter's outputs (f32 tolerance for reordered sums).
fn check(test: &str, g: &Graph, seed: u64) {
    if !device() {
        return;
    }
    let exe = cuda_exe(g);
    let interp = backend_with(Device::Interp, CompileOptions::default())
        .unwrap()
        .compile(g)
        .unwrap();
    let inputs = random_inputs(g, &mut Rng(seed), 5, 1.0);
    let want = interp.run(&inputs).unwrap();
    let got = exe.run(&inputs).unwrap_or_else(|e| panic!("{test}: {e}"));
    assert_eq!(got.len(), want.len());
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        a.check_close(b, 1e-4, 1e-3)
            .unwrap_or_else(|e| panic!("{test}: output {k}: {e}\n{}", text::print(g)));
    }
}

#[test]
fn gemms_transposed_batched_broadcast_and_vectors() {
    let (m, k, n) = (13, 19, 11);
    for (ta, tb) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let mut g = Graph::new("gemm");
        let mut rng = Rng(1);
        let a_dims = if ta == 1 { [k, m] } else { [m, k] };
        let b_dims = if tb == 1 { [n, k] } else { [k, n] };
        let a = param(&mut g, "a", &a_dims);
        let b = weight(&mut g, &mut rng, "b", &b_dims);
        let c = param(&mut g, "c", &[m, n]);
        let attrs = Attrs::new()
            .with("transA", Attr::Int(ta))
            .with("transB", Attr::Int(tb))
            .with("alpha", Attr::Float(0.5))
            .with("beta", Attr::Float(2.0));
        let y = op(&mut g, "Gemm", &[a, b, c], attrs);
        g.add_output("y", y).unwrap();
        check("gemm", &g, 2);
    }
    // Batched with broadcast batch axes, a shared weight (folded into one GEMM), and
    // vectors on either side.
    let cases: &[(&[usize], &[usize])] = &[
        (&[4, 7, 5], &[4, 5, 3]),
        (&[2, 1, 7, 5], &[3, 5, 6]),
        (&[3, 7, 5], &[5, 6]),
        (&[5], &[5, 6]),
        (&[7, 5], &[5]),
        (&[2, 7, 5], &[5]),
    ];
    for (i, (a_dims, b_dims)) in cases.iter().enumerate() {
        let mut g = Graph::new("matmul");
        let a = param(&mut g, "a", a_dims);
        let b = param(&mut g, "b", b_dims);
        let y = op(&mut g, "MatMul", &[a, b], Attrs::new());
        g.add_output("y", y).unwrap();
        check("matmul", &g, i as u64);
    }
}

#[test]
fn fused_matmul_epilogues() {
    // MatMul + bias + residual + activation: the pipeline fuses it into a FusedMatMul,
    // which runs as a cuBLAS GEMM and the generated epilogue.
    for act in ["Relu", "Sigmoid", "Tanh"] {
        let mut g = Graph::new("fused");
        let mut rng = Rng(3);
        let x = param(&mut g, "x", &[6, 17]);
        let w = weight(&mut g, &mut rng, "w", &[17, 9]);
        let bias = weight(&mut g, &mut rng, "bias", &[9]);
        let z = param(&mut g, "z", &[6, 9]);
        let y = op(&mut g, "MatMul", &[x, w], Attrs::new());
        let y = op(&mut g, "Add", &[y, bias], Attrs::new());
        let y = op(&mut g, "Add", &[y, z], Attrs::new());
        let y = op(&mut g, act, &[y], Attrs::new());
        g.add_output("y", y).unwrap();
        check("fused matmul", &g, 4);
    }
}

#[test]
fn elementwise_chains_and_broadcasts() {
    let mut g = Graph::new("eltwise");
    let mut rng = Rng(5);
    let x = param(&mut g, "x", &[3, 5, 33]);
    let y = param(&mut g, "y", &[3, 5, 33]);
    let row = weight(&mut g, &mut rng, "row", &[33]);
    let col = weight(&mut g, &mut rng, "col", &[3, 1, 33]);
    let h = op(&mut g, "Mul", &[x, y], Attrs::new());
    let h = op(&mut g, "Add", &[h, row], Attrs::new());
    let h = op(&mut g, "Sub", &[h, col], Attrs::new());
    let e = op(&mut g, "Exp", &[h], Attrs::new());
    let t = op(&mut g, "Tanh", &[h], Attrs::new());
    let s = op(&mut g, "Sigmoid", &[t], Attrs::new());
    let r = op(&mut g, "Relu", &[h], Attrs::new());
    let d = op(&mut g, "Div", &[r, e], Attrs::new());
    let a = op(&mut g, "Abs", &[d], Attrs::new());
    g.add_output("s", s).unwrap();
    g.add_output("a", a).unwrap();
    check("elementwise", &g, 6);
}

#[test]
fn reductions() {
    for (k, (name, ax)) in [
        ("ReduceMean", &[2i64][..]),
        ("ReduceSum", &[0, 2]),
        ("ReduceMax", &[1]),
        ("ReduceMin", &[-1]),
        ("ReduceSum", &[0, 1, 2]),
    ]
    .into_iter()
    .enumerate()
    {
        let mut g = Graph::new("reduce");
        let x = param(&mut g, "x", &[4, 7, 130]);
        let axes: Value = g
            .add_constant_value("axes", Tensor::from_vec(&[ax.len()], ax.to_vec()).unwrap())
            .unwrap()
            .into();
        let attrs = Attrs::new().with("keepdims", Attr::Int((k % 2) as i64));
        let y = op(&mut g, name, &[x, axes], attrs);
        g.add_output("y", y).unwrap();
        check("reduce", &g, k as u64);
    }
}

#[test]
fn softmax_layernorm_and_gelu() {
    for width in [1, 7, 100, 768] {
        let mut g = Graph::new("rows");
        let mut rng = Rng(width as u64);
        let x = param(&mut g, "x", &[3, 5, width]);
        let gamma = weight(&mut g, &mut rng, "gamma", &[width]);
        let beta = weight(&mut g, &mut rng, "beta", &[width]);
        let axis = Attrs::new().with("axis", Attr::Int(-1));
        let s = op(&mut g, "Softmax", &[x], axis.clone());
        let ln = op(&mut g, "LayerNormalization", &[x, gamma, beta], axis);
        let ge = op(&mut g, "Gelu", &[ln], Attrs::new());
        g.add_output("softmax", s).unwrap();
        g.add_output("layernorm_gelu", ge).unwrap();
        check("softmax/layernorm/gelu", &g, 7);
    }
}

#[test]
fn convolutions_and_pooling() {
    // NCHW (no layout blocking on CUDA): strides, pads, dilation, groups, bias,
    // residual and activation (a FusedConv after the pipeline), then pooling.
    for (c, group, stride, dilation) in [(3usize, 1i64, 1, 1), (8, 2, 2, 1), (4, 4, 1, 2)] {
        let mut g = Graph::new("conv");
        let mut rng = Rng(c as u64);
        let x = param(&mut g, "x", &[2, c, 11, 9]);
        let w = weight(&mut g, &mut rng, "w", &[8, c / group as usize, 3, 3]);
        let b = weight(&mut g, &mut rng, "b", &[8]);
        let attrs = ints(&[
            ("pads", &[1, 1, 1, 1]),
            ("strides", &[stride, stride]),
            ("dilations", &[dilation, dilation]),
        ])
        .with("group", Attr::Int(group));
        let y = op(&mut g, "Conv", &[x, w, b], attrs);
        let y = op(&mut g, "Relu", &[y], Attrs::new());
        let pool = ints(&[("kernel_shape", &[2, 2]), ("strides", &[2, 2])]);
        let m = op(&mut g, "MaxPool", &[y], pool.clone());
        let a = op(&mut g, "AveragePool", &[y], pool);
        g.add_output("max", m).unwrap();
        g.add_output("avg", a).unwrap();
        check("conv/pool", &g, 8);
    }
}

#[test]
fn views() {
    let mut g = Graph::new("views");
    let x = param(&mut g, "x", &[4, 6, 5]);
    let shape: Value = g
        .add_constant_value("shape", Tensor::from_vec(&[2], vec![24i64, 5]).unwrap())
        .unwrap()
        .into();
    let r = op(&mut g, "Reshape", &[x, shape], Attrs::new());
    let e = op(&mut g, "Exp", &[r], Attrs::new());
    g.add_output("reshaped", r).unwrap();
    g.add_output("exp", e).unwrap();
    // A graph input returned as it is.
    g.add_output("x", x).unwrap();
    check("views", &g, 9);
}

#[test]
fn transposes() {
    let mut g = Graph::new("transpose");
    let x = param(&mut g, "x", &[4, 6, 5]);
    let t = op(&mut g, "Transpose", &[x], ints(&[("perm", &[2, 0, 1])]));
    g.add_output("transposed", t).unwrap();
    check("transpose", &g, 10);
}

#[test]
fn symbolic_batch_runs_per_shape_and_from_many_threads() {
    let kir = r#"graph "mlp" {
  %0 "x" = Parameter : f32[N, 8]
  %1 "w" = Constant : f32[8, 4] = [0.5, -0.25, 0.125, 1.0, 0.5, -0.25, 0.125, 1.0, 0.5, -0.25, 0.125, 1.0, 0.5, -0.25, 0.125, 1.0, 0.5, -0.25, 0.125, 1.0, 0.5, -0.25, 0.125, 1.0, 0.5, -0.25, 0.125, 1.0, 0.5, -0.25, 0.125, 1.0]
  %2 "y" = MatMul(%0, %1) : f32[N, 4]
  return "y" = %2
}
"#;
    let g = text::parse(kir, "mlp.kir", None).unwrap();
    if !device() {
        return;
    }
    let exe = cuda_exe(&g);
    let interp = backend_with(Device::Interp, CompileOptions::default())
        .unwrap()
        .compile(&g)
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (exe, interp) = (&exe, &interp);
            s.spawn(move || {
                let mut rng = Rng(t);
                for batch in [1, 3, 64, 3] {
                    let x = rng.f32_tensor(&[batch, 8], 1.0);
                    let got = exe.run(std::slice::from_ref(&x)).unwrap();
                    let want = interp.run(&[x]).unwrap();
                    got[0].check_close(&want[0], 1e-5, 1e-4).unwrap();
                }
            });
        }
    });
}

#[test]
fn errors_name_the_problem() {
    let mut g = Graph::new("bad");
    let x = param(&mut g, "x", &[3]);
    let y = op(&mut g, "Exp", &[x], Attrs::new());
    g.add_output("y", y).unwrap();
    let state = text::parse(STATE, "state.kir", None).unwrap();
    if !device() {
        return;
    }
    // Bad inputs are caught before anything reaches the device.
    let exe = cuda_exe(&g);
    let err = exe.run(&[Tensor::from_vec(&[2], vec![1.0f32, 2.0]).unwrap()]);
    assert!(matches!(err, Err(Error::InvalidArgument(m)) if m.contains("input 'x'")));
    // Training state is not supported on CUDA yet, and says so at compile.
    let err = backend_with(Device::Cuda(0), CompileOptions::default())
        .unwrap()
        .compile(&state)
        .err()
        .expect("variables are refused");
    assert!(
        matches!(&err, Error::Device(m) if m.contains("not supported on cuda yet") && m.contains("v")),
        "{err}"
    );
}

const STATE: &str = r#"graph "state" {
  %0 "x" = Parameter : f32[2]
  %1 "v" = Variable : f32[2] = [1.0, 2.0]
  %2 "s" = Add(%0, %1) : f32[2]
  %3 "store" = Assign(%1, %2) : ()
  return "s" = %2
}
"#;

#[test]
fn no_device_means_a_clean_error_never_a_panic() {
    // Whatever this machine has: an ordinal no machine has fails with the reason.
    let err = backend_with(Device::Cuda(4_000_000), CompileOptions::default())
        .err()
        .expect("no machine has four million GPUs");
    let Error::Device(msg) = &err else {
        panic!("expected Error::Device, got {err:?}");
    };
    assert!(msg.starts_with("cuda:4000000: "), "{msg}");
    assert!(
        [
            "no CUDA driver",
            "no such device",
            "no CUDA device",
            "failed to initialize"
        ]
        .iter()
        .any(|r| msg.contains(r)),
        "{msg}"
    );
}

type Calls = std::sync::Arc<std::sync::Mutex<Vec<(usize, Vec<usize>, bool)>>>;

/// An external op (y = x) whose CUDA kernel records what it was handed.
struct Recorder {
    schema: kiln::ir::ops::OpSchema,
    kernels: Kernels,
    calls: Calls,
}

/// The recorder's CUDA kernel.
struct RecordCalls(Calls);

impl kiln::ir::ops::Op for Recorder {
    fn schema(&self) -> &kiln::ir::ops::OpSchema {
        &self.schema
    }
    fn validate_attrs(&self, _: &Attrs) -> Result<(), String> {
        Ok(())
    }
    fn infer(&self, cx: &kiln::ir::ops::InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        Ok(vec![cx.input(0)?.clone()])
    }
    fn eval(&self, cx: &kiln::ir::ops::EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        Ok(vec![cx.input(0)?.clone()])
    }
    fn backend_kernels(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        Some(self.kernels.as_any())
    }
}

impl CudaKernel for RecordCalls {
    fn compute(
        &self,
        inputs: &[Option<RawTensor>],
        outputs: &[RawTensor],
        _attrs: &Attrs,
        stream: *mut std::ffi::c_void,
    ) -> Result<(), String> {
        let x = inputs[0].as_ref().ok_or("no input")?;
        let all_set = !x.data.is_null() && !outputs[0].data.is_null() && !stream.is_null();
        self.0
            .lock()
            .unwrap()
            .push((inputs.len(), outputs[0].shape.clone(), all_set));
        Ok(())
    }
}

#[test]
fn external_ops_run_their_cuda_callback_or_are_refused_by_name() {
    let ops: Vec<std::sync::Arc<Recorder>> =
        [("cudatest::with_cuda", true), ("cudatest::cpu_only", false)]
            .into_iter()
            .map(|(name, cuda)| {
                let calls = Calls::default();
                let kernel = std::sync::Arc::new(RecordCalls(calls.clone()));
                let op = std::sync::Arc::new(Recorder {
                    schema: kiln::ir::ops::OpSchema {
                        name,
                        family: "custom",
                        inputs: &["x"],
                        outputs: &["y"],
                        attrs: &[],
                        doc: "records its CUDA calls",
                        in_place: kiln::ir::ops::InPlace::No,
                        origin: kiln::ir::ops::Origin::Onnx,
                    },
                    kernels: Kernels {
                        buffers: None,
                        cuda: cuda.then_some(kernel as std::sync::Arc<dyn CudaKernel>),
                    },
                    calls,
                });
                kiln::ir::ops::custom::register(op.clone()).unwrap();
                op
            })
            .collect();
    let graph = |op: &str| {
        let mut g = Graph::new("ext");
        let x = param(&mut g, "x", &[2, 3]);
        let y = g.op(op, &[x], Attrs::new(), "ext").unwrap();
        g.add_output("y", y.into()).unwrap();
        g
    };
    let (with_cuda, cpu_only) = (graph("cudatest::with_cuda"), graph("cudatest::cpu_only"));
    if !device() {
        return;
    }
    let exe = cuda_exe(&with_cuda);
    exe.run(&[Rng(1).f32_tensor(&[2, 3], 1.0)]).unwrap();
    assert_eq!(*ops[0].calls.lock().unwrap(), vec![(1, vec![2, 3], true)]);
    let err = backend_with(Device::Cuda(0), CompileOptions::default())
        .unwrap()
        .compile(&cpu_only)
        .err()
        .expect("no CUDA kernel");
    let msg = err.to_string();
    assert!(
        msg.contains("cudatest::cpu_only") && msg.contains("compute_cuda"),
        "{msg}"
    );
}
