//! Activations applied in kernels' epilogues and fused elementwise loops.
use crate::ir::Attrs;

/// An activation from a fused op's `activation` / `activation_attrs` (see
/// `ir::ops::fused::ACTIVATIONS`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Act {
    None,
    Relu,
    LeakyRelu(f32),
    Sigmoid,
    Tanh,
    /// max(0, min(1, alpha·x + beta))
    HardSigmoid(f32, f32),
    Elu(f32),
    /// x·Φ(x) with the exact (erf) Φ.
    Gelu,
    /// GELU with the tanh approximation.
    GeluTanh,
    Clip(f32, f32),
}

impl Act {
    /// The activation a fused op's attributes name.
    pub fn from_attrs(attrs: &Attrs) -> Result<Act, String> {
        let name = attrs.string_or("activation", "none")?;
        let mut kv = std::collections::HashMap::new();
        for s in attrs.strings("activation_attrs")?.unwrap_or(&[]) {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| format!("activation_attrs: '{s}' is not NAME=VALUE"))?;
            kv.insert(k.to_string(), v.trim_matches('"').to_string());
        }
        let num = |k: &str, default: f32| -> Result<f32, String> {
            kv.get(k).map_or(Ok(default), |v| {
                v.parse()
                    .map_err(|_| format!("activation_attrs: bad {k} '{v}'"))
            })
        };
        Ok(match name {
            "none" => Act::None,
            "Relu" => Act::Relu,
            "LeakyRelu" => Act::LeakyRelu(num("alpha", 0.01)?),
            "Sigmoid" => Act::Sigmoid,
            "Tanh" => Act::Tanh,
            "HardSigmoid" => Act::HardSigmoid(num("alpha", 0.2)?, num("beta", 0.5)?),
            "Elu" => Act::Elu(num("alpha", 1.0)?),
            "Gelu" if kv.get("approximate").map(String::as_str) == Some("tanh") => Act::GeluTanh,
            "Gelu" => Act::Gelu,
            "Clip" => Act::Clip(num("min", f32::NEG_INFINITY)?, num("max", f32::INFINITY)?),
            other => return Err(format!("the CPU backend has no activation '{other}'")),
        })
    }

    /// Applies the activation to every element of `x` in place.
    pub fn apply(self, x: &mut [f32]) {
        match self {
            Act::None => {}
            Act::Relu => x.iter_mut().for_each(|v| *v = v.max(0.0)),
            Act::LeakyRelu(a) => x.iter_mut().for_each(|v| {
                if *v < 0.0 {
                    *v *= a
                }
            }),
            Act::Clip(lo, hi) => x.iter_mut().for_each(|v| *v = v.max(lo).min(hi)),
            Act::Sigmoid => x.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
            Act::Tanh => x.iter_mut().for_each(|v| *v = v.tanh()),
            Act::HardSigmoid(a, b) => x.iter_mut().for_each(|v| *v = (a * *v + b).clamp(0.0, 1.0)),
            Act::Elu(a) => x.iter_mut().for_each(|v| {
                if *v < 0.0 {
                    *v = a * (v.exp() - 1.0)
                }
            }),
            Act::Gelu => x.iter_mut().for_each(|v| {
                *v = 0.5 * *v * (1.0 + libm::erff(*v * std::f32::consts::FRAC_1_SQRT_2))
            }),
            Act::GeluTanh => x.iter_mut().for_each(|v| {
                let u = 0.797_884_6 * (*v + 0.044715 * *v * *v * *v);
                *v = 0.5 * *v * (1.0 + u.tanh())
            }),
        }
    }
}
