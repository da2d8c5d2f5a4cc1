//! The execution plan as a picture, Poplar-style: schedule steps along x, the arena's
//! addresses along y, every arena value a rectangle at its planned offset from the step
//! that makes it to the last step that reads it, so addresses handed from one value to
//! the next show as rectangles side by side at one height. A strip under the plot
//! colours each step by its kernel kind and, when the steps were timed, bars show each
//! step's time. [`to_svg`] is the picture alone (the browser's own tooltips);
//! [`to_html`] embeds it with instant tooltips, a step guide and a table of the steps.
//!
//! Pure rendering, deterministic: what the backend knows of its steps comes in as
//! [`StepNote`]s (memory may not import the backends).
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use super::plan::{MemoryPlan, StepDetail};
use super::report::human_bytes;
use super::svg::{axis_unit, nice_step, num, tick_label, xml};
use crate::ir::{Graph, NodeId, Value};

/// What a backend knows of one step of its program. Several may come from one node;
/// a node with none (a view, a source) is drawn as "no kernel".
#[derive(Debug, Clone, PartialEq)]
pub struct StepNote {
    /// The node it came from, a step of the plan's schedule.
    pub node: NodeId,
    /// Its kernel (`gemm`, `conv-blocked`, …).
    pub kind: String,
    /// Its operands' and results' shapes (`1×64×56×56, … → …`; may be empty).
    pub shapes: String,
    /// Its floating-point work per run.
    pub flops: f64,
    /// Its measured time per run, when it was timed.
    pub seconds: Option<f64>,
}

/// The kind of a step with notes for none of its node's work, when others have notes.
const NO_KERNEL: &str = "no kernel";
const NO_KERNEL_COLOR: &str = "#c8c8c8";
/// Distinct colours for the commonest kinds; rarer ones get a hue from their name.
const PALETTE: [&str; 18] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d",
    "#31a354", "#756bb1",
];
const PLANNED_COLOR: &str = "#000000";
const BOUND_COLOR: &str = "#666666";
const LIVE_COLOR: &str = "#444444";

/// One step of the schedule as drawn: its plan detail and its notes gathered.
struct Step<'a> {
    detail: &'a StepDetail,
    /// Its kernel kinds in program order, without repeats (empty: no kernel).
    kinds: Vec<&'a str>,
    shapes: Vec<&'a str>,
    kernels: usize,
    flops: f64,
    seconds: Option<f64>,
}

impl Step<'_> {
    /// The kind it is coloured by.
    fn kind(&self) -> &str {
        self.kinds.first().copied().unwrap_or(NO_KERNEL)
    }
}

/// Everything the picture needs, gathered once.
struct View<'a> {
    plan: &'a MemoryPlan,
    g: Option<&'a Graph>,
    title: &'a str,
    steps: Vec<Step<'a>>,
    /// Each scheduled node's step.
    index: HashMap<NodeId, usize>,
    /// The steps drawn, as indices into `steps` (sources holding nothing are left out).
    cols: Vec<usize>,
    /// Per schedule step: its column, and the column after it (equal when not drawn).
    col_start: Vec<usize>,
    col_end: Vec<usize>,
    /// Kinds by how many steps have them (most first), with their colours.
    kinds: Vec<(String, usize, String)>,
    timed: bool,
}

