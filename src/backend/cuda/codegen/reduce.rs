//! Reductions, Softmax/LogSoftmax and LayerNormalization. f32 accumulation.
//!
//! When the innermost input axis is reduced, one block owns one output row: its threads
//! stride over the row (coalesced), combine in registers, then across the block by warp
//! shuffles and a shared-memory exchange of the warps' partials (`kiln_block_*`, whose
//! result every thread gets, so a row can be normalized after its statistics). When
//! the innermost axis is kept, adjacent threads own adjacent outputs and each walks its
//! reduced elements serially: the reads of a warp are still adjacent, and no block-wide
//! step is needed.
use super::cexpr::{self, Ty};
use super::index::Walk;
use super::{fixed, ty_of, GeneratedKernel, KernelParam, Source};
use crate::ir::ops::reduce::reduce_axes;
use crate::ir::{Graph, NodeId};

/// Threads per block of column kernels.
const COLUMN_BLOCK: u32 = 256;
/// The most blocks a column kernel's grid-stride loop launches.
const MAX_BLOCKS: u64 = 65535;

/// A block-wide combine: its name, `combine(a, b)` and identity.
#[derive(Clone, Copy, PartialEq)]
struct Combine {
    name: &'static str,
    expr: &'static str,
    identity: &'static str,
}

const SUM: Combine = Combine {
    name: "sum",
    expr: "a + b",
    identity: "0.0f",
};
const PROD: Combine = Combine {
    name: "prod",
    expr: "a * b",
    identity: "1.0f",
};
/// NaN wins (ReduceMax/Min).
const MAX: Combine = Combine {
    name: "max",
    expr: "kiln_max(a, b)",
    identity: "(-kiln_inf())",
};
const MIN: Combine = Combine {
    name: "min",
    expr: "kiln_min(a, b)",
    identity: "kiln_inf()",
};
/// NaN ignored (f64::max: the softmaxes' and log-sum-exp's shift, GlobalMaxPool).
const FMAX: Combine = Combine {
    name: "fmax",
    expr: "fmaxf(a, b)",
    identity: "(-kiln_inf())",
};

/// The device functions of `combines`, each once.
fn block_functions(combines: &[Combine]) -> String {
    let mut s = String::new();
    let mut seen: Vec<&str> = vec![];
    for c in combines {
        if seen.contains(&c.name) {
            continue;
        }
        seen.push(c.name);
        let (n, e, id) = (c.name, c.expr, c.identity);
        s.push_str(&format!(
            "static __device__ __forceinline__ float kiln_comb_{n}(float a, float b) {{ return {e}; }}
/* The block-wide {n} of v, returned to every thread: each warp combines by shuffles, the
   warps' partials meet in shared memory and every warp combines them again. blockDim.x is
   a multiple of 32; every thread of the block must call it. */
static __device__ float kiln_block_{n}(float v, float* red) {{
  for (int o = 16; o > 0; o >>= 1) {{ v = kiln_comb_{n}(v, __shfl_xor_sync(0xffffffffu, v, o)); }}
  const unsigned lane = threadIdx.x & 31u;
  if (lane == 0u) {{ red[threadIdx.x >> 5] = v; }}
  __syncthreads();
  v = lane < (blockDim.x >> 5) ? red[lane] : {id};
  for (int o = 16; o > 0; o >>= 1) {{ v = kiln_comb_{n}(v, __shfl_xor_sync(0xffffffffu, v, o)); }}
  __syncthreads();
  return v;
}}
"
        ));
    }
    s
}

/// Axes grouped for a reduction: runs of kept or reduced axes merged, size-1 axes
/// dropped; each group as (size, stride in the input).
struct Groups {
    kept: Vec<(usize, usize)>,
    reduced: Vec<(usize, usize)>,
    rows: usize,
    len: usize,
    /// Whether the innermost (non-1) axis is reduced.
    inner_reduced: bool,
}

