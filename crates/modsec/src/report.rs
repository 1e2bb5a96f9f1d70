//! What a transaction matched, parsed from libmodsecurity's text log lines.
//!
//! The C API cannot read TX variables, so everything here comes from text: the lines the
//! server log callback delivers (non-disruptive matches, and every match in
//! `DetectionOnly`) and the log of a disruptive intervention (the blocking rule, e.g.
//! CRS 949110 "Inbound Anomaly Score Exceeded (Total Score: 5)").
//!
//! Those lines carry request bytes unescaped (libmodsecurity 3.0.9, 3.0.14 and 3.0.16 alike:
//! the matched variable's name and value, the decoded path, a `msg` expanding a macro), so
//! a client can write rule fields into them. [`parse_line_with`] reads each line from both
//! ends with what the transaction gave libmodsecurity, and [`RuleMatch::ambiguous`] marks
//! a line that still reads more than one way; scores come only from lines that do not.

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
    /// True when request bytes in the line imitate its rule fields, so that it reads in
    /// more than one way (or in none: then `id` is 0). The fields kept are the reading
    /// libmodsecurity wrote unless a rule's own `msg` expands request bytes into such an
    /// imitation (see `parse_line_with`): the score, and any decision, never come from such
    /// a line; logs say it.
    pub ambiguous: bool,
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
    known: Known,
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

    /// The transaction id given to libmodsecurity (its `[unique_id "…"]`).
    pub(crate) fn know_id(&mut self, id: &str) {
        self.known.id = Some(id.to_owned());
    }

    /// The server address given to libmodsecurity (its `[hostname "…"]`).
    pub(crate) fn know_server(&mut self, server: &str) {
        self.known.server = Some(server.to_owned());
    }

    /// The request line's URI given to libmodsecurity (its `[uri "…"]` is the decoded path).
    pub(crate) fn know_uri(&mut self, uri: &str) {
        self.known.uri = Some(uri.to_owned());
    }

    /// Parses `line` with what this transaction knows (see [`parse_line_with`]).
    pub(crate) fn parse(&self, line: &str, disruptive: bool) -> RuleMatch {
        parse_line_with(line, disruptive, &self.known)
    }

    pub(crate) fn set_request_body_truncated(&mut self) {
        self.request_body_truncated = true;
    }

    pub(crate) fn set_response_body_truncated(&mut self) {
        self.response_body_truncated = true;
    }

    /// Records one log line (from the callback or an intervention).
    ///
    /// Scores are read only from lines that read one way, and only from the rules that
    /// report them (CRS's 949xxx, 959xxx and 980xxx, and our score rules), whose messages
    /// expand numbers only: a rule of another range whose message expands request bytes
    /// cannot set them.
    pub(crate) fn record_line(&mut self, line: &str, disruptive: bool) {
        let m = self.parse(line, disruptive);
        if !m.ambiguous {
            if let Some(rest) = m.msg.strip_prefix(crate::crs::SCORE_MESSAGE_PREFIX) {
                // Our own score rules (crs.rs): a number, not a match.
                if m.id == crate::crs::SCORE_RULE_INBOUND {
                    if let Some(n) = rest.strip_prefix("inbound ").and_then(|n| number(n.trim())) {
                        self.inbound_score = Some(n);
                    }
                    return;
                }
                if m.id == crate::crs::SCORE_RULE_OUTBOUND {
                    if let Some(n) = rest
                        .strip_prefix("outbound ")
                        .and_then(|n| number(n.trim()))
                    {
                        self.outbound_score = Some(n);
                    }
                    return;
                }
            }
            let inbound = (949_000..950_000).contains(&m.id) || (980_000..981_000).contains(&m.id);
            let outbound = (959_000..960_000).contains(&m.id) || (980_000..981_000).contains(&m.id);
            if let Some(score) = inbound_score_of(&m.msg).filter(|_| inbound) {
                self.inbound_score = Some(score);
            }
            if let Some(score) = outbound_score_of(&m.msg).filter(|_| outbound) {
                self.outbound_score = Some(score);
            }
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

/// What the transaction told libmodsecurity that each line's tail repeats: the server
/// address (`[hostname "…"]`), the request line's URI (`[uri "…"]`, from which the
/// decoded path is computed) and the transaction id (`[unique_id "…"]`). Knowing them,
/// the parser finds where the real tail starts, whatever the URI carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Known {
    pub(crate) server: Option<String>,
    pub(crate) uri: Option<String>,
    pub(crate) id: Option<String>,
}

/// Parses one libmodsecurity text log line (`RuleMessage::log`) knowing nothing of its
/// transaction (see [`parse_line_with`]).
#[cfg(test)]
pub(crate) fn parse_line(line: &str, disruptive: bool) -> RuleMatch {
    parse_line_with(line, disruptive, &Known::default())
}

/// Parses one libmodsecurity text log line (`RuleMessage::log`, the same in 3.0.9 to 3.0.16):
///
/// `[[client C] ]ModSecurity: Warning. MATCH` (or `Access denied with code N (phase P). MATCH`)
/// ` [file "F"] [line "N"] [id "N"] [rev "E"] [msg "MSG"] [data "E"] [severity "N"] [ver "E"]`
/// ` [maturity "N"] [accuracy "N"]( [tag "E"])* [hostname "H"] [uri "U"] [unique_id "I"]`
/// ` [ref "R"]`
///
/// `MATCH` (the matched variable's name and value), `MSG` (macro expansion) and `U` (the
/// decoded path) carry request bytes with `"` and `]` unescaped, so a client can write any
/// of these fields into them. The fields written `E` are escaped by libmodsecurity (`"` as
/// `\x22`), `N` are numbers, `R` is offsets and transformation names, and the whole line has
/// its bytes outside 32-126 escaped. So the line is read from both ends:
///
/// 1. the phase from the prefix, which the client cannot write;
/// 2. the tail from the right: `R`, then `I`, `U` and `H` compared with what the
///    transaction was given ([`Known`]), then the escaped and numeric fields back to the end
///    of `MSG`: one reading only, whatever the URI or the message carry;
/// 3. the head (`file`, `line`, `id`, `rev`, start of `MSG`): every place where that
///    sequence parses before the end of `MSG` is a reading. Imitations in `MATCH` come
///    before the real head and imitations in `MSG` (only from a rule whose message expands
///    request bytes) after it: the last reading is taken, and [`RuleMatch::ambiguous`] says
///    there was more than one.
///
/// A line that does not parse so (not libmodsecurity's shape) gives id 0 and is ambiguous.
pub(crate) fn parse_line_with(line: &str, disruptive: bool, known: &Known) -> RuleMatch {
    let (body, prefix_phase) = split_prefix(line);
    let mut m = RuleMatch {
        id: 0,
        msg: String::new(),
        data: String::new(),
        severity: None,
        tags: Vec::new(),
        file: String::new(),
        file_line: 0,
        rev: String::new(),
        ver: String::new(),
        maturity: 0,
        accuracy: 0,
        hostname: String::new(),
        uri: String::new(),
        unique_id: String::new(),
        phase: if disruptive { prefix_phase } else { None },
        disruptive,
        ambiguous: true,
        line: line.to_owned(),
    };
    let tails = tails(body, known);
    // Several readings of the tail happen only when the URI could not be compared (see
    // `tails`): the leftmost is taken (imitations in the URI come after the real one).
    let Some(tail) = tails.first() else {
        return m;
    };
    let heads = heads(body.get(..tail.msg_end).unwrap_or_default());
    let Some(head) = heads.last() else {
        return m;
    };
    m.id = head.id;
    m.file = head.file.to_owned();
    m.file_line = head.line;
    m.rev = head.rev.to_owned();
    m.msg = body
        .get(head.msg_start..tail.msg_end)
        .unwrap_or_default()
        .to_owned();
    m.data = tail.data.to_owned();
    m.severity = tail.severity;
    m.ver = tail.ver.to_owned();
    m.maturity = tail.maturity;
    m.accuracy = tail.accuracy;
    m.tags = tail.tags.iter().map(|t| (*t).to_owned()).collect();
    m.hostname = tail.hostname.to_owned();
    m.uri = tail.uri.to_owned();
    m.unique_id = tail.unique_id.to_owned();
    m.ambiguous = tails.len() > 1 || heads.len() > 1;
    m
}

/// The line after libmodsecurity's prefix, and the phase the prefix names.
fn split_prefix(line: &str) -> (&str, Option<u8>) {
    let mut rest = line;
    if let Some(after) = rest.strip_prefix("[client ") {
        // An address has no "] ".
        match after.find("] ") {
            Some(end) => rest = after.get(end + 2..).unwrap_or_default(),
            None => return (line, None),
        }
    }
    if let Some(after) = rest.strip_prefix("ModSecurity: Warning. ") {
        return (after, None);
    }
    let Some(after) = rest.strip_prefix("ModSecurity: Access denied with code ") else {
        return (line, None);
    };
    // The status, or a literal "%d" when the library had none yet.
    let code_end = after.find(' ').unwrap_or(after.len());
    let code = after.get(..code_end).unwrap_or_default();
    if code != "%d" && number(code).is_none() {
        return (line, None);
    }
    let Some(after) = after
        .get(code_end..)
        .and_then(|a| a.strip_prefix(" (phase "))
    else {
        return (line, None);
    };
    let digits = after.bytes().take_while(u8::is_ascii_digit).count();
    let phase = after.get(..digits).and_then(|d| d.parse::<u8>().ok());
    match after.get(digits..).and_then(|a| a.strip_prefix("). ")) {
        Some(body) => (body, phase),
        None => (line, None),
    }
}

/// One reading of the fields after `MSG`.
#[derive(Debug)]
struct Tail<'a> {
    /// Where `MSG` ends (its closing `"]` starts) in the body.
    msg_end: usize,
    data: &'a str,
    severity: Option<u8>,
    ver: &'a str,
    maturity: u32,
    accuracy: u32,
    tags: Vec<&'a str>,
    hostname: &'a str,
    uri: &'a str,
    unique_id: &'a str,
}

