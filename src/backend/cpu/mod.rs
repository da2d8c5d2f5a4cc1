//! The optimizing CPU backend: the pass pipeline, then lowering of the optimized IR to a
//! flat list of kernel calls over one arena laid out by the memory planner.
//!
//! A graph with symbolic input dims is specialized per input-shape signature: the first
//! run with new shapes binds the symbols, runs the pipeline on the now-static graph,
//! plans its memory and lowers it; later runs with those shapes reuse that program.
//! Graphs with state run like any other: the executable owns its variables
//! ([`state::Variables`]); runs that store to them hold the variables exclusively (they
//! are serialized), runs that only read share them.
use std::borrow::Borrow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use crate::backend::inputs::{check_input_types, check_view_types, input_types};
use crate::backend::interp::{self, InterpExecutable};
use crate::backend::specialize::{specialize_for_shapes, static_input_shapes, ProgramCache};
use crate::backend::{Backend, Executable};
use crate::error::{Error, Result};
use crate::ir::{verify, Graph, TensorType};
use crate::passes::CompileOptions;
use crate::tensor::{Tensor, TensorView};

pub(crate) mod by_value;
pub(crate) mod denormals;
pub(crate) mod host;
pub(crate) mod host_program;
pub(crate) mod isa;
pub(crate) mod kernels;
pub(crate) mod lower;
pub(crate) mod peak;
pub(crate) mod pool;
pub(crate) mod profile;
pub(crate) mod program;
pub(crate) mod state;
pub(crate) mod steps;
pub(crate) mod tail;
pub(crate) mod tune;

pub use profile::StepTiming;

use crate::aligned::AlignedBuf;
use lower::Program;
use pool::Pool;
use profile::Profiler;
use program::Cx;
use state::Variables;

/// The CPU backend: the options' passes then lowering; runs use the options' `threads`
/// (0 = one per core); algorithms are chosen per shape as their `tuning` says (see
/// [`tune`]).
pub struct CpuBackend {
    pub options: CompileOptions,
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn compile(&self, graph: &Graph) -> Result<Box<dyn Executable>> {
        Ok(Box::new(self.compile_cpu(graph)?))
    }
}

impl CpuBackend {
    /// The backend for `options`, with the CPU backend's layout unless they set one
    /// ([`crate::backend::cpu_pass_options`]).
    pub fn new(options: CompileOptions) -> CpuBackend {
        CpuBackend {
            options: crate::backend::cpu_pass_options(options),
        }
    }

    /// The executable, as its concrete type.
    pub fn compile_cpu(&self, graph: &Graph) -> Result<CpuExecutable> {
        verify(graph)?;
        isa::cap_from_env().map_err(Error::InvalidArgument)?;
        let profiler = Profiler::new(&self.options.profile)?;
        let traces = profiler.as_ref().is_some_and(Profiler::traces);
        let exe = CpuExecutable {
            graph: graph.clone(),
            variables: RwLock::new(Variables::new(graph)?),
            input_types: input_types(graph),
            options: self.options.clone(),
            pool: if traces {
                Pool::traced(self.options.threads)
            } else {
                Pool::new(self.options.threads)
            },
            programs: ProgramCache::new(),
            arenas: Mutex::new(vec![]),
            profiler,
        };
        // Static inputs: build the one program now, so errors show at compile time.
        if let Some(shapes) = static_input_shapes(graph) {
            exe.program(&shapes)?;
        }
        Ok(exe)
    }
}

/// How one input-shape signature runs: lowered; lowered with a dynamic tail (when the
/// only dynamic types come from ops with data-dependent output shapes, see [`tail`]);
/// one program per value of the small inputs the types depend on ([`by_value`]); or
/// (when some other type stays dynamic, or it holds host objects) node by node on the
/// host ([`host_program`]). The interpreter runs a signature only when the fallback is
/// asked for and none of these can.
pub enum Compiled {
    Program(Program),
    Split(Box<tail::Split>),
    ByValue(Box<by_value::ByValue>),
    Host(Box<host_program::HostProgram>),
    Interp(InterpExecutable),
}

