//! libnvm's logger: `[function] message` lines on stderr, as upstream's debug builds print them.
//! Errors are printed by default; `NVM_LOG_LEVEL` (1 debug … 4 errors only, 0 silent) changes it.

#![forbid(unsafe_code)]

use std::fmt;

use gpudirect_common::log::{Level, LogConfig, Logger, env_int, push_args};

fn read_config() -> LogConfig {
    match env_int("NVM_LOG_LEVEL") {
        Some(0) => LogConfig { enabled: false, threshold: 0 },
        Some(n) => LogConfig { enabled: true, threshold: n },
        None => LogConfig { enabled: true, threshold: Level::Warn as i32 },
    }
}

/// One line: `[origin] text`.
pub fn format_line(out: &mut String, _level: Level, origin: &str, args: fmt::Arguments<'_>) {
    push_args(out, format_args!("[{origin}] "));
    push_args(out, args);
    if !out.ends_with('\n') {
        out.push('\n');
    }
}

pub static LOGGER: Logger = Logger::new(read_config, format_line);

macro_rules! nvm_log {
    ($lvl:ident, $origin:expr, $($arg:tt)*) => {
        $crate::log::LOGGER.log(gpudirect_common::log::Level::$lvl, $origin, format_args!($($arg)*))
    };
}
macro_rules! nvm_err { ($origin:expr, $($arg:tt)*) => { nvm_log!(Error, $origin, $($arg)*) }; }
macro_rules! nvm_warn { ($origin:expr, $($arg:tt)*) => { nvm_log!(Warn, $origin, $($arg)*) }; }

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_format() {
        let mut s = String::new();
        format_line(&mut s, Level::Error, "nvm_aq_create", format_args!("x={}", 1));
        assert_eq!(s, "[nvm_aq_create] x=1\n");
    }
}
