//! Index, scan and structured ops on every dtype they take: ArgMax / ArgMin, Trilu,
//! CumSum / CumProd, Hardmax, ReverseSequence, GatherND, Det, Einsum, DFT and
//! TfIdfVectorizer (and the pools `nn` declines, through [`super::pool_nd`]), each a typed loop of `kernels::index_ops` over the arena. Attributes
//! and constant operands are read here; scalar operands that are not constants (Trilu's
//! k, CumSum's axis, DFT's length and axis) are read from their slot per run.
use std::collections::HashMap;

use crate::backend::cpu::kernels::index_ops::{
    self as k, Contraction, Dft, GatherNd, NGrams, Scan, MAX_EINSUM_OPERANDS,
};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::ops::matmul::{dot_equation, dot_plan, einsum_labels, parse_equation};
use crate::ir::ops::tree::Ensemble;
use crate::ir::shape::norm_axis;
use crate::ir::DType;
use crate::tensor::Elem;
use crate::with_dtype;

use super::Build;

/// A scalar operand: its value when constant, else its slot (read per run).
#[derive(Debug, Clone)]
enum Scalar {
    Known(i64),
    Slot(Slot),
}

impl Scalar {
    fn of(b: &Build, i: usize) -> Option<Scalar> {
        let s = b.input(i)?;
        Some(match b.constant(i) {
            Some(t) => Scalar::Known(t.to_i64_vec().first().copied().unwrap_or(0)),
            None => Scalar::Slot(s.clone()),
        })
    }
    /// The value under `cx`.
    fn get(&self, cx: &Cx) -> Result<i64, String> {
        match self {
            Scalar::Known(v) => Ok(*v),
            Scalar::Slot(s) => {
                if s.elements() == 0 {
                    return Err("a scalar operand is empty".into());
                }
                let p = cx.ptr(s.loc);
                // SAFETY: build admitted only an i32 or i64 slot of at least one element,
                // read here unaligned as its dtype says.
                Ok(unsafe {
                    match s.dtype {
                        DType::I32 => (p as *const i32).read_unaligned() as i64,
                        _ => (p as *const i64).read_unaligned(),
                    }
                })
            }
        }
    }
    fn int_slot(&self) -> bool {
        match self {
            Scalar::Known(_) => true,
            Scalar::Slot(s) => matches!(s.dtype, DType::I32 | DType::I64),
        }
    }
}

enum What {
    Arg {
        dims: [usize; 3],
        max: bool,
        last: bool,
    },
    Trilu {
        rows: usize,
        cols: usize,
        upper: bool,
        k: Scalar,
    },
    Cumulative {
        scan: Scan,
        axis: Scalar,
    },
    Hardmax {
        dims: [usize; 3],
    },
    ReverseSequence {
        dims: [usize; 3],
        batch_first: bool,
        lens: Slot,
    },
    GatherNd {
        g: GatherNd,
        idx: Slot,
    },
    Det {
        m: usize,
        work: Loc,
    },
    Einsum {
        c: Contraction,
        ops: Vec<Slot>,
        acc: Loc,
    },
    Dft {
        d: Dft,
        /// The twiddles when the length is known at build time.
        table: Vec<(f64, f64)>,
        len: Option<Scalar>,
        axis: Option<Scalar>,
        onesided: bool,
    },
    TfIdf {
        g: NGrams,
        rows: usize,
        width: usize,
    },
    /// TreeEnsemble on a float dtype other than f32 (the `trees` step's): the rows as
    /// f64, then scores, `seen` flags and picks, in the scratch at these byte offsets.
    Trees {
        e: Box<Ensemble>,
        rows: usize,
        features: usize,
        scratch: Loc,
        at: [usize; 3],
    },
}

struct IndexStep {
    what: What,
    x: Slot,
    y: Slot,
    /// Where x is copied first when the output took over its buffer.
    copy: Option<Loc>,
    kind: &'static str,
}

