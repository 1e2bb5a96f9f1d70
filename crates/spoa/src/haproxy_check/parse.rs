//! HAProxy's configuration syntax, as far as the check needs it: sections (`frontend NAME`,
//! `backend NAME`, `listen`, `defaults`, `global`, and an SPOE file's `spoe-agent`,
//! `spoe-message`, `spoe-group` under `[SCOPE]` lines), each with its lines split into words
//! the way HAProxy splits them (spaces, `#` comments, double and single quotes, backslash
//! escapes). Sans-IO: text in, sections out.

/// One configuration line, split into words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    /// 1-based line number.
    pub(crate) no: usize,
    /// The words, quotes and escapes removed.
    pub(crate) words: Vec<String>,
}

impl Line {
    /// Whether the words start with `prefix` (case-sensitive, as HAProxy's keywords are).
    pub(crate) fn starts(&self, prefix: &[&str]) -> bool {
        self.words.len() >= prefix.len() && self.words.iter().zip(prefix).all(|(w, p)| w == p)
    }

    /// The words joined by one space (for looking into conditions).
    pub(crate) fn text(&self) -> String {
        self.words.join(" ")
    }
}

/// One section and the lines in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Section {
    /// `frontend`, `backend`, `spoe-agent`, ...
    pub(crate) kind: String,
    /// Its name (empty for `global`, or an unnamed `defaults`).
    pub(crate) name: String,
    /// The SPOE scope it is in (`[coraza]`), if any.
    pub(crate) scope: Option<String>,
    /// The line that opens it.
    pub(crate) line: usize,
    /// Its lines.
    pub(crate) lines: Vec<Line>,
}

impl Section {
    /// The first line starting with `prefix`.
    pub(crate) fn find(&self, prefix: &[&str]) -> Option<&Line> {
        self.lines.iter().find(|l| l.starts(prefix))
    }

    /// Every line starting with `prefix`.
    pub(crate) fn all(&self, prefix: &[&str]) -> std::vec::IntoIter<&Line> {
        self.lines
            .iter()
            .filter(|l| l.starts(prefix))
            .collect::<Vec<_>>()
            .into_iter()
    }
}

const SECTIONS: &[&str] = &[
    "global",
    "defaults",
    "frontend",
    "backend",
    "listen",
    "resolvers",
    "peers",
    "userlist",
    "cache",
    "program",
    "http-errors",
    "ring",
    "mailers",
    "crt-store",
    "traces",
    "log-forward",
    "spoe-agent",
    "spoe-message",
    "spoe-group",
];

/// Splits a file into sections. Lines before the first section are left out.
pub(crate) fn sections(text: &str) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    let mut scope = None;
    for (i, raw) in text.lines().enumerate() {
        let no = i + 1;
        let trimmed = raw.trim();
        if trimmed.starts_with('[') && trimmed.ends_with(']') {
            scope = Some(trimmed[1..trimmed.len() - 1].trim().to_owned());
            continue;
        }
        let words = words(raw);
        let Some(first) = words.first() else {
            continue;
        };
        if SECTIONS.contains(&first.as_str()) {
            out.push(Section {
                kind: first.clone(),
                name: words.get(1).cloned().unwrap_or_default(),
                scope: scope.clone().filter(|_| first.starts_with("spoe-")),
                line: no,
                lines: Vec::new(),
            });
        } else if let Some(section) = out.last_mut() {
            section.lines.push(Line { no, words });
        }
    }
    out
}

/// Splits one line into words as HAProxy does: whitespace separates, `#` outside quotes
/// starts a comment, `"..."` and `'...'` quote, a backslash escapes the next character.
pub(crate) fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (_, '\\') if quote != Some('\'') => {
                if let Some(next) = chars.next() {
                    word.push(next);
                    in_word = true;
                }
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '#') => break,
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_as_haproxy_splits_them() {
        assert_eq!(
            words(
                r#"    http-request deny deny_status 403 hdr waf-block "request"  if { var(txn.coraza.action) -m str deny } # c"#
            ),
            [
                "http-request",
                "deny",
                "deny_status",
                "403",
                "hdr",
                "waf-block",
                "request",
                "if",
                "{",
                "var(txn.coraza.action)",
                "-m",
                "str",
                "deny",
                "}"
            ]
        );
        assert_eq!(
            words(r"log-format %ci:%cp\ [%t]"),
            ["log-format", "%ci:%cp [%t]"]
        );
        assert_eq!(
            words("bind \"${FRONTEND_ADDR}\""),
            ["bind", "${FRONTEND_ADDR}"]
        );
        assert!(words("   # only a comment").is_empty());
    }

    #[test]
    fn sections_and_spoe_scopes() {
        let s = sections("global\n  log stdout\n[coraza]\nspoe-agent a\n  groups g\nspoe-message m\n  args x=y\nfrontend f\n  bind :80\n");
        let kinds: Vec<(&str, &str, Option<&str>, usize)> = s
            .iter()
            .map(|s| (s.kind.as_str(), s.name.as_str(), s.scope.as_deref(), s.line))
            .collect();
        assert_eq!(
            kinds,
            [
                ("global", "", None, 1),
                ("spoe-agent", "a", Some("coraza"), 4),
                ("spoe-message", "m", Some("coraza"), 6),
                ("frontend", "f", None, 8)
            ]
        );
        assert_eq!(s[1].find(&["groups"]).map(|l| l.no), Some(5));
    }
}
