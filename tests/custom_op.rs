//! Registered (external) ops from the Rust side: ONNX custom domains, the text format,
//! panics contained at the C ABI, constant folding only of pure ops, the passes and the
//! memory planner treating them as opaque, and interpreter / CPU backend agreement with
//! the same computation in built-in ops. The C side (registration struct, versioning,
//! callbacks' errors) is `tests/capi/custom_op.c`.
//!
//! Tests run in parallel in one process and the registry is global: each test registers
//! its own op names.
use std::ffi::CString;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kiln::backend::{backend_for, Device};
use kiln::capi::graph::{
    kiln_graph_add_op, kiln_graph_add_parameter, kiln_graph_free, kiln_graph_new,
};
use kiln::capi::{kiln_last_error_message, KILN_STATUS_INVALID_GRAPH};
use kiln::ir::ops::custom::{self, OpRef};
use kiln::ir::ops::{EvalCtx, InferCtx, Op, OpSchema};
use kiln::ir::{text, Attr, Attrs, Graph, TensorType, Value};
use kiln::Tensor;

/// y = x * sigmoid(beta * x) on f32, in Rust; counts its evaluations; may panic.
struct Swish {
    schema: OpSchema,
    pure: bool,
    evals: AtomicUsize,
    panic_in: Option<&'static str>,
    /// Whether it brings its own gradient rule (built from catalogue ops).
    with_gradient: bool,
}

fn swish(name: &'static str, pure: bool, panic_in: Option<&'static str>) -> Arc<Swish> {
    Arc::new(Swish {
        schema: OpSchema {
            name,
            family: "custom",
            inputs: &["x"],
            outputs: &["y"],
            attrs: &[],
            doc: "test swish",
            in_place: kiln::ir::ops::InPlace::No,
            origin: kiln::ir::ops::Origin::Onnx,
        },
        pure,
        evals: AtomicUsize::new(0),
        panic_in,
        with_gradient: false,
    })
}

impl Op for Swish {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }
    fn validate_attrs(&self, _: &Attrs) -> Result<(), String> {
        Ok(())
    }
    fn pure(&self) -> bool {
        self.pure
    }
    fn may_run_in_place(&self) -> bool {
        true
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        if self.panic_in == Some("infer") {
            panic!("swish infer exploded");
        }
        Ok(vec![cx.input(0)?.clone()])
    }
    fn gradient(
        &self,
        g: &mut Graph,
        node: kiln::NodeId,
        gys: &[Option<Value>],
    ) -> Option<Result<Vec<Option<Value>>, String>> {
        if !self.with_gradient {
            return None;
        }
        // d/dx [x s(bx)] = s + b x s (1 - s), s = sigmoid(b x).
        let rule = |g: &mut Graph| -> kiln::Result<Vec<Option<Value>>> {
            let n = g.node(node).clone();
            let x = n.inputs[0].expect("one input");
            let gy = gys[0].expect("the loss uses the output");
            let beta = n.attrs.float_or("beta", 1.0).map_err(kiln::Error::Graph)?;
            let op = |g: &mut Graph, op: &str, ins: &[Value]| -> kiln::Result<Value> {
                Ok(g.op(op, ins, Attrs::new(), "")?.into())
            };
            let name = g.fresh_name("beta");
            let b: Value = g.add_constant_value(&name, Tensor::scalar(beta))?.into();
            let name = g.fresh_name("one");
            let one: Value = g.add_constant_value(&name, Tensor::scalar(1.0f64))?.into();
            let bx = op(g, "Mul", &[x, b])?;
            let sg = op(g, "Sigmoid", &[bx])?;
            let om = op(g, "Sub", &[one, sg])?;
            let t = op(g, "Mul", &[bx, sg])?;
            let t = op(g, "Mul", &[t, om])?;
            let d = op(g, "Add", &[sg, t])?;
            Ok(vec![Some(op(g, "Mul", &[gy, d])?)])
        };
        Some(rule(g).map_err(|e| e.to_string()))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        self.evals.fetch_add(1, Ordering::SeqCst);
        if self.panic_in == Some("eval") {
            panic!("swish kernel exploded");
        }
        let beta = cx.attrs.float_or("beta", 1.0)?;
        let x = cx.input(0)?;
        let v: Vec<f64> = x
            .to_f64_vec()
            .iter()
            .map(|&x| x / (1.0 + (-beta * x).exp()))
            .collect();
        Ok(vec![Tensor::from_f64s(x.dtype(), x.shape(), &v)?])
    }
}

