//! Host programs on the CPU backend: signatures that hold strings, sequences or optionals,
//! or whose types stay dynamic, run node by node with host steps and kernels compiled
//! per run-time shape — never a step on the reference interpreter — and agree with it.
use crate::common;
use crate::cpu_dynamic::{check, cpu, kinds};

use std::sync::Arc;

use kiln::backend::Executable;
use kiln::ir::{Attr, Attrs, DType, Dim, Graph, Shape, TensorType};
use kiln::Tensor;

use common::{op, typed_param, Rng};

fn words(v: &[&str]) -> Tensor {
    Tensor::from_strings(&[v.len()], v.iter().map(|s| s.to_string()).collect()).unwrap()
}

#[test]
fn strings_and_sequences_run_on_host_steps_around_kernels() {
    let mut g = Graph::new("host");
    let w = g
        .add_parameter("words", TensorType::new(DType::String, Shape::fixed(&[3])))
        .unwrap()
        .into();
    let x = typed_param(&mut g, "x", DType::F32, &[2, 3]);
    let lower = op(
        &mut g,
        "StringNormalizer",
        &[w],
        Attrs::new().with("case_change_action", Attr::String("LOWER".into())),
    );
    let r = op(&mut g, "Relu", &[x], Attrs::new());
    let s = op(&mut g, "SequenceConstruct", &[r, x], Attrs::new());
    let cat = op(
        &mut g,
        "ConcatFromSequence",
        &[s],
        Attrs::new().with("axis", Attr::Int(0)),
    );
    let y = op(&mut g, "Sigmoid", &[cat], Attrs::new());
    g.add_output("lower", lower).unwrap();
    g.add_output("y", y).unwrap();
    let exe = cpu(&g);
    let inputs = [words(&["Kiln", "ÄÖ", "b"]), Rng(3).f32_tensor(&[2, 3], 1.0)];
    check(&exe, &g, &inputs);
    let k = kinds(&exe, &inputs);
    for kind in ["host-string", "host-sequence", "dynamic-kernel"] {
        assert!(k.contains(&kind), "{kind} in {k:?}");
    }
    // Relu and Sigmoid are compiled programs of their own (one level deeper).
    assert!(
        k.iter()
            .filter(|&&s| s != "host-string" && s != "host-sequence")
            .count()
            >= 3,
        "{k:?}"
    );
}

/// A trip count read from data: the largest of 65 values (too many to key a program by
/// value, so the loop's trips stay unknown until it runs).
fn trips_from_data(g: &mut Graph) -> kiln::ir::Value {
    let counts = typed_param(g, "counts", DType::I64, &[65]);
    op(
        g,
        "ReduceMax",
        &[counts],
        Attrs::new().with("keepdims", Attr::Int(0)),
    )
}

fn counts(m: i64) -> Tensor {
    Tensor::from_vec(&[65], vec![m; 65]).unwrap()
}

/// `Loop(M, cond, v)` whose body passes `v` on and gives it as a scan output: the
/// number of trips, so the scan output's length, is known only at run time.
fn loop_graph() -> Graph {
    let mut body = Graph::new("body");
    let i = typed_param(&mut body, "i", DType::I64, &[]);
    let c = typed_param(&mut body, "c", DType::Bool, &[]);
    let v = typed_param(&mut body, "v", DType::F32, &[2]);
    let one = common::constant(&mut body, Tensor::from_vec(&[1], vec![1.0f32]).unwrap());
    let next = op(&mut body, "Add", &[v, one], Attrs::new());
    let fi = op(
        &mut body,
        "Cast",
        &[i],
        Attrs::new().with("to", Attr::String("f32".into())),
    );
    let scan = op(&mut body, "Mul", &[v, fi], Attrs::new());
    body.add_output("c", c).unwrap();
    body.add_output("v", next).unwrap();
    body.add_output("scan", scan).unwrap();
    let mut g = Graph::new("loop");
    let m = trips_from_data(&mut g);
    let cond = typed_param(&mut g, "cond", DType::Bool, &[]);
    let v0 = typed_param(&mut g, "v0", DType::F32, &[2]);
    let outs = g
        .op(
            "Loop",
            &[m, cond, v0],
            Attrs::new().with("body", Attr::Graph(Arc::new(body))),
            "loop",
        )
        .unwrap();
    g.add_output("v", outs.out(0)).unwrap();
    g.add_output("scan", outs.out(1)).unwrap();
    g
}

