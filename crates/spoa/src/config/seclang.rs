//! An application's rule text as libmodsecurity compiles it, and libmodsecurity's errors
//! placed back on the configuration file's lines.
//!
//! coraza-spoa's files include Coraza's embedded files by `@` name; here each resolves to
//! what it stands for:
//!
//! - `Include @coraza.conf-recommended`: the recommended engine settings
//!   ([`crs::RECOMMENDED_ENGINE_SETTINGS`]), written in place;
//! - `Include @crs-setup.conf.example`: the CRS setup file of the configured CRS;
//! - `Include @owasp_crs/FILE-OR-GLOB`: the same name in the configured CRS's rules.
//!
//! Any other `@` name is a problem that names the line and what to write instead. Before the
//! application's own text come the engine's limits ([`crs::ENGINE_LIMITS`]: what one request
//! may cost), each unless the text sets its own (the same directive, or a rule with the same
//! id) or the application says `engine_limits: false`; after it `SecRuleEngine
//! DetectionOnly` for `detect_only`, and the score rules that let `anomaly_score` be CRS's
//! own total ([`crs::score_rules_text`]), unless the text has them already (what
//! `show-config` prints reads back unchanged).

use lastcall_modsec::crs;

use super::{Application, Directives};

/// Where a line of the compiled text came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// That line of the configuration file (0: no file, the built-in application).
    Line(usize),
    /// The text `Include @coraza.conf-recommended` on that line stands for.
    Recommended(usize),
    /// A line the agent adds before the application's text (the engine's limits).
    AddedBefore,
    /// A line the agent adds after the application's text.
    Added,
}

/// The text to compile, with the origin of each of its lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuleText {
    /// SecLang text.
    pub(crate) text: String,
    origins: Vec<Origin>,
}

/// A problem with an application's rules: the file line it is on (0 when there is no
/// file), what is wrong, and what would be valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuleProblem {
    /// The configuration file's line.
    pub(crate) line: usize,
    /// What is wrong.
    pub(crate) message: String,
    /// What would be valid, when it can be said.
    pub(crate) expected: Option<String>,
}

/// What libmodsecurity names a text that came from no file.
const NO_FILE: &str = "<<reference missing or not informed>>";

/// The names of Coraza's embedded files that resolve here.
/// `SecRequestBodyNoFilesLimit` of the built-in application: the documented `tune.bufsize`
/// (1114112), so that a 1 MiB form, JSON or XML body HAProxy hands over whole is inspected,
/// not refused with 400 by ModSecurity's usual 128 KiB (docs/spoa.md, *Request bodies*).
pub(crate) const BUILTIN_NO_FILES_LIMIT: usize = 1_114_112;

const CORAZA_NAMES: &str = "@coraza.conf-recommended, @crs-setup.conf.example or \
                            @owasp_crs/<file or glob> (or a path)";

