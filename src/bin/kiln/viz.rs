//! `kiln viz`: a picture of a graph (DOT, SVG through Graphviz's `dot`, or an HTML page
//! of the top level with each collapsed box expandable), optionally of the optimized
//! graph with each node coloured by the cpu kernel it runs. A model that fails to
//! import is drawn up to the failing node, which is marked; the command then fails.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kiln::backend::cpu::{Compiled as CpuCompiled, CpuBackend};
use kiln::backend::cpu_pass_options;
use kiln::frontend::onnx;
use kiln::ir::dot::{self, DotOptions, Failure, Picture};
use kiln::ir::text;
use kiln::memory::xml;
use kiln::passes::{run_pipeline, CompileOptions, Profiling};
use kiln::{Error, Graph, NodeId, Result};

use crate::compile::{bindings, input_shapes};
use crate::emit;

pub struct Request<'a> {
    pub file: &'a Path,
    pub output: Option<&'a Path>,
    pub optimized: bool,
    pub shapes: &'a [String],
}

#[derive(PartialEq)]
enum Format {
    Dot,
    Svg,
    Html,
}

pub(crate) fn run(req: &Request) -> Result<()> {
    let format = match req.output {
        None => Format::Dot,
        Some(p) => match p
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
        {
            Some(e) if e == "dot" || e == "gv" => Format::Dot,
            Some(e) if e == "svg" => Format::Svg,
            Some(e) if e == "html" || e == "htm" => Format::Html,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "-o {}: expected a .dot, .svg or .html file",
                    p.display()
                )))
            }
        },
    };
    // Before any work: a picture that needs Graphviz fails early without it.
    if format != Format::Dot && !has_dot() {
        return Err(Error::Unsupported(format!(
            "writing {} needs Graphviz's `dot` on the PATH (install graphviz), or write .dot instead; nothing written",
            req.output.map(|p| p.display().to_string()).unwrap_or_default()
        )));
    }
    let t0 = Instant::now();
    let (mut graph, failure) = load_partial(req.file)?;
    let t_import = t0.elapsed();
    let mut opts = DotOptions {
        links: format == Format::Html,
        ..DotOptions::default()
    };
    let mut notes: Vec<String> = vec![];
    let mut t_passes = Duration::ZERO;
    let mut t_kernels = Duration::ZERO;
    if let Some(f) = &failure {
        opts.failure = Some(Failure {
            name: f.node.clone(),
            op: f.op.clone(),
            message: f.error.to_string(),
            inputs: f.inputs.clone(),
        });
        if req.optimized {
            notes.push("the model did not import: the imported part is drawn unoptimized".into());
        }
    } else if req.optimized {
        let t1 = Instant::now();
        let mut given = bindings(req.shapes)?;
        for s in graph.specialize(&given)? {
            notes.push(format!(
                "symbolic dim {s} was not given (--shape {s}=SIZE): 1 assumed"
            ));
            given.insert(s, 1);
        }
        graph.specialize(&given)?;
        let options = cpu_pass_options(CompileOptions::from_env()?);
        run_pipeline(&mut graph, &options)?;
        t_passes = t1.elapsed();
        let t2 = Instant::now();
        opts.kinds = kernel_kinds(&graph, options, &mut notes)?;
        t_kernels = t2.elapsed();
    } else if !req.shapes.is_empty() {
        graph.specialize(&bindings(req.shapes)?)?;
    }
    let t3 = Instant::now();
    let pic = dot::picture(&graph, &opts);
    let t_dot = t3.elapsed();
    let kiln_time = t_import + t_passes + t_kernels + t_dot;
    let mut report = String::new();
    writeln!(
        report,
        "{}: {} nodes, {} top-level boxes, {} collapsed",
        req.file.display(),
        graph.len(),
        pic.boxes,
        pic.scopes.len()
    )
    .ok();
    for n in &notes {
        writeln!(report, "note   {n}").ok();
    }
    let kernels = if req.optimized && failure.is_none() {
        format!(", cpu kernel choice {:.1} ms", ms(t_kernels))
    } else {
        String::new()
    };
    writeln!(
        report,
        "time   import {:.1} ms, passes {:.1} ms{kernels}, dot text {:.1} ms, kiln total {:.1} ms",
        ms(t_import),
        ms(t_passes),
        ms(t_dot),
        ms(kiln_time)
    )
    .ok();
    match (req.output, format) {
        (None, _) => {
            emit(&pic.top)?;
            eprint!("{report}");
        }
        (Some(path), Format::Dot) => {
            write(path, pic.top.as_bytes())?;
            writeln!(report, "wrote {}", path.display()).ok();
            emit(&report)?;
        }
        (Some(path), Format::Svg) => {
            write(path, &render_svg(&pic.top)?)?;
            writeln!(report, "wrote {}", path.display()).ok();
            emit(&report)?;
        }
        (Some(path), Format::Html) => {
            write(path, html(&graph.name, &pic, &report)?.as_bytes())?;
            writeln!(report, "wrote {}", path.display()).ok();
            emit(&report)?;
        }
    }
    match failure {
        Some(f) => Err(Error::Graph(format!(
            "{}: the model did not import (drawn up to the failing node '{}' ({})): {}",
            req.file.display(),
            f.node,
            f.op,
            f.error
        ))),
        None => Ok(()),
    }
}

