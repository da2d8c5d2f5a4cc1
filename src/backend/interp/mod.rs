//! The reference interpreter: walks the schedule and calls each op's reference `eval`.
//!
//! It is slow on purpose and the numerical oracle for every optimized kernel and pass.
//! Besides computing, it checks at run time what the IR could only promise: inputs match
//! their parameters, each symbol is bound to one size, and every op's result has the
//! dtype and shape its inference declared.
use std::collections::HashMap;
use std::sync::RwLock;

use crate::backend::inputs::{bind, check_input_types, input_types};
use crate::backend::{check_variable_write, unknown_variable, Backend, Executable};
use crate::error::{Error, Result};
use crate::ir::ops::{self, EvalCtx};
use crate::ir::{verify, Graph, NodeId, TensorType};
use crate::tensor::Tensor;

/// The interpreter backend: it runs the graph exactly as given. It knows nothing of the
/// pass pipeline, so it can check it: to interpret an optimized graph, run
/// `passes::run_pipeline` on it first and compile the result here.
#[derive(Default)]
pub struct Interpreter;

impl Backend for Interpreter {
    fn name(&self) -> &'static str {
        "interp"
    }

    fn compile(&self, graph: &Graph) -> Result<Box<dyn Executable>> {
        Ok(Box::new(InterpExecutable::new(graph.clone())?))
    }
}

/// A verified graph plus its variables' current values.
pub struct InterpExecutable {
    graph: Graph,
    schedule: Vec<NodeId>,
    /// Whether any node assigns; such runs hold the variables' write lock throughout, so
    /// they are serialized, while read-only runs share the read lock.
    assigns: bool,
    variables: RwLock<HashMap<NodeId, Tensor>>,
}

impl InterpExecutable {
    pub fn new(graph: Graph) -> Result<InterpExecutable> {
        verify(&graph)?;
        let schedule = graph.schedule()?;
        let variables = graph
            .node_ids()
            .filter(|&id| graph.node(id).op == "Variable")
            .map(|id| {
                (
                    id,
                    graph.node(id).data.as_deref().expect("verified").clone(),
                )
            })
            .collect();
        let assigns = graph.nodes().iter().any(|n| n.op == "Assign");
        Ok(InterpExecutable {
            graph,
            schedule,
            assigns,
            variables: RwLock::new(variables),
        })
    }

    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }

    pub(crate) fn schedule(&self) -> &[NodeId] {
        &self.schedule
    }

    fn variable_id(&self, name: &str) -> Result<NodeId> {
        self.graph
            .find(name)
            .filter(|&id| self.graph.node(id).op == "Variable")
            .ok_or_else(|| unknown_variable(name, &self.variables()))
    }
}

impl Executable for InterpExecutable {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        if !self.assigns {
            let vars = self.variables.read().unwrap_or_else(|e| e.into_inner());
            return run_graph(&self.graph, &self.schedule, inputs, &vars).map(|(outs, _)| outs);
        }
        let mut vars = self.variables.write().unwrap_or_else(|e| e.into_inner());
        let (outs, updates) = run_graph(&self.graph, &self.schedule, inputs, &vars)?;
        // Stores land only when the whole run succeeded.
        vars.extend(updates);
        Ok(outs)
    }

    fn variables(&self) -> Vec<(String, TensorType)> {
        self.graph
            .nodes()
            .iter()
            .filter(|n| n.op == "Variable")
            .map(|n| (n.name.clone(), n.outputs[0].clone()))
            .collect()
    }

    fn read_variable(&self, name: &str) -> Result<Tensor> {
        let id = self.variable_id(name)?;
        let vars = self.variables.read().unwrap_or_else(|e| e.into_inner());
        Ok(vars[&id].clone())
    }

    fn read_variables(&self) -> Result<Vec<(String, Tensor)>> {
        let vars = self.variables.read().unwrap_or_else(|e| e.into_inner());
        Ok(self
            .graph
            .node_ids()
            .filter(|&id| self.graph.node(id).op == "Variable")
            .map(|id| (self.graph.node(id).name.clone(), vars[&id].clone()))
            .collect())
    }

    fn write_variables(&self, values: &[(&str, &Tensor)]) -> Result<()> {
        let mut checked = Vec::with_capacity(values.len());
        for &(name, value) in values {
            let id = self.variable_id(name)?;
            check_variable_write(name, &self.graph.node(id).outputs[0], value)?;
            checked.push((id, value.clone()));
        }
        let mut vars = self.variables.write().unwrap_or_else(|e| e.into_inner());
        vars.extend(checked);
        Ok(())
    }
}

