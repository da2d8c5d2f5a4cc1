//! Elementwise kernels: a program of steps (catalogue elementwise ops, through the one
//! table in `cexpr`) evaluated per output element in a grid-stride loop, one thread per
//! element. Operands broadcast into the output by index arithmetic on the specialized
//! shapes. When every operand is read at the output's own index (or is one repeated
//! value) and everything is f32, each thread handles four elements with float4 loads and
//! stores (buffers are 16-byte aligned, see [`super::GeneratedKernel`]).
//!
//! Plain elementwise nodes, `Fused` bodies (with exported steps as extra outputs) and
//! the epilogues of FusedMatMul/FusedConv are all such programs.
use std::fmt::Write;

use super::cexpr::{self, CVal, Ty};
use super::index::{Access, Walk};
use super::{GeneratedKernel, KernelParam, Source};
use crate::ir::Attrs;

/// Threads per block of elementwise kernels.
pub const BLOCK: u32 = 256;
/// Grid-stride loops cover the rest; more blocks than this buy nothing.
pub const MAX_BLOCKS: u64 = 65535;

/// An operand of the program: a kernel buffer of a type and shape.
#[derive(Debug, Clone)]
pub struct EltInput {
    pub param: KernelParam,
    pub ty: Ty,
    pub shape: Vec<usize>,
}

/// A step's operand.
#[derive(Debug, Clone)]
pub enum EltArg {
    Input(usize),
    Step(usize),
    /// A constant expression (an epilogue's Clip bounds).
    Lit(CVal),
}

#[derive(Debug, Clone)]
pub struct EltStep {
    pub op: String,
    pub attrs: Attrs,
    pub args: Vec<Option<EltArg>>,
}

/// Steps over inputs; `outputs` are (buffer, step whose value it stores), all of
/// `shape`. A buffer may be both an input and an output (read, then written in place).
#[derive(Debug, Clone)]
pub struct EltProgram {
    pub inputs: Vec<EltInput>,
    pub steps: Vec<EltStep>,
    pub outputs: Vec<(KernelParam, usize)>,
    pub shape: Vec<usize>,
    /// The outputs' types as the graph declares them (empty: not checked).
    pub expect: Vec<Ty>,
}