fn register(op: Arc<Swish>) {
    custom::register(op).unwrap();
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Deterministic pseudo-random values in [-1.5, 1.5).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 3.0 - 1.5
        })
        .collect()
}

fn tensor(shape: &[usize], seed: u64) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(shape, values(n, seed)).unwrap()
}

fn run(g: &Graph, device: Device, inputs: &[Tensor]) -> kiln::Result<Vec<Tensor>> {
    backend_for(device)?.compile(g)?.run(inputs)
}

/// The ONNX MLP of the examples (a `com.example` ScaledSwish between two layers) in
/// built-in ops.
fn builtin_mlp() -> Graph {
    let mut g = Graph::new("builtin");
    let f32 = kiln::DType::F32;
    let param = |g: &mut Graph, name: &str, dims: Vec<kiln::Dim>| {
        Value::from(
            g.add_parameter(name, TensorType::new(f32, kiln::Shape::new(dims)))
                .unwrap(),
        )
    };
    use kiln::Dim::{Fixed, Sym};
    let x = param(&mut g, "x", vec![Sym("N".into()), Fixed(4)]);
    let w1 = param(&mut g, "W1", vec![Fixed(4), Fixed(8)]);
    let b1 = param(&mut g, "b1", vec![Fixed(8)]);
    let w2 = param(&mut g, "W2", vec![Fixed(8), Fixed(3)]);
    let b2 = param(&mut g, "b2", vec![Fixed(3)]);
    let op = |g: &mut Graph, op: &str, ins: &[Value]| -> Value {
        g.op(op, ins, Attrs::new(), "").unwrap().into()
    };
    let h = op(&mut g, "MatMul", &[x, w1]);
    let h = op(&mut g, "Add", &[h, b1]);
    let beta = g
        .add_constant_value("beta", Tensor::scalar(1.5f32))
        .unwrap()
        .into();
    let bh = op(&mut g, "Mul", &[h, beta]);
    let s = op(&mut g, "Sigmoid", &[bh]);
    let a = op(&mut g, "Mul", &[h, s]);
    let o = op(&mut g, "MatMul", &[a, w2]);
    let y = op(&mut g, "Add", &[o, b2]);
    g.add_output("y", y).unwrap();
    g
}

#[test]
fn onnx_custom_domain_imports_and_agrees_with_builtin_ops_on_both_backends() {
    let path = root().join("examples/data/swish_mlp.onnx");
    // Before registration the domain is unknown: an error naming the node.
    let err = kiln::frontend::onnx::import_file(&path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'act'") && err.contains("com.example"),
        "{err}"
    );
    let op = swish("com.example::ScaledSwish", true, None);
    register(op.clone());
    let g = kiln::frontend::onnx::import_file(&path).unwrap();
    let printed = text::print(&g);
    assert!(
        printed.contains("com.example::ScaledSwish(%6) {beta = 1.5}"),
        "{printed}"
    );
    let reference = builtin_mlp();
    let inputs = vec![
        tensor(&[7, 4], 1),
        tensor(&[4, 8], 2),
        tensor(&[8], 3),
        tensor(&[8, 3], 4),
        tensor(&[3], 5),
    ];
    let want = run(&reference, Device::Interp, &inputs).unwrap();
    for device in [Device::Interp, Device::Cpu] {
        let got = run(&g, device, &inputs).unwrap();
        got[0]
            .check_close(&want[0], 1e-6, 1e-5)
            .unwrap_or_else(|e| panic!("{device:?}: {e}"));
        let builtin = run(&reference, device, &inputs).unwrap();
        got[0].check_close(&builtin[0], 1e-6, 1e-5).unwrap();
    }
    assert!(op.evals.load(Ordering::SeqCst) >= 2);
    custom::unregister("com.example::ScaledSwish").unwrap();
}

