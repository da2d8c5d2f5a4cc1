//! Optimizers as graph nodes: [`add_optimizer`] appends to a graph the update of each
//! variable from its gradient and the `Assign`s that store the results (and the
//! optimizer's own state: momenta, moments, the step count, kept in new variables). The
//! learning rate is a graph input, so a schedule needs no recompile. Every read in a run
//! sees the values the run started with (the interpreter's rule for variables), so all
//! updates use the pre-step state.
use crate::error::{Error, Result};
use crate::ir::{Attr, Attrs, DType, Graph, NodeId, Shape, TensorType, Value};
use crate::tensor::Tensor;

/// The update rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// `v ← μ·v + g; w ← w − lr·(nesterov ? g + μ·v : v)` (plain SGD when μ = 0).
    Sgd { momentum: f64, nesterov: bool },
    /// Adam with bias correction; `decoupled` (AdamW) applies the weight decay to the
    /// weights directly instead of adding it to the gradient.
    Adam {
        beta1: f64,
        beta2: f64,
        epsilon: f64,
        decoupled: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Optimizer {
    pub rule: Rule,
    /// L2 weight decay (added to the gradient, or decoupled for AdamW).
    pub weight_decay: f64,
    /// Scale all gradients down together when their global L2 norm exceeds this.
    pub clip_norm: Option<f64>,
}

/// The `Assign` nodes that apply one optimizer step to `vars` (variables) from `grads`
/// (their gradients, in order), with learning rate `lr` (a float scalar value, usually
/// a parameter). New state variables are named after the variables they serve.
pub fn add_optimizer(
    g: &mut Graph,
    opt: &Optimizer,
    vars: &[Value],
    grads: &[Value],
    lr: Value,
) -> Result<Vec<NodeId>> {
    if vars.len() != grads.len() {
        return Err(Error::InvalidArgument(format!(
            "{} variables but {} gradients",
            vars.len(),
            grads.len()
        )));
    }
    let lr_ty = g.value_type(lr)?.clone();
    if !lr_ty.dtype.is_float() || lr_ty.num_elements() != Some(1) {
        return Err(Error::InvalidArgument(format!(
            "the learning rate must be a float scalar, has type {lr_ty}"
        )));
    }
    let mut b = Builder { g, assigns: vec![] };
    let mut specs = vec![];
    for (&v, &gr) in vars.iter().zip(grads) {
        let node = b.g.node(v.node);
        if node.op != "Variable" {
            return Err(Error::InvalidArgument(format!(
                "an optimizer updates variables; '{}' is a {}",
                node.name, node.op
            )));
        }
        let (ty, name) = (node.outputs[0].clone(), node.name.clone());
        let gt = b.g.value_type(gr)?.clone();
        if gt.dtype != ty.dtype || gt.shape.dims() != ty.shape.dims() {
            return Err(Error::InvalidArgument(format!(
                "the gradient for '{name}' has type {gt}, the variable {ty}"
            )));
        }
        specs.push((v, gr, ty, name));
    }
    let Some(dtype) = specs.first().map(|s| s.2.dtype) else {
        return Ok(vec![]);
    };
    let lr = if lr_ty.dtype == dtype {
        lr
    } else {
        b.g.apply(
            "Cast",
            &[lr],
            Attrs::new().with("to", Attr::String(dtype.to_string())),
        )?
    };
    let scale = match opt.clip_norm {
        Some(c) => Some(b.clip_scale(&specs.iter().map(|s| s.1).collect::<Vec<_>>(), c, dtype)?),
        None => None,
    };
    // Adam's step count, shared by every variable.
    let step = match opt.rule {
        Rule::Adam { .. } => {
            let t = b.state("adam_step", &TensorType::new(dtype, Shape::scalar()))?;
            let one = b.g.scalar("optim_const", dtype, 1.0)?;
            let t1 = b.g.apply("Add", &[t, one], Attrs::new())?;
            b.assign(t, t1)?;
            Some(t1)
        }
        Rule::Sgd { .. } => None,
    };
    for (w, gr, ty, name) in specs {
        let mut d = match scale {
            Some(s) => b.g.apply("Mul", &[gr, s], Attrs::new())?,
            None => gr,
        };
        let decay_into_grad = !matches!(
            opt.rule,
            Rule::Adam {
                decoupled: true,
                ..
            }
        );
        if opt.weight_decay != 0.0 && decay_into_grad {
            let wd = b.g.scalar("optim_const", dtype, opt.weight_decay)?;
            let dw = b.g.apply("Mul", &[w, wd], Attrs::new())?;
            d = b.g.apply("Add", &[d, dw], Attrs::new())?;
        }
        let update = match opt.rule {
            Rule::Sgd { momentum: 0.0, .. } => d,
            Rule::Sgd { momentum, nesterov } => {
                let v = b.state(&format!("{name}_momentum"), &ty)?;
                let mu = b.g.scalar("optim_const", dtype, momentum)?;
                let mv = b.g.apply("Mul", &[v, mu], Attrs::new())?;
                let v1 = b.g.apply("Add", &[mv, d], Attrs::new())?;
                b.assign(v, v1)?;
                if nesterov {
                    let mv1 = b.g.apply("Mul", &[v1, mu], Attrs::new())?;
                    b.g.apply("Add", &[d, mv1], Attrs::new())?
                } else {
                    v1
                }
            }
            Rule::Adam {
                beta1,
                beta2,
                epsilon,
                decoupled,
            } => {
                let t = step.expect("Adam has a step count");
                let m = b.state(&format!("{name}_m"), &ty)?;
                let v = b.state(&format!("{name}_v"), &ty)?;
                let m1 = b.ema(m, d, beta1, dtype)?;
                let dd = b.g.apply("Mul", &[d, d], Attrs::new())?;
                let v1 = b.ema(v, dd, beta2, dtype)?;
                b.assign(m, m1)?;
                b.assign(v, v1)?;
                // lr joins the numerator's per-step scalar (lr / (1 − β₁ᵗ)), so each
                // element pays one multiplication for both.
                let mh = b.debias(m1, beta1, t, Some(lr), dtype)?;
                let vh = b.debias(v1, beta2, t, None, dtype)?;
                let root = b.g.apply("Sqrt", &[vh], Attrs::new())?;
                let eps = b.g.scalar("optim_const", dtype, epsilon)?;
                let den = b.g.apply("Add", &[root, eps], Attrs::new())?;
                let u = b.g.apply("Div", &[mh, den], Attrs::new())?;
                if decoupled && opt.weight_decay != 0.0 {
                    let wd = b.g.scalar("optim_const", dtype, opt.weight_decay)?;
                    let wd_lr = b.g.apply("Mul", &[wd, lr], Attrs::new())?;
                    let dw = b.g.apply("Mul", &[w, wd_lr], Attrs::new())?;
                    b.g.apply("Add", &[u, dw], Attrs::new())?
                } else {
                    u
                }
            }
        };
        let step = match opt.rule {
            Rule::Adam { .. } => update,
            Rule::Sgd { .. } => b.g.apply("Mul", &[update, lr], Attrs::new())?,
        };
        let w1 = b.g.apply("Sub", &[w, step], Attrs::new())?;
        b.assign(w, w1)?;
    }
    Ok(b.assigns)
}

struct Builder<'g> {
    g: &'g mut Graph,
    assigns: Vec<NodeId>,
}

