//! Helpers for op tests: build a one-op graph around some inputs and run it.
#![allow(dead_code)]
use kiln::backend::interp::InterpExecutable;
use kiln::backend::Executable;
use kiln::ir::{Attr, Attrs, Dim, Graph, Shape, TensorType, Value};
use kiln::{Result, Tensor};

pub fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}
pub fn f64s(shape: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}
pub fn i64s(shape: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}
pub fn i32s(shape: &[usize], v: &[i32]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}
pub fn bools(shape: &[usize], v: &[bool]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

/// numpy's `((np.arange(n) % k) - off) * 0.5` over `shape`: deterministic test data
/// whose expected results are computed with numpy.
pub fn ramp(shape: &[usize], k: usize, off: f64) -> Tensor {
    let n: usize = shape.iter().product();
    f64s(
        shape,
        &(0..n)
            .map(|i| ((i % k) as f64 - off) * 0.5)
            .collect::<Vec<_>>(),
    )
}

/// Attributes from `(name, value)` pairs.
pub fn attrs(pairs: &[(&str, Attr)]) -> Attrs {
    let mut a = Attrs::new();
    for (k, v) in pairs {
        a.set(k, v.clone());
    }
    a
}

/// An operand of a test graph: a run-time input, or a constant (so that inference can
/// read it, as shape operands need).
pub enum Arg {
    Input(Tensor),
    /// A run-time input whose declared dims are all symbolic (`s0`, `s1`, ... per input).
    Symbolic(Tensor),
    Const(Tensor),
    Absent,
}

pub use Arg::{Absent, Const, Input, Symbolic};

/// Builds `op(args) {attrs}` and runs it through the interpreter.
pub fn run(op: &str, args: Vec<Arg>, attrs: Attrs) -> Result<Vec<Tensor>> {
    let (g, inputs) = build(op, args, attrs)?;
    InterpExecutable::new(g)?.run(&inputs)
}

/// The one-op graph and its run-time inputs, without running it.
pub fn build(op: &str, args: Vec<Arg>, attrs: Attrs) -> Result<(Graph, Vec<Tensor>)> {
    let mut g = Graph::new("test");
    let mut inputs = vec![];
    let mut vals: Vec<Option<Value>> = vec![];
    for (i, a) in args.into_iter().enumerate() {
        let name = format!("in{i}");
        match a {
            Input(t) => {
                let ty = TensorType::new(t.dtype(), Shape::fixed(t.shape()));
                vals.push(Some(g.add_parameter(&name, ty)?.into()));
                inputs.push(t);
            }
            Symbolic(t) => {
                let dims = (0..t.rank()).map(|d| Dim::Sym(format!("s{i}_{d}")));
                let ty = TensorType::new(t.dtype(), Shape::new(dims));
                vals.push(Some(g.add_parameter(&name, ty)?.into()));
                inputs.push(t);
            }
            Const(t) => vals.push(Some(g.add_constant_value(&name, t)?.into())),
            Absent => vals.push(None),
        }
    }
    let node = g.add_op(op, &vals, attrs, "op")?;
    for i in 0..g.node(node).outputs.len() {
        g.add_output(&format!("out{i}"), node.out(i as u32))?;
    }
    Ok((g, inputs))
}

/// Runs and returns the single output.
pub fn run1(op: &str, args: Vec<Arg>, attrs: Attrs) -> Tensor {
    let mut out = run(op, args, attrs).unwrap_or_else(|e| panic!("{op}: {e}"));
    assert_eq!(out.len(), 1, "{op} should have one output");
    out.remove(0)
}

/// The error message of a build or run that must fail.
pub fn run_err(op: &str, args: Vec<Arg>, attrs: Attrs) -> String {
    match run(op, args, attrs) {
        Ok(v) => panic!("{op} should fail, gave {v:?}"),
        Err(e) => e.to_string(),
    }
}

/// Asserts `got` is within `atol + rtol·|want|` of `want`, same dtype and shape.
#[track_caller]
pub fn assert_close(got: &Tensor, want: &Tensor, atol: f64, rtol: f64) {
    if let Err(e) = got.check_close(want, atol, rtol) {
        panic!("{e}\n got: {got:?}\nwant: {want:?}");
    }
}
