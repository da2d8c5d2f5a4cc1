//! Ops registered at run time (issue 8): a user's kernel, usually brought through the C
//! ABI (`kiln_register_op`, `src/capi/custom_op.rs`), that graphs use like a catalogue op.
//!
//! A registered op is an ordinary [`Op`] behind an `Arc`, keyed by its qualified name
//! `domain::name` (catalogue names never contain `::`, so the two cannot clash). Nodes
//! name it by that string, like every other op, and the `.kir` text prints it so. A
//! graph that uses one keeps its `Arc` ([`super::super::Graph`] pins the ops it was
//! built with), so unregistering an op stops new graphs from using it while graphs and
//! executables that already do keep working; the registration is dropped (and a C
//! user's destructor runs) when the last of them goes.
//!
//! The registry is a `std::sync::RwLock` over a `BTreeMap`: lookups (every node added,
//! every graph imported) share the read lock, (un)registration takes the write lock.
use crate::ir::ops::{InPlace, Origin};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use super::{Op, OpSchema};

/// An op of the catalogue or of the run-time registry.
#[derive(Clone)]
pub enum OpRef {
    Catalogue(&'static dyn Op),
    Registered(Arc<dyn Op>),
}

impl Deref for OpRef {
    type Target = dyn Op;
    fn deref(&self) -> &(dyn Op + 'static) {
        match self {
            OpRef::Catalogue(op) => *op,
            OpRef::Registered(op) => &**op,
        }
    }
}

/// The family name of registered ops' schemas: passes treat ops of this family as
/// opaque (no fusion, no algebraic rewrites; constant folding only when pure).
pub(crate) const FAMILY: &str = "custom";

fn registry() -> &'static RwLock<BTreeMap<String, Arc<dyn Op>>> {
    static REGISTRY: OnceLock<RwLock<BTreeMap<String, Arc<dyn Op>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(BTreeMap::new()))
}

/// `domain::name`: how nodes, the text format and errors name a registered op.
pub(crate) fn qualified(domain: &str, name: &str) -> String {
    format!("{domain}::{name}")
}

/// Whether `s` can be a domain or op name: what the `.kir` lexer reads as one identifier
/// on either side of `::` (`[A-Za-z_][A-Za-z0-9_.]*`).
pub(crate) fn valid_part(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

/// Adds `op` under its schema's name, which must be `domain::name`. An error if that
/// name is taken (unregister the old op first) or malformed.
pub fn register(op: Arc<dyn Op>) -> Result<(), String> {
    let name = op.schema().name;
    let Some((domain, op_name)) = name.split_once("::") else {
        return Err(format!(
            "'{name}' is not a qualified op name (domain::name)"
        ));
    };
    for (what, part) in [("domain", domain), ("name", op_name)] {
        if !valid_part(part) {
            return Err(format!(
                "op {what} '{part}' must match [A-Za-z_][A-Za-z0-9_.]* (it is printed in .kir text)"
            ));
        }
    }
    let mut reg = registry().write().unwrap_or_else(|e| e.into_inner());
    if reg.contains_key(name) {
        return Err(format!(
            "an op '{name}' is already registered (domain '{domain}', name '{op_name}'); unregister it first"
        ));
    }
    reg.insert(name.to_string(), op);
    Ok(())
}

/// Removes the op called `name` from the registry and returns it; `None` if no such op
/// is registered. Graphs that use it keep their reference.
pub fn unregister(name: &str) -> Option<Arc<dyn Op>> {
    registry()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .remove(name)
}

/// The registered op called `name`.
pub(crate) fn registered(name: &str) -> Option<Arc<dyn Op>> {
    registry()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(name)
        .cloned()
}

/// The op called `name`: the catalogue's, else a registered one.
pub fn resolve(name: &str) -> Option<OpRef> {
    if let Some(op) = super::lookup(name) {
        return Some(OpRef::Catalogue(op));
    }
    if !name.contains("::") {
        return None;
    }
    registered(name).map(OpRef::Registered)
}

/// The schema of a run-time op named `domain::name`: its inputs' and outputs' names as
/// `OpSchema` spells them (`x?` optional, `xs...` variadic), every string interned.
/// The C ABI's registrations and the Python package's make theirs here.
pub fn registered_schema(name: &str, inputs: &[String], outputs: &[String], doc: &str) -> OpSchema {
    let inputs: Vec<&'static str> = inputs.iter().map(|s| intern(s)).collect();
    let outputs: Vec<&'static str> = outputs.iter().map(|s| intern(s)).collect();
    OpSchema {
        name: intern(name),
        family: FAMILY,
        inputs: intern_list(&inputs),
        outputs: intern_list(&outputs),
        attrs: &[],
        doc: intern(doc),
        in_place: InPlace::No,
        origin: Origin::Onnx,
    }
}

/// `s` with a `'static` lifetime, for the `&'static str`s of a run-time op's schema.
/// Each distinct string is stored once and stays reachable from the interning table, so
/// registering and unregistering repeatedly does not grow memory (nor leak it).
fn intern(s: &str) -> &'static str {
    static STRINGS: OnceLock<Mutex<BTreeSet<&'static str>>> = OnceLock::new();
    let mut set = STRINGS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(&k) = set.get(s) {
        return k;
    }
    let k: &'static str = Box::leak(s.to_string().into_boxed_str());
    set.insert(k);
    k
}

/// `list` with a `'static` lifetime, interned like [`intern`].
fn intern_list(list: &[&'static str]) -> &'static [&'static str] {
    type Lists = BTreeSet<&'static [&'static str]>;
    static LISTS: OnceLock<Mutex<Lists>> = OnceLock::new();
    let mut set = LISTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(&k) = set.get(list) {
        return k;
    }
    let k: &'static [&'static str] = Box::leak(list.to_vec().into_boxed_slice());
    set.insert(k);
    k
}

/// The registered ops a graph uses, by name: a graph holds them so that it (and what is
/// compiled from it) keeps working after they are unregistered. Not part of a graph's
/// value: two graphs compare equal whatever they pin.
#[derive(Clone, Default)]
pub struct Pinned(BTreeMap<String, Arc<dyn Op>>);

impl Pinned {
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<dyn Op>> {
        self.0.get(name)
    }

    /// Pins the registered op `name` if it is one and not pinned yet.
    pub(crate) fn pin(&mut self, name: &str) {
        if name.contains("::") && !self.0.contains_key(name) {
            if let Some(op) = registered(name) {
                self.0.insert(name.to_string(), op);
            }
        }
    }
}

impl PartialEq for Pinned {
    fn eq(&self, _: &Pinned) -> bool {
        true
    }
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// Runs `f`, a call into `op`. For a registered op a panic inside it (a bug in a Rust
/// op, or in Kiln's side of a C op) becomes an error naming the op, so it fails the
/// call that reached it (adding the node, a run) like any error instead of unwinding
/// through whoever called Kiln.
pub(crate) fn contain<T>(op: &OpRef, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match op {
        OpRef::Catalogue(_) => f(),
        OpRef::Registered(o) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .unwrap_or_else(|payload| {
                let what = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".into());
                Err(format!("{} panicked: {what}", o.schema().name))
            }),
    }
}
