//! Any text given to the `.kir` parser gives a graph or an error, never a panic; a graph
//! that parses verifies, and printing it and parsing the print gives the same text back
//! (the format's round-trip promise).
#![no_main]
use kiln::ir::text::{parse, print};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // No base directory: `external(...)` weights are refused, so no file is ever read.
    let Ok(graph) = parse(text, "fuzz.kir", None) else {
        return;
    };
    if let Err(e) = kiln::ir::verify(&graph) {
        panic!("a parsed graph does not verify: {e}\n{text}");
    }
    let printed = print(&graph);
    let reparsed = match parse(&printed, "printed.kir", None) {
        Ok(g) => g,
        Err(e) => panic!("the printed graph does not parse back: {e}\n{printed}"),
    };
    let reprinted = print(&reparsed);
    assert_eq!(
        printed, reprinted,
        "print → parse → print is not the identity"
    );
});