/// One step of a lowered program, as [`CpuExecutable::step_report`] lists it.
#[derive(Clone, Debug)]
pub struct StepInfo {
    /// The node it came from (`node #12 'conv1' (Conv)`).
    pub node: String,
    /// Its kernel (`gemm`, `conv-blocked`, …; `fallback` and `interpreter` run the
    /// reference interpreter's op).
    pub kind: &'static str,
    /// 0 for the program's own steps, 1 for a control-flow body's, and so on.
    pub depth: usize,
}

impl StepInfo {
    /// Whether the step runs the reference interpreter rather than a kernel.
    pub fn is_fallback(&self) -> bool {
        matches!(self.kind, "fallback" | "interpreter")
    }
}

pub struct CpuExecutable {
    /// The verified, unoptimized graph (specialized per signature, then optimized).
    graph: Graph,
    /// The variables' values: read-locked by runs that only read them, write-locked by
    /// runs that store (serialized) and by writes from outside.
    variables: RwLock<Variables>,
    /// The graph inputs' names and types, checked every run.
    input_types: Vec<(String, TensorType)>,
    options: CompileOptions,
    pool: Pool,
    programs: ProgramCache<Compiled>,
    /// Arenas of finished runs, reused by the next ones (one per concurrent run).
    arenas: Mutex<Vec<AlignedBuf>>,
    /// The `profile` option's profiler, if on (see [`profile`]).
    profiler: Option<Profiler>,
}

impl CpuExecutable {
    /// The program for these input shapes, built on first sight.
    pub fn program(&self, shapes: &[Vec<usize>]) -> Result<Arc<Compiled>> {
        self.programs
            .get_or_build(shapes, || self.specialize(shapes))
    }

