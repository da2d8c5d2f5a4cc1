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

/// The external weights files of one import or parse, read on first use and kept by
/// location, so that a model whose initializers share a file reads it once.
pub(crate) struct WeightsFiles<'d> {
    dir: Option<&'d Path>,
    read: std::cell::RefCell<std::collections::HashMap<String, std::rc::Rc<[u8]>>>,
}

impl<'d> WeightsFiles<'d> {
    /// The files of the model in folder `dir` (`None`: a model that came as bytes).
    pub(crate) fn new(dir: Option<&'d Path>) -> Self {
        WeightsFiles {
            dir,
            read: Default::default(),
        }
    }

    /// The model's folder, if it has one.
    pub(crate) fn dir(&self) -> Option<&'d Path> {
        self.dir
    }

    /// The whole file at `location` (checked to stay inside `folder`, e.g. "the model's
    /// folder"), read the first time it is asked for.
    pub(crate) fn get(&self, location: &str, folder: &str) -> Result<std::rc::Rc<[u8]>, String> {
        if let Some(bytes) = self.read.borrow().get(location) {
            return Ok(bytes.clone());
        }
        let rel = inside_folder(location, folder)?;
        let dir = self
            .dir
            .ok_or_else(|| format!("'{location}' needs {folder} (import from a file)"))?;
        let path = dir.join(rel);
        let bytes: std::rc::Rc<[u8]> = std::fs::read(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .into();
        self.read
            .borrow_mut()
            .insert(location.to_string(), bytes.clone());
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_once_and_stays_inside_the_folder() {
        let dir = std::env::temp_dir().join(format!("kiln-weights-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("w.bin"), [1u8, 2, 3]).unwrap();
        let files = WeightsFiles::new(Some(&dir));
        let first = files.get("w.bin", "the model's folder").unwrap();
        // Rewritten on disk: the import keeps the bytes it read first.
        std::fs::write(dir.join("w.bin"), [9u8]).unwrap();
        let again = files.get("w.bin", "the model's folder").unwrap();
        assert!(std::rc::Rc::ptr_eq(&first, &again));
        assert_eq!(&*again, &[1, 2, 3]);
        let e = files.get("../w.bin", "the model's folder").unwrap_err();
        assert!(e.contains("leaves the model's folder"), "{e}");
        let e = WeightsFiles::new(None)
            .get("w.bin", "the model's folder")
            .unwrap_err();
        assert!(e.contains("import from a file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
