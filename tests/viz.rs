//! Graph pictures: `ir::dot` (escaping, determinism, collapsing), the provenance the
//! passes record for the nodes they fuse, and `kiln viz` end to end. Rendering through
//! Graphviz's `dot` skips without it (`KILN_REQUIRE=graphviz` makes that a failure), the
//! real-model checks without `target/real-models` (`KILN_REQUIRE=onnx-suite`).
use crate::common;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{named_op, param, require, weight, Need, Rng};
use kiln::ir::dot::{picture, quote, to_dot, DotOptions};
use kiln::ir::{text, Attr, Attrs, Graph};
use kiln::passes::{run_pipeline, CompileOptions};
use kiln::Tensor;

fn has_dot() -> Result<(), String> {
    match Command::new("dot").arg("-V").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err("Graphviz's dot is not on the PATH (install graphviz)".into()),
    }
}

/// `dot -Tsvg` over `text`: the DOT must parse.
fn renders(text: &str) {
    if !require(Need::Graphviz, has_dot()) {
        return;
    }
    let mut child = Command::new("dot")
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("<svg"),
        "dot rejected:\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The top-level boxes of a DOT text: node statements `n12 [`, `s3 [`, `failed [`
/// (fusion clusters' original nodes `n12_o0` count too; the legend does not).
fn boxes(dot: &str) -> usize {
    dot.lines()
        .map(str::trim_start)
        .filter(|l| {
            let id = l.split(' ').next().unwrap_or("");
            l.contains(" [")
                && !l.contains(" -> ")
                && (id == "failed"
                    || (id.len() > 1
                        && (id.starts_with('n') || id.starts_with('s'))
                        && id[1..]
                            .chars()
                            .all(|c| c.is_ascii_digit() || c == '_' || c == 'o')))
        })
        .count()
}

#[test]
fn names_are_escaped() {
    assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
    assert_eq!(quote("x\ny"), r#""x\ny""#);
    assert_eq!(quote("tab\there"), r#""tab\\x09here""#);
    assert_eq!(quote("<b>&amp;</b>"), r#""<b>&amp;</b>""#);
    let mut g = Graph::new("we\"ird\\");
    let x = param(&mut g, "in \"put\"\\n\n<x>&", &[2]);
    let y = named_op(&mut g, "Relu", &[x], Attrs::new(), "re\\lu\"}; evil [");
    g.add_output("out\"", y).unwrap();
    let dot = to_dot(&g);
    assert!(dot.starts_with("digraph \"we\\\"ird\\\\\" {"), "{dot}");
    assert!(dot.contains(r#"#0 in \"put\"\\n\n<x>&"#), "{dot}");
    assert!(dot.contains(r#"#1 re\\lu\"}; evil ["#), "{dot}");
    // No quoted string spans a raw newline: every line has balanced unescaped quotes.
    for line in dot.lines() {
        let unescaped = line.replace("\\\\", "").replace("\\\"", "");
        assert_eq!(unescaped.matches('"').count() % 2, 0, "{line}");
    }
    renders(&dot);
}

/// A transformer-like graph: `layers` layers of 10 nodes under
/// `<sep>encoder<sep>layer.<i><sep>attention|ffn<sep><op>`.
fn scoped(layers: usize, slash: bool) -> Graph {
    let mut g = Graph::new("scoped");
    let mut x = param(&mut g, "x", &[2, 8]);
    let name = |i: usize, part: &str, op: &str| {
        if slash {
            format!("/encoder/layer.{i}/{part}/{op}")
        } else {
            format!("encoder.layer{i}.{part}.{op}")
        }
    };
    for i in 0..layers {
        for (k, op) in ["Relu", "Neg", "Abs", "Exp", "Tanh"].iter().enumerate() {
            x = named_op(
                &mut g,
                op,
                &[x],
                Attrs::new(),
                &name(i, "attention", &format!("{op}_{k}")),
            );
        }
        let y = named_op(
            &mut g,
            "Sigmoid",
            &[x],
            Attrs::new(),
            &name(i, "ffn", "Sigmoid"),
        );
        let z = named_op(&mut g, "Mul", &[x, y], Attrs::new(), &name(i, "ffn", "Mul"));
        let w = named_op(&mut g, "Neg", &[z], Attrs::new(), &name(i, "ffn", "Neg"));
        let v = named_op(&mut g, "Add", &[w, x], Attrs::new(), &name(i, "ffn", "Add"));
        x = named_op(&mut g, "Relu", &[v], Attrs::new(), &name(i, "ffn", "Relu"));
    }
    g.add_output("y", x).unwrap();
    g
}

#[test]
fn scopes_collapse_to_at_most_80_boxes_as_deep_as_fits() {
    for slash in [true, false] {
        let g = scoped(12, slash);
        assert_eq!(g.len(), 121);
        let pic = picture(&g, &DotOptions::default());
        // Depth 3 (layer.i/attention, layer.i/ffn) is 24 boxes + x: the deepest that fits.
        assert_eq!(pic.boxes, 25, "slash {slash}\n{}", pic.top);
        assert_eq!(pic.boxes, boxes(&pic.top));
        assert_eq!(pic.scopes.len(), 24);
        let titles: Vec<&str> = pic.scopes.iter().map(|s| s.title.as_str()).collect();
        let want = if slash {
            "encoder/layer.3/attention"
        } else {
            "encoder/layer3/attention"
        };
        assert!(titles.contains(&want), "{titles:?}");
        assert!(
            pic.top.contains("Abs×1, Exp×1, Neg×1, Relu×1, …"),
            "{}",
            pic.top
        );
        // Boxes are linked once per pair.
        assert_eq!(pic.top.matches("s1 -> s2 ").count(), 1, "{}", pic.top);
        renders(&pic.top);
        renders(&pic.scopes[0].dot);
        // Tighter: whole layers.
        let small = picture(
            &g,
            &DotOptions {
                max_boxes: 13,
                ..DotOptions::default()
            },
        );
        assert_eq!(small.boxes, 13, "{}", small.top);
    }
    // Small graphs are drawn node by node.
    let g = scoped(1, true);
    let pic = picture(&g, &DotOptions::default());
    assert_eq!((pic.boxes, pic.scopes.len()), (11, 0));
}

#[test]
fn pictures_are_deterministic() {
    let g = scoped(12, true);
    let a = to_dot(&g);
    assert_eq!(a, to_dot(&g.clone()));
    let reparsed = text::parse(&text::print(&g), "g", None).unwrap();
    assert_eq!(a, to_dot(&reparsed));
}

#[test]
fn graphs_without_scopes_collapse_by_chains_then_runs() {
    let mut g = Graph::new("flat");
    let mut x = param(&mut g, "x", &[4]);
    for i in 0..300 {
        let a = named_op(&mut g, "Relu", &[x], Attrs::new(), &format!("Relu_{i}"));
        let b = named_op(&mut g, "Neg", &[x], Attrs::new(), &format!("Neg_{i}"));
        x = named_op(&mut g, "Add", &[a, b], Attrs::new(), &format!("Add_{i}"));
    }
    g.add_output("y", x).unwrap();
    let pic = picture(&g, &DotOptions::default());
    assert!(pic.boxes <= 80, "{} boxes", pic.boxes);
    assert_eq!(pic.boxes, boxes(&pic.top));
    let members: usize =
        pic.scopes.iter().map(|s| s.nodes).sum::<usize>() + pic.boxes - pic.scopes.len();
    assert_eq!(members, g.len(), "every node is in exactly one box");
    renders(&pic.top);
}

/// A residual block: conv → BN → ReLU → conv → BN, + x, ReLU, then `x * sigmoid(x)`
/// and a Neg: 16 channels, so that the layout pass blocks it too.
fn residual_block() -> Graph {
    let mut rng = Rng(7);
    let mut g = Graph::new("block");
    let x = param(&mut g, "x", &[1, 16, 6, 6]);
    let conv_attrs = || {
        Attrs::new()
            .with("kernel_shape", Attr::Ints(vec![3, 3]))
            .with("pads", Attr::Ints(vec![1, 1, 1, 1]))
    };
    let mut h = x;
    for i in 0..2 {
        let w = weight(&mut g, &mut rng, &format!("w{i}"), &[16, 16, 3, 3]);
        let c = named_op(
            &mut g,
            "Conv",
            &[h, w],
            conv_attrs(),
            &format!("/block/conv{i}/Conv"),
        );
        let bn: Vec<_> = ["scale", "bias", "mean", "var"]
            .iter()
            .map(|p| {
                let t = Tensor::from_vec(&[16], (0..16).map(|k| 1.0 + k as f32 / 32.0).collect())
                    .unwrap();
                g.add_constant_value(&format!("bn{i}.{p}"), t)
                    .unwrap()
                    .into()
            })
            .collect();
        h = named_op(
            &mut g,
            "BatchNormalization",
            &[c, bn[0], bn[1], bn[2], bn[3]],
            Attrs::new(),
            &format!("/block/bn{i}/BatchNormalization"),
        );
        if i == 0 {
            h = named_op(&mut g, "Relu", &[h], Attrs::new(), "/block/relu0/Relu");
        }
    }
    let sum = named_op(&mut g, "Add", &[h, x], Attrs::new(), "/block/Add");
    let r = named_op(&mut g, "Relu", &[sum], Attrs::new(), "/block/Relu");
    let s = named_op(&mut g, "Sigmoid", &[r], Attrs::new(), "/head/Sigmoid");
    let m = named_op(&mut g, "Mul", &[r, s], Attrs::new(), "/head/Mul");
    let n = named_op(&mut g, "Neg", &[m], Attrs::new(), "/head/Neg");
    let e = named_op(&mut g, "Exp", &[n], Attrs::new(), "/head/Exp");
    g.add_output("y", e).unwrap();
    g
}

#[test]
fn fused_nodes_list_exactly_the_nodes_they_replaced() {
    let before = residual_block();
    let ops_before: BTreeSet<(String, String)> = before
        .nodes()
        .iter()
        .filter(|n| !matches!(n.op.as_str(), "Constant" | "Parameter"))
        .map(|n| (n.name.clone(), n.op.clone()))
        .collect();
    for layout in ["plain", "nchw16c"] {
        let mut g = before.clone();
        let mut options = CompileOptions::default();
        options.set("layout", layout).unwrap();
        options.verify = true;
        run_pipeline(&mut g, &options).unwrap();
        let ops_after: BTreeSet<(String, String)> = g
            .nodes()
            .iter()
            .map(|n| (n.name.clone(), n.op.clone()))
            .collect();
        let replaced: BTreeSet<(String, String)> =
            ops_before.difference(&ops_after).cloned().collect();
        let mut listed: Vec<(String, String)> = vec![];
        for id in (0..g.len() as u32).map(kiln::NodeId) {
            listed.extend(g.origins(id).iter().map(|o| (o.name.clone(), o.op.clone())));
        }
        let listed_set: BTreeSet<(String, String)> = listed.iter().cloned().collect();
        assert_eq!(
            listed.len(),
            listed_set.len(),
            "{layout}: each replaced node once: {listed:?}"
        );
        let dump: Vec<String> = (0..g.len() as u32)
            .map(kiln::NodeId)
            .map(|id| format!("{} <- {:?}", g.describe(id), g.origins(id)))
            .collect();
        // Every model node that went is listed; anything else listed is a node the
        // passes themselves made and removed again (a layout's reorder that cancelled).
        assert!(
            listed_set.is_superset(&replaced),
            "{layout}:\n{}",
            dump.join("\n")
        );
        for extra in listed_set.difference(&replaced) {
            assert!(
                before.find(&extra.0).is_none() && extra.1 == "Reorder",
                "{layout}: {extra:?} was not replaced:\n{}",
                dump.join("\n")
            );
        }
        // The second conv took its BatchNormalization, the residual Add and the ReLU.
        let conv1 = g.find("/block/conv1/Conv").unwrap();
        let names: Vec<&str> = g.origins(conv1).iter().map(|o| o.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "/block/conv1/Conv",
                "/block/bn1/BatchNormalization",
                "/block/Add",
                "/block/Relu"
            ],
            "{layout}"
        );
        assert_eq!(g.node(conv1).op, "FusedConv");
        // Provenance is bookkeeping: the text and equality do not see it.
        let reparsed = text::parse(&text::print(&g), "g", None).unwrap();
        assert_eq!(text::print(&reparsed), text::print(&g));
        assert!(reparsed == g);
        let dot = to_dot(&g);
        assert!(
            dot.contains(&format!("subgraph cluster_n{} {{", conv1.0)),
            "{dot}"
        );
        assert!(dot.contains("FusedConv replaced 4 nodes"), "{dot}");
        renders(&dot);
    }
}

// ---------------------------------------------------------------------------------------
// `kiln viz`

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("the kiln binary runs")
}

fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("viz")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn text_of(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

#[test]
fn viz_writes_dot_svg_and_html() {
    let dir = scratch("formats");
    let kir = dir.join("scoped.kir");
    std::fs::write(&kir, text::print(&scoped(12, true))).unwrap();
    let kir = kir.to_str().unwrap();
    let o = kiln(&["viz", kir]);
    assert!(o.status.success(), "{}", text_of(&o.stderr));
    let dot = text_of(&o.stdout);
    assert!(dot.starts_with("digraph \"scoped\""), "{dot}");
    assert!(
        text_of(&o.stderr).contains("25 top-level boxes"),
        "{}",
        text_of(&o.stderr)
    );
    let file = dir.join("x.dot");
    let o = kiln(&["viz", kir, "-o", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text_of(&o.stderr));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), dot);
    let bad = kiln(&["viz", kir, "-o", dir.join("x.png").to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        text_of(&bad.stderr).starts_with("kiln: ") && text_of(&bad.stderr).contains("x.png"),
        "{}",
        text_of(&bad.stderr)
    );
    if !require(Need::Graphviz, has_dot()) {
        return;
    }
    let svg = dir.join("x.svg");
    let o = kiln(&["viz", kir, "-o", svg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text_of(&o.stderr));
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    let html = dir.join("x.html");
    let o = kiln(&["viz", kir, "-o", html.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text_of(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(page.matches("<details id=\"scope-s").count(), 24);
    assert!(
        page.contains("href=\"#scope-s1\""),
        "top-level boxes link to their sections"
    );
    for remote in ["<link", " src=", "@import", "url("] {
        assert!(!page.contains(remote), "the page loads {remote}");
    }
}

#[test]
fn viz_draws_a_model_that_fails_to_import_up_to_the_failing_node() {
    use kiln::frontend::onnx::proto::ModelProto;
    use prost::Message;
    let dir = scratch("partial");
    let bytes = std::fs::read(common::root().join("tests/onnx/scale_relu.onnx")).unwrap();
    let mut model = ModelProto::decode(bytes.as_slice()).unwrap();
    let graph = model.graph.as_mut().unwrap();
    let last = graph.node.last_mut().unwrap();
    last.op_type = Some("NoSuchOp".into());
    last.name = Some("bad \"node\"".into());
    let path = dir.join("bad.onnx");
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    let out = dir.join("bad.dot");
    let o = kiln(&["viz", path.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text_of(&o.stderr));
    let err = text_of(&o.stderr);
    assert!(
        err.starts_with("kiln: ") && err.contains("bad \"node\"") && err.contains("NoSuchOp"),
        "{err}"
    );
    let dot = std::fs::read_to_string(&out).unwrap();
    assert!(
        dot.contains("failed [") && dot.contains("import failed:") && dot.contains("color=red"),
        "{dot}"
    );
    assert!(
        dot.contains("-> failed"),
        "the failing node's inputs lead to it: {dot}"
    );
    renders(&dot);
}

#[test]
fn optimized_resnet50_fits_on_one_screen() {
    let Some(model) = common::real_model("resnet50") else {
        return;
    };
    let dir = scratch("resnet50");
    let out = dir.join("r50.dot");
    let o = kiln(&[
        "viz",
        model.to_str().unwrap(),
        "--optimized",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text_of(&o.stderr));
    let dot = std::fs::read_to_string(&out).unwrap();
    let n = boxes(&dot);
    assert!(n <= 80, "{n} top-level boxes:\n{dot}");
    assert!(
        dot.contains("cluster_legend") && dot.contains("fillcolor=\"#8dd3c7\""),
        "coloured by kernel: {}\n{dot}",
        text_of(&o.stdout)
    );
    assert!(
        text_of(&o.stdout).contains(&format!("{n} top-level boxes")),
        "{}",
        text_of(&o.stdout)
    );
    renders(&dot);
}
