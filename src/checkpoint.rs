//! Checkpoints: an executable's variables in a small versioned file.
//!
//! The format (version 1), all integers little-endian:
//!
//! ```text
//! offset  size  field
//!      0     8  magic "KILNCKPT"
//!      8     4  u32 format version (1)
//!     12     8  u64 fingerprint of the variable set (below)
//!     20     4  u32 variable count
//!     24     8  u64 payload length: the bytes of the records that follow
//!     32     …  one record per variable, in the executable's order:
//!                 u32 name length, the name (UTF-8),
//!                 u32 dtype (the C ABI's kiln_dtype code),
//!                 u32 rank, rank × u64 dims,
//!                 u64 data length, the data (row-major, little-endian)
//!    end-8   8  u64 FNV-1a 64 checksum of every byte before it
//! ```
//!
//! The fingerprint is FNV-1a 64 over the variables sorted by name (name, dtype code, rank,
//! dims), so it identifies the set of names and types whatever the order of the graph's
//! nodes. `load` checks everything (size, magic, version, checksum, records, fingerprint,
//! and that the file's variables are exactly the executable's, in dtype and shape) before
//! it writes all of them at once through `Executable::write_variables`: a bad file leaves
//! the executable unchanged. `save` writes a temporary file beside the target and renames
//! it over, so a crash never leaves a half-written checkpoint at `path`.
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::Executable;
use crate::error::{Error, Result};
use crate::ir::{DType, TensorType};
use crate::tensor::Tensor;

/// The first 8 bytes of every checkpoint.
pub const MAGIC: &[u8; 8] = b"KILNCKPT";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

const HEADER_LEN: usize = 32;
const CHECKSUM_LEN: usize = 8;

/// FNV-1a, 64-bit: simple, dependency-free, and enough to catch accidental corruption
/// (this is not a defence against deliberate tampering).
#[derive(Clone, Copy)]
struct Fnv64(u64);

impl Fnv64 {
    fn new() -> Fnv64 {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }

    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

fn dtype_code(d: DType) -> u32 {
    DType::ALL.iter().position(|&x| x == d).expect("in ALL") as u32
}

/// The fingerprint of a variable set: names, dtypes and dims, independent of order.
fn fingerprint<'a>(vars: impl IntoIterator<Item = (&'a str, DType, &'a [usize])>) -> u64 {
    let mut sorted: Vec<_> = vars.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut h = Fnv64::new();
    for (name, dtype, dims) in sorted {
        h.update(&(name.len() as u32).to_le_bytes());
        h.update(name.as_bytes());
        h.update(&dtype_code(dtype).to_le_bytes());
        h.update(&(dims.len() as u32).to_le_bytes());
        for &d in dims {
            h.update(&(d as u64).to_le_bytes());
        }
    }
    h.0
}

/// The bytes of a checkpoint holding `vars` (name and value), in order.
pub(crate) fn encode(vars: &[(String, Tensor)]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (name, value) in vars {
        payload.extend((name.len() as u32).to_le_bytes());
        payload.extend(name.as_bytes());
        payload.extend(dtype_code(value.dtype()).to_le_bytes());
        payload.extend((value.rank() as u32).to_le_bytes());
        for &d in value.shape() {
            payload.extend((d as u64).to_le_bytes());
        }
        let data = value.to_le_bytes();
        payload.extend((data.len() as u64).to_le_bytes());
        payload.extend(data);
    }
    let print = fingerprint(vars.iter().map(|(n, v)| (n.as_str(), v.dtype(), v.shape())));
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + CHECKSUM_LEN);
    out.extend(MAGIC);
    out.extend(FORMAT_VERSION.to_le_bytes());
    out.extend(print.to_le_bytes());
    out.extend((vars.len() as u32).to_le_bytes());
    out.extend((payload.len() as u64).to_le_bytes());
    out.extend(payload);
    let mut h = Fnv64::new();
    h.update(&out);
    out.extend(h.0.to_le_bytes());
    out
}

