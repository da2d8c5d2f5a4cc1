//! A run of a compiled CPU executable allocates only its output tensors: no kernel, no
//! step, no thread-pool loop and no lookup allocates per run, and a compiled loop
//! allocates nothing per iteration (counted by a global allocator; the tests take one
//! lock so that nothing else allocates meanwhile).
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use kiln::backend::{backend_with, Device};
use kiln::ir::{Attr, Attrs, DType, Graph, Shape, TensorType, Value};
use kiln::passes::CompileOptions;
use kiln::{Dim, Tensor};

use common::op;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// Held by each test while it counts.
static ALONE: Mutex<()> = Mutex::new(());

// SAFETY: forwards to the system allocator; counting has no effect on the memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn tensor(dims: &[usize], seed: usize) -> Tensor {
    let n: usize = dims.iter().product();
    let v = (0..n)
        .map(|i| ((i * 7 + seed * 13) % 23) as f32 / 23.0 - 0.5)
        .collect::<Vec<f32>>();
    Tensor::from_vec(dims, v).unwrap()
}

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

/// Convs (blocked and plain), pools, a residual add, GEMMs, softmax, elementwise ops, a
/// fused elementwise chain and reductions: one step of most kernel families.
fn graph() -> Graph {
    let mut g = Graph::new("allocations");
    // A symbolic batch: the run looks up the program specialized for it.
    let dims = [
        Dim::Sym("N".into()),
        Dim::Fixed(16),
        Dim::Fixed(12),
        Dim::Fixed(12),
    ];
    let ty = TensorType::new(DType::F32, Shape::new(dims));
    let x: Value = g.add_parameter("x", ty).unwrap().into();
    let c = |g: &mut Graph, name: &str, dims: &[usize], seed| -> Value {
        g.add_constant_value(name, tensor(dims, seed))
            .unwrap()
            .into()
    };
    let w1 = c(&mut g, "w1", &[32, 16, 3, 3], 1);
    let b1 = c(&mut g, "b1", &[32], 2);
    let pads = Attrs::new().with("pads", ints(&[1, 1, 1, 1]));
    let h = op(&mut g, "Conv", &[x, w1, b1], pads.clone());
    let h = op(&mut g, "Relu", &[h], Attrs::new());
    let w2 = c(&mut g, "w2", &[32, 32, 1, 1], 3);
    let h2 = op(&mut g, "Conv", &[h, w2], Attrs::new());
    let h = op(&mut g, "Add", &[h, h2], Attrs::new());
    let pool = Attrs::new()
        .with("kernel_shape", ints(&[2, 2]))
        .with("strides", ints(&[2, 2]));
    let h = op(&mut g, "MaxPool", &[h], pool);
    let wd = c(&mut g, "wd", &[32, 1, 3, 3], 4);
    let dw = pads.with("group", Attr::Int(32));
    let h = op(&mut g, "Conv", &[h, wd], dw);
    let h = op(&mut g, "GlobalAveragePool", &[h], Attrs::new());
    let h = op(&mut g, "Flatten", &[h], Attrs::new());
    let wf = c(&mut g, "wf", &[32, 10], 5);
    let bf = c(&mut g, "bf", &[10], 6);
    let h = op(&mut g, "MatMul", &[h, wf], Attrs::new());
    let h = op(&mut g, "Add", &[h, bf], Attrs::new());
    let y = op(&mut g, "Softmax", &[h], Attrs::new());
    g.add_output("y", y).unwrap();
    g.add_output("features", h2).unwrap();
    let axes = |g: &mut Graph, name: &str, v: &[i64]| -> Value {
        let t = Tensor::from_vec(&[v.len()], v.to_vec()).unwrap();
        g.add_constant_value(name, t).unwrap().into()
    };
    let hw = axes(&mut g, "hw", &[2, 3]);
    let m = op(&mut g, "ReduceMean", &[h2, hw], Attrs::new());
    let e = op(&mut g, "Sub", &[h2, m], Attrs::new());
    let e = op(&mut g, "Sigmoid", &[e], Attrs::new());
    let e = op(&mut g, "Mul", &[e, h2], Attrs::new());
    let ch = axes(&mut g, "ch", &[1]);
    let l = op(&mut g, "ReduceLogSumExp", &[e, ch], Attrs::new());
    g.add_output("gated", l).unwrap();
    g
}

#[test]
fn runs_allocate_only_their_outputs() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let g = graph();
    let inputs = vec![tensor(&[2, 16, 12, 12], 9)];
    for threads in [1, 2] {
        let exe = backend_with(
            Device::Cpu,
            CompileOptions {
                threads,
                ..Default::default()
            },
        )
        .unwrap()
        .compile(&g)
        .unwrap();
        // The first runs size the arena free list and the GEMM's per-thread buffers.
        let want = exe.run(&inputs).unwrap();
        exe.run(&inputs).unwrap();
        // The fewest of a few runs: a pool's loop allocates a fresh job when a worker
        // has not yet dropped the previous one, a rare race.
        let mut allocated = usize::MAX;
        let mut got = vec![];
        for _ in 0..5 {
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            got = exe.run(&inputs).unwrap();
            allocated = allocated.min(ALLOCATIONS.load(Ordering::SeqCst) - before);
        }
        assert_eq!(got.len(), 3);
        assert!(got.iter().zip(&want).all(|(a, b)| a == b));
        // The result Vec, and each output's data (its shape is stored inline).
        let outputs = 1 + got.len();
        assert!(
            allocated <= outputs,
            "{threads} thread(s): {allocated} allocations in one run, {outputs} expected"
        );
        // Borrowed inputs are read in place, not copied, once the shapes' program exists.
        let views: Vec<_> = inputs.iter().map(|t| t.bytes_view().unwrap()).collect();
        let mut allocated = usize::MAX;
        for _ in 0..5 {
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            got = exe.run_views(&views).unwrap();
            allocated = allocated.min(ALLOCATIONS.load(Ordering::SeqCst) - before);
        }
        assert!(got.iter().zip(&want).all(|(a, b)| a == b));
        assert!(
            allocated <= outputs,
            "{threads} thread(s): {allocated} allocations in a run on views, {outputs} expected"
        );
    }
}

/// The fewest allocations of a few runs of `exe` on `inputs` (after two warm-up runs).
fn fewest_allocations(exe: &dyn kiln::backend::Executable, inputs: &[Tensor]) -> usize {
    exe.run(inputs).unwrap();
    exe.run(inputs).unwrap();
    (0..5)
        .map(|_| {
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            exe.run(inputs).unwrap();
            ALLOCATIONS.load(Ordering::SeqCst) - before
        })
        .min()
        .unwrap()
}

#[test]
fn a_compiled_loop_allocates_nothing_per_iteration() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let inputs = common::control_graphs::recurrence_inputs(16, 5);
    let mut counts = vec![];
    // Long enough not to be unrolled by the pipeline.
    for iters in [40, 1000] {
        let g = common::control_graphs::recurrence_loop(iters, 16, true);
        let exe = backend_with(
            Device::Cpu,
            CompileOptions {
                threads: 1,
                ..Default::default()
            },
        )
        .unwrap()
        .compile(&g)
        .unwrap();
        let got = exe.run(&inputs).unwrap();
        assert_eq!(got[1].shape(), [iters as usize, 1, 16]);
        counts.push(fewest_allocations(&*exe, &inputs));
    }
    // Only the outputs: the result Vec and each output's data.
    assert_eq!(counts[0], counts[1], "40 vs 1000 iterations: {counts:?}");
    assert!(counts[1] <= 3, "{counts:?} allocations per run");
}
