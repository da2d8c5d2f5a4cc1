//! The `kiln` binary end to end: every subcommand, and every kind of bad input giving a
//! clear message and exit status 1 (never a panic, which would exit 101).
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln::tensor::npy;
use kiln::Tensor;

const AXPY: &str = r#"graph "axpy" {
  %0 "x" = Parameter : f32[N]
  %1 "y" = Parameter : f32[N]
  %2 "a" = Constant : f32[] = [2.0]
  %3 "ax" = Mul(%2, %0) : f32[N]
  %4 "z" = Add(%3, %1) : f32[N]
  return "z" = %4, "ax" = %3
}
"#;

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("the kiln binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh scratch directory for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("cli")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn write_npy(dir: &Path, name: &str, t: &Tensor) -> String {
    let path = dir.join(name);
    npy::write(&path, t).unwrap();
    path.display().to_string()
}

fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

/// Asserts a clean failure: exit status 1 and `needles` all in stderr.
#[track_caller]
fn assert_fails(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "stderr: {err}\nstdout: {}",
        stdout(o)
    );
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[track_caller]
fn assert_ok(o: &Output) {
    assert!(o.status.success(), "stderr: {}", stderr(o));
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/graphs")
}

#[test]
fn ops_lists_the_catalogue_one_op_a_line() {
    let o = kiln(&["ops"]);
    assert_ok(&o);
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    let n = kiln::ir::ops::catalogue().len();
    assert_eq!(lines.last(), Some(&format!("{n} ops").as_str()));
    assert_eq!(lines.len(), n + 1);
    assert!(n >= 70, "the catalogue has {n} ops");
    assert!(out.contains("Clip(input, min?, max?) -> (output)"), "{out}");
}

