//! The epilogue of a FusedMatMul/FusedConv (bias, residual Z, activation) as an in-place
//! elementwise kernel over the GEMM's (or convolution's) output, in the order the
//! reference applies them: `act((y + bias) + Z)`. A Gemm's `+ beta·C` is one too, over
//! cuBLAS's `alpha·A'·B'`.
use super::cexpr::{CVal, Ty};
use super::eltwise::{self, EltArg, EltInput, EltProgram, EltStep};
use super::{fixed, ty_of, GeneratedKernel, KernelParam};
use crate::ir::ops::fused::ACTIVATIONS;
use crate::ir::ops::lookup;
use crate::ir::{Attr, AttrKind, Attrs, Graph, NodeId};

/// The activation step of `attrs` (`activation`, `activation_attrs`), if any.
pub(crate) fn activation_step(attrs: &Attrs, x: EltArg) -> Result<Option<EltStep>, String> {
    let name = attrs.string_or("activation", "none")?;
    if name == "none" {
        return Ok(None);
    }
    if !ACTIVATIONS.contains(&name) {
        return Err(format!("unknown activation '{name}'"));
    }
    let op = lookup(name).ok_or_else(|| format!("{name} is not a catalogue op"))?;
    let mut act_attrs = Attrs::new();
    let mut bounds: [Option<EltArg>; 2] = [None, None];
    for kv in attrs.strings("activation_attrs")?.unwrap_or(&[]) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("activation_attrs: '{kv}' is not NAME=VALUE"))?;
        let bad = || format!("activation_attrs: cannot read {k}={v}");
        if name == "Clip" && (k == "min" || k == "max") {
            let x: f64 = v.parse().map_err(|_| bad())?;
            bounds[(k == "max") as usize] = Some(EltArg::Lit(CVal::f32(x)));
            continue;
        }
        let kind = op
            .schema()
            .attrs
            .iter()
            .find(|s| s.name == k)
            .map(|s| s.kind);
        let value = match kind {
            Some(AttrKind::Int) => Attr::Int(v.parse().map_err(|_| bad())?),
            Some(AttrKind::Float) => Attr::Float(v.parse().map_err(|_| bad())?),
            Some(AttrKind::String) => Attr::String(v.to_string()),
            _ => return Err(bad()),
        };
        act_attrs.set(k, value);
    }
    let mut args = vec![Some(x)];
    if name == "Clip" {
        let [lo, hi] = bounds;
        args.push(lo);
        args.push(hi);
    }
    Ok(Some(EltStep {
        op: name.to_string(),
        attrs: act_attrs,
        args,
    }))
}

fn add(a: EltArg, b: EltArg) -> EltStep {
    EltStep {
        op: "Add".into(),
        attrs: Attrs::new(),
        args: vec![Some(a), Some(b)],
    }
}

pub(crate) fn epilogue(
    graph: &Graph,
    id: NodeId,
    entry: &str,
) -> Result<Option<GeneratedKernel>, String> {
    let n = graph.node(id);
    let conv = match n.op.as_str() {
        "FusedMatMul" => false,
        "FusedConv" => true,
        "Gemm" => return gemm_epilogue(graph, id, entry),
        _ => return Ok(None),
    };
    if conv && n.attrs.int_or("block", 0)? != 0 {
        return Err("a blocked (NCHWc) FusedConv: run the pipeline without layout blocking".into());
    }
    let y_type = &n.outputs[0];
    let y_ty = ty_of(y_type.dtype, "output 0")?;
    if y_ty != Ty::F32 {
        return Err(format!("output 0 is {}; epilogues are f32", y_type.dtype));
    }
    let shape = fixed(y_type)?;
    let mut inputs = vec![EltInput {
        param: KernelParam::Output(0),
        ty: Ty::F32,
        shape: shape.clone(),
    }];
    let mut steps: Vec<EltStep> = vec![];
    let last = |steps: &Vec<EltStep>| {
        if steps.is_empty() {
            EltArg::Input(0)
        } else {
            EltArg::Step(steps.len() - 1)
        }
    };
    for (i, what) in [(2, "bias"), (3, "residual Z")] {
        let Some(v) = n.inputs.get(i).copied().flatten() else {
            continue;
        };
        let t = graph.value_type(v).map_err(|e| e.to_string())?;
        if ty_of(t.dtype, what)? != Ty::F32 {
            return Err(format!("{what} is {}; epilogues are f32", t.dtype));
        }
        let mut s = fixed(t).map_err(|e| format!("{what}: {e}"))?;
        if conv && i == 2 {
            // Conv's bias is one value per output channel (axis 1).
            s.extend(std::iter::repeat_n(1, shape.len().saturating_sub(2)));
        }
        inputs.push(EltInput {
            param: KernelParam::Input(i),
            ty: Ty::F32,
            shape: s,
        });
        let k = inputs.len() - 1;
        steps.push(add(last(&steps), EltArg::Input(k)));
    }
    if let Some(act) = activation_step(&n.attrs, last(&steps))? {
        steps.push(act);
    }
    if steps.is_empty() {
        return Ok(None);
    }
    let prog = EltProgram {
        inputs,
        outputs: vec![(KernelParam::Output(0), steps.len() - 1)],
        steps,
        shape,
        expect: vec![Ty::F32],
    };
    eltwise::generate(entry, &prog).map(Some)
}

/// Gemm's `y + beta·C` (C broadcast to Y) over `y = alpha·A'·B'`; Ok(None) without C.
fn gemm_epilogue(
    graph: &Graph,
    id: NodeId,
    entry: &str,
) -> Result<Option<GeneratedKernel>, String> {
    let n = graph.node(id);
    let Some(c) = n.inputs.get(2).copied().flatten() else {
        return Ok(None);
    };
    let ct = graph.value_type(c).map_err(|e| e.to_string())?;
    for (what, t) in [("C", ct), ("output 0", &n.outputs[0])] {
        if ty_of(t.dtype, what)? != Ty::F32 {
            return Err(format!("{what} is {}; epilogues are f32", t.dtype));
        }
    }
    let shape = fixed(&n.outputs[0])?;
    let beta = n.attrs.float_or("beta", 1.0)?;
    let inputs = vec![
        EltInput {
            param: KernelParam::Output(0),
            ty: Ty::F32,
            shape: shape.clone(),
        },
        EltInput {
            param: KernelParam::Input(2),
            ty: Ty::F32,
            shape: fixed(ct).map_err(|e| format!("C: {e}"))?,
        },
    ];
    let mut steps = vec![];
    let mut c_arg = EltArg::Input(1);
    if beta != 1.0 {
        steps.push(EltStep {
            op: "Mul".into(),
            attrs: Attrs::new(),
            args: vec![Some(EltArg::Input(1)), Some(EltArg::Lit(CVal::f32(beta)))],
        });
        c_arg = EltArg::Step(0);
    }
    steps.push(add(EltArg::Input(0), c_arg));
    let prog = EltProgram {
        inputs,
        outputs: vec![(KernelParam::Output(0), steps.len() - 1)],
        steps,
        shape,
        expect: vec![Ty::F32],
    };
    eltwise::generate(entry, &prog).map(Some)
}