impl<'a> View<'a> {
    fn new(
        plan: &'a MemoryPlan,
        g: Option<&'a Graph>,
        notes: &'a [StepNote],
        title: &'a str,
    ) -> View<'a> {
        let index: HashMap<NodeId, usize> = plan.steps.iter().map(|s| (s.node, s.step)).collect();
        let mut steps: Vec<Step> = plan
            .steps
            .iter()
            .map(|detail| Step {
                detail,
                kinds: vec![],
                shapes: vec![],
                kernels: 0,
                flops: 0.0,
                seconds: None,
            })
            .collect();
        for n in notes {
            // A note for a node the plan does not schedule has nowhere to go.
            let Some(s) = index.get(&n.node).and_then(|&i| steps.get_mut(i)) else {
                continue;
            };
            if !s.kinds.contains(&n.kind.as_str()) {
                s.kinds.push(&n.kind);
            }
            if !n.shapes.is_empty() {
                s.shapes.push(&n.shapes);
            }
            s.kernels += 1;
            s.flops += n.flops;
            if let Some(t) = n.seconds {
                s.seconds = Some(s.seconds.unwrap_or(0.0) + t);
            }
        }
        // Without any notes (a plan drawn without a program) the op stands for the kind.
        if notes.is_empty() {
            for s in &mut steps {
                s.kinds.push(&s.detail.op);
            }
        }
        let is_source = |s: &Step| {
            matches!(s.detail.op.as_str(), "Constant" | "Parameter" | "Variable")
                && s.kernels == 0
                && s.detail.own_bytes == 0
        };
        let mut cols = vec![];
        let mut col_start = vec![];
        let mut col_end = vec![];
        for (i, s) in steps.iter().enumerate() {
            col_start.push(cols.len());
            if !is_source(s) {
                cols.push(i);
            }
            col_end.push(cols.len());
        }
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for &c in &cols {
            *count.entry(steps[c].kind()).or_default() += 1;
        }
        let mut by_count: Vec<(&str, usize)> = count.into_iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let mut next = 0;
        let kinds = by_count
            .into_iter()
            .map(|(k, n)| {
                let color = if k == NO_KERNEL && !notes.is_empty() {
                    NO_KERNEL_COLOR.to_string()
                } else if next < PALETTE.len() {
                    next += 1;
                    PALETTE[next - 1].to_string()
                } else {
                    hue_of(k)
                };
                (k.to_string(), n, color)
            })
            .collect();
        let timed = steps.iter().any(|s| s.seconds.is_some());
        View {
            plan,
            g,
            title,
            steps,
            index,
            cols,
            col_start,
            col_end,
            kinds,
            timed,
        }
    }

    fn color(&self, kind: &str) -> &str {
        self.kinds
            .iter()
            .find(|k| k.0 == kind)
            .map_or(NO_KERNEL_COLOR, |k| k.2.as_str())
    }

    /// `conv1:0`, with its type when the graph is known: a value as its node's name
    /// and output index.
    fn value_name(&self, v: Value) -> String {
        let name = self.index.get(&v.node).map_or_else(
            || format!("#{}", v.node.0),
            |&i| self.steps[i].detail.name.clone(),
        );
        let ty = self
            .g
            .and_then(|g| g.nodes().get(v.node.0 as usize))
            .and_then(|n| n.outputs.get(v.output as usize))
            .map(|t| format!(" {t}"))
            .unwrap_or_default();
        format!("{name}:{}{ty}", v.output)
    }

    /// The node's operand and result types from the graph, else the notes' shapes.
    fn shapes(&self, s: &Step) -> String {
        let from_graph = self.g.and_then(|g| {
            let n = g.nodes().get(s.detail.node.0 as usize)?;
            let ins: Vec<String> = n
                .inputs
                .iter()
                .flatten()
                .map(|v| {
                    g.nodes()
                        .get(v.node.0 as usize)
                        .and_then(|m| m.outputs.get(v.output as usize))
                        .map_or_else(|| "?".to_string(), |t| t.to_string())
                })
                .collect();
            let outs: Vec<String> = n.outputs.iter().map(|t| t.to_string()).collect();
            Some(format!("{} → {}", ins.join(", "), outs.join(", ")))
        });
        from_graph.unwrap_or_else(|| s.shapes.join("; "))
    }

    /// A step's tooltip text.
    fn step_tip(&self, s: &Step) -> String {
        let d = s.detail;
        let mut t = format!(
            "step {}: node #{} '{}' ({})\nkernel: {}",
            d.step,
            d.node.0,
            d.name,
            d.op,
            if s.kinds.is_empty() {
                NO_KERNEL.to_string()
            } else {
                s.kinds.join(" + ")
            }
        );
        let shapes = self.shapes(s);
        if !shapes.is_empty() {
            let _ = write!(t, "\nshapes: {shapes}");
        }
        if s.flops > 0.0 {
            let _ = write!(t, "\nFLOPs: {}", human_flops(s.flops));
        }
        if let Some(secs) = s.seconds {
            let _ = write!(t, "\nmeasured: {} per run", human_secs(secs));
            if s.flops > 0.0 && secs > 0.0 {
                let _ = write!(t, " ({:.1} GFLOP/s)", s.flops / secs / 1e9);
            }
        }
        let _ = write!(
            t,
            "\nlive: {}, own outputs: {}",
            human_bytes(d.live_bytes, 2),
            human_bytes(d.own_bytes, 2)
        );
        t
    }
}

/// A colour for a kind past the palette: a hue from its name (FNV-1a), stable.
fn hue_of(kind: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in kind.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    format!("hsl({},55%,45%)", h % 360)
}

fn human_flops(f: f64) -> String {
    let (v, u) = if f >= 1e9 {
        (f / 1e9, "G")
    } else if f >= 1e6 {
        (f / 1e6, "M")
    } else if f >= 1e3 {
        (f / 1e3, "k")
    } else {
        (f, "")
    };
    format!("{v:.2} {u}FLOP")
}

fn human_secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// The picture's geometry.
struct Layout {
    left: f64,
    top: f64,
    plot_w: f64,
    plot_h: f64,
    /// The plot's bottom edge: offset 0.
    base: f64,
    width: f64,
    height: f64,
    step_w: f64,
    /// The kind strip and the time bars (0 high when untimed).
    band_y: f64,
    band_h: f64,
    time_y: f64,
    time_h: f64,
    /// The x ticks' line.
    axis_y: f64,
    /// The y labels' byte unit, tick step and the top of the y axis.
    unit: f64,
    tick: f64,
    y_max: f64,
    /// Where each legend entry goes: kind index → (x, y).
    legend: Vec<(f64, f64)>,
}

const CHAR_W: f64 = 6.8;

