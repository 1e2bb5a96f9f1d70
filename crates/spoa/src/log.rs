//! The logs: the process log and the applications' logs of matched rules, in the formats
//! the file's `log_format` names, and coraza-spoa's JSON shape for matched rules.
//!
//! Every event but a matched rule is written by tracing's formatters ([`lastcall::logging`]:
//! text, or one flat JSON object per line). A matched rule in a JSON log is written as
//! coraza-spoa 0.7 writes it (`internal/application.go`, `logCallback` with `log_format:
//! json`): zerolog's `level`, the rule under `match`, zerolog's `time`:
//!
//! ```text
//! {"level":"error","match":{"client":"10.0.0.7","file":"…/REQUEST-942-APPLICATION-ATTACK-SQLI.conf","line":45,"rule_id":942100,"revision":"","msg":"SQL Injection Attack Detected via libinjection","data":"Matched Data: …","severity":"critical","severity_id":2,"version":"OWASP_CRS/3.3.4","maturity":0,"accuracy":0,"tags":["application-multi","attack-sqli"],"server":"10.0.0.9","uri":"/?id=…","unique_id":"SBVBXYOALZTGDFTV","disruptive":false,"phase_id":2,"phase":"request-body"},"time":"2026-12-01T11:56:52Z"}
//! ```
//!
//! tracing's JSON formatter cannot nest an object, so that line is written here with
//! serde_json (`CorazaRules`), from one event whose `coraza_match` field carries the
//! object; `log_format: json-flat` keeps the rule's fields at the top level like every
//! other event.

use std::fmt;
use std::sync::OnceLock;
use std::time::SystemTime;

use lastcall::{LogArgs, LogFormat};
use lastcall_modsec::RuleMatch;
use serde::Serialize;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{Format, Json, Writer};
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// The target of matched-rule events (under `lastcall_spoa::waf`, so filters written for
/// that module keep applying): `log_level: info,lastcall_spoa::waf::rule=off` silences
/// them.
pub(crate) const RULE_TARGET: &str = "lastcall_spoa::waf::rule";

/// The field of a matched-rule event that carries coraza-spoa's `match` object (JSON text).
pub(crate) const MATCH_FIELD: &str = "coraza_match";

/// A `log_format` of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileFormat {
    /// `console` (coraza-spoa's) or `text`: human-readable lines.
    Text,
    /// `json`: one object per line; matched rules in coraza-spoa's shape.
    Json,
    /// `json-flat`: one object per line; matched rules' fields at the top level, like every
    /// other event.
    JsonFlat,
}

/// The values `log_format` takes, for error messages.
pub(crate) const FORMATS: &str = "console, text, json or json-flat";

impl FileFormat {
    /// Reads a `log_format` value.
    pub(crate) fn parse(s: &str) -> Option<FileFormat> {
        match s {
            "console" | "text" => Some(FileFormat::Text),
            "json" => Some(FileFormat::Json),
            "json-flat" => Some(FileFormat::JsonFlat),
            _ => None,
        }
    }

    /// tracing's format, and how matched rules are written in it.
    pub(crate) fn split(self) -> (LogFormat, RuleLines) {
        match self {
            FileFormat::Text => (LogFormat::Text, RuleLines::Fields),
            FileFormat::Json => (LogFormat::Json, RuleLines::Coraza),
            FileFormat::JsonFlat => (LogFormat::Json, RuleLines::Fields),
        }
    }
}

/// How a log writes matched rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RuleLines {
    /// As fields of the event: `key=value` in text, top-level keys in JSON.
    #[default]
    Fields,
    /// coraza-spoa's JSON: `{"level":…,"match":{…},"time":…}`.
    Coraza,
}

impl RuleLines {
    /// How a log in tracing's `format` writes matched rules: coraza-spoa's shape in JSON
    /// unless `json-flat` was asked for.
    pub(crate) fn of(format: LogFormat, flat: bool) -> RuleLines {
        match format {
            LogFormat::Json if !flat => RuleLines::Coraza,
            _ => RuleLines::Fields,
        }
    }
}

static PROCESS_RULE_LINES: OnceLock<RuleLines> = OnceLock::new();

/// How the process log writes matched rules (once [`init`] has installed it; before,
/// and in tests that install none, as fields).
pub(crate) fn process_rule_lines() -> RuleLines {
    PROCESS_RULE_LINES.get().copied().unwrap_or_default()
}

/// Installs the process log (the global subscriber) at `args`' level and format, writing
/// to `writer`, with matched rules written as `rules` says.
pub fn init(args: &LogArgs, rules: RuleLines, writer: BoxMakeWriter) {
    let rules = match args.log_format {
        LogFormat::Text => RuleLines::Fields,
        LogFormat::Json => rules,
    };
    if tracing::dispatcher::set_global_default(dispatch(args, rules, writer)).is_ok() {
        let _ = PROCESS_RULE_LINES.set(rules);
    }
}

