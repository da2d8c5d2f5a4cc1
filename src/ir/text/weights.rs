//! External weights files, for `.kir` `external(...)` data and ONNX external initializers
//! alike. A file is named by a relative path that stays inside the model's folder (no
//! root, no `..`), so a model cannot read any other file the process can.
use std::path::{Component, Path};

/// `location` as a path relative to the model's folder, or an error saying that it
/// leaves `folder` (e.g. "the model's folder").
pub(crate) fn inside_folder<'l>(location: &'l str, folder: &str) -> Result<&'l Path, String> {
    let rel = Path::new(location);
    let escapes = rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if location.is_empty() {
        return Err("an external weights file needs a name".into());
    }
    if escapes {
        return Err(format!(
            "'{location}' leaves {folder}: external weights are relative paths inside it"
        ));
    }
    Ok(rel)
}
