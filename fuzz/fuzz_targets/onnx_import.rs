//! Any bytes given to the ONNX importer give a graph or an error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = kiln::frontend::onnx::import_bytes(data, None);
});
