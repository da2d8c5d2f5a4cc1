//! What rewrite passes share: [`sweep`] visits the live nodes and lets a rewrite change
//! the graph at each, and the helpers that add a node in place of another, replace a
//! node's output, and add a constant.
use super::{pattern, Changed, PassContext};
use crate::error::Result;
use crate::ir::Graph;

/// Visits the live nodes in schedule order (or reversed), letting `rewrite` change the
/// graph at each; after a change the uses are recomputed. Nodes a rewrite appends are
/// visited by the next round.
pub(super) fn sweep(
    g: &mut Graph,
    cx: &mut PassContext,
    reverse: bool,
    mut rewrite: impl FnMut(
        &mut Graph,
        &pattern::Uses,
        crate::ir::NodeId,
        &mut PassContext,
    ) -> Result<Changed>,
) -> Result<Changed> {
    let mut order = g.schedule()?;
    if reverse {
        order.reverse();
    }
    let mut uses = pattern::Uses::new(g);
    let mut changed = false;
    for id in order {
        if !uses.is_live(id) {
            continue;
        }
        if rewrite(g, &uses, id, cx)? {
            changed = true;
            uses = pattern::Uses::new(g);
        }
    }
    Ok(changed)
}

/// Adds `op` named after `base`; `None` when the catalogue rejects the operands (the
/// rewrite then does not apply).
pub(super) fn try_add(
    g: &mut Graph,
    op: &str,
    inputs: &[Option<crate::ir::Value>],
    attrs: crate::ir::Attrs,
    base: &str,
) -> Option<crate::ir::NodeId> {
    let name = g.fresh_name(base);
    g.add_op(op, inputs, attrs, &name).ok()
}

/// Adds `op` to stand in for `like`: it takes `like`'s name (`like`, about to be
/// replaced, becomes `<name>.old` until the manager drops it), so dumps keep the
/// model's names and the symbols inference invents for unknown dims, which are named
/// after the node, come out the same as `like`'s. `None`, with `like`'s name back,
/// when the catalogue rejects the operands. The new node's provenance is `like` and what
/// `like` computes from values other than its operands (`Graph::record_replaced`).
pub(super) fn add_in_place_of(
    g: &mut Graph,
    like: crate::ir::NodeId,
    op: &str,
    inputs: &[Option<crate::ir::Value>],
    attrs: crate::ir::Attrs,
) -> Option<crate::ir::NodeId> {
    let name = g.node(like).name.clone();
    let old = g.fresh_name(&format!("{name}.old"));
    g.node_mut(like).name = old.clone();
    match g.add_op(op, inputs, attrs, &name) {
        Ok(id) => {
            // Provenance keeps the model's name, not the `.old` one.
            g.node_mut(like).name = name;
            g.record_replaced(id, like);
            g.node_mut(like).name = old;
            Some(id)
        }
        Err(_) => {
            g.node_mut(like).name = name;
            None
        }
    }
}

/// Replaces `root`'s output by a new `op(inputs) {attrs}` of the same type standing in
/// for `like` (`add_in_place_of`): the last step of most rewrites. False, and nothing
/// replaced, when the catalogue rejects the new node, its type differs, or the rewrite
/// budget is spent.
pub(super) fn replace_node(
    g: &mut Graph,
    root: crate::ir::NodeId,
    like: crate::ir::NodeId,
    op: &str,
    inputs: &[Option<crate::ir::Value>],
    attrs: crate::ir::Attrs,
    cx: &mut PassContext,
) -> Result<Changed> {
    Ok(replacement(g, root, like, op, inputs, attrs, cx)?.is_some())
}

/// [`replace_node`], giving the new node (whose other outputs the caller may wire up).
pub(super) fn replacement(
    g: &mut Graph,
    root: crate::ir::NodeId,
    like: crate::ir::NodeId,
    op: &str,
    inputs: &[Option<crate::ir::Value>],
    attrs: crate::ir::Attrs,
    cx: &mut PassContext,
) -> Result<Option<crate::ir::NodeId>> {
    let out_ty = g.node(root).outputs[0].clone();
    let Some(new) = add_in_place_of(g, like, op, inputs, attrs) else {
        return Ok(None);
    };
    if g.node(new).outputs[0] != out_ty || !cx.allow_rewrite() {
        give_back_name(g, new, like);
        return Ok(None);
    }
    g.replace_uses(root.into(), new.into())?;
    if root != like {
        g.record_replaced(new, root);
    }
    Ok(Some(new))
}

/// Undoes `add_in_place_of` for a rewrite that does not apply: `like` gets its name
/// back and `new` stays dead until the manager drops it.
pub(super) fn give_back_name(g: &mut Graph, new: crate::ir::NodeId, like: crate::ir::NodeId) {
    let name = g.node(new).name.clone();
    let dead = g.fresh_name(&format!("{name}.rejected"));
    g.node_mut(new).name = dead;
    g.node_mut(like).name = name;
}

/// A new constant named after `base`.
pub(super) fn add_const(
    g: &mut Graph,
    base: &str,
    t: crate::tensor::Tensor,
) -> Result<crate::ir::NodeId> {
    let name = g.fresh_name(base);
    g.add_constant_value(&name, t)
}