fn numeric(d: DType) -> bool {
    d.is_float() || d.is_int()
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), [y, ..]) = (b.input(0), b.outs) else {
        return Ok(None);
    };
    let attrs = &b.node.attrs;
    let r = x.shape.len();
    let (what, kind) = match b.node.op.as_str() {
        op @ ("ArgMax" | "ArgMin") => {
            if !numeric(x.dtype) || y.dtype != DType::I64 || r == 0 {
                return Ok(None);
            }
            let axis = norm_axis(attrs.int_or("axis", 0)?, r)?;
            let what = What::Arg {
                dims: k::split3(&x.shape, axis),
                max: op == "ArgMax",
                last: attrs.int_or("select_last_index", 0)? != 0,
            };
            (what, "arg-reduce")
        }
        "Trilu" => {
            let kk = match b.input(1) {
                None => Scalar::Known(0),
                Some(_) => Scalar::of(b, 1).expect("present"),
            };
            if r < 2 || !kk.int_slot() || x.dtype == DType::String || y.dtype != x.dtype {
                return Ok(None);
            }
            let what = What::Trilu {
                rows: x.shape[r - 2],
                cols: x.shape[r - 1],
                upper: attrs.int_or("upper", 1)? != 0,
                k: kk,
            };
            (what, "trilu")
        }
        op @ ("CumSum" | "CumProd") => {
            let Some(axis) = Scalar::of(b, 1) else {
                return Ok(None);
            };
            if !numeric(x.dtype) || y.dtype != x.dtype || !axis.int_slot() {
                return Ok(None);
            }
            let scan = Scan {
                product: op == "CumProd",
                exclusive: attrs.int_or("exclusive", 0)? != 0,
                reverse: attrs.int_or("reverse", 0)? != 0,
            };
            (What::Cumulative { scan, axis }, "cumulative")
        }
        "Hardmax" => {
            if !x.dtype.is_float() || y.dtype != x.dtype || r == 0 {
                return Ok(None);
            }
            let axis = norm_axis(attrs.int_or("axis", -1)?, r)?;
            let dims = k::split3(&x.shape, axis);
            (What::Hardmax { dims }, "hardmax")
        }
        "ReverseSequence" => {
            let Some(lens) = b.input(1) else {
                return Ok(None);
            };
            if r < 2 || lens.dtype != DType::I64 || x.dtype == DType::String {
                return Ok(None);
            }
            let bax = norm_axis(attrs.int_or("batch_axis", 1)?, r)?;
            let tax = norm_axis(attrs.int_or("time_axis", 0)?, r)?;
            if bax > 1 || tax > 1 || bax == tax || lens.elements() != x.shape[bax] {
                return Ok(None);
            }
            let what = What::ReverseSequence {
                dims: [x.shape[0], x.shape[1], x.shape[2..].iter().product()],
                batch_first: bax == 0,
                lens: lens.clone(),
            };
            (what, "reverse-sequence")
        }
        "GatherND" => return build_gather_nd(b, x, y),
        "Det" => {
            if !x.dtype.is_float()
                || y.dtype != x.dtype
                || r < 2
                || x.shape[r - 1] != x.shape[r - 2]
            {
                return Ok(None);
            }
            let m = x.shape[r - 1];
            let work = b.scratch(m * m * 8);
            (What::Det { m, work }, "det")
        }
        "Einsum" => return build_einsum(b, y, b.node.attrs.string_or("equation", "")?),
        "Dot" => return build_dot(b, y),
        "DFT" => return build_dft(b, x, y),
        "STFT" => return build_stft(b, x, y),
        "TfIdfVectorizer" => return build_tf_idf(b, x, y),
        "MaxPool" | "AveragePool" | "LpPool" => return super::pool_nd::build(b),
        "TreeEnsemble" => return build_trees(b, x, y),
        _ => return Ok(None),
    };
    Ok(Some(step(b, what, x, y, kind)))
}

fn step(b: &Build, what: What, x: &Slot, y: &Slot, kind: &'static str) -> Box<dyn Kernel> {
    // The scratch is one region: steps with a work area of their own put x's copy after
    // it. (None of these ops is planned in place; this keeps them right if one were.)
    let work = match &what {
        What::Det { m, .. } => m * m * 8,
        What::Einsum { .. } => y.elements() * 8,
        What::Trees { at, rows, .. } => at[2] + rows * std::mem::size_of::<usize>(),
        _ => 0,
    };
    let work = work.div_ceil(64) * 64;
    let copy = (x.loc == y.loc).then(|| match b.scratch(work + x.bytes()) {
        Loc::Arena(at) => Loc::Arena(at + work),
        other => other,
    });
    Box::new(IndexStep {
        what,
        x: x.clone(),
        y: y.clone(),
        copy,
        kind,
    })
}

