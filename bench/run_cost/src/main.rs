//! The cost of one run through Kiln's C API beside onnxruntime's C API: the same model
//! file, the same inputs, the same thread count, rounds alternating between the two.
//!
//! Usage: kiln-run-cost --ort LIBONNXRUNTIME [--threads 1,2] [--rounds 7] [--seconds 0.2]
//!        NAME=MODEL.onnx[:IN0.npy,IN1.npy,…] …
//!
//! Each side runs a prepared session: Kiln `kiln_executable_run` on tensors made once with
//! `kiln_tensor_wrap`, then `kiln_tensor_free` on the outputs; onnxruntime `OrtApi::Run` on
//! `OrtValue`s made once, then `ReleaseValue` on the outputs. Both allocate their outputs,
//! as a caller of either API does. A round times each side for about `--seconds` after a
//! pause (both pools spin after a run and would take the other's cores) and records the
//! median call; a row is the median of the rounds' medians. Prints a Markdown table.

use std::ffi::{c_char, CStr, CString};
use std::path::Path;
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

use kiln::capi::compile::{
    kiln_compile, kiln_compile_options, kiln_compile_options_free, kiln_compile_options_new,
    kiln_compile_options_set_threads, kiln_executable, kiln_executable_free,
    kiln_executable_output_count, kiln_executable_run,
};
use kiln::capi::graph::{kiln_graph, kiln_graph_free, kiln_graph_import_onnx};
use kiln::capi::status::{kiln_last_error_message, kiln_status, KILN_STATUS_OK};
use kiln::capi::tensor::{kiln_dtype, kiln_tensor, kiln_tensor_free, kiln_tensor_wrap};
use kiln::{DType, Tensor};
use ort::environment::Environment;
use ort::session::{builder::SessionBuilder, Session};
use ort::value::DynValue;
use ort::AsPointer;

type Res<T> = Result<T, String>;

/// Output slots on the stack, so that neither side's timing includes the bench's own
/// allocation.
const MAX_OUTPUTS: usize = 16;

/// The pause before each timed stretch, so the other runtime's idle workers have stopped
/// spinning (Kiln's poll 500 µs; onnxruntime's spin longer).
const PAUSE: Duration = Duration::from_millis(300);

struct Case {
    name: String,
    model: String,
    inputs: Vec<Tensor>,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("run-cost: {e}");
        std::process::exit(1);
    }
}

fn run() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let (mut ort_lib, mut threads, mut rounds, mut seconds) = (None, vec![1, 2], 7, 0.2);
    let mut cases = Vec::new();
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--ort" => ort_lib = Some(value()?),
            "--threads" => {
                threads = (value()?.split(','))
                    .map(|t| t.parse().map_err(|_| format!("--threads: bad '{t}'")))
                    .collect::<Res<_>>()?
            }
            "--rounds" => rounds = value()?.parse().map_err(|_| "--rounds: a number")?,
            "--seconds" => seconds = value()?.parse().map_err(|_| "--seconds: a number")?,
            spec => cases.push(case(spec)?),
        }
    }
    let ort_lib = ort_lib.ok_or("--ort LIBONNXRUNTIME is required")?;
    if cases.is_empty() {
        return Err("no NAME=MODEL given".into());
    }
    let env = (ort::init_from(&ort_lib).map_err(|e| format!("{ort_lib}: {e}"))?)
        .build()
        .map_err(|e| e.to_string())?;
    println!("| model | threads | Kiln µs | onnxruntime µs | Kiln / onnxruntime |");
    println!("|---|---|---|---|---|");
    for c in &cases {
        for &t in &threads {
            let kiln = KilnRun::new(c, t)?;
            let peer = OrtRun::new(&env, c, t as usize)?;
            let (mut k, mut o) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                o.push(timed(seconds, || peer.call())?);
                k.push(timed(seconds, || kiln.call())?);
            }
            let (k, o) = (median(&mut k), median(&mut o));
            println!("| {} | {t} | {:.2} | {:.2} | {:.2} |", c.name, k, o, k / o);
        }
    }
    Ok(())
}

/// `NAME=MODEL.onnx[:IN0.npy,IN1.npy,…]`.
fn case(spec: &str) -> Res<Case> {
    let (name, rest) = spec
        .split_once('=')
        .ok_or(format!("'{spec}': not NAME=MODEL"))?;
    let (model, npys) = rest.split_once(':').unwrap_or((rest, ""));
    let inputs = (npys.split(',').filter(|p| !p.is_empty()))
        .map(|p| kiln::tensor::npy::read(Path::new(p)).map_err(|e| e.to_string()))
        .collect::<Res<_>>()?;
    Ok(Case {
        name: name.into(),
        model: model.into(),
        inputs,
    })
}

