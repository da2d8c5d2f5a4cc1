//! The GPU-less check of generated CUDA code: every kernel compiled to PTX by NVRTC for
//! compute_80 and compute_90, then assembled by `ptxas` for sm_80 and sm_90. Needs
//! NVRTC on the loader's path and ptxas at `KILN_PTXAS` (or on PATH): both come from
//! `eval "$(scripts/cuda-tools.sh)"`. Without them the tests skip through
//! `common::require` (`KILN_REQUIRE=cuda-tools` makes that a failure).
#![cfg(feature = "cuda")]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use std::collections::HashMap;

use kiln::frontend::onnx;
use kiln::internals::cuda::{codegen, nvrtc};
use kiln::ir::text;
use kiln::passes::{run_pipeline, CompileOptions};
use kiln::{Error, Graph};

use common::{require, test_graphs_and_real_models, Need};

/// ptxas, when NVRTC and ptxas are both here (`Need::CudaTools`).
fn tools() -> Option<PathBuf> {
    let ptxas = std::env::var_os("KILN_PTXAS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("ptxas"));
    let found =
        nvrtc::available().and_then(|()| match Command::new(&ptxas).arg("--version").output() {
            Ok(o) if o.status.success() => Ok(()),
            _ => Err(format!(
                "no ptxas at {} (set KILN_PTXAS; scripts/cuda-tools.sh prints it)",
                ptxas.display()
            )),
        });
    require(Need::CudaTools, found).then_some(ptxas)
}

/// One kernel to check: its entry point and CUDA C source.
struct Kernel {
    entry: String,
    source: String,
}

/// The kernels to check: every template instantiated once, then every kernel the
/// generator emits for the test graphs and (when `scripts/test-onnx-models.sh` wrote
/// them) the real models, optimized as the CUDA backend compiles them.
fn kernels() -> Vec<Kernel> {
    let mut out: Vec<Kernel> = codegen::template_samples()
        .into_iter()
        .map(|k| Kernel {
            entry: k.entry,
            source: k.source,
        })
        .collect();
    for (path, dims) in test_graphs_and_real_models() {
        let g = optimized(&path, &dims);
        let kernels =
            codegen::kernels_for_graph(&g).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for (_, k) in kernels {
            out.push(Kernel {
                // Entries are unique within a graph only.
                entry: k.entry,
                source: k.source,
            });
        }
    }
    out
}

/// Imported, specialized to `dims`, optimized by the default pipeline without layout
/// blocking (as the CUDA backend runs it).
fn optimized(path: &Path, dims: &[(&str, usize)]) -> Graph {
    let mut g = if path.extension().is_some_and(|e| e == "kir") {
        text::parse_file(path).unwrap()
    } else {
        onnx::import_file(path).unwrap()
    };
    let bindings: HashMap<String, usize> = dims.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let unbound = g.specialize(&bindings).unwrap();
    assert!(
        unbound.is_empty(),
        "{}: unbound {unbound:?}",
        path.display()
    );
    run_pipeline(&mut g, &CompileOptions::default()).unwrap();
    g
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
    let Some(ptxas_path) = tools() else {
        return;
    };
    let mut kernels = kernels();
    // The same source twice (a template reached by several graphs) is checked once.
    let mut seen = std::collections::HashSet::new();
    kernels.retain(|k| seen.insert(k.source.clone()));
    let mut failures = vec![];
    for (i, k) in kernels.iter().enumerate() {
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
            if let Err(log) = ptxas(&ptxas_path, &ptx, &format!("{i}_{}", k.entry), sm) {
                failures.push(format!("kernel {}: ptxas -arch={sm}:\n{log}", k.entry));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    println!("nvrtc+ptxas: {} kernels, sm_80 and sm_90", kernels.len());
    assert!(
        kernels.len() > 20,
        "only {} kernels: the generator emitted almost nothing",
        kernels.len()
    );
}

#[test]
fn a_rejected_kernel_names_its_entry_and_carries_the_log() {
    if tools().is_none() {
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
    if tools().is_none() {
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
