//! The documents say what the code does: what can be checked mechanically is checked
//! here, so that README.md, ARCHITECTURE.md and STATUS.md cannot drift silently.
use crate::common;

use std::collections::BTreeSet;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(name: &str) -> String {
    std::fs::read_to_string(root().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The lines of the `## {title}` section of a markdown document.
fn section<'a>(doc: &'a str, title: &str) -> Vec<&'a str> {
    let heading = format!("## {title}");
    let mut lines = doc.lines().skip_while(|l| l.trim_end() != heading);
    assert!(lines.next().is_some(), "no '{heading}' section");
    lines.take_while(|l| !l.starts_with("## ")).collect()
}

/// The spans between backticks on a line.
fn code_spans(line: &str) -> impl Iterator<Item = &str> {
    line.split('`').skip(1).step_by(2)
}

/// The top-level folders a code span may name a path from, anywhere in ARCHITECTURE.md.
const TOP_DIRS: [&str; 11] = [
    "src/",
    "tests/",
    "include/",
    "scripts/",
    "bindings/",
    "examples/",
    "bench/",
    "benches/",
    "fuzz/",
    "cmake/",
    "docs/",
];

/// Whether a code span names a file or a directory: path characters only, and either a
/// trailing `/` or a file extension the tree uses (so `kiln.ops` or `1.0` are not paths).
fn is_path(span: &str) -> bool {
    const EXTENSIONS: [&str; 15] = [
        "rs", "h", "hpp", "c", "cpp", "proto", "md", "toml", "txt", "kir", "py", "pyi", "sh",
        "json", "onnx",
    ];
    !span.starts_with('.')
        && span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c))
        && (span.ends_with('/')
            || span.rsplit_once('.').is_some_and(|(stem, ext)| {
                !stem.is_empty() && !stem.ends_with('/') && EXTENSIONS.contains(&ext)
            }))
}

/// Every directory under `dir`, relative to the repository root, with a trailing `/`.
fn directories(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            let rel = path.strip_prefix(root()).unwrap().to_string_lossy();
            out.insert(format!("{rel}/"));
            directories(&path, out);
        }
    }
}

