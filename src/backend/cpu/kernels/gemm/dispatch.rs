//! Which routines run: [`Kernel`] bundles one ISA's micro-kernel and packers, and
//! [`kernel_for`] picks them for the requested ISA, capped by what the CPU has.
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use super::{pack, portable, Tile, MR, NR};
use crate::backend::cpu::isa::{self, Isa};

/// An ISA's routines: the micro-kernel (`kc`, packed A micro-panels, packed B
/// micro-panels, the tile of at most `mr`×`nr`), the packer of a full 6-row panel of
/// row-major A (`kc`, A, row stride, destination with 2 floats of slack) and of
/// column-major A (`kc`, A, column stride, destination), and the packers of a full
/// 16-column panel of row-major and of column-major B (`kc`, B, row or column stride,
/// 64-byte-aligned destination).
#[derive(Clone, Copy)]
pub(super) struct Kernel {
    pub(super) micro: unsafe fn(usize, *const f32, *const f32, &Tile),
    /// The largest tile `micro` takes: a multiple of MR rows × a multiple of NR columns
    /// (it reads ⌈mr/MR⌉ adjacent A panels and ⌈nr/NR⌉ adjacent B panels).
    pub(super) mr: usize,
    pub(super) nr: usize,
    pub(super) pack_a_rows: unsafe fn(usize, *const f32, usize, *mut f32),
    pub(super) pack_a_cols: unsafe fn(usize, *const f32, usize, *mut f32),
    pub(super) pack_b_rows: unsafe fn(usize, *const f32, usize, *mut f32),
    pub(super) pack_b_cols: unsafe fn(usize, *const f32, usize, *mut f32),
}

/// The routines `isa` asks for, if this CPU can run them.
pub(super) fn kernel_for(isa: Isa) -> Kernel {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && isa::detected() >= Isa::Avx2 {
        let simd = Kernel {
            micro: avx2_kernel,
            mr: MR,
            nr: NR,
            pack_a_rows: avx2_pack_a_rows,
            pack_a_cols: avx2_pack_a_cols,
            pack_b_rows: avx2_pack_b_rows,
            pack_b_cols: avx2_pack_b_cols,
        };
        if isa >= Isa::Avx512 && isa::detected() >= Isa::Avx512 {
            return Kernel {
                micro: avx512_kernel,
                mr: avx512::MR2,
                nr: avx512::NR2,
                pack_b_rows: avx512_pack_b_rows,
                pack_b_cols: avx512_pack_b_cols,
                ..simd
            };
        }
        return simd;
    }
    let _ = isa;
    Kernel {
        micro: portable::kernel,
        mr: MR,
        nr: NR,
        pack_a_rows: pack::portable_pack_a_rows,
        pack_a_cols: pack::portable_pack_a_cols,
        pack_b_rows: pack::portable_pack_b_rows,
        pack_b_cols: pack::portable_pack_b_cols,
    }
}

/// Wraps an ISA module's `#[target_feature]` routine in a plain `unsafe fn`, the type
/// [`Kernel`] stores; [`kernel_for`] returns it only after checking the CPU.
macro_rules! checked_by_kernel_for {
    ($($name:ident = $isa:ident::$routine:ident($($arg:ident: $ty:ty),*), needs $feature:literal;)*) => {$(
        /// # Safety
        #[doc = concat!("As for [`", stringify!($isa), "::", stringify!($routine),
            "`]; only returned by [`kernel_for`] when the CPU has ", $feature, ".")]
        #[cfg(target_arch = "x86_64")]
        unsafe fn $name($($arg: $ty),*) {
            // SAFETY: kernel_for checked the CPU; the rest is the caller's contract.
            unsafe { $isa::$routine($($arg),*) }
        }
    )*};
}

checked_by_kernel_for! {
    avx2_kernel = avx2::kernel(kc: usize, ap: *const f32, bp: *const f32, t: &Tile), needs "AVX2+FMA";
    avx2_pack_a_rows = avx2::pack_a_rows(kc: usize, a: *const f32, rs: usize, dst: *mut f32), needs "AVX2+FMA";
    avx2_pack_a_cols = avx2::pack_a_cols(kc: usize, a: *const f32, cs: usize, dst: *mut f32), needs "AVX2+FMA";
    avx2_pack_b_rows = avx2::pack_b_rows(kc: usize, b: *const f32, rs: usize, dst: *mut f32), needs "AVX2+FMA";
    avx2_pack_b_cols = avx2::pack_b_cols(kc: usize, b: *const f32, cs: usize, dst: *mut f32), needs "AVX2+FMA";
    avx512_kernel = avx512::kernel(kc: usize, ap: *const f32, bp: *const f32, t: &Tile), needs "AVX-512F";
    avx512_pack_b_rows = avx512::pack_b_rows(kc: usize, b: *const f32, rs: usize, dst: *mut f32), needs "AVX-512F";
    avx512_pack_b_cols = avx512::pack_b_cols(kc: usize, b: *const f32, cs: usize, dst: *mut f32), needs "AVX-512F";
}