/// The variables' new values by node, from a run's `Assign`s.
pub type Updates = HashMap<NodeId, Tensor>;

/// Runs `graph` once (it must be verified) over the variable values `vars`; returns the
/// outputs and what its `Assign`s stored. A Variable node reads before any `Assign` to it
/// (the `Assign` consumes it), so every read in a run sees the value the run started
/// with; when several `Assign`s store to one variable, the last in the schedule wins.
pub(crate) fn run_graph(
    graph: &Graph,
    schedule: &[NodeId],
    inputs: &[Tensor],
    vars: &HashMap<NodeId, Tensor>,
) -> Result<(Vec<Tensor>, Updates)> {
    let mut symbols = check_inputs(graph, inputs)?;
    let params = graph.inputs();
    let mut inputs_by_node: HashMap<NodeId, &Tensor> = params.iter().copied().zip(inputs).collect();
    let mut values: HashMap<NodeId, Vec<Tensor>> = HashMap::new();
    let mut updates = Updates::new();
    for &id in schedule {
        let node = graph.node(id);
        let outs = match node.op.as_str() {
            "Parameter" => vec![inputs_by_node
                .remove(&id)
                .expect("every parameter has an input")
                .clone()],
            "Constant" => vec![node.data.as_deref().expect("verified").clone()],
            "Variable" => vec![vars[&id].clone()],
            "Assign" => {
                let target = node.inputs[0].expect("verified").node;
                let v = node.inputs[1].expect("verified");
                updates.insert(target, values[&v.node][v.output as usize].clone());
                vec![]
            }
            _ => {
                let op = graph
                    .op_impl(&node.op)
                    .ok_or_else(|| Error::Runtime(format!("{}: unknown op", graph.describe(id))))?;
                let args: Vec<Option<&Tensor>> = node
                    .inputs
                    .iter()
                    .map(|v| v.map(|v| &values[&v.node][v.output as usize]))
                    .collect();
                let types: Vec<Option<&TensorType>> = node
                    .inputs
                    .iter()
                    .map(|v| v.map(|v| &graph.node(v.node).outputs[v.output as usize]))
                    .collect();
                let cx = EvalCtx {
                    inputs: &args,
                    input_types: &types,
                    attrs: &node.attrs,
                };
                let outs = ops::custom::contain(&op, || ops::evaluate(&*op, &cx))
                    .map_err(|e| Error::Runtime(format!("{}: {e}", graph.describe(id))))?;
                if outs.len() != node.outputs.len() {
                    return Err(Error::Runtime(format!(
                        "{}: produced {} outputs, its type says {}",
                        graph.describe(id),
                        outs.len(),
                        node.outputs.len()
                    )));
                }
                for (i, (t, ty)) in outs.iter().zip(&node.outputs).enumerate() {
                    bind(ty, t, &mut symbols).map_err(|e| {
                        Error::Runtime(format!("{}: output {i}: {e}", graph.describe(id)))
                    })?;
                }
                outs
            }
        };
        values.insert(id, outs);
    }
    let outs = graph
        .outputs()
        .iter()
        .map(|o| values[&o.value.node][o.value.output as usize].clone())
        .collect();
    Ok((outs, updates))
}

/// Checks `inputs` against the graph's parameters (count, dtype, rank, fixed sizes, one
/// size per symbol); returns the symbols' sizes.
fn check_inputs(graph: &Graph, inputs: &[Tensor]) -> Result<HashMap<String, usize>> {
    check_input_types(&input_types(graph), inputs)
}