/// One reading of the fields before `MSG`.
#[derive(Debug)]
struct Head<'a> {
    file: &'a str,
    line: u32,
    id: u32,
    rev: &'a str,
    /// Where `MSG` starts in the body.
    msg_start: usize,
}

/// The readings of the tail of `body` (see [`parse_line_with`]), leftmost first.
fn tails<'a>(body: &'a str, known: &Known) -> Vec<Tail<'a>> {
    let Some(s) = body.strip_suffix("\"]") else {
        return Vec::new();
    };
    // `[ref "…"]` has no quote: the last opening is the real one.
    let Some(at) = s.rfind(" [ref \"") else {
        return Vec::new();
    };
    if s.get(at + 7..).is_none_or(|r| r.contains('"')) {
        return Vec::new();
    }
    let s = s.get(..at).unwrap_or_default();
    // `[unique_id "…"]`: the id given, else one libmodsecurity made (no quote in it).
    let (s, unique_id) = match &known.id {
        Some(id) => {
            let id = escape(id.as_bytes());
            let field = format!(" [unique_id \"{id}\"]");
            match s.strip_suffix(field.as_str()) {
                Some(rest) => (rest, s.get(rest.len() + 13..s.len() - 2)),
                None => return Vec::new(),
            }
        }
        None => match last_quote_free(s, "unique_id") {
            Some((rest, v)) => (rest, Some(v)),
            None => return Vec::new(),
        },
    };
    let unique_id = unique_id.unwrap_or_default();
    let server = known.server.as_deref().map(|h| escape(h.as_bytes()));
    // `[hostname "H"] [uri "U"]`: with the URI known, exactly where it must be.
    let mut starts: Vec<usize> = Vec::new();
    if let Some(uri) = &known.uri {
        for expected in expected_uris(uri) {
            let field = format!(" [uri \"{expected}\"]");
            if let Some(rest) = s.strip_suffix(field.as_str()) {
                if let Some(h) = hostname_start(rest, server.as_deref()) {
                    if !starts.contains(&h) {
                        starts.push(h);
                    }
                }
            }
        }
    }
    if starts.is_empty() {
        // Unknown URI (or decoded otherwise than expected): every `[hostname "H"] [uri "`
        // is a place the tail may start.
        let mut from = 0;
        while let Some(pos) = s.get(from..).and_then(|r| r.find(" [hostname \"")) {
            let h = from + pos;
            let after = s.get(h + 12..).unwrap_or_default();
            if let Some(end) = after.find("\"] [uri \"") {
                let name = after.get(..end).unwrap_or_default();
                let ok = match &server {
                    Some(server) => name == server,
                    None => !name.contains('"'),
                };
                if ok && h + 12 + end + 9 + 2 <= s.len() && s.ends_with("\"]") {
                    starts.push(h);
                }
            }
            from = h + 1;
        }
    }
    let mut out = Vec::new();
    for h in starts {
        let after = s.get(h + 12..).unwrap_or_default();
        let Some(end) = after.find("\"] [uri \"") else {
            continue;
        };
        let hostname = after.get(..end).unwrap_or_default();
        let uri = s
            .get(h + 12 + end + 9..s.len().saturating_sub(2))
            .unwrap_or_default();
        if let Some(tail) = middle(s.get(..h).unwrap_or_default(), hostname, uri, unique_id) {
            out.push(tail);
        }
    }
    out
}

