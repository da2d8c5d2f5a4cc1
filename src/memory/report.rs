//! The memory report as JSON (the SVG chart is [`super::svg`]), and the byte formatting
//! both use.
use std::fmt::Write;

use super::plan::MemoryPlan;
use super::ALIGN;
use crate::ir::{Graph, Value};

/// `"conv_1:0"`: a value as its node's name and output index.
fn value_name(g: &Graph, v: Value) -> String {
    format!("{}:{}", g.node(v.node).name, v.output)
}

/// `s` as a JSON string literal.
pub(crate) fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            // Control characters, and the two separators JavaScript strings reject.
            c if (c as u32) < 0x20 || c == '\u{2028}' || c == '\u{2029}' || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The plan as a JSON object (deterministic: same plan, same bytes). Keys:
/// `graph`, `alignment`, `naive_bytes`, `planned_bytes`, `lower_bound_bytes`,
/// `lower_bound_without_inplace_bytes`, `strategy`, `strategies` (each heuristic's
/// arena), `inplace_reuses`, `notes`, `steps` (`step`, `node`, `op`, `own_bytes`,
/// `live_bytes`) and `buffers` (`values` as `node:output`, `bytes` reserved (aligned),
/// `tensor_bytes`, `offset`, `first_step`, `last_step`).
pub fn to_json(plan: &MemoryPlan, g: &Graph, notes: &[String]) -> String {
    let mut o = String::new();
    o.push_str("{\n");
    let _ = writeln!(o, "  \"graph\": {},", json_string(&g.name));
    let _ = writeln!(o, "  \"alignment\": {ALIGN},");
    let _ = writeln!(o, "  \"naive_bytes\": {},", plan.naive_bytes);
    let _ = writeln!(o, "  \"planned_bytes\": {},", plan.planned_bytes);
    let _ = writeln!(o, "  \"lower_bound_bytes\": {},", plan.lower_bound_bytes);
    let _ = writeln!(
        o,
        "  \"lower_bound_without_inplace_bytes\": {},",
        plan.lower_bound_without_inplace_bytes
    );
    let _ = writeln!(o, "  \"strategy\": {},", json_string(plan.strategy));
    let strategies: Vec<String> = plan
        .strategies
        .iter()
        .map(|(s, b)| format!("{}: {b}", json_string(s)))
        .collect();
    let _ = writeln!(o, "  \"strategies\": {{{}}},", strategies.join(", "));
    let _ = writeln!(o, "  \"inplace_reuses\": {},", plan.inplace_reuses);
    let notes: Vec<String> = notes.iter().map(|n| json_string(n)).collect();
    let _ = writeln!(o, "  \"notes\": [{}],", notes.join(", "));
    o.push_str("  \"steps\": [");
    for (i, s) in plan.steps.iter().enumerate() {
        let _ = write!(
            o,
            "{}\n    {{\"step\": {}, \"node\": {}, \"op\": {}, \"own_bytes\": {}, \"live_bytes\": {}}}",
            if i == 0 { "" } else { "," },
            s.step,
            json_string(&s.name),
            json_string(&s.op),
            s.own_bytes,
            s.live_bytes
        );
    }
    o.push_str(if plan.steps.is_empty() {
        "],\n"
    } else {
        "\n  ],\n"
    });
    o.push_str("  \"buffers\": [");
    for (i, b) in plan.buffers.iter().enumerate() {
        let values: Vec<String> = b
            .values
            .iter()
            .map(|&v| json_string(&value_name(g, v)))
            .collect();
        let _ = write!(
            o,
            "{}\n    {{\"values\": [{}], \"bytes\": {}, \"tensor_bytes\": {}, \"offset\": {}, \"first_step\": {}, \"last_step\": {}}}",
            if i == 0 { "" } else { "," },
            values.join(", "),
            b.size,
            b.bytes,
            b.offset,
            b.first,
            b.last
        );
    }
    o.push_str(if plan.buffers.is_empty() {
        "]\n"
    } else {
        "\n  ]\n"
    });
    o.push_str("}\n");
    o
}

