//! The CUDA kernel generator, checked without a GPU: every kernel it emits for the
//! sample graphs (every template) and for the real models is compiled for the host by
//! g++ against the emulation header, run on random inputs, and compared with the
//! reference interpreter's evaluation of its node on the same inputs.
//!
//! Without g++ the checks skip through `common::require` (`KILN_REQUIRE=gxx` makes that
//! a failure).
use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use kiln::backend::{backend_with, Device};
use kiln::frontend::onnx;
use kiln::internals::cuda::codegen::emulation::{self, HostLaunch};
use kiln::internals::cuda::codegen::{
    kernel_for_node, kernels_for_graph, samples, template_samples, GeneratedKernel, KernelParam,
};
use kiln::ir::ops::EvalCtx;
use kiln::ir::{Attr, Attrs, DType, Graph, NodeId, Shape, TensorType};
use kiln::passes::{run_pipeline, CompileOptions};
use kiln::Tensor;

use common::{require, test_graphs_and_real_models, Need, Rng};

/// Whether the host-emulation checks can run (`Need::Gxx`).
fn have_gxx() -> bool {
    require(
        Need::Gxx,
        if emulation::have_gxx() {
            Ok(())
        } else {
            Err("no g++ for the CUDA host emulation".into())
        },
    )
}

/// One kernel to check: its buffers before the launch and what each output must hold.
struct Case {
    what: String,
    family: &'static str,
    kernel: GeneratedKernel,
    buffers: Vec<Vec<u8>>,
    /// Per parameter, the expected tensor of an output parameter.
    expected: Vec<Option<Tensor>>,
}

/// (atol, rtol) per family: f32 kernels against the f64-exact reference rounded once.
fn tolerance(family: &str) -> (f64, f64) {
    match family {
        "elementwise" | "epilogue" => (1e-5, 1e-5),
        "reduction" => (1e-4, 1e-4),
        // Long f32 dot products against the f64 reference.
        "conv" => (1e-4, 1e-4),
        _ => (1e-5, 1e-4),
    }
}

fn family(op: &str, epilogue: bool) -> &'static str {
    if epilogue {
        return "epilogue";
    }
    match op {
        "Softmax" | "LogSoftmax" => "softmax",
        "LayerNormalization" => "layernorm",
        "Fused" => "fused",
        "Conv" | "FusedConv" => "conv",
        "MaxPool" | "AveragePool" => "pool",
        "Transpose" => "transpose",
        o if o.starts_with("Reduce") || o.starts_with("Global") => "reduction",
        _ => "elementwise",
    }
}

fn eval_node(g: &Graph, id: NodeId, inputs: &[Option<Tensor>], attrs: &Attrs) -> Vec<Tensor> {
    let node = g.node(id);
    let op = g.op_impl(&node.op).unwrap();
    let args: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
    let types: Vec<Option<&TensorType>> = node
        .inputs
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.filter(|_| inputs[i].is_some())
                .map(|v| g.value_type(v).unwrap())
        })
        .collect();
    let cx = EvalCtx {
        inputs: &args,
        input_types: &types,
        attrs,
    };
    op.eval(&cx)
        .unwrap_or_else(|e| panic!("{}: reference: {e}", g.describe(id)))
}

/// Bytes an output holds before the launch: a pattern no kernel result equals by
/// chance (NaN for floats, an invalid bool), so an element left unwritten shows.
fn poison(t: &TensorType) -> Vec<u8> {
    let n: usize = t.shape.to_fixed().unwrap().iter().product();
    match t.dtype {
        DType::F32 => std::iter::repeat_n(f32::NAN.to_le_bytes(), n)
            .flatten()
            .collect(),
        DType::Bool => vec![0xAB; n],
        d => vec![0x5A; n * d.size_in_bytes()],
    }
}