impl Layout {
    fn new(v: &View) -> Layout {
        let n = v.cols.len();
        let plot_w = (n as f64 * 8.0).clamp(1000.0, 2000.0);
        let (left, right) = (84.0, 150.0);
        let width = left + plot_w + right;
        // The legend: the line series, then the kinds, wrapped to the width.
        let mut legend = vec![];
        let (mut x, mut y) = (16.0, 84.0);
        let labels = [
            "tensor (by its step's kind)".to_string(),
            "live bytes".to_string(),
            "planned arena".to_string(),
            "lower bound".to_string(),
        ]
        .into_iter()
        .chain(v.kinds.iter().map(|(k, c, _)| format!("{k} ×{c}")));
        for label in labels {
            let w = 20.0 + CHAR_W * label.chars().count() as f64 + 18.0;
            if x + w > width - 16.0 && x > 16.0 {
                x = 16.0;
                y += 18.0;
            }
            legend.push((x, y));
            x += w;
        }
        let top = y + 26.0;
        let plot_h = 520.0;
        let base = top + plot_h;
        let band_y = base + 6.0;
        let band_h = 16.0;
        let time_y = band_y + band_h + 6.0;
        let time_h = if v.timed { 64.0 } else { 0.0 };
        let axis_y = if v.timed {
            time_y + time_h + 4.0
        } else {
            band_y + band_h + 4.0
        };
        let height = axis_y + 52.0;
        let peak_live = v.plan.steps.iter().map(|s| s.live_bytes).max().unwrap_or(0);
        let y_data = v.plan.planned_bytes.max(peak_live).max(1) as f64;
        let unit = axis_unit(y_data);
        let tick = nice_step(y_data * 1.02, unit, 8.0);
        let y_max = ((y_data * 1.02) / tick).ceil() * tick;
        Layout {
            left,
            top,
            plot_w,
            plot_h,
            base,
            width,
            height,
            step_w: plot_w / n.max(1) as f64,
            band_y,
            band_h,
            time_y,
            time_h,
            axis_y,
            unit,
            tick,
            y_max,
            legend,
        }
    }

    /// The y of arena offset `b`.
    fn y(&self, b: f64) -> f64 {
        self.base - b / self.y_max * self.plot_h
    }

    /// The left edge of column `c`.
    fn x(&self, c: usize) -> f64 {
        self.left + c as f64 * self.step_w
    }
}

/// The plan as a self-contained SVG: rectangles of the arena's values by step and
/// offset, the steps' kernel kinds (and times, when the notes have them) in strips
/// below, the planned arena, lower bound and live bytes as lines, and a legend with
/// the naive, planned and lower-bound bytes. `notes` are the backend's steps; `g`, the
/// graph the plan was made from, adds types to the tooltips. Deterministic.
pub fn to_svg(plan: &MemoryPlan, g: Option<&Graph>, notes: &[StepNote], title: &str) -> String {
    let v = View::new(plan, g, notes, title);
    svg(&v, &Layout::new(&v))
}

fn svg(v: &View, l: &Layout) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#,
        w = num(l.width),
        h = num(l.height)
    );
    let _ = writeln!(o, "<title>{}</title>", xml(v.title));
    let _ = writeln!(
        o,
        r#"<rect x="0" y="0" width="{}" height="{}" fill="white"/>"#,
        num(l.width),
        num(l.height)
    );
    header(&mut o, v);
    legend(&mut o, v, l);
    y_axis(&mut o, l);
    steps(&mut o, v, l);
    tensors(&mut o, v, l);
    lines(&mut o, v, l);
    x_axis(&mut o, v, l);
    if v.cols.is_empty() {
        let _ = writeln!(
            o,
            r##"<text x="{}" y="{}" text-anchor="middle" fill="#888">empty schedule</text>"##,
            num(l.left + l.plot_w / 2.0),
            num(l.top + l.plot_h / 2.0)
        );
    }
    o.push_str("</svg>\n");
    o
}

/// The title and two summary lines: the three byte counts, then counts of things.
fn header(o: &mut String, v: &View) {
    let p = v.plan;
    let _ = writeln!(
        o,
        r#"<text x="16" y="24" font-size="16" font-weight="bold">{}</text>"#,
        xml(v.title)
    );
    let saved = if p.naive_bytes > 0 {
        100.0 * (1.0 - p.planned_bytes as f64 / p.naive_bytes as f64)
    } else {
        0.0
    };
    let flops: f64 = v.steps.iter().map(|s| s.flops).sum();
    let mut second = format!(
        "{} steps drawn of {} · {} buffers · {} values · {} in-place reuses · {}",
        v.cols.len(),
        v.steps.len(),
        p.buffers.len(),
        p.values.len(),
        p.inplace_reuses,
        p.strategy
    );
    if flops > 0.0 {
        let _ = write!(second, " · {}", human_flops(flops));
    }
    if v.timed {
        let total: f64 = v.steps.iter().filter_map(|s| s.seconds).sum();
        let _ = write!(second, " · measured {} per run", human_secs(total));
    }
    let lines = [
        format!(
            "naive {} · planned arena {} ({saved:.1}% saved) · lower bound {} (planned ×{:.3})",
            human_bytes(p.naive_bytes, 2),
            human_bytes(p.planned_bytes, 2),
            human_bytes(p.lower_bound_bytes, 2),
            p.ratio_to_lower_bound()
        ),
        second,
    ];
    for (i, line) in lines.iter().enumerate() {
        let _ = writeln!(
            o,
            r##"<text x="16" y="{}" fill="#333">{}</text>"##,
            44 + 17 * i,
            xml(line)
        );
    }
}

