//! The engine settings Debian does not ship, plus Debian's OWASP Core Rule Set.
//!
//! Debian's `libmodsecurity3` has no `modsecurity.conf`, and `modsecurity-crs` ships only
//! the rules and `crs-setup.conf`. Without engine settings the rule engine is off and
//! request bodies are never read. [`debian_default_directives`] writes the missing part
//! and then loads CRS the way Debian's packages do. The same text is what the nginx
//! connector gets in the differential test, so both engines run identical rules.
//!
//! Order matters (it follows Debian's `/usr/share/modsecurity-crs/owasp-crs.load`):
//! 1. Engine settings (`SecRuleEngine`, body access and limits, body processors), and the
//!    engine's own limits ([`ENGINE_LIMITS`]: what one request may cost).
//! 2. `Include /etc/modsecurity/crs/crs-setup.conf`: the `SecDefaultAction`s for phases 1
//!    and 2 (anomaly scoring, `pass`) and rule 900990. No `SecDefaultAction` is written
//!    here: a second one for the same phase is a configuration error.
//! 3. `SecAction id:900000` setting `tx.paranoia_level` (and 900110 for the anomaly
//!    thresholds, when asked): `crs-setup.conf` ships those rules commented out, and CRS
//!    rule 901120 only sets a default when the variable is still unset, so ours must come
//!    before the rules. It comes after `crs-setup.conf`, so it wins over a 900000 rule
//!    uncommented there (libmodsecurity 3.0.9 does not reject duplicate `SecAction` ids;
//!    both run, the later `setvar` stays).
//! 4. `REQUEST-900-EXCLUSION-RULES-BEFORE-CRS.conf` (if present), `rules/*.conf`,
//!    `RESPONSE-999-EXCLUSION-RULES-AFTER-CRS.conf` (if present).
//! 5. Two pass-only rules ([`SCORE_RULE_INBOUND`], [`SCORE_RULE_OUTBOUND`]) that log CRS's
//!    anomaly totals when they are above 0, so scores of allowed traffic are known.
//!
//! `owasp-crs.load` itself cannot be included: it uses `IncludeOptional`, which
//! libmodsecurity 3.0.9 does not know ("Invalid input"). The optional files are checked
//! for existence when the directives are written instead.
//!
//! Where CRS lives is a [`Location`]: Debian's packages ([`Location::debian`]), or a CRS
//! release unpacked anywhere ([`Location::from_dir`]: `crs-setup.conf` or
//! `crs-setup.conf.example` beside `rules/`). [`RECOMMENDED_ENGINE_SETTINGS`] is the
//! engine part alone, for rule sets written by hand (what Coraza users know as
//! `@coraza.conf-recommended`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Debian's CRS setup file.
pub const DEBIAN_CRS_SETUP: &str = "/etc/modsecurity/crs/crs-setup.conf";
/// Debian's exclusions included before the CRS rules (optional).
pub const DEBIAN_CRS_EXCLUSIONS_BEFORE: &str =
    "/etc/modsecurity/crs/REQUEST-900-EXCLUSION-RULES-BEFORE-CRS.conf";
/// Debian's CRS rules.
pub const DEBIAN_CRS_RULES: &str = "/usr/share/modsecurity-crs/rules/*.conf";
/// Debian's exclusions included after the CRS rules (optional).
pub const DEBIAN_CRS_EXCLUSIONS_AFTER: &str =
    "/etc/modsecurity/crs/RESPONSE-999-EXCLUSION-RULES-AFTER-CRS.conf";

/// Where a Core Rule Set is: its setup file, its rules, and the optional exclusion files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The setup file (`crs-setup.conf`).
    pub setup: PathBuf,
    /// The directory holding `REQUEST-*.conf`, `RESPONSE-*.conf` and their `.data` files.
    pub rules_dir: PathBuf,
    /// Exclusions included before the rules, if the file exists.
    pub exclusions_before: Option<PathBuf>,
    /// Exclusions included after the rules, if the file exists.
    pub exclusions_after: Option<PathBuf>,
}