fn build_gather_nd(b: &Build, x: &Slot, y: &Slot) -> Result<Option<Box<dyn Kernel>>, String> {
    let Some(idx) = b.input(1) else {
        return Ok(None);
    };
    let bd = b.node.attrs.int_or("batch_dims", 0)?.max(0) as usize;
    let q = idx.shape.len();
    if !matches!(idx.dtype, DType::I32 | DType::I64) || x.dtype == DType::String || q == 0 {
        return Ok(None);
    }
    let kk = idx.shape[q - 1];
    if bd >= q || bd + kk > x.shape.len() || idx.shape[..bd] != x.shape[..bd] {
        return Ok(None);
    }
    let mut want = idx.shape[..q - 1].to_vec();
    want.extend(&x.shape[bd + kk..]);
    if want != y.shape || y.dtype != x.dtype {
        return Ok(None);
    }
    let strides = (0..kk)
        .map(|j| x.shape[bd + j + 1..].iter().product())
        .collect();
    let g = GatherNd {
        batch: x.shape[..bd].iter().product(),
        tuples: idx.shape[bd..q - 1].iter().product(),
        k: kk,
        batch_len: x.shape[bd..].iter().product(),
        slice: x.shape[bd + kk..].iter().product(),
        dims: x.shape[bd..bd + kk].to_vec(),
        strides,
        elem: x.dtype.size_in_bytes(),
    };
    let what = What::GatherNd {
        g,
        idx: idx.clone(),
    };
    Ok(Some(step(b, what, x, y, "gather-nd")))
}

/// Dot: the Einsum of its axis names' equation (the names live in the graph's types).
fn build_dot(b: &Build, y: &Slot) -> Result<Option<Box<dyn Kernel>>, String> {
    let types: Vec<_> = b
        .node
        .inputs
        .iter()
        .map(|v| v.and_then(|v| b.g.value_type(v).ok()))
        .collect();
    let [Some(ta), Some(tb)] = types[..] else {
        return Ok(None);
    };
    let pairs = dot_plan(&ta.shape, &tb.shape)?;
    let Some(eq) = dot_equation(ta.shape.rank(), tb.shape.rank(), &pairs) else {
        return Ok(None);
    };
    build_einsum(b, y, &eq)
}

fn build_einsum(b: &Build, y: &Slot, equation: &str) -> Result<Option<Box<dyn Kernel>>, String> {
    let Some(ops) = b.ins.iter().cloned().collect::<Option<Vec<Slot>>>() else {
        return Ok(None);
    };
    let dtype = y.dtype;
    if ops.is_empty()
        || ops.len() > MAX_EINSUM_OPERANDS
        || !numeric(dtype)
        || ops.iter().any(|s| s.dtype != dtype || s.loc == y.loc)
    {
        return Ok(None);
    }
    let eq = parse_equation(equation, ops.len())?;
    let ranks: Vec<usize> = ops.iter().map(|s| s.shape.len()).collect();
    let (ins, outs) = einsum_labels(&eq, &ranks)?;
    let mut ids: Vec<u32> = ins.iter().flatten().copied().collect();
    ids.sort_unstable();
    ids.dedup();
    let id = |l: u32| {
        ids.binary_search(&l)
            .map_err(|_| "an output label no operand has")
    };
    let mut sizes = vec![1usize; ids.len()];
    for (labels, s) in ins.iter().zip(&ops) {
        for (&l, &d) in labels.iter().zip(&s.shape) {
            let e = &mut sizes[id(l)?];
            if d != 1 && *e != 1 && *e != d {
                return Err(format!("einsum: label sizes differ: {d} vs {e}"));
            }
            if d != 1 {
                *e = d;
            }
        }
    }
    let strides_of = |shape: &[usize], labels: &[u32]| -> Result<Vec<usize>, String> {
        let mut per = vec![0; sizes.len()];
        let mut step = 1;
        for (&extent, &l) in shape.iter().zip(labels).rev() {
            if extent != 1 {
                per[id(l)?] += step;
            }
            step *= extent;
        }
        Ok(per)
    };
    let out_shape: Vec<usize> = outs
        .iter()
        .map(|&l| id(l).map(|i| sizes[i]))
        .collect::<Result<_, _>>()?;
    if out_shape != y.shape {
        return Ok(None);
    }
    let strides = ins
        .iter()
        .zip(&ops)
        .map(|(l, s)| strides_of(&s.shape, l))
        .collect::<Result<_, _>>()?;
    let c = Contraction {
        out_strides: strides_of(&out_shape, &outs)?,
        strides,
        sizes,
    };
    let acc = b.scratch(y.elements() * 8);
    let x = ops[0].clone();
    let what = What::Einsum { c, ops, acc };
    Ok(Some(step(b, what, &x, y, "einsum")))
}