/// The median call, in µs, of as many calls as fit in `seconds` (at least 20), after a
/// pause and two warm-up calls.
fn timed(seconds: f64, mut call: impl FnMut() -> Res<()>) -> Res<f64> {
    std::thread::sleep(PAUSE);
    call()?;
    call()?;
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < 20 || start.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        call()?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(&mut times))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A compiled Kiln executable and its inputs, wrapped once.
struct KilnRun {
    exe: *mut kiln_executable,
    inputs: Vec<*mut kiln_tensor>,
    n_out: usize,
    // The wrapped tensors borrow these bytes.
    _bytes: Vec<Vec<u8>>,
}

fn kiln_check(s: kiln_status, what: &str) -> Res<()> {
    if s == KILN_STATUS_OK {
        return Ok(());
    }
    // SAFETY: the message is a NUL-terminated string Kiln owns until the next failure.
    let m = unsafe { CStr::from_ptr(kiln_last_error_message()) };
    Err(format!("kiln {what}: {}", m.to_string_lossy()))
}

impl KilnRun {
    fn new(c: &Case, threads: u32) -> Res<KilnRun> {
        let path = CString::new(c.model.as_str()).map_err(|e| e.to_string())?;
        let mut g: *mut kiln_graph = null_mut();
        let mut o: *mut kiln_compile_options = null_mut();
        let mut exe: *mut kiln_executable = null_mut();
        // SAFETY: each call gets valid out-pointers and the handles the one before made.
        unsafe {
            kiln_check(kiln_graph_import_onnx(path.as_ptr(), &mut g), "import")?;
            kiln_check(kiln_compile_options_new(&mut o), "options")?;
            kiln_check(kiln_compile_options_set_threads(o, threads), "threads")?;
            let compiled = kiln_check(kiln_compile(g, o, &mut exe), "compile");
            kiln_compile_options_free(o);
            kiln_graph_free(g);
            compiled?;
        }
        let bytes: Vec<Vec<u8>> = c.inputs.iter().map(|t| t.to_le_bytes()).collect();
        let mut inputs = Vec::new();
        for (t, b) in c.inputs.iter().zip(&bytes) {
            let dtype = DType::ALL
                .iter()
                .position(|&d| d == t.dtype())
                .expect("in ALL");
            let dims: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
            let mut h = null_mut();
            // SAFETY: `b` holds the tensor's bytes and outlives the handle (`_bytes`).
            let s = unsafe {
                kiln_tensor_wrap(
                    dtype as kiln_dtype,
                    dims.as_ptr(),
                    dims.len(),
                    b.as_ptr() as *mut _,
                    b.len(),
                    &mut h,
                )
            };
            kiln_check(s, "wrap")?;
            inputs.push(h);
        }
        // SAFETY: `exe` is the live executable compiled above.
        let n_out = unsafe { kiln_executable_output_count(exe) };
        if n_out > MAX_OUTPUTS {
            return Err(format!("{}: more than {MAX_OUTPUTS} outputs", c.model));
        }
        Ok(KilnRun {
            exe,
            inputs,
            n_out,
            _bytes: bytes,
        })
    }

    fn call(&self) -> Res<()> {
        let mut outs = [null_mut(); MAX_OUTPUTS];
        let outs = &mut outs[..self.n_out];
        // SAFETY: the executable and input handles are live; `outs` has a slot per output.
        let s = unsafe {
            kiln_executable_run(
                self.exe,
                self.inputs.as_ptr() as *const *const kiln_tensor,
                self.inputs.len(),
                outs.as_mut_ptr(),
                outs.len(),
            )
        };
        kiln_check(s, "run")?;
        for &mut o in outs {
            // SAFETY: each output is a new handle the run made for the caller.
            unsafe { kiln_tensor_free(o) };
        }
        Ok(())
    }
}

impl Drop for KilnRun {
    fn drop(&mut self) {
        // SAFETY: the handles were made by `new` and are freed once, here.
        unsafe {
            for &t in &self.inputs {
                kiln_tensor_free(t);
            }
            kiln_executable_free(self.exe);
        }
    }
}

