//! Any model the importer accepts goes through the whole pass pipeline (verifying after
//! every pass, with the cpu backend's blocked layout) and a real `cpu` compile (lowering
//! and the memory plan) to an executable or an error, never a panic. A pass that leaves
//! an invalid graph is a bug in the pass, not in the model, so it fails the target.
#![no_main]
use std::collections::HashMap;

use kiln::backend::{backend_with, Device};
use kiln::passes::CompileOptions;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut g) = kiln::frontend::onnx::import_bytes(data, None) else {
        return;
    };
    // Symbolic dims as `kiln compile` defaults them, so the compile builds its program
    // now rather than on the first run.
    let Ok(unbound) = g.specialize(&HashMap::new()) else {
        return;
    };
    let ones: HashMap<String, usize> = unbound.into_iter().map(|s| (s, 1)).collect();
    if g.specialize(&ones).is_err() {
        return;
    }
    let options = CompileOptions {
        verify: true,
        threads: 1,
        ..CompileOptions::default()
    };
    let backend = backend_with(Device::Cpu, options).expect("the cpu backend always exists");
    if let Err(e) = backend.compile(&g) {
        let message = e.to_string();
        assert!(
            !message.contains("left an invalid graph"),
            "a pass broke a valid graph: {message}"
        );
    }
});