fn build_dft(b: &Build, x: &Slot, y: &Slot) -> Result<Option<Box<dyn Kernel>>, String> {
    let r = x.shape.len();
    if !x.dtype.is_float() || y.dtype != x.dtype || r < 2 || y.shape.len() != r {
        return Ok(None);
    }
    let len = b.input(1).map(|_| Scalar::of(b, 1).expect("present"));
    let axis = b.input(2).map(|_| Scalar::of(b, 2).expect("present"));
    if len.as_ref().is_some_and(|s| !s.int_slot()) || axis.as_ref().is_some_and(|s| !s.int_slot()) {
        return Ok(None);
    }
    let inverse = b.node.attrs.int_or("inverse", 0)? != 0;
    let onesided = b.node.attrs.int_or("onesided", 0)? != 0;
    let parts = x.shape[r - 1];
    if !matches!(parts, 1 | 2) {
        return Ok(None);
    }
    let d = Dft {
        pre: 0,
        size: 0,
        post: 0,
        parts,
        n: 0,
        bins: 0,
        inverse,
        real_out: inverse && onesided,
    };
    let mut what = What::Dft {
        d,
        table: vec![],
        len,
        axis,
        onesided,
    };
    // With both operands known, the geometry (and twiddles) are fixed now.
    if let What::Dft {
        d,
        table,
        len,
        axis,
        ..
    } = &mut what
    {
        let known = |s: &Option<Scalar>| match s {
            None => Some(None),
            Some(Scalar::Known(v)) => Some(Some(*v)),
            Some(Scalar::Slot(_)) => None,
        };
        if let (Some(l), Some(a)) = (known(len), known(axis)) {
            *d = dft_geometry(d, &x.shape, &y.shape, l, a, onesided)?;
            *table = k::twiddles(d.n);
        }
    }
    Ok(Some(step(b, what, x, y, "dft")))
}

/// The DFT geometry for length `len` and axis `axis` (`None`: defaults), checked
/// against the output's shape.
fn dft_geometry(
    base: &Dft,
    xs: &[usize],
    ys: &[usize],
    len: Option<i64>,
    axis: Option<i64>,
    onesided: bool,
) -> Result<Dft, String> {
    let r = xs.len();
    let axis = norm_axis(axis.unwrap_or(-2), r)?;
    if axis == r - 1 {
        return Err("axis cannot be the last axis (real and imaginary parts)".into());
    }
    let size = xs[axis];
    let n = match len {
        Some(l) if l < 1 => return Err(format!("dft_length must be positive, got {l}")),
        Some(l) => l as usize,
        None if base.real_out => 2 * size.saturating_sub(1),
        None => size,
    };
    if n == 0 {
        return Err("the transform length is 0".into());
    }
    let (bins, out_parts) = match (base.inverse, onesided) {
        (true, true) => (n, 1),
        (false, true) => (n / 2 + 1, 2),
        _ => (n, 2),
    };
    let mut want = xs.to_vec();
    want[axis] = bins;
    want[r - 1] = out_parts;
    if want != ys {
        return Err(format!("DFT gives {want:?}, the output is {ys:?}"));
    }
    Ok(Dft {
        pre: xs[..axis].iter().product(),
        size,
        post: xs[axis + 1..r - 1].iter().product(),
        n,
        bins,
        ..*base
    })
}

fn build_trees(b: &Build, x: &Slot, y: &Slot) -> Result<Option<Box<dyn Kernel>>, String> {
    if !x.dtype.is_float() || x.dtype == DType::F32 || y.dtype != x.dtype || b.outs.len() != 1 {
        return Ok(None);
    }
    let e = Ensemble::new("TreeEnsemble", &b.node.attrs)?;
    let (rows, features) = match x.shape[..] {
        [n, f] => (n, f),
        _ => (1, x.elements()),
    };
    let width = e.width();
    if e.features() > features || y.elements() != rows * width {
        return Ok(None);
    }
    let align = |v: usize| v.div_ceil(64) * 64;
    let scores_at = align(rows * features * 8);
    let seen_at = align(scores_at + rows * width * 8);
    let picks_at = align(seen_at + rows * width);
    let scratch = b.scratch(picks_at + rows * std::mem::size_of::<usize>());
    let what = What::Trees {
        e: Box::new(e),
        rows,
        features,
        scratch,
        at: [scores_at, seen_at, picks_at],
    };
    Ok(Some(step(b, what, x, y, "tree-ensemble")))
}

