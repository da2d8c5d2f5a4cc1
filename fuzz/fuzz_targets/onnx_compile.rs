//! Any model the importer accepts goes through the whole pass pipeline (verifying after
//! every pass, as the cpu backend's with the blocked layout) and the memory planner to a
//! graph or an error, never a panic; an optimized graph must still verify.
#![no_main]
use std::collections::HashMap;

use kiln::backend::cpu_pass_options;
use kiln::passes::{run_pipeline, PassOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut g) = kiln::frontend::onnx::import_bytes(data, None) else {
        return;
    };
    // Symbolic dims as `kiln compile` defaults them.
    let Ok(unbound) = g.specialize(&HashMap::new()) else {
        return;
    };
    let ones: HashMap<String, usize> = unbound.into_iter().map(|s| (s, 1)).collect();
    if g.specialize(&ones).is_err() {
        return;
    }
    let options = cpu_pass_options(PassOptions {
        verify: true,
        ..PassOptions::default()
    });
    if run_pipeline(&mut g, &options).is_ok() {
        kiln::ir::verify(&g).expect("an optimized graph verifies");
        if let Ok(schedule) = g.schedule() {
            let _ = kiln::memory::plan(&g, &schedule);
        }
    }
});
