//! Denormal floats flushed to zero while kernels run. A product or sum with a
//! denormal operand or result takes a microcode assist on x86 (tens to hundreds of
//! cycles): training drives gradients and Adam's moments towards zero, where a step
//! without flushing ran several times slower (`bench/RESULTS.md`). Kiln's CPU kernels treat

//! denormals as zero (MXCSR's FTZ and DAZ bits): results differ from IEEE only below
//! 1.2e-38 in f32.

/// FTZ (bit 15) and DAZ (bit 6) of MXCSR.
#[cfg(target_arch = "x86_64")]
const FLUSH: u32 = (1 << 15) | (1 << 6);

/// Sets flush-to-zero for the current thread and restores the previous mode on drop.
pub struct FlushDenormals {
    #[cfg(target_arch = "x86_64")]
    saved: u32,
}

impl FlushDenormals {
    pub(crate) fn new() -> FlushDenormals {
        #[cfg(target_arch = "x86_64")]
        {
            let saved = mxcsr();
            set_mxcsr(saved | FLUSH);
            FlushDenormals { saved }
        }
        #[cfg(not(target_arch = "x86_64"))]
        FlushDenormals {}
    }
}

impl Default for FlushDenormals {
    fn default() -> Self {
        FlushDenormals::new()
    }
}

impl Drop for FlushDenormals {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        set_mxcsr(self.saved);
    }
}

#[cfg(target_arch = "x86_64")]
fn mxcsr() -> u32 {
    let mut v: u32 = 0;
    // SAFETY: stores the 4-byte MXCSR register into `v`.
    unsafe {
        std::arch::asm!("stmxcsr [{}]", in(reg) &mut v, options(nostack, preserves_flags));
    }
    v
}

#[cfg(target_arch = "x86_64")]
fn set_mxcsr(v: u32) {
    // SAFETY: loads MXCSR from `v`, which came from `stmxcsr` with only the FTZ/DAZ
    // bits changed (no reserved bit is set).
    unsafe {
        std::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack, readonly, preserves_flags));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushes_while_held_and_restores() {
        let tiny = std::hint::black_box(1e-39f32); // a denormal
        let half = std::hint::black_box(0.5f32);
        assert!(tiny * half > 0.0, "IEEE by default");
        {
            let _flush = FlushDenormals::new();
            assert_eq!(std::hint::black_box(tiny) * half, 0.0);
        }
        assert!(std::hint::black_box(tiny) * half > 0.0, "restored");
    }
}