impl RuleText {
    /// The text application `a` runs, with `loc` as its CRS.
    pub(crate) fn for_application(
        a: &Application,
        loc: &crs::Location,
    ) -> Result<RuleText, Vec<RuleProblem>> {
        let Some(d) = &a.directives else {
            let text = crs::debian_default_directives(&crs::CrsOptions {
                paranoia_level: a.paranoia_level,
                detect_only: a.detect_only,
                response_check: a.response_check,
                request_body_no_files_limit: BUILTIN_NO_FILES_LIMIT,
                ..loc.options()
            });
            let origins = vec![Origin::Line(a.line); text.lines().count()];
            return Ok(RuleText { text, origins });
        };
        let mut out = RuleText {
            text: String::with_capacity(d.text.len() + 1024),
            origins: Vec::new(),
        };
        if a.engine_limits {
            for l in crs::ENGINE_LIMITS.lines() {
                if !sets_its_own(&d.text, l) {
                    out.push(l, Origin::AddedBefore);
                }
            }
        }
        let mut problems = Vec::new();
        // A block's last newline ends its last line; it starts no other.
        let own = d.text.strip_suffix('\n').unwrap_or(&d.text);
        for (i, line) in own.split('\n').enumerate() {
            let at = d.lines.get(i).copied().unwrap_or(0);
            match coraza_include(line) {
                None => out.push(line, Origin::Line(at)),
                Some(name) => match resolve(name, loc) {
                    Ok(Resolved::Recommended) => {
                        for l in crs::RECOMMENDED_ENGINE_SETTINGS.lines() {
                            out.push(l, Origin::Recommended(at));
                        }
                    }
                    Ok(Resolved::Include(path)) => {
                        out.push(&format!("Include {path}"), Origin::Line(at));
                    }
                    Err((message, expected)) => problems.push(RuleProblem {
                        line: at,
                        message,
                        expected,
                    }),
                },
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        if a.detect_only && last_engine_mode(&out.text) != Some("detectiononly") {
            out.push("SecRuleEngine DetectionOnly", Origin::Added);
        }
        for l in crs::score_rules_text().lines() {
            if !sets_its_own(&d.text, l) {
                out.push(l, Origin::Added);
            }
        }
        Ok(out)
    }

    fn push(&mut self, line: &str, origin: Origin) {
        self.text.push_str(line);
        self.text.push('\n');
        self.origins.push(origin);
    }

    /// libmodsecurity's compile error placed on the configuration file's line, with the
    /// position in the text it compiled left out (that text is not what the operator wrote).
    pub(crate) fn place(
        &self,
        error: &str,
        d: Option<&Directives>,
        fallback: usize,
    ) -> RuleProblem {
        let (file, line, rest) = parse_error(error);
        let origin = match (file, line) {
            (Some(NO_FILE), Some(n)) => n.checked_sub(1).and_then(|i| self.origins.get(i)),
            (Some(path), _) => self.include_of(path),
            _ => None,
        };
        let message = match (file, line, origin) {
            (Some(NO_FILE), _, Some(Origin::Recommended(_))) => {
                format!("in @coraza.conf-recommended: {rest}")
            }
            (Some(NO_FILE), _, Some(Origin::Added)) => {
                format!("in the rules lastcall-spoa adds after yours: {rest}")
            }
            (Some(NO_FILE), _, Some(Origin::AddedBefore)) => {
                format!("in the engine limits lastcall-spoa adds before yours (engine_limits: false leaves them out): {rest}")
            }
            (Some(NO_FILE), _, _) => rest.to_owned(),
            (Some(path), Some(n), _) => format!("{path}:{n}: {rest}"),
            _ => error.to_owned(),
        };
        let line = match origin {
            Some(Origin::Line(l) | Origin::Recommended(l)) if *l > 0 => *l,
            _ => d.and_then(|d| d.lines.first().copied()).unwrap_or(fallback),
        };
        RuleProblem {
            line,
            message,
            expected: None,
        }
    }

    /// The line that included `path` (itself, or a glob of its directory).
    fn include_of(&self, path: &str) -> Option<&Origin> {
        let dir = std::path::Path::new(path).parent()?;
        self.text
            .split('\n')
            .zip(&self.origins)
            .find(|(l, _)| {
                include_argument(l).is_some_and(|arg| {
                    arg == path || std::path::Path::new(arg).parent() == Some(dir)
                })
            })
            .map(|(_, o)| o)
    }
}

/// Whether `text` sets what `line` (one of the lines the agent adds) sets: the same
/// directive for a setting (`SecPcreMatchLimit`), a rule with the same id for a rule.
fn sets_its_own(text: &str, line: &str) -> bool {
    match rule_id(line) {
        Some(id) => text
            .match_indices("id:")
            .any(|(at, _)| rule_id(&text[at..]) == Some(id)),
        None => {
            let directive = line.split_whitespace().next().unwrap_or_default();
            text.lines().any(|l| {
                l.split_whitespace()
                    .next()
                    .is_some_and(|w| w.eq_ignore_ascii_case(directive))
            })
        }
    }
}

/// The id of a rule's `id:N` action (the first in `text`), quoted or not.
fn rule_id(text: &str) -> Option<u64> {
    let (_, after) = text.split_once("id:")?;
    let digits: String = after
        .trim_start_matches([' ', '\'', '"'])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The mode of the last `SecRuleEngine` line of `text`, lower-case.
fn last_engine_mode(text: &str) -> Option<&'static str> {
    text.lines().rev().find_map(|l| {
        let mut words = l.split_whitespace();
        let directive = words.next()?;
        if !directive.eq_ignore_ascii_case("SecRuleEngine") {
            return None;
        }
        match words.next()?.to_ascii_lowercase().as_str() {
            "on" => Some("on"),
            "off" => Some("off"),
            "detectiononly" => Some("detectiononly"),
            _ => None,
        }
    })
}

/// What a Coraza name stands for.
#[derive(Debug, PartialEq, Eq)]
enum Resolved {
    /// The recommended engine settings, written in place.
    Recommended,
    /// An `Include` of this path (or glob).
    Include(String),
}

/// The argument of an `Include` directive, unquoted.
fn include_argument(line: &str) -> Option<&str> {
    let line = line.trim();
    let (directive, rest) = line.split_once(char::is_whitespace)?;
    if !directive.eq_ignore_ascii_case("include") {
        return None;
    }
    let arg = rest.trim();
    let unquoted = arg
        .strip_prefix('"')
        .and_then(|a| a.strip_suffix('"'))
        .or_else(|| arg.strip_prefix('\'').and_then(|a| a.strip_suffix('\'')))
        .unwrap_or(arg);
    Some(unquoted)
}

/// The `@` name an `Include` line names, if it names one.
fn coraza_include(line: &str) -> Option<&str> {
    include_argument(line).filter(|a| a.starts_with('@'))
}

fn resolve(name: &str, loc: &crs::Location) -> Result<Resolved, (String, Option<String>)> {
    match name {
        "@coraza.conf-recommended" => return Ok(Resolved::Recommended),
        "@crs-setup.conf.example" => {
            return Ok(Resolved::Include(loc.setup.display().to_string()));
        }
        _ => {}
    }
    if let Some(rest) = name.strip_prefix("@owasp_crs/") {
        let path = loc.rules_dir.join(rest);
        let glob = rest.contains(['*', '?', '[']);
        if !glob && !path.is_file() {
            return Err((
                format!(
                    "Include {name}: {} is not in the CRS at {} (a file of another CRS version?)",
                    rest,
                    loc.rules_dir.display()
                ),
                Some(
                    "a file that is there, `@owasp_crs/*.conf`, or --crs-dir with the CRS \
                     release that has it"
                        .into(),
                ),
            ));
        }
        return Ok(Resolved::Include(path.display().to_string()));
    }
    if name.starts_with("@owasp_crs_plugins/") {
        return Err((
            format!("Include {name}: CRS plugins are not built in"),
            Some(
                "the plugin's own files, by path (Include /path/to/plugins/NAME-before.conf)"
                    .into(),
            ),
        ));
    }
    Err((
        format!("Include {name}: not a file Coraza's embedded set has"),
        Some(CORAZA_NAMES.into()),
    ))
}

/// Splits libmodsecurity's `Rules error. File: F. Line: N. Column: C. MESSAGE`.
fn parse_error(error: &str) -> (Option<&str>, Option<usize>, &str) {
    let Some(after) = error.split_once("File: ").map(|(_, a)| a) else {
        return (None, None, error);
    };
    let Some((file, rest)) = after.split_once(". Line: ") else {
        return (None, None, error);
    };
    let Some((line, rest)) = rest.split_once(". Column: ") else {
        return (Some(file), None, error);
    };
    let rest = rest.split_once(". ").map_or(rest, |(_, m)| m);
    (Some(file), line.trim().parse().ok(), rest.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(text: &str, first_line: usize) -> Application {
        let mut a = Application::new("a");
        a.line = first_line - 1;
        a.directives = Some(Directives {
            text: text.to_owned(),
            lines: (0..text.split('\n').count())
                .map(|i| first_line + i)
                .collect(),
            key: "applications[0].directives".into(),
        });
        a
    }

    #[test]
    fn coraza_names_resolve() {
        let loc = crs::Location::debian();
        let a = app(
            "Include @coraza.conf-recommended\nInclude \"@crs-setup.conf.example\"\ninclude @owasp_crs/*.conf\nSecRuleEngine On",
            10,
        );
        let t = RuleText::for_application(&a, &loc).unwrap();
        let limits = crs::ENGINE_LIMITS.lines().count();
        assert!(
            t.text.starts_with(crs::ENGINE_LIMITS),
            "the engine's limits first"
        );
        assert!(t.text[crs::ENGINE_LIMITS.len()..]
            .starts_with("# Engine settings recommended by lastcall"));
        assert!(t
            .text
            .contains("\nInclude /etc/modsecurity/crs/crs-setup.conf\n"));
        assert!(t
            .text
            .contains("\nInclude /usr/share/modsecurity-crs/rules/*.conf\nSecRuleEngine On\n"));
        assert!(t.text.contains("id:9990110"), "the score rules follow");
        assert_eq!(t.origins[0], Origin::AddedBefore);
        assert_eq!(t.origins[limits], Origin::Recommended(10));
        let n = limits + crs::RECOMMENDED_ENGINE_SETTINGS.lines().count();
        assert_eq!(t.origins[n], Origin::Line(11));
        assert_eq!(t.origins[n + 2], Origin::Line(13));
    }

    /// Directives a user writes get the engine's limits, except those they set themselves;
    /// `engine_limits: false` leaves them all out. The score rules are added once.
    #[test]
    fn user_directives_get_the_engine_limits_unless_they_set_their_own() {
        let loc = crs::Location::debian();
        let a = app("SecRuleEngine On\nInclude @owasp_crs/*.conf", 1);
        let t = RuleText::for_application(&a, &loc).unwrap().text;
        for l in crs::ENGINE_LIMITS.lines() {
            assert_eq!(t.matches(l).count(), 1, "{l}");
        }
        let own = app(
            "SecPcreMatchLimit 1000000\nSecRule &ARGS \"@ge 5000\" \"id:200007,phase:2,deny\"\nSecRuleEngine On",
            1,
        );
        let t = RuleText::for_application(&own, &loc).unwrap().text;
        assert!(!t.contains("SecPcreMatchLimit 50000"), "{t}");
        assert!(!t.contains("@ge 1000"), "{t}");
        assert!(
            t.contains("SecArgumentsLimit 1000\n") && t.contains("id:9990130"),
            "{t}"
        );
        let mut off = app("SecRuleEngine On", 1);
        off.engine_limits = false;
        let t = RuleText::for_application(&off, &loc).unwrap().text;
        assert!(
            !t.contains("SecPcreMatchLimit") && !t.contains("id:9990130"),
            "{t}"
        );
        assert_eq!(t.matches("id:9990110").count(), 1);
        // The text of an application that has them all (what show-config prints) is left
        // as it is, DetectionOnly included.
        let mut again = app(&RuleText::for_application(&a, &loc).unwrap().text, 1);
        again.detect_only = true;
        let t2 = RuleText::for_application(&again, &loc).unwrap().text;
        assert_eq!(
            t2,
            format!(
                "{}SecRuleEngine DetectionOnly\n",
                RuleText::for_application(&a, &loc).unwrap().text
            )
        );
        again.directives = Some(Directives::inline(&t2));
        assert_eq!(RuleText::for_application(&again, &loc).unwrap().text, t2);
    }

    #[test]
    fn other_names_are_problems_on_their_line() {
        let loc = crs::Location::debian();
        let a = app(
            "SecRuleEngine On\nInclude @owasp_crs/REQUEST-999-NOT-THERE.conf\nInclude @owasp_crs_plugins/wordpress-before.conf\nInclude @foo.conf",
            5,
        );
        let problems = RuleText::for_application(&a, &loc).unwrap_err();
        let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, [6, 7, 8]);
        assert!(
            problems[0].message.contains(
                "REQUEST-999-NOT-THERE.conf is not in the CRS at /usr/share/modsecurity-crs/rules"
            ),
            "{problems:?}"
        );
        assert!(problems[1]
            .expected
            .as_deref()
            .unwrap_or("")
            .contains("by path"));
        assert!(problems[2]
            .expected
            .as_deref()
            .unwrap_or("")
            .contains("@coraza.conf-recommended"));
    }

    #[test]
    fn compile_errors_land_on_the_file_line() {
        let loc = crs::Location::debian();
        let a = app(
            "Include @coraza.conf-recommended\nSecRuleEngine On\nSecFoo bar",
            20,
        );
        let t = RuleText::for_application(&a, &loc).unwrap();
        let n =
            crs::ENGINE_LIMITS.lines().count() + crs::RECOMMENDED_ENGINE_SETTINGS.lines().count();
        let err = format!(
            "Rules error. File: {NO_FILE}. Line: {}. Column: 11. Invalid input:  SecFoo bar",
            n + 2
        );
        let p = t.place(&err, a.directives.as_ref(), a.line);
        assert_eq!(
            (p.line, p.message.as_str()),
            (22, "Invalid input:  SecFoo bar")
        );
        let err = "Rules error. File: /usr/share/modsecurity-crs/rules/REQUEST-911-METHOD-ENFORCEMENT.conf. Line: 3. Column: 4. Bad";
        let a = app("SecRuleEngine On\nInclude @owasp_crs/*.conf", 30);
        let t = RuleText::for_application(&a, &loc).unwrap();
        let p = t.place(err, a.directives.as_ref(), a.line);
        assert_eq!(p.line, 31);
        assert!(
            p.message.starts_with(
                "/usr/share/modsecurity-crs/rules/REQUEST-911-METHOD-ENFORCEMENT.conf:3: Bad"
            ),
            "{p:?}"
        );
    }
}