/// The epilogue of FusedMatMul/FusedConv node `id` applied to `y` (the bare product),
/// through the catalogue's `Fused` reference: `act((y + bias) + Z)`, Conv's bias one
/// value per channel. For nodes whose full reference (the convolution itself) would
/// take the unoptimized interpreter too long.
fn epilogue_reference(g: &Graph, id: NodeId, y: &Tensor, inputs: &[Option<Tensor>]) -> Tensor {
    let node = g.node(id);
    let mut ins: Vec<Tensor> = vec![y.clone()];
    let mut body: Vec<String> = vec![];
    let mut last = "i0".to_string();
    if node.op == "Gemm" {
        // `+ beta·C`.
        let beta = node.attrs.float_or("beta", 1.0).unwrap() as f32;
        ins.push(inputs[2].clone().unwrap());
        ins.push(Tensor::scalar(beta));
        body.push("Mul(i1, i2)".into());
        body.push("Add(i0, t0)".into());
    }
    for i in [2, 3].into_iter().filter(|_| node.op != "Gemm") {
        if let Some(Some(t)) = inputs.get(i) {
            let mut t = t.clone();
            if node.op == "FusedConv" && i == 2 {
                let mut dims = t.shape().to_vec();
                dims.extend(std::iter::repeat_n(1, y.rank() - 2));
                t = Tensor::from_le_bytes(t.dtype(), &dims, &t.to_le_bytes()).unwrap();
            }
            ins.push(t);
            body.push(format!("Add({last}, i{})", ins.len() - 1));
            last = format!("t{}", body.len() - 1);
        }
    }
    let act = node.attrs.string_or("activation", "none").unwrap();
    if act != "none" {
        let mut step = format!("{act}({last}");
        let mut attrs = String::new();
        let mut bounds = [None, None];
        for kv in node
            .attrs
            .strings("activation_attrs")
            .unwrap()
            .unwrap_or(&[])
        {
            let (k, v) = kv.split_once('=').unwrap();
            match k {
                "min" | "max" if act == "Clip" => {
                    bounds[(k == "max") as usize] = Some(v.parse::<f32>().unwrap())
                }
                _ => attrs.push_str(&format!(" {kv}")),
            }
        }
        for b in bounds {
            match b {
                Some(v) => {
                    ins.push(Tensor::scalar(v));
                    step.push_str(&format!(", i{}", ins.len() - 1));
                }
                None if act == "Clip" => step.push_str(", _"),
                None => {}
            }
        }
        step.push(')');
        body.push(step + &attrs);
    }
    let fused = kiln::ir::ops::lookup("Fused").unwrap();
    let attrs = Attrs::new().with("body", Attr::Strings(body));
    let args: Vec<Option<&Tensor>> = ins.iter().map(Some).collect();
    let types = vec![None; args.len()];
    let cx = EvalCtx {
        inputs: &args,
        input_types: &types,
        attrs: &attrs,
    };
    fused.eval(&cx).unwrap().remove(0)
}

/// Node `id` alone on the CPU backend: the reference for convolutions too large for the
/// unoptimized interpreter (the CPU backend's own tests check it against the
/// interpreter).
fn cpu_reference(g: &Graph, id: NodeId, inputs: &[Option<Tensor>]) -> Vec<Tensor> {
    let node = g.node(id);
    let mut one = Graph::new("one node");
    let mut args = vec![];
    let mut values = vec![];
    for (i, t) in inputs.iter().enumerate() {
        args.push(t.as_ref().map(|t| {
            let ty = TensorType::new(t.dtype(), Shape::fixed(t.shape()));
            values.push(t.clone());
            one.add_parameter(&format!("in{i}"), ty).unwrap().into()
        }));
    }
    let n = one
        .add_op(&node.op, &args, node.attrs.clone(), "node")
        .unwrap();
    for o in 0..node.outputs.len() {
        one.add_output(&format!("out{o}"), n.out(o as u32)).unwrap();
    }
    let backend = backend_with(
        Device::Cpu,
        CompileOptions {
            threads: 1,
            ..Default::default()
        },
    )
    .unwrap();
    backend.compile(&one).unwrap().run(&values).unwrap()
}

/// Multiply-adds above which an epilogue's node is not evaluated in full.
const FULL_REFERENCE_LIMIT: usize = 1 << 20;