fn build_tf_idf(b: &Build, x: &Slot, y: &Slot) -> Result<Option<Box<dyn Kernel>>, String> {
    let attrs = &b.node.attrs;
    if !matches!(x.dtype, DType::I32 | DType::I64) || y.dtype != DType::F32 {
        return Ok(None);
    }
    let (rows, width) = match x.shape[..] {
        [b, c] => (b, c),
        [c] => (1, c),
        _ => return Ok(None),
    };
    let Some(tokens) = attrs.ints("pool_int64s")? else {
        return Ok(None);
    };
    let counts = attrs
        .ints("ngram_counts")?
        .ok_or("ngram_counts is required")?;
    let indexes = attrs
        .ints("ngram_indexes")?
        .ok_or("ngram_indexes is required")?;
    let int = |name| -> Result<usize, String> {
        let v = attrs.req_int(name)?;
        usize::try_from(v).map_err(|_| format!("{name} must not be negative, got {v}"))
    };
    let (min, max, max_skip) = (
        int("min_gram_length")?,
        int("max_gram_length")?,
        int("max_skip_count")?,
    );
    if min < 1 || min > max || indexes.iter().any(|&i| i < 0) {
        return Ok(None);
    }
    let mode = match attrs.string_or("mode", "")? {
        "TF" => 0,
        "IDF" => 1,
        "TFIDF" => 2,
        _ => return Ok(None),
    };
    let columns = indexes.iter().map(|&i| i as usize + 1).max().unwrap_or(0);
    // As the interpreter's pool: a later equal n-gram takes the column.
    let mut grams: HashMap<Vec<i64>, usize> = HashMap::new();
    let mut id = 0usize;
    for (s, &start) in counts.iter().enumerate() {
        let end = counts.get(s + 1).copied().unwrap_or(tokens.len() as i64);
        let (start, end) = (start as usize, end as usize);
        if start > end || end > tokens.len() {
            return Ok(None);
        }
        let n = s + 1;
        for gram in tokens[start..end].chunks(n).filter(|g| g.len() == n) {
            if (min..=max).contains(&n) {
                let Some(&column) = indexes.get(id) else {
                    return Ok(None);
                };
                grams.insert(gram.to_vec(), column as usize);
            }
            id += 1;
        }
    }
    let weights = attrs.floats("weights")?.unwrap_or_default();
    if (!weights.is_empty() && weights.len() < columns) || y.elements() != rows * columns {
        return Ok(None);
    }
    let mut by_len: Vec<Vec<(Vec<i64>, usize)>> = vec![vec![]; max];
    for (g, c) in grams {
        by_len[g.len() - 1].push((g, c));
    }
    for v in &mut by_len {
        v.sort();
    }
    let g = NGrams {
        grams: by_len,
        columns,
        min,
        max,
        max_skip,
        mode,
        weights,
    };
    let what = What::TfIdf { g, rows, width };
    Ok(Some(step(b, what, x, y, "tf-idf")))
}

/// `len` `T`s at `loc`, read-only.
///
/// # Safety
/// `loc` must hold `len` `T`s under `cx`, not written while the slice lives.
unsafe fn view<'a, T>(cx: &Cx, loc: Loc, len: usize) -> &'a [T] {
    // SAFETY: the caller's contract: `len` live `T`s at `loc`, unwritten meanwhile.
    unsafe { std::slice::from_raw_parts(cx.ptr(loc) as *const T, len) }
}

/// `len` `T`s at `loc`, to write.
///
/// # Safety
/// `loc` must hold `len` `T`s under `cx` that nothing else reads or writes while the
/// slice lives.
#[allow(clippy::mut_from_ref)]
unsafe fn view_mut<'a, T>(cx: &Cx, loc: Loc, len: usize) -> &'a mut [T] {
    // SAFETY: the caller's contract: `len` live `T`s at `loc`, this slice's alone.
    unsafe { std::slice::from_raw_parts_mut(cx.ptr(loc) as *mut T, len) }
}