fn legend(o: &mut String, v: &View, l: &Layout) {
    let series = [
        ("tensor (by its step's kind)", 0, "#9ecae1"),
        ("live bytes", 1, LIVE_COLOR),
        ("planned arena", 2, PLANNED_COLOR),
        ("lower bound", 3, BOUND_COLOR),
    ];
    for (&(x, y), (label, kind, color)) in l.legend.iter().zip(series) {
        match kind {
            0 => {
                let _ = write!(
                    o,
                    r#"<rect x="{}" y="{}" width="14" height="10" fill="{color}" fill-opacity="0.6" stroke="{color}"/>"#,
                    num(x),
                    num(y - 9.0)
                );
            }
            _ => {
                let dash = if kind == 3 {
                    r#" stroke-dasharray="6 3""#
                } else {
                    ""
                };
                let _ = write!(
                    o,
                    r#"<line x1="{}" y1="{y1}" x2="{}" y2="{y1}" stroke="{color}" stroke-width="{}"{dash}/>"#,
                    num(x),
                    num(x + 14.0),
                    if kind == 1 { "1" } else { "2" },
                    y1 = num(y - 4.0),
                );
            }
        }
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}">{}</text>"#,
            num(x + 19.0),
            num(y),
            xml(label)
        );
    }
    for (&(x, y), (kind, count, color)) in l.legend.iter().skip(series.len()).zip(&v.kinds) {
        let _ = writeln!(
            o,
            r#"<rect x="{}" y="{}" width="14" height="10" fill="{color}"/><text x="{}" y="{}">{} ×{count}</text>"#,
            num(x),
            num(y - 9.0),
            num(x + 19.0),
            num(y),
            xml(kind)
        );
    }
}

fn y_axis(o: &mut String, l: &Layout) {
    let mut t = 0.0;
    while t <= l.y_max + l.tick * 1e-6 {
        let yy = l.y(t);
        let _ = writeln!(
            o,
            r##"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#e8e8e8"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            num(l.left),
            num(l.left + l.plot_w),
            num(l.left - 6.0),
            num(yy + 4.0),
            xml(&tick_label(t, l.unit, l.tick)),
            y = num(yy),
        );
        t += l.tick;
    }
    let _ = writeln!(
        o,
        r#"<text transform="translate(16 {}) rotate(-90)" text-anchor="middle">arena offset</text>"#,
        num(l.top + l.plot_h / 2.0)
    );
}

/// Per drawn step, one group: a transparent column over the plot (hovered where no
/// tensor is), its cell in the kind strip and its time bar, with the step's tooltip.
fn steps(o: &mut String, v: &View, l: &Layout) {
    let max_secs = v
        .steps
        .iter()
        .filter_map(|s| s.seconds)
        .fold(0.0f64, f64::max);
    if v.timed {
        let _ = writeln!(
            o,
            r##"<text x="{}" y="{}" text-anchor="end" fill="#333">time</text><text x="{}" y="{}" text-anchor="end" fill="#777" font-size="10">{}</text>"##,
            num(l.left - 6.0),
            num(l.time_y + l.time_h / 2.0 + 4.0),
            num(l.left - 6.0),
            num(l.time_y + 9.0),
            xml(&human_secs(max_secs))
        );
    }
    let _ = writeln!(
        o,
        r##"<text x="{}" y="{}" text-anchor="end" fill="#333">kernel</text>"##,
        num(l.left - 6.0),
        num(l.band_y + 12.0)
    );
    let bottom = if v.timed {
        l.time_y + l.time_h
    } else {
        l.band_y + l.band_h
    };
    for (c, &i) in v.cols.iter().enumerate() {
        let s = &v.steps[i];
        let x = l.x(c);
        let color = v.color(s.kind());
        let _ = write!(
            o,
            r#"<g class="step" data-x="{}" data-w="{}"><title>{}</title><rect x="{}" y="{}" width="{}" height="{}" fill="transparent"/>"#,
            num(x),
            num(l.step_w),
            xml(&v.step_tip(s)),
            num(x),
            num(l.top),
            num(l.step_w),
            num(bottom - l.top)
        );
        let _ = write!(
            o,
            r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{color}"/>"#,
            num(x),
            num(l.band_y),
            num(l.step_w),
            num(l.band_h)
        );
        if let (Some(secs), true) = (s.seconds, max_secs > 0.0) {
            let h = secs / max_secs * l.time_h;
            let _ = write!(
                o,
                r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{color}"/>"#,
                num(x),
                num(l.time_y + l.time_h - h),
                num(l.step_w),
                num(h)
            );
        }
        o.push_str("</g>\n");
    }
}