fn case(g: &Graph, id: NodeId, kernel: GeneratedKernel, rng: &mut Rng) -> Case {
    let node = g.node(id);
    let epilogue = kernel.entry.ends_with("_epilogue");
    let inputs: Vec<Option<Tensor>> = node
        .inputs
        .iter()
        .map(|v| {
            v.map(|v| {
                let src = g.node(v.node);
                match (&src.op[..], &src.data) {
                    ("Constant", Some(t)) => (**t).clone(),
                    _ => {
                        let t = g.value_type(v).unwrap();
                        rng.tensor_of(t.dtype, &t.shape.to_fixed().unwrap())
                    }
                }
            })
        })
        .collect();
    let elems = |t: &TensorType| -> usize { t.shape.to_fixed().unwrap().iter().product() };
    // The product's cost: output elements times the weights per output element.
    let cost = || {
        let w = g.value_type(node.inputs[1].unwrap()).unwrap();
        elems(&node.outputs[0]) * elems(w) / w.shape.to_fixed().unwrap()[0].max(1)
    };
    let (before, outs) = if epilogue && cost() > FULL_REFERENCE_LIMIT {
        // The epilogue starts from a random bare product.
        let y = rng.tensor_of(
            node.outputs[0].dtype,
            &node.outputs[0].shape.to_fixed().unwrap(),
        );
        let want = epilogue_reference(g, id, &y, &inputs);
        (Some(y), vec![want])
    } else if epilogue {
        // The epilogue starts from the GEMM's (or convolution's) bare result.
        let mut bare = inputs.clone();
        for t in bare.iter_mut().skip(2) {
            *t = None;
        }
        let mut attrs = node.attrs.clone();
        attrs.0.remove("activation");
        attrs.0.remove("activation_attrs");
        let y = eval_node(g, id, &bare, &attrs).remove(0);
        let want = epilogue_reference(g, id, &y, &inputs);
        let full = eval_node(g, id, &inputs, &node.attrs);
        // The shortcut reference agrees with the node's own where both run.
        want.check_close(&full[0], 1e-6, 1e-6)
            .unwrap_or_else(|e| panic!("{}: epilogue reference: {e}", g.describe(id)));
        (Some(y), full)
    } else if !epilogue && family(&node.op, false) == "conv" && cost() > FULL_REFERENCE_LIMIT {
        (None, cpu_reference(g, id, &inputs))
    } else {
        (None, eval_node(g, id, &inputs, &node.attrs))
    };
    let mut buffers = vec![];
    let mut expected = vec![];
    for p in &kernel.params {
        match *p {
            KernelParam::Input(i) => {
                buffers.push(inputs[i].as_ref().unwrap().to_le_bytes());
                expected.push(None);
            }
            KernelParam::Output(o) => {
                buffers.push(match &before {
                    Some(t) => t.to_le_bytes(),
                    None => poison(&node.outputs[o]),
                });
                expected.push(Some(outs[o].clone()));
            }
            KernelParam::Scratch(n) => {
                buffers.push(vec![0; n]);
                expected.push(None);
            }
        }
    }
    Case {
        what: format!("{}: {} ({})", g.name, g.describe(id), kernel.entry),
        family: family(&node.op, epilogue),
        kernel,
        buffers,
        expected,
    }
}

