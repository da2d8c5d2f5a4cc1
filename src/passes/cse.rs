//! Common-subexpression elimination: of nodes with the same op, operands, attributes
//! and control dependencies, the first in the schedule serves every reader; small
//! constants with equal values merge too.
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::{Changed, Pass, PassContext};
use crate::error::Result;
use crate::ir::Graph;

/// Constants up to this many elements are compared by value.
const MAX_CONST_ELEMENTS: usize = 4096;

pub struct Cse;

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }
    fn summary(&self) -> &'static str {
        "merge nodes that compute the same thing (and equal small constants)"
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed> {
        let uses = super::pattern::Uses::new(g);
        let mut seen: HashMap<String, crate::ir::NodeId> = HashMap::new();
        let mut changed = false;
        for id in g.schedule()? {
            if !uses.is_live(id) {
                continue;
            }
            let n = g.node(id);
            let key = match n.op.as_str() {
                "Parameter" | "Variable" | "Assign" => continue,
                // Keyed by a hash of the bytes; equal keys are compared in full below.
                "Constant" => match &n.data {
                    Some(t) if t.len() <= MAX_CONST_ELEMENTS => {
                        let mut h = std::collections::hash_map::DefaultHasher::new();
                        t.to_le_bytes().hash(&mut h);
                        format!("Constant|{}|{:x}", n.outputs[0], h.finish())
                    }
                    _ => continue,
                },
                _ => format!("{}|{:?}|{:?}|{:?}", n.op, n.inputs, n.attrs, n.control_deps),
            };
            match seen.get(&key) {
                None => {
                    seen.insert(key, id);
                }
                Some(&first) => {
                    if n.op == "Constant" && g.node(first).data != n.data {
                        continue; // a hash collision
                    }
                    let outputs = n.outputs.len() as u32;
                    if !cx.allow_rewrite() {
                        continue;
                    }
                    for i in 0..outputs {
                        g.replace_uses(id.out(i), first.out(i))?;
                    }
                    changed = true;
                }
            }
        }
        Ok(changed)
    }
}
