//! In-place reuse: an output may take over the buffer of an input that dies at its node,
//! so a chain of values shares one buffer. The arena planner then places buffers, not
//! values.
use super::liveness::Liveness;
use crate::ir::{Graph, NodeId};

pub use crate::ir::ops::InPlace;

/// The in-place rule of the op called `op`.
pub(crate) fn rule(op: &str) -> InPlace {
    crate::ir::ops::lookup(op).map_or(InPlace::No, |o| o.schema().in_place)
}

/// The in-place rule of op `op` in graph `g`: [`rule`], and for a registered op the
/// rule it declared (its kernel reads each element before writing that element; the
/// CPU backend hands it the planned buffers as they are). Asked of the op the graph
/// holds, not of the registry, which may have another op under that name by now.
pub(crate) fn rule_in(g: &Graph, op: &str) -> InPlace {
    match rule(op) {
        InPlace::No if op.contains("::") && g.op_impl(op).is_some_and(|o| o.may_run_in_place()) => {
            InPlace::AnySameShape
        }
        r => r,
    }
}

/// A chain of values that share one buffer, live from the first one's def to the last
/// one's last use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// Indices into [`Liveness::values`], in schedule order.
    pub values: Vec<usize>,
    /// The tensor bytes (equal for every value of the chain).
    pub bytes: usize,
    /// `bytes` aligned.
    pub size: usize,
    pub first: usize,
    pub last: usize,
}

/// The values grouped into buffers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Buffers {
    pub chains: Vec<Chain>,
    /// Per value (index into [`Liveness::values`]): its chain.
    pub chain_of: Vec<usize>,
    /// Per value: the input value whose buffer it took over, if any.
    pub took: Vec<Option<usize>>,
}

impl Buffers {
    /// How many outputs took over an input's buffer.
    pub(crate) fn reuses(&self) -> usize {
        self.took.iter().flatten().count()
    }

    /// Drops the chains holding a value `keep` says no to (whole chains: a chain's
    /// values share one buffer). Values keep their indices; a dropped one's chain is
    /// `usize::MAX` and it took nothing.
    pub(crate) fn retain(&mut self, keep: &[bool]) {
        let mut new_index = vec![usize::MAX; self.chains.len()];
        let mut chains = Vec::with_capacity(self.chains.len());
        for (c, chain) in std::mem::take(&mut self.chains).into_iter().enumerate() {
            if chain.values.iter().all(|&v| keep[v]) {
                new_index[c] = chains.len();
                chains.push(chain);
            }
        }
        self.chains = chains;
        for (v, c) in self.chain_of.iter_mut().enumerate() {
            *c = new_index[*c];
            if *c == usize::MAX {
                self.took[v] = None;
            }
        }
    }
}

/// Groups the values into buffers. With `inplace` false every value is its own buffer.
pub(crate) fn group(g: &Graph, schedule: &[NodeId], lv: &Liveness, inplace: bool) -> Buffers {
    let n = lv.values.len();
    let mut b = Buffers {
        chains: Vec::with_capacity(n),
        chain_of: vec![usize::MAX; n],
        took: vec![None; n],
    };
    let mut taken: Vec<usize> = vec![];
    for (s, &id) in schedule.iter().enumerate() {
        let node = g.node(id);
        let rule = if inplace {
            rule_in(g, &node.op)
        } else {
            InPlace::No
        };
        taken.clear();
        for k in 0..node.outputs.len() {
            let Some(vo) = lv.index_of(id.out(k as u32)) else {
                continue;
            };
            let out = &lv.values[vo];
            let positions = match rule {
                InPlace::No => 0..0,
                InPlace::AnySameShape => 0..node.inputs.len(),
                InPlace::InputSameShape(i) => i..i + 1,
                InPlace::View => 0..1,
            };
            let same_shape = rule != InPlace::View;
            let donor = positions
                .filter_map(|p| node.inputs.get(p).copied().flatten().map(|v| (p, v)))
                // A residual that is also the convolution's input is read all along.
                .filter(|&(p, v)| {
                    !matches!(rule, InPlace::InputSameShape(_))
                        || !node
                            .inputs
                            .iter()
                            .enumerate()
                            .any(|(q, &u)| q != p && u == Some(v))
                })
                .filter_map(|(_, v)| lv.index_of(v))
                .find(|&vi| {
                    let inp = &lv.values[vi];
                    inp.last == s
                        && !inp.graph_output
                        && inp.bytes == out.bytes
                        && (!same_shape || inp.dims == out.dims)
                        && !taken.contains(&vi)
                });
            match donor {
                Some(vi) => {
                    taken.push(vi);
                    let c = b.chain_of[vi];
                    b.chain_of[vo] = c;
                    b.took[vo] = Some(vi);
                    let chain = &mut b.chains[c];
                    chain.values.push(vo);
                    chain.last = chain.last.max(out.last);
                }
                None => {
                    b.chain_of[vo] = b.chains.len();
                    b.chains.push(Chain {
                        values: vec![vo],
                        bytes: out.bytes,
                        size: out.size,
                        first: out.def,
                        last: out.last,
                    });
                }
            }
        }
    }
    debug_assert!(b.chain_of.iter().all(|&c| c != usize::MAX));
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert_eq!(rule("Relu"), InPlace::AnySameShape);
        assert_eq!(rule("Add"), InPlace::AnySameShape);
        assert_eq!(rule("Fused"), InPlace::AnySameShape);
        assert_eq!(rule("FusedConv"), InPlace::InputSameShape(3));
        assert_eq!(rule("Reshape"), InPlace::View);
        assert_eq!(rule("Identity"), InPlace::View);
        assert_eq!(rule("Conv"), InPlace::No);
        assert_eq!(rule("MatMul"), InPlace::No);
        assert_eq!(rule("NoSuchOp"), InPlace::No);
    }

    /// Every elementwise op may overwrite a same-shape input; of the rest only `Fused`,
    /// `FusedConv` and the views reuse a buffer.
    #[test]
    fn schema_rules() {
        let views = ["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"];
        for (&name, op) in crate::ir::ops::catalogue() {
            let expected = match name {
                "Fused" => InPlace::AnySameShape,
                "FusedConv" => InPlace::InputSameShape(3),
                _ if views.contains(&name) => InPlace::View,
                _ if op.schema().family == "elementwise" => InPlace::AnySameShape,
                _ => InPlace::No,
            };
            assert_eq!(rule(name), expected, "{name}");
        }
    }
}