/// Compiles and runs `cases` in batches (one g++ run per batch); panics with every
/// mismatch. Returns the count per family.
fn check(cases: &[Case]) -> BTreeMap<&'static str, usize> {
    let mut failures = vec![];
    let mut counts = BTreeMap::new();
    for batch in cases.chunks(48) {
        let launches: Vec<HostLaunch<'_>> = batch
            .iter()
            .map(|c| HostLaunch {
                kernel: &c.kernel,
                buffers: c.buffers.clone(),
            })
            .collect();
        let results = emulation::run_on_host(&launches, &[]).unwrap_or_else(|e| panic!("{e}"));
        for (c, bufs) in batch.iter().zip(results) {
            let (atol, rtol) = tolerance(c.family);
            for ((p, want), got) in c.kernel.params.iter().zip(&c.expected).zip(bufs) {
                let Some(want) = want else { continue };
                let got = match Tensor::from_le_bytes(want.dtype(), want.shape(), &got) {
                    Ok(t) => t,
                    Err(e) => {
                        failures.push(format!("{} {p:?}: {e}", c.what));
                        continue;
                    }
                };
                if let Err(e) = got.check_close(want, atol, rtol) {
                    failures.push(format!("{} {p:?}: {e}", c.what));
                }
            }
            *counts.entry(c.family).or_insert(0) += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    counts
}

fn report(what: &str, counts: &BTreeMap<&str, usize>) {
    let total: usize = counts.values().sum();
    let families: Vec<String> = counts.iter().map(|(f, n)| format!("{f} {n}")).collect();
    println!(
        "host-emulation: {total} kernels checked ({what}; families: {})",
        families.join(", ")
    );
}

#[test]
fn sample_kernels_match_the_interpreter_in_host_emulation() {
    if !have_gxx() {
        return;
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut cases = vec![];
    for g in samples::graphs().unwrap() {
        for (id, k) in kernels_for_graph(&g).unwrap() {
            cases.push(case(&g, id, k, &mut rng));
        }
    }
    let counts = check(&cases);
    report("sample graphs", &counts);
    for f in [
        "elementwise",
        "fused",
        "reduction",
        "softmax",
        "layernorm",
        "epilogue",
        "conv",
    ] {
        assert!(
            counts.get(f).is_some_and(|&n| n > 0),
            "no {f} kernel checked"
        );
    }
}

/// A model (ONNX, or a `.kir` test graph), specialized to `dims` and optimized as the
/// CUDA backend sees it (no layout blocking).
fn optimized_model(path: &Path, dims: &[(&str, usize)]) -> Graph {
    let mut g = if path.extension().is_some_and(|e| e == "kir") {
        kiln::ir::text::parse_file(path).unwrap()
    } else {
        onnx::import_file(path).unwrap()
    };
    let bindings: HashMap<String, usize> = dims.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let unbound = g.specialize(&bindings).unwrap();
    assert!(
        unbound.is_empty(),
        "{}: unbound {unbound:?}",
        path.display()
    );
    let options = CompileOptions {
        layout_block: Some(0),
        ..CompileOptions::default()
    };
    run_pipeline(&mut g, &options).unwrap();
    g
}

#[test]
fn model_kernels_match_the_interpreter_in_host_emulation() {
    if !have_gxx() {
        return;
    }
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut cases = vec![];
    for (path, dims) in test_graphs_and_real_models() {
        let g = optimized_model(&path, &dims);
        let kernels = kernels_for_graph(&g).unwrap();
        // What the generator leaves to cuBLAS, views or other means, for the record.
        let mut others: BTreeMap<&str, usize> = BTreeMap::new();
        for n in g.nodes() {
            let covered = kernels.iter().any(|(id, _)| g.node(*id).name == n.name);
            if !covered && !matches!(n.op.as_str(), "Parameter" | "Constant") {
                *others.entry(n.op.as_str()).or_insert(0) += 1;
            }
        }
        println!(
            "{}: {} kernels; without a generated kernel: {others:?}",
            path.display(),
            kernels.len()
        );
        for (id, k) in kernels {
            cases.push(case(&g, id, k, &mut rng));
        }
    }
    let counts = check(&cases);
    report("real models", &counts);
}

#[test]
fn generated_source_is_deterministic() {
    let a = template_samples();
    let b = template_samples();
    assert!(!a.is_empty());
    assert_eq!(a, b);
    let (path, dims) = test_graphs_and_real_models().remove(0);
    let k1 = kernels_for_graph(&optimized_model(&path, &dims)).unwrap();
    let k2 = kernels_for_graph(&optimized_model(&path, &dims)).unwrap();
    assert_eq!(k1, k2);
    // Entry names are unique within a graph.
    for g in samples::graphs().unwrap() {
        let ks = kernels_for_graph(&g).unwrap();
        let mut names: Vec<&str> = ks.iter().map(|(_, k)| k.entry.as_str()).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "{}", g.name);
    }
}

#[test]
fn unsupported_dtype_is_an_error_naming_the_node() {
    let mut g = Graph::new("f64");
    let ty = TensorType::new(DType::F64, Shape::fixed(&[4]));
    let x = g.add_parameter("x", ty).unwrap();
    let y = g.op("Exp", &[x.into()], Attrs::new(), "the_exp").unwrap();
    let e = kernel_for_node(&g, y).unwrap_err().to_string();
    assert!(e.contains("the_exp") && e.contains("f64"), "{e}");
    let s = g
        .op("Softmax", &[x.into()], Attrs::new(), "the_softmax")
        .unwrap();
    let e = kernel_for_node(&g, s).unwrap_err().to_string();
    assert!(e.contains("the_softmax") && e.contains("f64"), "{e}");
    // Ops the generator does not cover are Ok(None).
    let t = g.op("ArgMax", &[x.into()], Attrs::new(), "").unwrap();
    assert!(kernel_for_node(&g, t).unwrap().is_none());
}

/// A kernel whose result depends on the barrier: each thread stores its index to
/// shared memory, then reads its neighbour's. Run one thread at a time without a real
/// barrier, thread 0 would read its neighbour's slot before the neighbour wrote it.
const NEIGHBOUR: &str = r#"
extern "C" __global__ void neighbour(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float s[128];
  const unsigned t = threadIdx.x;
  s[t] = x[blockIdx.x * 128u + t];
  BARRIER();
  y[blockIdx.x * 128u + t] = s[(t + 1u) % 128u];
  BARRIER();
  /* A warp-level exchange too: lane 0 ends with its warp's sum. */
  float v = s[t];
  for (int o = 16; o > 0; o >>= 1) { v += __shfl_down_sync(0xffffffffu, v, o); }
  if ((t & 31u) == 0u) { y[blockIdx.x * 128u + t] += 1000.0f * v; }
}
"#;

fn neighbour_kernel(barrier: &str) -> GeneratedKernel {
    GeneratedKernel {
        entry: "neighbour".into(),
        source: format!("#define BARRIER() {barrier}\n{NEIGHBOUR}\n#undef BARRIER\n"),
        grid: [3, 1, 1],
        block: [128, 1, 1],
        shared_bytes: 0,
        params: vec![KernelParam::Input(0), KernelParam::Output(0)],
    }
}

#[test]
fn the_emulated_barrier_is_real() {
    if !have_gxx() {
        return;
    }
    let x: Vec<f32> = (0..384)
        .map(|i| (i % 7) as f32 + 0.5 * (i / 128) as f32)
        .collect();
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let expected: Vec<f32> = (0..384)
        .map(|i| {
            let (b, t) = (i / 128, i % 128);
            let mut y = x[b * 128 + (t + 1) % 128];
            if t % 32 == 0 {
                y += 1000.0 * x[b * 128 + t..b * 128 + t + 32].iter().sum::<f32>();
            }
            y
        })
        .collect();
    let run = |barrier: &str| -> Vec<f32> {
        let k = neighbour_kernel(barrier);
        let launch = HostLaunch {
            kernel: &k,
            buffers: vec![bytes.clone(), vec![0; bytes.len()]],
        };
        let out = emulation::run_on_host(&[launch], &[]).unwrap();
        out[0][1]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    assert_eq!(run("__syncthreads()"), expected);
    // The same kernel without its barriers computes something else: the check above
    // can fail.
    assert_ne!(run(""), expected);
}

#[test]
fn a_barrier_no_thread_can_pass_is_reported() {
    if !have_gxx() {
        return;
    }
    // Thread 0 waits at the block barrier while the rest of its warp waits for it at a
    // shuffle: on a GPU this hangs; the emulation says so.
    let k = GeneratedKernel {
        entry: "stuck".into(),
        source: r#"extern "C" __global__ void stuck(float* y) {
  float v = 1.0f;
  if (threadIdx.x == 0u) { __syncthreads(); }
  else { v = __shfl_down_sync(0xffffffffu, v, 1); __syncthreads(); }
  y[threadIdx.x] = v;
}
"#
        .into(),
        grid: [1, 1, 1],
        block: [64, 1, 1],
        shared_bytes: 0,
        params: vec![KernelParam::Output(0)],
    };
    let launch = HostLaunch {
        kernel: &k,
        buffers: vec![vec![0; 256]],
    };
    let e = emulation::run_on_host(&[launch], &[]).unwrap_err();
    assert!(e.contains("deadlock"), "{e}");
}

#[test]
fn a_kernel_that_does_not_compile_fails_with_the_gxx_log() {
    if !have_gxx() {
        return;
    }
    let k = GeneratedKernel {
        entry: "broken".into(),
        source: "extern \"C\" __global__ void broken(float* y) { y[0] = undefined_thing; }\n"
            .into(),
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
        params: vec![KernelParam::Output(0)],
    };
    let launch = HostLaunch {
        kernel: &k,
        buffers: vec![vec![0; 4]],
    };
    let e = emulation::run_on_host(&[launch], &[]).unwrap_err();
    assert!(e.contains("broken") && e.contains("undefined_thing"), "{e}");
}