/// The program as one kernel named `entry`.
pub(crate) fn generate(entry: &str, prog: &EltProgram) -> Result<GeneratedKernel, String> {
    let n: usize = prog.shape.iter().product();
    if n >= 1 << 31 {
        return Err(format!(
            "{n} elements: more than the generator indexes (2^31)"
        ));
    }
    // Types first: each step's value through the table, with placeholder names.
    let mut step_vals: Vec<CVal> = vec![];
    let mut step_exprs: Vec<String> = vec![];
    let mut used = vec![false; prog.inputs.len()];
    for (i, st) in prog.steps.iter().enumerate() {
        let mut args = vec![];
        for a in &st.args {
            args.push(match a {
                None => None,
                Some(EltArg::Input(k)) => {
                    let inp = prog
                        .inputs
                        .get(*k)
                        .ok_or_else(|| format!("step {i} reads input {k}, which is missing"))?;
                    used[*k] = true;
                    Some(CVal::new(format!("a{k}"), inp.ty))
                }
                Some(EltArg::Step(k)) if *k < i => Some(step_vals[*k].clone()),
                Some(EltArg::Step(k)) => {
                    return Err(format!("step {i} reads step {k}, which is not earlier"))
                }
                Some(EltArg::Lit(v)) => Some(v.clone()),
            });
        }
        let v = cexpr::elementwise(&st.op, &st.attrs, &args)
            .map_err(|e| format!("step {i}: {e}"))?
            .ok_or_else(|| format!("step {i}: {} has no CUDA expression", st.op))?;
        step_exprs.push(v.expr.clone());
        step_vals.push(CVal::new(format!("t{i}"), v.ty));
    }
    let mut out_tys = vec![];
    for (p, s) in &prog.outputs {
        let v = step_vals
            .get(*s)
            .ok_or_else(|| format!("output {p:?} stores step {s}, which is missing"))?;
        out_tys.push(v.ty);
    }
    if !prog.expect.is_empty() && prog.expect != out_tys {
        return Err(format!(
            "the outputs are {:?}, the kernel would give {out_tys:?}",
            prog.expect
        ));
    }

    // Parameters: every used input and every output, once each, in that order.
    let mut params: Vec<KernelParam> = vec![];
    let mut param_ty: Vec<Ty> = vec![];
    let mut written: Vec<bool> = vec![];
    let mut slot = |p: KernelParam, ty: Ty, write: bool| -> Result<usize, String> {
        if let Some(j) = params.iter().position(|q| *q == p) {
            if param_ty[j] != ty {
                return Err(format!("buffer {p:?} is read and written as two types"));
            }
            written[j] |= write;
            return Ok(j);
        }
        params.push(p);
        param_ty.push(ty);
        written.push(write);
        Ok(params.len() - 1)
    };
    let mut in_slot = vec![usize::MAX; prog.inputs.len()];
    for (k, inp) in prog.inputs.iter().enumerate() {
        if used[k] {
            in_slot[k] = slot(inp.param, inp.ty, false)?;
        }
    }
    let out_slot: Vec<usize> = prog
        .outputs
        .iter()
        .zip(&out_tys)
        .map(|((p, _), ty)| slot(*p, *ty, true))
        .collect::<Result<_, _>>()?;

    // Inputs no step reads need not broadcast (a Fused node may carry such).
    let shapes: Vec<&[usize]> = prog
        .inputs
        .iter()
        .enumerate()
        .map(|(k, i)| if used[k] { i.shape.as_slice() } else { &[] })
        .collect();
    let walk = Walk::new(&prog.shape, &shapes)
        .ok_or_else(|| format!("the operands do not broadcast to {:?}", prog.shape))?;
    let vector = n > 0
        && n.is_multiple_of(4)
        && prog
            .inputs
            .iter()
            .enumerate()
            .all(|(k, i)| !used[k] || (i.ty == Ty::F32 && walk.access(k) != Access::Strided))
        && out_tys.iter().all(|&t| t == Ty::F32);

    let mut src = Source::new(entry);
    src.line(cexpr::PRELUDE);
    let sig: Vec<String> = params
        .iter()
        .enumerate()
        .map(|(j, _)| {
            let c = param_ty[j].mem_c();
            if written[j] {
                format!("{c}* __restrict__ p{j}")
            } else {
                format!("const {c}* __restrict__ p{j}")
            }
        })
        .collect();
    let _ = writeln!(
        src.text,
        "extern \"C\" __global__ void __launch_bounds__({BLOCK}) {entry}({}) {{",
        sig.join(", ")
    );
    let work = if vector { n / 4 } else { n };
    src.line(&format!("  const unsigned n = {work}u;"));
    // Repeated operands: one load before the loop.
    for (k, inp) in prog.inputs.iter().enumerate() {
        if used[k] && walk.access(k) == Access::Repeated {
            let load = inp.ty.load(&format!("p{}[0]", in_slot[k]));
            src.line(&format!("  const {} a{k} = {load};", inp.ty.value_c()));
        }
    }
    src.line("  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {");
    let body = |src: &mut Source, indent: &str, loads: &[(usize, String)], stores: &[String]| {
        for (k, e) in loads {
            let ty = prog.inputs[*k].ty;
            src.line(&format!("{indent}const {} a{k} = {e};", ty.value_c()));
        }
        for (i, e) in step_exprs.iter().enumerate() {
            src.line(&format!(
                "{indent}const {} t{i} = {e};",
                step_vals[i].ty.value_c()
            ));
        }
        for s in stores {
            src.line(&format!("{indent}{s}"));
        }
    };
    if vector {
        let mut loads = vec![];
        for (k, _) in prog.inputs.iter().enumerate() {
            if used[k] && walk.access(k) == Access::Linear {
                let j = in_slot[k];
                src.line(&format!(
                    "    const float4 v{k} = reinterpret_cast<const float4*>(p{j})[i];"
                ));
                src.line(&format!(
                    "    const float l{k}[4] = {{v{k}.x, v{k}.y, v{k}.z, v{k}.w}};"
                ));
                loads.push((k, format!("l{k}[l]")));
            }
        }
        for (o, _) in prog.outputs.iter().enumerate() {
            src.line(&format!("    float o{o}[4];"));
        }
        src.line("#pragma unroll");
        src.line("    for (int l = 0; l < 4; ++l) {");
        let stores: Vec<String> = prog
            .outputs
            .iter()
            .enumerate()
            .map(|(o, (_, s))| format!("o{o}[l] = t{s};"))
            .collect();
        body(&mut src, "      ", &loads, &stores);
        src.line("    }");
        for (o, _) in prog.outputs.iter().enumerate() {
            let j = out_slot[o];
            src.line(&format!(
                "    reinterpret_cast<float4*>(p{j})[i] = make_float4(o{o}[0], o{o}[1], o{o}[2], o{o}[3]);"
            ));
        }
    } else {
        let (stmts, offs) = walk.offsets("i", "unsigned", "x");
        for s in &stmts {
            src.line(&format!("    {s}"));
        }
        let loads: Vec<(usize, String)> = prog
            .inputs
            .iter()
            .enumerate()
            .filter(|(k, _)| used[*k] && walk.access(*k) != Access::Repeated)
            .map(|(k, inp)| (k, inp.ty.load(&format!("p{}[{}]", in_slot[k], offs[k]))))
            .collect();
        let stores: Vec<String> = prog
            .outputs
            .iter()
            .enumerate()
            .map(|(o, (_, s))| {
                format!(
                    "p{}[i] = {};",
                    out_slot[o],
                    out_tys[o].store(&format!("t{s}"))
                )
            })
            .collect();
        body(&mut src, "    ", &loads, &stores);
    }
    src.line("  }");
    src.line("}");
    let blocks = (work as u64).div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS) as u32;
    Ok(GeneratedKernel {
        entry: entry.to_string(),
        source: src.text,
        grid: [blocks, 1, 1],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
        params,
    })
}