/// Every arena value: a rectangle from its step to its last reader's, at its buffer's
/// offset, filled with the colour of the kind that made it.
fn tensors(o: &mut String, v: &View, l: &Layout) {
    let p = v.plan;
    o.push_str("<g class=\"tensors\" stroke-width=\"0.6\" fill-opacity=\"0.55\">\n");
    for val in &p.values {
        let Some(b) = p.buffers.get(val.buffer) else {
            continue;
        };
        let (Some(&c0), Some(&c1)) = (v.col_start.get(val.def), v.col_end.get(val.last)) else {
            continue;
        };
        let x0 = l.x(c0);
        let x1 = l.x(c1.max(c0));
        let y = l.y((b.offset + b.size) as f64);
        let h = l.y(b.offset as f64) - y;
        let color = v
            .steps
            .get(val.def)
            .map_or(NO_KERNEL_COLOR, |s| v.color(s.kind()));
        let mut tip = format!(
            "{}\n{} ({} B; {} B reserved)\noffset {} … {} B\nsteps {}–{}",
            v.value_name(val.value),
            human_bytes(val.bytes, 2),
            val.bytes,
            b.size,
            b.offset,
            b.offset + b.size,
            val.def,
            val.last
        );
        if let Some(r) = val.reuses {
            let _ = write!(tip, "\ntook over {} in place", v.value_name(r));
        }
        if b.values.len() > 1 {
            let _ = write!(
                tip,
                "\nbuffer {}: {} values, steps {}–{}",
                val.buffer,
                b.values.len(),
                b.first,
                b.last
            );
        }
        let _ = writeln!(
            o,
            r#"<rect class="t" data-buffer="{}" data-offset="{}" data-size="{}" x="{}" y="{}" width="{}" height="{}" fill="{color}" stroke="{color}"><title>{}</title></rect>"#,
            val.buffer,
            b.offset,
            b.size,
            num(x0),
            num(y),
            num(x1 - x0),
            num(h),
            xml(&tip)
        );
    }
    o.push_str("</g>\n");
}

/// The live bytes per step (a step-shaped line), the planned arena and the lower bound,
/// the last two labelled in the right margin.
fn lines(o: &mut String, v: &View, l: &Layout) {
    if !v.cols.is_empty() {
        let mut d = String::new();
        for (c, &i) in v.cols.iter().enumerate() {
            let y = num(l.y(v.steps[i].detail.live_bytes as f64));
            let _ = write!(
                d,
                "{}{} {y}H{}",
                if c == 0 { "M" } else { "L" },
                num(l.x(c)),
                num(l.x(c + 1))
            );
        }
        let _ = writeln!(
            o,
            r#"<path class="live" d="{d}" fill="none" stroke="{LIVE_COLOR}" stroke-width="1" pointer-events="none"/>"#
        );
    }
    let p = v.plan;
    let yp = l.y(p.planned_bytes as f64);
    let yl = l.y(p.lower_bound_bytes as f64);
    let close = (yl - yp).abs() < 28.0;
    for (bytes, yy, color, dash, label, shift) in [
        (
            p.planned_bytes,
            yp,
            PLANNED_COLOR,
            "",
            "planned arena",
            if close { -9.0 } else { 0.0 },
        ),
        (
            p.lower_bound_bytes,
            yl,
            BOUND_COLOR,
            r#" stroke-dasharray="6 3""#,
            "lower bound",
            if close { 19.0 } else { 0.0 },
        ),
    ] {
        let _ = writeln!(
            o,
            r#"<line class="bound" x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="{color}" stroke-width="1.5"{dash} pointer-events="none"/>"#,
            num(l.left),
            num(l.left + l.plot_w),
            y = num(yy),
        );
        let lx = l.left + l.plot_w + 8.0;
        let _ = writeln!(
            o,
            r#"<text x="{0}" y="{1}" fill="{color}">{2}<tspan x="{0}" dy="13">{3}</tspan></text>"#,
            num(lx),
            num(yy + shift - 3.0),
            label,
            xml(&human_bytes(bytes, 2))
        );
    }
}

/// The axes, x ticks at nice column counts labelled with schedule steps, the x title.
fn x_axis(o: &mut String, v: &View, l: &Layout) {
    let _ = writeln!(
        o,
        r##"<path d="M{} {}V{}H{}" fill="none" stroke="#333"/>"##,
        num(l.left),
        num(l.top),
        num(l.base),
        num(l.left + l.plot_w)
    );
    let n = v.cols.len();
    let every = (nice_step(n.max(1) as f64, 1.0, (l.plot_w / 70.0).max(1.0)) as usize).max(1);
    for c in (0..n).step_by(every) {
        let xx = l.x(c) + l.step_w / 2.0;
        let _ = writeln!(
            o,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#333"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            num(l.axis_y),
            num(l.axis_y + 5.0),
            num(l.axis_y + 18.0),
            v.steps[v.cols[c]].detail.step,
            x = num(xx),
        );
    }
    let hidden = v.steps.len() - n;
    let title = if hidden > 0 {
        let s = if hidden == 1 { "" } else { "s" };
        format!("schedule step (not drawn: {hidden} source step{s} holding no arena memory)")
    } else {
        "schedule step".to_string()
    };
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        num(l.left + l.plot_w / 2.0),
        num(l.axis_y + 40.0),
        xml(&title)
    );
}

