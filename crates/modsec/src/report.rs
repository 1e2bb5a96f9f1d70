//! What a transaction matched, parsed from libmodsecurity's text log lines.
//!
//! The C API cannot read TX variables, so everything here comes from text: the lines the
//! server log callback delivers (non-disruptive matches, and every match in
//! `DetectionOnly`) and the log of a disruptive intervention (the blocking rule, e.g.
//! CRS 949110 "Inbound Anomaly Score Exceeded (Total Score: 5)").

/// One logged rule match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleMatch {
    /// `[id "…"]`; 0 when the line carried none (rules without an id cannot exist in
    /// libmodsecurity 3, but the text is parsed defensively).
    pub id: u32,
    /// `[msg "…"]` (may be empty).
    pub msg: String,
    /// `[data "…"]` (may be empty).
    pub data: String,
    /// `[severity "…"]`: 0 EMERGENCY … 7 DEBUG; `None` when absent.
    pub severity: Option<u8>,
    /// `[tag "…"]`, in order.
    pub tags: Vec<String>,
    /// `[file "…"]`: the rule's file (empty for rules given as text).
    pub file: String,
    /// `[line "…"]`: the rule's line in its file; 0 when absent.
    pub file_line: u32,
    /// `[rev "…"]` (may be empty).
    pub rev: String,
    /// `[ver "…"]` (e.g. `OWASP_CRS/3.3.4`; may be empty).
    pub ver: String,
    /// `[maturity "…"]`; 0 when absent.
    pub maturity: u32,
    /// `[accuracy "…"]`; 0 when absent.
    pub accuracy: u32,
    /// `[hostname "…"]`: the server address libmodsecurity was given.
    pub hostname: String,
    /// `[uri "…"]`: the path, without the query, as libmodsecurity decoded it.
    pub uri: String,
    /// `[unique_id "…"]`: the transaction id.
    pub unique_id: String,
    /// The SecLang phase (1-5) of a disruptive line (`Access denied with code 403 (phase
    /// 2).`); `None` for the other lines, which do not say it (the caller knows which phase
    /// it was running).
    pub phase: Option<u8>,
    /// True when this line came from a disruptive intervention ("Access denied …").
    pub disruptive: bool,
    /// The whole line as libmodsecurity wrote it.
    pub line: String,
}

/// Everything a transaction has matched so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MatchReport {
    rule_ids: Vec<u32>,
    matches: Vec<RuleMatch>,
    inbound_score: Option<u32>,
    outbound_score: Option<u32>,
    request_body_truncated: bool,
    response_body_truncated: bool,
}

impl MatchReport {
    /// The ids of the rules that logged a match, in order of first match, without
    /// duplicates.
    pub fn rule_ids(&self) -> &[u32] {
        &self.rule_ids
    }

    /// Every logged match, in order (a rule may appear more than once).
    pub fn matches(&self) -> &[RuleMatch] {
        &self.matches
    }

    /// The inbound anomaly score that CRS reported in a message: 949110 "Inbound Anomaly
    /// Score Exceeded (Total Score: N)" when blocking, the score rule of
    /// [`crate::crs::debian_default_directives`] when the request scored but passed, or
    /// the 980 correlation rules in the logging phase. `None` when nothing was logged
    /// (no score, or rules without our score rule and below the threshold); see
    /// [`MatchReport::estimated_inbound_score`].
    pub fn inbound_anomaly_score(&self) -> Option<u32> {
        self.inbound_score
    }

    /// The outbound anomaly score CRS reported (959100, 980 rules), if any.
    pub fn outbound_anomaly_score(&self) -> Option<u32> {
        self.outbound_score
    }

    /// The reported inbound score, or else the sum of CRS's severity points (CRITICAL 5,
    /// ERROR 4, WARNING 3, NOTICE 2) over the matched request rules (ids 910000-948999),
    /// which is how CRS 3.x accumulates `tx.anomaly_score` in anomaly-scoring mode.
    ///
    /// The sum is a lower bound: libmodsecurity 3.0.9 runs a rule's `setvar` once per
    /// matching variable but logs the rule once (e.g. a path traversal in the URI and in an
    /// argument counts twice in CRS's total). With the default thresholds the bound is
    /// only used when no score was reported (rule sets without the score rules of
    /// [`crate::crs::debian_default_directives`]).
    pub fn estimated_inbound_score(&self) -> u32 {
        self.inbound_score
            .unwrap_or_else(|| self.severity_inbound_score())
    }