/// A bounds-checked reader over the records; errors say what was being read.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(
        &mut self,
        n: usize,
        what: &dyn Fn() -> String,
    ) -> std::result::Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| {
            format!(
                "{} needs {n} bytes at payload offset {}, {} are left",
                what(),
                self.pos,
                self.bytes.len() - self.pos
            )
        })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
}

/// Parses and checks a checkpoint's bytes: size, magic, version, checksum, every record
/// and the fingerprint. Returns the variables in file order, or what is wrong.
pub(crate) fn decode(bytes: &[u8]) -> std::result::Result<Vec<(String, Tensor)>, String> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a Kiln checkpoint (the file does not start with KILNCKPT)".into());
    }
    if bytes.len() < HEADER_LEN + CHECKSUM_LEN {
        return Err(format!(
            "truncated: {} bytes, shorter than the {}-byte header and checksum",
            bytes.len(),
            HEADER_LEN + CHECKSUM_LEN
        ));
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    let version = u32_at(8);
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this build of Kiln reads version {FORMAT_VERSION}"
        ));
    }
    let print = u64_at(12);
    let count = u32_at(20) as usize;
    let payload_len = u64_at(24);
    let want = (HEADER_LEN + CHECKSUM_LEN) as u64 + payload_len.min(u64::MAX / 2);
    if bytes.len() as u64 != want {
        let how = if (bytes.len() as u64) < want {
            "truncated"
        } else {
            "trailing bytes"
        };
        return Err(format!(
            "{how}: {} bytes, the header promises {want}",
            bytes.len()
        ));
    }
    let body_end = bytes.len() - CHECKSUM_LEN;
    let mut h = Fnv64::new();
    h.update(&bytes[..body_end]);
    let stored = u64_at(body_end);
    if h.0 != stored {
        return Err(format!(
            "checksum mismatch (stored {stored:#018x}, computed {:#018x}): the file is corrupt",
            h.0
        ));
    }
    let mut r = Reader {
        bytes: &bytes[HEADER_LEN..body_end],
        pos: 0,
    };
    let mut vars: Vec<(String, Tensor)> = Vec::with_capacity(count.min(1 << 16));
    for i in 0..count {
        let at = |field: &str| format!("record {i}: {field}");
        let name_len = r.u32(&|| at("the name length"))? as usize;
        let name = std::str::from_utf8(r.take(name_len, &|| at("the name"))?)
            .map_err(|_| at("the name is not UTF-8"))?
            .to_string();
        let at = |field: &str| format!("record {i} ('{name}'): {field}");
        let code = r.u32(&|| at("the dtype"))?;
        let dtype = *DType::ALL
            .get(code as usize)
            .ok_or_else(|| at(&format!("{code} is not a dtype code")))?;
        let rank = r.u32(&|| at("the rank"))? as usize;
        let mut dims = Vec::with_capacity(rank.min(64));
        for k in 0..rank {
            let d = r.u64(&|| at(&format!("dim {k}")))?;
            dims.push(usize::try_from(d).map_err(|_| at(&format!("dim {k} is {d}")))?);
        }
        let data_len = r.u64(&|| at("the data length"))?;
        let need = dims
            .iter()
            .try_fold(dtype.size_in_bytes(), |n, &d| n.checked_mul(d))
            .filter(|&n| n as u64 == data_len)
            .ok_or_else(|| {
                at(&format!(
                    "{data_len} bytes of data do not fit {}{dims:?}",
                    dtype.name()
                ))
            })?;
        let data = r.take(need, &|| at("the data"))?;
        let value = Tensor::from_le_bytes(dtype, &dims, data).map_err(|e| at(&e))?;
        if vars.iter().any(|(n, _)| *n == name) {
            return Err(format!("variable '{name}' is stored twice"));
        }
        vars.push((name, value));
    }
    if r.pos != r.bytes.len() {
        return Err(format!(
            "{} bytes after the last of {count} records",
            r.bytes.len() - r.pos
        ));
    }
    let computed = fingerprint(vars.iter().map(|(n, v)| (n.as_str(), v.dtype(), v.shape())));
    if computed != print {
        return Err("the variable-set fingerprint does not match the records".into());
    }
    Ok(vars)
}