#[test]
fn the_text_format_prints_domain_and_name_and_reads_them_back() {
    register(swish("org.test::Text", true, None));
    let mut g = Graph::new("t");
    let x = g
        .add_parameter(
            "x",
            TensorType::new(kiln::DType::F32, kiln::Shape::fixed(&[2, 3])),
        )
        .unwrap();
    let y = g
        .op(
            "org.test::Text",
            &[x.into()],
            Attrs::new().with("beta", Attr::Float(0.5)),
            "act",
        )
        .unwrap();
    g.add_output("y", y.into()).unwrap();
    let printed = text::print(&g);
    assert!(
        printed.contains("\"act\" = org.test::Text(%0) {beta = 0.5}"),
        "{printed}"
    );
    let parsed = text::parse(&printed, "<t>", None).unwrap();
    assert_eq!(text::print(&parsed), printed);
    assert_eq!(parsed, g);
    custom::unregister("org.test::Text").unwrap();
    // Unregistered: the graph keeps working, new text cannot name the op.
    assert!(run(&g, Device::Cpu, &[tensor(&[2, 3], 9)]).is_ok());
    let err = text::parse(&printed, "<t>", None).unwrap_err().to_string();
    assert!(err.contains("unknown op 'org.test::Text'"), "{err}");
}

/// `f` with the panic hook silenced (the contained panics would print); other tests'
/// panics may be silenced meanwhile too, but still fail them.
fn quietly<T>(f: impl FnOnce() -> T) -> T {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = f();
    std::panic::set_hook(hook);
    r
}

#[test]
fn panics_in_a_registered_op_become_errors_naming_it() {
    register(swish("org.test::PanicInfer", true, Some("infer")));
    register(swish("org.test::PanicEval", true, Some("eval")));
    let ty = TensorType::new(kiln::DType::F32, kiln::Shape::fixed(&[4]));
    let mut g = Graph::new("p");
    let x: Value = g.add_parameter("x", ty).unwrap().into();
    let err = quietly(|| g.op("org.test::PanicInfer", &[x], Attrs::new(), "bad"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'bad'")
            && err.contains("org.test::PanicInfer panicked: swish infer exploded"),
        "{err}"
    );
    let y = g
        .op("org.test::PanicEval", &[x], Attrs::new(), "boom")
        .unwrap();
    g.add_output("y", y.into()).unwrap();
    for device in [Device::Interp, Device::Cpu] {
        let exe = backend_for(device).unwrap().compile(&g).unwrap();
        for _ in 0..2 {
            // The executable stays usable after a contained panic.
            let err = quietly(|| exe.run(&[tensor(&[4], 1)])).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, kiln::Error::Runtime(_)), "{msg}");
            assert!(
                msg.contains("'boom'")
                    && msg.contains("org.test::PanicEval panicked: swish kernel exploded"),
                "{device:?}: {msg}"
            );
        }
    }
    // Through the C ABI: a status and a message, no unwinding.
    // SAFETY: handles from kiln_graph_new, used before being freed; C strings are literals.
    unsafe {
        let mut cg = std::ptr::null_mut();
        assert_eq!(kiln_graph_new(&mut cg), 0);
        let mut v = std::mem::zeroed();
        let dims = [4i64];
        let name = CString::new("x").unwrap();
        assert_eq!(
            kiln_graph_add_parameter(
                cg,
                name.as_ptr(),
                0,
                dims.as_ptr(),
                std::ptr::null(),
                1,
                &mut v
            ),
            0
        );
        let op = CString::new("org.test::PanicInfer").unwrap();
        let mut out = std::mem::zeroed();
        let mut n = 0usize;
        let status = quietly(|| {
            kiln_graph_add_op(
                cg,
                op.as_ptr(),
                &v,
                1,
                std::ptr::null(),
                0,
                &mut out,
                1,
                &mut n,
            )
        });
        assert_eq!(status, KILN_STATUS_INVALID_GRAPH);
        let msg = std::ffi::CStr::from_ptr(kiln_last_error_message()).to_string_lossy();
        assert!(msg.contains("panicked: swish infer exploded"), "{msg}");
        assert_eq!(n, 0, "nothing was added");
        kiln_graph_free(cg);
    }
    custom::unregister("org.test::PanicInfer").unwrap();
    custom::unregister("org.test::PanicEval").unwrap();
}

