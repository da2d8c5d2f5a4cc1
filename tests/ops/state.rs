//! Sources and state: Parameter, Constant, Variable and Assign through the interpreter.
use kiln::backend::interp::InterpExecutable;
use kiln::backend::{backend_with, Device, Executable};
use kiln::ir::text::parse;
use kiln::passes::CompileOptions;

use crate::ops::harness::*;

/// A counter: `count += step` on every run, returning the value before the update.
const COUNTER: &str = r#"graph "counter" {
  %0 "step" = Parameter : i64[2]
  %1 "count" = Variable : i64[2] = [0, 10]
  %2 "next" = Add(%1, %0) : i64[2]
  %3 "store" = Assign(%1, %2) : ()
  %4 "seen" = Identity(%1) : i64[2]
  return "before" = %4
}
"#;

#[test]
fn parameters_and_constants_feed_ops() {
    let g = parse(
        "graph \"g\" {\n  %0 \"x\" = Parameter : f32[N]\n  %1 \"c\" = Constant : f32[] = [0.5]\n  %2 \"y\" = Mul(%0, %1) : f32[N]\n  return \"y\" = %2\n}\n",
        "g.kir",
        None,
    )
    .unwrap();
    let exe = InterpExecutable::new(g).unwrap();
    let y = exe.run(&[f32s(&[3], &[2.0, 4.0, 6.0])]).unwrap();
    assert_eq!(y[0], f32s(&[3], &[1.0, 2.0, 3.0]));
    // The symbol binds per run: another size is fine on the next run.
    assert_eq!(exe.run(&[f32s(&[0], &[])]).unwrap()[0].shape(), &[0]);
    let e = exe.run(&[f64s(&[3], &[1.0; 3])]).unwrap_err().to_string();
    assert!(
        e.contains("input 'x'") && e.contains("expected f32[N]"),
        "{e}"
    );
    let e = exe.run(&[]).unwrap_err().to_string();
    assert!(e.contains("takes 1 inputs, 0 given"), "{e}");
}

/// The graph on the interpreter and on the CPU backend (its own variable storage).
fn both_backends(text: &str) -> Vec<Box<dyn Executable>> {
    let g = parse(text, "state.kir", None).unwrap();
    [Device::Interp, Device::Cpu]
        .into_iter()
        .map(|d| {
            backend_with(
                d,
                CompileOptions {
                    threads: 1,
                    ..Default::default()
                },
            )
            .unwrap()
            .compile(&g)
            .unwrap()
        })
        .collect()
}

#[test]
fn variables_persist_across_runs() {
    for exe in both_backends(COUNTER) {
        variables_persist(&*exe);
    }
}

fn variables_persist(exe: &dyn Executable) {
    let step = i64s(&[2], &[1, 2]);
    assert_eq!(
        exe.run(std::slice::from_ref(&step)).unwrap()[0],
        i64s(&[2], &[0, 10])
    );
    assert_eq!(
        exe.run(std::slice::from_ref(&step)).unwrap()[0],
        i64s(&[2], &[1, 12])
    );
    assert_eq!(exe.read_variable("count").ok(), Some(i64s(&[2], &[2, 14])));
    // A failed run stores nothing.
    assert!(exe.run(&[i64s(&[3], &[1, 1, 1])]).is_err());
    assert_eq!(exe.read_variable("count").ok(), Some(i64s(&[2], &[2, 14])));
    // Each executable has its own state.
    let other = InterpExecutable::new(parse(COUNTER, "counter.kir", None).unwrap()).unwrap();
    assert_eq!(other.run(&[step]).unwrap()[0], i64s(&[2], &[0, 10]));
}

#[test]
fn reads_see_the_run_start_value_and_the_last_store_wins() {
    // Ordering the read after the store does not change what it sees: the Variable
    // node read the state before the Assign that consumes it.
    let text = COUNTER.replace(
        "%4 \"seen\" = Identity(%1) : i64[2]",
        "%4 \"seen\" = Identity(%1) : i64[2] after(%3)\n  %5 \"reset\" = Assign(%1, %0) : () after(%3)",
    );
    for exe in both_backends(&text) {
        assert_eq!(
            exe.run(&[i64s(&[2], &[1, 2])]).unwrap()[0],
            i64s(&[2], &[0, 10])
        );
        assert_eq!(
            exe.read_variable("count").ok(),
            Some(i64s(&[2], &[1, 2])),
            "the later Assign wins"
        );
    }
}

#[test]
fn assign_checks_its_operands() {
    let bad = COUNTER.replace(
        "%2 \"next\" = Add(%1, %0) : i64[2]",
        "%2 \"next\" = Cast(%1) {to = \"f32\"} : f32[2]",
    );
    let e = parse(&bad, "bad.kir", None).unwrap_err().to_string();
    assert!(
        e.contains("bad.kir:5:") && e.contains("'store' (Assign)") && e.contains("cannot assign"),
        "{e}"
    );
    let not_var = COUNTER.replace("Assign(%1, %2)", "Assign(%0, %2)");
    let e = parse(&not_var, "nv.kir", None).unwrap_err().to_string();
    assert!(e.contains("must be a Variable"), "{e}");
}

#[test]
fn sources_validate_their_declarations() {
    let e = parse(
        "graph \"g\" {\n  %0 \"x\" = Parameter {foo = 1} : f32[2]\n}\n",
        "p.kir",
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("p.kir:2:") && e.contains("unknown attribute 'foo'"),
        "{e}"
    );
    let e = parse(
        "graph \"g\" {\n  %0 \"c\" = Constant : f32[N] = [1.0]\n}\n",
        "c.kir",
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("static"), "{e}");
    let e = parse(
        "graph \"g\" {\n  %0 \"c\" = Constant : f32[2] = [1.0]\n}\n",
        "c.kir",
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("1 values given, f32[2] holds 2"), "{e}");
    let e = parse(
        "graph \"g\" {\n  %0 \"v\" = Variable : f32[2]\n}\n",
        "v.kir",
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("has no data"), "{e}");
}

#[test]
fn read_only_runs_share_one_executable_across_threads() {
    let g = parse(
        "graph \"g\" {\n  %0 \"x\" = Parameter : f64[N]\n  %1 \"w\" = Variable : f64[] = [3.0]\n  %2 \"y\" = Mul(%0, %1) : f64[N]\n  return \"y\" = %2\n}\n",
        "t.kir",
        None,
    )
    .unwrap();
    let exe = InterpExecutable::new(g).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let exe = &exe;
            s.spawn(move || {
                for i in 0..50 {
                    let v = (t * 100 + i) as f64;
                    let y = exe.run(&[f64s(&[2], &[v, -v])]).unwrap();
                    assert_eq!(y[0], f64s(&[2], &[3.0 * v, -3.0 * v]));
                }
            });
        }
    });
}

#[test]
fn the_runtime_ops_are_in_the_catalogue() {
    for (name, family) in [
        ("Parameter", "source"),
        ("Constant", "source"),
        ("Variable", "source"),
        ("Assign", "state"),
    ] {
        let op = kiln::ir::ops::lookup(name).unwrap();
        assert_eq!(op.schema().family, family, "{name}");
    }
}