/// An onnxruntime session and its inputs, made once; `call` is `OrtApi::Run` itself.
struct OrtRun {
    session: Session,
    // `value_ptrs` point into these.
    _inputs: Vec<DynValue>,
    // The C arrays `Run` takes, made once: they point into the names, which stay put.
    input_ptrs: Vec<*const c_char>,
    value_ptrs: Vec<*const ort::sys::OrtValue>,
    output_ptrs: Vec<*const c_char>,
    _names: Vec<CString>,
}

impl OrtRun {
    fn new(env: &Environment, c: &Case, threads: usize) -> Res<OrtRun> {
        let e = |e: ort::Error<SessionBuilder>| e.to_string();
        let session = (Session::builder(env).map_err(|e| e.to_string())?)
            .with_intra_threads(threads)
            .map_err(e)?
            .with_inter_threads(1)
            .map_err(e)?
            .commit_from_file(&c.model)
            .map_err(|e| format!("onnxruntime {}: {e}", c.model))?;
        let cstr = |n: &str| CString::new(n).map_err(|e| e.to_string());
        let input_names = (session.inputs().iter())
            .map(|i| cstr(i.name()))
            .collect::<Res<Vec<_>>>()?;
        let output_names = (session.outputs().iter())
            .map(|o| cstr(o.name()))
            .collect::<Res<Vec<_>>>()?;
        if output_names.len() > MAX_OUTPUTS {
            return Err(format!("{}: more than {MAX_OUTPUTS} outputs", c.model));
        }
        let inputs: Vec<DynValue> = c.inputs.iter().map(ort_value).collect::<Res<_>>()?;
        Ok(OrtRun {
            input_ptrs: input_names.iter().map(|n| n.as_ptr()).collect(),
            value_ptrs: inputs.iter().map(|v| v.ptr()).collect(),
            output_ptrs: output_names.iter().map(|n| n.as_ptr()).collect(),
            _names: input_names.into_iter().chain(output_names).collect(),
            session,
            _inputs: inputs,
        })
    }

    fn call(&self) -> Res<()> {
        let api = ort::api();
        let mut outs = [null_mut(); MAX_OUTPUTS];
        let outs = &mut outs[..self.output_ptrs.len()];
        // SAFETY: the session and values are live; the name arrays match their counts.
        let status = unsafe {
            (api.Run)(
                self.session.ptr() as *mut _,
                null(),
                self.input_ptrs.as_ptr(),
                self.value_ptrs.as_ptr(),
                self.value_ptrs.len(),
                self.output_ptrs.as_ptr(),
                self.output_ptrs.len(),
                outs.as_mut_ptr(),
            )
        };
        if !status.0.is_null() {
            // SAFETY: a non-NULL status carries a message and is released once.
            let m = unsafe { CStr::from_ptr((api.GetErrorMessage)(status.0)) };
            let m = m.to_string_lossy().into_owned();
            // SAFETY: the status is released once, after its message was copied.
            unsafe { (api.ReleaseStatus)(status.0) };
            return Err(format!("onnxruntime run: {m}"));
        }
        for &mut o in outs {
            // SAFETY: each output is a new value the run made for the caller.
            unsafe { (api.ReleaseValue)(o) };
        }
        Ok(())
    }
}

fn ort_value(t: &Tensor) -> Res<DynValue> {
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    fn typed<T: ort::value::PrimitiveTensorElementType + std::fmt::Debug + Clone + 'static>(
        shape: Vec<i64>,
        data: Vec<T>,
    ) -> Res<DynValue> {
        let v = ort::value::Tensor::from_array((shape, data)).map_err(|e| e.to_string())?;
        Ok(v.into_dyn())
    }
    let b = t.to_le_bytes();
    fn le<T, const N: usize>(b: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
        (b.chunks_exact(N))
            .map(|c| from(c.try_into().expect("N bytes")))
            .collect()
    }
    match t.dtype() {
        DType::F32 => typed(shape, le(&b, f32::from_le_bytes)),
        DType::F64 => typed(shape, le(&b, f64::from_le_bytes)),
        DType::I64 => typed(shape, le(&b, i64::from_le_bytes)),
        DType::I32 => typed(shape, le(&b, i32::from_le_bytes)),
        DType::U8 => typed(shape, b),
        DType::I8 => typed(shape, le(&b, i8::from_le_bytes)),
        DType::Bool => typed(shape, b.iter().map(|&x| x != 0).collect()),
        other => Err(format!("inputs of {other:?} are not handled here")),
    }
}