/// The start of ` [hostname "H"]` that ends `s` (with `H` the server given, if known).
fn hostname_start(s: &str, server: Option<&str>) -> Option<usize> {
    match server {
        Some(h) => {
            let field = format!(" [hostname \"{h}\"]");
            s.strip_suffix(field.as_str()).map(str::len)
        }
        None => last_quote_free(s, "hostname").map(|(rest, _)| rest.len()),
    }
}

/// The fields between `MSG` and `[hostname`, read from the right (each value has no quote,
/// so each field's opening is the last quote before its closing).
fn middle<'a>(
    mut s: &'a str,
    hostname: &'a str,
    uri: &'a str,
    unique_id: &'a str,
) -> Option<Tail<'a>> {
    let mut tags = Vec::new();
    loop {
        let (rest, name, value) = last_field(s)?;
        s = rest;
        if name == "tag" {
            tags.push(value);
        } else if name == "accuracy" {
            let accuracy = number(value)?;
            let (rest, maturity) = named(s, "maturity")?;
            let (rest, ver) = named(rest, "ver")?;
            let (rest, severity) = named(rest, "severity")?;
            let (rest, data) = named(rest, "data")?;
            tags.reverse();
            let msg_end = rest.len().checked_sub(2)?;
            if !rest.ends_with("\"]") {
                return None;
            }
            // `rest` is a prefix of the body, so its length is a position in it.
            return Some(Tail {
                msg_end,
                data,
                severity: severity.parse().ok(),
                ver,
                maturity: number(maturity)?,
                accuracy,
                tags,
                hostname,
                uri,
                unique_id,
            });
        } else {
            return None;
        }
    }
}

