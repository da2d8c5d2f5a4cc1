//! Training: optimizers as graph nodes. A `kiln_optimizer` is a builder (the rule and
//! its hyper-parameters, set by name so that new ones do not change the ABI); adding it
//! to a graph appends the update of each variable and the `Assign`s that store it.
use std::ffi::c_char;

use super::graph::{kiln_graph, kiln_value};
use super::{arg, arg_mut, arg_slice, arg_str, free_handle, guard, guard_or, into_handle};
use super::{kiln_status, out_ptr, Failure};
use crate::ir::{NodeId, Value};
use crate::optim::{add_optimizer, Optimizer, Rule};

/// An optimizer's settings.
pub struct kiln_optimizer {
    opt: Optimizer,
}

/// Creates an optimizer: `"sgd"` (learning rate only until `momentum` is set), `"adam"`
/// or `"adamw"` (beta1 0.9, beta2 0.999, epsilon 1e-8), no weight decay, no clipping.
/// The caller frees it with `kiln_optimizer_free`.
///
/// # Safety
/// `kind` is a string; `out` a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_optimizer_new(
    kind: *const c_char,
    out: *mut *mut kiln_optimizer,
) -> kiln_status {
    guard(|| {
        let kind = arg_str(kind, "kind")?;
        let out = out_ptr(out, "out")?;
        let adam = |decoupled| Rule::Adam {
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            decoupled,
        };
        let rule = match kind {
            "sgd" => Rule::Sgd {
                momentum: 0.0,
                nesterov: false,
            },
            "adam" => adam(false),
            "adamw" => adam(true),
            other => {
                return Err(Failure::invalid(format!(
                    "unknown optimizer '{other}' (sgd, adam, adamw)"
                )))
            }
        };
        *out = into_handle(kiln_optimizer {
            opt: Optimizer {
                rule,
                weight_decay: 0.0,
                clip_norm: None,
            },
        });
        Ok(())
    })
}

/// Frees an optimizer. NULL is a no-op.
///
/// # Safety
/// `o` is NULL or a live optimizer, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn kiln_optimizer_free(o: *mut kiln_optimizer) {
    guard_or((), || free_handle(o))
}

/// Sets a hyper-parameter by name: `"momentum"` and `"nesterov"` (0 or 1) for SGD;
/// `"beta1"`, `"beta2"`, `"epsilon"` for Adam and AdamW; `"weight_decay"` and
/// `"clip_norm"` (scale all gradients together down to this global L2 norm; 0 turns it
/// off) for all. A name the optimizer does not take, or a value out of range, fails.
///
/// # Safety
/// `o` is a live optimizer; `name` a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_optimizer_set(
    o: *mut kiln_optimizer,
    name: *const c_char,
    value: f64,
) -> kiln_status {
    guard(|| {
        let o = arg_mut(o, "o")?;
        let name = arg_str(name, "name")?;
        if !value.is_finite() || value < 0.0 {
            return Err(Failure::invalid(format!(
                "{name} must be finite and ≥ 0, got {value}"
            )));
        }
        let unit = || {
            if value < 1.0 {
                Ok(value)
            } else {
                Err(Failure::invalid(format!(
                    "{name} must be below 1, got {value}"
                )))
            }
        };
        match (&mut o.opt.rule, name) {
            (_, "weight_decay") => o.opt.weight_decay = value,
            (_, "clip_norm") => o.opt.clip_norm = (value > 0.0).then_some(value),
            (Rule::Sgd { momentum, .. }, "momentum") => *momentum = unit()?,
            (Rule::Sgd { nesterov, .. }, "nesterov") => *nesterov = value != 0.0,
            (Rule::Adam { beta1, .. }, "beta1") => *beta1 = unit()?,
            (Rule::Adam { beta2, .. }, "beta2") => *beta2 = unit()?,
            (Rule::Adam { epsilon, .. }, "epsilon") => *epsilon = value,
            (rule, _) => {
                return Err(Failure::invalid(format!(
                    "{rule:?} takes no setting '{name}'"
                )))
            }
        }
        Ok(())
    })
}

/// Appends one optimizer step to `g`: each of `vars[0..n]` (variables) is updated from
/// `grads[0..n]` (its gradient, e.g. from `kiln_graph_add_gradients`) with learning rate
/// `lr` (a float scalar value, usually a parameter, so a schedule needs no recompile),
/// and stored by an `Assign`; the optimizer's state (momenta, moments, the step count)
/// lives in new variables. Every read in a run sees the values it started with.
///
/// # Safety
/// `g` is a live graph, `o` a live optimizer; `vars` and `grads` point to `n` entries.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_add_optimizer(
    g: *mut kiln_graph,
    o: *const kiln_optimizer,
    vars: *const kiln_value,
    grads: *const kiln_value,
    n: usize,
    lr: kiln_value,
) -> kiln_status {
    guard(|| {
        let g = arg_mut(g, "g")?;
        let o = arg(o, "o")?;
        let values = |p: *const kiln_value, name: &str| -> Result<Vec<Value>, Failure> {
            Ok(arg_slice(p, n, name)?
                .iter()
                .map(|v| Value {
                    node: NodeId(v.node),
                    output: v.output,
                })
                .collect())
        };
        let (vars, grads) = (values(vars, "vars")?, values(grads, "grads")?);
        let lr = Value {
            node: NodeId(lr.node),
            output: lr.output,
        };
        add_optimizer(&mut g.graph, &o.opt, &vars, &grads, lr)?;
        Ok(())
    })
}