    /// The severity-point sum over matched request rules (ids 910000-948999), ignoring any
    /// reported score.
    pub fn severity_inbound_score(&self) -> u32 {
        self.severity_sum(|id| (910_000..949_000).contains(&id))
    }

    /// The reported outbound score, or else the severity sum over response rules
    /// (ids 950000-958999).
    pub fn estimated_outbound_score(&self) -> u32 {
        self.outbound_score
            .unwrap_or_else(|| self.severity_sum(|id| (950_000..959_000).contains(&id)))
    }

    /// The interesting text messages (`msg` of each match), in order.
    pub fn messages(&self) -> impl Iterator<Item = &str> {
        self.matches.iter().map(|m| m.msg.as_str())
    }

    /// True when a request body chunk went beyond `SecRequestBodyLimit` under
    /// `SecRequestBodyLimitAction ProcessPartial` (only the first part was inspected).
    pub fn request_body_truncated(&self) -> bool {
        self.request_body_truncated
    }

    /// Like [`MatchReport::request_body_truncated`], for `SecResponseBodyLimit`.
    pub fn response_body_truncated(&self) -> bool {
        self.response_body_truncated
    }

    /// True when nothing was logged.
    pub fn is_empty(&self) -> bool {
        self.matches.is_empty()
    }

    pub(crate) fn set_request_body_truncated(&mut self) {
        self.request_body_truncated = true;
    }

    pub(crate) fn set_response_body_truncated(&mut self) {
        self.response_body_truncated = true;
    }

    /// Records one log line (from the callback or an intervention).
    pub(crate) fn record_line(&mut self, line: &str, disruptive: bool) {
        let m = parse_line(line, disruptive);
        if let Some(rest) = m.msg.strip_prefix(crate::crs::SCORE_MESSAGE_PREFIX) {
            // Our own score rules (crs.rs): a number, not a match.
            if let Some(n) = rest
                .strip_prefix("inbound ")
                .and_then(|n| n.trim().parse().ok())
            {
                self.inbound_score = Some(n);
            } else if let Some(n) = rest
                .strip_prefix("outbound ")
                .and_then(|n| n.trim().parse().ok())
            {
                self.outbound_score = Some(n);
            }
            return;
        }
        if let Some(score) = inbound_score_of(&m.msg) {
            self.inbound_score = Some(score);
        }
        if let Some(score) = outbound_score_of(&m.msg) {
            self.outbound_score = Some(score);
        }
        if m.id != 0 && !self.rule_ids.contains(&m.id) {
            self.rule_ids.push(m.id);
        }
        self.matches.push(m);
    }

    fn severity_sum(&self, select: impl Fn(u32) -> bool) -> u32 {
        let mut seen: Vec<u32> = Vec::new();
        let mut sum = 0;
        for m in &self.matches {
            if !select(m.id) || seen.contains(&m.id) {
                continue;
            }
            seen.push(m.id);
            sum += match m.severity {
                Some(2) => 5,
                Some(3) => 4,
                Some(4) => 3,
                Some(5) => 2,
                _ => 0,
            };
        }
        sum
    }
}

