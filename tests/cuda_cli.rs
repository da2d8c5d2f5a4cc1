//! `kiln run` and `kiln bench` with `--backend cuda:0`, in either build: without the
//! `cuda` feature a clean "built without CUDA"; with it, on a machine without a usable
//! device, the probe's reason (exit status 1, never a panic); with a device, the same
//! numbers as the cpu backend.
use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use kiln::backend::{device_available, Device};
use kiln::tensor::npy;
use kiln::Tensor;

const AXPY: &str = r#"graph "axpy" {
  %0 "x" = Parameter : f32[N]
  %1 "y" = Parameter : f32[N]
  %2 "a" = Constant : f32[] = [2.0]
  %3 "ax" = Mul(%2, %0) : f32[N]
  %4 "z" = Add(%3, %1) : f32[N]
  return "z" = %4
}
"#;

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("the kiln binary runs")
}

/// What compiling for cuda:0 must fail with here, or None when cuda:0 is usable.
fn expected_failure() -> Option<String> {
    let reason = device_available(Device::Cuda(0)).err()?.to_string();
    if cfg!(feature = "cuda") {
        assert!(!reason.contains("without CUDA"), "{reason}");
    } else {
        assert!(
            reason.contains("cuda:0: Kiln was built without CUDA"),
            "{reason}"
        );
    }
    Some(reason)
}

#[track_caller]
fn assert_clean_failure(o: &Output, reason: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains(&format!("kiln: {reason}")), "stderr: {err}");
    assert!(err.contains("cuda:0"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn run_and_bench_on_cuda_fail_cleanly_or_match_the_cpu() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cuda_cli");
    std::fs::create_dir_all(&dir).unwrap();
    let graph = dir.join("axpy.kir");
    std::fs::write(&graph, AXPY).unwrap();
    let graph = graph.display().to_string();
    let x = dir.join("x.npy");
    npy::write(
        &x,
        &Tensor::from_vec(&[4], vec![1.0f32, -2.0, 3.5, 0.25]).unwrap(),
    )
    .unwrap();
    let x = x.display().to_string();
    let run = |backend: &str| {
        let out = dir.join(backend.replace(':', "_"));
        let o = kiln(&[
            "run",
            &graph,
            "--inputs",
            &x,
            &x,
            "--backend",
            backend,
            "--outputs",
            &out.display().to_string(),
        ]);
        (o, out.join("z.npy"))
    };
    let bench = kiln(&[
        "bench",
        &graph,
        "--shape",
        "N=8",
        "--backend",
        "cuda:0",
        "--iterations",
        "2",
    ]);
    let (cuda, cuda_z) = run("cuda:0");
    match expected_failure() {
        Some(reason) => {
            assert_clean_failure(&cuda, &reason);
            assert_clean_failure(&bench, &reason);
            // The clean failure is checked; the comparison with cpu is what skips.
            common::require(
                common::Need::CudaDevice,
                Err(format!("no CUDA device ({reason}); the CLI failed cleanly")),
            );
        }
        None => {
            let (cpu, cpu_z) = run("cpu");
            for o in [&cpu, &cuda, &bench] {
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            }
            let (a, b) = (npy::read(&cpu_z).unwrap(), npy::read(&cuda_z).unwrap());
            b.check_close(&a, 1e-6, 1e-6).unwrap();
        }
    }
}
