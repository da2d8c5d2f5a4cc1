//! Control flow as compiled steps. Each body of an `If`, `Loop` or `Scan` is specialized
//! for the shapes its operands have in this program, optimized by the pass pipeline and
//! lowered to its own [`Program`] once, when the parent is lowered. The body's arena lies
//! in the parent's step scratch region, beside what the step itself needs (a loop's
//! carried values twice, so that each iteration reads one copy and writes the other; a
//! scan's slices along a non-leading axis), so a run of the step neither looks anything
//! up nor allocates, however many iterations it makes, and the body programs keep the
//! backend's invariant: their runs walk a flat list of kernels.
//!
//! A body whose types stay dynamic once its operands' shapes are bound (a loop whose
//! carried shapes change between iterations), that makes host objects (strings,
//! sequences, optionals), whose carried or branch results do not
//! have the step's own static types, or that holds variables, is declined: the fallback
//! step runs the interpreter's op on it.
use std::ptr;

use super::Build;
use crate::backend::cpu::lower::{lower, Program};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::backend::cpu::state::Variables;
use crate::backend::specialize::specialize_for_shapes;
use crate::ir::{DType, Graph};
use crate::memory::ALIGN;

/// The most iterations a loop without a trip count runs before failing instead of
/// hanging: the reference evaluation's limit.
const UNBOUNDED_LOOP_LIMIT: i64 = 1 << 24;

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    match b.node.op.as_str() {
        "If" => build_if(b),
        "Loop" => build_loop(b),
        "Scan" => build_scan(b),
        _ => Ok(None),
    }
}

/// The step's part of the scratch region, laid out buffer after aligned buffer.
struct Layout {
    /// Where the scratch region starts in the arena.
    base: usize,
    used: usize,
}

impl Layout {
    fn new(b: &Build) -> Layout {
        Layout {
            base: match b.scratch(0) {
                Loc::Arena(at) => at,
                _ => unreachable!("the scratch region is in the arena"),
            },
            used: 0,
        }
    }
    /// The arena offset of a new buffer of `bytes`.
    fn take(&mut self, bytes: usize) -> Result<usize, String> {
        let at = self
            .base
            .checked_add(self.used)
            .ok_or("scratch offsets overflow")?;
        self.used = bytes
            .checked_next_multiple_of(ALIGN)
            .and_then(|b| self.used.checked_add(b))
            .ok_or("the step's scratch size overflows")?;
        Ok(at)
    }
    /// Reserves what was taken.
    fn finish(self, b: &Build) {
        b.scratch(self.used);
    }
}

/// A body lowered for the shapes its parameters take in this program, or `None` when it
/// cannot be compiled (see the module comment). With the `allow-fallback` option off, a
/// body op without a kernel is this node's error (naming that op), not a decline that
/// would hide it behind "no cpu kernel for Scan".
fn compile_body(
    b: &Build,
    body: &Graph,
    params: &[(DType, &[usize])],
) -> Result<Option<Program>, String> {
    match lower_body(b, body, params) {
        Some(Ok(p)) => Ok(Some(p)),
        Some(Err(e)) if !b.passes.allow_fallback => Err(format!("in its body: {e}")),
        _ => Ok(None),
    }
}

/// The body specialized for `params` and lowered (`None` where it cannot be: state,
/// a parameter mismatch, host values).
fn lower_body(
    b: &Build,
    body: &Graph,
    params: &[(DType, &[usize])],
) -> Option<Result<Program, String>> {
    let has_state = body
        .nodes()
        .iter()
        .any(|n| matches!(n.op.as_str(), "Variable" | "Assign"));
    if has_state || body.inputs().len() != params.len() {
        return None;
    }
    let shapes: Vec<Vec<usize>> = params.iter().map(|(_, s)| s.to_vec()).collect();
    let g = specialize_for_shapes(body, &shapes, b.passes).ok()?;
    let inputs = g.inputs();
    let bound = inputs.len() == params.len()
        && inputs.iter().zip(params).all(|(&p, (dtype, shape))| {
            let ty = &g.node(p).outputs[0];
            ty.dtype == *dtype && ty.static_dims().as_deref() == Some(*shape)
        });
    if !bound || crate::backend::cpu::runs_on_host(&g) {
        return None;
    }
    let vars = Variables::new(&g).ok()?;
    Some(lower(&g, b.pool, &vars, b.passes).map_err(|e| e.to_string()))
}

