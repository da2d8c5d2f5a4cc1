//! Which vector instructions the kernels use, detected once per process.
//!
//! `KILN_CPU_ISA=portable|avx2|avx512` caps the choice (never raises it above what the
//! CPU has), so every path can be forced and tested on one machine.
use std::sync::OnceLock;

/// Instruction sets the kernels have paths for, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust the compiler may auto-vectorize for the baseline target.
    Portable,
    /// AVX2 with FMA: 8 f32 lanes, 16 vector registers.
    Avx2,
    /// AVX-512F: 16 f32 lanes, 32 vector registers.
    Avx512,
}

impl Isa {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

/// The best instruction set this CPU has.
pub(crate) fn detected() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// The cap a `KILN_CPU_ISA` value names, in any case.
fn parse_cap(value: &str) -> Result<Isa, String> {
    [Isa::Portable, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .find(|isa| isa.name().eq_ignore_ascii_case(value.trim()))
        .ok_or_else(|| {
            format!("KILN_CPU_ISA is '{value}'; it must be portable, avx2 or avx512 (or unset)")
        })
}

/// The cap `KILN_CPU_ISA` sets (`None` when unset), or an error for a value that names
/// no instruction set. Compiling for the CPU checks it, so a typo is never ignored.
pub(crate) fn cap_from_env() -> Result<Option<Isa>, String> {
    match std::env::var("KILN_CPU_ISA") {
        Ok(v) => parse_cap(&v).map(Some),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err("KILN_CPU_ISA is not UTF-8; it must be portable, avx2 or avx512".into())
        }
    }
}

/// The instruction set the kernels use: the detected one, capped by `KILN_CPU_ISA` (a
/// bad value, which compiling reports, caps nothing here).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let cap = cap_from_env().ok().flatten().unwrap_or(Isa::Avx512);
        detected().min(cap)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_isa_values_are_read_in_any_case_and_typos_are_errors() {
        assert_eq!(parse_cap("avx2"), Ok(Isa::Avx2));
        assert_eq!(parse_cap("AVX2"), Ok(Isa::Avx2));
        assert_eq!(parse_cap("Portable "), Ok(Isa::Portable));
        assert_eq!(parse_cap("AVX512"), Ok(Isa::Avx512));
        for bad in ["foo", "", "avx", "sse4"] {
            let e = parse_cap(bad).unwrap_err();
            assert!(
                e.contains(&format!("'{bad}'")) && e.contains("avx512"),
                "{e}"
            );
        }
    }
}
