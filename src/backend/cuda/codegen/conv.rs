//! Conv and FusedConv (NCHW, 1-D and 2-D, groups, strides, pads, dilations) as an
//! implicit GEMM: per group, Y[m, p] = Σ_k W[m, k] · X̂[k, p] with k = (c, kh, kw) and
//! p = (n, oh, ow), X̂ gathered from X on the fly (zero outside the padding). A block
//! computes a 64×64 tile of Y with 256 threads (4×4 outputs each), staging 16-deep
//! slices of W and X̂ in shared memory; a warp's X̂ loads run along the output pixels,
//! so they are adjacent for stride 1. The epilogue (Conv's bias; FusedConv's bias,
//! residual and activation) is applied to the accumulators before the one store.
use super::cexpr::{self, CVal, Ty};
use super::eltwise::EltArg;
use super::epilogue::activation_step;
use super::{fixed, ty_of, GeneratedKernel, KernelParam, Source};
use crate::ir::ops::conv::windows;
use crate::ir::{Graph, NodeId};

const BM: usize = 64;
const BN: usize = 64;
const BK: usize = 16;
const THREADS: u32 = 256;

pub(crate) fn conv(
    graph: &Graph,
    id: NodeId,
    entry: &str,
) -> Result<Option<GeneratedKernel>, String> {
    let n = graph.node(id);
    let fused = n.op == "FusedConv";
    if fused && n.attrs.int_or("block", 0)? != 0 {
        return Err("a blocked (NCHWc) FusedConv: run the pipeline without layout blocking".into());
    }
    let input = |i: usize| -> Result<Option<Vec<usize>>, String> {
        match n.inputs.get(i).copied().flatten() {
            None => Ok(None),
            Some(v) => {
                let t = graph.value_type(v).map_err(|e| e.to_string())?;
                if ty_of(t.dtype, &format!("input {i}"))? != Ty::F32 {
                    return Err(format!(
                        "input {i} is {}; convolutions are f32 here",
                        t.dtype
                    ));
                }
                fixed(t).map(Some)
            }
        }
    };
    let x = input(0)?.ok_or("input 0 is missing")?;
    let w = input(1)?.ok_or("input 1 is missing")?;
    let bias = input(2)?;
    let z = if fused { input(3)? } else { None };
    let y = fixed(&n.outputs[0])?;
    if ty_of(n.outputs[0].dtype, "output 0")? != Ty::F32 {
        return Err(format!(
            "output 0 is {}; convolutions are f32 here",
            n.outputs[0].dtype
        ));
    }
    // 1-D and 2-D; a 1-D convolution is a 2-D one of height 1.
    let (h, wd, kh, kw) = match x.len() {
        3 => (1, x[2], 1, w[2]),
        4 => (x[2], x[3], w[2], w[3]),
        _ => return Ok(None),
    };
    let spatial: Vec<Option<usize>> = x[2..].iter().map(|&d| Some(d)).collect();
    let win = windows(&n.attrs, &w[2..], &spatial)?;
    let (sh, dh, ph) = if x.len() == 4 {
        (win[0].stride, win[0].dilation, win[0].pad_begin)
    } else {
        (1, 1, 0)
    };
    let lw = win[win.len() - 1];
    let (sw, dw, pw) = (lw.stride, lw.dilation, lw.pad_begin);
    let (batch, c) = (x[0], x[1]);
    let m = w[0];
    let group = n.attrs.int_or("group", 1)? as usize;
    if group == 0 || !c.is_multiple_of(group) || !m.is_multiple_of(group) || w[1] * group != c {
        return Err(format!(
            "group {group} does not divide X's {c} and W's {m} channels"
        ));
    }
    let (oh, ow) = if y.len() == 4 {
        (y[2], y[3])
    } else {
        (1, y[2])
    };
    let (mg, cg) = (m / group, c / group);
    let k = cg * kh * kw;
    let p = batch * oh * ow;
    let total: usize = [
        x.iter().product::<usize>(),
        w.iter().product(),
        y.iter().product(),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    if total >= 1 << 31 {
        return Err(format!(
            "{total} elements: more than the generator indexes (2^31)"
        ));
    }

    // The epilogue on accumulator `v` of output channel `mc`, element `yi`.
    let mut params = vec![KernelParam::Input(0), KernelParam::Input(1)];
    let mut sig = vec![
        "const float* __restrict__ x".to_string(),
        "const float* __restrict__ w".to_string(),
    ];
    let mut epi = vec![];
    if bias.is_some() {
        params.push(KernelParam::Input(2));
        sig.push("const float* __restrict__ bias".into());
        epi.push("v = v + bias[mc];".to_string());
    }
    if z.is_some() {
        params.push(KernelParam::Input(3));
        sig.push("const float* __restrict__ z".into());
        epi.push("v = v + z[yi];".to_string());
    }
    if fused {
        if let Some(step) = activation_step(&n.attrs, EltArg::Input(0))? {
            let args: Vec<Option<CVal>> = step
                .args
                .iter()
                .map(|a| match a {
                    Some(EltArg::Lit(v)) => Some(v.clone()),
                    Some(_) => Some(CVal::new("v", Ty::F32)),
                    None => None,
                })
                .collect();
            let e = cexpr::elementwise(&step.op, &step.attrs, &args)?
                .ok_or_else(|| format!("{} has no CUDA expression", step.op))?;
            epi.push(format!("v = {};", e.expr));
        }
    }
    params.push(KernelParam::Output(0));
    sig.push("float* __restrict__ y".into());

    let mut src = Source::new(entry);
    src.line(cexpr::PRELUDE);
    src.line(&format!(
        "extern \"C\" __global__ void __launch_bounds__({THREADS}) {entry}({}) {{",
        sig.join(", ")
    ));
    src.line(&format!("  __shared__ float ws[{BK}][{BM}];"));
    src.line(&format!("  __shared__ float xs[{BK}][{BN}];"));
    src.line("  const unsigned tid = threadIdx.x;");
    src.line("  const unsigned tx = tid % 16u, ty = tid / 16u;");
    src.line(&format!(
        "  const unsigned p0 = blockIdx.x * {BN}u, m0 = blockIdx.y * {BM}u;"
    ));
    src.line("  const unsigned g = blockIdx.z;");
    src.line(&format!("  const float* wg = w + g * {};", mg * k));
    src.line(&format!("  const float* xg = x + g * {};", cg * h * wd));
    src.line("  float acc[4][4];");
    src.line("#pragma unroll");
    src.line("  for (int i = 0; i < 4; ++i) {");
    src.line("#pragma unroll");
    src.line("    for (int j = 0; j < 4; ++j) { acc[i][j] = 0.0f; }");
    src.line("  }");
    src.line(&format!(
        "  for (unsigned k0 = 0; k0 < {k}u; k0 += {BK}u) {{"
    ));
    // W slice: BM x BK, read along k.
    src.line(&format!(
        "    for (unsigned e = tid; e < {}u; e += {THREADS}u) {{",
        BM * BK
    ));
    src.line(&format!(
        "      const unsigned mm = e / {BK}u, kk = e % {BK}u;"
    ));
    src.line("      const unsigned gm = m0 + mm, gk = k0 + kk;");
    src.line(&format!(
        "      ws[kk][mm] = (gm < {mg}u && gk < {k}u) ? wg[gm * {k}u + gk] : 0.0f;"
    ));
    src.line("    }");
    // X̂ slice: BK x BN, read along p.
    src.line(&format!(
        "    for (unsigned e = tid; e < {}u; e += {THREADS}u) {{",
        BK * BN
    ));
    src.line(&format!(
        "      const unsigned kk = e / {BN}u, pp = e % {BN}u;"
    ));
    src.line("      const unsigned gk = k0 + kk, gp = p0 + pp;");
    src.line("      float v = 0.0f;");
    src.line(&format!("      if (gk < {k}u && gp < {p}u) {{"));
    src.line(&format!(
        "        const unsigned ci = gk / {}u, r = gk % {}u;",
        kh * kw,
        kh * kw
    ));
    src.line(&format!(
        "        const unsigned ki = r / {kw}u, kj = r % {kw}u;"
    ));
    src.line(&format!(
        "        const unsigned bn = gp / {}u, q = gp % {}u;",
        oh * ow,
        oh * ow
    ));
    src.line(&format!(
        "        const unsigned oi = q / {ow}u, oj = q % {ow}u;"
    ));
    src.line(&format!(
        "        const int ih = (int)(oi * {sh}u + ki * {dh}u) - {ph};"
    ));
    src.line(&format!(
        "        const int iw = (int)(oj * {sw}u + kj * {dw}u) - {pw};"
    ));
    src.line(&format!(
        "        if (ih >= 0 && ih < {h} && iw >= 0 && iw < {wd}) {{ v = xg[(bn * {c}u + ci) * {}u + (unsigned)ih * {wd}u + (unsigned)iw]; }}",
        h * wd
    ));
    src.line("      }");
    src.line("      xs[kk][pp] = v;");
    src.line("    }");
    src.line("    __syncthreads();");
    src.line("#pragma unroll");
    src.line(&format!("    for (int kk = 0; kk < {BK}; ++kk) {{"));
    src.line("      float a[4], b[4];");
    src.line("#pragma unroll");
    src.line("      for (int i = 0; i < 4; ++i) { a[i] = ws[kk][ty + 16 * i]; b[i] = xs[kk][tx + 16 * i]; }");
    src.line("#pragma unroll");
    src.line("      for (int i = 0; i < 4; ++i) {");
    src.line("#pragma unroll");
    src.line("        for (int j = 0; j < 4; ++j) { acc[i][j] += a[i] * b[j]; }");
    src.line("      }");
    src.line("    }");
    src.line("    __syncthreads();");
    src.line("  }");
    src.line("#pragma unroll");
    src.line("  for (int i = 0; i < 4; ++i) {");
    src.line("    const unsigned gm = m0 + ty + 16u * i;");
    src.line(&format!("    if (gm >= {mg}u) {{ continue; }}"));
    src.line(&format!("    const unsigned mc = g * {mg}u + gm;"));
    src.line("#pragma unroll");
    src.line("    for (int j = 0; j < 4; ++j) {");
    src.line("      const unsigned gp = p0 + tx + 16u * j;");
    src.line(&format!("      if (gp >= {p}u) {{ continue; }}"));
    src.line(&format!(
        "      const unsigned yi = ((gp / {hw}u) * {m}u + mc) * {hw}u + gp % {hw}u;",
        hw = oh * ow
    ));
    src.line("      float v = acc[i][j];");
    for e in &epi {
        src.line(&format!("      {e}"));
    }
    src.line("      y[yi] = v;");
    src.line("    }");
    src.line("  }");
    src.line("}");
    let _ = (&z, &bias);
    Ok(Some(GeneratedKernel {
        entry: entry.into(),
        source: src.text,
        grid: [
            p.div_ceil(BN).max(1) as u32,
            mg.div_ceil(BM).max(1) as u32,
            group as u32,
        ],
        block: [THREADS, 1, 1],
        shared_bytes: 0,
        params,
    }))
}