/// Whether body result `k` of `p` has exactly the type of `slot`.
fn result_is(p: &Program, k: usize, dtype: DType, shape: &[usize]) -> bool {
    p.outputs
        .get(k)
        .is_some_and(|o| o.dtype == dtype && o.shape == shape)
}

/// The present inputs of `b` from `from` on (the trailing operands).
fn slots_from(b: &Build, from: usize) -> Option<Vec<Slot>> {
    b.ins.get(from..)?.iter().cloned().collect()
}

/// Calls `f` with `n` pointers, on the stack when there are few (a step's body inputs),
/// so that running a step does not allocate.
fn with_ptrs<R>(n: usize, f: impl FnOnce(&mut [*const u8]) -> R) -> R {
    const FEW: usize = 16;
    if n <= FEW {
        let mut few = [ptr::null(); FEW];
        f(&mut few[..n])
    } else {
        f(&mut vec![ptr::null(); n])
    }
}

/// Runs body program `p` over the arena at `arena` with its parameters at `inputs`, and
/// calls `results` with a context in which its output slots can be read.
///
/// # Safety
/// `arena` holds `p.arena_bytes` writable bytes and `inputs` point to values of the
/// types `p` was lowered for.
unsafe fn run_body(
    p: &Program,
    arena: *mut u8,
    inputs: &[*const u8],
    parent: &Cx,
    results: impl FnOnce(&Cx) -> Result<(), String>,
) -> Result<(), String> {
    let cx = Cx {
        arena,
        inputs,
        state: &[],
        pool: parent.pool,
    };
    for step in &p.steps {
        // SAFETY: the caller's contract: the body's arena and inputs are as lowered.
        unsafe { step.kernel.run(&cx) }.map_err(|e| format!("body {}: {e}", step.node))?;
    }
    results(&cx)
}

/// Copies `bytes` from `from` to `to`.
///
/// # Safety
/// Both are valid for `bytes`.
unsafe fn copy(from: *const u8, to: *mut u8, bytes: usize) {
    // SAFETY: the caller's contract; `copy` allows the two to overlap.
    unsafe { ptr::copy(from, to, bytes) }
}

/// `If(cond, captures...)`: both branches compiled; the condition picks one per run.
struct IfStep {
    cond: Slot,
    branches: [Program; 2],
    arena: usize,
    captures: Vec<Slot>,
    outs: Vec<Slot>,
}

fn build_if(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(cond), Some(captures)) = (b.input(0).cloned(), slots_from(b, 1)) else {
        return Ok(None);
    };
    let params: Vec<(DType, &[usize])> = captures.iter().map(|s| (s.dtype, &s.shape[..])).collect();
    let mut branches = vec![];
    for name in ["then_branch", "else_branch"] {
        let Some(body) = b.node.attrs.graph(name)? else {
            return Ok(None);
        };
        let Some(p) = compile_body(b, body, &params)? else {
            return Ok(None);
        };
        let fits = p.outputs.len() == b.outs.len()
            && (b.outs.iter().enumerate()).all(|(k, o)| result_is(&p, k, o.dtype, &o.shape));
        if !fits {
            return Ok(None);
        }
        branches.push(p);
    }
    let Ok([then_branch, else_branch]) = <[Program; 2]>::try_from(branches) else {
        unreachable!("two branches")
    };
    let mut layout = Layout::new(b);
    let arena = layout.take(then_branch.arena_bytes.max(else_branch.arena_bytes))?;
    layout.finish(b);
    Ok(Some(Box::new(IfStep {
        cond,
        branches: [then_branch, else_branch],
        arena,
        captures,
        outs: b.outs.to_vec(),
    })))
}