/// The step on `T` (x's dtype).
///
/// # Safety
/// The Kernel::run contract: the slots hold their dtypes and shapes under `cx`.
unsafe fn run_typed<T: Elem>(cx: &Cx, s: &IndexStep) -> Result<(), String> {
    let (nx, ny) = (s.x.elements(), s.y.elements());
    let mut x_loc = s.x.loc;
    if let Some(at) = s.copy {
        // SAFETY: x is y's buffer, `x.bytes()`, copied to the scratch build sized for it.
        unsafe { std::ptr::copy_nonoverlapping(cx.ptr(x_loc), cx.ptr(at), s.x.bytes()) };
        x_loc = at;
    }
    // SAFETY: x's slot (or its copy) holds `nx` `T`s; no output is that buffer now.
    let x: &[T] = unsafe { view(cx, x_loc, nx) };
    match &s.what {
        What::Arg { dims, max, last } => {
            if dims[1] == 0 {
                return Err("cannot take the arg max / min of an empty axis".into());
            }
            // SAFETY: y is an i64 slot of `ny` elements, another buffer than x's.
            let y = unsafe { view_mut(cx, s.y.loc, ny) };
            k::arg_reduce(x, y, *dims, *max, *last);
        }
        What::Trilu {
            rows,
            cols,
            upper,
            k,
        } => {
            let kv = k.get(cx)?;
            // SAFETY: Trilu's output is x's dtype and shape, in its own buffer.
            let y = unsafe { view_mut(cx, s.y.loc, ny) };
            k::trilu(x, y, *rows, *cols, kv, *upper);
        }
        What::Cumulative { scan, axis } => {
            let a = norm_axis(axis.get(cx)?, s.x.shape.len())?;
            // SAFETY: the running totals go to y, x's dtype and shape, its own buffer.
            let y = unsafe { view_mut(cx, s.y.loc, ny) };
            k::cumulative(x, y, k::split3(&s.x.shape, a), *scan);
        }
        What::Hardmax { dims } => {
            // SAFETY: Hardmax writes y, x's dtype and shape, a buffer of its own.
            let y = unsafe { view_mut(cx, s.y.loc, ny) };
            k::hardmax(x, y, *dims);
        }
        What::ReverseSequence {
            dims,
            batch_first,
            lens,
        } => {
            // SAFETY: sequence_lens is an i64 slot of its elements, only read.
            let l: &[i64] = unsafe { view(cx, lens.loc, lens.elements()) };
            let steps = dims[if *batch_first { 1 } else { 0 }] as i64;
            if l.iter().any(|&v| v < 0 || v > steps) {
                return Err(format!(
                    "sequence_lens {l:?} must give each batch entry a length <= {steps}"
                ));
            }
            // SAFETY: the reversed sequences go to y (x's shape), its own buffer.
            let y = unsafe { view_mut(cx, s.y.loc, ny) };
            k::reverse_sequence(x, y, *dims, *batch_first, l);
        }
        What::GatherNd { g, idx } => {
            let n = idx.elements();
            // SAFETY: data is `x.bytes()` of raw elements, y `y.bytes()`, distinct buffers.
            let (xb, yb): (&[u8], &mut [u8]) = unsafe {
                (
                    view(cx, x_loc, s.x.bytes()),
                    view_mut(cx, s.y.loc, s.y.bytes()),
                )
            };
            return match idx.dtype {
                // SAFETY: the indices slot holds `n` i32 (build checked its dtype).
                DType::I32 => k::gather_nd(g, xb, unsafe { view::<i32>(cx, idx.loc, n) }, yb),
                // SAFETY: the indices slot holds `n` i64 (the only other dtype admitted).
                _ => k::gather_nd(g, xb, unsafe { view::<i64>(cx, idx.loc, n) }, yb),
            };
        }
        What::Det { m, work } => {
            // SAFETY: build asked m·m f64 of scratch for the LU, this step's alone.
            let w = unsafe { view_mut(cx, *work, m * m) };
            // SAFETY: one determinant per matrix into y, x's dtype, its own buffer.
            let y = unsafe { view_mut(cx, s.y.loc, ny) };
            k::det(x, y, *m, w);
        }
        What::Einsum { c, ops, acc } => {
            let mut slices: [&[T]; MAX_EINSUM_OPERANDS] = [&[]; MAX_EINSUM_OPERANDS];
            for (d, o) in slices.iter_mut().zip(ops) {
                // SAFETY: each operand slot holds its elements of the output's dtype;
                // none is the output's buffer (build declined that).
                *d = unsafe { view(cx, o.loc, o.elements()) };
            }
            // SAFETY: the scratch build asked is the output's elements as f64.
            let a = unsafe { view_mut(cx, *acc, ny) };
            k::contract(c, &slices[..ops.len()], a);
            // SAFETY: the output slot holds `ny` `T`s, written only here.
            let y: &mut [T] = unsafe { view_mut(cx, s.y.loc, ny) };
            let float = T::DTYPE.is_float();
            for (o, &v) in y.iter_mut().zip(a.iter()) {
                *o = if float {
                    T::from_f64(v)
                } else {
                    T::from_i64(v as i64)
                };
            }
        }
        What::Dft {
            d,
            table,
            len,
            axis,
            onesided,
        } => {
            // SAFETY: the spectrum (or signal) goes to y, x's dtype, its own buffer.
            let y = unsafe { view_mut(cx, s.y.loc, ny) };
            if !table.is_empty() {
                k::dft(d, x, y, &|m| table[m]);
            } else {
                let get = |o: &Option<Scalar>| o.as_ref().map(|v| v.get(cx)).transpose();
                let (l, a) = (get(len)?, get(axis)?);
                let g = dft_geometry(d, &s.x.shape, &s.y.shape, l, a, *onesided)?;
                let n = g.n as f64;
                k::dft(&g, x, y, &|m| {
                    let a = 2.0 * std::f64::consts::PI * m as f64 / n;
                    (a.cos(), a.sin())
                });
            }
        }
        What::TfIdf { g, rows, width } => {
            // SAFETY: Y is an f32 slot of rows · columns, its own buffer.
            let y = unsafe { view_mut(cx, s.y.loc, ny) };
            k::tf_idf(g, x, *rows, *width, y);
        }
        What::Trees {
            e,
            rows,
            features,
            scratch,
            at,
        } => {
            let (nf, nw) = (rows * features, rows * e.width());
            let base = cx.ptr(*scratch);
            // SAFETY: build sized the scratch for rows × features f64, then (at these
            // 64-aligned offsets) the scores f64, the seen flags and the picks, disjoint.
            let (xf, scores, seen, picks): (&mut [f64], &mut [f64], &mut [bool], &mut [usize]) = unsafe {
                (
                    std::slice::from_raw_parts_mut(base as *mut f64, nf),
                    std::slice::from_raw_parts_mut(base.add(at[0]) as *mut f64, nw),
                    std::slice::from_raw_parts_mut(base.add(at[1]) as *mut bool, nw),
                    std::slice::from_raw_parts_mut(base.add(at[2]) as *mut usize, *rows),
                )
            };
            for (d, v) in xf.iter_mut().zip(x) {
                *d = v.to_f64();
            }
            scores.fill(0.0);
            seen.fill(false);
            e.rows(xf, *features, scores, seen, picks)?;
            // SAFETY: the scores go to Y, x's dtype, rows × width, its own buffer.
            let y: &mut [T] = unsafe { view_mut(cx, s.y.loc, ny) };
            for (o, &v) in y.iter_mut().zip(scores.iter()) {
                *o = T::from_f64(v);
            }
        }
    }
    Ok(())
}

