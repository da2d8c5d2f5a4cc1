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
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

/// The best instruction set this CPU has.
pub fn detected() -> Isa {
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

/// The instruction set the kernels use: the detected one, capped by `KILN_CPU_ISA`.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let cap = match std::env::var("KILN_CPU_ISA").as_deref() {
            Ok("portable") => Isa::Portable,
            Ok("avx2") => Isa::Avx2,
            _ => Isa::Avx512,
        };
        detected().min(cap)
    })
}