/// `s` without its last field ` [NAME "VALUE"]`, where VALUE has no quote.
fn last_field(s: &str) -> Option<(&str, &str, &str)> {
    let inner = s.strip_suffix("\"]")?;
    let open = inner.rfind('"')?;
    let value = inner.get(open + 1..)?;
    let before = inner.get(..open)?.strip_suffix(' ')?;
    let bracket = before.rfind(" [")?;
    let name = before.get(bracket + 2..)?;
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
        return None;
    }
    Some((before.get(..bracket)?, name, value))
}

/// [`last_field`], which must be `name`.
fn named<'a>(s: &'a str, name: &str) -> Option<(&'a str, &'a str)> {
    let (rest, n, v) = last_field(s)?;
    (n == name).then_some((rest, v))
}

/// `s` without its last field ` [name "VALUE"]` (VALUE without quote), and VALUE.
fn last_quote_free<'a>(s: &'a str, name: &str) -> Option<(&'a str, &'a str)> {
    named(s, name)
}

fn number(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Every reading of ` [file "F"] [line "N"] [id "N"] [rev "E"] [msg "` in `s` (the body up
/// to the end of `MSG`), left to right.
fn heads(s: &str) -> Vec<Head<'_>> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(pos) = s.get(from..).and_then(|r| r.find(" [file \"")) {
        let at = from + pos;
        if let Some(head) = head_at(s, at) {
            out.push(head);
        }
        from = at + 1;
    }
    out
}

