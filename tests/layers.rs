//! The module layers, enforced: every path from one module of `src/` into another must
//! be an edge that ARCHITECTURE.md's `## Layers` table allows, and every module has a
//! row there.
//!
//! The table has one row per module: `| module | may import |`, the module as a path
//! under `src/` (`ir`, `backend/cpu`), the modules it may import separated by commas
//! (or `nothing`). A file belongs to the row that is the longest prefix of its path.
//! Imports are the paths that start with `crate::` (and `$crate::`), `super::` when it
//! leaves the module, and in the binary `kiln::`; comments and string literals are
//! stripped first. A name the crate root re-exports (`crate::Error`) counts as an import
//! of the module it comes from, an exported macro (`crate::match_tensor!`) as one of the
//! module that defines it.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The `## Layers` table: module → the modules it may import.
type Table = BTreeMap<String, BTreeSet<String>>;

fn parse_table(markdown: &str) -> Result<Table, String> {
    let section = markdown
        .split("\n## ")
        .find(|s| s.starts_with("Layers\n"))
        .ok_or("ARCHITECTURE.md has no `## Layers` section")?;
    let mut lines = section
        .lines()
        .map(str::trim)
        .skip_while(|l| !l.starts_with('|'));
    let cells = |line: &str| -> Vec<String> {
        line.trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let header = lines.next().map(cells).unwrap_or_default();
    if header != ["module", "may import"] {
        return Err(format!(
            "the Layers section's table must start with `| module | may import |`, not {header:?}"
        ));
    }
    lines.next(); // the `| --- | --- |` line
    let mut table = Table::new();
    for line in lines.take_while(|l| l.starts_with('|')) {
        let row = cells(line);
        let [module, allowed] = &row[..] else {
            return Err(format!("the Layers row `{line}` does not have two cells"));
        };
        let name = |s: &str| s.trim().trim_matches('`').to_string();
        let allowed = if allowed == "nothing" {
            BTreeSet::new()
        } else {
            allowed.split(',').map(name).collect()
        };
        if table.insert(name(module), allowed).is_some() {
            return Err(format!(
                "the Layers table has two rows for {}",
                name(module)
            ));
        }
    }
    if table.is_empty() {
        return Err("the Layers table has no rows".into());
    }
    Ok(table)
}

/// `src` with comments, string literals and character literals blanked out (line
/// breaks kept, so positions keep their line numbers).
fn strip_comments_and_strings(src: &str) -> String {
    let s: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, chars: &[char]| {
        out.extend(chars.iter().map(|&c| if c == '\n' { '\n' } else { ' ' }))
    };
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        let at_word_start = i == 0 || !(s[i - 1].is_alphanumeric() || s[i - 1] == '_');
        if rest.starts_with(&['/', '/']) {
            let end = rest.iter().position(|&c| c == '\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(&['/', '*']) {
            // Block comments nest.
            let (mut depth, mut j) = (0, 0);
            loop {
                if rest[j..].starts_with(&['/', '*']) {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(&['*', '/']) {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
                if j >= rest.len() {
                    j = rest.len();
                    break;
                }
            }
            blank(&mut out, &rest[..j]);
            i += j;
        } else if let Some(len) = raw_string_len(rest).filter(|_| at_word_start) {
            blank(&mut out, &rest[..len]);
            i += len;
        } else if rest[0] == '"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != '"' {
                j += if rest[j] == '\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == '\'' && rest.get(1) == Some(&'\\') {
            // An escape is a backslash and at least one character.
            let end = rest[3..]
                .iter()
                .position(|&c| c == '\'')
                .map_or(rest.len(), |p| p + 4);
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == '\'' && rest.get(2) == Some(&'\'') {
            // A one-character literal; anything else after a quote is a lifetime.
            blank(&mut out, &rest[..3]);
            i += 3;
        } else {
            out.push(rest[0]);
            i += 1;
        }
    }
    out
}

/// The length of the raw string literal (`r"…"`, `r#"…"#`, `br"…"`) at the start of
/// `s`, if one starts there.
fn raw_string_len(s: &[char]) -> Option<usize> {
    let after_b = usize::from(s.first() == Some(&'b'));
    if s.get(after_b) != Some(&'r') {
        return None;
    }
    let hashes = s[after_b + 1..].iter().take_while(|&&c| c == '#').count();
    let open = after_b + 1 + hashes;
    if s.get(open) != Some(&'"') {
        return None;
    }
    let close: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    (open + 1..s.len())
        .find(|&j| s[j..].starts_with(&close))
        .map(|j| j + close.len())
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths of the use tree (or plain path) starting at byte `at` of `code`, each as
/// its segments after `prefix`: `a::{b, c::d}` gives `[a, b]` and `[a, c, d]`.
fn paths_at(code: &str, at: usize, prefix: &[String]) -> Vec<Vec<String>> {
    let mut out = vec![];
    tree(code.as_bytes(), at, prefix.to_vec(), &mut out);
    out
}

/// Parses one use tree at `i`; pushes its paths to `out`; returns where it ends.
fn tree(b: &[u8], mut i: usize, mut path: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let skip_space = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_space(i);
        if b.get(i) == Some(&b'{') {
            i += 1;
            loop {
                i = skip_space(i);
                match b.get(i) {
                    None => return i,
                    Some(b'}') => return i + 1,
                    Some(b',') => i += 1,
                    Some(_) => {
                        i = tree(b, i, path.clone(), out);
                        // Past a rename (`as x`) to the next item.
                        while i < b.len() && !matches!(b[i], b',' | b'}') {
                            i += 1;
                        }
                    }
                }
            }
        }
        let start = i;
        while i < b.len() && is_ident_char(b[i] as char) {
            i += 1;
        }
        if i == start {
            // `*`, `<T>`, or the end: the path so far.
            if !path.is_empty() {
                out.push(path);
            }
            return i;
        }
        path.push(String::from_utf8_lossy(&b[start..i]).into_owned());
        let j = skip_space(i);
        if b[j..].starts_with(b"::") {
            i = j + 2;
        } else {
            out.push(path);
            return i;
        }
    }
}

/// The module path of a file under `src/`: `backend/cpu/mod.rs` is `[backend, cpu]`.
fn module_path(rel: &str) -> Vec<String> {
    let mut p: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if p.last().is_some_and(|s| s == "mod") {
        p.pop();
    }
    p
}

/// The inline modules (`mod tests { … }`) of `code`: byte ranges and names.
fn inline_modules(code: &str) -> Vec<(std::ops::Range<usize>, String)> {
    let b = code.as_bytes();
    let mut out = vec![];
    let mut from = 0;
    while let Some(k) = code[from..].find("mod ") {
        let at = from + k;
        from = at + 4;
        if at > 0 && is_ident_char(b[at - 1] as char) {
            continue;
        }
        let name: String = code[at + 4..]
            .trim_start()
            .chars()
            .take_while(|&c| is_ident_char(c))
            .collect();
        let after = code[at + 4..].trim_start()[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = code.len() - after.len();
        let mut depth = 0;
        let close = (open..b.len()).find(|&j| {
            match b[j] {
                b'{' => depth += 1,
                b'}' => depth -= 1,
                _ => {}
            }
            depth == 0
        });
        out.push((open..close.unwrap_or(b.len()), name));
    }
    out
}

/// One path from a file into the crate, resolved from the crate root.
struct Reference {
    line: usize,
    /// As written, for the message.
    written: String,
    /// From the crate root.
    path: Vec<String>,
}

/// The crate paths `code` (stripped) of the file at `rel` under `src/` mentions.
fn references(rel: &str, code: &str) -> Vec<Reference> {
    let in_binary = rel.starts_with("bin/");
    let file_module = module_path(rel);
    let inline = inline_modules(code);
    let mut out = vec![];
    let b = code.as_bytes();
    for (k, _) in code.match_indices("::") {
        let head_start = code[..k]
            .trim_end()
            .rfind(|c: char| !is_ident_char(c))
            .map_or(0, |p| p + 1);
        let head = code[head_start..k].trim_end();
        if head_start > 0 && b[head_start - 1] == b':' {
            continue; // not a path's first segment
        }
        let root: Vec<String> = match head {
            "crate" if !in_binary => vec![],
            "kiln" if in_binary => vec![],
            "super" if !in_binary => {
                let mut module = file_module.clone();
                module.extend(
                    inline
                        .iter()
                        .filter(|(r, _)| r.contains(&head_start))
                        .map(|(_, n)| n.clone()),
                );
                module.pop();
                module
            }
            _ => continue,
        };
        let line = code[..k].matches('\n').count() + 1;
        for mut path in paths_at(code, k + 2, &[]) {
            if path.last().is_some_and(|s| s == "self") {
                path.pop();
            }
            let written = format!("{head}::{}", path.join("::"));
            let mut root = root.clone();
            while path.first().is_some_and(|s| s == "super") {
                root.pop();
                path.remove(0);
            }
            root.extend(path);
            out.push(Reference {
                line,
                written,
                path: root,
            });
        }
    }
    out
}

/// The row a module path belongs to: the longest row that is a prefix of it.
fn row_of<'t>(table: &'t Table, path: &[String]) -> Option<&'t str> {
    table
        .keys()
        .filter(|row| {
            let segs: Vec<&str> = row.split('/').collect();
            segs.len() <= path.len() && segs.iter().zip(path).all(|(a, b)| a == b)
        })
        .max_by_key(|row| row.len())
        .map(String::as_str)
}

/// Every violation of `table` by the files (`(path under src/, text)`): imports it does
/// not allow, modules with no row, rows with no module.
fn check(table: &Table, files: &[(String, String)], dirs: &[String]) -> Vec<String> {
    let mut errors = vec![];
    // Modules that need a row: every entry of src/, and every directory of a module
    // that the table splits into rows (`backend/cpu` splits `backend`).
    let top: BTreeSet<String> = files
        .iter()
        .map(|(rel, _)| rel.as_str())
        .chain(dirs.iter().map(String::as_str))
        .filter(|rel| *rel != "lib.rs")
        .map(|rel| {
            rel.split('/')
                .next()
                .unwrap()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    let split: BTreeSet<&str> = table
        .keys()
        .filter_map(|r| r.rsplit_once('/').map(|(parent, _)| parent))
        .collect();
    let nested = dirs
        .iter()
        .filter(|d| d.rsplit_once('/').is_some_and(|(p, _)| split.contains(p)));
    for module in top.iter().chain(nested) {
        if !table.contains_key(module) {
            errors.push(format!(
                "src/{module} has no row in ARCHITECTURE.md's Layers table"
            ));
        }
    }
    for row in table.keys() {
        let exists = files.iter().any(|(rel, _)| {
            rel.trim_end_matches(".rs") == row || rel.starts_with(&format!("{row}/"))
        });
        if !exists {
            errors.push(format!(
                "the Layers table has a row for {row}, but src/ has no such module"
            ));
        }
    }
    // Names the crate root re-exports, and exported macros, by the module they are from.
    let mut at_root: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (rel, text) in files {
        let code = strip_comments_and_strings(text);
        if rel == "lib.rs" {
            for (k, _) in code.match_indices("pub use ") {
                for path in paths_at(&code, k + 8, &[]) {
                    at_root.insert(path.last().unwrap().clone(), path);
                }
            }
        }
        for (k, _) in code.match_indices("macro_rules!") {
            let name: String = code[k + 12..]
                .trim_start()
                .chars()
                .take_while(|&c| is_ident_char(c))
                .collect();
            at_root.insert(name, module_path(rel));
        }
    }
    for (rel, text) in files {
        if rel == "lib.rs" {
            continue; // the root declares and re-exports; it imports nothing
        }
        let Some(from) = row_of(table, &module_path(rel)) else {
            continue; // reported above
        };
        let code = strip_comments_and_strings(text);
        // One message per forbidden edge of a file, at its first line.
        let mut reported = BTreeSet::new();
        for r in references(rel, &code) {
            let path = match r.path.first().and_then(|name| at_root.get(name)) {
                Some(source) if row_of(table, &r.path).is_none() => source,
                _ => &r.path,
            };
            let to = match row_of(table, path) {
                Some(to) => to,
                None if path.is_empty() => continue, // `crate::{}` and the like
                None => {
                    errors.push(format!(
                        "src/{rel}:{} names `{}`, which is in no module of ARCHITECTURE.md's Layers table",
                        r.line, r.written
                    ));
                    continue;
                }
            };
            if to != from && !table[from].contains(to) && reported.insert(to) {
                errors.push(format!(
                    "src/{rel} imports {to}, which ARCHITECTURE.md's Layers table does not allow (line {}: `{}`)",
                    r.line, r.written
                ));
            }
        }
    }
    errors
}

/// Every `.rs` file under `dir` as (path relative to `root`, text), and every directory.
fn read_tree(root: &Path, dir: &Path, files: &mut Vec<(String, String)>, dirs: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if path.is_dir() {
            dirs.push(rel);
            read_tree(root, &path, files, dirs);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push((rel, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

#[test]
fn every_import_is_an_edge_the_layers_table_allows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let table = parse_table(&doc).unwrap_or_else(|e| panic!("{e}"));
    let (mut files, mut dirs) = (vec![], vec![]);
    read_tree(&root.join("src"), &root.join("src"), &mut files, &mut dirs);
    let errors = check(&table, &files, &dirs);
    assert!(errors.is_empty(), "\n{}\n", errors.join("\n"));
}

/// The lines of the `.rs` files under `dirs` (relative to the root) whose code, comments
/// and strings stripped, contains one of `words`, as `file:line: text`.
fn lines_with(root: &Path, dirs: &[&str], words: &[&str]) -> Vec<String> {
    let mut found = vec![];
    for dir in dirs {
        let (mut files, mut subdirs) = (vec![], vec![]);
        read_tree(root, &root.join(dir), &mut files, &mut subdirs);
        for (rel, text) in files {
            let code = strip_comments_and_strings(&text);
            for (n, line) in code.lines().enumerate() {
                if words.iter().any(|w| line.contains(w)) {
                    found.push(format!("{rel}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    found
}

/// The `kiln::capi::…` paths (and `kiln::{capi, …}` trees) in `code` (stripped), as
/// `line: path`.
fn capi_paths(code: &str) -> Vec<String> {
    let b = code.as_bytes();
    let mut out = vec![];
    for (k, _) in code.match_indices("::") {
        let head_start = code[..k]
            .trim_end()
            .rfind(|c: char| !is_ident_char(c))
            .map_or(0, |p| p + 1);
        if code[head_start..k].trim_end() != "kiln" || (head_start > 0 && b[head_start - 1] == b':')
        {
            continue;
        }
        let line = code[..k].matches('\n').count() + 1;
        for path in paths_at(code, k + 2, &[]) {
            if path.first().is_some_and(|s| s == "capi") {
                out.push(format!("{line}: kiln::{}", path.join("::")));
            }
        }
    }
    out
}

/// The bindings stand beside the C ABI, not on it: what they share with it (tensors,
/// DLPack, errors) is a Rust module of the library (`kiln::interop`, `kiln::Error`).
#[test]
fn no_binding_imports_the_c_abi() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut files, mut dirs) = (vec![], vec![]);
    read_tree(root, &root.join("bindings"), &mut files, &mut dirs);
    let found: Vec<String> = files
        .iter()
        .flat_map(|(rel, text)| {
            let code = strip_comments_and_strings(text);
            capi_paths(&code)
                .into_iter()
                .map(move |p| format!("{rel}:{p}"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "the bindings import kiln::capi:\n{}",
        found.join("\n")
    );
}

/// The core (the IR and catalogue, the passes, memory planning, autodiff, the frontends)
/// knows nothing of buffers, devices or streams: no raw pointer, no `c_void`, no
/// `unsafe`. A registered op's kernels reach the backends as `Op::backend_kernels`, an
/// opaque value only `backend::registered` opens.
#[test]
fn the_core_carries_no_backend_hooks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let core = [
        "src/ir",
        "src/passes",
        "src/memory",
        "src/autodiff",
        "src/frontend",
    ];
    let found = lines_with(root, &core, &["*mut ", "*const ", "c_void", "unsafe"]);
    assert!(
        found.is_empty(),
        "backend hooks in the core:\n{}",
        found.join("\n")
    );
}

mod checker {
    use super::*;

    const TABLE: &str = "# Title\n\n## Layers\n\nText.\n\n\
        | module | may import |\n| --- | --- |\n\
        | `error` | nothing |\n\
        | `ir` | `error` |\n\
        | `backend` | `ir`, `error`, `backend/cpu` |\n\
        | `backend/cpu` | `backend`, `ir` |\n\
        | `backend/cuda` | `backend`, `ir` |\n\
        | `bin` | `backend`, `error` |\n\n## Next\n";

    fn file(rel: &str, text: &str) -> (String, String) {
        (rel.to_string(), text.to_string())
    }

    fn dirs() -> Vec<String> {
        ["backend", "backend/cpu", "backend/cuda", "bin", "ir"]
            .map(String::from)
            .to_vec()
    }

    fn base() -> Vec<(String, String)> {
        vec![
            file("lib.rs", "pub mod ir;\npub use error::{Error, Result};\n"),
            file("error.rs", "pub enum Error {}\n"),
            file(
                "ir/mod.rs",
                "use crate::error::Error;\n#[macro_export]\nmacro_rules! each_op { () => {} }\n",
            ),
            file(
                "backend/mod.rs",
                "pub mod cpu;\nuse crate::backend::cpu::Thing;\n",
            ),
            file(
                "backend/cpu/mod.rs",
                "use super::super::ir::Graph;\nuse crate::backend::Backend;\n",
            ),
            file(
                "backend/cuda/mod.rs",
                "use crate::{backend::Backend, ir::{self, Graph}};\n",
            ),
            file(
                "bin/kiln/main.rs",
                "use kiln::backend::Device;\nuse crate::args::Args;\nuse kiln::Error;\n",
            ),
        ]
    }

    fn errors(files: &[(String, String)]) -> Vec<String> {
        check(&parse_table(TABLE).unwrap(), files, &dirs())
    }

    #[test]
    fn the_table_is_read_from_its_section() {
        let t = parse_table(TABLE).unwrap();
        assert_eq!(t.len(), 6);
        assert!(t["error"].is_empty());
        assert_eq!(
            t["backend"],
            ["ir", "error", "backend/cpu"].map(String::from).into()
        );
        assert!(parse_table("## Other\n| module | may import |\n").is_err());
        let dup = TABLE.replace("| `bin` |", "| `ir` |");
        assert!(parse_table(&dup).unwrap_err().contains("two rows for ir"));
    }

    #[test]
    fn allowed_imports_pass() {
        assert_eq!(errors(&base()), Vec::<String>::new());
    }

    #[test]
    fn a_forbidden_edge_is_named() {
        let mut files = base();
        files.push(file(
            "backend/cuda/runtime.rs",
            "// crate::backend::cpu in a comment is not an import\n\
             const S: &str = \"crate::backend::cpu\";\n\
             use crate::backend::{cpu::lower::static_output, Backend};\n",
        ));
        assert_eq!(
            errors(&files),
            ["src/backend/cuda/runtime.rs imports backend/cpu, which ARCHITECTURE.md's Layers table does not allow (line 3: `crate::backend::cpu::lower::static_output`)"]
        );
    }

    #[test]
    fn super_that_leaves_the_module_is_an_import_and_inline_modules_count() {
        let mut files = base();
        files.push(file(
            "backend/cuda/lower.rs",
            "use super::Helper;\nmod tests {\n    use super::super::super::cpu::Kernel;\n}\n",
        ));
        let e = errors(&files);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("src/backend/cuda/lower.rs imports backend/cpu"),
            "{e:?}"
        );
        assert!(
            e[0].contains("line 3: `super::super::super::cpu::Kernel`"),
            "{e:?}"
        );
    }

    #[test]
    fn root_re_exports_and_macros_count_as_their_modules() {
        let mut files = base();
        files.push(file("error/extra.rs", "fn f() { crate::each_op!(); }\n"));
        files.push(file(
            "ir/more.rs",
            "fn f() -> crate::Result<()> { todo() }\n",
        ));
        let e = errors(&files);
        assert_eq!(
            e,
            ["src/error/extra.rs imports ir, which ARCHITECTURE.md's Layers table does not allow (line 1: `crate::each_op`)"]
        );
    }

    #[test]
    fn the_binary_imports_through_the_library_name() {
        let mut files = base();
        files.push(file("bin/kiln/run.rs", "use kiln::ir::Graph;\n"));
        let e = errors(&files);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("src/bin/kiln/run.rs imports ir"), "{e:?}");
    }

    #[test]
    fn a_module_without_a_row_and_a_row_without_a_module_fail() {
        let mut files = base();
        files.push(file("optim.rs", "use crate::ir::Graph;\n"));
        files.push(file("backend/metal/mod.rs", ""));
        let mut dirs = dirs();
        dirs.push("backend/metal".into());
        files.retain(|(rel, _)| !rel.starts_with("bin/"));
        let e = check(&parse_table(TABLE).unwrap(), &files, &dirs);
        assert!(
            e.contains(&"src/optim has no row in ARCHITECTURE.md's Layers table".to_string()),
            "{e:?}"
        );
        assert!(
            e.contains(
                &"src/backend/metal has no row in ARCHITECTURE.md's Layers table".to_string()
            ),
            "{e:?}"
        );
        assert!(
            e.contains(
                &"the Layers table has a row for bin, but src/ has no such module".to_string()
            ),
            "{e:?}"
        );
    }

    #[test]
    fn capi_paths_are_found_in_use_trees_but_not_in_comments_or_other_crates() {
        let code = strip_comments_and_strings(
            "// kiln::capi::x in a comment\nuse kiln::{capi::tensor::kiln_tensor, Error};\n\
             use mykiln::capi::y;\nlet s = \"kiln::capi\";\nkiln::capi::guard();\n",
        );
        assert_eq!(
            capi_paths(&code),
            ["2: kiln::capi::tensor::kiln_tensor", "5: kiln::capi::guard"]
        );
    }

    #[test]
    fn strings_chars_and_lifetimes_are_told_apart() {
        let code = strip_comments_and_strings(
            "let a = '\"'; let b = '\\''; fn f<'a>(x: &'a str) {} let r = r#\"crate::x\"#; /* /* crate::y */ */ crate::z::W",
        );
        assert!(
            !code.contains("crate::x") && !code.contains("crate::y"),
            "{code}"
        );
        assert!(
            code.contains("fn f<'a>(x: &'a str)") && code.contains("crate::z::W"),
            "{code}"
        );
    }
}
