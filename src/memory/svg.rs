//! The memory report's SVG chart: live and own-output bytes per schedule step as bars
//! (or step-shaped areas when the steps are thin), the planned arena and the lower
//! bound as lines, a summary, a legend and a tooltip per step. Its escaping, tick and
//! number helpers are shared with [`super::plan_view`].
use std::fmt::Write;

use super::plan::{MemoryPlan, StepDetail};
use super::report::human_bytes;
use crate::ir::Graph;

/// `s` escaped for XML and HTML text and attribute values (SVG charts, `kiln viz`'s
/// page).
pub fn xml(s: &str) -> String {
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

/// A "nice" tick step (1, 2 or 5 × 10^k, scaled by `unit`) giving at most about
/// `max_ticks` intervals over `0..=max`.
pub(crate) fn nice_step(max: f64, unit: f64, max_ticks: f64) -> f64 {
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
pub(crate) fn axis_unit(max: f64) -> f64 {
    let mut unit = 1.0;
    while max / unit >= 1024.0 && unit < 1024f64.powi(4) {
        unit *= 1024.0;
    }
    unit
}

/// A number with at most 2 decimals, no trailing zeros: SVG coordinates.
pub(crate) fn num(v: f64) -> String {
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

/// The plot's geometry: where the plot area sits and how bytes and steps map onto it.
struct Chart {
    left: f64,
    top: f64,
    plot_w: f64,
    plot_h: f64,
    /// The plot's bottom edge (zero bytes).
    base: f64,
    width: f64,
    height: f64,
    step_w: f64,
    /// Steps too narrow for bars: drawn as areas.
    thin: bool,
    /// The first step shown.
    start: usize,
    /// The byte unit of the y labels, the tick step and the top of the y axis.
    unit: f64,
    tick: f64,
    y_max: f64,
}

impl Chart {
    /// The geometry for `plan` showing `m` steps from step `start`.
    fn new(plan: &MemoryPlan, start: usize, m: usize) -> Chart {
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
        let base = top + plot_h;
        Chart {
            left,
            top,
            plot_w,
            plot_h,
            base,
            width,
            height,
            step_w,
            thin,
            start,
            unit,
            tick,
            y_max,
        }
    }

    /// The y of `b` bytes.
    fn y(&self, b: f64) -> f64 {
        self.top + self.plot_h - b / self.y_max * self.plot_h
    }

    /// The left edge of absolute step `s`.
    fn x(&self, s: f64) -> f64 {
        self.left + (s - self.start as f64) * self.step_w
    }
}

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
    let c = Chart::new(plan, start, m);

    let mut o = String::new();
    header(&mut o, &c, plan, title, n);
    legend(&mut o);
    y_axis(&mut o, &c);
    bars(&mut o, &c, shown);
    x_axis(&mut o, &c, n, m);
    bound_lines(&mut o, &c, plan);
    if m == 0 {
        let _ = writeln!(
            o,
            r##"<text x="{}" y="{}" text-anchor="middle" fill="#888">empty schedule</text>"##,
            num(c.left + c.plot_w / 2.0),
            num(c.top + c.plot_h / 2.0)
        );
    }
    o.push_str("</svg>\n");
    o
}

/// The opening tag, the background, the title and the two-line summary.
fn header(o: &mut String, c: &Chart, plan: &MemoryPlan, title: &str, n: usize) {
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#,
        w = num(c.width),
        h = num(c.height)
    );
    let _ = writeln!(o, "<title>{}</title>", xml(title));
    let _ = writeln!(
        o,
        r#"<rect x="0" y="0" width="{}" height="{}" fill="white"/>"#,
        num(c.width),
        num(c.height)
    );

    // The title and a two-line summary.
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
}

/// The legend: a swatch or line sample and a label per series.
fn legend(o: &mut String) {
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
}

/// The horizontal grid lines with the y tick labels, and the y title.
fn y_axis(o: &mut String, c: &Chart) {
    let mut t = 0.0;
    while t <= c.y_max + c.tick * 1e-6 {
        let yy = c.y(t);
        let _ = writeln!(
            o,
            r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#e5e5e5"/>"##,
            num(c.left),
            num(yy),
            num(c.left + c.plot_w),
            num(yy)
        );
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            num(c.left - 6.0),
            num(yy + 4.0),
            xml(&tick_label(t, c.unit, c.tick))
        );
        t += c.tick;
    }
    let _ = writeln!(
        o,
        r#"<text transform="translate(16 {}) rotate(-90)" text-anchor="middle">bytes</text>"#,
        num(c.top + c.plot_h / 2.0)
    );
}

