//! Counting the floating-point work of a graph: what a benchmark divides by its time.
//! It reads only the IR (static types), so every backend's run of a graph is measured
//! against the same count.
use crate::ir::{Graph, NodeId};

/// Floating-point operations of one run of `g` (static types): its matrix products and
/// convolutions, two per multiply-add; the rest is memory-bound and not counted.
pub fn graph_flops(g: &Graph) -> f64 {
    g.node_ids().map(|id| node_flops(g, id)).sum()
}

/// Floating-point operations of node `id` (see [`graph_flops`]).
pub(crate) fn node_flops(g: &Graph, id: NodeId) -> f64 {
    let node = g.node(id);
    let shape = |k: usize| -> Option<Vec<usize>> {
        let v = node.inputs.get(k).copied().flatten()?;
        g.node(v.node).outputs[v.output as usize].static_dims()
    };
    let outputs = node
        .outputs
        .first()
        .and_then(|t| t.num_elements())
        .unwrap_or(0) as f64;
    match node.op.as_str() {
        // Each output: a dot product over (input channels per group × kernel size).
        "Conv" | "FusedConv" => shape(1).map_or(0.0, |w| {
            2.0 * outputs * w[1..].iter().product::<usize>() as f64
        }),
        "MatMul" | "FusedMatMul" | "Gemm" => shape(0).map_or(0.0, |a| {
            let trans_a = node.attrs.int_or("transA", 0).unwrap_or(0) != 0;
            let k = match a.len() {
                0 => 1,
                1 => a[0],
                r if trans_a => a[r - 2],
                r => a[r - 1],
            };
            2.0 * outputs * k as f64
        }),
        // The input projection of every step and the recurrent product: X's seq·batch
        // rows against W's (and R's) dirs·gates·hidden rows of input (hidden) terms.
        "RNN" | "GRU" | "LSTM" => match (shape(0), shape(1), shape(2)) {
            (Some(x), Some(w), Some(r)) if x.len() == 3 && w.len() == 3 && r.len() == 3 => {
                2.0 * (x[0] * x[1] * w[0] * w[1] * (w[2] + r[2])) as f64
            }
            _ => 0.0,
        },
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::text::parse;

    #[test]
    fn products_count_two_flops_per_multiply_add_and_the_rest_nothing() {
        let g = parse(
            "graph \"g\" {\n  \
             %0 \"a\" = Parameter : f32[2, 3]\n  \
             %1 \"b\" = Parameter : f32[3, 4]\n  \
             %2 \"c\" = Parameter : f32[3, 2]\n  \
             %3 \"ab\" = MatMul(%0, %1) : f32[2, 4]\n  \
             %4 \"r\" = Relu(%3) : f32[2, 4]\n  \
             %5 \"ct\" = Gemm(%2, %1) {transA = 1} : f32[2, 4]\n  \
             return \"r\" = %4, \"ct\" = %5\n}\n",
            "t.kir",
            None,
        )
        .unwrap();
        // Each product: 2·4 outputs, each a 3-term dot product.
        assert_eq!(graph_flops(&g), 2.0 * (2.0 * 8.0 * 3.0));
    }

    #[test]
    fn a_recurrent_layer_counts_both_products_of_every_step() {
        let g = parse(
            "graph \"g\" {\n  \
             %0 \"x\" = Parameter : f32[5, 2, 3]\n  \
             %1 \"w\" = Parameter : f32[1, 16, 3]\n  \
             %2 \"r\" = Parameter : f32[1, 16, 4]\n  \
             %3 \"y\" = LSTM(%0, %1, %2) {hidden_size = 4} : \
             (f32[5, 1, 2, 4], f32[1, 2, 4], f32[1, 2, 4])\n  \
             return \"y\" = %3\n}\n",
            "t.kir",
            None,
        )
        .unwrap();
        // 5 steps × 2 rows, each 16 gate units over 3 inputs and 4 hidden terms.
        assert_eq!(graph_flops(&g), 2.0 * (10.0 * 16.0 * 7.0));
    }
}
