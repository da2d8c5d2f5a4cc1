//! The `.kir` text format: a deterministic printer and a parser that round-trip exactly
//! (print → parse → print gives identical text). It is the language of snapshot tests,
//! `KILN_DUMP_IR` dumps and bug reports.
//!
//! ```text
//! # comments run to the end of the line
//! graph "mlp" {
//!   %0 "x" = Parameter : f32[batch:N, 4]
//!   %1 "w" = Constant : f32[4, 2] = [0.5, -1.0, 2.0, 0.25, 1.0, 1.0, 0.0, 3.0]
//!   %2 "big" = Constant : f32[512, 512] = external("mlp.weights", 0, 1048576)
//!   %3 "mm" = MatMul(%0, %1) : f32[batch:N, 2]
//!   %4 "parts" = Split(%3) {axis = 1, num_outputs = 2} : (f32[batch:N, 1], f32[batch:N, 1])
//!   %5 "c" = Clip(%4:1, _, _) : f32[batch:N, 1]
//!   %6 "v" = Variable : f32[2] = [0.0, 0.0]
//!   %7 "upd" = Assign(%6, %1) : () after(%5)
//!   return "y" = %3, "z" = %5
//! }
//! ```
//!
//! Nodes are numbered by the graph's deterministic schedule; `%k:i` is output `i` of node
//! `k` (`%k` is output 0); `_` is an omitted optional input. Attributes are sorted by
//! name; floats always carry a `.`, an exponent, `inf` or `NaN`, so `1` is an int and
//! `1.0` a float; empty lists are written `ints[]`, `floats[]`, `strings[]`. Inline data
//! is row-major; floats print as the shortest text that reads back to the same value.
//! Constants above the inline limit are referenced by byte range in a weights file.
//! IR dumps (`KILN_DUMP_IR`) write large constants as `elided(<elements>)`, which reads
//! well and does not parse back.
mod lex;
mod parse;
mod print;
pub(crate) mod weights;

pub use parse::{parse, parse_file};
pub use print::{print, print_with, save, PrintOptions};