impl Location {
    /// Debian's `modsecurity-crs`: the setup and exclusions in `/etc/modsecurity/crs`, the
    /// rules in `/usr/share/modsecurity-crs/rules`.
    pub fn debian() -> Location {
        Location {
            setup: DEBIAN_CRS_SETUP.into(),
            rules_dir: "/usr/share/modsecurity-crs/rules".into(),
            exclusions_before: Some(DEBIAN_CRS_EXCLUSIONS_BEFORE.into()),
            exclusions_after: Some(DEBIAN_CRS_EXCLUSIONS_AFTER.into()),
        }
    }

    /// A CRS release unpacked in `dir` (or a directory laid out like one): `rules/` with
    /// the rule files, and `crs-setup.conf` (or, when that is missing, the release's
    /// `crs-setup.conf.example`). The exclusion files are taken from `rules/` without their
    /// `.example` suffix, when present. The error says what is missing.
    pub fn from_dir(dir: &Path) -> Result<Location, String> {
        let rules_dir = dir.join("rules");
        let has_rules = std::fs::read_dir(&rules_dir)
            .map(|entries| {
                entries.flatten().any(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    name.starts_with("REQUEST-") && name.ends_with(".conf")
                })
            })
            .unwrap_or(false);
        if !has_rules {
            return Err(format!(
                "{} has no REQUEST-*.conf rule files (a CRS release has them in rules/)",
                rules_dir.display()
            ));
        }
        let setup = ["crs-setup.conf", "crs-setup.conf.example"]
            .iter()
            .map(|name| dir.join(name))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                format!(
                    "{} has no crs-setup.conf or crs-setup.conf.example",
                    dir.display()
                )
            })?;
        let optional = |name: &str| Some(rules_dir.join(name)).filter(|p| p.is_file());
        Ok(Location {
            setup,
            exclusions_before: optional("REQUEST-900-EXCLUSION-RULES-BEFORE-CRS.conf"),
            exclusions_after: optional("RESPONSE-999-EXCLUSION-RULES-AFTER-CRS.conf"),
            rules_dir,
        })
    }

    /// The release of the CRS here, as its rules sign themselves
    /// (`SecComponentSignature "OWASP_CRS/3.3.4"` in `REQUEST-901-INITIALIZATION.conf`):
    /// `Some("3.3.4")`; `None` when that file or line is missing.
    pub fn version(&self) -> Option<String> {
        let text =
            std::fs::read_to_string(self.rules_dir.join("REQUEST-901-INITIALIZATION.conf")).ok()?;
        text.lines().find_map(|l| {
            let rest = l.trim().strip_prefix("SecComponentSignature")?;
            let v = rest.trim().trim_matches('"').strip_prefix("OWASP_CRS/")?;
            Some(v.to_owned())
        })
    }

    /// The major release of the CRS here (3 or 4), from [`version`](Self::version).
    pub fn major(&self) -> Option<u32> {
        self.version()?.split('.').next()?.parse().ok()
    }

    /// The rules as one `Include` glob.
    pub fn rules_glob(&self) -> String {
        format!("{}/*.conf", self.rules_dir.display())
    }

    /// [`CrsOptions`] with this location (and the other options at their defaults).
    pub fn options(&self) -> CrsOptions {
        let path = |p: &Path| p.display().to_string();
        CrsOptions {
            crs_setup: path(&self.setup),
            crs_exclusions_before: self.exclusions_before.as_deref().map(path),
            crs_rules: self.rules_glob(),
            crs_exclusions_after: self.exclusions_after.as_deref().map(path),
            ..CrsOptions::default()
        }
    }
}