fn groups(dims: &[usize], reduced: &[bool]) -> Groups {
    let mut merged: Vec<(usize, bool)> = vec![];
    for (&d, &r) in dims.iter().zip(reduced) {
        if d == 1 {
            continue;
        }
        match merged.last_mut() {
            Some((s, lr)) if *lr == r => *s *= d,
            _ => merged.push((d, r)),
        }
    }
    let mut kept = vec![];
    let mut red = vec![];
    let mut stride = 1;
    for &(d, r) in merged.iter().rev() {
        if r {
            red.insert(0, (d, stride));
        } else {
            kept.insert(0, (d, stride));
        }
        stride *= d;
    }
    Groups {
        rows: kept.iter().map(|g| g.0).product(),
        len: red.iter().map(|g| g.0).product(),
        inner_reduced: merged.last().is_some_and(|g| g.1),
        kept,
        reduced: red,
    }
}

/// Statements and the offset expression of linear index `var` over `groups`.
fn offset(var: &str, groups: &[(usize, usize)], p: &str) -> (Vec<String>, String) {
    match groups {
        [] => (vec![], "0u".into()),
        [(_, 1)] => (vec![], var.into()),
        [(_, s)] => (vec![], format!("{var} * {s}u")),
        _ => {
            let mut stmts = vec![format!("unsigned {p}r = {var};")];
            let mut terms = vec![];
            for (k, &(d, s)) in groups.iter().enumerate().rev() {
                if k == 0 {
                    stmts.push(format!("const unsigned {p}c{k} = {p}r;"));
                } else {
                    stmts.push(format!(
                        "const unsigned {p}c{k} = {p}r % {d}u; {p}r /= {d}u;"
                    ));
                }
                terms.push(format!("{p}c{k} * {s}u"));
            }
            terms.reverse();
            (stmts, format!("({})", terms.join(" + ")))
        }
    }
}

/// Threads for one block per row of `len` elements.
fn row_threads(len: usize, rows: usize) -> u32 {
    let cap = if rows < 64 { 1024 } else { 256 };
    len.next_power_of_two().clamp(32, cap) as u32
}

fn too_big(n: usize) -> Result<(), String> {
    if n >= 1 << 31 {
        return Err(format!(
            "{n} elements: more than the generator indexes (2^31)"
        ));
    }
    Ok(())
}

/// How a reduction maps, combines and finishes.
struct Kind {
    map: &'static str,
    combine: Combine,
    /// `A` is the accumulator, `R` the count.
    finish: &'static str,
    /// Log-sum-exp: a max pass first, then the sum of exp(x - max).
    lse: bool,
}

fn kind(op: &str) -> Option<Kind> {
    let k = |map, combine, finish| Kind {
        map,
        combine,
        finish,
        lse: false,
    };
    Some(match op {
        "ReduceSum" => k("X", SUM, "A"),
        "ReduceMean" | "GlobalAveragePool" => k("X", SUM, "A / R"),
        "ReduceMax" => k("X", MAX, "A"),
        "GlobalMaxPool" => k("X", FMAX, "A"),
        "ReduceMin" => k("X", MIN, "A"),
        "ReduceProd" => k("X", PROD, "A"),
        "ReduceL1" => k("fabsf(X)", SUM, "A"),
        "ReduceL2" => k("X * X", SUM, "sqrtf(A)"),
        "ReduceLogSum" => k("X", SUM, "logf(A)"),
        "ReduceSumSquare" => k("X * X", SUM, "A"),
        "ReduceLogSumExp" => Kind {
            map: "expf(X - m)",
            combine: SUM,
            finish: "logf(A) + m",
            lse: true,
        },
        _ => return None,
    })
}

