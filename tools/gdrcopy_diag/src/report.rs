//! Findings and their two renderings: plain words for people, JSON for scripts.

#![forbid(unsafe_code)]

use std::fmt::Write as _;

/// How a finding bears on GPUDirect working.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Checked and fine.
    Ok,
    /// Works, but something limits it or a related feature.
    Warn,
    /// This blocks a GPUDirect path.
    Fail,
    /// Facts without a judgement.
    Info,
    /// Could not be checked (a prerequisite is missing); says which.
    Skip,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Info => "info",
            Status::Skip => "skip",
        }
    }
}

/// A typed fact attached to a finding (keeps the JSON machine-readable).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    Null,
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_owned())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// One check's outcome: what was found, in words, and what to do about it.
#[derive(Clone, Debug)]
pub struct Finding {
    pub check: &'static str,
    pub status: Status,
    pub summary: String,
    pub fix: Option<String>,
    pub facts: Vec<(&'static str, Value)>,
}

impl Finding {
    pub fn new(check: &'static str, status: Status, summary: impl Into<String>) -> Finding {
        Finding { check, status, summary: summary.into(), fix: None, facts: Vec::new() }
    }
    pub fn fix(mut self, fix: impl Into<String>) -> Finding {
        self.fix = Some(fix.into());
        self
    }
    pub fn fact(mut self, key: &'static str, v: impl Into<Value>) -> Finding {
        self.facts.push((key, v.into()));
        self
    }
}

/// Text headings printed before the first finding of each later section (the check that opens
/// it): the registration and storage reports follow the gdrcopy checks.
const HEADINGS: &[(&str, &str)] =
    &[("peer-memory", "GPU memory registration with RDMA devices:"), ("storage", "GPU-initiated storage (libnvm):")];

/// The whole report: findings in check order and the verdict.
#[derive(Debug)]
pub struct Report {
    pub findings: Vec<Finding>,
    /// The backend that a working end-to-end pin/map/copy used, if any.
    pub working_path: Option<String>,
    pub verdict: String,
}

impl Report {
    pub fn human(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "gdrcopy_diag {}: can GPUDirect work on this machine?\n", env!("CARGO_PKG_VERSION"));
        for f in &self.findings {
            if let Some((_, h)) = HEADINGS.iter().find(|(c, _)| *c == f.check) {
                let _ = writeln!(s, "\n{h}");
            }
            let tag = match f.status {
                Status::Ok => " OK ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
                Status::Info => "INFO",
                Status::Skip => "SKIP",
            };
            let _ = writeln!(s, "[{tag}] {:<16} {}", f.check, f.summary);
            if let Some(fix) = &f.fix {
                let _ = writeln!(s, "       {:<16} fix: {fix}", "");
            }
        }
        let _ = writeln!(s, "\nverdict: {}", self.verdict);
        s
    }

    pub fn json(&self) -> String {
        let mut s = String::from("{");
        let _ = write!(s, "\"tool\":\"gdrcopy_diag\",\"version\":{},", quote(env!("CARGO_PKG_VERSION")));
        let _ = write!(s, "\"gpudirect_works\":{},", self.working_path.is_some());
        let _ = write!(s, "\"working_path\":{},", value(&self.working_path.clone().into()));
        let _ = write!(s, "\"verdict\":{},\"findings\":[", quote(&self.verdict));
        for (i, f) in self.findings.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(
                s,
                "{{\"check\":{},\"status\":{},\"summary\":{},\"fix\":{},\"facts\":{{",
                quote(f.check),
                quote(f.status.word()),
                quote(&f.summary),
                value(&f.fix.clone().into())
            );
            for (j, (k, v)) in f.facts.iter().enumerate() {
                if j > 0 {
                    s.push(',');
                }
                let _ = write!(s, "{}:{}", quote(k), value(v));
            }
            s.push_str("}}");
        }
        s.push_str("]}\n");
        s
    }
}

fn value(v: &Value) -> String {
    match v {
        Value::Str(t) => quote(t),
        Value::Int(i) => i.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "null".to_owned(),
    }
}

/// A JSON string literal (RFC 8259 escaping).
pub fn quote(t: &str) -> String {
    let mut s = String::with_capacity(t.len() + 2);
    s.push('"');
    for c in t.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_escapes_controls_quotes_and_backslashes() {
        assert_eq!(quote("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }

    #[test]
    fn json_carries_status_fix_and_typed_facts() {
        let r = Report {
            findings: vec![
                Finding::new("gdrdrv-node", Status::Fail, "missing").fix("load it").fact("major", 511i64),
                Finding::new("iommu", Status::Ok, "off").fact("enabled", false).fact("mode", None::<String>),
            ],
            working_path: None,
            verdict: "no".into(),
        };
        let j = r.json();
        assert!(j.contains("\"gpudirect_works\":false"), "{j}");
        assert!(
            j.contains("\"status\":\"fail\",\"summary\":\"missing\",\"fix\":\"load it\",\"facts\":{\"major\":511}")
        );
        assert!(j.contains("\"facts\":{\"enabled\":false,\"mode\":null}"), "{j}");
        let h = r.human();
        assert!(h.contains("[FAIL] gdrdrv-node"), "{h}");
        assert!(h.contains("fix: load it"), "{h}");
    }
}
