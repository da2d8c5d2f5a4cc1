//! The parser (see the module docs for the grammar).
use std::path::Path;

use crate::error::{Error, Result};
use crate::ir::Graph;

/// Parses `.kir` text; `file` names the source in errors, and external weights are read
/// relative to `base_dir` when given.
pub fn parse(text: &str, file: &str, base_dir: Option<&Path>) -> Result<Graph> {
    let _ = (text, base_dir);
    Err(Error::Parse {
        file: file.into(),
        line: 1,
        col: 1,
        msg: "the parser is not written yet".into(),
    })
}

/// Reads and parses a `.kir` file.
pub fn parse_file(path: &Path) -> Result<Graph> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse(&text, &path.display().to_string(), path.parent())
}
