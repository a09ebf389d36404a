//! The environment variables libgdsync honours (spec §4.2), read once with `atoi(getenv())`
//! semantics. `Settings::from_lookup` takes the lookup as a function so tests need not touch the
//! process environment.

#![forbid(unsafe_code)]

use std::sync::OnceLock;

use gpudirect_common::log::atoi;

/// Parsed settings; `true` means the variable is non-zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub enable_debug: bool,
    pub disable_write64: bool,
    /// Default **true** (upstream issue #68): NOR waits are off unless `GDS_DISABLE_WAIT_NOR=0`.
    pub disable_wait_nor: bool,
    pub disable_remote_flush: bool,
    pub disable_writememory: bool,
    pub simulate_write64: bool,
    /// Default **true**: batches use strong ordering unless `GDS_DISABLE_WEAK_CONSISTENCY=0`.
    pub disable_weak_consistency: bool,
    pub enable_dump_memops: bool,
    pub enable_wait_checker: bool,
}

impl Settings {
    /// Reads every variable through `lookup` (name → value).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Settings {
        let flag = |name: &str, default: bool| lookup(name).map(|v| atoi(&v) != 0).unwrap_or(default);
        let disable_writememory = flag("GDS_DISABLE_WRITEMEMORY", false);
        let mut simulate_write64 = flag("GDS_SIMULATE_WRITE64", false);
        if simulate_write64 && !disable_writememory {
            // Upstream: simulating 64-bit stores needs write-memory to be off for plain stores.
            crate::log::LOGGER.log(
                gpudirect_common::log::Level::Warn,
                "gds_env",
                format_args!("GDS_SIMULATE_WRITE64 is set while write-memory is not disabled: ignoring it"),
            );
            simulate_write64 = false;
        }
        Settings {
            enable_debug: flag("GDS_ENABLE_DEBUG", false),
            disable_write64: flag("GDS_DISABLE_WRITE64", false),
            disable_wait_nor: flag("GDS_DISABLE_WAIT_NOR", true),
            disable_remote_flush: flag("GDS_DISABLE_REMOTE_FLUSH", false),
            disable_writememory,
            simulate_write64,
            disable_weak_consistency: flag("GDS_DISABLE_WEAK_CONSISTENCY", true),
            enable_dump_memops: flag("GDS_ENABLE_DUMP_MEMOPS", false),
            enable_wait_checker: flag("GDS_ENABLE_WAIT_CHECKER", false),
        }
    }
}

impl Default for Settings {
    /// The values with no variable set.
    fn default() -> Self {
        Settings::from_lookup(|_| None)
    }
}

/// The process-wide settings, read on first use.
pub fn settings() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| {
        let s = Settings::from_lookup(|n| std::env::var_os(n).map(|v| v.to_string_lossy().into_owned()));
        if s.enable_wait_checker {
            crate::log::LOGGER.log(
                gpudirect_common::log::Level::Warn,
                "gds_env",
                format_args!("GDS_ENABLE_WAIT_CHECKER is not implemented by this libgdsync: no checker thread runs"),
            );
        }
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Settings {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Settings::from_lookup(|n| m.get(n).cloned())
    }

    #[test]
    fn defaults_are_upstreams() {
        let s = Settings::default();
        assert!(s.disable_wait_nor, "NOR is disabled by default");
        assert!(s.disable_weak_consistency);
        assert!(!s.disable_write64 && !s.disable_remote_flush && !s.enable_dump_memops);
    }

    #[test]
    fn atoi_semantics() {
        let s = with(&[("GDS_DISABLE_WAIT_NOR", "0"), ("GDS_DISABLE_WRITE64", "1"), ("GDS_ENABLE_DUMP_MEMOPS", "yes")]);
        assert!(!s.disable_wait_nor);
        assert!(s.disable_write64);
        assert!(!s.enable_dump_memops, "\"yes\" parses as 0 like atoi");
        let s = with(&[("GDS_DISABLE_REMOTE_FLUSH", " 7x"), ("GDS_DISABLE_WEAK_CONSISTENCY", "0")]);
        assert!(s.disable_remote_flush);
        assert!(!s.disable_weak_consistency);
    }

    #[test]
    fn simulate_write64_needs_writememory_disabled() {
        assert!(!with(&[("GDS_SIMULATE_WRITE64", "1")]).simulate_write64);
        assert!(with(&[("GDS_SIMULATE_WRITE64", "1"), ("GDS_DISABLE_WRITEMEMORY", "1")]).simulate_write64);
    }
}