/// A log at `args`' level and format, writing to `writer`; in JSON, matched rules are
/// written as `rules` says (in text always as fields).
pub(crate) fn dispatch(
    args: &LogArgs,
    rules: RuleLines,
    writer: BoxMakeWriter,
) -> tracing::Dispatch {
    if args.log_format == LogFormat::Text || rules == RuleLines::Fields {
        return lastcall::logging::dispatch(args, writer);
    }
    let filter = EnvFilter::try_new(&args.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false)
        .json()
        .flatten_event(true)
        .event_format(CorazaRules {
            inner: tracing_subscriber::fmt::format().json().flatten_event(true),
        })
        .finish();
    tracing::Dispatch::new(subscriber)
}

/// tracing's JSON formatter, except for matched-rule events carrying [`MATCH_FIELD`], which
/// are written in coraza-spoa's shape.
pub(crate) struct CorazaRules {
    inner: Format<Json>,
}

impl<S, N> FormatEvent<S, N> for CorazaRules
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if event.metadata().target() == RULE_TARGET {
            let mut found = MatchObject(None);
            event.record(&mut found);
            if let Some(object) = found.0 {
                let line = coraza_line(*event.metadata().level(), &object, SystemTime::now());
                return writeln!(writer, "{line}");
            }
        }
        self.inner.format_event(ctx, writer, event)
    }
}

/// The `coraza_match` field of an event.
struct MatchObject(Option<String>);

impl Visit for MatchObject {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == MATCH_FIELD {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn fmt::Debug) {}
}

/// One line in coraza-spoa's shape: zerolog's level name, the `match` object (JSON text
/// made by [`coraza_match`]), zerolog's default time format (RFC 3339, seconds).
fn coraza_line(level: Level, object: &str, now: SystemTime) -> String {
    let level = match level {
        Level::TRACE => "trace",
        Level::DEBUG => "debug",
        Level::INFO => "info",
        Level::WARN => "warn",
        Level::ERROR => "error",
    };
    format!(
        "{{\"level\":\"{level}\",\"match\":{object},\"time\":\"{}\"}}",
        lastcall::rfc3339::seconds(now)
    )
}

/// coraza-spoa's `match` object (its `errorLog` struct, field for field and in its order).
#[derive(Serialize)]
struct CorazaMatch<'a> {
    client: &'a str,
    file: &'a str,
    line: u32,
    rule_id: u32,
    revision: &'a str,
    msg: &'a str,
    data: &'a str,
    severity: &'static str,
    severity_id: i32,
    version: &'a str,
    maturity: u32,
    accuracy: u32,
    tags: &'a [String],
    server: &'a str,
    uri: &'a str,
    unique_id: &'a str,
    disruptive: bool,
    phase_id: u8,
    phase: &'static str,
    /// Ours, only when true: request bytes in libmodsecurity's line imitated its rule fields
    /// ([`RuleMatch::ambiguous`]).
    #[serde(skip_serializing_if = "is_false")]
    ambiguous: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What a matched-rule line says about its request, beside the rule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    /// The transaction id (coraza-spoa's `unique_id`).
    pub(crate) tx: &'a str,
    /// The client's address.
    pub(crate) client: &'a str,
    /// The request's URI, with its query (coraza-spoa's `uri`).
    pub(crate) uri: &'a str,
}

/// coraza-spoa's `match` object for `m`, which matched in SecLang `phase` (1-5; a
/// disruptive line's own phase wins), as JSON text.
pub(crate) fn coraza_match(m: &RuleMatch, phase: Option<u8>, req: &Request<'_>) -> String {
    let phase = m.phase.or(phase).unwrap_or(0);
    let object = CorazaMatch {
        client: req.client,
        file: &m.file,
        line: m.file_line,
        rule_id: m.id,
        revision: &m.rev,
        msg: &m.msg,
        data: &m.data,
        severity: m.severity.map_or("unknown", severity_name),
        severity_id: m.severity.map_or(-1, i32::from),
        version: &m.ver,
        maturity: m.maturity,
        accuracy: m.accuracy,
        tags: &m.tags,
        server: &m.hostname,
        uri: req.uri,
        unique_id: req.tx,
        disruptive: m.disruptive,
        phase_id: phase,
        phase: phase_name(phase),
        ambiguous: m.ambiguous,
    };
    // Serializing borrowed strings, numbers and a slice of strings cannot fail.
    serde_json::to_string(&object).unwrap_or_default()
}

/// coraza's names of the severities (`types.RuleSeverity.String`).
pub(crate) fn severity_name(s: u8) -> &'static str {
    match s {
        0 => "emergency",
        1 => "alert",
        2 => "critical",
        3 => "error",
        4 => "warning",
        5 => "notice",
        6 => "info",
        7 => "debug",
        _ => "unknown",
    }
}

