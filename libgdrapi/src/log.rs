//! gdrcopy's logging: enabled when `GDRCOPY_ENABLE_LOGGING` exists (any value), threshold from
//! `GDRCOPY_LOG_LEVEL` (C `atoi`, default 4 = errors only), lines to stderr with upstream's prefixes.

#![forbid(unsafe_code)]

use std::fmt;

use gpudirect_common::log::{Level, LogConfig, Logger, env_int, push_args};

fn read_config() -> LogConfig {
    LogConfig {
        enabled: std::env::var_os("GDRCOPY_ENABLE_LOGGING").is_some(),
        threshold: env_int("GDRCOPY_LOG_LEVEL").unwrap_or(Level::Error as i32),
    }
}

fn format_line(out: &mut String, level: Level, _origin: &str, args: fmt::Arguments<'_>) {
    out.push_str(match level {
        Level::Debug => "DBG:  ",
        Level::Info => "INFO: ",
        Level::Warn => "WARN: ",
        Level::Error => "ERR:  ",
    });
    push_args(out, args);
    if !out.ends_with('\n') {
        out.push('\n');
    }
}

/// The library's logger.
pub static LOGGER: Logger = Logger::new(read_config, format_line);

macro_rules! gdr_log {
    ($level:ident, $($arg:tt)*) => {
        $crate::log::LOGGER.log(gpudirect_common::log::Level::$level, module_path!(), format_args!($($arg)*))
    };
}
macro_rules! gdr_dbg { ($($arg:tt)*) => { gdr_log!(Debug, $($arg)*) }; }
macro_rules! gdr_info { ($($arg:tt)*) => { gdr_log!(Info, $($arg)*) }; }
#[allow(unused_macros)]
macro_rules! gdr_warn { ($($arg:tt)*) => { gdr_log!(Warn, $($arg)*) }; }
macro_rules! gdr_err { ($($arg:tt)*) => { gdr_log!(Error, $($arg)*) }; }

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_upstream_prefixes() {
        let mut s = String::new();
        format_line(&mut s, Level::Error, "x", format_args!("ioctl error (errno={})", 22));
        assert_eq!(s, "ERR:  ioctl error (errno=22)\n");
        s.clear();
        format_line(&mut s, Level::Debug, "x", format_args!("a\n"));
        assert_eq!(s, "DBG:  a\n");
    }
}
