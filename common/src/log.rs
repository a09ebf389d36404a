//! The logger both libraries use, configured per library.
//!
//! Each library reads its own environment variables once (lazily, at the first message attempt, as
//! upstream does) and formats lines its own way; this module owns the mechanics: the one-time
//! configuration, the level threshold and writing whole lines to stderr with a single `write(2)`
//! so lines from several threads never interleave.

#![forbid(unsafe_code)]

use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::sync::OnceLock;

/// Message severity, numbered as upstream's levels (DEBUG = 1 … ERROR = 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
}

/// What the environment said, read once per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// Nothing is printed unless logging is enabled.
    pub enabled: bool,
    /// Messages below this level are dropped (compared with `Level as i32`).
    pub threshold: i32,
}

/// A line formatter: appends the whole line (including its trailing newline) to `out`.
pub type LineFormat = fn(out: &mut String, level: Level, origin: &str, args: fmt::Arguments<'_>);

/// A lazily configured logger; declare one `static` per library.
pub struct Logger {
    read_config: fn() -> LogConfig,
    format: LineFormat,
    config: OnceLock<LogConfig>,
}

impl Logger {
    /// `read_config` runs once, at the first message attempt.
    pub const fn new(read_config: fn() -> LogConfig, format: LineFormat) -> Self {
        Logger { read_config, format, config: OnceLock::new() }
    }

    /// The configuration, read from the environment on first use.
    pub fn config(&self) -> LogConfig {
        *self.config.get_or_init(self.read_config)
    }

    /// Whether a message of `level` would be printed.
    pub fn enabled(&self, level: Level) -> bool {
        let c = self.config();
        c.enabled && level as i32 >= c.threshold
    }

    /// Prints one message if its level passes; `origin` is the reporting function's name.
    pub fn log(&self, level: Level, origin: &str, args: fmt::Arguments<'_>) {
        if !self.enabled(level) {
            return;
        }
        let mut line = String::with_capacity(128);
        (self.format)(&mut line, level, origin, args);
        // One write call per line; a failed write to stderr has nowhere to be reported.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// C's `atoi`: optional leading whitespace and sign, then decimal digits; anything else gives 0.
/// Upstream parses its level variables this way, so "abc" means level 0.
pub fn atoi(s: &str) -> i32 {
    let s = s.trim_start();
    let (neg, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let mut v: i64 = 0;
    for b in digits.bytes().take_while(u8::is_ascii_digit) {
        v = (v * 10 + i64::from(b - b'0')).min(i64::from(i32::MAX) + 1);
    }
    let v = if neg { -v } else { v };
    v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

/// Reads an integer environment variable the way upstream does (`atoi(getenv(name))`).
pub fn env_int(name: &str) -> Option<i32> {
    std::env::var_os(name).map(|v| atoi(&v.to_string_lossy()))
}

/// Helper for formatters: appends `args` to `out`.
pub fn push_args(out: &mut String, args: fmt::Arguments<'_>) {
    let _ = out.write_fmt(args);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atoi_matches_c() {
        assert_eq!(atoi("4"), 4);
        assert_eq!(atoi("  -2x"), -2);
        assert_eq!(atoi("abc"), 0);
        assert_eq!(atoi(""), 0);
        assert_eq!(atoi("+17"), 17);
        assert_eq!(atoi("99999999999"), i32::MAX);
    }

    fn fmt_plain(out: &mut String, level: Level, origin: &str, args: fmt::Arguments<'_>) {
        push_args(out, format_args!("{level:?} {origin}: "));
        push_args(out, args);
        out.push('\n');
    }

    #[test]
    fn threshold_and_enable_decide() {
        static OFF: Logger = Logger::new(|| LogConfig { enabled: false, threshold: 0 }, fmt_plain);
        static WARN: Logger = Logger::new(|| LogConfig { enabled: true, threshold: 3 }, fmt_plain);
        assert!(!OFF.enabled(Level::Error));
        assert!(WARN.enabled(Level::Error));
        assert!(WARN.enabled(Level::Warn));
        assert!(!WARN.enabled(Level::Info));
        let mut s = String::new();
        fmt_plain(&mut s, Level::Warn, "f", format_args!("x={}", 1));
        assert_eq!(s, "Warn f: x=1\n");
    }
}