/// The plan as a self-contained HTML page: [`to_svg`]'s picture with instant tooltips
/// (a step's column is marked, a tensor outlined), then a table of the drawn steps.
/// No network: the style and script are inline. Deterministic.
pub fn to_html(plan: &MemoryPlan, g: Option<&Graph>, notes: &[StepNote], title: &str) -> String {
    let v = View::new(plan, g, notes, title);
    let l = Layout::new(&v);
    let mut o = String::new();
    let _ = writeln!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>",
        xml(title)
    );
    o.push_str("<div id=\"plot\">\n");
    o.push_str(&svg(&v, &l));
    o.push_str("</div>\n<div id=\"tip\"></div>\n");
    step_table(&mut o, &v);
    let _ = writeln!(o, "<script>{SCRIPT}</script>\n</body>\n</html>");
    o
}

/// The drawn steps, one a row.
fn step_table(o: &mut String, v: &View) {
    o.push_str("<h2>Steps</h2>\n<table>\n<tr><th>step</th><th>node</th><th>op</th><th>kernel</th><th>shapes</th><th>FLOPs</th>");
    if v.timed {
        o.push_str("<th>time/run</th>");
    }
    o.push_str("<th>live</th></tr>\n");
    for &i in &v.cols {
        let s = &v.steps[i];
        let d = s.detail;
        let kinds = if s.kinds.is_empty() {
            NO_KERNEL.to_string()
        } else {
            s.kinds.join(" + ")
        };
        let _ = write!(
            o,
            "<tr><td>{}</td><td>#{} {}</td><td>{}</td><td><span class=\"sw\" style=\"background:{}\"></span>{}</td><td>{}</td><td>{}</td>",
            d.step,
            d.node.0,
            xml(&d.name),
            xml(&d.op),
            v.color(s.kind()),
            xml(&kinds),
            xml(&v.shapes(s)),
            if s.flops > 0.0 {
                human_flops(s.flops)
            } else {
                String::new()
            }
        );
        if v.timed {
            let _ = write!(
                o,
                "<td>{}</td>",
                s.seconds.map(human_secs).unwrap_or_default()
            );
        }
        let _ = writeln!(o, "<td>{}</td></tr>", human_bytes(d.live_bytes, 2));
    }
    o.push_str("</table>\n");
}