/// Parses one libmodsecurity text log line (`RuleMessage::log`): `… [file "…"] [line "…"]
/// [id "…"] [rev "…"] [msg "…"] [data "…"] [severity "…"] [ver "…"] [maturity "…"]
/// [accuracy "…"] [tag "…"]… [hostname "…"] [uri "…"] [unique_id "…"] [ref "…"]`.
pub(crate) fn parse_line(line: &str, disruptive: bool) -> RuleMatch {
    let id = field(line, "id", "rev")
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(0);
    let msg = field(line, "msg", "data").unwrap_or_default().to_owned();
    let data = field(line, "data", "severity")
        .unwrap_or_default()
        .to_owned();
    let severity = field(line, "severity", "ver").and_then(|s| s.trim().parse::<u8>().ok());
    let tags = tags(line);
    let text = |name: &str, next: &str| field(line, name, next).unwrap_or_default().to_owned();
    let number = |name: &str, next: &str| {
        field(line, name, next)
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(0)
    };
    // The phase is in the prefix libmodsecurity writes before the matched text (which
    // carries request bytes), so only the prefix is read.
    let prefix = line
        .find(" [file \"")
        .and_then(|end| line.get(..end))
        .unwrap_or(line);
    let phase = if disruptive {
        number_after(prefix, " (phase ").and_then(|p| u8::try_from(p).ok())
    } else {
        None
    };
    RuleMatch {
        id,
        msg,
        data,
        severity,
        tags,
        file: text("file", "line"),
        file_line: number("line", "id"),
        rev: text("rev", "msg"),
        ver: text("ver", "maturity"),
        maturity: number("maturity", "accuracy"),
        accuracy: number("accuracy", "tag"),
        hostname: text("hostname", "uri"),
        uri: text("uri", "unique_id"),
        unique_id: text("unique_id", "ref"),
        phase,
        disruptive,
        line: line.to_owned(),
    }
}

/// The value of ` [name "VALUE"]` where the next field is ` [next "`. Values (msg, data)
/// may contain `"` and `]`, so the end is found by the next field's start; when that is
/// missing, the first `"]` ends the value.
fn field<'a>(line: &'a str, name: &str, next: &str) -> Option<&'a str> {
    let open = format!("[{name} \"");
    let start = line.find(&open)? + open.len();
    let rest = line.get(start..)?;
    let close = format!("\"] [{next} \"");
    let end = rest.find(&close).or_else(|| rest.find("\"]"))?;
    rest.get(..end)
}

fn tags(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(pos) = rest.find("[tag \"") {
        let after = match rest.get(pos + 6..) {
            Some(a) => a,
            None => break,
        };
        match after.find("\"]") {
            Some(end) => {
                out.push(after.get(..end).unwrap_or_default().to_owned());
                rest = after.get(end..).unwrap_or_default();
            }
            None => break,
        }
    }
    out
}