impl Kernel for IndexStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract, with x of `x.dtype` (what build checked).
        unsafe { with_dtype!(self.x.dtype, run_typed(cx, self)) }
    }
    fn can_fail(&self) -> bool {
        !matches!(
            self.what,
            What::Hardmax { .. } | What::Det { .. } | What::Einsum { .. } | What::TfIdf { .. }
        )
    }
    fn kind(&self) -> &'static str {
        self.kind
    }
}

/// STFT: frames of `f` every `step` (read at run time when not a constant, and checked
/// against the static frame count), times the window, as direct DFT sums in f64.
struct StftStep {
    f: usize,
    frames: usize,
    bins: usize,
    step: Scalar,
    frame_len: Option<Scalar>,
    tw: Vec<(f64, f64)>,
    x: Slot,
    window: Option<Slot>,
    y: Slot,
}

fn build_stft(b: &Build, x: &Slot, y: &Slot) -> Result<Option<Box<dyn Kernel>>, String> {
    if !x.dtype.is_float()
        || y.dtype != x.dtype
        || x.shape.len() != 3
        || !matches!(x.shape[2], 1 | 2)
        || y.shape.len() != 4
        || y.shape[0] != x.shape[0]
        || y.shape[3] != 2
    {
        return Ok(None);
    }
    let Some(step) = Scalar::of(b, 1) else {
        return Ok(None);
    };
    let window = b.input(2).cloned();
    if window
        .as_ref()
        .is_some_and(|w| w.dtype != x.dtype || w.shape.len() != 1)
    {
        return Ok(None);
    }
    let frame_len = b.input(3).map(|_| Scalar::of(b, 3).expect("present"));
    if [Some(&step), frame_len.as_ref()]
        .iter()
        .flatten()
        .any(|s| matches!(s, Scalar::Slot(s) if !matches!(s.dtype, DType::I32 | DType::I64)))
    {
        return Ok(None);
    }
    let f = match (&frame_len, &window) {
        (Some(Scalar::Known(v)), _) => *v as usize,
        (Some(Scalar::Slot(_)), Some(w)) => w.shape[0],
        (Some(Scalar::Slot(_)), None) => return Ok(None),
        (None, Some(w)) => w.shape[0],
        (None, None) => x.shape[1],
    };
    let (frames, bins) = (y.shape[1], y.shape[2]);
    let onesided = b.node.attrs.int_or("onesided", 1)? != 0;
    let want_bins = if onesided { f / 2 + 1 } else { f };
    if f == 0 || f > x.shape[1] || bins != want_bins || frames == 0 {
        return Ok(None);
    }
    if window.as_ref().is_some_and(|w| w.shape[0] != f) {
        return Err(format!(
            "the window has {} values for frames of {f}",
            window.unwrap().shape[0]
        ));
    }
    Ok(Some(Box::new(StftStep {
        f,
        frames,
        bins,
        step,
        frame_len,
        tw: k::twiddles(f),
        x: x.clone(),
        window,
        y: y.clone(),
    })))
}

