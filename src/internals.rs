//! Kiln's internals, re-exported for the crate's own benches, tests and fuzz targets:
//! NOT a stable API. Anything here may change or vanish in any release; an embedder uses
//! the rest of the crate or the C ABI.
//!
//! The backends' modules are crate-private, so that nothing outside the crate comes to
//! depend on them; what a bench or test must reach (a kernel to time, the CUDA generator
//! to check on the host) is re-exported here, and nowhere else.

/// The CPU backend's kernels, thread pool and ISA dispatch.
pub mod cpu {
    pub use crate::backend::cpu::isa::{isa, Isa};
    #[cfg(feature = "openblas")]
    pub use crate::backend::cpu::kernels::blas;
    pub use crate::backend::cpu::kernels::{adam, conv, gemm, rnn, Act};
    pub use crate::backend::cpu::pool::Pool;
}

/// The buffer arenas and packed constants are allocated in (huge pages when large), for
/// benches that time a kernel on the memory a compiled model would give it.
pub use crate::aligned::AlignedBuf;

/// The CUDA kernel generator (host-checkable without a GPU) and NVRTC.
pub mod cuda {
    /// The CUDA C the backend generates, and its host emulation.
    pub mod codegen {
        pub use crate::backend::cuda::codegen::{
            emulation, kernel_for_node, kernels_for_graph, samples, template_samples,
            GeneratedKernel, KernelParam,
        };
    }

    /// Compiling CUDA C to PTX.
    #[cfg(feature = "cuda")]
    pub mod nvrtc {
        pub use crate::backend::cuda::nvrtc::{available, compile_ptx, ARCHES};
    }
}

/// This machine's single-core f32 FMA peak, measured in the calling process: what the
/// benchmarks report their kernels' throughput against.
pub mod peak {
    pub use crate::backend::cpu::peak::fma_gflops;
    #[cfg(target_arch = "x86_64")]
    pub use crate::backend::cpu::peak::{fma256_gflops, fma512_gflops};
}