/// The engine settings recommended for rule sets written by hand: what Coraza ships as
/// `@coraza.conf-recommended`, for libmodsecurity, in this project's words. Like Coraza's
/// file it starts the engine in `DetectionOnly` (a rule set turns it `On` after the
/// `Include`, as coraza-spoa's example does) and has every rule of Coraza's, with the same
/// targets, operators and actions (200000-200003 and 200006), and the same body limits and
/// response settings. It adds what Coraza's file lists as unsupported by Coraza and
/// libmodsecurity runs (`SecCookieFormat`, `SecArgumentSeparator`, rule 200004, the
/// internal-error rule 200005 on libmodsecurity's `MSC_` flags instead of Coraza's `COR_`),
/// the request-body limit without files and the JSON depth limit. Left out: the audit log
/// (each matched rule is a log line of the agent's; set `SecAuditEngine` and `SecAuditLog`
/// to have one) and `SecRequestBodyInMemoryLimit` (libmodsecurity 3 keeps bodies in
/// memory). `crates/modsec/tests/modsec/recommended.rs` holds the two lists side by side.
pub const RECOMMENDED_ENGINE_SETTINGS: &str = r#"# Engine settings recommended by lastcall for rules written by hand (Coraza users know
# them as @coraza.conf-recommended). Turn the engine On after this file when you are done
# watching what it would block.
SecRuleEngine DetectionOnly
# Read request bodies: without them, POST parameters go unseen.
SecRequestBodyAccess On
# XML and JSON bodies get their parsers (by content type); everything else is read as
# forms or multipart.
SecRule REQUEST_HEADERS:Content-Type "^(?:application(?:/soap\+|/)|text/)xml" "id:200000,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=XML"
SecRule REQUEST_HEADERS:Content-Type "^application/json" "id:200001,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=JSON"
# JSON subtypes (application/vnd.api+json, application/problem+json, ...) are JSON too.
SecRule REQUEST_HEADERS:Content-Type "^application/[a-z0-9.-]+[+]json" "id:200006,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=JSON"
# The largest body accepted (files included), and what happens above it.
SecRequestBodyLimit 13107200
SecRequestBodyNoFilesLimit 13107200
SecRequestBodyLimitAction Reject
SecRequestBodyJsonDepthLimit 512
# A body that does not parse is refused (400): what cannot be read cannot be inspected.
SecRule REQBODY_ERROR "!@eq 0" "id:200002,phase:2,t:none,log,deny,status:400,msg:'Failed to parse request body.',logdata:'%{reqbody_error_msg}',severity:2"
SecRule MULTIPART_STRICT_ERROR "!@eq 0" "id:200003,phase:2,t:none,log,deny,status:400,msg:'Multipart request body failed strict validation.'"
SecRule MULTIPART_UNMATCHED_BOUNDARY "@eq 1" "id:200004,phase:2,t:none,log,deny,msg:'Multipart parser detected a possible unmatched boundary.'"
# libmodsecurity flags its own internal errors (such as regex limits hit) in TX:MSC_*.
SecRule TX:/^MSC_/ "!@streq 0" "id:200005,phase:2,t:none,deny,msg:'ModSecurity internal error flagged: %{MATCHED_VAR_NAME}'"
# Read response bodies of text types, up to 512 KiB; above that, inspect what was read.
SecResponseBodyAccess On
SecResponseBodyMimeType text/plain text/html text/xml
SecResponseBodyLimit 524288
SecResponseBodyLimitAction ProcessPartial
# Persistent data and parsing details as everyone expects them.
SecDataDir /tmp/
SecArgumentSeparator &
SecCookieFormat 0
# No audit log: the agent logs one line per matched rule.
SecAuditEngine Off
"#;

/// The CRS used by coraza-spoa 0.7.2 for `@owasp_crs/` and `@crs-setup.conf.example`: the
/// `github.com/corazawaf/coraza-coreruleset/v4 v4.25.0` module of its `go.mod`, which embeds
/// CRS 4.25.0.
pub const CORAZA_SPOA_CRS: &str = "4.25.0";

/// Transaction variables that only CRS 4 reads (from CRS 4's `crs-setup.conf.example`), each
/// with what CRS 3 reads instead, if anything: set against a CRS 3 tree they change nothing.
pub const CRS4_ONLY_VARIABLES: &[(&str, Option<&str>)] = &[
    ("blocking_paranoia_level", Some("tx.paranoia_level")),
    (
        "detection_paranoia_level",
        Some("tx.executing_paranoia_level"),
    ),
    ("early_blocking", None),
    ("enable_default_collections", None),
    ("reporting_level", None),
    ("allow_method_override_parameter", None),
    ("restricted_headers_basic", Some("tx.restricted_headers")),
    ("restricted_headers_extended", Some("tx.restricted_headers")),
    ("crs_skip_response_analysis", None),
];

