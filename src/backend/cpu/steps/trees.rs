//! Tree ensembles (`TreeEnsemble`, `TreeEnsembleRegressor`, `TreeEnsembleClassifier`
//! with integer labels) on f32, f64, i32 or i64 rows (f32 scores): the trees read from the attributes once, here, and
//! each run walks the rows in parallel (see [`kernels::trees`]).
use crate::backend::cpu::kernels::trees::{ensemble_rows, TreeOutputs};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::ops::tree::Ensemble;
use crate::ir::DType;

use super::Build;

pub struct TreeEnsembleStep {
    x: Slot,
    /// The f32 scores and, for a classifier, its i64 labels.
    scores: Slot,
    labels: Option<Slot>,
    ensemble: Ensemble,
    rows: usize,
    features: usize,
    scratch: Loc,
    /// Byte offset in the scratch of the per-row `seen` flags.
    seen_at: usize,
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let op = b.node.op.as_str();
    if !matches!(
        op,
        "TreeEnsemble" | "TreeEnsembleRegressor" | "TreeEnsembleClassifier"
    ) {
        return Ok(None);
    }
    let Some(x) = b.input(0) else { return Ok(None) };
    if !matches!(x.dtype, DType::F32 | DType::F64 | DType::I32 | DType::I64) {
        return Ok(None);
    }
    let ensemble = Ensemble::new(op, &b.node.attrs)?;
    let (rows, features) = match x.shape.as_slice() {
        [n, f] => (*n, *f),
        _ => (1, x.elements()),
    };
    if ensemble.features() > features {
        return Ok(None);
    }
    let width = ensemble.width();
    let (scores, labels) = match b.outs {
        [y] => (y, None),
        [labels, z] if ensemble.int_labels().is_some() && labels.dtype == DType::I64 => {
            (z, Some(labels.clone()))
        }
        _ => return Ok(None),
    };
    if scores.dtype != DType::F32 || scores.elements() != rows * width {
        return Ok(None);
    }
    let f64_bytes = rows * (features + width) * std::mem::size_of::<f64>();
    let seen_at = f64_bytes.div_ceil(64) * 64;
    Ok(Some(Box::new(TreeEnsembleStep {
        x: x.clone(),
        scores: scores.clone(),
        labels,
        ensemble,
        rows,
        features,
        scratch: b.scratch(seen_at + rows * width),
        seen_at,
    })))
}

impl Kernel for TreeEnsembleStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let scratch = cx.ptr(self.scratch);
        let out = TreeOutputs {
            scores: cx.f32_mut(&self.scores),
            labels: self.labels.as_ref().and_then(|l| {
                let labels = self.ensemble.int_labels()?;
                Some((cx.ptr(l.loc) as *mut i64, labels))
            }),
        };
        // `seen_at` bytes of f64 scratch come first, then the `seen` flags (an offset
        // inside the scratch build asked for; no access here).
        let (f64s, seen) = (
            scratch as *mut f64,
            scratch.wrapping_add(self.seen_at) as *mut bool,
        );
        let (e, rows, features) = (&self.ensemble, self.rows, self.features);
        let x = (cx.ptr(self.x.loc) as *const u8, self.x.dtype);
        // SAFETY: the Kernel::run contract: x holds rows × features of its dtype, the
        // outputs rows × width f32 and rows i64; the scratch `seen_at + rows · width`
        // bytes: rows × (features + width) f64, then rows × width bools at `seen`.
        unsafe { ensemble_rows(e, x, rows, features, f64s, seen, &out, cx.pool) }
    }
    fn kind(&self) -> &'static str {
        "tree-ensemble"
    }
}
