//! Small graphs that instantiate every kernel template: every op of the elementwise
//! table (plain and in `Fused` bodies, broadcasting, exported steps, the float4 path),
//! reductions of every kind over several axis sets (row and column kernels, one warp to
//! 1024 threads), softmaxes along the last and an outer axis, LayerNormalization with
//! and without B, transposes, global pools, and FusedMatMul/FusedConv epilogues with every
//! activation, convolutions (tiles, groups, strides, pads, dilations, 1-D).
//! `template_samples` generates them; the host-emulation test runs them.
use crate::error::Result;
use crate::ir::ops::fused::ACTIVATIONS;
use crate::ir::{Attr, Attrs, DType, Graph, NodeId, Shape, TensorType, Value};
use crate::tensor::Tensor;

use super::{kernels_for_graph, GeneratedKernel};

struct Builder {
    g: Graph,
    outputs: usize,
}

impl Builder {
    fn new(name: &str) -> Builder {
        Builder {
            g: Graph::new(name),
            outputs: 0,
        }
    }

    fn param(&mut self, name: &str, dtype: DType, dims: &[usize]) -> Result<Value> {
        let ty = TensorType::new(dtype, Shape::fixed(dims));
        Ok(self.g.add_parameter(name, ty)?.into())
    }

    fn f32(&mut self, name: &str, dims: &[usize]) -> Result<Value> {
        self.param(name, DType::F32, dims)
    }

    fn constant(&mut self, name: &str, t: Tensor) -> Result<Value> {
        Ok(self.g.add_constant_value(name, t)?.into())
    }

    fn axes(&mut self, axes: &[i64]) -> Result<Value> {
        let name = self.g.fresh_name("axes");
        let t = Tensor::from_i64s(DType::I64, &[axes.len()], axes).map_err(crate::Error::Graph)?;
        self.constant(&name, t)
    }

    /// Applies `op` and makes every output of it a graph output.
    fn op(&mut self, op: &str, ins: &[Option<Value>], attrs: Attrs) -> Result<NodeId> {
        let id = self.g.add_op(op, ins, attrs, "")?;
        for o in 0..self.g.node(id).outputs.len() {
            self.outputs += 1;
            let name = format!("out{}", self.outputs);
            self.g.add_output(&name, id.out(o as u32))?;
        }
        Ok(id)
    }

    fn v(&mut self, op: &str, ins: &[Value], attrs: Attrs) -> Result<Value> {
        let ins: Vec<Option<Value>> = ins.iter().map(|&v| Some(v)).collect();
        Ok(self.op(op, &ins, attrs)?.into())
    }
}

fn attrs(pairs: &[(&str, Attr)]) -> Attrs {
    let mut a = Attrs::new();
    for (k, v) in pairs {
        a.set(k, v.clone());
    }
    a
}

fn s(v: &str) -> Attr {
    Attr::String(v.into())
}

fn unary() -> Result<Graph> {
    let mut b = Builder::new("unary");
    let x = b.f32("x", &[5, 33])?;
    let plain = [
        "Neg",
        "Abs",
        "Sign",
        "Relu",
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Tanh",
        "Sigmoid",
        "Erf",
        "Sin",
        "Cos",
        "Tan",
        "Asin",
        "Acos",
        "Atan",
        "Sinh",
        "Cosh",
        "Asinh",
        "Acosh",
        "Atanh",
        "Floor",
        "Ceil",
        "Round",
        "Softplus",
        "Softsign",
        "Mish",
        "HardSwish",
        "LeakyRelu",
        "Elu",
        "Celu",
        "ThresholdedRelu",
        "Selu",
        "HardSigmoid",
        "Gelu",
        "IsNaN",
        "IsInf",
    ];
    for op in plain {
        b.v(op, &[x], Attrs::new())?;
    }
    b.v("LeakyRelu", &[x], attrs(&[("alpha", Attr::Float(0.3))]))?;
    b.v("Elu", &[x], attrs(&[("alpha", Attr::Float(0.7))]))?;
    b.v(
        "HardSigmoid",
        &[x],
        attrs(&[("alpha", Attr::Float(0.3)), ("beta", Attr::Float(0.4))]),
    )?;
    b.v("Gelu", &[x], attrs(&[("approximate", s("tanh"))]))?;
    b.v("IsInf", &[x], attrs(&[("detect_negative", Attr::Int(0))]))?;
    Ok(b.g)
}