/// Tells apart `exe`'s variables and a checkpoint's: every difference, by name.
fn compare(exe_vars: &[(String, TensorType)], file_vars: &[(String, Tensor)]) -> Vec<String> {
    let file: BTreeMap<&str, &Tensor> = file_vars.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut problems = Vec::new();
    for (name, ty) in exe_vars {
        match file.get(name.as_str()) {
            None => problems.push(format!("variable '{name}' ({ty}) is missing from the file")),
            Some(t) => {
                let fits = t.dtype() == ty.dtype && ty.static_dims().as_deref() == Some(t.shape());
                if !fits {
                    problems.push(format!(
                        "variable '{name}' is {ty} in the executable but {}{:?} in the file",
                        t.dtype(),
                        t.shape()
                    ));
                }
            }
        }
    }
    for (name, t) in file_vars {
        if !exe_vars.iter().any(|(n, _)| n == name) {
            problems.push(format!(
                "the file's variable '{name}' ({}{:?}) is not one of the executable's",
                t.dtype(),
                t.shape()
            ));
        }
    }
    problems
}

/// Writes `exe`'s variables to `path`, atomically (a temporary file beside it, renamed
/// over). The variables are read together between runs, so the checkpoint is one
/// step's state even while other threads train.
pub fn save(exe: &dyn Executable, path: &Path) -> Result<()> {
    write_atomically(path, &encode(&exe.read_variables()?))
}

