//! The GPU-less check of generated CUDA code: every kernel compiled to PTX by NVRTC for
//! compute_80 and compute_90, then assembled by `ptxas` for sm_80 and sm_90. Needs
//! NVRTC on the loader's path and ptxas at `KILN_PTXAS` (or on PATH): both come from
//! `eval "$(scripts/cuda-tools.sh)"`. Without them the tests fail under CI=true and say
//! SKIPPED otherwise.
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use kiln::backend::cuda::nvrtc;
use kiln::Error;

/// The tools, or why not (then fails under CI=true, else prints SKIPPED).
fn tools(test: &str) -> Option<PathBuf> {
    let ptxas = std::env::var_os("KILN_PTXAS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("ptxas"));
    let why = match nvrtc::available() {
        Err(why) => Some(why),
        Ok(()) => match Command::new(&ptxas).arg("--version").output() {
            Ok(o) if o.status.success() => None,
            _ => Some(format!(
                "no ptxas at {} (set KILN_PTXAS; scripts/cuda-tools.sh prints it)",
                ptxas.display()
            )),
        },
    };
    match why {
        None => Some(ptxas),
        Some(why) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: {why}"
            );
            println!("{test}: SKIPPED: {why}");
            None
        }
    }
}

/// One kernel to check: its entry point and CUDA C source.
struct Kernel {
    entry: String,
    source: String,
}

/// The kernels to check.
///
/// Until the generator (src/backend/cuda/codegen) is on this branch, these are two
/// hand-written kernels shaped like its output (an elementwise chain, and a row
/// reduction through shared memory); with it, this becomes `codegen::template_samples()`
/// plus `codegen::kernels_for_graph` over tests/graphs and the real models.
fn kernels() -> Vec<Kernel> {
    let add_relu = r#"
extern "C" __global__ void k0_add_relu(const float* __restrict__ a, const float* __restrict__ b,
                                       float* __restrict__ out, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { float v = a[i] + b[i]; out[i] = v > 0.0f ? v : 0.0f; }
}
"#;
    let row_sum = r#"
extern "C" __global__ void k1_row_sum(const float* __restrict__ x, float* __restrict__ out,
                                      unsigned cols) {
  extern __shared__ float partial[];
  const float* row = x + (unsigned long long)blockIdx.x * cols;
  float acc = 0.0f;
  for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) acc += row[c];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}
"#;
    vec![
        Kernel {
            entry: "k0_add_relu".into(),
            source: add_relu.into(),
        },
        Kernel {
            entry: "k1_row_sum".into(),
            source: row_sum.into(),
        },
    ]
}

fn scratch() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cuda_nvrtc");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Assembles `ptx` for `sm` with ptxas; the error is ptxas's output.
fn ptxas(ptxas: &Path, ptx: &str, entry: &str, sm: &str) -> Result<(), String> {
    let dir = scratch();
    let input = dir.join(format!("{entry}.{sm}.ptx"));
    std::fs::write(&input, ptx).unwrap();
    let out = Command::new(ptxas)
        .arg(format!("-arch={sm}"))
        .arg(&input)
        .arg("-o")
        .arg(dir.join(format!("{entry}.{sm}.cubin")))
        .output()
        .map_err(|e| format!("{}: {e}", ptxas.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn every_kernel_compiles_with_nvrtc_and_assembles_with_ptxas() {
    let Some(ptxas_path) = tools("nvrtc+ptxas") else {
        return;
    };
    let kernels = kernels();
    let mut failures = vec![];
    for k in &kernels {
        for (arch, sm) in nvrtc::ARCHES.iter().zip(["sm_80", "sm_90"]) {
            let ptx = match nvrtc::compile_ptx(&k.entry, &k.source, arch, &[]) {
                Ok(ptx) => ptx,
                Err(e) => {
                    failures.push(format!("{e}\n--- source ---\n{}", k.source));
                    continue;
                }
            };
            assert!(
                ptx.contains(&format!(".target {sm}")) && ptx.contains(&k.entry),
                "{}: PTX for {arch} lacks `.target {sm}` or the entry",
                k.entry
            );
            if let Err(log) = ptxas(&ptxas_path, &ptx, &k.entry, sm) {
                failures.push(format!("kernel {}: ptxas -arch={sm}:\n{log}", k.entry));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    println!("nvrtc+ptxas: {} kernels, sm_80 and sm_90", kernels.len());
}

#[test]
fn a_rejected_kernel_names_its_entry_and_carries_the_log() {
    if tools("nvrtc errors").is_none() {
        return;
    }
    let bad = "extern \"C\" __global__ void k7_broken(float* out) { out[0] = undeclared_thing; }";
    let err = nvrtc::compile_ptx("k7_broken", bad, "compute_80", &[]).unwrap_err();
    let Error::Compile(msg) = &err else {
        panic!("expected Error::Compile, got {err:?}");
    };
    assert!(msg.contains("k7_broken"), "{msg}");
    assert!(
        msg.contains("undeclared_thing"),
        "the NVRTC log is missing: {msg}"
    );
    let bad_option = nvrtc::compile_ptx(
        "k8_ok",
        "extern \"C\" __global__ void k8_ok() {}",
        "compute_80",
        &["--no-such-option".to_string()],
    );
    assert!(
        matches!(&bad_option, Err(Error::Compile(m)) if m.contains("k8_ok")),
        "{bad_option:?}"
    );
}

#[test]
fn programs_are_compiled_once_per_source_arch_and_options() {
    if tools("nvrtc cache").is_none() {
        return;
    }
    // A source no other test uses, so that the counts are this test's own.
    let src = "extern \"C\" __global__ void k9_cache(float* o) { o[threadIdx.x] = 9.0f; }";
    let first = nvrtc::compile_ptx("k9_cache", src, "compute_80", &[]).unwrap();
    let again = nvrtc::compile_ptx("k9_cache", src, "compute_80", &[]).unwrap();
    assert!(
        Arc::ptr_eq(&first, &again),
        "the second compile was not cached"
    );
    let other_arch = nvrtc::compile_ptx("k9_cache", src, "compute_90", &[]).unwrap();
    assert!(!Arc::ptr_eq(&first, &other_arch));
    assert!(other_arch.contains(".target sm_90"));
    let fast = ["--use_fast_math".to_string()];
    let other_opts = nvrtc::compile_ptx("k9_cache", src, "compute_80", &fast).unwrap();
    assert!(!Arc::ptr_eq(&first, &other_opts));
}