/// `Add(op(constant), x)`, compiled on the CPU backend and run twice: how often the op
/// was evaluated at compile time and per run.
fn folding(name: &'static str, pure: bool) -> (usize, usize) {
    let op = swish(name, pure, None);
    register(op.clone());
    let mut g = Graph::new("f");
    let ty = TensorType::new(kiln::DType::F32, kiln::Shape::fixed(&[3]));
    let x: Value = g.add_parameter("x", ty).unwrap().into();
    let c: Value = g
        .add_constant_value(
            "c",
            Tensor::from_vec(&[3], vec![0.5f32, -1.0, 2.0]).unwrap(),
        )
        .unwrap()
        .into();
    let s = g.op(name, &[c], Attrs::new(), "s").unwrap();
    let y = g.op("Add", &[s.into(), x], Attrs::new(), "y").unwrap();
    g.add_output("y", y.into()).unwrap();
    let exe = backend_for(Device::Cpu).unwrap().compile(&g).unwrap();
    let at_compile = op.evals.load(Ordering::SeqCst);
    for _ in 0..2 {
        let out = exe.run(&[tensor(&[3], 4)]).unwrap();
        let want = run(&g, Device::Interp, &[tensor(&[3], 4)]).unwrap();
        out[0].check_close(&want[0], 1e-6, 1e-6).unwrap();
    }
    custom::unregister(name).unwrap();
    // The interpreter's reference runs evaluate it twice more.
    (at_compile, op.evals.load(Ordering::SeqCst) - at_compile - 2)
}

#[test]
fn constant_folding_evaluates_only_pure_ops() {
    let (compile, runs) = folding("org.test::Pure", true);
    assert_eq!((compile, runs), (1, 0), "a pure op on constants folds once");
    let (compile, runs) = folding("org.test::Impure", false);
    assert_eq!((compile, runs), (0, 2), "an impure op runs every time");
}

#[test]
fn passes_keep_the_op_as_a_barrier_and_the_planner_runs_it_in_place() {
    register(swish("org.test::Barrier", true, None));
    let mut g = Graph::new("b");
    let ty = TensorType::new(kiln::DType::F32, kiln::Shape::fixed(&[16, 16]));
    let x: Value = g.add_parameter("x", ty).unwrap().into();
    let r: Value = g.op("Relu", &[x], Attrs::new(), "r").unwrap().into();
    let s: Value = g
        .op("org.test::Barrier", &[r], Attrs::new(), "s")
        .unwrap()
        .into();
    let n: Value = g.op("Neg", &[s], Attrs::new(), "n").unwrap().into();
    let e: Value = g.op("Exp", &[n], Attrs::new(), "e").unwrap().into();
    g.add_output("y", e).unwrap();
    let mut opt = g.clone();
    kiln::passes::run_pipeline(&mut opt, &kiln::passes::CompileOptions::default()).unwrap();
    let ops: Vec<&str> = opt.nodes().iter().map(|n| n.op.as_str()).collect();
    assert!(ops.contains(&"org.test::Barrier"), "{ops:?}");
    // Neg and Exp fuse with each other but not with Relu across the op.
    let s_id = opt.find("s").unwrap();
    let feeding = opt.node(opt.node(s_id).inputs[0].unwrap().node).op.clone();
    assert_eq!(feeding, "Relu", "{}", text::print(&opt));
    let schedule = opt.schedule().unwrap();
    let plan = kiln::memory::plan(&opt, &schedule).unwrap();
    let sv = plan.value(s_id.out(0)).unwrap();
    assert!(
        sv.reuses.is_some(),
        "the op's output takes its dying input's buffer"
    );
    let inputs = [tensor(&[16, 16], 7)];
    let want = run(&g, Device::Interp, &inputs).unwrap();
    let got = run(&g, Device::Cpu, &inputs).unwrap();
    got[0].check_close(&want[0], 1e-6, 1e-5).unwrap();
    custom::unregister("org.test::Barrier").unwrap();
}