fn head_at(s: &str, at: usize) -> Option<Head<'_>> {
    let mut rest = s.get(at..)?;
    let mut value = |name: &str| -> Option<&str> {
        let open = format!(" [{name} \"");
        let after = rest.strip_prefix(open.as_str())?;
        let end = after.find("\"]")?;
        let v = after.get(..end)?;
        if v.contains('"') {
            return None;
        }
        rest = after.get(end + 2..)?;
        Some(v)
    };
    let file = value("file")?;
    let line = number(value("line")?)?;
    let id = number(value("id")?)?;
    let rev = value("rev")?;
    let after = rest.strip_prefix(" [msg \"")?;
    let msg_start = s.len() - after.len();
    Some(Head {
        file,
        line,
        id,
        rev,
        msg_start,
    })
}

/// libmodsecurity's `toHexIfNeeded` without the quote escape, as applied to the whole line:
/// bytes outside 32-126 as `\xNN`.
fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if (32..=126).contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// `utils::uri_decode`: `%XX` with two hex digits decoded, anything else kept.
fn uri_decode(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            let hex = |b: u8| char::from(b).to_digit(16);
            if let (Some(h), Some(l)) = (hex(s[i + 1]), hex(s[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

/// `utils::string::limitTo(200, …)`.
fn limit_200(mut s: Vec<u8>) -> Vec<u8> {
    if s.len() > 200 {
        let omitted = s.len() - 200;
        s.truncate(200);
        s.extend_from_slice(format!(" ({omitted} characters omitted)").as_bytes());
    }
    s
}

/// The `[uri "…"]` values libmodsecurity writes for a request line's `uri`: the path
/// without the fragment and the query, percent-decoded, cut at 200 bytes. 3.0.9 decodes
/// the whole URI and cuts at the first `?` after decoding; later releases cut at the raw
/// `?` and decode the path (they differ only when the path has `%3F`).
fn expected_uris(uri: &str) -> Vec<String> {
    let raw = uri.as_bytes();
    let raw = raw.split(|&b| b == b'#').next().unwrap_or_default();
    let decoded = uri_decode(raw);
    let old = decoded.split(|&b| b == b'?').next().unwrap_or_default();
    let path = raw.split(|&b| b == b'?').next().unwrap_or_default();
    let new = uri_decode(path);
    let mut out = vec![escape(&limit_200(old.to_vec()))];
    let second = escape(&limit_200(new));
    if second != out[0] {
        out.push(second);
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
            "ModSecurity: Access denied with code 403 (phase 2). x [file \"/crs/REQUEST-949-BLOCKING-EVALUATION.conf\"] [line \"80\"] [id \"949110\"] [rev \"\"] [msg \"Inbound Anomaly Score Exceeded (Total Score: 10)\"] [data \"\"] [severity \"2\"] [ver \"\"] [maturity \"0\"] [accuracy \"0\"] [hostname \"127.0.0.1\"] [uri \"/\"] [unique_id \"abc\"] [ref \"\"]",
            true,
        );
        assert_eq!(r.inbound_anomaly_score(), Some(10));
        assert_eq!(r.rule_ids(), &[942100, 949110]);
        r.record_line("ModSecurity: Warning.  [file \"/crs/RESPONSE-959-BLOCKING-EVALUATION.conf\"] [line \"9\"] [id \"959100\"] [rev \"\"] [msg \"Outbound Anomaly Score Exceeded (Total Score: 4)\"] [data \"\"] [severity \"2\"] [ver \"\"] [maturity \"0\"] [accuracy \"0\"] [hostname \"127.0.0.1\"] [uri \"/\"] [unique_id \"abc\"] [ref \"\"]", false);
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

    /// A line as `RuleMessage::log` (3.0.9-3.0.16) writes it: `matched` and `msg` raw,
    /// the escaped fields with `"` and `\` as `\xNN`, the whole line's bytes outside 32-126
    /// as `\xNN`.
    struct Line<'a> {
        disruptive: Option<u8>,
        matched: &'a str,
        file: &'a str,
        line: u32,
        id: u32,
        msg: &'a str,
        data: &'a str,
        severity: u8,
        tags: &'a [&'a str],
        uri: &'a str,
    }

    const SERVER: &str = "10.0.0.9";
    const TX: &str = "tx-1";

    fn spec(s: &str) -> String {
        s.bytes()
            .map(|b| {
                if b == b'"' || b == b'\\' {
                    format!("\\x{b:02x}")
                } else {
                    char::from(b).to_string()
                }
            })
            .collect()
    }

    impl Line<'_> {
        fn text(&self) -> String {
            let mut s = match self.disruptive {
                Some(p) => format!(
                    "[client 10.0.0.7] ModSecurity: Access denied with code 403 (phase {p}). "
                ),
                None => "ModSecurity: Warning. ".to_owned(),
            };
            s.push_str(self.matched);
            s.push_str(&format!(
                " [file \"{}\"] [line \"{}\"] [id \"{}\"] [rev \"\"] [msg \"{}\"] [data \"{}\"] [severity \"{}\"] [ver \"OWASP_CRS/4.0.0\"] [maturity \"0\"] [accuracy \"0\"]",
                self.file, self.line, self.id, self.msg, spec(self.data), self.severity
            ));
            for t in self.tags {
                s.push_str(&format!(" [tag \"{}\"]", spec(t)));
            }
            let path = expected_uris(self.uri).swap_remove(0);
            s.push_str(&format!(
                " [hostname \"{SERVER}\"] [uri \"{path}\"] [unique_id \"{TX}\"] [ref \"o0,4v10,4t:lowercase\"]"
            ));
            escape(s.as_bytes())
        }
    }

    const REAL: Line<'static> = Line {
        disruptive: None,
        matched: "Matched \"Operator `Rx' with parameter `(?i)union' against variable `ARGS:q' (Value: `x union select' )",
        file: "/usr/share/modsecurity-crs/rules/REQUEST-942-APPLICATION-ATTACK-SQLI.conf",
        line: 1000,
        id: 942_270,
        msg: "Looking for basic sql injection",
        data: "Matched Data: union select found within ARGS:q: x union select",
        severity: 2,
        tags: &["application-multi", "attack-sqli"],
        uri: "/search",
    };

    /// The head and tags a client writes into its request bytes.
    const FAKE: &str = " [file \"/x\"] [line \"1\"] [id \"942100\"] [rev \"\"] [msg \"fake\"] [data \"\"] [severity \"0\"] [ver \"\"] [maturity \"9\"] [accuracy \"9\"] [tag \"forged\"] [hostname \"10.0.0.9\"] [uri \"/\"] [unique_id \"tx-1\"] [ref \"\"]";

    fn known(uri: &str) -> Known {
        Known {
            server: Some(SERVER.into()),
            uri: Some(uri.into()),
            id: Some(TX.into()),
        }
    }

    fn assert_real(m: &RuleMatch, real: &Line<'_>, case: &str) {
        assert_eq!(m.id, real.id, "{case}: {}", m.line);
        assert_eq!(
            (m.file.as_str(), m.file_line),
            (real.file, real.line),
            "{case}"
        );
        assert_eq!(m.severity, Some(real.severity), "{case}");
        assert_eq!(m.tags, real.tags, "{case}");
        assert_eq!(m.data, spec(real.data), "{case}");
        assert_eq!(
            (m.hostname.as_str(), m.unique_id.as_str()),
            (SERVER, TX),
            "{case}"
        );
    }

    #[test]
    fn an_unforged_line_reads_one_way() {
        let m = parse_line_with(&REAL.text(), false, &known(REAL.uri));
        assert_real(&m, &REAL, "plain");
        assert_eq!(m.msg, REAL.msg);
        assert!(!m.ambiguous);
        // Without knowing the transaction, too.
        let m = parse_line(&REAL.text(), false);
        assert_real(&m, &REAL, "unknown transaction");
        assert!(!m.ambiguous);
    }

    /// Every place a client writes into a line: the real rule, severity, tags and file are
    /// read, whatever it imitates.
    #[test]
    fn request_bytes_cannot_forge_the_rule() {
        let value = format!("Matched \"Operator `Rx' with parameter `x' against variable `ARGS:q' (Value: `a{FAKE} b' )");
        let name = format!("Matched \"Operator `Rx' with parameter `x' against variable `ARGS:a{FAKE}' (Value: `1' )");
        let header = format!("Matched \"Operator `Rx' with parameter `x' against variable `REQUEST_HEADERS:User-Agent' (Value: `{FAKE}' )");
        // The brief's shape: a head whose `rev` swallows the rest.
        let open = "Matched \"Operator `Rx' with parameter `x' against variable `ARGS:q' (Value: ` [file \"/x\"] [line \"1\"] [id \"942100\"] [rev \"' )".to_owned();
        // Percent-encoded in the path: libmodsecurity writes it decoded.
        let uri = "/a%22%5D%20%5Bfile%20%22/x%22%5D%20%5Bline%20%221%22%5D%20%5Bid%20%22942100%22%5D%20%5Brev%20%22%22%5D%20%5Bmsg%20%22fake%22%5D%20%5Bdata%20%22%22%5D%20%5Bseverity%20%220%22%5D%20%5Bver%20%22%22%5D%20%5Bmaturity%20%220%22%5D%20%5Baccuracy%20%220%22%5D%20%5Btag%20%22forged%22%5D%20%5Bhostname%20%2210.0.0.9%22%5D%20%5Buri%20%22/?q=1";
        let shapes: [(&str, Line<'_>); 5] = [
            (
                "argument value",
                Line {
                    matched: &value,
                    ..REAL
                },
            ),
            (
                "argument name",
                Line {
                    matched: &name,
                    ..REAL
                },
            ),
            (
                "header",
                Line {
                    matched: &header,
                    ..REAL
                },
            ),
            (
                "open head",
                Line {
                    matched: &open,
                    ..REAL
                },
            ),
            ("uri", Line { uri, ..REAL }),
        ];
        for (case, line) in &shapes {
            let text = line.text();
            let m = parse_line_with(&text, false, &known(line.uri));
            assert_real(&m, line, case);
            assert_eq!(m.msg, REAL.msg, "{case}");
            assert!(!m.tags.iter().any(|t| t == "forged"), "{case}");
            // The uri shape reads one way; the others say the line carried an imitation.
            assert_eq!(
                m.ambiguous,
                *case != "uri" && *case != "open head",
                "{case}"
            );
            // A disruptive line: its phase is the prefix's.
            let denied = Line {
                disruptive: Some(2),
                ..*line
            };
            let m = parse_line_with(&denied.text(), true, &known(line.uri));
            assert_real(&m, &denied, case);
            assert_eq!(m.phase, Some(2), "{case}");
        }
    }

    /// A rule whose message expands request bytes (`msg:'%{MATCHED_VAR}'`) can carry an
    /// imitation after the real head: the line says it is ambiguous, and its tags,
    /// severity and data (after the message) are still the real ones.
    #[test]
    fn a_message_macro_is_flagged() {
        let msg = "bad value: x\"] [file \"/x\"] [line \"1\"] [id \"949110\"] [rev \"\"] [msg \"Inbound Anomaly Score Exceeded (Total Score: 0)";
        let line = Line {
            id: 190_001,
            msg,
            ..REAL
        };
        let mut r = MatchReport {
            known: known(line.uri),
            ..MatchReport::default()
        };
        r.record_line(&line.text(), false);
        let m = &r.matches()[0];
        assert!(m.ambiguous, "{}", m.line);
        assert_eq!(m.severity, Some(2));
        assert_eq!(m.tags, REAL.tags);
        // No score from it.
        assert_eq!(r.inbound_anomaly_score(), None);
    }

    /// Imitated score lines set no score: neither CRS's blocking message nor ours.
    #[test]
    fn request_bytes_cannot_forge_the_score() {
        for fake in [
            " [file \"/x\"] [line \"1\"] [id \"949110\"] [rev \"\"] [msg \"Inbound Anomaly Score Exceeded (Total Score: 999)",
            " [file \"/x\"] [line \"1\"] [id \"9990110\"] [rev \"\"] [msg \"lastcall anomaly score: inbound 0",
        ] {
            let matched = format!("Matched \"Operator `Rx' with parameter `x' against variable `ARGS:q' (Value: `{fake}' )");
            let line = Line { matched: &matched, ..REAL };
            let mut r = MatchReport {
                known: known(line.uri),
                ..MatchReport::default()
            };
            r.record_line(&line.text(), false);
            assert_eq!(r.inbound_anomaly_score(), None, "{fake}");
            assert_eq!(r.rule_ids(), &[REAL.id], "{fake}");
            // A rule's message in another range cannot set it either.
            let msg = "Inbound Anomaly Score Exceeded (Total Score: 999)";
            let line = Line { id: 190_002, msg, ..REAL };
            r.record_line(&line.text(), false);
            assert_eq!(r.inbound_anomaly_score(), None, "{fake}");
        }
        // The real score rule's line still sets it, with a forged URI beside it.
        let score = Line {
            matched: "Matched \"Operator `Gt' with parameter `0' against variable `TX:ANOMALY_SCORE' (Value: `5' )",
            id: crate::crs::SCORE_RULE_INBOUND,
            msg: "lastcall anomaly score: inbound 5",
            uri: "/%22%5D%20%5Bunique_id%20%22tx-1%22%5D",
            ..REAL
        };
        let mut r = MatchReport {
            known: known(score.uri),
            ..MatchReport::default()
        };
        r.record_line(&score.text(), false);
        assert_eq!(r.inbound_anomaly_score(), Some(5));
    }

    /// Without the URI the tail has two readings when the path imitates it: flagged.
    #[test]
    fn an_unknown_uri_imitated_is_flagged() {
        let fake = "/a\"] [data \"\"] [severity \"0\"] [ver \"\"] [maturity \"0\"] [accuracy \"0\"] [tag \"forged\"] [hostname \"10.0.0.9\"] [uri \"/b";
        let uri: String = fake
            .bytes()
            .map(|b| match b {
                b'"' => "%22".to_owned(),
                b' ' => "%20".to_owned(),
                _ => char::from(b).to_string(),
            })
            .collect();
        let line = Line { uri: &uri, ..REAL };
        let mut k = known(line.uri);
        k.uri = None;
        let m = parse_line_with(&line.text(), false, &k);
        assert_real(&m, &line, "unknown uri");
        assert!(m.ambiguous);
        assert!(!parse_line_with(&line.text(), false, &known(line.uri)).ambiguous);
    }

    /// libmodsecurity's `[uri "…"]`: decoded, without query and fragment, cut at 200 bytes,
    /// bytes outside 32-126 escaped; 3.0.9 cuts at a decoded `?`, later releases at the raw.
    #[test]
    fn expected_uri_values() {
        assert_eq!(expected_uris("/a%20b?x=1#f"), vec!["/a b"]);
        assert_eq!(
            expected_uris("/%e2%82%ac%0a%"),
            vec!["/\\xe2\\x82\\xac\\x0a%"]
        );
        assert_eq!(expected_uris("/a%3Fb?c"), vec!["/a", "/a?b"]);
        let long = format!("/{}", "a".repeat(250));
        assert_eq!(
            expected_uris(&long),
            vec![format!("/{} (51 characters omitted)", "a".repeat(199))]
        );
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