impl Builder<'_> {
    /// A new zero-initialized state variable.
    fn state(&mut self, base: &str, ty: &TensorType) -> Result<Value> {
        let dims = ty.static_dims().ok_or_else(|| {
            Error::InvalidArgument(format!("optimizer state of type {ty} needs static dims"))
        })?;
        let zeros = Tensor::zeros(ty.dtype, &dims);
        let name = self.g.fresh_name(base);
        Ok(self.g.add_variable(&name, ty.clone(), zeros)?.into())
    }

    fn assign(&mut self, var: Value, value: Value) -> Result<()> {
        let id = self.g.op("Assign", &[var, value], Attrs::new(), "")?;
        self.assigns.push(id);
        Ok(())
    }

    /// β·s + (1 − β)·x
    fn ema(&mut self, s: Value, x: Value, beta: f64, dtype: DType) -> Result<Value> {
        let (b, c) = (
            self.g.scalar("optim_const", dtype, beta)?,
            self.g.scalar("optim_const", dtype, 1.0 - beta)?,
        );
        let bs = self.g.apply("Mul", &[s, b], Attrs::new())?;
        let cx = self.g.apply("Mul", &[x, c], Attrs::new())?;
        self.g.apply("Add", &[bs, cx], Attrs::new())
    }

    /// `s / (1 − βᵗ)` (times `by`, a scalar, if given), as `s · (1 / (1 − βᵗ))`: the
    /// reciprocal is one scalar per step, so each element pays a multiplication
    /// instead of a division.
    fn debias(
        &mut self,
        s: Value,
        beta: f64,
        t: Value,
        by: Option<Value>,
        dtype: DType,
    ) -> Result<Value> {
        let (b, one) = (
            self.g.scalar("optim_const", dtype, beta)?,
            self.g.scalar("optim_const", dtype, 1.0)?,
        );
        let bt = self.g.apply("Pow", &[b, t], Attrs::new())?;
        let den = self.g.apply("Sub", &[one, bt], Attrs::new())?;
        let mut scale = self.g.apply("Reciprocal", &[den], Attrs::new())?;
        if let Some(by) = by {
            scale = self.g.apply("Mul", &[scale, by], Attrs::new())?;
        }
        self.g.apply("Mul", &[s, scale], Attrs::new())
    }

    /// min(1, c / ‖grads‖₂) over all the gradients together.
    fn clip_scale(&mut self, grads: &[Value], c: f64, dtype: DType) -> Result<Value> {
        let keep0 = Attrs::new().with("keepdims", Attr::Int(0));
        let mut total: Option<Value> = None;
        for &gr in grads {
            let s = self.g.apply("ReduceSumSquare", &[gr], keep0.clone())?;
            total = Some(match total {
                Some(t) => self.g.apply("Add", &[t, s], Attrs::new())?,
                None => s,
            });
        }
        let norm = self.g.apply(
            "Sqrt",
            &[total.expect("at least one gradient")],
            Attrs::new(),
        )?;
        let cv = self.g.scalar("optim_const", dtype, c)?;
        let big = self.g.apply("Max", &[norm, cv], Attrs::new())?;
        self.g.apply("Div", &[cv, big], Attrs::new())
    }
}