/// The STFT on `T`.
///
/// # Safety
/// The Kernel::run contract: signal, window and output hold `T`s of their shapes.
unsafe fn run_stft<T: Elem>(cx: &Cx, s: &StftStep) -> Result<(), String> {
    let (f, length, parts) = (s.f, s.x.shape[1], s.x.shape[2]);
    let step = s.step.get(cx)?;
    if let Some(fl) = &s.frame_len {
        let v = fl.get(cx)?;
        if v != f as i64 {
            return Err(format!("frame_length {v} is not the planned {f}"));
        }
    }
    if step < 1 || 1 + (length - f) / step as usize != s.frames {
        return Err(format!(
            "frame_step {step} does not give the planned {} frames",
            s.frames
        ));
    }
    let step = step as usize;
    // SAFETY: the STFT signal, `T`s of its shape, only read.
    let x = unsafe { std::slice::from_raw_parts(cx.ptr(s.x.loc) as *const T, s.x.elements()) };
    // SAFETY: the STFT window, `f` `T`s, only read.
    let w = s
        .window
        .as_ref()
        .map(|w| unsafe { std::slice::from_raw_parts(cx.ptr(w.loc) as *const T, f) });
    // SAFETY: the STFT output (never planned in place), `T`s of its shape.
    let y = unsafe { std::slice::from_raw_parts_mut(cx.ptr(s.y.loc) as *mut T, s.y.elements()) };
    let sig = length * parts;
    for (b, out) in y.chunks_mut(s.frames * s.bins * 2).enumerate() {
        let signal = &x[b * sig..(b + 1) * sig];
        for (fr, of) in out.chunks_mut(s.bins * 2).enumerate() {
            let start = fr * step;
            for (kb, o) in of.chunks_mut(2).enumerate() {
                let (mut re, mut im) = (0.0, 0.0);
                for n in 0..f {
                    let wn = w.map_or(1.0, |w| w[n].to_f64());
                    let at = (start + n) * parts;
                    let xr = signal[at].to_f64() * wn;
                    let xi = if parts == 2 {
                        signal[at + 1].to_f64() * wn
                    } else {
                        0.0
                    };
                    let (c, sn) = s.tw[(kb * n) % f];
                    let sn = -sn;
                    re += xr * c - xi * sn;
                    im += xr * sn + xi * c;
                }
                o[0] = T::from_f64(re);
                o[1] = T::from_f64(im);
            }
        }
    }
    Ok(())
}

impl Kernel for StftStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract; signal, window and output hold x.dtype.
        unsafe { with_dtype!(self.x.dtype, run_stft(cx, self)) }
    }
    fn can_fail(&self) -> bool {
        true
    }
    fn kind(&self) -> &'static str {
        "stft"
    }
}