impl Kernel for IfStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the If's condition is a Bool scalar slot: one byte, live for the run.
        let taken = unsafe { *cx.ptr(self.cond.loc) } != 0;
        let p = &self.branches[usize::from(!taken)];
        // The branches' arena, taken from the step's scratch with the larger one's size.
        let arena = cx.arena.wrapping_add(self.arena);
        with_ptrs(self.captures.len(), |ins| {
            for (i, s) in ins.iter_mut().zip(&self.captures) {
                *i = cx.ptr(s.loc);
            }
            let results = |bcx: &Cx<'_>| -> Result<(), String> {
                for (o, r) in self.outs.iter().zip(&p.outputs) {
                    // SAFETY: the branch result r has the If output o's dtype and shape
                    // (checked at build), so both hold o.bytes() bytes.
                    unsafe { copy(bcx.ptr(r.loc), cx.ptr(o.loc), o.bytes()) };
                }
                Ok(())
            };
            // SAFETY: `arena` holds max(then, else) arena_bytes of the step's scratch, and
            // `ins` the captures, of the types both branches were compiled for.
            unsafe { run_body(p, arena, ins, cx, results) }
        })
    }
    fn kind(&self) -> &'static str {
        "if"
    }
    fn bodies(&self) -> Vec<&Program> {
        self.branches.iter().collect()
    }
}

/// `Loop(M?, cond?, initial..., captures...)`: the body runs in place; the carried
/// values alternate between two buffers; each iteration's scan outputs are copied into
/// their row of the step's outputs, whose length the lowered types fix.
struct LoopStep {
    body: Program,
    arena: usize,
    trip_count: Option<Slot>,
    cond: Option<Slot>,
    initial: Vec<Slot>,
    captures: Vec<Slot>,
    /// Each carried value's two buffers (arena offsets).
    carried: [Vec<usize>; 2],
    /// The body's iteration number (i64) and condition (bool) parameters.
    iter_at: usize,
    cond_at: usize,
    outs: Vec<Slot>,
}

/// A body's parameters as (dtype, dims) from slots.
fn shapes_of(slots: &[Slot]) -> impl Iterator<Item = (DType, &[usize])> {
    slots.iter().map(|s| (s.dtype, &s.shape[..]))
}

fn build_loop(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let captures_n = usize::try_from(b.node.attrs.int_or("captures", 0)?)
        .map_err(|_| "captures must not be negative")?;
    let Some(initial_end) = b.ins.len().checked_sub(captures_n).filter(|&e| e >= 2) else {
        return Ok(None);
    };
    let (Some(initial), Some(captures)) = (
        b.ins[2..initial_end]
            .iter()
            .cloned()
            .collect::<Option<Vec<_>>>(),
        slots_from(b, initial_end),
    ) else {
        return Ok(None);
    };
    let Some(body) = b.node.attrs.graph("body")? else {
        return Ok(None);
    };
    let n = initial.len();
    let scan_outs = b.outs.len().saturating_sub(n);
    if b.outs.len() < n {
        return Ok(None);
    }
    let mut params: Vec<(DType, &[usize])> = vec![(DType::I64, &[]), (DType::Bool, &[])];
    params.extend(shapes_of(&initial));
    params.extend(shapes_of(&captures));
    let Some(p) = compile_body(b, body, &params)? else {
        return Ok(None);
    };
    // Fixed shapes: each carried result has its initial value's type and the step's, and
    // each scan output's rows have the body's per-iteration type.
    let fits = p.outputs.len() == 1 + n + scan_outs
        && result_is(&p, 0, DType::Bool, &[])
        && (0..n).all(|k| {
            let (i, o) = (&initial[k], &b.outs[k]);
            result_is(&p, 1 + k, i.dtype, &i.shape) && o.dtype == i.dtype && o.shape == i.shape
        })
        && (0..scan_outs).all(|j| {
            let o = &b.outs[n + j];
            !o.shape.is_empty() && result_is(&p, 1 + n + j, o.dtype, &o.shape[1..])
        });
    if !fits {
        return Ok(None);
    }
    let mut layout = Layout::new(b);
    let arena = layout.take(p.arena_bytes)?;
    let mut carried = [vec![], vec![]];
    for half in &mut carried {
        for s in &initial {
            half.push(layout.take(s.bytes())?);
        }
    }
    let iter_at = layout.take(8)?;
    let cond_at = layout.take(1)?;
    layout.finish(b);
    Ok(Some(Box::new(LoopStep {
        body: p,
        arena,
        trip_count: b.input(0).cloned(),
        cond: b.input(1).cloned(),
        initial,
        captures,
        carried,
        iter_at,
        cond_at,
        outs: b.outs.to_vec(),
    })))
}

