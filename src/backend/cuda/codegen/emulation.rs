//! Host emulation of generated kernels: the CUDA C compiled by g++ against
//! `emulation.h` (which defines the CUDA built-ins, runs each block's threads as fibers
//! with real barriers and warp shuffles), inside a generated host program that reads
//! every parameter's buffer from a file, launches the kernel over its whole grid and
//! writes the outputs back. Tests compare those outputs with the reference interpreter.
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{GeneratedKernel, KernelParam};

/// The emulation header.
pub const HEADER: &str = include_str!("emulation.h");

/// One launch: a kernel and the initial contents of each of its parameters' buffers, in
/// parameter order (inputs' data; outputs as they are before the launch, which matters
/// for read-modify-write epilogues; scratch).
pub struct HostLaunch<'a> {
    pub kernel: &'a GeneratedKernel,
    pub buffers: Vec<Vec<u8>>,
}

/// Whether a kernel needs its threads run as fibers (it waits at barriers).
pub(crate) fn needs_fibers(source: &str) -> bool {
    source.contains("__syncthreads") || source.contains("__shfl")
}

/// The C++ host program running `launches` in order: launch `i` reads parameter `j`
/// from `<dir>/l<i>_p<j>.bin` and writes each output parameter to `<dir>/l<i>_p<j>.out`
/// (`dir` is the program's first argument). Each kernel sits in its own namespace, so
/// kernels from different graphs may share entry names and helpers.
pub(crate) fn host_program(launches: &[HostLaunch<'_>]) -> String {
    let mut s = String::new();
    s.push_str(HEADER);
    for (i, l) in launches.iter().enumerate() {
        let k = l.kernel;
        let _ = writeln!(s, "namespace kiln_l{i} {{");
        // `extern "C"` would put every kernel's entry in one namespace.
        s.push_str(&k.source.replace("extern \"C\" ", ""));
        let _ = writeln!(s, "}}  // namespace kiln_l{i}");
        let _ = writeln!(s, "static void run_l{i}(const char* dir) {{");
        let _ = writeln!(s, "  char path[4096];");
        for (j, b) in l.buffers.iter().enumerate() {
            let _ = writeln!(
                s,
                "  snprintf(path, sizeof path, \"%s/l{i}_p{j}.bin\", dir);\n  kiln_emu::Buf b{j}{{kiln_emu::read_file(path, {})}};",
                b.len()
            );
        }
        let args: Vec<String> = (0..l.buffers.len()).map(|j| format!("b{j}")).collect();
        let [gx, gy, gz] = k.grid;
        let [bx, by, bz] = k.block;
        let _ = writeln!(
            s,
            "  kiln_emu::launch({}, dim3({gx}, {gy}, {gz}), dim3({bx}, {by}, {bz}), [&] {{ kiln_l{i}::{}({}); }});",
            needs_fibers(&k.source),
            k.entry,
            args.join(", ")
        );
        for (j, p) in k.params.iter().enumerate() {
            if matches!(p, KernelParam::Output(_)) {
                let _ = writeln!(
                    s,
                    "  snprintf(path, sizeof path, \"%s/l{i}_p{j}.out\", dir);\n  kiln_emu::write_file(path, b{j}.p, {});",
                    l.buffers[j].len()
                );
            }
        }
        for j in 0..l.buffers.len() {
            let _ = writeln!(s, "  free(b{j}.p);");
        }
        let _ = writeln!(s, "}}");
    }
    s.push_str("int main(int argc, char** argv) {\n  if (argc < 2) { return 2; }\n");
    for i in 0..launches.len() {
        let _ = writeln!(s, "  run_l{i}(argv[1]);");
    }
    s.push_str("  return 0;\n}\n");
    s
}

/// A fresh directory under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "kiln-cuda-emu-{}-{}-{nanos}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `g++` runs here.
pub fn have_gxx() -> bool {
    Command::new("g++")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Compiles `launches` into one host program with `g++ -O1 -std=c++17` (plus `flags`),
/// runs it, and returns per launch, per parameter, the buffer after the launch (the
/// initial contents for parameters the kernel only reads). Err carries g++'s log or the
/// program's error output.
pub fn run_on_host(
    launches: &[HostLaunch<'_>],
    flags: &[&str],
) -> Result<Vec<Vec<Vec<u8>>>, String> {
    for (i, l) in launches.iter().enumerate() {
        if l.buffers.len() != l.kernel.params.len() {
            return Err(format!(
                "launch {i} ({}): {} buffers for {} parameters",
                l.kernel.entry,
                l.buffers.len(),
                l.kernel.params.len()
            ));
        }
    }
    let tmp = TempDir::new().map_err(|e| format!("temporary directory: {e}"))?;
    let dir: &Path = &tmp.0;
    let src = dir.join("kernels.cpp");
    let exe = dir.join("kernels");
    std::fs::write(&src, host_program(launches)).map_err(|e| e.to_string())?;
    for (i, l) in launches.iter().enumerate() {
        for (j, b) in l.buffers.iter().enumerate() {
            std::fs::write(dir.join(format!("l{i}_p{j}.bin")), b).map_err(|e| e.to_string())?;
        }
    }
    let out = Command::new("g++")
        .args(["-O1", "-std=c++17"])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| format!("cannot run g++: {e}"))?;
    if !out.status.success() {
        let entries: Vec<&str> = launches.iter().map(|l| l.kernel.entry.as_str()).collect();
        return Err(format!(
            "g++ failed on the kernels {}:\n{}",
            entries.join(", "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let run = Command::new(&exe)
        .arg(dir)
        .output()
        .map_err(|e| format!("cannot run the host program: {e}"))?;
    if !run.status.success() {
        return Err(format!(
            "the host program failed ({}):\n{}",
            run.status,
            String::from_utf8_lossy(&run.stderr)
        ));
    }
    let mut results = vec![];
    for (i, l) in launches.iter().enumerate() {
        let mut bufs = vec![];
        for (j, p) in l.kernel.params.iter().enumerate() {
            if matches!(p, KernelParam::Output(_)) {
                let path = dir.join(format!("l{i}_p{j}.out"));
                bufs.push(std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?);
            } else {
                bufs.push(l.buffers[j].clone());
            }
        }
        results.push(bufs);
    }
    Ok(results)
}
