//! The reference interpreter: walks the schedule and calls each op's reference `eval`.
//!
//! It is slow on purpose and the numerical oracle for every optimized kernel and pass.
//! Besides computing, it checks at run time what the IR could only promise: inputs match
//! their parameters, each symbol is bound to one size, and every op's result has the
//! dtype and shape its inference declared.
use std::collections::HashMap;
use std::sync::RwLock;

use crate::backend::{check_variable_write, unknown_variable, Backend, Executable};
use crate::error::Result;
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

pub(crate) use crate::ir::eval::run_graph;