#[test]
fn ops_by_family_and_verbose() {
    let o = kiln(&["ops", "--family", "elementwise", "-v"]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(out.contains("[elementwise]"));
    assert!(!out.contains("Parameter"));
    assert_fails(
        &kiln(&["ops", "--family", "nope"]),
        &["unknown op family 'nope'"],
    );
}

#[test]
fn check_summarizes_a_valid_graph() {
    let dir = scratch("check_ok");
    let f = write(&dir, "axpy.kir", AXPY);
    let o = kiln(&["check", &f]);
    assert_ok(&o);
    assert!(
        stdout(&o).contains("graph \"axpy\" is valid: 5 nodes; inputs: x f32[N], y f32[N]; outputs: z f32[N], ax f32[N]"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn print_is_canonical() {
    let dir = scratch("print");
    let f = write(&dir, "axpy.kir", &AXPY.replace("  %", "    %"));
    let o = kiln(&["print", &f]);
    assert_ok(&o);
    assert_eq!(stdout(&o), AXPY);
}

#[test]
fn run_writes_each_output_as_npy() {
    let dir = scratch("run");
    let f = write(&dir, "axpy.kir", AXPY);
    let x = write_npy(&dir, "x.npy", &f32s(&[3], &[1.0, 2.0, 3.0]));
    let y = write_npy(&dir, "y.npy", &f32s(&[3], &[0.5, 0.5, -1.0]));
    let out = dir.join("out");
    let o = kiln(&[
        "run",
        &f,
        "--inputs",
        &x,
        &y,
        "--outputs",
        out.to_str().unwrap(),
        "--print",
    ]);
    assert_ok(&o);
    let z = npy::read(&out.join("z.npy")).unwrap();
    assert_eq!(z, f32s(&[3], &[2.5, 4.5, 5.0]));
    let ax = npy::read(&out.join("ax.npy")).unwrap();
    assert_eq!(ax, f32s(&[3], &[2.0, 4.0, 6.0]));
    assert!(
        stdout(&o).contains("z = f32[3] [2.5, 4.5, 5]"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn run_takes_inputs_by_name() {
    let dir = scratch("run_named");
    let f = write(&dir, "axpy.kir", AXPY);
    let x = write_npy(&dir, "x.npy", &f32s(&[2], &[1.0, 2.0]));
    let y = write_npy(&dir, "y.npy", &f32s(&[2], &[10.0, 20.0]));
    let o = kiln(&[
        "run",
        &f,
        "--input",
        &format!("y={y}"),
        "--input",
        &format!("x={x}"),
        "--print",
    ]);
    assert_ok(&o);
    assert!(stdout(&o).contains("z = f32[2] [12, 24]"), "{}", stdout(&o));
    let o = kiln(&["run", &f, "--input", &format!("w={x}")]);
    assert_fails(&o, &["no input of that name", "x, y"]);
    let o = kiln(&["run", &f, "--input", &format!("x={x}")]);
    assert_fails(&o, &["input 'y' is missing"]);
    let o = kiln(&["run", &f, "--input", "x"]);
    assert_fails(&o, &["expected NAME=PATH"]);
}

#[test]
fn run_the_demo_mlp() {
    let dir = scratch("mlp");
    let g = examples().join("mlp.kir");
    let x = examples().join("mlp_input.npy");
    let o = kiln(&[
        "run",
        g.to_str().unwrap(),
        "--inputs",
        x.to_str().unwrap(),
        "--outputs",
        dir.to_str().unwrap(),
    ]);
    assert_ok(&o);
    // numpy: relu(x @ w1 + b1) @ w2 + b2, then softmax over the last axis.
    let logits = f32s(
        &[2, 3],
        &[
            -0.07328575,
            -0.01069925,
            0.00598498,
            -0.19024849,
            0.17226802,
            -0.6483835,
        ],
    );
    let probs = f32s(
        &[2, 3],
        &[
            0.31775448, 0.33827716, 0.3439684, 0.32579625, 0.46814996, 0.20605376,
        ],
    );
    let got = npy::read(&dir.join("logits.npy")).unwrap();
    got.check_close(&logits, 1e-6, 1e-5).unwrap();
    let got = npy::read(&dir.join("probs.npy")).unwrap();
    got.check_close(&probs, 1e-6, 1e-5).unwrap();
}

#[test]
fn run_rejects_wrong_inputs() {
    let dir = scratch("run_bad");
    let f = write(&dir, "axpy.kir", AXPY);
    let x = write_npy(&dir, "x.npy", &f32s(&[3], &[1.0, 2.0, 3.0]));
    let y2 = write_npy(&dir, "y2.npy", &f32s(&[2], &[1.0, 2.0]));
    let xi = write_npy(
        &dir,
        "xi.npy",
        &Tensor::from_vec(&[3], vec![1i64, 2, 3]).unwrap(),
    );
    assert_fails(
        &kiln(&["run", &f, "--inputs", &x]),
        &["takes 2 inputs (x, y), 1 given"],
    );
    assert_fails(
        &kiln(&["run", &f, "--inputs", &xi, &x]),
        &["input 'x'", "f32[N]", "i64"],
    );
    assert_fails(
        &kiln(&["run", &f, "--inputs", &x, &y2]),
        &["input 'y'", "symbol N is 3"],
    );
    let missing = dir.join("nope.npy").display().to_string();
    assert_fails(&kiln(&["run", &f, "--inputs", &x, &missing]), &["nope.npy"]);
    let junk = write(&dir, "junk.npy", "not an npy file");
    assert_fails(&kiln(&["run", &f, "--inputs", &x, &junk]), &["junk.npy"]);
    assert_ok(&kiln(&["run", &f, "--inputs", &x, &x, "--backend", "cpu"]));
    let o = kiln(&["run", &f, "--inputs", &x, &x, "--backend", "cuda:0"]);
    // tests/cuda_cli.rs checks the reason in either build.
    assert_fails(&o, &["cuda:0"]);
    let o = kiln(&["run", &f, "--inputs", &x, &x, "--backend", "tpu"]);
    assert_fails(&o, &["unknown device 'tpu'"]);
}

#[test]
fn check_reports_malformed_text_with_line_and_column() {
    let dir = scratch("malformed");
    let f = write(
        &dir,
        "bad.kir",
        "graph \"g\" {\n  %0 \"x\" = Parameter : f32[2]\n  %1 \"y\" Relu(%0) : f32[2]\n}\n",
    );
    assert_fails(&kiln(&["check", &f]), &["bad.kir:3:"]);
    let f = write(
        &dir,
        "cut.kir",
        "graph \"g\" {\n  %0 \"x\" = Parameter : f32[2",
    );
    assert_fails(&kiln(&["check", &f]), &["cut.kir:2:"]);
    let f = write(&dir, "binary.kir", "\u{0}\u{1}\u{2}garbage");
    assert_fails(&kiln(&["check", &f]), &["binary.kir:1:"]);
    let missing = dir.join("missing.kir").display().to_string();
    assert_fails(&kiln(&["check", &missing]), &["missing.kir"]);
}

#[test]
fn check_reports_graph_errors_by_node() {
    let dir = scratch("graph_errors");
    let head = "graph \"g\" {\n  %0 \"x\" = Parameter : f32[2, 3]\n";
    let cases: &[(&str, &[&str])] = &[
        (
            "  %1 \"f\" = Frobnicate(%0) : f32[2, 3]\n",
            &["Frobnicate", ":3:"],
        ),
        (
            "  %1 \"r\" = Relu(%0) {alpha = 1.0} : f32[2, 3]\n",
            &["unknown attribute 'alpha'", "'r'"],
        ),
        ("  %1 \"r\" = Relu(%0) : f32[3, 2]\n", &["'r'", "f32[2, 3]"]),
        (
            "  %1 \"c\" = Constant : f32[2] = [1.0, 2.0]\n  %2 \"s\" = Add(%0, %1) : f32[2, 3]\n",
            &["'s'", "dims 3 and 2"],
        ),
    ];
    for (i, (body, needles)) in cases.iter().enumerate() {
        let text = format!("{head}{body}  return \"y\" = %1\n}}\n");
        let f = write(&dir, &format!("case{i}.kir"), &text);
        assert_fails(&kiln(&["check", &f]), needles);
    }
}

#[test]
fn check_reports_mismatched_axis_names() {
    let dir = scratch("axis_names");
    let text = "graph \"g\" {\n  %0 \"a\" = Parameter : f32[B:2, C:3]\n  %1 \"b\" = Parameter : f32[B:2, D:3]\n  %2 \"s\" = Add(%0, %1) : f32[B:2, C:3]\n  return \"y\" = %2\n}\n";
    let f = write(&dir, "names.kir", text);
    assert_fails(&kiln(&["check", &f]), &["'C'", "'D'", "'s'"]);
}

#[test]
fn npy_prints_a_file_of_every_dtype() {
    let dir = scratch("npy");
    // Strings have no numeric values to give (their .npy is unicode, tested on its own).
    for dtype in kiln::DType::ALL.into_iter().filter(|d| !d.is_string()) {
        let t = Tensor::from_f64s(dtype, &[2, 2], &[1.0, 0.0, 1.0, 1.0]).unwrap();
        let f = write_npy(&dir, &format!("{dtype}.npy"), &t);
        let o = kiln(&["npy", &f]);
        assert_ok(&o);
        let want = if dtype == kiln::DType::Bool {
            format!("{dtype}[2, 2] [true, false, true, true]")
        } else if dtype == kiln::DType::F8E8M0 {
            // A power of two with no zero: 0 becomes the smallest, 2^-127.
            format!("{dtype}[2, 2] [1, {}, 1, 1]", 2f32.powi(-127))
        } else {
            format!("{dtype}[2, 2] [1, 0, 1, 1]")
        };
        assert_eq!(stdout(&o).trim(), want);
    }
    let half = Tensor::from_f64s(kiln::DType::F8E4M3FN, &[2], &[0.5, -448.0]).unwrap();
    let f = write_npy(&dir, "half.npy", &half);
    assert_eq!(
        stdout(&kiln(&["npy", &f])).trim(),
        "f8e4m3fn[2] [0.5, -448]"
    );
    let long = write_npy(&dir, "long.npy", &f32s(&[40], &[0.5; 40]));
    assert!(stdout(&kiln(&["npy", &long])).contains("(24 more)"));
    assert!(!stdout(&kiln(&["npy", &long, "--full"])).contains("more"));
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(kiln(&["frob"]).status.code(), Some(2));
    assert_eq!(kiln(&["run"]).status.code(), Some(2));
    assert!(kiln(&["--version"]).status.success());
}

#[test]
fn onnx_models_check_print_info_and_run() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/scale_relu.onnx");
    let m = model.to_str().unwrap();
    let o = kiln(&["info", m]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(
        out.contains("input  x f32[N, 3]")
            && out.contains("ops    Constant 1, Mul 1, Parameter 1, Relu 1"),
        "{out}"
    );
    assert!(out.contains("parameters 3 "), "{out}");
    assert_ok(&kiln(&["check", m]));
    assert!(stdout(&kiln(&["print", m])).contains("%2 \"scale\" = Mul(%1, %0) : f32[N, 3]"));
    let dir = scratch("onnx_run");
    let x = write_npy(&dir, "x.npy", &f32s(&[1, 3], &[1.0, 1.0, -1.0]));
    let o = kiln(&["run", m, "--inputs", &x, "--print"]);
    assert_ok(&o);
    assert!(
        stdout(&o).contains("y = f32[1, 3] [1, 2, 0]"),
        "{}",
        stdout(&o)
    );
    let bad = write(&dir, "bad.onnx", "this is not protobuf");
    assert_fails(
        &kiln(&["info", &bad]),
        &["bad.onnx", "not a valid ONNX model"],
    );
}

#[test]
fn passes_lists_the_registry_and_the_default_pipeline() {
    let o = kiln(&["passes"]);
    assert_ok(&o);
    let out = stdout(&o);
    for p in ["constant-fold", "fuse-epilogue", "fuse-elementwise", "dce"] {
        assert!(out.contains(p), "{out}");
    }
    assert!(out.contains("default pipeline: canonicalize,"), "{out}");
}

#[test]
fn compile_optimizes_dumps_and_reports_memory() {
    let dir = scratch("compile");
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/graphs/convnet.kir");
    let model = model.to_str().unwrap();
    let (json, svg, kir, dumps) = (
        dir.join("mem.json"),
        dir.join("mem.svg"),
        dir.join("out.kir"),
        dir.join("dumps"),
    );
    let o = kiln(&[
        "compile",
        model,
        "--shape",
        "N=2",
        "--dump-ir",
        "after-all",
        "--dump-ir-dir",
        dumps.to_str().unwrap(),
        "--pass-timing",
        "--memory-report",
        json.to_str().unwrap(),
        "--memory-chart",
        svg.to_str().unwrap(),
        "-o",
        kir.to_str().unwrap(),
    ]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(
        out.contains("FusedConv 1") && out.contains("memory naive"),
        "{out}"
    );
    // The timing table goes to stderr, one line per pass.
    assert!(stderr(&o).contains("fuse-epilogue"), "{}", stderr(&o));
    let report = std::fs::read_to_string(&json).unwrap();
    for key in [
        "\"naive_bytes\"",
        "\"planned_bytes\"",
        "\"lower_bound_bytes\"",
        "\"steps\"",
    ] {
        assert!(report.contains(key), "{report}");
    }
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    let dumped = std::fs::read_dir(&dumps).unwrap().count();
    assert_eq!(
        dumped,
        kiln::passes::parse_pipeline(kiln::passes::DEFAULT_PIPELINE)
            .unwrap()
            .len()
    );
    // The optimized graph is valid .kir text.
    assert_ok(&kiln(&["check", kir.to_str().unwrap()]));
}

#[test]
fn compile_report_lists_each_cpu_step_and_marks_the_interpreter() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/graphs/convnet.kir");
    let o = kiln(&[
        "compile",
        model.to_str().unwrap(),
        "--shape",
        "N=2",
        "--report",
    ]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(out.contains("conv-"), "{out}");
    assert!(out.contains(", 0 on the reference interpreter"), "{out}");
    // A Conv of four spatial axes on f32 has no kernel: its step runs the interpreter's op, and the report says so.
    let dir = scratch("compile_report");
    let g = write(
        &dir,
        "conv4.kir",
        "graph \"conv\" {\n  %0 \"x\" = Parameter : f32[1, 1, 3, 3, 3, 3]\n  %1 \"w\" = Constant : f32[1, 1, 2, 2, 2, 2] = [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]\n  %2 \"d\" = Conv(%0, %1) : f32[1, 1, 2, 2, 2, 2]\n  return \"d\" = %2\n}\n",
    );
    let o = kiln(&["compile", &g, "--report"]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(
        out.contains("fallback") && out.contains("'d' (Conv)  <- interpreter"),
        "{out}"
    );
    assert!(
        out.contains("1 steps, 1 on the reference interpreter"),
        "{out}"
    );
}

/// A graph whose dims are known only at run time (a Reshape to a run-time shape)
/// compiles, plans its static part and says what it left out, instead of failing in the
/// memory plan.
#[test]
fn compile_plans_the_static_part_of_a_graph_with_run_time_dims() {
    let dir = scratch("run_time_dims");
    let g = write(
        &dir,
        "reshape.kir",
        "graph \"runtime_dims\" {\n  %0 \"x\" = Parameter : f32[N, 6]\n  %1 \"s\" = Parameter : i64[2]\n  %2 \"h\" = Neg(%0) : f32[N, 6]\n  %3 \"y\" = Reshape(%2, %1) : f32[y.0.0, y.0.1]\n  %4 \"z\" = Relu(%3) : f32[y.0.0, y.0.1]\n  return \"z\" = %4, \"h\" = %2\n}\n",
    );
    let report = dir.join("memory.json");
    let o = kiln(&[
        "compile",
        &g,
        "--shape",
        "N=2",
        "--report",
        "--memory-report",
        report.to_str().unwrap(),
    ]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(
        out.contains("2 of 5 nodes have types known only at run time, from node #3 'y' (Reshape)"),
        "{out}"
    );
    // The static part: h, 2×6 f32, is planned.
    assert!(out.contains("memory naive 64 B"), "{out}");
    assert!(std::fs::read_to_string(&report).unwrap().contains("\"h\""));
}

#[test]
fn compile_plan_view_draws_the_cpu_plan_as_html_and_svg() {
    let dir = scratch("plan_view");
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/digits_cnn.onnx");
    let (html, svg) = (dir.join("plan.html"), dir.join("plan.SVG"));
    for path in [&html, &svg] {
        let path = path.to_str().unwrap();
        let o = kiln(&[
            "compile",
            model.to_str().unwrap(),
            "--shape",
            "batch=1",
            "--plan-view",
            path,
        ]);
        assert_ok(&o);
        assert!(
            stdout(&o).contains(&format!("wrote {path} (")),
            "{}",
            stdout(&o)
        );
    }
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") && page.contains("<svg"));
    assert!(
        !page.contains("src=") && !page.contains("href="),
        "no network"
    );
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && !picture.contains("<html"));
    for text in [&page, &picture] {
        // A rectangle per arena value, each step's node and kernel, the three numbers.
        assert!(text.contains("<rect class=\"t\""), "tensors drawn");
        assert!(text.contains("(FusedConv)\nkernel: conv"), "{text}");
        assert!(text.contains("f32[1, "), "types from the optimized graph");
        for label in ["naive ", "planned arena ", "lower bound "] {
            assert!(text.contains(label), "{label}");
        }
    }
    assert!(!page.contains("measured: "), "no times unless asked");
    // Timed: each step's measured time, and the time strip.
    let timed = dir.join("timed.html");
    let o = kiln(&[
        "compile",
        model.to_str().unwrap(),
        "--shape",
        "batch=1",
        "--plan-view",
        timed.to_str().unwrap(),
        "--plan-view-runs",
        "3",
    ]);
    assert_ok(&o);
    assert!(stdout(&o).contains("3 timed runs"), "{}", stdout(&o));
    let page = std::fs::read_to_string(&timed).unwrap();
    assert!(page.contains("(FusedConv)\nkernel: conv") && page.contains(">time<"));
    assert!(
        page.contains(" per run\nlive: "),
        "measured times in the tooltips"
    );
    assert!(page.contains("<th>time/run</th>"));
    // A graph holding host objects (a sequence) runs partly on the interpreter: no
    // single plan, a clear error.
    let f = write(
        &dir,
        "seq.kir",
        r#"graph "seq" {
  %0 "x" = Parameter : f32[2, 3]
  %1 "pieces" = SplitToSequence(%0) {axis = 0, keepdims = 0} : seq<f32[3]>
  %2 "one" = Constant : i64[] = [1]
  %3 "second" = SequenceAt(%1, %2) : f32[3]
  %4 "y" = Relu(%3) : f32[3]
  return "y" = %4, "pieces" = %1
}
"#,
    );
    let out = dir.join("seq.html");
    assert_fails(
        &kiln(&["compile", &f, "--plan-view", out.to_str().unwrap()]),
        &["--plan-view", "no single memory plan"],
    );
    assert!(!out.exists());
}

#[test]
fn compile_rejects_bad_options() {
    let dir = scratch("compile_bad");
    let g = write(&dir, "axpy.kir", AXPY);
    assert_fails(
        &kiln(&["compile", &g, "--passes", "cse,nope"]),
        &["unknown pass 'nope'"],
    );
    assert_fails(
        &kiln(&["compile", &g, "--shape", "N"]),
        &["--shape 'N'", "SYMBOL=SIZE"],
    );
    assert_fails(
        &kiln(&["compile", &g, "--dump-ir", "always"]),
        &["dump-ir: expected"],
    );
    // Symbols not given default to 1 and the output says so.
    let o = kiln(&["compile", &g]);
    assert_ok(&o);
    assert!(
        stdout(&o).contains("symbolic dim N was not given"),
        "{}",
        stdout(&o)
    );
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["compile", &g])
        .env("KILN_DISABLE_PASSES", "nope")
        .output()
        .unwrap();
    assert_fails(&o, &["KILN_DISABLE_PASSES", "unknown pass 'nope'"]);
}

/// A graph of one convolution with `channels` in and out, 3×3, pad 1, on 12×12 images.
fn conv_graph(channels: usize, group: usize) -> String {
    let w: Vec<String> = (0..channels * channels / group * 9)
        .map(|i| format!("{:.2}", (i % 7) as f32 * 0.1 - 0.3))
        .collect();
    format!(
        r#"graph "conv" {{
  %0 "x" = Parameter : f32[1, {channels}, 12, 12]
  %1 "w" = Constant : f32[{channels}, {}, 3, 3] = [{}]
  %2 "y" = Conv(%0, %1) {{group = {group}, pads = [1, 1, 1, 1]}} : f32[1, {channels}, 12, 12]
  return "y" = %2
}}
"#,
        channels / group,
        w.join(", ")
    )
}

/// `kiln bench` with extra environment variables; returns stderr (the profile).
fn bench_with_env(g: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args([
        "bench",
        g,
        "--warmup",
        "0",
        "--iterations",
        "1",
        "--threads",
        "1",
    ])
    .env_remove("KILN_AUTOTUNE")
    .env_remove("KILN_TUNE_CACHE")
    .env("KILN_PROFILE", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("the kiln binary runs");
    assert_ok(&o);
    stderr(&o)
}

#[test]
fn profile_gives_each_conv_its_shapes_rate_and_share_of_the_peak() {
    let dir = scratch("profile-rate");
    let g = write(&dir, "conv.kir", &conv_graph(16, 1));
    let profile = bench_with_env(&g, &[]);
    let line = profile
        .lines()
        .find(|l| l.contains("'y' (FusedConv)"))
        .unwrap_or_else(|| panic!("no step line for the conv: {profile}"));
    // Columns: ms/run, share, GFLOP/s, share of the peak, kernel, node, shapes.
    assert!(
        profile.contains("GFLOP/s") && profile.contains("of peak"),
        "{profile}"
    );
    // The blocked layout's shapes, as the kernel reads and writes them.
    assert!(
        line.contains("1×1×12×12×16, 16×16×3×3 → 1×1×12×12×16"),
        "{line}"
    );
    if kiln::internals::peak::fma_gflops().is_some() {
        assert!(profile.contains("FMA peak"), "{profile}");
        // The step's share of the run's time and of the peak.
        assert_eq!(line.matches('%').count(), 2, "{line}");
    }
}

#[test]
fn autotune_measures_caches_and_reuses_the_winner() {
    let dir = scratch("autotune");
    // Eight channels: the layout pass leaves it plain (it blocks depthwise convs of 16 or
    // more), where depthwise and im2col are both candidates.
    let g = write(&dir, "depthwise.kir", &conv_graph(8, 8));
    let cache = dir.join("tune.tsv").display().to_string();
    // The cost model's pick for a depthwise conv, nothing written.
    assert!(bench_with_env(&g, &[]).contains("conv-depthwise"));
    let tune = bench_with_env(&g, &[("KILN_AUTOTUNE", "1"), ("KILN_TUNE_CACHE", &cache)]);
    let text = std::fs::read_to_string(&cache).expect("the cache was written");
    let line = text
        .lines()
        .find(|l| l.contains("conv nchw n1 ic8 12x12 oc8 k3x3"))
        .unwrap_or_else(|| panic!("no entry for the conv: {text}"));
    let fields: Vec<&str> = line.split('\t').collect();
    assert_eq!(fields.len(), 6, "{line}");
    assert_eq!(fields[2], "1", "the thread count: {line}");
    assert!(
        fields[5].contains("depthwise=") && fields[5].contains("im2col="),
        "{line}"
    );
    let winner = fields[4];
    assert!(tune.contains(&format!("conv-{winner}")), "{tune}");
    // A later compile takes the cached winner without KILN_AUTOTUNE: force each one.
    for forced in ["im2col", "depthwise"] {
        let edited = text.replace(&format!("\t{winner}\t"), &format!("\t{forced}\t"));
        std::fs::write(&cache, edited).unwrap();
        let profile = bench_with_env(&g, &[("KILN_TUNE_CACHE", &cache)]);
        assert!(profile.contains(&format!("conv-{forced}")), "{profile}");
    }
    // An unreadable cache is the same as none.
    std::fs::write(&cache, "not\ta cache\n").unwrap();
    assert!(bench_with_env(&g, &[("KILN_TUNE_CACHE", &cache)]).contains("conv-depthwise"));
}

#[test]
fn option_sets_any_compile_key_on_the_command_line() {
    let dir = scratch("option");
    let g = write(&dir, "depthwise.kir", &conv_graph(8, 8));
    // The cost model picks the depthwise kernel; the option pins im2col instead.
    let o = kiln(&[
        "bench",
        &g,
        "--warmup",
        "0",
        "--iterations",
        "1",
        "--profile",
        "--option",
        "tune-force=im2col",
        "--option",
        "threads=1",
    ]);
    assert_ok(&o);
    assert!(stdout(&o).contains("conv-im2col"), "{}", stdout(&o));
    for (arg, want) in [
        ("colour=1", "unknown option 'colour'"),
        ("threads", "--option threads: expected KEY=VALUE"),
        ("threads=many", "threads: expected a count"),
    ] {
        let o = kiln(&["run", &g, "--option", arg]);
        assert!(
            !o.status.success() && stderr(&o).contains(want),
            "{arg}: {}",
            stderr(&o)
        );
    }
}

const SEQ: &str = r#"graph "seq" {
  %0 "s" = Parameter : seq<f32[?]>
  %1 "o" = Parameter : opt<f32[2]>
  %2 "w" = Parameter : string[2]
  %3 "n" = SequenceLength(%0) : i64[]
  %4 "has" = OptionalHasElement(%1) : bool[]
  %5 "w2" = Concat(%2, %2) {axis = 0} : string[4]
  %6 "s2" = SequenceErase(%0) : seq<f32[?]>
  %7 "o2" = Identity(%1) : opt<f32[2]>
  return "n" = %3, "has" = %4, "w2" = %5, "s2" = %6, "o2" = %7
}
"#;

#[test]
fn run_takes_and_writes_strings_sequences_and_optionals() {
    let dir = scratch("run_seq");
    let f = write(&dir, "seq.kir", SEQ);
    assert_eq!(stdout(&kiln(&["print", &f])), SEQ);
    let seq = dir.join("s");
    std::fs::create_dir_all(&seq).unwrap();
    write_npy(&seq, "0.npy", &f32s(&[1], &[1.0]));
    write_npy(&seq, "1.npy", &f32s(&[3], &[2.0, 3.0, 4.0]));
    let words = Tensor::from_strings(&[2], vec!["hé".into(), "wörld".into()]).unwrap();
    let w = write_npy(&dir, "w.npy", &words);
    let out = dir.join("out");
    for backend in ["interp", "cpu"] {
        let _ = std::fs::remove_dir_all(&out);
        let o = kiln(&[
            "run",
            &f,
            "--input",
            &format!("s={}", seq.display()),
            "--input",
            "o=",
            "--input",
            &format!("w={w}"),
            "--outputs",
            &out.display().to_string(),
            "--backend",
            backend,
            "--print",
        ]);
        assert_ok(&o);
        let text = stdout(&o);
        assert!(text.contains("n = i64[] [2]"), "{text}");
        assert!(text.contains("has = bool[] [false]"), "{text}");
        assert!(
            text.contains("o2 is an empty optional: nothing written"),
            "{text}"
        );
        let w2 = npy::read(&out.join("w2.npy")).unwrap();
        let want = ["hé", "wörld", "hé", "wörld"].map(String::from).to_vec();
        assert_eq!(w2, Tensor::from_strings(&[4], want).unwrap());
        assert_eq!(
            npy::read(&out.join("s2").join("0.npy")).unwrap(),
            f32s(&[1], &[1.0])
        );
        assert!(!out.join("s2").join("1.npy").exists());
        assert!(!out.join("o2.npy").exists());
    }
    // A full optional is its value's file; a missing sequence folder is a clear error.
    let o_file = write_npy(&dir, "o.npy", &f32s(&[2], &[5.0, 6.0]));
    let o = kiln(&[
        "run",
        &f,
        "--input",
        &format!("s={}", seq.display()),
        "--input",
        &format!("o={o_file}"),
        "--input",
        &format!("w={w}"),
        "--outputs",
        &out.display().to_string(),
    ]);
    assert_ok(&o);
    assert_eq!(
        npy::read(&out.join("o2.npy")).unwrap(),
        f32s(&[2], &[5.0, 6.0])
    );
    let o = kiln(&[
        "run",
        &f,
        "--input",
        "s=nowhere",
        "--input",
        "o=",
        "--input",
        &format!("w={w}"),
    ]);
    assert_fails(&o, &["nowhere", "a sequence is a folder"]);
    let o = kiln(&[
        "run",
        &f,
        "--input",
        &format!("s={}", seq.display()),
        "--input",
        "o=",
        "--input",
        "w=",
    ]);
    assert_fails(&o, &["input 'w'", "not optional"]);
}
