//! libgdsync's logger: upstream's line format `[<pid>] GDS <LVL> <function>() <text>` on stderr.
//! DBG lines only with `GDS_ENABLE_DEBUG` (non-zero); INFO/WARN/ERR always.

#![forbid(unsafe_code)]

use std::fmt;

use gpudirect_common::log::{Level, LogConfig, Logger, env_int, push_args};

fn read_config() -> LogConfig {
    let debug = env_int("GDS_ENABLE_DEBUG").unwrap_or(0) != 0;
    LogConfig { enabled: true, threshold: if debug { Level::Debug as i32 } else { Level::Info as i32 } }
}

/// Formats one line exactly as upstream does.
pub fn format_line(out: &mut String, level: Level, origin: &str, args: fmt::Arguments<'_>) {
    let lvl = match level {
        Level::Debug => "DBG  ",
        Level::Info => "INFO ",
        Level::Warn => "WARN ",
        Level::Error => "ERR  ",
    };
    push_args(out, format_args!("[{}] GDS {} {}() ", std::process::id(), lvl, origin));
    push_args(out, args);
    if !out.ends_with('\n') {
        out.push('\n');
    }
}

pub static LOGGER: Logger = Logger::new(read_config, format_line);

macro_rules! gds_log {
    ($lvl:ident, $origin:expr, $($arg:tt)*) => {
        $crate::log::LOGGER.log(gpudirect_common::log::Level::$lvl, $origin, format_args!($($arg)*))
    };
}
macro_rules! gds_dbg { ($origin:expr, $($arg:tt)*) => { gds_log!(Debug, $origin, $($arg)*) }; }
macro_rules! gds_info { ($origin:expr, $($arg:tt)*) => { gds_log!(Info, $origin, $($arg)*) }; }
macro_rules! gds_warn { ($origin:expr, $($arg:tt)*) => { gds_log!(Warn, $origin, $($arg)*) }; }
macro_rules! gds_err { ($origin:expr, $($arg:tt)*) => { gds_log!(Error, $origin, $($arg)*) }; }

/// Prints a warning only the first time this call site runs.
macro_rules! gds_warn_once {
    ($origin:expr, $($arg:tt)*) => {{
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| gds_warn!($origin, $($arg)*));
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_format_is_upstreams() {
        let mut s = String::new();
        format_line(&mut s, Level::Warn, "gds_map_mem", format_args!("x={}", 3));
        assert_eq!(s, format!("[{}] GDS WARN  gds_map_mem() x=3\n", std::process::id()));
        let mut s = String::new();
        format_line(&mut s, Level::Error, "f", format_args!("done\n"));
        assert!(s.ends_with("GDS ERR   f() done\n"), "{s}");
    }
}
