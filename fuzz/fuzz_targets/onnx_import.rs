//! Any bytes given to the ONNX importer give a graph or an error, never a panic; a graph
//! it gives prints as `.kir` text that parses back and prints the same (subgraphs,
//! sequences and strings included: the text is how such a graph is dumped and reported).
#![no_main]
use kiln::ir::text::{parse, print};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(graph) = kiln::frontend::onnx::import_bytes(data, None) else {
        return;
    };
    let printed = print(&graph);
    let reparsed = match parse(&printed, "imported.kir", None) {
        Ok(g) => g,
        Err(e) => panic!("an imported graph's text does not parse back: {e}\n{printed}"),
    };
    assert_eq!(
        printed,
        print(&reparsed),
        "print → parse → print is not the identity"
    );
});