fn binary() -> Result<Graph> {
    let mut b = Builder::new("binary");
    let a = b.f32("a", &[4, 1, 6])?;
    let c = b.f32("c", &[5, 1])?;
    let r = b.f32("r", &[6])?;
    for op in ["Add", "Sub", "Mul", "Div", "Pow", "Mod"] {
        b.v(op, &[a, c], Attrs::new())?;
    }
    b.v("Mod", &[a, c], attrs(&[("fmod", Attr::Int(1))]))?;
    for op in ["Max", "Min", "Sum", "Mean"] {
        b.v(op, &[a, c, r], Attrs::new())?;
        b.v(op, &[a], Attrs::new())?;
    }
    let x = b.f32("x", &[4, 5, 6])?;
    b.v("PRelu", &[x, c], Attrs::new())?;
    let mut conds = vec![];
    for op in ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"] {
        conds.push(b.v(op, &[a, c], Attrs::new())?);
    }
    let p = b.param("p", DType::Bool, &[5, 6])?;
    for op in ["And", "Or", "Xor", "Equal"] {
        b.v(op, &[conds[1], p], Attrs::new())?;
    }
    b.v("Not", &[p], Attrs::new())?;
    b.v("Where", &[p, a, c], Attrs::new())?;
    let lo = b.constant("lo", Tensor::scalar(-0.5f32))?;
    let hi = b.constant("hi", Tensor::scalar(0.75f32))?;
    b.v("Clip", &[x, lo, hi], Attrs::new())?;
    b.op("Clip", &[Some(x), None, Some(hi)], Attrs::new())?;
    b.op("Clip", &[Some(x), Some(lo)], Attrs::new())?;
    let i = b.param("i", DType::I32, &[3, 7])?;
    for (v, to) in [
        (x, "i32"),
        (x, "bool"),
        (x, "i64"),
        (p, "f32"),
        (i, "f32"),
        (i, "bool"),
    ] {
        b.v("Cast", &[v], attrs(&[("to", s(to))]))?;
    }
    Ok(b.g)
}

fn fused() -> Result<Graph> {
    let mut b = Builder::new("fused");
    let body = |steps: &[&str]| Attr::Strings(steps.iter().map(|s| s.to_string()).collect());
    // Broadcast inputs, and step 1 exported as output 1.
    let x = b.f32("x", &[2, 3, 17])?;
    let bias = b.f32("bias", &[17])?;
    let k = b.f32("k", &[2, 1, 1])?;
    b.v(
        "Fused",
        &[x, bias, k],
        attrs(&[
            (
                "body",
                body(&[
                    "Add(i0, i1)",
                    "Mul(t0, i2)",
                    "Relu(t1)",
                    "Sigmoid(t2)",
                    "Sub(t3, t0)",
                ]),
            ),
            ("outputs", Attr::Ints(vec![1, 2])),
        ]),
    )?;
    // Same-shaped inputs and a scalar: the float4 path.
    let y = b.f32("y", &[8, 16])?;
    let z = b.f32("z", &[8, 16])?;
    let c = b.f32("c", &[])?;
    b.v(
        "Fused",
        &[y, z, c],
        attrs(&[
            (
                "body",
                body(&[
                    "Mul(i0, i2)",
                    "Add(t0, i1)",
                    "Tanh(t1)",
                    "Gelu(t2) approximate=tanh",
                ]),
            ),
            ("outputs", Attr::Ints(vec![0])),
        ]),
    )?;
    // A comparison and Where inside a body; an odd size.
    let w = b.f32("w", &[3, 7, 5])?;
    b.v(
        "Fused",
        &[w, bias],
        attrs(&[(
            "body",
            body(&[
                "Greater(i0, i0)",
                "Exp(i0)",
                "Where(t0, t1, i0)",
                "LeakyRelu(t2) alpha=0.2",
            ]),
        )]),
    )?;
    Ok(b.g)
}

fn reductions() -> Result<Graph> {
    let mut b = Builder::new("reductions");
    let x = b.f32("x", &[3, 5, 7, 2])?;
    let kinds = [
        "ReduceSum",
        "ReduceMean",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceSumSquare",
    ];
    let axis_sets: [&[i64]; 5] = [&[3], &[1], &[0, 2], &[1, 3], &[-1, 0, 1, 2]];
    for (i, op) in kinds.iter().enumerate() {
        for (j, axes) in axis_sets.iter().enumerate() {
            // Every kind over two axis sets, every axis set by several kinds.
            if (i + j) % 3 != 0 && j != i % 5 {
                continue;
            }
            let a = b.axes(axes)?;
            let keep = ((i + j) % 2) as i64;
            b.v(op, &[x, a], attrs(&[("keepdims", Attr::Int(keep))]))?;
        }
    }
    // No axes: all of them.
    b.op("ReduceSum", &[Some(x)], Attrs::new())?;
    // Long rows: several warps, then a 1024-thread block.
    let wide = b.f32("wide", &[4, 1000])?;
    let a = b.axes(&[1])?;
    b.v("ReduceSum", &[wide, a], Attrs::new())?;
    b.v("ReduceMax", &[wide, a], Attrs::new())?;
    let long = b.f32("long", &[2, 3000])?;
    let a = b.axes(&[-1])?;
    b.v("ReduceMean", &[long, a], Attrs::new())?;
    b.v("ReduceLogSumExp", &[long, a], Attrs::new())?;
    // An outer axis of a long row: the column kernel.
    let a = b.axes(&[0])?;
    b.v("ReduceSum", &[wide, a], Attrs::new())?;
    let img = b.f32("img", &[2, 3, 5, 5])?;
    b.v("GlobalAveragePool", &[img], Attrs::new())?;
    b.v("GlobalMaxPool", &[img], Attrs::new())?;
    Ok(b.g)
}