impl Kernel for LoopStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let n = self.initial.len();
        let trip_count = self.trip_count.as_ref().map(|s| {
            // SAFETY: M is an i64 scalar slot, 8 bytes, read unaligned as inputs may be.
            unsafe { ptr::read_unaligned(cx.ptr(s.loc) as *const i64) }
        });
        // SAFETY: the loop's `cond` operand is a Bool scalar slot, one byte.
        let mut go = self
            .cond
            .as_ref()
            .is_none_or(|s| unsafe { *cx.ptr(s.loc) } != 0);
        // Offsets the layout took in the step's scratch region at build.
        let scratch = |at: usize| cx.arena.wrapping_add(at);
        for (s, &at) in self.initial.iter().zip(&self.carried[0]) {
            // SAFETY: the first carried buffer of initial value s was taken with its
            // s.bytes(), and s's slot holds as many.
            unsafe { copy(cx.ptr(s.loc), scratch(at), s.bytes()) };
        }
        let iter_ptr = scratch(self.iter_at);
        // An iteration runs only while the condition holds: the body sees it true.
        let cond_ptr = scratch(self.cond_at);
        // SAFETY: cond_at is the one byte the layout took for the body's condition.
        unsafe { *cond_ptr = 1 };
        let scan = &self.outs[n..];
        let rows = scan.first().map(|o| o.shape[0]);
        let mut cur = 0;
        let mut i: i64 = 0;
        with_ptrs(2 + n + self.captures.len(), |ins| {
            ins[0] = iter_ptr;
            ins[1] = cond_ptr;
            for (p, s) in ins[2 + n..].iter_mut().zip(&self.captures) {
                *p = cx.ptr(s.loc);
            }
            while go && trip_count.is_none_or(|m| i < m) {
                if trip_count.is_none() && i >= UNBOUNDED_LOOP_LIMIT {
                    return Err(format!(
                        "the loop ran {UNBOUNDED_LOOP_LIMIT} iterations without ending"
                    ));
                }
                let row = usize::try_from(i).map_err(|_| "iteration count overflow")?;
                if rows.is_some_and(|r| row >= r) {
                    return Err(format!(
                        "the loop runs more than the {} iterations its outputs were \
                         lowered for",
                        rows.unwrap_or(0)
                    ));
                }
                // SAFETY: iter_at is the 8 bytes the layout took for the iteration
                // number, at any alignment.
                unsafe { ptr::write_unaligned(iter_ptr as *mut i64, i) };
                for (p, &at) in ins[2..2 + n].iter_mut().zip(&self.carried[cur]) {
                    *p = scratch(at);
                }
                let next = &self.carried[1 - cur];
                let results = |bcx: &Cx<'_>| -> Result<(), String> {
                    let outs = &self.body.outputs;
                    // The body's condition decides the next iteration (like the
                    // reference evaluation, also without a `cond` operand).
                    // SAFETY: the body's first result is a Bool scalar (checked at build).
                    go = unsafe { *bcx.ptr(outs[0].loc) } != 0;
                    for (k, &at) in next.iter().enumerate() {
                        let r = &outs[1 + k];
                        // SAFETY: the other half's buffer of carried value k was taken
                        // with initial k's bytes, which result 1 + k has (build's check).
                        unsafe { copy(bcx.ptr(r.loc), scratch(at), r.bytes()) };
                    }
                    for (o, r) in scan.iter().zip(&outs[1 + n..]) {
                        let bytes = r.bytes();
                        // SAFETY: scan output o is rows × r's shape (build's check) and
                        // row < rows (checked above), so row `row` of it is in bounds.
                        unsafe { copy(bcx.ptr(r.loc), cx.ptr(o.loc).add(row * bytes), bytes) };
                    }
                    Ok(())
                };
                let arena = scratch(self.arena);
                // SAFETY: `arena` holds the body's arena_bytes, and `ins` its parameters:
                // the iteration and condition scalars, this half's carried values and
                // the captures, of the types the body was compiled for.
                unsafe { run_body(&self.body, arena, ins, cx, results) }?;
                cur = 1 - cur;
                i += 1;
            }
            Ok(())
        })?;
        if let Some(r) = rows.filter(|&r| i as usize != r) {
            return Err(format!(
                "the loop ran {i} iterations; its outputs were lowered for {r}"
            ));
        }
        for (o, &at) in self.outs.iter().zip(&self.carried[cur]) {
            // SAFETY: the final carried buffer of output o holds o.bytes(), o having its
            // initial value's type (build's check).
            unsafe { copy(scratch(at), cx.ptr(o.loc), o.bytes()) };
        }
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "loop"
    }
    fn bodies(&self) -> Vec<&Program> {
        vec![&self.body]
    }
}