#[test]
fn registry_refuses_duplicates_and_bad_names_and_pins_ops_in_graphs() {
    let op = swish("org.test::Pinned", true, None);
    register(op.clone());
    assert!(custom::register(op.clone())
        .unwrap_err()
        .contains("already registered"));
    assert!(custom::register(swish("NoDomain", true, None))
        .unwrap_err()
        .contains("not a qualified op name"));
    assert!(custom::register(swish("bad domain::X", true, None))
        .unwrap_err()
        .contains("domain 'bad domain'"));
    let mut g = Graph::new("p");
    let ty = TensorType::new(kiln::DType::F32, kiln::Shape::fixed(&[2]));
    let x: Value = g.add_parameter("x", ty).unwrap().into();
    let y = g.op("org.test::Pinned", &[x], Attrs::new(), "y").unwrap();
    g.add_output("y", y.into()).unwrap();
    let before = Arc::strong_count(&op);
    custom::unregister("org.test::Pinned").unwrap();
    assert_eq!(Arc::strong_count(&op), before - 1);
    assert!(matches!(
        g.op_impl("org.test::Pinned"),
        Some(OpRef::Registered(_))
    ));
    assert!(custom::resolve("org.test::Pinned").is_none());
    drop(g);
    assert_eq!(
        Arc::strong_count(&op),
        1,
        "the graph held the last other reference"
    );
}

