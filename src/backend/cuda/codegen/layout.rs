//! Transpose (any permutation, any dtype the generator stores): one thread per output
//! element in a grid-stride loop, which decomposes its index over the output's dims and
//! reads the input at the permuted strides. Writes are coalesced; reads are strided
//! unless the last axis stays last.
use super::cexpr;
use super::pool::{BLOCK, MAX_BLOCKS};
use super::{fixed, ty_of, GeneratedKernel, KernelParam, Source};
use crate::ir::{Graph, NodeId};

pub(crate) fn transpose(graph: &Graph, id: NodeId, entry: &str) -> Result<GeneratedKernel, String> {
    let n = graph.node(id);
    let xv = n.inputs[0].ok_or("input 0 is missing")?;
    let xt = graph.value_type(xv).map_err(|e| e.to_string())?;
    let ty = ty_of(xt.dtype, "input 0")?;
    let x = fixed(xt)?;
    let y = fixed(&n.outputs[0])?;
    let perm: Vec<usize> = match n.attrs.ints("perm")? {
        Some(p) => p.iter().map(|&a| a as usize).collect(),
        None => (0..x.len()).rev().collect(),
    };
    let total: usize = y.iter().product();
    if total >= 1 << 31 {
        return Err("more elements than the generator indexes (2^31)".into());
    }
    // Input strides (row-major), then the stride of each output axis: its input axis's.
    let mut in_strides = vec![1usize; x.len()];
    for a in (0..x.len().saturating_sub(1)).rev() {
        in_strides[a] = in_strides[a + 1] * x[a + 1];
    }
    let c = ty.mem_c();
    let mut src = Source::new(entry);
    src.line(cexpr::PRELUDE);
    src.line(&format!(
        "extern \"C\" __global__ void __launch_bounds__({BLOCK}) {entry}(const {c}* __restrict__ x, {c}* __restrict__ y) {{"
    ));
    src.line(&format!(
        "  for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < {total}u; o += gridDim.x * blockDim.x) {{"
    ));
    src.line("    unsigned rest = o, at = 0u;");
    for (a, &d) in y.iter().enumerate().rev() {
        let stride = in_strides[perm[a]];
        if d > 1 {
            src.line(&format!(
                "    at += (rest % {d}u) * {stride}u; rest /= {d}u;"
            ));
        }
    }
    src.line("    y[o] = x[at];");
    src.line("  }");
    src.line("}");
    let blocks = (total as u64).div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS) as u32;
    Ok(GeneratedKernel {
        entry: entry.into(),
        source: src.text,
        grid: [blocks, 1, 1],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
        params: vec![KernelParam::Input(0), KernelParam::Output(0)],
    })
}
