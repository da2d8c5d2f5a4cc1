//! The memory report: a JSON summary and an SVG chart of memory over the schedule.
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

/// `s` escaped for SVG text and attribute values.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 forbids most control characters even escaped.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
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

/// A "nice" tick step (1, 2 or 5 × 10^k, scaled by `unit`) giving at most about
/// `max_ticks` intervals over `0..=max`.
fn nice_step(max: f64, unit: f64, max_ticks: f64) -> f64 {
    let raw = (max / unit / max_ticks).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag);
    step * unit
}

/// The binary unit (1, 1024, 1024², …) to label an axis reaching `max` bytes.
fn axis_unit(max: f64) -> f64 {
    let mut unit = 1.0;
    while max / unit >= 1024.0 && unit < 1024f64.powi(4) {
        unit *= 1024.0;
    }
    unit
}

/// A number with at most 2 decimals, no trailing zeros: SVG coordinates.
fn num(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

const LIVE_COLOR: &str = "#9ecae1";
const OWN_COLOR: &str = "#2166ac";
const PLANNED_COLOR: &str = "#d62728";
const BOUND_COLOR: &str = "#2ca02c";
const DASH: &str = r#" stroke-dasharray="6 4""#;

/// A self-contained SVG chart of memory over the schedule: per step a bar of all live
/// bytes with, overlaid, a darker bar of the step's own output bytes; horizontal lines
/// for the planned arena and the lower bound; a legend and a tooltip per step. Past a
/// few hundred steps the bars become step-shaped areas (hover still works per step).
pub fn to_svg(plan: &MemoryPlan, g: &Graph, title: &str) -> String {
    let title = if title.is_empty() { &g.name } else { title };
    let n = plan.steps.len();
    // Leading steps with nothing live (the sources, which a schedule puts first) are
    // left out: x starts at the first step holding arena memory.
    let start = plan
        .steps
        .iter()
        .position(|s| s.live_bytes > 0)
        .unwrap_or(0);
    let shown = &plan.steps[start..];
    let m = shown.len();
    let plot_w = (m as f64 * 8.0).clamp(560.0, 1400.0);
    let plot_h = 360.0;
    let (left, right, top, bottom) = (78.0, 150.0, 104.0, 56.0);
    let width = left + plot_w + right;
    let height = top + plot_h + bottom;
    let step_w = plot_w / m.max(1) as f64;
    let thin = step_w < 3.0;

    let peak_live = plan.steps.iter().map(|s| s.live_bytes).max().unwrap_or(0);
    let y_data = plan.planned_bytes.max(peak_live).max(1) as f64;
    let unit = axis_unit(y_data);
    let tick = nice_step(y_data * 1.05, unit, 6.0);
    let y_max = ((y_data * 1.05) / tick).ceil() * tick;
    let y = |b: f64| top + plot_h - b / y_max * plot_h;
    // The left edge of absolute step `s`.
    let x = |s: f64| left + (s - start as f64) * step_w;
    let base = top + plot_h;

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#,
        w = num(width),
        h = num(height)
    );
    let _ = writeln!(o, "<title>{}</title>", xml(title));
    let _ = writeln!(
        o,
        r#"<rect x="0" y="0" width="{}" height="{}" fill="white"/>"#,
        num(width),
        num(height)
    );

    // Title, a two-line summary and the legend.
    let _ = writeln!(
        o,
        r#"<text x="16" y="24" font-size="16" font-weight="bold">{}</text>"#,
        xml(title)
    );
    let saved = if plan.naive_bytes > 0 {
        100.0 * (1.0 - plan.planned_bytes as f64 / plan.naive_bytes as f64)
    } else {
        0.0
    };
    let ratio = plan.ratio_to_lower_bound();
    let lines = [
        format!(
            "planned arena {} · lower bound {} (×{ratio:.3}) · naive {} ({saved:.1}% saved)",
            human_bytes(plan.planned_bytes, 2),
            human_bytes(plan.lower_bound_bytes, 2),
            human_bytes(plan.naive_bytes, 2),
        ),
        format!(
            "{n} steps · {} buffers · {} in-place reuses (lower bound without them {}) · {}",
            plan.buffers.len(),
            plan.inplace_reuses,
            human_bytes(plan.lower_bound_without_inplace_bytes, 2),
            plan.strategy
        ),
    ];
    for (i, line) in lines.iter().enumerate() {
        let _ = writeln!(
            o,
            r##"<text x="16" y="{}" fill="#444">{}</text>"##,
            44 + 16 * i,
            xml(line)
        );
    }
    let mut lx = 16.0;
    let ly = 86.0;
    for (label, kind, color) in [
        ("live bytes", 0, LIVE_COLOR),
        ("own output bytes", 0, OWN_COLOR),
        ("planned arena", 1, PLANNED_COLOR),
        ("lower bound", 2, BOUND_COLOR),
    ] {
        if kind == 0 {
            let _ = writeln!(
                o,
                r#"<rect x="{}" y="{}" width="14" height="10" fill="{color}"/>"#,
                num(lx),
                num(ly - 9.0)
            );
        } else {
            let dash = if kind == 2 { DASH } else { "" };
            let _ = writeln!(
                o,
                r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{color}" stroke-width="2"{dash}/>"#,
                num(lx),
                num(ly - 4.0),
                num(lx + 14.0),
                num(ly - 4.0)
            );
        }
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}">{}</text>"#,
            num(lx + 19.0),
            num(ly),
            xml(label)
        );
        lx += 19.0 + 7.0 * label.len() as f64 + 22.0;
    }

    // Grid and y axis.
    let mut t = 0.0;
    while t <= y_max + tick * 1e-6 {
        let yy = y(t);
        let _ = writeln!(
            o,
            r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#e5e5e5"/>"##,
            num(left),
            num(yy),
            num(left + plot_w),
            num(yy)
        );
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            num(left - 6.0),
            num(yy + 4.0),
            xml(&tick_label(t, unit, tick))
        );
        t += tick;
    }
    let _ = writeln!(
        o,
        r#"<text transform="translate(16 {}) rotate(-90)" text-anchor="middle">bytes</text>"#,
        num(top + plot_h / 2.0)
    );

    // Bars (or areas) with a tooltip per step.
    let tip = |s: &super::plan::StepDetail| {
        xml(&format!(
            "step {}: {} ({})\nown outputs: {}\nlive: {}",
            s.step,
            s.name,
            s.op,
            human_bytes(s.own_bytes, 2),
            human_bytes(s.live_bytes, 2)
        ))
    };
    if thin {
        let live: Vec<usize> = shown.iter().map(|s| s.live_bytes).collect();
        let own: Vec<usize> = shown.iter().map(|s| s.own_bytes).collect();
        for (values, color) in [(live, LIVE_COLOR), (own, OWN_COLOR)] {
            let _ = writeln!(
                o,
                r#"<path fill="{color}" d="{}"/>"#,
                step_area(&values, left, step_w, &y, base)
            );
        }
        o.push_str("<g fill=\"transparent\">\n");
        for s in shown {
            let _ = writeln!(
                o,
                r#"<rect x="{}" y="{}" width="{}" height="{}"><title>{}</title></rect>"#,
                num(x(s.step as f64)),
                num(top),
                num(step_w),
                num(plot_h),
                tip(s)
            );
        }
        o.push_str("</g>\n");
    } else {
        let gap = if step_w >= 6.0 { step_w * 0.15 } else { 0.0 };
        let bw = step_w - gap;
        for s in shown {
            let bx = x(s.step as f64) + gap / 2.0;
            let _ = write!(o, "<g><title>{}</title>", tip(s));
            let _ = write!(
                o,
                r#"<rect x="{}" y="{}" width="{}" height="{}" fill="transparent"/>"#,
                num(bx),
                num(top),
                num(bw),
                num(plot_h)
            );
            for (b, color) in [(s.live_bytes, LIVE_COLOR), (s.own_bytes, OWN_COLOR)] {
                if b > 0 {
                    let _ = write!(
                        o,
                        r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{color}"/>"#,
                        num(bx),
                        num(y(b as f64)),
                        num(bw),
                        num(base - y(b as f64))
                    );
                }
            }
            o.push_str("</g>\n");
        }
    }

    // Axes and x ticks (at multiples of a nice step, labelled with true step numbers).
    let _ = writeln!(
        o,
        r##"<path d="M{} {}V{}H{}" fill="none" stroke="#333"/>"##,
        num(left),
        num(top),
        num(base),
        num(left + plot_w)
    );
    let xt = (nice_step(m.max(1) as f64, 1.0, (plot_w / 70.0).max(1.0)) as usize).max(1);
    let mut s = start.div_ceil(xt) * xt;
    while s < n {
        let xx = x(s as f64) + step_w / 2.0;
        let _ = writeln!(
            o,
            r##"<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="#333"/><text x="{0}" y="{3}" text-anchor="middle">{4}</text>"##,
            num(xx),
            num(base),
            num(base + 5.0),
            num(base + 18.0),
            s
        );
        s += xt;
    }
    let x_title = match start {
        0 => "schedule step".to_string(),
        1 => "schedule step (step 0 holds no arena memory and is not shown)".to_string(),
        _ => format!(
            "schedule step (steps 0–{} hold no arena memory and are not shown)",
            start - 1
        ),
    };
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        num(left + plot_w / 2.0),
        num(base + 40.0),
        xml(&x_title)
    );

    // The planned arena and the lower bound across the plot, labelled in the right
    // margin; when the two are close, the planned label goes above and the bound's below.
    let yp = y(plan.planned_bytes as f64);
    let yl = y(plan.lower_bound_bytes as f64);
    let close = (yl - yp).abs() < 28.0;
    for (bytes, yy, color, dash, label, shift) in [
        (
            plan.planned_bytes,
            yp,
            PLANNED_COLOR,
            "",
            "planned arena",
            if close { -9.0 } else { 0.0 },
        ),
        (
            plan.lower_bound_bytes,
            yl,
            BOUND_COLOR,
            DASH,
            "lower bound",
            if close { 19.0 } else { 0.0 },
        ),
    ] {
        let _ = writeln!(
            o,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{color}" stroke-width="2"{dash}/>"#,
            num(left),
            num(yy),
            num(left + plot_w),
            num(yy)
        );
        let lx = left + plot_w + 8.0;
        let ty = yy + shift;
        let _ = writeln!(
            o,
            r#"<text x="{0}" y="{1}" fill="{color}">{2}<tspan x="{0}" dy="13">{3}</tspan></text>"#,
            num(lx),
            num(ty - 3.0),
            label,
            xml(&human_bytes(bytes, 2))
        );
    }
    if m == 0 {
        let _ = writeln!(
            o,
            r##"<text x="{}" y="{}" text-anchor="middle" fill="#888">empty schedule</text>"##,
            num(left + plot_w / 2.0),
            num(top + plot_h / 2.0)
        );
    }
    o.push_str("</svg>\n");
    o
}

