//! `kiln timeline`: a Chrome trace written by the `profile` option (`KILN_PROFILE=FILE`,
//! `kiln bench --trace FILE`) drawn as one self-contained HTML page, for where Perfetto
//! is out of reach: a row per thread, steps colored by kernel, the arena counter below,
//! each step's node, kernel, shapes, bytes and FLOPs on hover. The page parses the trace
//! itself (`timeline.html`); this only checks that the file is a trace and embeds it.
use std::path::Path;

use kiln::{Error, Result};

const PAGE: &str = include_str!("timeline.html");

pub(crate) fn run(trace: &Path, out: &Path) -> Result<()> {
    let text = std::fs::read_to_string(trace).map_err(|e| Error::io(trace, e))?;
    let head = text.trim_start();
    if !(head.starts_with('[') || head.starts_with('{') && text.contains("\"traceEvents\"")) {
        return Err(Error::InvalidArgument(format!(
            "{}: not a Chrome trace-event file (a JSON array of events or an object with \
             \"traceEvents\")",
            trace.display()
        )));
    }
    let name = trace.file_name().unwrap_or_default().to_string_lossy();
    let title = kiln::memory::xml(&name);
    // In JSON, `</` occurs only inside strings, where `<\/` means the same: so the trace
    // cannot end the <script> element that holds it.
    let (before, after) = PAGE.split_once("__TRACE__").expect("the page has the slot");
    let page = format!(
        "{}{}{}",
        before.replace("__TITLE__", &title),
        text.replace("</", "<\\/"),
        after
    );
    std::fs::write(out, page).map_err(|e| Error::io(out, e))?;
    println!("wrote {}", out.display());
    Ok(())
}