/// The f32 input 0 and output 0 of a reduction-like node: (input dims, output elements).
fn f32_io(graph: &Graph, id: NodeId) -> Result<(Vec<usize>, usize), String> {
    let n = graph.node(id);
    let x = n.inputs[0].ok_or("input 0 is missing")?;
    let xt = graph.value_type(x).map_err(|e| e.to_string())?;
    for (what, t) in [("input 0", xt), ("output 0", &n.outputs[0])] {
        if ty_of(t.dtype, what)? != Ty::F32 {
            return Err(format!(
                "{what} is {}; the CUDA generator supports f32 here",
                t.dtype
            ));
        }
    }
    if n.attrs.int_or("block", 0)? != 0 {
        return Err("a blocked (NCHWc) pool: run the pipeline without layout blocking".into());
    }
    let dims = fixed(xt)?;
    too_big(dims.iter().product())?;
    let out: usize = fixed(&n.outputs[0])?.iter().product();
    Ok((dims, out))
}

/// A reduction (`Reduce*`, `GlobalAveragePool`, `GlobalMaxPool`).
pub(crate) fn reduction(graph: &Graph, id: NodeId, entry: &str) -> Result<GeneratedKernel, String> {
    let n = graph.node(id);
    let k = kind(&n.op).ok_or_else(|| format!("{} is not a reduction", n.op))?;
    let (dims, out) = f32_io(graph, id)?;
    let rank = dims.len();
    let axes: Vec<usize> = if n.op.starts_with("Global") {
        (2..rank).collect()
    } else {
        let xt = graph
            .value_type(n.inputs[0].expect("checked"))
            .map_err(|e| e.to_string())?;
        let axes_input = match n.inputs.get(1).copied().flatten() {
            None => None,
            Some(v) => {
                let node = graph.node(v.node);
                match (&node.op[..], &node.data) {
                    ("Constant", Some(t)) => Some(Some(t.to_i64_vec())),
                    _ => return Err("the axes input must be a constant".into()),
                }
            }
        };
        reduce_axes(&xt.shape, axes_input, &n.attrs)?
            .ok_or("the axes are not known before run time")?
    };
    let reduced: Vec<bool> = (0..rank).map(|a| axes.contains(&a)).collect();
    let g = groups(&dims, &reduced);
    if g.rows != out {
        return Err(format!(
            "{} output elements, the reduction gives {}",
            out, g.rows
        ));
    }
    let len = g.len;
    let map = |x: &str| k.map.replace('X', x);
    let finish = |a: &str| {
        k.finish
            .replace('A', a)
            .replace('R', &cexpr::float_lit(len as f64))
    };
    let mut src = Source::new(entry);
    src.line(cexpr::PRELUDE);
    let (rstmts, roff) = offset("row", &g.kept, "kr_");
    let (jstmts, joff) = offset("j", &g.reduced, "kj_");
    let sig = "(const float* __restrict__ x, float* __restrict__ y)";
    let rows = g.rows;
    if g.inner_reduced {
        let threads = row_threads(len, rows);
        let mut combines = vec![k.combine];
        if k.lse {
            combines.insert(0, FMAX);
        }
        src.line(&block_functions(&combines));
        src.line(&format!(
            "extern \"C\" __global__ void __launch_bounds__({threads}) {entry}{sig} {{"
        ));
        src.line("  __shared__ float red[32];");
        src.line("  const unsigned row = blockIdx.x;");
        src.line(&format!("  if (row >= {rows}u) {{ return; }}"));
        for s in &rstmts {
            src.line(&format!("  {s}"));
        }
        src.line(&format!("  const float* xr = x + {roff};"));
        let each = |src: &mut Source, body: &str| {
            src.line(&format!(
                "  for (unsigned j = threadIdx.x; j < {len}u; j += blockDim.x) {{"
            ));
            for s in &jstmts {
                src.line(&format!("    {s}"));
            }
            src.line(&format!("    const float v = xr[{joff}];"));
            src.line(&format!("    {body}"));
            src.line("  }");
        };
        if k.lse {
            src.line("  float m = -kiln_inf();");
            each(&mut src, "m = fmaxf(m, v);");
            src.line("  m = kiln_block_fmax(m, red);");
            src.line("  m = fabsf(m) <= 3.40282347e38f ? m : 0.0f;");
        }
        let c = k.combine;
        src.line(&format!("  float acc = {};", c.identity));
        each(
            &mut src,
            &format!("acc = kiln_comb_{}(acc, {});", c.name, map("v")),
        );
        src.line(&format!("  acc = kiln_block_{}(acc, red);", c.name));
        src.line(&format!(
            "  if (threadIdx.x == 0u) {{ y[row] = {}; }}",
            finish("acc")
        ));
        src.line("}");
        Ok(GeneratedKernel {
            entry: entry.into(),
            source: src.text,
            grid: [rows.max(1) as u32, 1, 1],
            block: [threads, 1, 1],
            shared_bytes: 0,
            params: vec![KernelParam::Input(0), KernelParam::Output(0)],
        })
    } else {
        let c = k.combine;
        src.line(&format!(
            "static __device__ __forceinline__ float kiln_comb_{}(float a, float b) {{ return {}; }}",
            c.name, c.expr
        ));
        src.line(&format!(
            "extern \"C\" __global__ void __launch_bounds__({COLUMN_BLOCK}) {entry}{sig} {{"
        ));
        src.line(&format!(
            "  for (unsigned row = blockIdx.x * blockDim.x + threadIdx.x; row < {rows}u; row += gridDim.x * blockDim.x) {{"
        ));
        for s in &rstmts {
            src.line(&format!("    {s}"));
        }
        src.line(&format!("    const float* xr = x + {roff};"));
        let each = |src: &mut Source, body: &str| {
            src.line(&format!("    for (unsigned j = 0; j < {len}u; ++j) {{"));
            for s in &jstmts {
                src.line(&format!("      {s}"));
            }
            src.line(&format!("      const float v = xr[{joff}];"));
            src.line(&format!("      {body}"));
            src.line("    }");
        };
        if k.lse {
            src.line("    float m = -kiln_inf();");
            each(&mut src, "m = fmaxf(m, v);");
            src.line("    m = fabsf(m) <= 3.40282347e38f ? m : 0.0f;");
        }
        src.line(&format!("    float acc = {};", c.identity));
        each(
            &mut src,
            &format!("acc = kiln_comb_{}(acc, {});", c.name, map("v")),
        );
        src.line(&format!("    y[row] = {};", finish("acc")));
        src.line("  }");
        src.line("}");
        Ok(column_kernel(
            entry,
            src,
            rows,
            vec![KernelParam::Input(0), KernelParam::Output(0)],
        ))
    }
}

