//! The variables a CPU executable owns. Each has two buffers: its current value, which
//! runs read, and the buffer its next value is computed into by a run that stores to it
//! (the memory planner puts the stored value there instead of in the arena). A run that
//! succeeds swaps the two for every variable it stored to, so a failed run leaves the
//! variables as they were and storing costs no copy. A variable the plan lets a run
//! update in place (its last reader computes its next value over it) is written in its
//! current buffer, and not swapped; lowering allows that only when no step after the
//! first such update can fail, so a failed run still stores nothing.
use super::program::Loc;
use crate::aligned::AlignedBuf;
use crate::backend::{check_variable_write, unknown_variable};
use crate::error::{Error, Result};
use crate::ir::{Graph, TensorType};
use crate::tensor::Tensor;

pub struct Variables {
    /// Names and (static) types, in graph order; the index is the variable's number.
    pub list: Vec<(String, TensorType)>,
    bytes: Vec<usize>,
    _buffers: Vec<AlignedBuf>,
    /// `[current of 0..n, next of 0..n]`: what [`Loc::State`] indexes.
    ptrs: Vec<*mut u8>,
}

// SAFETY: the pointers are into `_buffers`, which the struct owns; the executable
// guards access with a lock (runs that store hold it exclusively).
unsafe impl Send for Variables {}
// SAFETY: a run that writes through `ptrs` (one that stores) holds the executable's lock
// exclusively, so threads sharing a `&Variables` only read the buffers.
unsafe impl Sync for Variables {}

impl Variables {
    /// The variables of `g` with their initial values.
    pub(crate) fn new(g: &Graph) -> Result<Variables> {
        let mut vars = Variables {
            list: vec![],
            bytes: vec![],
            _buffers: vec![],
            ptrs: vec![],
        };
        let mut next = vec![];
        for id in g.node_ids().filter(|&id| g.node(id).op == "Variable") {
            let node = g.node(id);
            let t = node.data.as_deref().expect("verified");
            if !node.outputs[0].is_static() {
                return Err(Error::Graph(format!(
                    "{}: a variable's shape must be static",
                    g.describe(id)
                )));
            }
            let bytes = t.to_le_bytes();
            let mut current = AlignedBuf::try_from_bytes(&bytes)?;
            let mut spare = AlignedBuf::try_zeroed(bytes.len())?;
            vars.ptrs.push(current.as_mut_ptr());
            next.push(spare.as_mut_ptr());
            vars._buffers.push(current);
            vars._buffers.push(spare);
            vars.bytes.push(bytes.len());
            vars.list.push((node.name.clone(), node.outputs[0].clone()));
        }
        vars.ptrs.extend(next);
        Ok(vars)
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// The number of the variable `name`.
    pub(crate) fn index(&self, name: &str) -> Result<usize> {
        self.list
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| unknown_variable(name, &self.list))
    }

    /// Where variable `k`'s current value is.
    pub(crate) fn current(&self, k: usize) -> Loc {
        Loc::State(k)
    }

    /// Where a run computes variable `k`'s next value.
    pub(crate) fn next(&self, k: usize) -> Loc {
        Loc::State(self.len() + k)
    }

    /// The buffers, as a run's context indexes them.
    pub(crate) fn ptrs(&self) -> &[*mut u8] {
        &self.ptrs
    }

    /// Makes the next values of `stored` (variable numbers) current.
    pub(crate) fn commit(&mut self, stored: &[usize]) {
        let n = self.len();
        for &k in stored {
            self.ptrs.swap(k, n + k);
        }
    }

    pub(crate) fn read(&self, k: usize) -> Result<Tensor> {
        let ty = &self.list[k].1;
        let shape = ty.static_dims().expect("static, checked in new");
        // SAFETY: the current buffer holds `bytes[k]` initialized bytes.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptrs[k], self.bytes[k]) };
        Tensor::from_le_bytes(ty.dtype, &shape, bytes).map_err(Error::Runtime)
    }

    /// Checks every write, then does them all (or none).
    pub(crate) fn write(&mut self, values: &[(&str, &Tensor)]) -> Result<()> {
        let mut checked = Vec::with_capacity(values.len());
        for &(name, value) in values {
            let k = self.index(name)?;
            check_variable_write(name, &self.list[k].1, value)?;
            checked.push((k, value.to_le_bytes()));
        }
        for (k, bytes) in checked {
            // SAFETY: the check made the value exactly the variable's size.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptrs[k], bytes.len()) };
        }
        Ok(())
    }
}