fn temp_path(path: &Path) -> PathBuf {
    // Unique per process and call, so concurrent saves never share a temporary.
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}-{n}", std::process::id()));
    path.with_file_name(name)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    if path.file_name().is_none() {
        return Err(Error::io(path, "not a file path"));
    }
    let tmp = temp_path(path);
    let written = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        // On disk before the rename makes it visible under the real name.
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    written.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// Reads the checkpoint at `path` into `exe`'s variables. Everything is checked first: a
/// file that is unreadable, truncated, corrupt or of another format version is an
/// `Error::Io`; one whose variables are not exactly `exe`'s (a missing or extra name,
/// another dtype or shape) an `Error::InvalidArgument` naming each difference. Then all
/// variables are written at once; on any error none is.
pub fn load(exe: &dyn Executable, path: &Path) -> Result<()> {
    let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
    let file_vars = decode(&bytes).map_err(|e| Error::io(path, e))?;
    let exe_vars = exe.variables();
    let problems = compare(&exe_vars, &file_vars);
    if !problems.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{}: the checkpoint is of another graph: {}",
            path.display(),
            problems.join("; ")
        )));
    }
    let values: Vec<(&str, &Tensor)> = file_vars.iter().map(|(n, t)| (n.as_str(), t)).collect();
    exe.write_variables(&values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{backend_with, Device};
    use crate::ir::{Attrs, Graph, Shape, Value};

    /// A variable: name, dtype, dims.
    type VarSpec = (&'static str, DType, &'static [usize]);

    /// A graph with variables `vars`, each bumped by one per run.
    fn exe_with(vars: &[VarSpec]) -> Box<dyn Executable> {
        let mut g = Graph::new("g");
        for (i, &(name, dtype, dims)) in vars.iter().enumerate() {
            let n: usize = dims.iter().product();
            let init: Vec<f64> = (0..n).map(|k| (k + 10 * i) as f64 * 0.5).collect();
            let init = Tensor::from_f64s(dtype, dims, &init).unwrap();
            let ty = TensorType::new(dtype, Shape::fixed(dims));
            let v = Value::from(g.add_variable(name, ty, init).unwrap());
            let one = Tensor::from_f64s(dtype, &[], &[1.0]).unwrap();
            let one = Value::from(g.add_constant_value("", one).unwrap());
            let next = Value::from(g.op("Add", &[v, one], Attrs::new(), "").unwrap());
            g.op("Assign", &[v, next], Attrs::new(), "").unwrap();
            if i == 0 {
                g.add_output("seen", next).unwrap();
            }
        }
        let interp = backend_with(Device::Interp, Default::default()).unwrap();
        interp.compile(&g).unwrap()
    }

    const VARS: &[VarSpec] = &[
        ("w", DType::F32, &[2, 3]),
        ("b", DType::F32, &[3]),
        ("step", DType::I64, &[]),
    ];

    fn values(exe: &dyn Executable) -> Vec<Tensor> {
        exe.variables()
            .iter()
            .map(|(n, _)| exe.read_variable(n).unwrap())
            .collect()
    }

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("kiln-ckpt-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// A saved checkpoint of a trained `exe`, then a run that changes its variables.
    fn saved_then_changed(file: &str) -> (Box<dyn Executable>, PathBuf, Vec<Tensor>) {
        let exe = exe_with(VARS);
        exe.run(&[]).unwrap();
        let path = dir().join(file);
        save(exe.as_ref(), &path).unwrap();
        let saved = values(exe.as_ref());
        exe.run(&[]).unwrap();
        assert_ne!(values(exe.as_ref()), saved);
        (exe, path, saved)
    }

    /// Loading `bytes` fails with a message containing `needle`, changing nothing.
    fn load_fails(exe: &dyn Executable, path: &Path, bytes: &[u8], needle: &str) -> Error {
        fs::write(path, bytes).unwrap();
        let before = values(exe);
        let err = load(exe, path).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
        assert_eq!(values(exe), before, "a failed load changed the variables");
        err
    }

    #[test]
    fn save_and_load_round_trip() {
        let (exe, path, saved) = saved_then_changed("round.ckpt");
        load(exe.as_ref(), &path).unwrap();
        assert_eq!(values(exe.as_ref()), saved);
        // A fresh executable of the same graph takes it too.
        let fresh = exe_with(VARS);
        load(fresh.as_ref(), &path).unwrap();
        assert_eq!(values(fresh.as_ref()), saved);
        // The variable order in the graph does not matter, only the set.
        let reordered = exe_with(&[VARS[2], VARS[0], VARS[1]]);
        load(reordered.as_ref(), &path).unwrap();
        assert_eq!(reordered.read_variable("w").unwrap(), saved[0]);
        // No temporary is left beside the file.
        let leftovers: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains("round.ckpt.tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn the_layout_is_as_documented() {
        let w = Tensor::from_f64s(DType::F32, &[2], &[1.0, -2.0]).unwrap();
        let bytes = encode(&[("w".to_string(), w)]);
        let record = 4 + 1 + 4 + 4 + 8 + 8 + 8;
        assert_eq!(bytes.len(), HEADER_LEN + record + CHECKSUM_LEN);
        assert_eq!(&bytes[..8], b"KILNCKPT");
        assert_eq!(bytes[8..12], 1u32.to_le_bytes());
        assert_eq!(bytes[20..24], 1u32.to_le_bytes());
        assert_eq!(bytes[24..32], (record as u64).to_le_bytes());
        assert_eq!(&bytes[32..37], b"\x01\x00\x00\x00w");
        assert_eq!(bytes[37..41], 0u32.to_le_bytes(), "f32 is kiln_dtype 0");
        assert_eq!(bytes[41..45], 1u32.to_le_bytes());
        assert_eq!(bytes[45..53], 2u64.to_le_bytes());
        assert_eq!(bytes[53..61], 8u64.to_le_bytes());
        assert_eq!(bytes[61..65], 1.0f32.to_le_bytes());
        assert_eq!(bytes[65..69], (-2.0f32).to_le_bytes());
    }

    #[test]
    fn truncated_files_fail_and_change_nothing() {
        let (exe, path, _) = saved_then_changed("trunc.ckpt");
        let good = fs::read(&path).unwrap();
        // Every cut: inside the magic, the header, a record, the checksum.
        for cut in [
            0,
            5,
            8,
            20,
            39,
            HEADER_LEN + 10,
            good.len() / 2,
            good.len() - 1,
        ] {
            let err = load_fails(exe.as_ref(), &path, &good[..cut], "");
            assert!(matches!(err, Error::Io(_)), "{err:?}");
            let m = err.to_string();
            assert!(
                m.contains("truncated") || m.contains("not a Kiln checkpoint"),
                "cut at {cut}: {m}"
            );
        }
        let mut longer = good.clone();
        longer.push(0);
        load_fails(exe.as_ref(), &path, &longer, "trailing bytes");
    }

    #[test]
    fn bad_magic_version_and_checksum_fail() {
        let (exe, path, _) = saved_then_changed("bad.ckpt");
        let good = fs::read(&path).unwrap();
        let mut b = good.clone();
        b[0] = b'X';
        load_fails(exe.as_ref(), &path, &b, "not a Kiln checkpoint");
        let mut b = good.clone();
        b[8] = 7;
        load_fails(exe.as_ref(), &path, &b, "format version 7");
        // One flipped bit in the data, the checksum, the fingerprint.
        for at in [good.len() - 20, good.len() - 1, 12] {
            let mut b = good.clone();
            b[at] ^= 0x10;
            load_fails(exe.as_ref(), &path, &b, "checksum mismatch");
        }
        let missing = dir().join("no-such.ckpt");
        let err = load(exe.as_ref(), &missing).unwrap_err();
        assert!(matches!(err, Error::Io(_)) && err.to_string().contains("no-such.ckpt"));
    }

    #[test]
    fn records_that_lie_are_caught_even_with_a_valid_checksum() {
        let (exe, path, _) = saved_then_changed("lie.ckpt");
        let good = fs::read(&path).unwrap();
        let reseal = |mut b: Vec<u8>| {
            let end = b.len() - CHECKSUM_LEN;
            let mut h = Fnv64::new();
            h.update(&b[..end]);
            b[end..].copy_from_slice(&h.0.to_le_bytes());
            b
        };
        // A fingerprint that is not the records'.
        let mut b = good.clone();
        b[12] ^= 1;
        load_fails(exe.as_ref(), &path, &reseal(b), "fingerprint");
        // A dtype code out of range in record 0 ('w': name length 1, then the dtype).
        let mut b = good.clone();
        b[HEADER_LEN + 5] = 99;
        load_fails(
            exe.as_ref(),
            &path,
            &reseal(b),
            "record 0 ('w'): 99 is not a dtype",
        );
        // More records promised than stored.
        let mut b = good.clone();
        b[20] = 4;
        load_fails(exe.as_ref(), &path, &reseal(b), "record 3");
    }

    #[test]
    fn a_checkpoint_of_another_graph_names_every_difference() {
        let (exe, path, _) = saved_then_changed("other.ckpt");
        let write_from = |vars: &[VarSpec]| {
            let other = exe_with(vars);
            save(other.as_ref(), &path).unwrap();
            fs::read(&path).unwrap()
        };
        let cases: &[(&[VarSpec], &str)] = &[
            (
                &VARS[..2],
                "variable 'step' (i64[]) is missing from the file",
            ),
            (
                &[VARS[0], VARS[1], VARS[2], ("extra", DType::F32, &[1])],
                "the file's variable 'extra' (f32[1]) is not one of the executable's",
            ),
            (
                &[VARS[0], ("b", DType::F64, &[3]), VARS[2]],
                "variable 'b' is f32[3] in the executable but f64[3] in the file",
            ),
            (
                &[("w", DType::F32, &[3, 2]), VARS[1], VARS[2]],
                "variable 'w' is f32[2, 3] in the executable but f32[3, 2] in the file",
            ),
        ];
        for (vars, needle) in cases {
            let bytes = write_from(vars);
            let err = load_fails(exe.as_ref(), &path, &bytes, needle);
            assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
            assert!(err.to_string().contains("another graph"), "{err}");
        }
    }

    #[test]
    fn saving_into_a_missing_directory_fails_naming_the_path() {
        let exe = exe_with(VARS);
        let path = dir().join("no-such-dir").join("x.ckpt");
        let err = save(exe.as_ref(), &path).unwrap_err();
        assert!(matches!(err, Error::Io(_)) && err.to_string().contains("x.ckpt"));
    }
}