fn column_kernel(
    entry: &str,
    src: Source,
    rows: usize,
    params: Vec<KernelParam>,
) -> GeneratedKernel {
    let blocks = (rows as u64)
        .div_ceil(COLUMN_BLOCK as u64)
        .clamp(1, MAX_BLOCKS) as u32;
    GeneratedKernel {
        entry: entry.into(),
        source: src.text,
        grid: [blocks, 1, 1],
        block: [COLUMN_BLOCK, 1, 1],
        shared_bytes: 0,
        params,
    }
}

/// Softmax or LogSoftmax along `axis`.
pub(crate) fn softmax(graph: &Graph, id: NodeId, entry: &str) -> Result<GeneratedKernel, String> {
    let n = graph.node(id);
    let log = n.op == "LogSoftmax";
    let (dims, _) = f32_io(graph, id)?;
    let axis = crate::ir::shape::norm_axis(n.attrs.int_or("axis", -1)?, dims.len())?;
    let outer: usize = dims[..axis].iter().product();
    let len = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let mut src = Source::new(entry);
    src.line(cexpr::PRELUDE);
    let sig = "(const float* __restrict__ x, float* __restrict__ y)";
    let write = if log {
        "yr[J] = (xr[J] - m) - ls;"
    } else {
        "yr[J] = expf(xr[J] - m) / s;"
    };
    let params = vec![KernelParam::Input(0), KernelParam::Output(0)];
    if inner == 1 {
        let threads = row_threads(len, outer);
        src.line(&block_functions(&[FMAX, SUM]));
        src.line(&format!(
            "extern \"C\" __global__ void __launch_bounds__({threads}) {entry}{sig} {{"
        ));
        src.line("  __shared__ float red[32];");
        src.line("  const unsigned row = blockIdx.x;");
        src.line(&format!("  if (row >= {outer}u) {{ return; }}"));
        src.line(&format!("  const float* xr = x + row * {len}u;"));
        src.line(&format!("  float* yr = y + row * {len}u;"));
        let each = |src: &mut Source, body: &str| {
            src.line(&format!(
                "  for (unsigned j = threadIdx.x; j < {len}u; j += blockDim.x) {{ {} }}",
                body.replace('J', "j")
            ));
        };
        src.line("  float m = -kiln_inf();");
        each(&mut src, "m = fmaxf(m, xr[J]);");
        src.line("  m = kiln_block_fmax(m, red);");
        src.line("  float s = 0.0f;");
        each(&mut src, "s += expf(xr[J] - m);");
        src.line("  s = kiln_block_sum(s, red);");
        if log {
            src.line("  const float ls = logf(s);");
        }
        each(&mut src, write);
        src.line("}");
        Ok(GeneratedKernel {
            entry: entry.into(),
            source: src.text,
            grid: [outer.max(1) as u32, 1, 1],
            block: [threads, 1, 1],
            shared_bytes: 0,
            params,
        })
    } else {
        let rows = outer * inner;
        src.line(&format!(
            "extern \"C\" __global__ void __launch_bounds__({COLUMN_BLOCK}) {entry}{sig} {{"
        ));
        src.line(&format!(
            "  for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < {rows}u; o += gridDim.x * blockDim.x) {{"
        ));
        src.line(&format!(
            "    const unsigned base = (o / {inner}u) * {} + o % {inner}u;",
            len * inner
        ));
        src.line("    const float* xr = x + base;");
        src.line("    float* yr = y + base;");
        let each = |src: &mut Source, body: &str| {
            src.line(&format!(
                "    for (unsigned j = 0; j < {len}u; ++j) {{ {} }}",
                body.replace('J', &format!("j * {inner}u"))
            ));
        };
        src.line("    float m = -kiln_inf();");
        each(&mut src, "m = fmaxf(m, xr[J]);");
        src.line("    float s = 0.0f;");
        each(&mut src, "s += expf(xr[J] - m);");
        if log {
            src.line("    const float ls = logf(s);");
        }
        each(&mut src, write);
        src.line("  }");
        src.line("}");
        Ok(column_kernel(entry, src, rows, params))
    }
}