/// A y tick label: `t` bytes in `unit`, with as many decimals as the step needs.
fn tick_label(t: f64, unit: f64, tick: f64) -> String {
    if t == 0.0 {
        return "0".into();
    }
    let name = match unit as u64 {
        1 => "B",
        1024 => "KiB",
        1_048_576 => "MiB",
        1_073_741_824 => "GiB",
        _ => "TiB",
    };
    let step = tick / unit;
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{:.decimals$} {name}", t / unit)
}

/// A step-shaped closed path under `values`, one column of width `step_w` per value
/// from `x0`.
fn step_area(values: &[usize], x0: f64, step_w: f64, y: &impl Fn(f64) -> f64, base: f64) -> String {
    let mut d = format!("M{} {}", num(x0), num(base));
    let mut prev: Option<String> = None;
    for (s, &v) in values.iter().enumerate() {
        let yy = num(y(v as f64));
        if prev.as_deref() != Some(&yy) {
            let _ = write!(d, "V{yy}");
        }
        let _ = write!(d, "H{}", num(x0 + (s + 1) as f64 * step_w));
        prev = Some(yy);
    }
    let _ = write!(d, "V{}Z", num(base));
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Attrs;
    use crate::memory::plan::tests::f32s;
    use crate::memory::plan::{self, MemoryPlan};

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
