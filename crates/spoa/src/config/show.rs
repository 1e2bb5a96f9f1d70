//! The effective configuration, printed: `lastcall-spoa show-config` (YAML that `--config`
//! reads back into the same rules) and `show-rules [APP]` (the SecLang text one application
//! compiles). The chart's and the benchmark's rules come from here, never from a copy.

use std::fmt::Write as _;

use lastcall::{Problem, Problems};

use super::seclang::RuleText;
use super::{Application, Config, Evaluation};

/// The configuration as YAML: every key with its effective value, and each application's
/// `directives` the text it compiles (the built-in application's written out).
pub(super) fn config(cfg: &Config) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# lastcall-spoa {}: the effective configuration (`lastcall-spoa show-config`).",
        env!("CARGO_PKG_VERSION")
    );
    let _ = writeln!(s, "bind: {}", quote(&cfg.bind.to_string()));
    if let Some(d) = &cfg.default_application {
        let _ = writeln!(s, "default_application: {}", quote(d));
    }
    let _ = writeln!(s, "max_frame_size: {}", cfg.max_frame_size);
    let _ = writeln!(s, "workers: {}", cfg.workers);
    let _ = writeln!(
        s,
        "max_inflight_per_connection: {}",
        cfg.max_inflight_per_connection
    );
    if cfg.evaluation == Evaluation::Inline {
        let _ = writeln!(s, "evaluation: inline");
    }
    for (key, d) in [
        ("evaluation_timeout", cfg.evaluation_timeout),
        ("hello_timeout", cfg.hello_timeout),
        ("idle_timeout", cfg.idle_timeout),
    ] {
        let _ = writeln!(s, "{key}: {}", lastcall::duration::format(d));
    }
    let _ = writeln!(s, "max_buffered_bytes: {}", cfg.max_buffered_bytes);
    let _ = writeln!(s, "applications:");
    for a in &cfg.applications {
        application(&mut s, cfg, a);
    }
    s
}

fn application(s: &mut String, cfg: &Config, a: &Application) {
    let _ = writeln!(s, "  - name: {}", quote(&a.name));
    let text = RuleText::for_application(a, &cfg.crs).map_or_else(|_| String::new(), |t| t.text);
    if text.starts_with([' ', '\t']) {
        let _ = writeln!(s, "    directives: |2");
    } else {
        let _ = writeln!(s, "    directives: |");
    }
    for line in text.lines() {
        if line.is_empty() {
            s.push('\n');
        } else {
            let _ = writeln!(s, "      {line}");
        }
    }
    let _ = writeln!(s, "    response_check: {}", a.response_check);
    let _ = writeln!(s, "    transaction_ttl_ms: {}", a.transaction_ttl_ms);
    let _ = writeln!(
        s,
        "    transaction_active_limit: {}",
        a.transaction_active_limit
    );
    if a.detect_only {
        let _ = writeln!(s, "    detect_only: true");
    }
    let _ = writeln!(s, "    body_limit_action: {}", a.body_limit_action.as_str());
}

/// The SecLang text application `app` compiles (default: the default application, else
/// the first), after a comment naming the configured CRS's release and tree (what the
/// built-in application, `@owasp_crs/` and `@crs-setup.conf.example` name).
pub(super) fn rules(cfg: &Config, app: Option<&str>) -> Result<String, Problems> {
    let wanted = app.or(cfg.default_application.as_deref());
    let found = match wanted {
        Some(name) => cfg.applications.iter().find(|a| a.name == name),
        None => cfg.applications.first(),
    };
    let Some(a) = found else {
        let names: Vec<&str> = cfg.applications.iter().map(|a| a.name.as_str()).collect();
        return Err(Problems::from(
            Problem::new("show-rules", "no such application")
                .value(wanted.unwrap_or_default())
                .expected(format!("one of {}", names.join(", "))),
        ));
    };
    RuleText::for_application(a, &cfg.crs)
        .map(|t| crs_comment(cfg) + &t.text)
        .map_err(|errs| {
            errs.into_iter()
                .map(|p| Problem::new("", p.message).at(cfg.source(p.line)))
                .collect()
        })
}

/// `# CRS: OWASP_CRS/4.28.0 in /usr/share/lastcall-spoa/crs` (the release as the tree's
/// `SecComponentSignature` names it).
fn crs_comment(cfg: &Config) -> String {
    let crs = &cfg.crs;
    let tree = crs.rules_dir.parent().unwrap_or(&crs.rules_dir).display();
    match crs.version() {
        Some(v) => format!("# CRS: OWASP_CRS/{v} in {tree}\n"),
        None => format!(
            "# CRS: {tree} (no SecComponentSignature in its REQUEST-901-INITIALIZATION.conf)\n"
        ),
    }
}

/// A YAML double-quoted scalar (JSON's escapes are YAML's).
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::apps::Apps;

    /// What `show-config` prints loads back into the same rules, application by
    /// application (the built-in one included), and compiles.
    #[test]
    fn printed_configuration_reads_back_into_the_same_rules() {
        let builtin = Config::builtin();
        let printed = config(&builtin);
        let back = Config::parse(&printed).unwrap();
        assert_eq!(back.applications.len(), 1);
        let text =
            |cfg: &Config, a: &Application| RuleText::for_application(a, &cfg.crs).unwrap().text;
        assert_eq!(
            text(&back, &back.applications[0]),
            text(&builtin, &builtin.applications[0])
        );
        assert_eq!(back.bind, builtin.bind);
        assert_eq!(back.max_frame_size, builtin.max_frame_size);
        assert_eq!(back.evaluation_timeout, builtin.evaluation_timeout);
        Apps::compile(&back).unwrap();
        // show-rules is the same text, after the comment naming the CRS.
        let shown = rules(&builtin, None).unwrap();
        let (first, rest) = shown.split_once('\n').unwrap();
        assert_eq!(rest, text(&builtin, &builtin.applications[0]));
        let tree = builtin
            .crs
            .rules_dir
            .parent()
            .unwrap()
            .display()
            .to_string();
        assert!(
            first.starts_with("# CRS: ") && first.ends_with(&tree),
            "{first}"
        );
        if let Some(v) = builtin.crs.version() {
            assert_eq!(first, format!("# CRS: OWASP_CRS/{v} in {tree}"));
        }
        assert!(rules(&builtin, Some("nope")).is_err());
    }
}
