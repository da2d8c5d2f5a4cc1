//! The host's data caches, read once: kernels size their blocking from these rather
//! than from constants tuned on one machine (hosts of one kind differ by 2× in cache).
//!
//! Linux reports each cache in sysfs (`/sys/devices/system/cpu/cpu0/cache/index*/`);
//! elsewhere, or when sysfs says nothing usable, the sizes are the conservative
//! defaults of a common x86-64 core (32 KiB L1d, 1 MiB L2).
use std::sync::OnceLock;

/// Per-core data cache sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caches {
    pub l1d: usize,
    pub l2: usize,
}

const DEFAULT: Caches = Caches {
    l1d: 32 * 1024,
    l2: 1024 * 1024,
};

/// The host's caches (read on first call).
pub(crate) fn caches() -> Caches {
    static CACHES: OnceLock<Caches> = OnceLock::new();
    *CACHES.get_or_init(|| read_sysfs().unwrap_or(DEFAULT))
}

fn read_sysfs() -> Option<Caches> {
    let mut found = DEFAULT;
    let (mut l1d, mut l2) = (false, false);
    for index in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        let Some(bytes) = parse_size(size.trim()) else {
            continue;
        };
        match (level.trim(), kind.trim()) {
            ("1", "Data") => (found.l1d, l1d) = (bytes, true),
            ("2", "Unified" | "Data") => (found.l2, l2) = (bytes, true),
            _ => {}
        }
    }
    (l1d || l2).then_some(found)
}

/// sysfs sizes: `48K`, `2048K`, `2M`, or plain bytes; None for nonsense or zero.
fn parse_size(s: &str) -> Option<usize> {
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: usize = digits.parse().ok()?;
    let bytes = match unit {
        "" => n,
        "K" => n.checked_mul(1024)?,
        "M" => n.checked_mul(1024 * 1024)?,
        _ => return None,
    };
    (bytes > 0).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_sizes_parse() {
        assert_eq!(parse_size("48K"), Some(48 * 1024));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("0K"), None);
        assert_eq!(parse_size("12G"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn caches_are_plausible() {
        let c = caches();
        assert!(c.l1d >= 4 * 1024 && c.l1d <= c.l2, "{c:?}");
    }
}
