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
        // SAFETY: `kind` is NULL or a NUL-terminated string, as the header requires.
        let kind = unsafe { arg_str(kind, "kind") }?;
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
        let opt = into_handle(kiln_optimizer {
            opt: Optimizer {
                rule,
                weight_decay: 0.0,
                clip_norm: None,
            },
        });
        // SAFETY: `out` is non-NULL (out_ptr) and writable (# Safety).
        unsafe { *out = opt };
        Ok(())
    })
}

/// Frees an optimizer. NULL is a no-op.
///
/// # Safety
/// `o` is NULL or a live optimizer, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn kiln_optimizer_free(o: *mut kiln_optimizer) {
    guard_or((), || {
        // SAFETY: `o` is NULL or an optimizer from kiln_optimizer_new, freed only here.
        unsafe { free_handle(o) }
    })
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
        // SAFETY: `o` is NULL or a live optimizer, not used elsewhere during the call.
        let o = unsafe { arg_mut(o, "o") }?;
        // SAFETY: the setting's `name` is NULL or a NUL-terminated string.
        let name = unsafe { arg_str(name, "name") }?;
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
        // SAFETY: `g` is NULL or a live graph with this call its only writer.
        let g = unsafe { arg_mut(g, "g") }?;
        // SAFETY: `o` is NULL or a live optimizer, only read.
        let o = unsafe { arg(o, "o") }?;
        let values = |p: *const kiln_value, name: &str| -> Result<Vec<Value>, Failure> {
            // SAFETY: `vars` and `grads` (the only `p`s) each point to `n` entries.
            Ok(unsafe { arg_slice(p, n, name) }?
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

fn to_value(v: kiln_value) -> Value {
    Value {
        node: NodeId(v.node),
        output: v.output,
    }
}

/// Appends training-mode dropout of `x` (a float value) to `g`: each run zeroes each
/// element with probability `ratio` (in [0, 1)) and scales the others by
/// 1 / (1 − ratio). The mask of run k is a pure function of (`seed`, k, element), so it
/// is reproducible on any backend and thread count; k is a new i64 variable that the
/// graph increments every run. `*y` receives the output; the mask (bool) is output 1
/// of the same node (`y->output = 1`). For inference, build without dropout (or use the
/// `Dropout` op with training_mode false).
///
/// # Safety
/// `g` is a live graph; `y` a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_add_dropout(
    g: *mut kiln_graph,
    x: kiln_value,
    ratio: f64,
    seed: i64,
    y: *mut kiln_value,
) -> kiln_status {
    guard(|| {
        // SAFETY: `g` is NULL or a live graph, written by this call alone.
        let g = unsafe { arg_mut(g, "g") }?;
        let y = out_ptr(y, "y")?;
        let d = crate::train::dropout_training(&mut g.graph, to_value(x), ratio, seed)?;
        // SAFETY: `y` is non-NULL and valid for a kiln_value, as documented.
        unsafe { *y = d.output.into() };
        Ok(())
    })
}

/// Appends training-mode batch normalization of `x` [N, C, d...] to `g`: normalized
/// with the batch's mean and (biased) variance over N and the spatial axes, then
/// `· scale + bias` ([C] each); `running_mean` and `running_var` (variables of type [C])
/// are updated every run to `momentum · running + (1 − momentum) · batch` (ONNX's
/// convention: 0.9 and epsilon 1e-5 are its defaults). `*y` receives the output.
///
/// # Safety
/// `g` is a live graph; `y` a valid pointer.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kiln_graph_add_batch_norm_training(
    g: *mut kiln_graph,
    x: kiln_value,
    scale: kiln_value,
    bias: kiln_value,
    running_mean: kiln_value,
    running_var: kiln_value,
    momentum: f64,
    epsilon: f64,
    y: *mut kiln_value,
) -> kiln_status {
    guard(|| {
        // SAFETY: the header makes `g` NULL or a live graph, not shared while we add to it.
        let g = unsafe { arg_mut(g, "g") }?;
        let y = out_ptr(y, "y")?;
        let out = crate::train::batch_norm_training(
            &mut g.graph,
            to_value(x),
            to_value(scale),
            to_value(bias),
            to_value(running_mean),
            to_value(running_var),
            momentum,
            epsilon,
        )?;
        // SAFETY: the normalized output goes to `y`, checked non-NULL, valid by contract.
        unsafe { *y = out.into() };
        Ok(())
    })
}