/// Per step the live and own-output bytes, as bars or (thin steps) two areas, each
/// step with a tooltip.
fn bars(o: &mut String, c: &Chart, shown: &[StepDetail]) {
    let tip = |s: &StepDetail| {
        xml(&format!(
            "step {}: {} ({})\nown outputs: {}\nlive: {}",
            s.step,
            s.name,
            s.op,
            human_bytes(s.own_bytes, 2),
            human_bytes(s.live_bytes, 2)
        ))
    };
    if c.thin {
        let live: Vec<usize> = shown.iter().map(|s| s.live_bytes).collect();
        let own: Vec<usize> = shown.iter().map(|s| s.own_bytes).collect();
        for (values, color) in [(live, LIVE_COLOR), (own, OWN_COLOR)] {
            let _ = writeln!(
                o,
                r#"<path fill="{color}" d="{}"/>"#,
                step_area(&values, c.left, c.step_w, &|b| c.y(b), c.base)
            );
        }
        o.push_str("<g fill=\"transparent\">\n");
        for s in shown {
            let _ = writeln!(
                o,
                r#"<rect x="{}" y="{}" width="{}" height="{}"><title>{}</title></rect>"#,
                num(c.x(s.step as f64)),
                num(c.top),
                num(c.step_w),
                num(c.plot_h),
                tip(s)
            );
        }
        o.push_str("</g>\n");
    } else {
        let gap = if c.step_w >= 6.0 {
            c.step_w * 0.15
        } else {
            0.0
        };
        let bw = c.step_w - gap;
        for s in shown {
            let bx = c.x(s.step as f64) + gap / 2.0;
            let _ = write!(o, "<g><title>{}</title>", tip(s));
            let _ = write!(
                o,
                r#"<rect x="{}" y="{}" width="{}" height="{}" fill="transparent"/>"#,
                num(bx),
                num(c.top),
                num(bw),
                num(c.plot_h)
            );
            for (b, color) in [(s.live_bytes, LIVE_COLOR), (s.own_bytes, OWN_COLOR)] {
                if b > 0 {
                    let _ = write!(
                        o,
                        r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{color}"/>"#,
                        num(bx),
                        num(c.y(b as f64)),
                        num(bw),
                        num(c.base - c.y(b as f64))
                    );
                }
            }
            o.push_str("</g>\n");
        }
    }
}

/// The axes' lines, the x ticks (true step numbers) and the x title.
fn x_axis(o: &mut String, c: &Chart, n: usize, m: usize) {
    // Axes and x ticks (at multiples of a nice step, labelled with true step numbers).
    let _ = writeln!(
        o,
        r##"<path d="M{} {}V{}H{}" fill="none" stroke="#333"/>"##,
        num(c.left),
        num(c.top),
        num(c.base),
        num(c.left + c.plot_w)
    );
    let xt = (nice_step(m.max(1) as f64, 1.0, (c.plot_w / 70.0).max(1.0)) as usize).max(1);
    let mut s = c.start.div_ceil(xt) * xt;
    while s < n {
        let xx = c.x(s as f64) + c.step_w / 2.0;
        let _ = writeln!(
            o,
            r##"<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="#333"/><text x="{0}" y="{3}" text-anchor="middle">{4}</text>"##,
            num(xx),
            num(c.base),
            num(c.base + 5.0),
            num(c.base + 18.0),
            s
        );
        s += xt;
    }
    let x_title = match c.start {
        0 => "schedule step".to_string(),
        1 => "schedule step (step 0 holds no arena memory and is not shown)".to_string(),
        _ => format!(
            "schedule step (steps 0–{} hold no arena memory and are not shown)",
            c.start - 1
        ),
    };
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        num(c.left + c.plot_w / 2.0),
        num(c.base + 40.0),
        xml(&x_title)
    );
}

/// The planned arena and the lower bound across the plot, labelled in the right margin.
fn bound_lines(o: &mut String, c: &Chart, plan: &MemoryPlan) {
    // The planned arena and the lower bound across the plot, labelled in the right
    // margin; when the two are close, the planned label goes above and the bound's below.
    let yp = c.y(plan.planned_bytes as f64);
    let yl = c.y(plan.lower_bound_bytes as f64);
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
            num(c.left),
            num(yy),
            num(c.left + c.plot_w),
            num(yy)
        );
        let lx = c.left + c.plot_w + 8.0;
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
}

/// A y tick label: `t` bytes in `unit`, with as many decimals as the step needs.
pub(crate) fn tick_label(t: f64, unit: f64, tick: f64) -> String {
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