    /// The kernel kind of each step of the program for these input shapes (`None` when
    /// they run on the interpreter): what tests check to know a kernel, not the
    /// fallback, computed their results.
    pub fn step_kinds(&self, shapes: &[Vec<usize>]) -> Result<Option<Vec<&'static str>>> {
        // Not cached: only shapes that `run` checked have programs in the cache.
        Ok(match self.specialize(shapes)? {
            Compiled::Program(p) => Some(p.steps.iter().map(|s| s.kernel.kind()).collect()),
            c @ (Compiled::Split(_) | Compiled::ByValue(_) | Compiled::Host(_)) => {
                Some(self.report(&c)?.iter().map(|s| s.kind).collect())
            }
            Compiled::Interp(_) => None,
        })
    }

    /// Every step of the program for these input shapes, bodies of control flow
    /// included (after their step, one level deeper): what `kiln compile --report` prints
    /// and what tests check to know no step runs on the interpreter. A signature that
    /// runs on the interpreter as a whole is one step of kind `interpreter`; one compiled
    /// per input value is a `by-value` step followed by the programs runs have made.
    pub fn step_report(&self, shapes: &[Vec<usize>]) -> Result<Vec<StepInfo>> {
        let cached = self.programs.find_by(|s| s == shapes);
        match cached {
            Some(c) => self.report(&c),
            None => self.report(&self.specialize(shapes)?),
        }
    }

    /// [`Self::step_report`] of a compiled signature; a dynamic tail's steps are those
    /// of its program at the sources' bounds.
    pub(super) fn report(&self, compiled: &Compiled) -> Result<Vec<StepInfo>> {
        fn walk(p: &Program, depth: usize, out: &mut Vec<StepInfo>) {
            for s in &p.steps {
                out.push(StepInfo {
                    node: s.node.to_string(),
                    kind: s.kernel.kind(),
                    depth,
                });
                for body in s.kernel.bodies() {
                    walk(body, depth + 1, out);
                }
            }
        }
        let mut out = vec![];
        match compiled {
            Compiled::Program(p) => walk(p, 0, &mut out),
            Compiled::Split(s) => {
                walk(&s.head, 0, &mut out);
                for src in &s.sources {
                    out.push(StepInfo {
                        node: src.node.to_string(),
                        kind: src.kernel.kind(),
                        depth: 0,
                    });
                }
                let extents = s.bound_extents();
                let shapes: Vec<Vec<usize>> = (0..s.tail_inputs.len())
                    .map(|k| s.tail_dims(k, &extents))
                    .collect();
                out.extend(self.report(&self.specialize_graph(&s.tail, &shapes)?)?);
            }
            // The programs of the values seen so far.
            Compiled::ByValue(b) => {
                out.push(StepInfo {
                    node: format!(
                        "graph '{}' (a program per value of its small integer inputs)",
                        self.graph.name
                    ),
                    kind: "by-value",
                    depth: 0,
                });
                for p in b.programs() {
                    let steps = self.report(&p)?;
                    out.extend(steps.into_iter().map(|s| StepInfo {
                        depth: s.depth + 1,
                        ..s
                    }));
                }
            }
            Compiled::Host(h) => h.report(self, 0, &mut out)?,
            Compiled::Interp(_) => out.push(StepInfo {
                node: format!(
                    "graph '{}' (a type stays dynamic or holds host objects)",
                    self.graph.name
                ),
                kind: "interpreter",
                depth: 0,
            }),
        }
        Ok(out)
    }

    /// Each node's measured time per run since the last `restart_profile`, by node id,
    /// when compiled with the `profile` option (else empty): what the plan view shows.
    pub fn step_times(&self) -> Vec<StepTiming> {
        self.profiler
            .as_ref()
            .map_or_else(Vec::new, Profiler::step_times)
    }

    fn specialize(&self, shapes: &[Vec<usize>]) -> Result<Compiled> {
        self.specialize_graph(&self.graph, shapes)
    }

    /// `graph` (this executable's, or a dynamic tail) compiled for input `shapes`.
    fn specialize_graph(&self, graph: &Graph, shapes: &[Vec<usize>]) -> Result<Compiled> {
        self.specialize_with(graph, shapes, true, true)
    }

    /// [`Self::specialize_graph`], keyed by input values (`by_value`) where the types
    /// depend on small inputs, else a host program where `host` (not for a graph of one
    /// node that a host program makes: it has no other way to run).
    fn specialize_with(
        &self,
        graph: &Graph,
        shapes: &[Vec<usize>],
        by_value: bool,
        host: bool,
    ) -> Result<Compiled> {
        let g = specialize_for_shapes(graph, shapes, &self.options)?;
        Ok(if runs_on_host(&g) {
            match tail::split(&g, Some(&self.pool), &self.options)? {
                Some(s) => Compiled::Split(Box::new(s)),
                None => {
                    let dynamic = g
                        .nodes()
                        .iter()
                        .any(|n| n.outputs.iter().any(|t| !t.is_static()));
                    let keyed = (by_value && dynamic)
                        .then(|| by_value::ByValue::new(graph, &g, shapes, host))
                        .flatten();
                    match keyed {
                        Some(k) => Compiled::ByValue(Box::new(k)),
                        None if host => match host_program::HostProgram::new(self, g.clone()) {
                            Ok(h) => Compiled::Host(Box::new(h)),
                            Err(_) if self.options.allow_fallback => {
                                Compiled::Interp(InterpExecutable::new(g)?)
                            }
                            Err(e) => return Err(e),
                        },
                        None if !self.options.allow_fallback => return Err(interp_refused(&g)),
                        None => Compiled::Interp(InterpExecutable::new(g)?),
                    }
                }
            }
        } else {
            let vars = self.variables.read().unwrap_or_else(|e| e.into_inner());
            match lower::lower(&g, Some(&self.pool), &vars, &self.options) {
                Ok(p) => Compiled::Program(p),
                // A control-flow body that cannot be one program (its trip counts or
                // shapes settle only as it runs) runs through a host program's If or Loop.
                Err(e) if host && has_control_flow(&g) => {
                    drop(vars);
                    match host_program::HostProgram::new(self, g) {
                        Ok(h) => Compiled::Host(Box::new(h)),
                        Err(_) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        })
    }

    /// Runs a signature on the inputs' bytes where they are (a copy only for a
    /// non-contiguous tensor); the pointers on the stack for the usual few inputs.
    fn run_compiled<T: Borrow<Tensor>>(
        &self,
        compiled: &Compiled,
        inputs: &[T],
    ) -> Result<Vec<Tensor>> {
        match compiled {
            Compiled::Interp(e) => {
                let owned: Vec<Tensor> = inputs.iter().map(|t| t.borrow().clone()).collect();
                return self.run_interp(e, &owned);
            }
            Compiled::Host(h) => return self.run_host(h, inputs),
            Compiled::ByValue(b) => {
                let p = b.program(inputs, |g| {
                    self.specialize_with(g, &b.shapes, false, b.host)
                })?;
                return self.run_compiled(&p, inputs);
            }
            _ => {}
        }
        let mut copies = vec![];
        self.run_in_place(compiled, inputs.len(), |i| {
            match inputs[i].borrow().bytes_view() {
                Some(v) => v.bytes().as_ptr(),
                None => {
                    copies.push(inputs[i].borrow().to_le_bytes());
                    copies.last().expect("just pushed").as_ptr()
                }
            }
        })
    }

    /// Runs `compiled` (a program, not the interpreter) on `n` inputs whose elements
    /// `input(i)` points to, in place.
    fn run_in_place(
        &self,
        compiled: &Compiled,
        n: usize,
        mut input: impl FnMut(usize) -> *const u8,
    ) -> Result<Vec<Tensor>> {
        const FEW: usize = 8;
        let mut few = [std::ptr::null(); FEW];
        let many: Vec<*const u8>;
        let ptrs: &[*const u8] = if n <= FEW {
            for (i, slot) in few.iter_mut().enumerate().take(n) {
                *slot = input(i);
            }
            &few[..n]
        } else {
            many = (0..n).map(input).collect();
            &many
        };
        match compiled {
            Compiled::Program(p) => self.run_program(p, ptrs),
            Compiled::Split(s) => self.run_split(s, ptrs),
            Compiled::Interp(_) | Compiled::ByValue(_) | Compiled::Host(_) => {
                unreachable!("run above")
            }
        }
    }

    /// An arena of at least `bytes`, a finished run's when one is free.
    fn take_arena(&self, bytes: usize) -> Result<AlignedBuf> {
        let mut free = self.arenas.lock().unwrap_or_else(|e| e.into_inner());
        match free.iter().position(|a| a.len() >= bytes) {
            Some(i) => Ok(free.swap_remove(i)),
            None => AlignedBuf::try_zeroed(bytes),
        }
    }

    fn give_back_arena(&self, arena: AlignedBuf) {
        self.arenas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(arena);
    }

    /// Runs `p`'s steps under `cx`, through the profiler when there is one.
    fn run_steps(&self, p: &Program, cx: &Cx) -> Result<()> {
        let run = |step: &program::Step| {
            // SAFETY: the arena has the program's size and the inputs its types (checked).
            unsafe { step.kernel.run(cx) }
                .map_err(|e| Error::Runtime(format!("{}: {e}", step.node)))
        };
        match &self.profiler {
            None => p.steps.iter().try_for_each(run),
            Some(profiler) => profiler.run(&p.steps, &self.pool, run),
        }
    }

    fn run_program(&self, p: &Program, ptrs: &[*const u8]) -> Result<Vec<Tensor>> {
        let mut arena = self.take_arena(p.arena_bytes)?;
        // A run that stores holds the variables alone from its first read to its commit.
        let reads;
        let mut stores = None;
        let vars: &Variables = if p.stores.is_empty() {
            reads = self.variables.read().unwrap_or_else(|e| e.into_inner());
            &reads
        } else {
            stores.insert(self.variables.write().unwrap_or_else(|e| e.into_inner()))
        };
        let cx = Cx {
            arena: arena.as_mut_ptr(),
            inputs: ptrs,
            state: vars.ptrs(),
            pool: Some(&self.pool),
        };
        let flush = denormals::FlushDenormals::new();
        let result = self.run_steps(p, &cx);
        drop(flush);
        let outputs = result.and_then(|()| {
            p.outputs
                .iter()
                // SAFETY: output slots lie in the arena, the inputs or the constants.
                .map(|s| unsafe { read_output(&cx, s) })
                .collect()
        });
        if let (Ok(_), Some(vars)) = (&outputs, stores.as_deref_mut()) {
            vars.commit(&p.swaps);
        }
        self.give_back_arena(arena);
        outputs
    }

    /// A run of a split signature: the head, the sources, then the tail's program for
    /// the extents they report (compiled on first sight), reading the head's arena.
    fn run_split(&self, s: &tail::Split, ptrs: &[*const u8]) -> Result<Vec<Tensor>> {
        let mut arena = self.take_arena(s.arena_bytes)?;
        let cx = Cx {
            arena: arena.as_mut_ptr(),
            inputs: ptrs,
            state: &[],
            pool: Some(&self.pool),
        };
        let result = self.run_split_in(s, &cx);
        self.give_back_arena(arena);
        result
    }

    fn run_split_in(&self, s: &tail::Split, cx: &Cx) -> Result<Vec<Tensor>> {
        let flush = denormals::FlushDenormals::new();
        self.run_steps(&s.head, cx)?;
        let mut extents = [0; tail::MAX_SOURCES];
        let mut found = 0;
        let run = |src: &tail::SourceStep| {
            // SAFETY: the arena has the split's size and the inputs their types.
            extents[found] = unsafe { src.kernel.run(cx) }
                .map_err(|e| Error::Runtime(format!("{}: {e}", src.node)))?;
            found += 1;
            Ok(())
        };
        match &self.profiler {
            None => s.sources.iter().try_for_each(run)?,
            Some(profiler) => profiler.run(&s.sources, &self.pool, run)?,
        }
        drop(flush);
        let extents = &extents[..s.sources.len()];
        let n = s.tail_inputs.len();
        let found = s.tails.find_by(|shapes| {
            shapes.len() == n
                && shapes
                    .iter()
                    .enumerate()
                    .all(|(k, shape)| s.tail_input_is(k, shape, extents))
        });
        let tail = match found {
            Some(t) => t,
            None => {
                let shapes: Vec<Vec<usize>> = (0..n).map(|k| s.tail_dims(k, extents)).collect();
                s.tails.get_or_build(&shapes, || {
                    self.specialize_with(&s.tail, &shapes, false, true)
                })?
            }
        };
        let mut ptrs = [std::ptr::null(); tail::MAX_TAIL_INPUTS];
        for (input, p) in s.tail_inputs.iter().zip(&mut ptrs) {
            *p = match input {
                tail::TailInput::Head(slot) => cx.ptr(slot.loc) as *const u8,
                tail::TailInput::Source(j, k) => {
                    cx.ptr(s.sources[*j].outs[*k].slot.loc) as *const u8
                }
            };
        }
        let ptrs = &ptrs[..n];
        let mut tail_outs = match &*tail {
            Compiled::Program(p) => self.run_program(p, ptrs)?,
            Compiled::Split(t) => self.run_split(t, ptrs)?,
            Compiled::ByValue(_) => unreachable!("a tail is compiled without value keys"),
            Compiled::Interp(_) | Compiled::Host(_) => {
                let inputs = (0..n)
                    .map(|k| {
                        let slot = program::Slot {
                            loc: program::Loc::Input(k),
                            dtype: s.tail.node(s.tail.inputs()[k]).outputs[0].dtype,
                            shape: s.tail_dims(k, extents),
                        };
                        let tail_cx = Cx {
                            inputs: ptrs,
                            ..*cx
                        };
                        // SAFETY: the pointer addresses the value the slot describes.
                        unsafe { steps::fallback::read(&tail_cx, &slot) }.map_err(Error::Runtime)
                    })
                    .collect::<Result<Vec<_>>>()?;
                self.run_compiled(&tail, &inputs)?
            }
        };
        s.outputs
            .iter()
            .map(|o| match o {
                // SAFETY: head slots lie in the arena, the inputs or the constants.
                tail::Output::Head(slot) => unsafe { read_output(cx, slot) },
                tail::Output::Tail(k) => Ok(std::mem::replace(
                    &mut tail_outs[*k],
                    Tensor::zeros(crate::ir::DType::F32, &[0]),
                )),
            })
            .collect()
    }
}

impl CpuExecutable {
    /// A run of a signature whose types stay dynamic, on the interpreter, over this
    /// executable's variables (copied in and, when it stores, back).
    fn run_interp(&self, e: &InterpExecutable, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let g = e.graph();
        let var_ids: Vec<_> = g
            .node_ids()
            .filter(|&id| g.node(id).op == "Variable")
            .collect();
        if var_ids.is_empty() {
            return e.run(inputs);
        }
        let mut vars = self.variables.write().unwrap_or_else(|e| e.into_inner());
        let values = var_ids
            .iter()
            .map(|&id| Ok((id, vars.read(vars.index(&g.node(id).name)?)?)))
            .collect::<Result<HashMap<_, _>>>()?;
        let (outs, updates) = interp::run_graph(g, e.schedule(), inputs, &values)?;
        let updates: Vec<(&str, &Tensor)> = updates
            .iter()
            .map(|(&id, t)| (g.node(id).name.as_str(), t))
            .collect();
        vars.write(&updates)?;
        Ok(outs)
    }
}

impl Drop for CpuExecutable {
    fn drop(&mut self) {
        if let Some(profiler) = &self.profiler {
            profiler.print_at_exit(self.pool.threads());
        }
    }
}

/// Why `g` (a signature [`runs_on_host`]) is refused without the fallback: its first
/// node whose type stays dynamic or holds host objects.
fn interp_refused(g: &Graph) -> Error {
    let first = g.nodes().iter().enumerate().find(|(_, n)| {
        n.outputs
            .iter()
            .any(|t| !t.is_static() || t.is_host_object())
    });
    let what = match first {
        Some((i, n)) => format!(
            "{} gives {}",
            g.describe(crate::ir::NodeId(i as u32)),
            n.outputs
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => "a type".into(),
    };
    Error::Graph(format!(
        "no cpu program for graph '{}': {what}, a type known only at run time or a host object (KILN_ALLOW_FALLBACK=1 runs the signature on the reference interpreter)",
        g.name
    ))
}

/// Whether a specialized graph (or body) runs on the host, node by node, rather than as a
/// lowered program: strings, sequences and optionals are host objects with no bytes in an
/// arena, and a shape that stays dynamic has no place in a plan.
/// So does one with a control-flow body that holds host objects (a body's dynamic dims
/// are its own to settle when it is lowered).
pub(crate) fn runs_on_host(g: &Graph) -> bool {
    g.nodes().iter().any(|n| {
        n.outputs
            .iter()
            .any(|t| !t.is_static() || t.is_host_object())
    }) || has_host_bodies(g)
}

fn has_control_flow(g: &Graph) -> bool {
    g.nodes()
        .iter()
        .any(|n| matches!(n.op.as_str(), "If" | "Loop" | "Scan"))
}

/// Whether some control-flow body of `g`, at any depth, holds host objects.
pub(crate) fn has_host_bodies(g: &Graph) -> bool {
    fn holds(g: &Graph) -> bool {
        g.nodes()
            .iter()
            .any(|n| n.outputs.iter().any(TensorType::is_host_object) || bodies(n).any(holds))
    }
    fn bodies(n: &crate::ir::Node) -> impl Iterator<Item = &Graph> {
        n.attrs.iter().filter_map(|(_, a)| match a {
            crate::ir::Attr::Graph(b) => Some(&**b),
            _ => None,
        })
    }
    g.nodes().iter().flat_map(bodies).any(holds)
}

/// The value in output slot `s`, copied out.
///
/// # Safety
/// `s` must address `s.bytes()` readable bytes under `cx` (a slot of the program `cx`
/// ran).
unsafe fn read_output(cx: &Cx, s: &program::Slot) -> Result<Tensor> {
    if s.dtype == crate::ir::DType::F32 {
        let p = cx.ptr(s.loc) as *const f32;
        // SAFETY: an f32 slot's s.bytes() are s.elements() floats, readable (the contract).
        let v = unsafe { std::slice::from_raw_parts(p, s.elements()) }.to_vec();
        return Tensor::from_vec(&s.shape, v).map_err(Error::Runtime);
    }
    // SAFETY: the slot's s.bytes() are readable under `cx`, as fallback::read needs.
    unsafe { steps::fallback::read(cx, s) }.map_err(Error::Runtime)
}

impl Executable for CpuExecutable {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        // A cached program's shapes passed the full check when it was made: with them,
        // only the dtypes are left to check (no allocation).
        let dtypes_match = || {
            inputs.len() == self.input_types.len()
                && self
                    .input_types
                    .iter()
                    .zip(inputs)
                    .all(|((_, ty), t)| ty.dtype == t.dtype())
        };
        let program = match self.programs.find(inputs) {
            Some(p) if dtypes_match() => p,
            _ => {
                check_input_types(&self.input_types, inputs)?;
                let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
                self.program(&shapes)?
            }
        };
        self.run_compiled(&program, inputs)
    }

    fn run_views(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Tensor>> {
        // The program for these shapes (built on a first run, after the views pass the
        // full check) reads the views in place; anything else (a mismatch to report, the
        // interpreter's fallback, low-bit codes to normalize) takes the checked path on
        // copies.
        let fits = inputs.len() == self.input_types.len()
            && (self.input_types.iter().zip(inputs))
                .all(|((_, ty), v)| ty.dtype == v.dtype() && v.readable_in_place());
        let cached = self.programs.find_by(|shapes| {
            shapes.len() == inputs.len() && shapes.iter().zip(inputs).all(|(s, v)| s == v.shape())
        });
        let program = match cached {
            None if fits => {
                check_view_types(&self.input_types, inputs)?;
                let shapes: Vec<Vec<usize>> = inputs.iter().map(|v| v.shape().to_vec()).collect();
                Some(self.program(&shapes)?)
            }
            cached => cached,
        };
        match program {
            Some(p)
                if fits
                    && !matches!(
                        *p,
                        Compiled::Interp(_) | Compiled::ByValue(_) | Compiled::Host(_)
                    ) =>
            {
                self.run_in_place(&p, inputs.len(), |i| inputs[i].bytes().as_ptr())
            }
            _ => {
                let owned = (inputs.iter().zip(&self.input_types))
                    .map(|(v, (name, _))| {
                        v.to_tensor()
                            .map_err(|e| Error::InvalidArgument(format!("input '{name}': {e}")))
                    })
                    .collect::<Result<Vec<_>>>()?;
                self.run(&owned)
            }
        }
    }

    fn variables(&self) -> Vec<(String, TensorType)> {
        self.variables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .list
            .clone()
    }

    fn read_variable(&self, name: &str) -> Result<Tensor> {
        let vars = self.variables.read().unwrap_or_else(|e| e.into_inner());
        vars.read(vars.index(name)?)
    }

    fn read_variables(&self) -> Result<Vec<(String, Tensor)>> {
        let vars = self.variables.read().unwrap_or_else(|e| e.into_inner());
        (0..vars.len())
            .map(|k| Ok((vars.list[k].0.clone(), vars.read(k)?)))
            .collect()
    }

    fn write_variables(&self, values: &[(&str, &Tensor)]) -> Result<()> {
        self.variables
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .write(values)
    }

    fn take_profile(&self, all: bool) -> Option<String> {
        self.profiler.as_ref()?.take_table(self.pool.threads(), all)
    }

    fn restart_profile(&self) {
        if let Some(p) = &self.profiler {
            p.restart();
        }
    }
}
