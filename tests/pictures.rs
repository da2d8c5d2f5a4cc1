//! Every picture and trace Kiln writes, checked by the program meant to read it: HTML
//! and SVG (`kiln viz` through graphviz's `dot`) loaded by headless Chromium, whose screenshot must not be blank; profile
//! traces parsed as JSON with the trace-event format's required fields and one complete
//! event per step per run. Chromium is `Need::Chromium` (`KILN_REQUIRE=chromium`).
use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln::backend::cpu::CpuBackend;
use kiln::passes::CompileOptions;
use serde_json::Value as Json;

use common::{require, root, Need};

fn kiln(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("the kiln binary runs");
    assert_ne!(o.status.code(), Some(101), "kiln panicked: {o:?}");
    o
}

fn ok(args: &[&str]) -> String {
    let o = kiln(args);
    assert!(
        o.status.success(),
        "kiln {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A fresh directory for one test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-pictures-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The program `name` on the PATH, if any.
fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The Chromium on the PATH; None (after `require`, which fails a test that must not
/// skip) when there is none.
fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| which(name));
    let why = "no chromium on the PATH (apt-get install chromium)";
    let ok = require(
        Need::Chromium,
        found.as_ref().map(|_| ()).ok_or(why.to_string()),
    );
    found.filter(|_| ok)
}

/// `page` (HTML or SVG) loaded by headless Chromium, its screenshot written to `png`.
fn screenshot(chrome: &Path, page: &Path, png: &Path, size: (u32, u32)) {
    let profile = png.with_extension("chromium-profile");
    let o = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--window-size={},{}", size.0, size.1))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", page.canonicalize().unwrap().display()))
        .output()
        .expect("chromium runs");
    assert!(
        png.exists(),
        "chromium wrote no screenshot of {}: {}",
        page.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::remove_dir_all(&profile).ok();
}

/// Panics unless the PNG shows something: at least 1 % of its pixels differ from the
/// top-left one (the background) and it has at least `colors` distinct colors.
fn assert_not_blank(png: &Path, colors: usize) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(png).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()]
        .chunks(channels)
        .map(|p| &p[..channels.min(3)])
        .collect();
    let background = pixels[0];
    let differ = pixels.iter().filter(|&&p| p != background).count();
    let distinct: std::collections::HashSet<&[u8]> = pixels.iter().copied().collect();
    assert!(
        differ * 100 >= pixels.len() && distinct.len() >= colors,
        "{} looks blank: {differ} of {} pixels differ from the background, {} colors",
        png.display(),
        pixels.len(),
        distinct.len()
    );
}

const DIGITS: &str = "examples/data/digits_cnn.onnx";

#[test]
fn a_bench_trace_has_every_step_and_its_timeline_renders() {
    let dir = scratch("trace");
    let trace = dir.join("digits.json");
    let model = root().join(DIGITS);
    let out = ok(&[
        "bench",
        model.to_str().unwrap(),
        "--shape",
        "batch=4",
        "--threads",
        "2",
        "--warmup",
        "1",
        "--iterations",
        "3",
        "--profile",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(out.contains("ms/run") && out.contains("of peak"), "{out}");

    // 1 first run, 1 warm-up, 3 timed: each step of the program five times, in order.
    let mut g = kiln::frontend::onnx::import_file(&model).unwrap();
    g.specialize(&[("batch".to_string(), 4)].into()).unwrap();
    let exe = CpuBackend::new(CompileOptions {
        threads: 2,
        ..Default::default()
    })
    .compile_cpu(&g)
    .unwrap();
    let steps = exe.step_report(&[vec![4, 1, 28, 28]]).unwrap();
    drop(exe);
    let json: Json = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let mut kinds = vec![];
    for e in events {
        for field in ["name", "ph", "pid", "tid"] {
            assert!(!e[field].is_null(), "no {field}: {e}");
        }
        if e["ph"] == "X" {
            assert!(e["ts"].is_number() && e["dur"].is_number(), "{e}");
            if e["cat"] != "parallel" {
                kinds.push(e["args"]["kernel"].as_str().unwrap().to_string());
            }
        }
    }
    let want: Vec<String> = (0..5)
        .flat_map(|_| steps.iter().map(|s| s.kind.to_string()))
        .collect();
    assert_eq!(kinds, want);

    let page = dir.join("timeline.html");
    ok(&[
        "timeline",
        trace.to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
    ]);
    let Some(chrome) = chromium() else { return };
    let png = dir.join("timeline.png");
    screenshot(&chrome, &page, &png, (1200, 500));
    assert_not_blank(&png, 6);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn timeline_refuses_what_is_not_a_trace() {
    let dir = scratch("not-a-trace");
    let bad = dir.join("model.json");
    std::fs::write(&bad, "hello").unwrap();
    let o = kiln(&[
        "timeline",
        bad.to_str().unwrap(),
        "-o",
        dir.join("x.html").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("model.json") && err.contains("not a Chrome trace"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_memory_chart_renders() {
    let dir = scratch("memory-chart");
    let svg = dir.join("chart.svg");
    let model = root().join(DIGITS);
    ok(&[
        "compile",
        model.to_str().unwrap(),
        "--shape",
        "batch=16",
        "--memory-chart",
        svg.to_str().unwrap(),
    ]);
    let Some(chrome) = chromium() else { return };
    let png = dir.join("chart.png");
    screenshot(&chrome, &svg, &png, (1000, 600));
    assert_not_blank(&png, 4);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_plan_view_renders_as_html_and_svg() {
    let dir = scratch("plan-view");
    let model = root().join(DIGITS);
    let (html, svg) = (dir.join("plan.html"), dir.join("plan.svg"));
    for (page, runs) in [(&html, "2"), (&svg, "0")] {
        ok(&[
            "compile",
            model.to_str().unwrap(),
            "--shape",
            "batch=1",
            "--plan-view",
            page.to_str().unwrap(),
            "--plan-view-runs",
            runs,
        ]);
    }
    let Some(chrome) = chromium() else { return };
    for page in [&html, &svg] {
        let png = page.with_extension("png");
        screenshot(&chrome, page, &png, (1600, 1000));
        // The tensors, the kinds' strip and the legend: many colors.
        assert_not_blank(&png, 8);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_optimized_graph_renders_as_svg_and_html() {
    let dir = scratch("viz");
    let model = root().join(DIGITS);
    let (svg, html) = (dir.join("graph.svg"), dir.join("graph.html"));
    if which("dot").is_none() {
        // `kiln viz` renders these through graphviz: tests/viz.rs checks the message.
        require(
            Need::Graphviz,
            Err("no dot on the PATH (apt-get install graphviz)".into()),
        );
        return;
    }
    for page in [&svg, &html] {
        let out = ok(&[
            "viz",
            model.to_str().unwrap(),
            "--optimized",
            "--shape",
            "batch=1",
            "-o",
            page.to_str().unwrap(),
        ]);
        assert!(out.contains("top-level boxes"), "{out}");
    }
    let Some(chrome) = chromium() else { return };
    for page in [&svg, &html] {
        let png = page.with_extension("png");
        screenshot(&chrome, page, &png, (1200, 1200));
        // Boxes filled by kernel, the legend, edges and text.
        assert_not_blank(&png, 5);
    }
    std::fs::remove_dir_all(&dir).ok();
}
