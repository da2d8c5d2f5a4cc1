//! MaxPool (with its Indices output) and AveragePool over 1-D and 2-D NCHW inputs: one
//! thread per output element in a grid-stride loop, walking its window; adjacent
//! threads own adjacent output columns, so their reads are close together.
use super::cexpr::{self, Ty};
use super::{fixed, ty_of, GeneratedKernel, KernelParam, Source};
use crate::ir::ops::conv::windows;
use crate::ir::{Graph, NodeId};

/// Threads per block and the most blocks of the one-thread-per-element kernels.
pub(super) const BLOCK: u32 = 256;
pub(super) const MAX_BLOCKS: u64 = 65535;

pub(crate) fn pool(
    graph: &Graph,
    id: NodeId,
    entry: &str,
) -> Result<Option<GeneratedKernel>, String> {
    let n = graph.node(id);
    let max = n.op == "MaxPool";
    if n.attrs.int_or("block", 0)? != 0 {
        return Err("a blocked (NCHWc) pool: run the pipeline without layout blocking".into());
    }
    let xv = n.inputs[0].ok_or("input 0 is missing")?;
    let xt = graph.value_type(xv).map_err(|e| e.to_string())?;
    if ty_of(xt.dtype, "input 0")? != Ty::F32 {
        return Err(format!("input 0 is {}; pools are f32 here", xt.dtype));
    }
    let x = fixed(xt)?;
    let y = fixed(&n.outputs[0])?;
    let kernel: Vec<usize> = n
        .attrs
        .ints("kernel_shape")?
        .ok_or("missing kernel_shape")?
        .iter()
        .map(|&k| k.max(1) as usize)
        .collect();
    if x.len() != kernel.len() + 2 || !(3..=4).contains(&x.len()) {
        return Ok(None);
    }
    let spatial: Vec<Option<usize>> = x[2..].iter().map(|&d| Some(d)).collect();
    let win = windows(&n.attrs, &kernel, &spatial)?;
    let two_d = x.len() == 4;
    let (h, w) = if two_d { (x[2], x[3]) } else { (1, x[2]) };
    let (oh, ow) = if two_d { (y[2], y[3]) } else { (1, y[2]) };
    let wy = if two_d { Some(win[0]) } else { None };
    let wx = win[win.len() - 1];
    let (kh, sh, dh, ph, peh) = wy.map_or((1, 1, 1, 0, 0), |v| {
        (v.kernel, v.stride, v.dilation, v.pad_begin, v.pad_end)
    });
    let (kw, sw, dw, pw, pew) = (wx.kernel, wx.stride, wx.dilation, wx.pad_begin, wx.pad_end);
    let total: usize = y.iter().product();
    if x.iter().product::<usize>() >= 1 << 31 {
        return Err("more elements than the generator indexes (2^31)".into());
    }
    let indices = max && n.outputs.len() > 1;
    if indices && n.attrs.int_or("storage_order", 0)? != 0 {
        return Err(
            "MaxPool with storage_order 1: the CUDA generator writes row-major Indices".into(),
        );
    }
    let include_pad = !max && n.attrs.int_or("count_include_pad", 0)? != 0;
    let mut params = vec![KernelParam::Input(0), KernelParam::Output(0)];
    let mut sig = "const float* __restrict__ x, float* __restrict__ y".to_string();
    if indices {
        if Ty::of(n.outputs[1].dtype) != Some(Ty::I64) {
            return Err(format!("Indices is {}, expected i64", n.outputs[1].dtype));
        }
        params.push(KernelParam::Output(1));
        sig.push_str(", long long* __restrict__ indices");
    }
    let mut src = Source::new(entry);
    src.line(cexpr::PRELUDE);
    src.line(&format!(
        "extern \"C\" __global__ void __launch_bounds__({BLOCK}) {entry}({sig}) {{"
    ));
    src.line(&format!(
        "  for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < {total}u; o += gridDim.x * blockDim.x) {{"
    ));
    src.line(&format!(
        "    const unsigned oj = o % {ow}u, oi = (o / {ow}u) % {oh}u, nc = o / {};",
        oh * ow
    ));
    src.line(&format!("    const float* xp = x + nc * {}u;", h * w));
    if max {
        src.line("    float best = -kiln_inf();");
        src.line("    int best_at = -1;");
    } else {
        src.line("    float sum = 0.0f;");
        src.line("    unsigned count = 0u;");
    }
    src.line(&format!("    for (unsigned ki = 0; ki < {kh}u; ++ki) {{"));
    src.line(&format!(
        "      const int ih = (int)(oi * {sh}u + ki * {dh}u) - {ph};"
    ));
    src.line(&format!("      for (unsigned kj = 0; kj < {kw}u; ++kj) {{"));
    src.line(&format!(
        "        const int iw = (int)(oj * {sw}u + kj * {dw}u) - {pw};"
    ));
    src.line(&format!(
        "        if (ih >= 0 && ih < {h} && iw >= 0 && iw < {w}) {{"
    ));
    src.line(&format!("          const int at = ih * {w} + iw;"));
    src.line("          const float v = xp[at];");
    if max {
        src.line("          if (v > best || best_at < 0) { best = v; best_at = at; }");
    } else {
        src.line("          sum += v;");
        src.line("          ++count;");
    }
    src.line("        }");
    if include_pad {
        // A tap on the explicit padding counts as a zero (not past it, where a
        // ceil-mode window may reach).
        src.line(&format!(
            "        else if (ih >= -{ph} && ih < {} && iw >= -{pw} && iw < {}) {{ ++count; }}",
            h + peh,
            w + pew
        ));
    }
    src.line("      }");
    src.line("    }");
    if max {
        src.line("    y[o] = best;");
        if indices {
            src.line(&format!(
                "    indices[o] = best_at < 0 ? 0ll : (long long)nc * {}ll + best_at;",
                h * w
            ));
        }
    } else {
        src.line("    y[o] = count == 0u ? kiln_nan() : sum / (float)count;");
    }
    src.line("  }");
    src.line("}");
    let blocks = (total as u64).div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS) as u32;
    Ok(Some(GeneratedKernel {
        entry: entry.into(),
        source: src.text,
        grid: [blocks, 1, 1],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
        params,
    }))
}