#[test]
fn a_loop_with_a_run_time_trip_count_stacks_its_scan_outputs() {
    let g = loop_graph();
    let exe = cpu(&g);
    let v0 = Tensor::from_vec(&[2], vec![0.5f32, -1.0]).unwrap();
    for (m, cond) in [(3i64, true), (0, true), (5, false), (1, true), (3, true)] {
        let inputs = [counts(m), Tensor::scalar(cond), v0.clone()];
        check(&exe, &g, &inputs);
        let scan = &exe.run(&inputs).unwrap()[1];
        let trips = if cond { m as usize } else { 0 };
        assert_eq!(scan.shape(), &[trips, 2]);
    }
    let k = kinds(&exe, &[counts(3), Tensor::scalar(true), v0]);
    assert!(k.contains(&"host-loop"), "{k:?}");
    // The body's program of kernels, one level deeper.
    assert!(k.len() > 1, "{k:?}");
}

#[test]
fn a_carried_value_that_grows_compiles_per_shape_and_reuses_programs() {
    let mut body = Graph::new("body");
    typed_param(&mut body, "i", DType::I64, &[]);
    let c = typed_param(&mut body, "c", DType::Bool, &[]);
    let grows = TensorType::new(
        DType::F32,
        Shape::new(vec![Dim::Sym("n".into()), Dim::Fixed(2)]),
    );
    let v: kiln::ir::Value = body.add_parameter("v", grows).unwrap().into();
    let twice = op(
        &mut body,
        "Concat",
        &[v, v],
        Attrs::new().with("axis", Attr::Int(0)),
    );
    body.add_output("c", c).unwrap();
    body.add_output("v", twice).unwrap();
    let mut g = Graph::new("grow");
    let m = trips_from_data(&mut g);
    let v0 = typed_param(&mut g, "v0", DType::F32, &[1, 2]);
    let outs = g
        .add_op(
            "Loop",
            &[Some(m), None, Some(v0)],
            Attrs::new().with("body", Attr::Graph(Arc::new(body))),
            "loop",
        )
        .unwrap();
    g.add_output("v", outs.out(0)).unwrap();
    let exe = cpu(&g);
    let v0 = Rng(9).f32_tensor(&[1, 2], 1.0);
    let steps = |m: i64| {
        let inputs = [counts(m), v0.clone()];
        check(&exe, &g, &inputs);
        assert_eq!(exe.run(&inputs).unwrap()[0].shape(), &[1 << m, 2]);
        kinds(&exe, &inputs).len()
    };
    // One body program per carried shape (1, 2, 4 rows), reused by later runs.
    let after_three = steps(3);
    assert_eq!(steps(3), after_three);
    assert_eq!(steps(2), after_three);
    assert_eq!(steps(0), after_three);
    assert!(steps(4) > after_three);
}

#[test]
fn an_optional_input_and_an_if_on_data_with_sequence_branches() {
    let mut g = Graph::new("opt");
    let held =
        TensorType::new(DType::F32, Shape::fixed(&[3])).wrapped(kiln::ir::Container::Opt, None);
    let o = g.add_parameter("o", held).unwrap().into();
    let has = op(&mut g, "OptionalHasElement", &[o], Attrs::new());
    let x = typed_param(&mut g, "x", DType::F32, &[3]);
    let mut then = Graph::new("then");
    let p = typed_param(&mut then, "p", DType::F32, &[3]);
    let one = op(&mut then, "SequenceConstruct", &[p], Attrs::new());
    then.add_output("s", one).unwrap();
    let mut other = Graph::new("else");
    let p = typed_param(&mut other, "p", DType::F32, &[3]);
    let two = op(&mut other, "SequenceConstruct", &[p, p], Attrs::new());
    other.add_output("s", two).unwrap();
    let branches = Attrs::new()
        .with("then_branch", Attr::Graph(Arc::new(then)))
        .with("else_branch", Attr::Graph(Arc::new(other)))
        .with("captures", Attr::Int(1));
    let s = op(&mut g, "If", &[has, x], branches);
    let n = op(&mut g, "SequenceLength", &[s], Attrs::new());
    g.add_output("n", n).unwrap();
    let exe = cpu(&g);
    let x = Rng(2).f32_tensor(&[3], 1.0);
    let full = Tensor::Optional(kiln::tensor::Optional {
        dtype: DType::F32,
        inner: vec![],
        value: Some(Box::new(x.clone())),
    });
    let empty = Tensor::empty_container(DType::F32, &[kiln::ir::Container::Opt]).unwrap();
    for (o, want) in [(full, 1i64), (empty, 2)] {
        let inputs = [o, x.clone()];
        check(&exe, &g, &inputs);
        assert_eq!(exe.run(&inputs).unwrap()[0], Tensor::scalar(want));
    }
    let k = kinds(&exe, &[Tensor::scalar(0i64), x]);
    assert!(k.contains(&"host-if"), "{k:?}");
}