/// How a scanned tensor is cut: `outer` blocks of `len` rows of `row_bytes` each; row
/// `t` of block `o` starts at byte `(o * len + t) * row_bytes`.
#[derive(Clone, Copy)]
struct Strides {
    outer: usize,
    len: usize,
    row_bytes: usize,
    reverse: bool,
}

impl Strides {
    fn new(shape: &[usize], axis: usize, elem: usize, reverse: bool) -> Option<Strides> {
        let len = *shape.get(axis)?;
        let outer = shape[..axis]
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))?;
        let row_bytes = shape[axis + 1..]
            .iter()
            .try_fold(elem, |a, &d| a.checked_mul(d))?;
        Some(Strides {
            outer,
            len,
            row_bytes,
            reverse,
        })
    }
    /// The row iteration `t` reads or writes.
    fn row(&self, t: usize) -> usize {
        if self.reverse {
            self.len - 1 - t
        } else {
            t
        }
    }
    /// Copies row `t` of every block of `whole` into the packed `slice`, or back when
    /// `into_whole`.
    ///
    /// # Safety
    /// `whole` holds `outer * len * row_bytes` bytes, `slice` `outer * row_bytes`.
    unsafe fn copy_row(&self, whole: *mut u8, slice: *mut u8, t: usize, into_whole: bool) {
        let row = self.row(t);
        for o in 0..self.outer {
            // SAFETY: the caller's contract; `o < outer` and `row < len`.
            unsafe {
                let w = whole.add((o * self.len + row) * self.row_bytes);
                let s = slice.add(o * self.row_bytes);
                if into_whole {
                    copy(s, w, self.row_bytes);
                } else {
                    copy(w, s, self.row_bytes);
                }
            }
        }
    }
}

struct ScanInput {
    slot: Slot,
    strides: Strides,
    /// Where a slice is gathered when it is not contiguous (axis > 0).
    gather_at: Option<usize>,
}

/// `Scan(initial..., scan_inputs..., captures...)`: like a loop whose iteration `t`
/// reads row `t` of each scan input (in place when the scan axis is the leading one)
/// and writes row `t` of each scan output.
struct ScanStep {
    body: Program,
    arena: usize,
    initial: Vec<Slot>,
    scans: Vec<ScanInput>,
    captures: Vec<Slot>,
    carried: [Vec<usize>; 2],
    /// The scan outputs' layouts (after the final state values in `outs`).
    scan_outs: Vec<Strides>,
    len: usize,
    outs: Vec<Slot>,
}