fn normalizations() -> Result<Graph> {
    let mut b = Builder::new("normalizations");
    let x = b.f32("x", &[6, 50])?;
    let y = b.f32("y", &[3, 4, 5])?;
    for op in ["Softmax", "LogSoftmax"] {
        b.v(op, &[x], attrs(&[("axis", Attr::Int(-1))]))?;
        b.v(op, &[y], attrs(&[("axis", Attr::Int(1))]))?;
        b.v(op, &[y], attrs(&[("axis", Attr::Int(0))]))?;
    }
    // Transposes: the last axis moved and kept, the default reversal, a bool tensor.
    b.v(
        "Transpose",
        &[y],
        attrs(&[("perm", Attr::Ints(vec![2, 0, 1]))]),
    )?;
    let t = b.f32("t", &[5, 3, 8])?;
    b.v(
        "Transpose",
        &[t],
        attrs(&[("perm", Attr::Ints(vec![1, 0, 2]))]),
    )?;
    b.v("Transpose", &[x], Attrs::new())?;
    let flags = b.param("flags", DType::Bool, &[3, 5])?;
    b.v("Transpose", &[flags], Attrs::new())?;
    let big = b.f32("big", &[2, 700])?;
    b.v("Softmax", &[big], Attrs::new())?;
    let h = b.f32("h", &[4, 7, 96])?;
    let scale = b.f32("scale", &[96])?;
    let bias = b.f32("ln_bias", &[96])?;
    b.v("LayerNormalization", &[h, scale, bias], Attrs::new())?;
    let scale2 = b.f32("scale2", &[7, 1])?;
    b.v(
        "LayerNormalization",
        &[h, scale2],
        attrs(&[("axis", Attr::Int(1)), ("epsilon", Attr::Float(1e-3))]),
    )?;
    Ok(b.g)
}

fn epilogues() -> Result<Graph> {
    let mut b = Builder::new("epilogues");
    let a = b.f32("a", &[3, 5])?;
    let w = b.f32("w", &[5, 7])?;
    let bias = b.f32("bias", &[7])?;
    let z = b.f32("z", &[3, 7])?;
    let act_attrs = |name: &str| -> Vec<String> {
        match name {
            "LeakyRelu" => vec!["alpha=0.1".into()],
            "Clip" => vec!["min=-0.5".into(), "max=1.5".into()],
            "HardSigmoid" => vec!["alpha=0.25".into(), "beta=0.4".into()],
            "Gelu" => vec!["approximate=tanh".into()],
            _ => vec![],
        }
    };
    for (i, act) in ACTIVATIONS.iter().enumerate() {
        let mut at = attrs(&[("activation", s(act))]);
        let extra = act_attrs(act);
        if !extra.is_empty() {
            at.set("activation_attrs", Attr::Strings(extra));
        }
        let ins = match i % 3 {
            0 => vec![Some(a), Some(w), Some(bias), Some(z)],
            1 => vec![Some(a), Some(w), Some(bias)],
            _ => vec![Some(a), Some(w), None, Some(z)],
        };
        b.op("FusedMatMul", &ins, at)?;
    }
    b.op("FusedMatMul", &[Some(a), Some(w), Some(bias)], Attrs::new())?;
    // Gemm: cuBLAS's alpha·A'·B', then beta·C (C broadcast) by the generator.
    let at = b.f32("at", &[5, 3])?;
    b.v(
        "Gemm",
        &[at, w, bias],
        attrs(&[
            ("transA", Attr::Int(1)),
            ("alpha", Attr::Float(0.5)),
            ("beta", Attr::Float(1.5)),
        ]),
    )?;
    b.v("Gemm", &[a, w, z], Attrs::new())?;
    let x = b.f32("x", &[1, 2, 6, 6])?;
    let k = b.f32("kw", &[4, 2, 3, 3])?;
    let cb = b.f32("cb", &[4])?;
    let res = b.f32("res", &[1, 4, 4, 4])?;
    b.op(
        "FusedConv",
        &[Some(x), Some(k), Some(cb), Some(res)],
        attrs(&[("activation", s("Relu"))]),
    )?;
    b.op(
        "FusedConv",
        &[Some(x), Some(k), Some(cb)],
        attrs(&[
            ("activation", s("Clip")),
            (
                "activation_attrs",
                Attr::Strings(vec!["min=0".into(), "max=6".into()]),
            ),
        ]),
    )?;
    Ok(b.g)
}