/// An ONNX model as far as it imports, or a `.kir` graph.
fn load_partial(file: &Path) -> Result<(Graph, Option<onnx::ImportFailure>)> {
    if file
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
    {
        onnx::import_partial(file).map_err(|e| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{}: {m}", file.display())),
            e => e,
        })
    } else {
        Ok((text::parse_file(file)?, None))
    }
}

/// Each node's cpu kernel: the cpu backend lowers `optimized` as it is (no passes
/// again, so the node ids are the picture's) and each step names its node.
fn kernel_kinds(
    optimized: &Graph,
    mut passes: CompileOptions,
    notes: &mut Vec<String>,
) -> Result<BTreeMap<NodeId, String>> {
    let shapes = input_shapes(optimized)?;
    passes.set("passes", "")?;
    passes.dump_ir = Default::default();
    passes.pass_timing = false;
    passes.profile = Profiling::Off;
    passes.threads = 1;
    let exe = CpuBackend { options: passes }.compile_cpu(optimized)?;
    let mut kinds = BTreeMap::new();
    match &*exe.program(&shapes)? {
        CpuCompiled::Program(p) => {
            for s in &p.steps {
                kinds
                    .entry(s.node.id)
                    .or_insert_with(|| s.kernel.kind().to_string());
            }
        }
        _ => notes.push(
            "the graph does not lower to one static cpu program: nodes left uncoloured".into(),
        ),
    }
    Ok(kinds)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| Error::io(path, e))
}

fn dot_program() -> PathBuf {
    PathBuf::from("dot")
}

/// Whether Graphviz's `dot` runs.
fn has_dot() -> bool {
    Command::new(dot_program())
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// DOT text through `dot -Tsvg`.
fn render_svg(dot_text: &str) -> Result<Vec<u8>> {
    let mut child = Command::new(dot_program())
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Io(format!("running Graphviz's dot: {e}")))?;
    let mut stdin = child.stdin.take().expect("piped");
    let text = dot_text.to_string();
    // Written from another thread: dot may fill its stdout before reading all input.
    let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
    let out = child
        .wait_with_output()
        .map_err(|e| Error::Io(format!("running Graphviz's dot: {e}")))?;
    let _ = writer.join();
    if !out.status.success() {
        return Err(Error::Runtime(format!(
            "Graphviz's dot failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out.stdout)
}

/// An SVG document as an element to inline in HTML: from `<svg` on.
fn inline_svg(svg: &[u8]) -> String {
    let s = String::from_utf8_lossy(svg);
    match s.find("<svg") {
        Some(i) => s[i..].to_string(),
        None => s.into_owned(),
    }
}

/// A self-contained page: the top level, then each collapsed box in a `<details>`
/// section the top level's boxes link to (opened when its anchor is followed).
fn html(name: &str, pic: &Picture, report: &str) -> Result<String> {
    let mut out = String::new();
    let title = xml(name);
    write!(
        out,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title>\n<style>\nbody {{ font-family: sans-serif; margin: 1em; }}\nsvg {{ max-width: 100%; height: auto; }}\ndetails {{ border: 1px solid #ccc; margin: .4em 0; padding: .3em; }}\nsummary {{ cursor: pointer; }}\npre {{ background: #f4f4f4; padding: .5em; }}\n</style></head><body>\n<h1>{title}</h1>\n<pre>{}</pre>\n<div class=\"top\">\n{}\n</div>\n",
        xml(report.trim_end()),
        inline_svg(&render_svg(&pic.top)?)
    )
    .ok();
    for s in &pic.scopes {
        let svg = inline_svg(&render_svg(&s.dot)?);
        write!(
            out,
            "<details id=\"scope-{}\"><summary>{} — {} nodes</summary>\n{svg}\n</details>\n",
            xml(&s.id),
            xml(&s.title),
            s.nodes
        )
        .ok();
    }
    out.push_str(
        "<script>\nfunction openTarget() {\n  var e = document.getElementById(decodeURIComponent(location.hash.slice(1)));\n  if (e && e.tagName === 'DETAILS') { e.open = true; e.scrollIntoView(); }\n}\nwindow.addEventListener('hashchange', openTarget);\nopenTarget();\n</script>\n</body></html>\n",
    );
    Ok(out)
}