/// Bytes in binary units with up to `decimals` decimals, trailing zeros dropped:
/// `0 B`, `512 B`, `1.5 KiB`, `12 MiB`.
pub(crate) fn human_bytes(n: usize, decimals: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        return format!("{n} B");
    }
    let mut s = format!("{v:.decimals$}");
    if s.contains('.') {
        s = s.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    format!("{s} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Attrs;
    use crate::memory::plan::tests::f32s;
    use crate::memory::plan::{self, MemoryPlan};
    use crate::memory::svg::{tick_label, to_svg};

    fn chain(n: usize) -> (Graph, MemoryPlan) {
        let mut g = Graph::new("chain \"q\"");
        let x = g.add_parameter("x", f32s(&[1024])).unwrap();
        let mut prev = x;
        let mut v = x;
        for i in 0..n {
            let op = if i % 3 == 0 { "Add" } else { "Relu" };
            let ins: Vec<Value> = if op == "Add" {
                vec![v.into(), prev.into()]
            } else {
                vec![v.into()]
            };
            prev = v;
            v = g.op(op, &ins, Attrs::new(), &format!("n<{i}>")).unwrap();
        }
        g.add_output("y", v.into()).unwrap();
        let p = plan::plan(&g, &g.schedule().unwrap()).unwrap();
        (g, p)
    }

    #[test]
    fn json_escapes() {
        assert_eq!(json_string("a\"b\\c\n\t\u{1}é"), r#""a\"b\\c\n\t\u0001é""#);
    }

    #[test]
    fn json_report() {
        let (g, p) = chain(4);
        let notes = vec!["symbol N defaulted to 1".to_string(), "tab\there".into()];
        let j = to_json(&p, &g, &notes);
        assert_eq!(j, to_json(&p, &g, &notes), "deterministic");
        for key in [
            "\"naive_bytes\": ",
            "\"planned_bytes\": ",
            "\"lower_bound_bytes\": ",
            "\"lower_bound_without_inplace_bytes\": ",
            "\"strategy\": \"",
            "\"inplace_reuses\": ",
            "\"notes\": [\"symbol N defaulted to 1\", \"tab\\there\"]",
            "\"steps\": [",
            "\"buffers\": [",
            "\"graph\": \"chain \\\"q\\\"\"",
            "{\"step\": 1, \"node\": \"n<0>\", \"op\": \"Add\", \"own_bytes\": 4096, \"live_bytes\": 4096}",
            "\"first_step\": 1",
        ] {
            assert!(j.contains(key), "{key} missing from\n{j}");
        }
        assert!(j.contains("\"values\": [\"n<0>:0\", \"n<1>:0\""), "{j}");
        // Balanced brackets outside strings: a cheap well-formedness check.
        let (mut depth, mut in_str, mut esc) = (0i32, false, false);
        for c in j.chars() {
            match (in_str, esc, c) {
                (true, true, _) => esc = false,
                (true, false, '\\') => esc = true,
                (true, false, '"') => in_str = false,
                (false, _, '"') => in_str = true,
                (false, _, '{' | '[') => depth += 1,
                (false, _, '}' | ']') => depth -= 1,
                _ => {}
            }
            assert!(depth >= 0);
        }
        assert_eq!((depth, in_str), (0, false));

        let empty = Graph::new("e");
        let pe = plan::plan(&empty, &[]).unwrap();
        let je = to_json(&pe, &empty, &[]);
        assert!(
            je.contains("\"steps\": [],") && je.contains("\"buffers\": []"),
            "{je}"
        );
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(0, 2), "0 B");
        assert_eq!(human_bytes(1000, 2), "1000 B");
        assert_eq!(human_bytes(1536, 2), "1.5 KiB");
        assert_eq!(human_bytes(3 << 20, 2), "3 MiB");
        assert_eq!(tick_label(2.0 * 1048576.0, 1048576.0, 1048576.0), "2 MiB");
        assert_eq!(tick_label(0.5 * 1024.0, 1024.0, 512.0), "0.5 KiB");
    }

    fn check_svg(svg: &str, n: usize) {
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<title>").count(),
            n + 1,
            "one tooltip per step"
        );
        assert!(svg.contains("planned arena") && svg.contains("lower bound"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        let width: f64 = svg
            .split("width=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap()
            .parse()
            .unwrap();
        assert!((700.0..=1700.0).contains(&width), "width {width}");
        // Tags balance (a cheap well-formedness check).
        assert_eq!(svg.matches("<g").count(), svg.matches("</g>").count());
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    }

    #[test]
    fn svg_small_and_large() {
        let (g, p) = chain(10);
        let svg = to_svg(&p, &g, "chain <10> & co");
        check_svg(&svg, p.steps.len() - 1);
        assert!(
            svg.contains("step 0 holds no arena memory"),
            "the parameter's step is cut"
        );
        assert!(svg.contains("chain &lt;10&gt; &amp; co"));
        assert!(svg.contains("KiB"), "tick labels in KiB");
        assert!(svg.contains("step 1: n&lt;0&gt; (Add)"));
        assert!(!svg.contains("<path fill="), "wide bars, not areas");

        let (g, p) = chain(3000);
        let svg = to_svg(&p, &g, "long");
        check_svg(&svg, p.steps.len() - 1);
        assert!(svg.contains("<path fill="), "areas for thin bars");

        let empty = Graph::new("e");
        let pe = plan::plan(&empty, &[]).unwrap();
        check_svg(&to_svg(&pe, &empty, "empty"), 0);
    }
}