/// The CRS-4-only variables `text` sets (`setvar:tx.NAME=...`, quoted or not, any case), in
/// the order of [`CRS4_ONLY_VARIABLES`], each once.
pub fn crs4_only_variables(text: &str) -> Vec<(&'static str, Option<&'static str>)> {
    let set = tx_variables_set(text);
    CRS4_ONLY_VARIABLES
        .iter()
        .filter(|(name, _)| set.iter().any(|s| s == name))
        .copied()
        .collect()
}

/// The transaction variables `text` sets (`setvar:tx.NAME=...`, quoted or not), lower-cased,
/// in order (repeats kept).
pub fn tx_variables_set(text: &str) -> Vec<String> {
    let lower = text.to_ascii_lowercase();
    lower
        .match_indices("setvar:")
        .filter_map(|(at, _)| {
            let rest = lower[at + 7..].trim_start_matches(['\'', '"', ' ']);
            let name = rest.strip_prefix("tx.")?;
            let end = name
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(name.len());
            Some(name[..end].to_owned())
        })
        .collect()
}

/// What to do with a body above its limit (`SecRequestBodyLimitAction`,
/// `SecResponseBodyLimitAction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLimitAction {
    /// Deny (the request gets 403 from libmodsecurity when the engine is `On`).
    Reject,
    /// Inspect the first `limit` bytes only; the rest passes uninspected.
    ProcessPartial,
}

impl BodyLimitAction {
    fn directive_value(self) -> &'static str {
        match self {
            BodyLimitAction::Reject => "Reject",
            BodyLimitAction::ProcessPartial => "ProcessPartial",
        }
    }
}

/// Options for [`debian_default_directives`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrsOptions {
    /// CRS paranoia level, 1..=4 (values outside are clamped).
    pub paranoia_level: u8,
    /// `SecRuleEngine DetectionOnly` instead of `On`: matches are logged and reported, no
    /// intervention is ever returned.
    pub detect_only: bool,
    /// `SecRequestBodyLimit` in bytes.
    pub request_body_limit: usize,
    /// `SecRequestBodyNoFilesLimit` in bytes (body without multipart file parts).
    pub request_body_no_files_limit: usize,
    /// `SecRequestBodyLimitAction`.
    pub request_body_limit_action: BodyLimitAction,
    /// `SecResponseBodyAccess On` (response body rules, CRS 95x) when true.
    pub response_check: bool,
    /// `SecResponseBodyLimit` in bytes.
    pub response_body_limit: usize,
    /// `SecResponseBodyLimitAction`.
    pub response_body_limit_action: BodyLimitAction,
    /// `tx.inbound_anomaly_score_threshold` (CRS default 5 when `None`).
    pub inbound_anomaly_threshold: Option<u32>,
    /// `tx.outbound_anomaly_score_threshold` (CRS default 4 when `None`).
    pub outbound_anomaly_threshold: Option<u32>,
    /// `crs-setup.conf` to include ([`DEBIAN_CRS_SETUP`]).
    pub crs_setup: String,
    /// Exclusions before the rules, included only if the file exists
    /// ([`DEBIAN_CRS_EXCLUSIONS_BEFORE`]).
    pub crs_exclusions_before: Option<String>,
    /// The rules (a glob is fine; [`DEBIAN_CRS_RULES`]).
    pub crs_rules: String,
    /// Exclusions after the rules, included only if the file exists
    /// ([`DEBIAN_CRS_EXCLUSIONS_AFTER`]).
    pub crs_exclusions_after: Option<String>,
}

impl Default for CrsOptions {
    fn default() -> Self {
        CrsOptions {
            paranoia_level: 1,
            detect_only: false,
            request_body_limit: 13_107_200,
            request_body_no_files_limit: 131_072,
            request_body_limit_action: BodyLimitAction::Reject,
            response_check: false,
            response_body_limit: 524_288,
            response_body_limit_action: BodyLimitAction::ProcessPartial,
            inbound_anomaly_threshold: None,
            outbound_anomaly_threshold: None,
            crs_setup: DEBIAN_CRS_SETUP.to_owned(),
            crs_exclusions_before: Some(DEBIAN_CRS_EXCLUSIONS_BEFORE.to_owned()),
            crs_rules: DEBIAN_CRS_RULES.to_owned(),
            crs_exclusions_after: Some(DEBIAN_CRS_EXCLUSIONS_AFTER.to_owned()),
        }
    }
}

