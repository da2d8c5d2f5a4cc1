//! Shorthands for code that builds graphs (optimizers, training layers, gradients,
//! generated samples): one call per value, constants under fresh names.
use super::{Attrs, DType, Graph, Value};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

impl Graph {
    /// Adds an unnamed `op` on `inputs`; returns its first output.
    pub fn apply(&mut self, op: &str, inputs: &[Value], attrs: Attrs) -> Result<Value> {
        Ok(self.op(op, inputs, attrs, "")?.into())
    }

    /// As [`Graph::apply`], with optional inputs (`None`: an absent one).
    pub fn apply_opt(&mut self, op: &str, inputs: &[Option<Value>], attrs: Attrs) -> Result<Value> {
        Ok(self.add_op(op, inputs, attrs, "")?.into())
    }

    /// A scalar constant of `dtype` holding `v` (converted as a cast would), named after
    /// `base`.
    pub fn scalar(&mut self, base: &str, dtype: DType, v: f64) -> Result<Value> {
        let t = Tensor::from_f64s(dtype, &[], &[v]).map_err(Error::Graph)?;
        let name = self.fresh_name(base);
        Ok(self.add_constant_value(&name, t)?.into())
    }

    /// A 1-D i64 constant (axes, shapes, pads), named after `base`.
    pub fn ints(&mut self, base: &str, v: &[i64]) -> Result<Value> {
        let t = Tensor::from_vec(&[v.len()], v.to_vec()).map_err(Error::Graph)?;
        let name = self.fresh_name(base);
        Ok(self.add_constant_value(&name, t)?.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Shape, TensorType};

    #[test]
    fn builds_values_and_named_constants() {
        let mut g = Graph::new("g");
        let x: Value = g
            .add_parameter("x", TensorType::new(DType::F32, Shape::fixed(&[2, 3])))
            .unwrap()
            .into();
        let two = g.scalar("c", DType::F32, 2.0).unwrap();
        let again = g.scalar("c", DType::F32, 2.0).unwrap();
        assert_eq!(g.node(two.node).name, "c");
        assert_eq!(g.node(again.node).name, "c.1");
        let y = g.apply("Mul", &[x, two], Attrs::new()).unwrap();
        let axes = g.ints("axes", &[1]).unwrap();
        let s = g
            .apply_opt("ReduceSum", &[Some(y), Some(axes)], Attrs::new())
            .unwrap();
        assert_eq!(g.value_type(s).unwrap().static_dims(), Some(vec![2, 1]));
        assert_eq!(
            g.node(axes.node).data.as_deref().unwrap().to_i64_vec(),
            vec![1]
        );
        let e = g.apply("Mul", &[x, axes], Attrs::new()).unwrap_err();
        assert!(e.to_string().contains("Mul"), "{e}");
    }
}
