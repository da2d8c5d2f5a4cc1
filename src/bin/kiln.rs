//! The `kiln` command-line tool.
fn main() {
    println!("kiln {}", env!("CARGO_PKG_VERSION"));
}