/// The directives of the default application: engine settings, then CRS at the chosen
/// paranoia level (see the module docs for the order).
pub fn debian_default_directives(opts: &CrsOptions) -> String {
    let mut s = String::with_capacity(2048);
    s.push_str("# Written by lastcall-modsec: engine settings Debian does not ship, then CRS.\n");
    engine_settings(&mut s, opts);
    body_processor_rules(&mut s);
    s.push_str(ENGINE_LIMITS);
    crs(&mut s, opts);
    s
}

/// The engine's own limits, so that one request's evaluation ends in bounded time (measured
/// in docs/spoa.md, *Limits*, with `cargo run --release -p lastcall-modsec --example cost`):
///
/// - `SecPcreMatchLimit 50000`: CRS 3.3's rules 941140 and 941160 (XSS, on every argument,
///   cookie, `User-Agent` and `Referer`) backtrack from each `=` and each quote to the end of
///   the value, so their cost grows with the square of its length (`1' OR 1=1-- ` repeated:
///   16 KB 0.14 s, 64 KB 1.9 s, 128 KB 6.4 s). The limit ends such a match early, and a match
///   that hits it ends the whole search: a 1 MiB query then costs 0.6 s (libmodsecurity
///   3.0.14). No benign value of up to 16 KB (HAProxy's default buffer) we measured reaches
///   it. libmodsecurity 3.0.9 reads the directive and ignores it (its PCRE keeps its own
///   limit of ten million per start position); 3.0.10 and later honour it.
/// - `SecArgumentsLimit 1000` and rule 200007 (upstream's recommended pair): the rules' cost
///   grows with the square of the number of arguments (5,000: 0.8 s, 20,000: 7.3 s); a
///   request with 1000 or more is refused with 400 (PHP's `max_input_vars` is 1000 too).
/// - Rules 9990130 and 9990131: a request line or a request header value longer than
///   64 KiB is refused in phase 1, before any rule reads it (nginx and Apache refuse more
///   than 8 KiB, HAProxy's default buffer holds 16 KiB; the limits are for agents reached
///   directly, or behind a raised `tune.bufsize`, where libmodsecurity 3.0.9 would spend
///   minutes on a 1 MiB value). Bodies are bounded by `SecRequestBodyNoFilesLimit`.
/// - Rule 9990132: more than 1024 request headers are refused in phase 1 (rule 920450's
///   cost grows with the square of their number: 20,000 took 4.5 s; HAProxy sends at most
///   `tune.http.maxhdr`, 101 by default; Apache refuses more than 100).
pub const ENGINE_LIMITS: &str = "\
SecPcreMatchLimit 50000
SecArgumentsLimit 1000
SecRule &ARGS \"@ge 1000\" \"id:200007,phase:2,t:none,log,deny,status:400,msg:'Failed to fully parse request body due to large argument count',severity:2\"
SecRule REQUEST_LINE \"@gt 65536\" \"id:9990130,phase:1,t:none,t:length,log,deny,status:414,msg:'Request line longer than 65536 bytes'\"
SecRule REQUEST_HEADERS \"@gt 65536\" \"id:9990131,phase:1,t:none,t:length,log,deny,status:400,msg:'Request header longer than 65536 bytes: %{MATCHED_VAR_NAME}'\"
SecRule &REQUEST_HEADERS \"@gt 1024\" \"id:9990132,phase:1,t:none,log,deny,status:400,msg:'More than 1024 request headers'\"
";

fn engine_settings(s: &mut String, o: &CrsOptions) {
    let engine = if o.detect_only { "DetectionOnly" } else { "On" };
    let resp = if o.response_check { "On" } else { "Off" };
    // `write!` into a String cannot fail.
    let _ = write!(
        s,
        "SecRuleEngine {engine}\n\
         SecRequestBodyAccess On\n\
         SecRequestBodyLimit {}\n\
         SecRequestBodyNoFilesLimit {}\n\
         SecRequestBodyLimitAction {}\n\
         SecRequestBodyJsonDepthLimit 512\n\
         SecResponseBodyAccess {resp}\n\
         SecResponseBodyMimeType text/plain text/html text/xml application/json\n\
         SecResponseBodyLimit {}\n\
         SecResponseBodyLimitAction {}\n\
         SecArgumentSeparator &\n\
         SecCookieFormat 0\n\
         SecAuditEngine Off\n",
        o.request_body_limit,
        o.request_body_no_files_limit,
        o.request_body_limit_action.directive_value(),
        o.response_body_limit,
        o.response_body_limit_action.directive_value(),
    );
}