/// ARCHITECTURE.md's code map is a map of directories: `### \`src/dir/\`` headings set the
/// directory; inside, a code span `name.rs`, `sub/name.rs` or `name/` names a path relative
/// to it, and one starting with a top-level folder (`src/`, `tests/`, …) names it from the
/// root. Every directory under `src/` must be named (as a heading or a `name/` span), and
/// every path named anywhere in the document must exist; files are named only where they
/// matter, not all of them.
#[test]
fn the_code_map_names_every_directory_and_only_existing_paths() {
    let doc = read("ARCHITECTURE.md");
    let mut named_dirs = BTreeSet::new();
    let mut named = BTreeSet::new();
    let mut dir = String::new();
    for line in section(&doc, "Code map") {
        if let Some(h) = line.strip_prefix("### ") {
            let d = h.trim().trim_matches('`');
            assert!(
                d.starts_with("src/") && d.ends_with('/'),
                "code map heading '{h}' is not a `src/.../` directory"
            );
            dir = d.to_string();
            named.insert(dir.clone());
            named_dirs.insert(dir.clone());
            continue;
        }
        for span in code_spans(line).filter(|s| is_path(s)) {
            let path = if TOP_DIRS.iter().any(|top| span.starts_with(top)) {
                span.to_string()
            } else {
                assert!(
                    !dir.is_empty(),
                    "`{span}` is named before any directory heading"
                );
                format!("{dir}{span}")
            };
            if path.ends_with('/') {
                named_dirs.insert(path.clone());
            }
            named.insert(path);
        }
    }
    // Outside the code map, a path is named from the root.
    for line in doc.lines() {
        for span in code_spans(line).filter(|s| is_path(s)) {
            if TOP_DIRS.iter().any(|top| span.starts_with(top)) {
                named.insert(span.to_string());
            }
        }
    }
    let mut actual = BTreeSet::from(["src/".to_string()]);
    directories(&root().join("src"), &mut actual);
    let missing: Vec<_> = actual.difference(&named_dirs).collect();
    let stale: Vec<_> = named.iter().filter(|p| !root().join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map does not name the directories {missing:?} \
         (a `### \\`dir/\\`` heading or a `name/` span under its parent's heading)"
    );
    assert!(
        stale.is_empty(),
        "ARCHITECTURE.md names {stale:?}, which do not exist"
    );
}

#[test]
fn paths_are_told_from_other_code_spans() {
    for path in [
        "mod.rs",
        "gemm/",
        "shape/reshape.rs",
        "src/ir/",
        "emulation.h",
        "onnx.proto",
    ] {
        assert!(is_path(path), "{path}");
    }
    for other in [
        "kiln.ops",
        "1.0",
        ".kir",
        "ir::Graph",
        "Graph.to_dot()",
        "f32[N, 4]",
        "KILN_PROFILE",
    ] {
        assert!(!is_path(other), "{other}");
    }
}

#[test]
fn architecture_is_a_map_not_an_atlas() {
    let lines = read("ARCHITECTURE.md").lines().count();
    assert!(
        lines <= 320,
        "ARCHITECTURE.md has {lines} lines; a map has at most 320"
    );
}

/// `KILN_*` names read through `env::var("…")` / `env::var_os("…")` in `text`.
fn env_reads(text: &str, out: &mut BTreeSet<String>) {
    for call in ["var(\"", "var_os(\""] {
        for (at, _) in text.match_indices(call) {
            let rest = &text[at + call.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if name.starts_with("KILN_") && rest[name.len()..].starts_with('"') {
                out.insert(name);
            }
        }
    }
}

#[test]
fn the_readme_lists_every_environment_variable_the_code_reads() {
    let mut read_by_code = BTreeSet::new();
    let mut files = vec![];
    for dir in ["src", "tests", "benches"] {
        common::rust_files(&root().join(dir), &mut files);
    }
    for f in files {
        env_reads(&std::fs::read_to_string(&f).unwrap(), &mut read_by_code);
    }
    // The pass options are read as KILN_<KEY> for each of their keys.
    for key in kiln::passes::CompileOptions::KEYS {
        read_by_code.insert(format!(
            "KILN_{}",
            key.to_ascii_uppercase().replace('-', "_")
        ));
    }
    let readme = read("README.md");
    let rows: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("| `KILN_"))
        .collect();
    let in_table: BTreeSet<String> = rows
        .iter()
        .map(|l| code_spans(l).next().unwrap().to_string())
        .collect();
    assert_eq!(rows.len(), in_table.len(), "a variable has two rows");
    // One table: the rows are consecutive lines.
    let first = readme.lines().position(|l| l.starts_with("| `KILN_"));
    if let Some(first) = first {
        let run = readme
            .lines()
            .skip(first)
            .take_while(|l| l.starts_with("| `KILN_"))
            .count();
        assert_eq!(run, rows.len(), "the KILN_* rows are not one table");
    }
    let missing: Vec<_> = read_by_code.difference(&in_table).collect();
    let unread: Vec<_> = in_table.difference(&read_by_code).collect();
    assert!(
        missing.is_empty(),
        "README.md's environment table lacks {missing:?}"
    );
    assert!(
        unread.is_empty(),
        "README.md's environment table lists {unread:?}, which no code reads"
    );
}

/// The leading integer of the second cell of the STATUS.md table row `| {what} | …`.
fn status_count(status: &str, what: &str) -> usize {
    let prefix = format!("| {what} |");
    let row = status
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("STATUS.md has no row '{prefix}'"));
    let cell = row[prefix.len()..].trim_start();
    let digits: String = cell
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(|c| *c != ',')
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("STATUS.md row '{prefix}' has no count: {row}"))
}

#[test]
fn the_counts_status_quotes_match_the_code() {
    let status = read("STATUS.md");
    assert_eq!(
        status_count(&status, "ops in the catalogue"),
        kiln::ir::ops::catalogue().len(),
        "STATUS.md: ops in the catalogue"
    );
    let header = read("include/kiln.h");
    let functions: BTreeSet<&str> = header
        .lines()
        .filter(|l| !l.trim_start().starts_with('*') && !l.trim_start().starts_with("/*"))
        // A declaration's return type may itself be a `kiln_` name
        // (`kiln_status kiln_compile(...)`): look at every `kiln_` on the line.
        .flat_map(|l| l.match_indices("kiln_").map(move |(open, _)| &l[open..]))
        .filter_map(|name| {
            let end = name.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
            name[end..].starts_with('(').then_some(&name[..end])
        })
        .collect();
    assert_eq!(
        status_count(&status, "exported C functions"),
        functions.len(),
        "STATUS.md: exported C functions"
    );
    assert_eq!(
        status_count(&status, "dtypes"),
        kiln::ir::DType::ALL.len(),
        "STATUS.md: dtypes"
    );
}