/// LayerNormalization over the axes from `axis` on: one block per row; the mean, then
/// the variance around it (two passes, as the reference), then the normalized row.
pub(crate) fn layer_norm(
    graph: &Graph,
    id: NodeId,
    entry: &str,
) -> Result<GeneratedKernel, String> {
    let n = graph.node(id);
    let (dims, _) = f32_io(graph, id)?;
    for (o, t) in n.outputs.iter().enumerate() {
        if ty_of(t.dtype, &format!("output {o}"))? != Ty::F32 {
            return Err(format!(
                "output {o} is {}; LayerNormalization is f32 here",
                t.dtype
            ));
        }
    }
    let axis = crate::ir::shape::norm_axis(n.attrs.int_or("axis", -1)?, dims.len())?;
    let eps = n.attrs.float_or("epsilon", 1e-5)?;
    let rows: usize = dims[..axis].iter().product();
    let len: usize = dims[axis..].iter().product();
    let norm = &dims[axis..];
    let mut params = vec![KernelParam::Input(0)];
    let mut operands: Vec<Vec<usize>> = vec![];
    let mut names = vec![];
    for (i, what) in [(1, "Scale"), (2, "B")] {
        if let Some(v) = n.inputs.get(i).copied().flatten() {
            let t = graph.value_type(v).map_err(|e| e.to_string())?;
            if ty_of(t.dtype, what)? != Ty::F32 {
                return Err(format!(
                    "{what} is {}; LayerNormalization is f32 here",
                    t.dtype
                ));
            }
            operands.push(fixed(t)?);
            params.push(KernelParam::Input(i));
            names.push(what);
        }
    }
    let shapes: Vec<&[usize]> = operands.iter().map(|s| s.as_slice()).collect();
    let walk =
        Walk::new(norm, &shapes).ok_or("Scale or B does not broadcast to the normalized axes")?;
    let (wstmts, woffs) = walk.offsets("j", "unsigned", "w");
    params.extend([
        KernelParam::Output(0),
        KernelParam::Output(1),
        KernelParam::Output(2),
    ]);
    let threads = row_threads(len, rows);
    let mut src = Source::new(entry);
    src.line(cexpr::PRELUDE);
    src.line(&block_functions(&[SUM]));
    let mut sig = vec!["const float* __restrict__ x".to_string()];
    for w in &names {
        sig.push(format!("const float* __restrict__ {}", w.to_lowercase()));
    }
    sig.extend([
        "float* __restrict__ y".to_string(),
        "float* __restrict__ mean_out".to_string(),
        "float* __restrict__ inv_out".to_string(),
    ]);
    src.line(&format!(
        "extern \"C\" __global__ void __launch_bounds__({threads}) {entry}({}) {{",
        sig.join(", ")
    ));
    src.line("  __shared__ float red[32];");
    src.line("  const unsigned row = blockIdx.x;");
    src.line(&format!("  if (row >= {rows}u) {{ return; }}"));
    src.line(&format!("  const float* xr = x + row * {len}u;"));
    src.line(&format!("  float* yr = y + row * {len}u;"));
    let lenf = cexpr::float_lit(len as f64);
    let each = |src: &mut Source, body: &[String]| {
        src.line(&format!(
            "  for (unsigned j = threadIdx.x; j < {len}u; j += blockDim.x) {{"
        ));
        for b in body {
            src.line(&format!("    {b}"));
        }
        src.line("  }");
    };
    src.line("  float s = 0.0f;");
    each(&mut src, &["s += xr[j];".into()]);
    src.line(&format!(
        "  const float mean = kiln_block_sum(s, red) / {lenf};"
    ));
    src.line("  float q = 0.0f;");
    each(
        &mut src,
        &["const float d = xr[j] - mean;".into(), "q += d * d;".into()],
    );
    src.line(&format!(
        "  const float inv = 1.0f / sqrtf(kiln_block_sum(q, red) / {lenf} + {});",
        cexpr::float_lit(eps)
    ));
    let mut body: Vec<String> = wstmts.clone();
    let mut e = "(xr[j] - mean) * inv".to_string();
    for (k, w) in names.iter().enumerate() {
        let p = w.to_lowercase();
        e = match *w {
            "Scale" => format!("{e} * {p}[{}]", woffs[k]),
            _ => format!("{e} + {p}[{}]", woffs[k]),
        };
    }
    body.push(format!("yr[j] = {e};"));
    each(&mut src, &body);
    src.line("  if (threadIdx.x == 0u) { mean_out[row] = mean; inv_out[row] = inv; }");
    src.line("}");
    Ok(GeneratedKernel {
        entry: entry.into(),
        source: src.text,
        grid: [rows.max(1) as u32, 1, 1],
        block: [threads, 1, 1],
        shared_bytes: 0,
        params,
    })
}