/// Selects the XML and JSON body processors by content type (JSON subtypes such as
/// `application/vnd.api+json` included, rule 200006) and turns body parsing errors into a
/// 400, as upstream ModSecurity's and Coraza's recommended configurations do (ids
/// 200000-200004, 200006).
fn body_processor_rules(s: &mut String) {
    s.push_str(concat!(
        "SecRule REQUEST_HEADERS:Content-Type \"^(?:application(?:/soap\\+|/)|text/)xml\" ",
        "\"id:200000,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=XML\"\n",
        "SecRule REQUEST_HEADERS:Content-Type \"^application/json\" ",
        "\"id:200001,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=JSON\"\n",
        "SecRule REQUEST_HEADERS:Content-Type \"^application/[a-z0-9.-]+[+]json\" ",
        "\"id:200006,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=JSON\"\n",
        "SecRule REQBODY_ERROR \"!@eq 0\" ",
        "\"id:200002,phase:2,t:none,log,deny,status:400,",
        "msg:'Failed to parse request body.',logdata:'%{reqbody_error_msg}',severity:2\"\n",
        "SecRule MULTIPART_STRICT_ERROR \"!@eq 0\" ",
        "\"id:200003,phase:2,t:none,log,deny,status:400,",
        "msg:'Multipart request body failed strict validation.',severity:2\"\n",
        "SecRule MULTIPART_UNMATCHED_BOUNDARY \"@eq 1\" ",
        "\"id:200004,phase:2,t:none,log,deny,",
        "msg:'Multipart parser detected a possible unmatched boundary.'\"\n",
    ));
}

fn crs(s: &mut String, o: &CrsOptions) {
    let _ = writeln!(s, "Include {}", o.crs_setup);
    let pl = o.paranoia_level.clamp(1, 4);
    // CRS 3.x reads `tx.paranoia_level`, CRS 4 `tx.blocking_paranoia_level`.
    let _ = writeln!(
        s,
        "SecAction \"id:900000,phase:1,pass,t:none,nolog,setvar:tx.paranoia_level={pl},\
         setvar:tx.blocking_paranoia_level={pl}\""
    );
    let mut thresholds = Vec::new();
    if let Some(v) = o.inbound_anomaly_threshold {
        thresholds.push(format!("setvar:tx.inbound_anomaly_score_threshold={v}"));
    }
    if let Some(v) = o.outbound_anomaly_threshold {
        thresholds.push(format!("setvar:tx.outbound_anomaly_score_threshold={v}"));
    }
    if !thresholds.is_empty() {
        let _ = writeln!(
            s,
            "SecAction \"id:900110,phase:1,pass,t:none,nolog,{}\"",
            thresholds.join(",")
        );
    }
    include_if_present(s, o.crs_exclusions_before.as_deref());
    let _ = writeln!(s, "Include {}", o.crs_rules);
    include_if_present(s, o.crs_exclusions_after.as_deref());
    score_rules(s);
}

/// Id of the rule that logs CRS's inbound anomaly score at the end of phase 2.
pub const SCORE_RULE_INBOUND: u32 = 9_990_110;
/// Id of the rule that logs CRS's outbound anomaly score at the end of phase 4.
pub const SCORE_RULE_OUTBOUND: u32 = 9_990_120;
/// How the score rules' messages start; [`crate::MatchReport`] reads the number after it
/// and keeps these rules out of its rule ids and matches.
pub const SCORE_MESSAGE_PREFIX: &str = "lastcall anomaly score: ";

/// The C API cannot read TX variables, and CRS logs its total only when a threshold is
/// reached. These two pass-only rules, after all of CRS, log the totals of requests and
/// responses that scored but passed, so the reported `anomaly_score` is CRS's own number
/// (not an estimate) for allowed traffic too.
fn score_rules(s: &mut String) {
    s.push_str(&score_rules_text());
}