/// coraza-spoa's names of the phases (`phaseToString`).
fn phase_name(phase: u8) -> &'static str {
    match phase {
        1 => "request-headers",
        2 => "request-body",
        3 => "response-headers",
        4 => "response-body",
        5 => "logging",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::sync::Arc;

    #[test]
    fn formats() {
        for (text, f) in [
            ("console", FileFormat::Text),
            ("text", FileFormat::Text),
            ("json", FileFormat::Json),
            ("json-flat", FileFormat::JsonFlat),
        ] {
            assert_eq!(FileFormat::parse(text), Some(f));
        }
        assert_eq!(FileFormat::parse("JSON"), None);
        assert_eq!(
            FileFormat::Json.split(),
            (LogFormat::Json, RuleLines::Coraza)
        );
        assert_eq!(
            FileFormat::JsonFlat.split(),
            (LogFormat::Json, RuleLines::Fields)
        );
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A matched rule is nested under `match`; every other event stays tracing's flat JSON;
    /// the level filter applies to both.
    #[test]
    fn a_rule_nested_the_rest_flat() {
        let buf = Buf::default();
        let w = buf.clone();
        let args = LogArgs {
            log_format: LogFormat::Json,
            log_level: "warn".into(),
        };
        let d = dispatch(
            &args,
            RuleLines::Coraza,
            BoxMakeWriter::new(move || w.clone()),
        );
        let object = r#"{"rule_id":942100,"tags":["a","b"]}"#;
        tracing::dispatcher::with_default(&d, || {
            tracing::warn!(target: RULE_TARGET, coraza_match = object, "rule matched");
            tracing::info!(target: RULE_TARGET, coraza_match = object, "rule matched");
            tracing::warn!(tx = "t1", "other");
        });
        let text = String::from_utf8(buf.0.lock().clone()).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_default())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        let rule = &lines[0];
        assert_eq!(rule["level"], "warn", "{text}");
        assert_eq!(rule["match"]["rule_id"], 942100, "{text}");
        assert_eq!(rule["match"]["tags"][1], "b", "{text}");
        assert_eq!(rule.as_object().map(|o| o.len()), Some(3), "{text}");
        assert!(rule["time"].as_str().is_some_and(|t| t.ends_with('Z')));
        assert_eq!(lines[1]["message"], "other", "{text}");
        assert_eq!(lines[1]["tx"], "t1", "{text}");
    }

    #[test]
    fn a_match_object() {
        let m = RuleMatch {
            id: 949110,
            msg: "Inbound Anomaly Score Exceeded (Total Score: 5)".into(),
            data: String::new(),
            severity: Some(2),
            tags: vec!["application-multi".into()],
            file: "/crs/REQUEST-949-BLOCKING-EVALUATION.conf".into(),
            file_line: 80,
            rev: String::new(),
            ver: "OWASP_CRS/3.3.4".into(),
            maturity: 0,
            accuracy: 0,
            hostname: "10.0.0.9".into(),
            uri: "/".into(),
            unique_id: "x".into(),
            phase: Some(2),
            disruptive: true,
            ambiguous: false,
            line: String::new(),
        };
        let req = Request {
            tx: "T1",
            client: "10.0.0.7",
            uri: "/?id=1",
        };
        let v: serde_json::Value =
            serde_json::from_str(&coraza_match(&m, Some(1), &req)).unwrap_or_default();
        assert_eq!(
            v,
            serde_json::json!({
                "client": "10.0.0.7", "file": "/crs/REQUEST-949-BLOCKING-EVALUATION.conf",
                "line": 80, "rule_id": 949110, "revision": "",
                "msg": "Inbound Anomaly Score Exceeded (Total Score: 5)", "data": "",
                "severity": "critical", "severity_id": 2, "version": "OWASP_CRS/3.3.4",
                "maturity": 0, "accuracy": 0, "tags": ["application-multi"],
                "server": "10.0.0.9", "uri": "/?id=1", "unique_id": "T1", "disruptive": true,
                "phase_id": 2, "phase": "request-body"
            })
        );
        let unknown = RuleMatch {
            severity: None,
            phase: None,
            ambiguous: true,
            ..m
        };
        let v: serde_json::Value =
            serde_json::from_str(&coraza_match(&unknown, None, &req)).unwrap_or_default();
        assert_eq!(
            (
                &v["severity"],
                &v["severity_id"],
                &v["phase_id"],
                &v["phase"]
            ),
            (
                &serde_json::json!("unknown"),
                &serde_json::json!(-1),
                &serde_json::json!(0),
                &serde_json::json!("unknown")
            )
        );
        assert_eq!(v["ambiguous"], true, "{v}");
    }
}