/// The first run of ASCII digits right after `pat` in `s`.
fn number_after(s: &str, pat: &str) -> Option<u32> {
    let start = s.find(pat)? + pat.len();
    let digits: String = s
        .get(start..)?
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

fn inbound_score_of(msg: &str) -> Option<u32> {
    if msg.starts_with("Inbound Anomaly Score Exceeded (Total Score: ") {
        return number_after(msg, "(Total Score: ");
    }
    number_after(msg, "Total Inbound Score: ")
        .or_else(|| number_after(msg, "(Inbound Anomaly Score: "))
}

fn outbound_score_of(msg: &str) -> Option<u32> {
    if msg.starts_with("Outbound Anomaly Score Exceeded (Total Score: ") {
        return number_after(msg, "(Total Score: ");
    }
    number_after(msg, "Outbound Anomaly Score Exceeded (score ")
        .or_else(|| number_after(msg, "Total Outbound Score: "))
        .or_else(|| number_after(msg, "(Outbound Anomaly Score: "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = "[client 127.0.0.1] ModSecurity: Warning. Matched \"Operator `Rx' with parameter `x' against variable `ARGS:id' (Value: `1' OR '1'='1' ) [file \"/usr/share/modsecurity-crs/rules/REQUEST-942-APPLICATION-ATTACK-SQLI.conf\"] [line \"45\"] [id \"942100\"] [rev \"\"] [msg \"SQL Injection Attack Detected via libinjection\"] [data \"Matched Data: s&sos found within ARGS:id: 1' OR '1'='1\"] [severity \"2\"] [ver \"OWASP_CRS/3.3.4\"] [maturity \"0\"] [accuracy \"0\"] [tag \"application-multi\"] [tag \"attack-sqli\"] [hostname \"127.0.0.1\"] [uri \"/\"] [unique_id \"abc\"] [ref \"v\"]";

    #[test]
    fn parses_a_crs_line() {
        let m = parse_line(LINE, false);
        assert_eq!(m.id, 942100);
        assert_eq!(m.msg, "SQL Injection Attack Detected via libinjection");
        assert_eq!(
            m.data,
            "Matched Data: s&sos found within ARGS:id: 1' OR '1'='1"
        );
        assert_eq!(m.severity, Some(2));
        assert_eq!(m.tags, vec!["application-multi", "attack-sqli"]);
        assert_eq!(
            m.file,
            "/usr/share/modsecurity-crs/rules/REQUEST-942-APPLICATION-ATTACK-SQLI.conf"
        );
        assert_eq!((m.file_line, m.rev.as_str()), (45, ""));
        assert_eq!(
            (m.ver.as_str(), m.maturity, m.accuracy),
            ("OWASP_CRS/3.3.4", 0, 0)
        );
        assert_eq!(
            (m.hostname.as_str(), m.uri.as_str(), m.unique_id.as_str()),
            ("127.0.0.1", "/", "abc")
        );
        assert_eq!(m.phase, None);
    }

    /// A disruptive line says its phase before the matched text; a phase written by the
    /// client in the matched value is not read.
    #[test]
    fn the_phase_of_a_disruptive_line() {
        let denied = "[client 127.0.0.1] ModSecurity: Access denied with code 403 (phase 2). Matched \"Operator `Ge' with parameter `5' against variable `TX:ANOMALY_SCORE' (Value: `5' ) [file \"/usr/share/modsecurity-crs/rules/REQUEST-949-BLOCKING-EVALUATION.conf\"] [line \"80\"] [id \"949110\"] [rev \"\"] [msg \"Inbound Anomaly Score Exceeded (Total Score: 5)\"] [data \"\"] [severity \"2\"] [ver \"OWASP_CRS/3.3.4\"] [maturity \"0\"] [accuracy \"0\"] [tag \"application-multi\"] [hostname \"127.0.0.1\"] [uri \"/\"] [unique_id \"abc\"] [ref \"\"]";
        let m = parse_line(denied, true);
        assert_eq!((m.id, m.phase, m.file_line), (949110, Some(2), 80));
        assert_eq!(m.tags, vec!["application-multi"]);
        let forged = LINE.replace("(Value: `1'", "(Value: `x (phase 4). 1'");
        assert_eq!(parse_line(&forged, false).phase, None);
    }

    #[test]
    fn scores_and_dedup() {
        let mut r = MatchReport::default();
        r.record_line(LINE, false);
        r.record_line(LINE, false);
        assert_eq!(r.rule_ids(), &[942100]);
        assert_eq!(r.estimated_inbound_score(), 5);
        r.record_line(
            "ModSecurity: Access denied with code 403 (phase 2). x [id \"949110\"] [rev \"\"] [msg \"Inbound Anomaly Score Exceeded (Total Score: 10)\"] [data \"\"] [severity \"2\"]",
            true,
        );
        assert_eq!(r.inbound_anomaly_score(), Some(10));
        assert_eq!(r.rule_ids(), &[942100, 949110]);
        r.record_line("[id \"959100\"] [rev \"\"] [msg \"Outbound Anomaly Score Exceeded (Total Score: 4)\"] [data \"\"]", false);
        assert_eq!(r.outbound_anomaly_score(), Some(4));
    }

    #[test]
    fn garbage_does_not_panic() {
        for s in [
            "",
            "[id \"",
            "[msg \"x",
            "[tag \"",
            "[id \"99999999999\"]",
            "[severity \"x\"]",
        ] {
            let m = parse_line(s, false);
            assert_eq!(m.id, 0);
        }
    }

    proptest::proptest! {
        /// Log lines carry request bytes (`[data "…"]`, `[uri "…"]`): any text parses
        /// without panicking, and ids stay unique.
        #[test]
        fn any_line_parses(line in ".{0,300}", prefix in "(\\[(id|msg|data|severity|tag) \"){0,3}") {
            let mut r = MatchReport::default();
            r.record_line(&format!("{prefix}{line}"), false);
            r.record_line(&format!("{line}{prefix}"), true);
            let mut ids = r.rule_ids().to_vec();
            ids.sort_unstable();
            ids.dedup();
            proptest::prop_assert_eq!(ids.len(), r.rule_ids().len());
            let _ = r.estimated_inbound_score();
        }
    }
}