/// The two score rules alone, to append after any rule set that may include CRS: CRS 3.x
/// keeps its totals in `TX:ANOMALY_SCORE` and `TX:OUTBOUND_ANOMALY_SCORE`, CRS 4 in
/// `TX:BLOCKING_INBOUND_ANOMALY_SCORE` and `TX:BLOCKING_OUTBOUND_ANOMALY_SCORE` (the scores
/// that count towards blocking); whichever is set is logged. Without CRS neither is set and
/// the rules never match. (Not `noauditlog`: with it libmodsecurity 3.0.9 does not call the
/// log callback either, and the score is lost.)
pub fn score_rules_text() -> String {
    format!(
        "SecRule TX:ANOMALY_SCORE|TX:BLOCKING_INBOUND_ANOMALY_SCORE \"@gt 0\" \"id:{SCORE_RULE_INBOUND},phase:2,pass,t:none,log,\
         msg:'{SCORE_MESSAGE_PREFIX}inbound %{{MATCHED_VAR}}'\"\n\
         SecRule TX:OUTBOUND_ANOMALY_SCORE|TX:BLOCKING_OUTBOUND_ANOMALY_SCORE \"@gt 0\" \"id:{SCORE_RULE_OUTBOUND},phase:4,pass,t:none,log,\
         msg:'{SCORE_MESSAGE_PREFIX}outbound %{{MATCHED_VAR}}'\"\n"
    )
}

fn include_if_present(s: &mut String, path: Option<&str>) {
    if let Some(p) = path {
        if std::path::Path::new(p).is_file() {
            let _ = writeln!(s, "Include {p}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crs_releases_and_their_variables() {
        // Debian's tree signs itself 3.x (the stand-in for every CRS 3 here).
        let debian = Location::debian();
        assert_eq!(debian.major(), Some(3), "{:?}", debian.version());
        let dir = std::env::temp_dir().join(format!("crs4-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("rules")).unwrap();
        std::fs::write(
            dir.join("rules/REQUEST-901-INITIALIZATION.conf"),
            "# x\nSecComponentSignature \"OWASP_CRS/4.28.0\"\n",
        )
        .unwrap();
        std::fs::write(dir.join("crs-setup.conf.example"), "").unwrap();
        let four = Location::from_dir(&dir).unwrap();
        assert_eq!(
            (four.version().as_deref(), four.major()),
            (Some("4.28.0"), Some(4))
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let text = "SecAction \"id:900000,phase:1,pass,setvar:tx.blocking_paranoia_level=4\"\n\
                    SecAction \"id:900001,phase:1,pass,setvar:'TX.early_blocking=1',setvar:tx.paranoia_level=2\"";
        assert_eq!(
            crs4_only_variables(text),
            [
                ("blocking_paranoia_level", Some("tx.paranoia_level")),
                ("early_blocking", None)
            ]
        );
        assert!(crs4_only_variables("setvar:tx.paranoia_level=2").is_empty());
    }

    #[test]
    fn order_and_values() {
        let d = debian_default_directives(&CrsOptions {
            paranoia_level: 9,
            detect_only: true,
            inbound_anomaly_threshold: Some(10),
            ..CrsOptions::default()
        });
        assert!(d.contains("SecRuleEngine DetectionOnly\n"));
        assert!(d.contains("setvar:tx.paranoia_level=4,"));
        assert!(d.contains("setvar:tx.blocking_paranoia_level=4\""));
        assert!(d.contains("setvar:tx.inbound_anomaly_score_threshold=10\""));
        let pos = |needle: &str| d.find(needle).unwrap_or(usize::MAX);
        assert!(pos("SecRuleEngine") < pos("Include /etc/modsecurity/crs/crs-setup.conf"));
        assert!(pos("SecPcreMatchLimit 50000") < pos("crs-setup.conf"));
        assert!(pos("id:200007") < pos("crs-setup.conf"));
        assert!(pos("crs-setup.conf") < pos("id:900000"));
        assert!(pos("id:900000") < pos("Include /usr/share/modsecurity-crs/rules/*.conf"));
        assert!(!d.contains("IncludeOptional"));
        assert!(pos("Include /usr/share/modsecurity-crs/rules/*.conf") < pos("id:9990110"));
        assert!(pos("id:9990110") < pos("id:9990120"));
        assert!(!d.contains("SecDefaultAction"));
    }
}