const STYLE: &str = "
body{font-family:Helvetica,Arial,sans-serif;font-size:13px;margin:12px;color:#222}
#plot{overflow-x:auto}
#tip{position:fixed;display:none;pointer-events:none;background:#fffff4;border:1px solid #999;
padding:6px 8px;white-space:pre;font-size:12px;box-shadow:2px 2px 6px rgba(0,0,0,.25);max-width:900px;overflow:hidden}
rect.t.hl{stroke:#000;stroke-width:2;fill-opacity:.9}
table{border-collapse:collapse;font-size:12px}
td,th{border-bottom:1px solid #ddd;padding:2px 8px;text-align:left;vertical-align:top}
.sw{display:inline-block;width:10px;height:10px;margin-right:5px}
h2{font-size:15px;margin:18px 0 6px}
";

/// The tooltips: each `<title>` becomes a `data-tip` shown at once in a box; hovering a
/// step draws a guide over its column, hovering a tensor outlines it. Reads only the
/// page's own (escaped) text.
const SCRIPT: &str = "
(function(){
var svg=document.querySelector('#plot svg'),tip=document.getElementById('tip');
var ns='http://www.w3.org/2000/svg';
svg.querySelectorAll('title').forEach(function(t){
  if(t.parentNode!==svg){t.parentNode.setAttribute('data-tip',t.textContent);t.remove();}
});
var guide=document.createElementNS(ns,'rect');
guide.setAttribute('fill','rgba(0,0,0,0.08)');guide.setAttribute('stroke','#000');
guide.setAttribute('stroke-width','0.5');guide.setAttribute('pointer-events','none');
guide.style.display='none';svg.appendChild(guide);
var lit=null;
function clear(){if(lit){lit.classList.remove('hl');lit=null;}guide.style.display='none';}
svg.addEventListener('mousemove',function(e){
  var el=e.target.closest('[data-tip]');clear();
  if(!el){tip.style.display='none';return;}
  if(el.classList.contains('step')){
    var bb=svg.viewBox.baseVal;
    guide.setAttribute('x',el.getAttribute('data-x'));guide.setAttribute('y',0);
    guide.setAttribute('width',Math.max(1,+el.getAttribute('data-w')));
    guide.setAttribute('height',bb.height);guide.style.display='';
  }else{lit=el;el.classList.add('hl');}
  tip.textContent=el.getAttribute('data-tip');tip.style.display='block';
  var x=e.clientX+14,y=e.clientY+14,w=tip.offsetWidth,h=tip.offsetHeight;
  if(x+w>innerWidth)x=Math.max(0,e.clientX-w-14);
  if(y+h>innerHeight)y=Math.max(0,e.clientY-h-14);
  tip.style.left=x+'px';tip.style.top=y+'px';
});
svg.addEventListener('mouseleave',function(){clear();tip.style.display='none';});
})();
";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Attrs;
    use crate::memory::plan::tests::f32s;
    use crate::memory::plan::{self, MemoryPlan};

    /// `a = relu(x), h = exp(y), c = a + h, d = tanh(c), e = d · a`: three buffers of
    /// different sizes and lifetimes, one taken over in place, and a hostile node name.
    fn small() -> (Graph, MemoryPlan) {
        let mut g = Graph::new("small");
        let x = g.add_parameter("x", f32s(&[8, 64])).unwrap();
        let y = g.add_parameter("y", f32s(&[8, 1])).unwrap();
        let a = g.op("Relu", &[x.into()], Attrs::new(), "a").unwrap();
        let h = g.op("Exp", &[y.into()], Attrs::new(), "<b>&\"'").unwrap();
        let c = g
            .op("Add", &[a.into(), h.into()], Attrs::new(), "c")
            .unwrap();
        let d = g.op("Tanh", &[c.into()], Attrs::new(), "d").unwrap();
        let e = g
            .op("Mul", &[d.into(), a.into()], Attrs::new(), "e")
            .unwrap();
        g.add_output("z", e.into()).unwrap();
        let p = plan::plan(&g, &g.schedule().unwrap()).unwrap();
        (g, p)
    }

    fn notes(g: &Graph, timed: bool) -> Vec<StepNote> {
        g.schedule()
            .unwrap()
            .into_iter()
            .filter(|&id| g.node(id).op != "Parameter")
            .enumerate()
            .map(|(i, id)| StepNote {
                node: id,
                kind: if i % 2 == 0 { "binary" } else { "unary" }.into(),
                shapes: "8×64 → 8×64".into(),
                flops: 0.0,
                seconds: timed.then_some(1e-6 * (i + 1) as f64),
            })
            .collect()
    }

    fn attr(tag: &str, name: &str) -> f64 {
        let key = format!(" {name}=\"");
        tag.split(&key)
            .nth(1)
            .and_then(|s| s.split('"').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {tag}"))
    }

    /// The tensor rectangles: (offset, size, y, height).
    fn rects(svg: &str) -> Vec<(f64, f64, f64, f64)> {
        svg.split("<rect class=\"t\"")
            .skip(1)
            .map(|t| {
                let tag = t.split('>').next().unwrap();
                (
                    attr(tag, "data-offset"),
                    attr(tag, "data-size"),
                    attr(tag, "y"),
                    attr(tag, "height"),
                )
            })
            .collect()
    }

    #[test]
    fn rectangles_at_the_planned_offsets() {
        let (g, p) = small();
        assert!(p.buffers.len() >= 3, "{:?}", p.buffers);
        assert!(p.inplace_reuses >= 1);
        let svg = to_svg(&p, Some(&g), &notes(&g, false), "small");
        let rs = rects(&svg);
        assert_eq!(rs.len(), p.values.len(), "one rectangle per value");
        // Every rectangle's bottom is its offset and its height its size, on one scale.
        let (_, size0, y0, h0) = *rs.iter().find(|r| r.0 == 0.0).unwrap();
        let scale = h0 / size0;
        let base = y0 + h0;
        for (val, &(off, size, y, h)) in p.values.iter().zip(&rs) {
            let b = &p.buffers[val.buffer];
            assert_eq!((off, size), (b.offset as f64, b.size as f64));
            assert!((h - size * scale).abs() < 0.02, "{val:?}: height {h}");
            assert!((base - y - h - off * scale).abs() < 0.02, "{val:?}: y {y}");
        }
        // Across each drawn step's column, the buffers drawn are the bytes live there.
        let drawn: Vec<&StepDetail> = p.steps.iter().filter(|s| s.op != "Parameter").collect();
        let columns: Vec<(f64, f64)> = svg
            .split("<g class=\"step\"")
            .skip(1)
            .map(|t| {
                let tag = t.split('>').next().unwrap();
                (attr(tag, "data-x"), attr(tag, "data-w"))
            })
            .collect();
        assert_eq!(columns.len(), drawn.len());
        for (s, (x, w)) in drawn.iter().zip(columns) {
            let mid = x + w / 2.0;
            let mut live: Vec<(usize, usize)> = svg
                .split("<rect class=\"t\"")
                .skip(1)
                .map(|t| t.split('>').next().unwrap())
                .filter(|t| attr(t, "x") <= mid && mid <= attr(t, "x") + attr(t, "width"))
                .map(|t| {
                    (
                        attr(t, "data-buffer") as usize,
                        attr(t, "data-size") as usize,
                    )
                })
                .collect();
            live.dedup();
            let bytes: usize = live.iter().map(|b| b.1).sum();
            assert_eq!(bytes, s.live_bytes, "step {}", s.step);
        }
        // Two buffers sharing addresses never overlap in time.
        for (i, a) in p.buffers.iter().enumerate() {
            for b in &p.buffers[i + 1..] {
                let addr = a.offset < b.offset + b.size && b.offset < a.offset + a.size;
                assert!(!addr || a.last < b.first || b.last < a.first);
            }
        }
        // The planned arena's line is at its size on that scale.
        let line = svg.split("<line class=\"bound\"").nth(1).unwrap();
        let y1 = attr(line.split('>').next().unwrap(), "y1");
        assert!((base - y1 - p.planned_bytes as f64 * scale).abs() < 0.02);
        assert!(svg.contains(&human_bytes(p.naive_bytes, 2)));
        assert!(svg.contains(&human_bytes(p.lower_bound_bytes, 2)));
    }

    #[test]
    fn hostile_names_are_escaped() {
        let (g, p) = small();
        let mut ns = notes(&g, true);
        ns[0].kind = "<script>alert(1)</script>".into();
        ns[1].shapes = "\"'&<>".into();
        for out in [
            to_svg(&p, Some(&g), &ns, "t </title><script>"),
            to_html(&p, Some(&g), &ns, "t </title><script>"),
            to_html(&p, None, &ns, "x"),
        ] {
            assert!(!out.contains("<b>") && !out.contains("<script>alert"));
            assert!(!out.contains("</title><script>"));
            assert!(
                out.contains("&lt;b&gt;&amp;&quot;&apos;"),
                "the node's name"
            );
            assert!(out.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
            // Only the page's own script tag.
            assert!(out.matches("<script>").count() <= 1);
            assert_eq!(out.matches("<g").count(), out.matches("</g>").count());
            assert_eq!(out.matches("<text").count(), out.matches("</text>").count());
        }
    }

    #[test]
    fn tooltips_and_strips() {
        let (g, p) = small();
        let svg = to_svg(&p, Some(&g), &notes(&g, true), "small");
        // The parameters' steps are sources: not drawn.
        let drawn = p.steps.len() - 2;
        assert!(svg.contains("not drawn: 2 source steps"));
        assert_eq!(svg.matches("<g class=\"step\"").count(), drawn);
        assert_eq!(svg.matches("<title>").count(), 1 + drawn + p.values.len());
        assert!(svg.contains("step 2: node #2 &apos;a&apos; (Relu)\nkernel: binary"));
        assert!(
            svg.contains("shapes: f32[8, 64] → f32[8, 64]"),
            "types from the graph"
        );
        assert!(svg.contains("measured: 1.0 µs per run"));
        assert!(svg.contains("binary ×3") && svg.contains("unary ×2"));
        assert!(svg.contains(">time<"), "a time strip");
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        // Without times, no strip; without the graph, the notes' shapes.
        let svg = to_svg(&p, None, &notes(&g, false), "small");
        assert!(!svg.contains(">time<"));
        assert!(svg.contains("shapes: 8×64 → 8×64"));
        assert!(svg.contains("a:0\n"), "values named without the graph");
        // No notes at all: the ops stand for kinds.
        let svg = to_svg(&p, Some(&g), &[], "small");
        assert!(svg.contains("Relu ×1"));
        // A node without notes when others have them.
        let mut ns = notes(&g, false);
        ns.remove(2);
        assert!(to_svg(&p, Some(&g), &ns, "s").contains("no kernel ×1"));
    }

    #[test]
    fn deterministic_and_empty() {
        let (g, p) = small();
        let ns = notes(&g, true);
        assert_eq!(
            to_html(&p, Some(&g), &ns, "t"),
            to_html(&p, Some(&g), &ns, "t")
        );
        assert_eq!(
            to_svg(&p, Some(&g), &ns, "t"),
            to_svg(&p, Some(&g), &ns, "t")
        );
        let html = to_html(&p, Some(&g), &ns, "t");
        assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
        assert!(
            !html.contains("src=") && !html.contains("href="),
            "no network"
        );
        let empty = Graph::new("e");
        let pe = plan::plan(&empty, &[]).unwrap();
        let svg = to_svg(&pe, None, &[], "empty");
        assert!(svg.contains("empty schedule") && !svg.contains("NaN"));
        assert!(to_html(&pe, None, &[], "empty").contains("</html>"));
    }

    #[test]
    fn many_steps_stay_bounded() {
        let mut g = Graph::new("long");
        let mut v = g.add_parameter("x", f32s(&[4, 16])).unwrap();
        for i in 0..1500 {
            let w = g
                .op("Exp", &[v.into()], Attrs::new(), &format!("e{i}"))
                .unwrap();
            v = g
                .op("Add", &[v.into(), w.into()], Attrs::new(), &format!("a{i}"))
                .unwrap();
        }
        g.add_output("y", v.into()).unwrap();
        let p = plan::plan(&g, &g.schedule().unwrap()).unwrap();
        let svg = to_svg(&p, Some(&g), &[], "long");
        let width = attr(svg.split('>').next().unwrap(), "width");
        assert!(width <= 2300.0, "width {width}");
        assert!(
            svg.contains("not drawn: 1 source step holding"),
            "the parameter not drawn"
        );
        assert_eq!(rects(&svg).len(), p.values.len());
    }
}