/// Attribute `name` (one entry per `n`), each an axis of a rank in `ranks` normalized, or
/// `default` for all.
fn axes(b: &Build, name: &str, ranks: &[usize]) -> Result<Option<Vec<usize>>, String> {
    let given = b.node.attrs.ints(name)?;
    Ok(ranks
        .iter()
        .enumerate()
        .map(|(k, &rank)| {
            let a = given.map_or(Some(0), |v| v.get(k).copied())?;
            let a = if a < 0 { a + rank as i64 } else { a };
            usize::try_from(a).ok().filter(|&a| a < rank)
        })
        .collect())
}

fn directions(b: &Build, name: &str, n: usize) -> Result<Option<Vec<bool>>, String> {
    let given = b.node.attrs.ints(name)?;
    Ok((0..n)
        .map(|k| given.map_or(Some(0), |v| v.get(k).copied()).map(|d| d == 1))
        .collect())
}

fn build_scan(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let attrs = &b.node.attrs;
    let count = |name| -> Result<usize, String> {
        usize::try_from(attrs.int_or(name, 0)?).map_err(|_| format!("{name} must not be negative"))
    };
    let (scan_n, captures_n) = (count("num_scan_inputs")?, count("captures")?);
    let Some(Some(state_n)) = b
        .ins
        .len()
        .checked_sub(captures_n)
        .map(|e| e.checked_sub(scan_n))
    else {
        return Ok(None);
    };
    let Some(ins) = slots_from(b, 0) else {
        return Ok(None);
    };
    let (initial, rest) = ins.split_at(state_n);
    let (scan_ins, captures) = rest.split_at(scan_n);
    let Some(body) = attrs.graph("body")? else {
        return Ok(None);
    };
    if b.outs.len() < state_n || scan_n == 0 {
        return Ok(None);
    }
    let scan_out_n = b.outs.len() - state_n;
    let in_ranks: Vec<usize> = scan_ins.iter().map(|s| s.shape.len()).collect();
    let out_ranks: Vec<usize> = b.outs[state_n..].iter().map(|s| s.shape.len()).collect();
    let (Some(in_axes), Some(in_dirs), Some(out_axes), Some(out_dirs)) = (
        axes(b, "scan_input_axes", &in_ranks)?,
        directions(b, "scan_input_directions", scan_n)?,
        axes(b, "scan_output_axes", &out_ranks)?,
        directions(b, "scan_output_directions", scan_out_n)?,
    ) else {
        return Ok(None);
    };
    let mut layout = Layout::new(b);
    let mut scans = vec![];
    let mut slice_shapes = vec![];
    for (k, s) in scan_ins.iter().enumerate() {
        let Some(strides) = Strides::new(&s.shape, in_axes[k], s.dtype.size_in_bytes(), in_dirs[k])
        else {
            return Ok(None);
        };
        let mut slice = s.shape.clone();
        slice.remove(in_axes[k]);
        slice_shapes.push(slice);
        scans.push(ScanInput {
            slot: s.clone(),
            strides,
            gather_at: None,
        });
    }
    let len = scans[0].strides.len;
    if scans.iter().any(|s| s.strides.len != len) {
        return Ok(None);
    }
    let mut params: Vec<(DType, &[usize])> = shapes_of(initial).collect();
    params.extend(
        scan_ins
            .iter()
            .zip(&slice_shapes)
            .map(|(s, sh)| (s.dtype, &sh[..])),
    );
    params.extend(shapes_of(captures));
    let Some(p) = compile_body(b, body, &params)? else {
        return Ok(None);
    };
    let mut scan_outs = vec![];
    for (j, o) in b.outs[state_n..].iter().enumerate() {
        let mut row = o.shape.clone();
        let Some(strides) =
            Strides::new(&o.shape, out_axes[j], o.dtype.size_in_bytes(), out_dirs[j])
        else {
            return Ok(None);
        };
        row.remove(out_axes[j]);
        if strides.len != len || !result_is(&p, state_n + j, o.dtype, &row) {
            return Ok(None);
        }
        scan_outs.push(strides);
    }
    let fits = p.outputs.len() == state_n + scan_out_n
        && (0..state_n).all(|k| {
            let (i, o) = (&initial[k], &b.outs[k]);
            result_is(&p, k, i.dtype, &i.shape) && o.dtype == i.dtype && o.shape == i.shape
        });
    if !fits {
        return Ok(None);
    }
    let arena = layout.take(p.arena_bytes)?;
    let mut carried = [vec![], vec![]];
    for half in &mut carried {
        for s in initial {
            half.push(layout.take(s.bytes())?);
        }
    }
    for s in &mut scans {
        if s.strides.outer > 1 {
            s.gather_at = Some(layout.take(s.strides.outer * s.strides.row_bytes)?);
        }
    }
    layout.finish(b);
    Ok(Some(Box::new(ScanStep {
        body: p,
        arena,
        initial: initial.to_vec(),
        scans,
        captures: captures.to_vec(),
        carried,
        scan_outs,
        len,
        outs: b.outs.to_vec(),
    })))
}