#[test]
fn the_registry_is_safe_to_use_from_many_threads() {
    // Each thread registers, uses and unregisters its own ops while the others do too;
    // all of them also build graphs with one shared op, registered throughout.
    register(swish("org.test::Shared", true, None));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let name: &'static str = Box::leak(format!("org.test::T{t}").into_boxed_str());
                for round in 0..25 {
                    custom::register(swish(name, round % 2 == 0, None)).unwrap();
                    let mut g = Graph::new("t");
                    let ty = TensorType::new(kiln::DType::F32, kiln::Shape::fixed(&[3]));
                    let x: Value = g.add_parameter("x", ty).unwrap().into();
                    let a: Value = g.op(name, &[x], Attrs::new(), "a").unwrap().into();
                    let b = g.op("org.test::Shared", &[a], Attrs::new(), "b").unwrap();
                    g.add_output("y", b.into()).unwrap();
                    custom::unregister(name).unwrap();
                    // Still runs: the graph pinned both ops.
                    let out = run(&g, Device::Interp, &[tensor(&[3], round)]).unwrap();
                    assert_eq!(out[0].shape(), &[3]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    custom::unregister("org.test::Shared").unwrap();
}

#[test]
fn a_registered_ops_own_gradient_agrees_with_central_differences() {
    let mut op = swish("org.test::Grad", true, None);
    Arc::get_mut(&mut op).unwrap().with_gradient = true;
    register(op);
    register(swish("org.test::NoGrad", true, None));
    let build = |name: &str| {
        let mut g = Graph::new("g");
        let ty = TensorType::new(kiln::DType::F64, kiln::Shape::fixed(&[5]));
        let x: Value = g.add_parameter("x", ty).unwrap().into();
        let y: Value = g
            .op(
                name,
                &[x],
                Attrs::new().with("beta", Attr::Float(1.3)),
                "act",
            )
            .unwrap()
            .into();
        let w: Value = g
            .add_constant_value(
                "w",
                Tensor::from_vec(&[5], vec![0.5f64, -1.0, 2.0, 0.25, 1.5]).unwrap(),
            )
            .unwrap()
            .into();
        let p: Value = g.op("Mul", &[y, w], Attrs::new(), "p").unwrap().into();
        let loss: Value = g
            .op("ReduceSum", &[p], Attrs::new(), "loss")
            .unwrap()
            .into();
        (g, x, loss)
    };
    let (mut g, x, loss) = build("org.test::NoGrad");
    let err = kiln::autodiff::grad(&mut g, loss, &[x])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'act'") && err.contains("no gradient rule for org.test::NoGrad"),
        "{err}"
    );
    let (mut g, x, loss) = build("org.test::Grad");
    let gx = kiln::autodiff::grad(&mut g, loss, &[x]).unwrap()[0];
    g.add_output("loss", loss).unwrap();
    g.add_output("gx", gx).unwrap();
    let x0 = [0.3f64, -1.2, 2.0, -0.1, 0.9];
    let at = |v: &[f64]| Tensor::from_vec(&[5], v.to_vec()).unwrap();
    for device in [Device::Interp, Device::Cpu] {
        let exe = backend_for(device).unwrap().compile(&g).unwrap();
        let grad = exe.run(&[at(&x0)]).unwrap()[1].to_f64_vec();
        let h = 1e-5;
        for k in 0..5 {
            let (mut plus, mut minus) = (x0, x0);
            plus[k] += h;
            minus[k] -= h;
            let f = |v: &[f64]| exe.run(&[at(v)]).unwrap()[0].to_f64_vec()[0];
            let numeric = (f(&plus) - f(&minus)) / (2.0 * h);
            assert!(
                (grad[k] - numeric).abs() <= 1e-7 * (1.0 + numeric.abs()),
                "{device:?} x[{k}]: {} vs {numeric}",
                grad[k]
            );
        }
    }
    custom::unregister("org.test::Grad").unwrap();
    custom::unregister("org.test::NoGrad").unwrap();
}

/// The statuses `kiln_kernel_context_output` gave the `Huge` kernel below, in call order.
static HUGE_STATUSES: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// One f32 output of two fresh symbolic dims.
unsafe extern "C" fn huge_infer(
    ctx: *mut kiln::capi::custom_op::kiln_infer_context,
    _: *mut std::ffi::c_void,
) -> u32 {
    let dims = [-1i64, -1];
    // SAFETY: the live context; `dims` has rank 2 entries; NULL symbols means fresh.
    unsafe {
        kiln::capi::custom_op::kiln_infer_context_set_output(
            ctx,
            0,
            kiln::capi::tensor::KILN_DTYPE_F32,
            dims.as_ptr(),
            std::ptr::null(),
            2,
        )
    }
}

/// Asks for outputs whose byte count overflows, then for one no machine can allocate.
unsafe extern "C" fn huge_compute(
    ctx: *mut kiln::capi::custom_op::kiln_kernel_context,
    _: *mut std::ffi::c_void,
) -> u32 {
    let cases: [&[i64]; 3] = [&[1 << 32, 1 << 32], &[i64::MAX / 2, 1], &[1 << 50, 1]];
    for dims in cases {
        let mut view = std::mem::MaybeUninit::uninit();
        // SAFETY: the live context; `dims` has `dims.len()` entries; `view` is writable.
        let status = unsafe {
            kiln::capi::custom_op::kiln_kernel_context_output(
                ctx,
                0,
                dims.as_ptr(),
                dims.len(),
                view.as_mut_ptr(),
            )
        };
        HUGE_STATUSES.lock().unwrap().push(status);
    }
    kiln::capi::KILN_STATUS_OK
}

/// A kernel's requested output size for a symbolic dim is checked (no wrapped byte
/// count, no buffer smaller than its shape), and a size that cannot be allocated is an
/// error status, not an abort of the process.
#[test]
fn a_kernels_huge_output_request_is_an_error_not_an_overflow_or_abort() {
    use kiln::capi::custom_op::{kiln_custom_op, kiln_register_op, KILN_CUSTOM_OP_VERSION};
    use kiln::capi::{KILN_STATUS_INVALID_ARGUMENT, KILN_STATUS_RUN_FAILED};
    let def = kiln_custom_op {
        struct_size: std::mem::size_of::<kiln_custom_op>() as u32,
        version: KILN_CUSTOM_OP_VERSION,
        domain: c"org.test".as_ptr(),
        name: c"Huge".as_ptr(),
        min_inputs: 1,
        max_inputs: 1,
        num_outputs: 1,
        flags: 0,
        infer: Some(huge_infer),
        compute: Some(huge_compute),
        user_data: std::ptr::null_mut(),
        destroy: None,
        compute_cuda: None,
        gradient: None,
    };
    // SAFETY: a complete registration whose strings are static.
    let status = unsafe { kiln_register_op(&def) };
    assert_eq!(status, kiln::capi::KILN_STATUS_OK);
    let mut g = Graph::new("g");
    let x = g
        .add_parameter(
            "x",
            TensorType::new(
                kiln::DType::F32,
                kiln::ir::Shape::new(vec![kiln::ir::Dim::Fixed(2)]),
            ),
        )
        .unwrap()
        .into();
    let y = g.op("org.test::Huge", &[x], Attrs::new(), "huge").unwrap();
    g.add_output("y", y.into()).unwrap();
    let e = run(&g, Device::Interp, &[tensor(&[2], 1)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("huge") && e.contains("too many elements"), "{e}");
    assert_eq!(
        *HUGE_STATUSES.lock().unwrap(),
        [
            KILN_STATUS_INVALID_ARGUMENT,
            KILN_STATUS_INVALID_ARGUMENT,
            KILN_STATUS_RUN_FAILED
        ]
    );
}