fn convolutions() -> Result<Graph> {
    let mut b = Builder::new("convolutions");
    let ints = |v: &[i64]| Attr::Ints(v.to_vec());
    // Several tiles in every direction of the implicit GEMM, with a bias.
    let x = b.f32("x", &[2, 8, 11, 11])?;
    let w = b.f32("w", &[70, 8, 3, 3])?;
    let bias = b.f32("bias", &[70])?;
    b.v(
        "Conv",
        &[x, w, bias],
        attrs(&[("pads", ints(&[1, 1, 1, 1]))]),
    )?;
    // Groups, strides, asymmetric pads.
    let x = b.f32("xg", &[1, 6, 7, 7])?;
    let w = b.f32("wg", &[9, 2, 3, 3])?;
    b.v(
        "Conv",
        &[x, w],
        attrs(&[
            ("group", Attr::Int(3)),
            ("strides", ints(&[2, 2])),
            ("pads", ints(&[1, 0, 0, 1])),
        ]),
    )?;
    // Depthwise with dilation; SAME padding.
    let x = b.f32("xd", &[1, 4, 9, 9])?;
    let w = b.f32("wd", &[4, 1, 3, 3])?;
    b.v(
        "Conv",
        &[x, w],
        attrs(&[
            ("group", Attr::Int(4)),
            ("dilations", ints(&[2, 2])),
            ("pads", ints(&[2, 2, 2, 2])),
        ]),
    )?;
    b.v(
        "Conv",
        &[x, w],
        attrs(&[
            ("group", Attr::Int(4)),
            ("auto_pad", s("SAME_UPPER")),
            ("strides", ints(&[2, 2])),
        ]),
    )?;
    // 1-D.
    let x = b.f32("x1", &[2, 3, 20])?;
    let w = b.f32("w1", &[5, 3, 4])?;
    b.v("Conv", &[x, w], attrs(&[("strides", ints(&[3]))]))?;
    // Pools: padding, strides, ceil mode, the padding counted or not, 1-D.
    let img = b.f32("img", &[2, 3, 9, 10])?;
    let k3 = || ("kernel_shape", Attr::Ints(vec![3, 3]));
    b.v(
        "MaxPool",
        &[img],
        attrs(&[
            k3(),
            ("strides", ints(&[2, 2])),
            ("pads", ints(&[1, 1, 1, 1])),
        ]),
    )?;
    b.v(
        "MaxPool",
        &[img],
        attrs(&[
            k3(),
            ("strides", ints(&[2, 2])),
            ("ceil_mode", Attr::Int(1)),
        ]),
    )?;
    b.v(
        "AveragePool",
        &[img],
        attrs(&[k3(), ("pads", ints(&[1, 0, 1, 2]))]),
    )?;
    b.v(
        "AveragePool",
        &[img],
        attrs(&[
            k3(),
            ("strides", ints(&[2, 2])),
            ("pads", ints(&[1, 1, 1, 1])),
            ("count_include_pad", Attr::Int(1)),
            ("ceil_mode", Attr::Int(1)),
        ]),
    )?;
    b.v(
        "MaxPool",
        &[x],
        attrs(&[("kernel_shape", ints(&[4])), ("strides", ints(&[3]))]),
    )?;
    Ok(b.g)
}

/// The sample graphs, by name.
pub fn graphs() -> Result<Vec<Graph>> {
    Ok(vec![
        unary()?,
        binary()?,
        fused()?,
        reductions()?,
        normalizations()?,
        epilogues()?,
        convolutions()?,
    ])
}

pub(crate) fn all() -> Vec<GeneratedKernel> {
    let graphs =
        graphs().expect("the sample graphs are well formed (tests/cuda_codegen.rs checks)");
    graphs
        .iter()
        .flat_map(|g| {
            kernels_for_graph(g)
                .expect("every sample kernel generates (tests/cuda_codegen.rs checks)")
                .into_iter()
                .map(|(_, k)| k)
        })
        .collect()
}