/// The text between `open` and the first `close` after it in `text`.
fn between<'t>(text: &'t str, open: &str, close: &str) -> &'t str {
    let start = text
        .find(open)
        .unwrap_or_else(|| panic!("no '{open}' to count from"))
        + open.len();
    let len = text[start..]
        .find(close)
        .unwrap_or_else(|| panic!("no '{close}' after '{open}'"));
    &text[start..start + len]
}

/// The files in the repository folder `dir` whose names end with `suffix`.
fn count_files(dir: &str, suffix: &str) -> usize {
    std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(suffix)
        })
        .count()
}

/// Asserts that STATUS.md's row `what` quotes `actual`, saying where the number comes from.
fn assert_status_row(status: &str, what: &str, actual: usize, source: &str) {
    let quoted = status_count(status, what);
    assert_eq!(
        quoted, actual,
        "STATUS.md's row '{what}' says {quoted}, but {source} gives {actual}: update the row"
    );
}

/// The counts STATUS.md quotes that the tree itself answers, without running Kiln: the
/// passes `src/passes/registry.rs` registers and the default pipeline's steps (what
/// `kiln passes` prints), the C test programs `scripts/test-capi.sh` runs, the graphs
/// `ir::round_trip_is_exact_on_every_graph` round-trips, and the insta snapshots.
#[test]
fn the_counts_status_reads_off_the_tree_match_it() {
    let status = read("STATUS.md");
    let registry = read("src/passes/registry.rs");
    let passes = between(&registry, "pub static PASSES: &[&dyn Pass] = &[", "];")
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .count();
    assert_status_row(
        &status,
        "registered passes",
        passes,
        "src/passes/registry.rs's PASSES",
    );
    // The pipeline is one string literal, continued across lines with `\`.
    let pipeline: String = between(&registry, "pub const DEFAULT_PIPELINE: &str = \"", "\";")
        .split("\\\n")
        .map(str::trim_start)
        .collect();
    let steps = pipeline.split(',').filter(|p| !p.trim().is_empty()).count();
    assert_status_row(
        &status,
        "default pipeline steps",
        steps,
        "src/passes/registry.rs's DEFAULT_PIPELINE",
    );
    assert_status_row(
        &status,
        "C test programs under valgrind",
        count_files("tests/capi", ".c"),
        "tests/capi/*.c",
    );
    assert_status_row(
        &status,
        "graphs round-tripped exactly",
        count_files("tests/graphs", ".kir") + count_files("examples/graphs", ".kir"),
        "tests/graphs/*.kir and examples/graphs/*.kir",
    );
    assert_status_row(
        &status,
        "insta snapshots of printed graphs",
        count_files("tests/snapshots", ".snap"),
        "tests/snapshots/*.snap",
    );
}

/// STATUS.md's ops by family (`kiln ops --family F`): each `family N` of the list that
/// follows "By family (`kiln ops --family F`…):" is the catalogue's count, and every
/// family is there.
#[test]
fn the_op_families_status_lists_match_the_catalogue() {
    let status = read("STATUS.md");
    let flat = status.split_whitespace().collect::<Vec<_>>().join(" ");
    let marker = "By family (`kiln ops --family F`";
    let start = flat
        .find(marker)
        .unwrap_or_else(|| panic!("STATUS.md has no '{marker}…):' list"));
    let list = &flat[start + marker.len()..];
    let list = &list[list.find("):").expect("the list starts after '):'") + 2..];
    let list = &list[..list.find(". ").expect("the list ends with '. '")];
    let words: Vec<&str> = list
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    let mut quoted = std::collections::BTreeMap::new();
    for pair in words.windows(2) {
        if let Ok(n) = pair[1].parse::<usize>() {
            if pair[0].chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                assert!(
                    quoted.insert(pair[0], n).is_none(),
                    "STATUS.md lists family {} twice",
                    pair[0]
                );
            }
        }
    }
    let mut actual = std::collections::BTreeMap::new();
    for op in kiln::ir::ops::catalogue().values() {
        *actual.entry(op.schema().family).or_insert(0usize) += 1;
    }
    assert_eq!(
        quoted, actual,
        "STATUS.md's ops by family (left) differ from the catalogue's (right)"
    );
}