impl Kernel for ScanStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let n = self.initial.len();
        let m = self.scans.len();
        // Offsets the layout took in the step's scratch region at build.
        let scratch = |at: usize| cx.arena.wrapping_add(at);
        for (s, &at) in self.initial.iter().zip(&self.carried[0]) {
            // SAFETY: the first carried buffer of state s was taken with its s.bytes(),
            // and s's slot holds as many.
            unsafe { copy(cx.ptr(s.loc), scratch(at), s.bytes()) };
        }
        let mut cur = 0;
        with_ptrs(n + m + self.captures.len(), |ins| {
            for (p, s) in ins[n + m..].iter_mut().zip(&self.captures) {
                *p = cx.ptr(s.loc);
            }
            for t in 0..self.len {
                for (p, &at) in ins[..n].iter_mut().zip(&self.carried[cur]) {
                    *p = scratch(at);
                }
                for (p, s) in ins[n..n + m].iter_mut().zip(&self.scans) {
                    let whole = cx.ptr(s.slot.loc);
                    *p = match s.gather_at {
                        Some(at) => {
                            let slice = scratch(at);
                            // SAFETY: `whole` is the scan input, outer · len · row_bytes
                            // bytes (its Strides), the gather buffer outer · row_bytes.
                            unsafe { s.strides.copy_row(whole, slice, t, false) };
                            slice
                        }
                        // One block: row t's bytes are contiguous, inside the input as
                        // row(t) < len.
                        None => whole.wrapping_add(s.strides.row(t) * s.strides.row_bytes),
                    };
                }
                let next = &self.carried[1 - cur];
                let results = |bcx: &Cx<'_>| -> Result<(), String> {
                    let outs = &self.body.outputs;
                    for (k, &at) in next.iter().enumerate() {
                        let r = &outs[k];
                        // SAFETY: the other half's buffer of state k was taken with
                        // initial k's bytes, which result k has (build's check).
                        unsafe { copy(bcx.ptr(r.loc), scratch(at), r.bytes()) };
                    }
                    for ((o, r), st) in self.outs[n..].iter().zip(&outs[n..]).zip(&self.scan_outs) {
                        // SAFETY: scan output o is outer · len · row_bytes bytes (its
                        // Strides) and result r one row of each block, outer · row_bytes.
                        unsafe { st.copy_row(cx.ptr(o.loc), bcx.ptr(r.loc), t, true) };
                    }
                    Ok(())
                };
                let arena = scratch(self.arena);
                // SAFETY: `arena` holds the body's arena_bytes, and `ins` its parameters:
                // this half's states, row t of each scan input and the captures, of the
                // types the body was compiled for.
                unsafe { run_body(&self.body, arena, ins, cx, results) }?;
                cur = 1 - cur;
            }
            Ok::<(), String>(())
        })?;
        for (o, &at) in self.outs.iter().zip(&self.carried[cur]) {
            // SAFETY: the last-written carried buffer of state output o holds o.bytes(),
            // o having its initial value's type (build's check).
            unsafe { copy(scratch(at), cx.ptr(o.loc), o.bytes()) };
        }
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "scan"
    }
    fn bodies(&self) -> Vec<&Program> {
        vec![&self.body]
    }
}
