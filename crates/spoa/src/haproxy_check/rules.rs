//! What `check-haproxy` checks, on parsed files. For each frontend (or `listen`) with a
//! `filter spoe` line, against its SPOE file and the agents' backend:
//!
//! - **fail-closed**: the request message is sent; `option set-on-error` is set and a rule
//!   after the send refuses the request when that variable is set (otherwise a request the
//!   agent could not answer passes uninspected); a rule after the send acts on
//!   `var(txn.<prefix>.action)`; the same for responses when they are sent;
//! - **lossless rollouts**: the agents' backend has two or more servers, `option
//!   spop-check` and `check` on each (a draining agent refuses health checks; with one
//!   server, DOWN means every request fails); the SPOE agent has `max-waiting-frames 1`
//!   (HAProxy then waits for each ACK on a connection, and an agent's goodbye rides on it
//!   without failing a message);
//! - **a hung agent**: `on-marked-down shutdown-sessions` on each agent server (or its
//!   `default-server`): HAProxy closes a stopped agent's connections when it marks it DOWN,
//!   and the retry asks another agent, instead of waiting `timeout processing` on each;
//! - **notes**: `option continue-on-error` with a second send (a connection closed under a
//!   request), `timeout processing` below 1s, `timeout hello`/`timeout idle` (ignored by
//!   HAProxy 3.1+, where the backend's `timeout connect`/`timeout server` apply), a request
//!   message without the body;
//! - **bodies**: a frontend sending `req.body` waits for it (`option http-buffer-request`,
//!   or `http-request wait-for-body` before the send); without, the message goes before
//!   the body arrives (docs/spoa.md, *Request bodies*).
//!
//! Findings carry the file and line they are about and the lines to add.

use std::path::{Path, PathBuf};

use super::parse::{Line, Section};
use super::File;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// Differs from the fail-closed, lossless setup: the check exits 1.
    Fix,
    /// Worth knowing; the setup is still fail-closed and lossless.
    Note,
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    /// The file.
    pub(crate) file: PathBuf,
    /// The line (the section's, when the problem is a missing line).
    pub(crate) line: usize,
    /// Fix or note.
    pub(crate) level: Level,
    /// What is the matter.
    pub(crate) what: String,
    /// The lines to add, if any.
    pub(crate) add: Option<String>,
}

/// The SPOE file paths that `filter spoe ... config PATH` lines of `file` name (`${VAR}`
/// taken from the environment, as HAProxy does).
pub(crate) fn spoe_paths(file: &File) -> Vec<PathBuf> {
    file.sections
        .iter()
        .flat_map(|s| s.all(&["filter", "spoe"]))
        .filter_map(|l| filter_spoe(l).1)
        .map(|p| PathBuf::from(expand_env(&p)))
        .collect()
}

/// `filter spoe [engine NAME] [config PATH]`: the engine and the path.
fn filter_spoe(l: &Line) -> (Option<String>, Option<String>) {
    let after = |key: &str| {
        l.words
            .iter()
            .position(|w| w == key)
            .and_then(|i| l.words.get(i + 1).cloned())
    };
    (after("engine"), after("config"))
}

fn expand_env(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        match rest[start + 2..].find('}') {
            Some(end) => {
                let name = &rest[start + 2..start + 2 + end];
                out.push_str(&std::env::var(name).unwrap_or_default());
                rest = &rest[start + 3 + end..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The spoe-agent a frontend's rules read the variables of: its section and file, its
/// `var-prefix` and its `set-on-error` variable (with its line).
#[derive(Clone, Copy)]
struct AgentVars<'a> {
    agent: &'a Section,
    spoe_file: &'a Path,
    prefix: &'a str,
    error_var: Option<&'a (String, usize)>,
}

/// Everything [`check`] looks at for one frontend.
struct Frontend<'a> {
    file: &'a Path,
    section: &'a Section,
    filter: &'a Line,
    engine: Option<String>,
    /// Sections of the HAProxy files (`defaults`, backends), in order, with their file.
    haproxy: Vec<(&'a Path, &'a Section)>,
    /// The SPOE sections of this engine, with their file.
    spoe: Vec<(&'a Path, &'a Section)>,
}

/// Checks every frontend with a `filter spoe` line in `files`.
pub(crate) fn check(files: &[File]) -> Vec<Finding> {
    let haproxy: Vec<(&Path, &Section)> = files
        .iter()
        .flat_map(|f| f.sections.iter().map(move |s| (f.path.as_path(), s)))
        .filter(|(_, s)| !s.kind.starts_with("spoe-"))
        .collect();
    let mut out = Vec::new();
    let frontends = haproxy
        .iter()
        .filter(|(_, s)| s.kind == "frontend" || s.kind == "listen");
    for (file, section) in frontends {
        for filter in section.all(&["filter", "spoe"]) {
            let (engine, config) = filter_spoe(filter);
            let config = config.map(|c| PathBuf::from(expand_env(&c)));
            // The file the filter names, else (a path of another machine, an unset
            // variable) every SPOE file given.
            let named = |f: &&File| {
                config.as_ref().is_some_and(|c| {
                    f.path == *c || (c.file_name().is_some() && f.path.file_name() == c.file_name())
                })
            };
            let chosen: Vec<&File> = if files.iter().any(|f| named(&f)) {
                files.iter().filter(named).collect()
            } else {
                files.iter().collect()
            };
            let spoe: Vec<(&Path, &Section)> = chosen
                .into_iter()
                .flat_map(|f| f.sections.iter().map(move |s| (f.path.as_path(), s)))
                .filter(|(_, s)| s.kind.starts_with("spoe-"))
                .filter(|(_, s)| engine.is_none() || s.scope.is_none() || s.scope == engine)
                .collect();
            let fe = Frontend {
                file,
                section,
                filter,
                engine: engine.clone(),
                haproxy: haproxy.clone(),
                spoe,
            };
            fe.check(&mut out);
        }
    }
    if !haproxy
        .iter()
        .any(|(_, s)| s.all(&["filter", "spoe"]).next().is_some())
    {
        let file = files.first().map(|f| f.path.clone()).unwrap_or_default();
        out.push(Finding {
            file,
            line: 1,
            level: Level::Fix,
            what: "no frontend has a `filter spoe` line: no request is inspected".into(),
            add: Some("filter spoe engine coraza config /etc/haproxy/coraza.cfg".into()),
        });
    }
    out
}

/// A rule that ends a request or response: the verbs that refuse one.
fn refuses(l: &Line, directive: &str) -> bool {
    l.words.first().map(String::as_str) == Some(directive)
        && matches!(
            l.words.get(1).map(String::as_str),
            Some("deny" | "return" | "reject" | "silent-drop" | "tarpit")
        )
}

impl Frontend<'_> {
    fn finding(
        &self,
        file: &Path,
        line: usize,
        level: Level,
        what: String,
        add: Option<String>,
    ) -> Finding {
        Finding {
            file: file.to_owned(),
            line,
            level,
            what,
            add,
        }
    }

    fn spoe_section(&self, kind: &str, name: Option<&str>) -> Option<(&Path, &Section)> {
        self.spoe
            .iter()
            .find(|(_, s)| s.kind == kind && name.is_none_or(|n| s.name == n))
            .copied()
    }

    fn check(&self, out: &mut Vec<Finding>) {
        let engine = self.engine.as_deref().unwrap_or("coraza");
        let Some((spoe_file, agent)) = self.spoe_section("spoe-agent", None) else {
            out.push(
                self.finding(
                    self.file,
                    self.filter.no,
                    Level::Fix,
                    "the SPOE file of this filter was not found or has no `spoe-agent`: \
                 pass it to check-haproxy too"
                        .into(),
                    None,
                ),
            );
            return;
        };
        let option = |name: &str| {
            agent
                .find(&["option", name])
                .and_then(|l| l.words.get(2).cloned().map(|v| (v, l.no)))
        };
        let prefix = option("var-prefix").map_or(agent.name.clone(), |(p, _)| p);
        let error_var = option("set-on-error");

        // The request message: sent by a group, or by an event.
        let sends = self.sends("http-request", engine);
        let req_event = self.event_messages(
            agent,
            &["on-frontend-http-request", "on-backend-http-request"],
        );
        let first_send = sends.first().map(|(l, _)| l.no);
        if sends.is_empty() && req_event.is_empty() {
            out.push(self.finding(
                self.file,
                self.section.line,
                Level::Fix,
                format!(
                    "frontend `{}` never sends a request message to the agent",
                    self.section.name
                ),
                Some(format!("http-request send-spoe-group {engine} coraza-req")),
            ));
        }
        let after = first_send.unwrap_or(0);
        let vars = AgentVars {
            agent,
            spoe_file,
            prefix: &prefix,
            error_var: error_var.as_ref(),
        };
        self.fail_closed("http-request", after, &vars, out);

        // Responses, when they are sent.
        let res_sends = self.sends("http-response", engine);
        let res_event = self.event_messages(agent, &["on-http-response"]);
        if !res_sends.is_empty() || !res_event.is_empty() {
            let after = res_sends.first().map_or(0, |(l, _)| l.no);
            self.fail_closed("http-response", after, &vars, out);
        }

        self.request_body(&sends, &req_event, out);
        self.one_at_a_time(agent, spoe_file, out);
        self.backend(agent, spoe_file, out);
        self.notes(agent, spoe_file, &prefix, error_var.as_ref(), &sends, out);
    }

    /// `DIRECTIVE send-spoe-group ENGINE GROUP` lines, with the group's messages.
    fn sends(&self, directive: &str, engine: &str) -> Vec<(&Line, Vec<String>)> {
        self.section
            .all(&[directive, "send-spoe-group"])
            .filter(|l| l.words.get(2).is_none_or(|e| e == engine))
            .map(|l| {
                let group = l.words.get(3).map(String::as_str);
                let messages = self
                    .spoe_section("spoe-group", group)
                    .and_then(|(_, g)| g.find(&["messages"]))
                    .map(|m| m.words[1..].to_vec())
                    .unwrap_or_default();
                (l, messages)
            })
            .collect()
    }

    /// The agent's `messages` whose `event` is one of `events`.
    fn event_messages(&self, agent: &Section, events: &[&str]) -> Vec<String> {
        agent
            .all(&["messages"])
            .flat_map(|l| l.words[1..].to_vec())
            .filter(|m| {
                self.spoe_section("spoe-message", Some(m))
                    .and_then(|(_, s)| s.find(&["event"]))
                    .and_then(|e| e.words.get(1))
                    .is_some_and(|e| events.contains(&e.as_str()))
            })
            .collect()
    }

    fn fail_closed(
        &self,
        directive: &str,
        after: usize,
        vars: &AgentVars<'_>,
        out: &mut Vec<Finding>,
    ) {
        let AgentVars {
            agent,
            spoe_file,
            prefix,
            error_var,
        } = *vars;
        let what = if directive == "http-request" {
            "request"
        } else {
            "response"
        };
        let on = |var: &str| {
            let needle = format!("var(txn.{prefix}.{var})");
            self.section
                .lines
                .iter()
                .filter(|l| refuses(l, directive) && l.text().contains(&needle))
                .collect::<Vec<_>>()
        };
        match error_var {
            None => {
                if directive == "http-request" {
                    out.push(self.finding(
                        spoe_file,
                        agent.line,
                        Level::Fix,
                        format!(
                            "spoe-agent `{}` has no `option set-on-error`: when the agent does not \
                             answer (down, timeout, error) nothing says so, and the {what} passes \
                             uninspected",
                            agent.name
                        ),
                        Some("option set-on-error error".into()),
                    ));
                }
                self.refusal(directive, &on("error"), "error", prefix, after, out);
            }
            Some((var, _)) => self.refusal(directive, &on(var), var, prefix, after, out),
        }
        let verdicts = on("action");
        let deny = verdicts.iter().any(|l| l.text().contains("-m str deny"));
        if !deny {
            out.push(self.finding(
                self.file,
                after.max(self.section.line),
                Level::Fix,
                format!("no `{directive}` rule acts on the agent's `deny`: its verdicts on {what}s are ignored"),
                Some(format!(
                    "{directive} deny deny_status 403 if {{ var(txn.{prefix}.action) -m str deny }}"
                )),
            ));
        }
        self.order(&verdicts, after, out);
    }

    /// The refusal of a request (response) the agent could not answer.
    fn refusal(
        &self,
        directive: &str,
        rules: &[&Line],
        var: &str,
        prefix: &str,
        after: usize,
        out: &mut Vec<Finding>,
    ) {
        let what = if directive == "http-request" {
            "request"
        } else {
            "response"
        };
        if rules.is_empty() {
            out.push(self.finding(
                self.file,
                after.max(self.section.line),
                Level::Fix,
                format!(
                    "nothing refuses a {what} the agent could not answer: it passes uninspected \
                     (fail-open)"
                ),
                Some(format!(
                    "{directive} deny deny_status 500 if {{ var(txn.{prefix}.{var}) -m int gt 0 }}"
                )),
            ));
        }
        self.order(rules, after, out);
    }

    /// Rules that come before the send cannot see what the agent said.
    fn order(&self, rules: &[&Line], after: usize, out: &mut Vec<Finding>) {
        for l in rules.iter().filter(|l| l.no < after) {
            out.push(self.finding(
                self.file,
                l.no,
                Level::Fix,
                format!("this rule runs before the agent is asked (line {after}): it never sees the answer"),
                Some(format!("the same rule after line {after}")),
            ));
        }
    }

    /// Whether the request body reaches the agent whole (see issue notes in docs/spoa.md).
    fn request_body(
        &self,
        sends: &[(&Line, Vec<String>)],
        events: &[String],
        out: &mut Vec<Finding>,
    ) {
        let messages: Vec<&String> = sends.iter().flat_map(|(_, m)| m).chain(events).collect();
        let sends_body = messages.iter().any(|m| {
            self.spoe_section("spoe-message", Some(m))
                .and_then(|(_, s)| s.find(&["args"]))
                .is_some_and(|a| a.words.iter().any(|w| w.ends_with("=req.body")))
        });
        let first_send = sends.first().map(|(l, _)| l.no).unwrap_or(usize::MAX);
        let buffered = self
            .section
            .find(&["option", "http-buffer-request"])
            .is_some()
            || (self
                .defaults_line(
                    self.section.line,
                    self.file,
                    &["option", "http-buffer-request"],
                )
                .is_some()
                && self
                    .section
                    .find(&["no", "option", "http-buffer-request"])
                    .is_none())
            || self
                .section
                .all(&["http-request", "wait-for-body"])
                .any(|l| l.no < first_send);
        if sends_body && !buffered {
            out.push(self.finding(
                self.file,
                self.section.line,
                Level::Fix,
                format!(
                    "frontend `{}` does not wait for request bodies: HAProxy sends the request \
                     message as soon as the headers are in, a body that comes after them (a \
                     browser's upload, `Expect: 100-continue`) cannot be inspected, and the agent \
                     answers such requests with the error variable (spoa_bodies_not_waited_total)",
                    self.section.name
                ),
                Some("option http-buffer-request   (in this frontend)".into()),
            ));
        }
        if !messages.is_empty() && !sends_body {
            out.push(
                self.finding(
                    self.file,
                    self.filter.no,
                    Level::Note,
                    "the request message has no `body=req.body`: request bodies are not inspected"
                        .into(),
                    None,
                ),
            );
        }
    }

    /// One NOTIFY at a time per agent connection (`max-waiting-frames 1`), pipelining and
    /// `async` as HAProxy 2.6 and 3.0 offer them.
    fn one_at_a_time(&self, agent: &Section, spoe_file: &Path, out: &mut Vec<Finding>) {
        let frames = agent.find(&["max-waiting-frames"]);
        if frames.and_then(|l| l.words.get(1)).map(String::as_str) != Some("1") {
            out.push(self.finding(
                spoe_file,
                frames.map_or(agent.line, |l| l.no),
                Level::Fix,
                format!(
                    "spoe-agent `{}` lets HAProxy 2.6 and 3.0 send up to {} NOTIFYs on an agent \
                     connection before the first ACK: an agent's goodbye (a drain, a \
                     rebalancing) can cross one, which HAProxy fails (`st=256` in its log, then \
                     the retry), and a hung agent's connections hold that many messages each; \
                     with 1, HAProxy waits for each ACK and the goodbye rides on it (3.1 and \
                     later ignore the line)",
                    agent.name,
                    frames
                        .and_then(|l| l.words.get(1))
                        .map_or("20 (the default)", String::as_str)
                ),
                Some("max-waiting-frames 1".into()),
            ));
        }
        if let Some(l) = agent.find(&["no", "option", "pipelining"]) {
            out.push(
                self.finding(
                    spoe_file,
                    l.no,
                    Level::Note,
                    "without pipelining HAProxy before 2.6.14 and 2.8 (Debian 12's 2.6.12) leaves \
                     messages queued after an ACK until another one comes (HAProxy bc9fb6462): \
                     requests wait `timeout processing`; `max-waiting-frames 1` gives one message \
                     at a time without it"
                        .into(),
                    Some("max-waiting-frames 1   (in place of this line)".into()),
                ),
            );
        }
        if let Some(l) = agent.find(&["no", "option", "async"]) {
            out.push(
                self.finding(
                    spoe_file,
                    l.no,
                    Level::Note,
                    "HAProxy 2.6 and 3.0 then offer `pipelining` alone, as the multiplexer of 3.1 \
                     and later does, and lastcall-spoa declines it (see the note on `no option \
                     pipelining`)"
                        .into(),
                    Some("remove this line".into()),
                ),
            );
        }
    }

    /// The agents' backend.
    fn backend(&self, agent: &Section, spoe_file: &Path, out: &mut Vec<Finding>) {
        let Some(use_backend) = agent.find(&["use-backend"]) else {
            out.push(self.finding(
                spoe_file,
                agent.line,
                Level::Fix,
                format!("spoe-agent `{}` names no backend", agent.name),
                Some("use-backend coraza-spoa".into()),
            ));
            return;
        };
        let name = use_backend.words.get(1).cloned().unwrap_or_default();
        let Some((file, backend)) = self
            .haproxy
            .iter()
            .find(|(_, s)| (s.kind == "backend" || s.kind == "listen") && s.name == name)
            .copied()
        else {
            out.push(self.finding(
                spoe_file,
                use_backend.no,
                Level::Fix,
                format!("backend `{name}` is not in the HAProxy files given"),
                None,
            ));
            return;
        };
        let servers: Vec<&Line> = backend.all(&["server"]).collect();
        if servers.len() < 2 {
            out.push(self.finding(
                file,
                backend.line,
                Level::Fix,
                format!(
                    "backend `{name}` has {} agent server(s): while one restarts or drains, \
                     requests fail; two or more keep them flowing",
                    servers.len()
                ),
                Some("server spoa2 ADDRESS:PORT check inter 1s fall 2 rise 1".into()),
            ));
        }
        if backend.find(&["option", "spop-check"]).is_none() {
            out.push(self.finding(
                file,
                backend.line,
                Level::Fix,
                format!(
                    "backend `{name}` has no `option spop-check`: HAProxy cannot see that an \
                     agent is draining and keeps sending it requests"
                ),
                Some("option spop-check".into()),
            ));
        }
        for s in servers
            .iter()
            .filter(|s| !s.words.iter().any(|w| w == "check"))
        {
            out.push(self.finding(
                file,
                s.no,
                Level::Fix,
                "this agent server is not health-checked: a draining agent is never marked DOWN".into(),
                Some("check inter 1s fall 2 rise 1 (on this line)".into()),
            ));
        }
        // `fall`: the server line's, else the backend's or the defaults' `default-server`,
        // else HAProxy's default, 3.
        let fall_of = |l: &Line| {
            l.words
                .windows(2)
                .find(|w| w[0] == "fall")
                .and_then(|w| w[1].parse::<u32>().ok())
        };
        let inherited = backend
            .all(&["default-server"])
            .find_map(fall_of)
            .or_else(|| {
                self.defaults_line(backend.line, file, &["default-server"])
                    .and_then(fall_of)
            });
        for s in servers
            .iter()
            .filter(|s| s.words.iter().any(|w| w == "check"))
        {
            let set = fall_of(s).or(inherited);
            let fall = set.unwrap_or(3);
            if fall > crate::engine::DOWN_AFTER_CHECKS {
                out.push(self.finding(
                    file,
                    s.no,
                    Level::Fix,
                    format!(
                        "`fall {fall}`{}: a draining agent leaves once it has refused {} health checks in a row, and HAProxy marks it DOWN only after {fall}; what HAProxy sends it in between fails",
                        if set.is_none() { " (HAProxy's default)" } else { "" },
                        crate::engine::DOWN_AFTER_CHECKS
                    ),
                    Some("fall 2 (on this line)".into()),
                ));
            }
        }
        let mode = backend
            .find(&["mode"])
            .or_else(|| self.defaults_line(backend.line, file, &["mode"]))
            .and_then(|l| l.words.get(1).cloned());
        let shuts = |l: &Line| {
            l.words
                .windows(2)
                .any(|w| w[0] == "on-marked-down" && w[1] == "shutdown-sessions")
        };
        let by_default = backend.all(&["default-server"]).any(shuts)
            || self
                .defaults_line(backend.line, file, &["default-server"])
                .is_some_and(shuts);
        if mode.as_deref() == Some("spop") {
            // HAProxy 3.1+ (only it knows `mode spop`): its multiplexer gets its HELLOs served
            // while the agent drains, and `shutdown-sessions` would cut them at DOWN.
            for s in servers.iter().filter(|s| by_default || shuts(s)) {
                out.push(self.finding(
                    file,
                    s.no,
                    Level::Fix,
                    "on HAProxy 3.1+ (`mode spop`) `on-marked-down shutdown-sessions` closes, when \
                     a draining agent is marked DOWN, the connections HAProxy opened to it while \
                     it was refusing, and fails their messages (4-32 per drain measured behind \
                     3.2.26); without it a hung agent costs one `timeout processing` and the \
                     retry asks another agent"
                        .into(),
                    Some("this server without `on-marked-down shutdown-sessions`".into()),
                ));
            }
        } else {
            for s in servers.iter().filter(|s| !by_default && !shuts(s)) {
                out.push(
                    self.finding(
                        file,
                        s.no,
                        Level::Fix,
                        "a hung agent (a stopped process, a frozen node) keeps this server's \
                     connections after HAProxy marks it DOWN: the messages on them wait `timeout \
                     processing`; with this, HAProxy 2.6 and 3.0 close them at DOWN and the retry \
                     asks another agent (a draining agent has said goodbye on every connection \
                     and waits for its DOWN before it leaves)"
                            .into(),
                        Some("on-marked-down shutdown-sessions (on this line)".into()),
                    ),
                );
            }
        }
        if mode.as_deref() != Some("spop") && mode.as_deref() != Some("tcp") {
            out.push(self.finding(
                file,
                backend.line,
                Level::Fix,
                format!(
                    "backend `{name}` is in mode {}: an SPOE backend must be `mode tcp` \
                     (HAProxy 2.6, 3.0) or `mode spop` (3.1+)",
                    mode.as_deref().unwrap_or("http (the default here)")
                ),
                Some("mode tcp".into()),
            ));
        }
    }

    /// A line of the last `defaults` section before `line` of `file`.
    fn defaults_line(&self, line: usize, file: &Path, prefix: &[&str]) -> Option<&Line> {
        self.haproxy
            .iter()
            .rfind(|(f, s)| s.kind == "defaults" && *f == file && s.line < line)
            .and_then(|(_, s)| s.find(prefix))
    }

    fn notes(
        &self,
        agent: &Section,
        spoe_file: &Path,
        prefix: &str,
        error_var: Option<&(String, usize)>,
        sends: &[(&Line, Vec<String>)],
        out: &mut Vec<Finding>,
    ) {
        let var = error_var.map_or("error", |(v, _)| v.as_str());
        let retried = sends.len() >= 2
            && sends
                .iter()
                .skip(1)
                .any(|(l, _)| l.text().contains(&format!("txn.{prefix}.")));
        if agent.find(&["option", "continue-on-error"]).is_none() || !retried {
            out.push(self.finding(
                spoe_file,
                agent.line,
                Level::Note,
                "no retry: a request queued on an agent connection that closes under it (an agent \
                 cut at its deadline) fails instead of being asked again"
                    .into(),
                Some(format!(
                    "option continue-on-error   (here), and in the frontend after the send:\n\
                     http-request set-var(txn.{prefix}.retried) bool(true) if {{ var(txn.{prefix}.{var}) -m int gt 0 }}\n\
                     http-request unset-var(txn.{prefix}.{var}) if {{ var(txn.{prefix}.retried) -m bool }}\n\
                     http-request send-spoe-group {} coraza-req if {{ var(txn.{prefix}.retried) -m bool }}",
                    self.engine.as_deref().unwrap_or("coraza")
                )),
            ));
        }
        if let Some(l) = agent.find(&["timeout", "processing"]) {
            let ms = l
                .words
                .get(2)
                .and_then(|v| lastcall::duration::parse(v).ok());
            if ms.is_some_and(|d| d < std::time::Duration::from_secs(1)) {
                out.push(self.finding(
                    spoe_file,
                    l.no,
                    Level::Note,
                    "a verdict must come within this, queueing included: under load this turns \
                     slowness into errors (docs/spoa.md uses 5s)"
                        .into(),
                    Some("timeout processing 5s".into()),
                ));
            }
        }
        for l in agent
            .all(&["timeout", "hello"])
            .chain(agent.all(&["timeout", "idle"]))
        {
            out.push(self.finding(
                spoe_file,
                l.no,
                Level::Note,
                "ignored by HAProxy 3.1 and later: there the agents' backend's `timeout connect` \
                 and `timeout server` apply (and `timeout server` closes idle agent connections)"
                    .into(),
                None,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse::sections;
    use super::*;

    fn files(haproxy: &str, spoe: &str) -> Vec<File> {
        vec![
            File {
                path: "haproxy.cfg".into(),
                sections: sections(haproxy),
            },
            File {
                path: "coraza.cfg".into(),
                sections: sections(spoe),
            },
        ]
    }

    fn shown(f: &[Finding]) -> Vec<String> {
        f.iter()
            .map(|f| format!("{}:{} {:?} {}", f.file.display(), f.line, f.level, f.what))
            .collect()
    }

    const GOOD_SPOE: &str = "\
[coraza]
spoe-agent coraza-agent
    groups coraza-req
    option var-prefix coraza
    option set-on-error error
    option continue-on-error
    timeout processing 2s
    max-waiting-frames 1
    use-backend coraza-spoa
spoe-message coraza-req
    args app=str(a) method=method path=path body=req.body
spoe-group coraza-req
    messages coraza-req
";

    const GOOD_HAPROXY: &str = "\
defaults
    mode http
frontend web
    bind :80
    option http-buffer-request
    filter spoe engine coraza config coraza.cfg
    http-request send-spoe-group coraza coraza-req
    http-request set-var(txn.coraza.retried) bool(true) if { var(txn.coraza.error) -m int gt 0 }
    http-request unset-var(txn.coraza.error) if { var(txn.coraza.retried) -m bool }
    http-request send-spoe-group coraza coraza-req if { var(txn.coraza.retried) -m bool }
    http-request deny deny_status 403 if { var(txn.coraza.action) -m str deny }
    http-request deny deny_status 500 if { var(txn.coraza.error) -m int gt 0 }
backend coraza-spoa
    mode tcp
    option spop-check
    server s1 127.0.0.1:9000 check fall 2 on-marked-down shutdown-sessions
    server s2 127.0.0.1:9001 check fall 2 on-marked-down shutdown-sessions
";

    /// Without `option http-buffer-request` (here, or in the defaults) or a `wait-for-body`
    /// before the send, a body sent after the headers never reaches the agent.
    #[test]
    fn a_frontend_that_does_not_wait_for_bodies_is_named() {
        let without = GOOD_HAPROXY.replace("    option http-buffer-request\n", "");
        let f = check(&files(&without, GOOD_SPOE));
        assert_eq!(
            shown(&f),
            ["haproxy.cfg:3 Fix frontend `web` does not wait for request bodies: HAProxy sends the request message as soon as the headers are in, a body that comes after them (a browser's upload, `Expect: 100-continue`) cannot be inspected, and the agent answers such requests with the error variable (spoa_bodies_not_waited_total)"]
        );
        assert_eq!(
            f[0].add.as_deref(),
            Some("option http-buffer-request   (in this frontend)")
        );
        let in_defaults = without.replace(
            "    mode http\n",
            "    mode http\n    option http-buffer-request\n",
        );
        assert!(check(&files(&in_defaults, GOOD_SPOE)).is_empty());
        let turned_off = in_defaults.replace(
            "    bind :80\n",
            "    bind :80\n    no option http-buffer-request\n",
        );
        assert_eq!(check(&files(&turned_off, GOOD_SPOE)).len(), 1);
        let waits = without.replace(
            "    filter spoe",
            "    http-request wait-for-body time 10s\n    filter spoe",
        );
        assert!(check(&files(&waits, GOOD_SPOE)).is_empty());
        let waits_too_late = without.replace(
            "    http-request deny deny_status 403",
            "    http-request wait-for-body time 10s\n    http-request deny deny_status 403",
        );
        assert_eq!(check(&files(&waits_too_late, GOOD_SPOE)).len(), 1);
        let no_body = GOOD_SPOE.replace(" body=req.body", "");
        let f = check(&files(&without, &no_body));
        assert!(f.iter().all(|f| f.level == Level::Note), "{:#?}", shown(&f));
    }

    /// A goodbye that crosses nothing needs one NOTIFY at a time (`max-waiting-frames 1`); a
    /// hung agent's connections are closed at DOWN with `on-marked-down shutdown-sessions`
    /// (on each server, or on a `default-server` of the backend or of the defaults).
    #[test]
    fn one_message_at_a_time_and_the_hung_agent() {
        const SPOP: &str = "on HAProxy 3.1+ (`mode spop`) `on-marked-down shutdown-sessions` closes, when a draining agent is marked DOWN, the connections HAProxy opened to it while it was refusing, and fails their messages (4-32 per drain measured behind 3.2.26); without it a hung agent costs one `timeout processing` and the retry asks another agent";
        let table: Vec<(String, String, Vec<&str>)> = vec![
            (
                GOOD_HAPROXY.to_string(),
                GOOD_SPOE.replace("    max-waiting-frames 1\n", ""),
                vec!["coraza.cfg:2 Fix spoe-agent `coraza-agent` lets HAProxy 2.6 and 3.0 send up to 20 (the default) NOTIFYs on an agent connection before the first ACK: an agent's goodbye (a drain, a rebalancing) can cross one, which HAProxy fails (`st=256` in its log, then the retry), and a hung agent's connections hold that many messages each; with 1, HAProxy waits for each ACK and the goodbye rides on it (3.1 and later ignore the line)"],
            ),
            (
                GOOD_HAPROXY.to_string(),
                GOOD_SPOE.replace("max-waiting-frames 1", "max-waiting-frames 5"),
                vec!["coraza.cfg:8 Fix spoe-agent `coraza-agent` lets HAProxy 2.6 and 3.0 send up to 5 NOTIFYs on an agent connection before the first ACK: an agent's goodbye (a drain, a rebalancing) can cross one, which HAProxy fails (`st=256` in its log, then the retry), and a hung agent's connections hold that many messages each; with 1, HAProxy waits for each ACK and the goodbye rides on it (3.1 and later ignore the line)"],
            ),
            (
                GOOD_HAPROXY.to_string(),
                GOOD_SPOE.replace("    max-waiting-frames 1\n", "    max-waiting-frames 1\n    no option pipelining\n    no option async\n"),
                vec![
                    "coraza.cfg:9 Note without pipelining HAProxy before 2.6.14 and 2.8 (Debian 12's 2.6.12) leaves messages queued after an ACK until another one comes (HAProxy bc9fb6462): requests wait `timeout processing`; `max-waiting-frames 1` gives one message at a time without it",
                    "coraza.cfg:10 Note HAProxy 2.6 and 3.0 then offer `pipelining` alone, as the multiplexer of 3.1 and later does, and lastcall-spoa declines it (see the note on `no option pipelining`)",
                ],
            ),
            (
                GOOD_HAPROXY.replace(" on-marked-down shutdown-sessions", ""),
                GOOD_SPOE.to_string(),
                vec![
                    "haproxy.cfg:16 Fix a hung agent (a stopped process, a frozen node) keeps this server's connections after HAProxy marks it DOWN: the messages on them wait `timeout processing`; with this, HAProxy 2.6 and 3.0 close them at DOWN and the retry asks another agent (a draining agent has said goodbye on every connection and waits for its DOWN before it leaves)",
                    "haproxy.cfg:17 Fix a hung agent (a stopped process, a frozen node) keeps this server's connections after HAProxy marks it DOWN: the messages on them wait `timeout processing`; with this, HAProxy 2.6 and 3.0 close them at DOWN and the retry asks another agent (a draining agent has said goodbye on every connection and waits for its DOWN before it leaves)",
                ],
            ),
            (
                GOOD_HAPROXY.replace(" on-marked-down shutdown-sessions", "").replace(
                    "    option spop-check\n",
                    "    option spop-check\n    default-server inter 1s on-marked-down shutdown-sessions\n",
                ),
                GOOD_SPOE.to_string(),
                vec![],
            ),
            (
                GOOD_HAPROXY
                    .replace(" on-marked-down shutdown-sessions", "")
                    .replace("    mode http\n", "    mode http\n    default-server on-marked-down shutdown-sessions\n"),
                GOOD_SPOE.to_string(),
                vec![],
            ),
            // HAProxy 3.1+ (`mode spop`): the other way round.
            (
                GOOD_HAPROXY.replace("    mode tcp\n", "    mode spop\n"),
                GOOD_SPOE.to_string(),
                vec![
                    "haproxy.cfg:16 Fix SPOP",
                    "haproxy.cfg:17 Fix SPOP",
                ],
            ),
            (
                GOOD_HAPROXY
                    .replace("    mode tcp\n", "    mode spop\n")
                    .replace(" on-marked-down shutdown-sessions", ""),
                GOOD_SPOE.to_string(),
                vec![],
            ),
        ];
        for (haproxy, spoe, want) in table {
            let f = check(&files(&haproxy, &spoe));
            let want: Vec<String> = want.iter().map(|w| w.replace("SPOP", SPOP)).collect();
            assert_eq!(shown(&f), want, "{haproxy}\n{spoe}");
        }
        let f = check(&files(
            GOOD_HAPROXY,
            &GOOD_SPOE.replace("    max-waiting-frames 1\n", ""),
        ));
        assert_eq!(f[0].add.as_deref(), Some("max-waiting-frames 1"));
    }

    /// A draining agent leaves after `DOWN_AFTER_CHECKS` (2) refused checks: a server whose
    /// `fall` is higher (HAProxy's default is 3) would still have it UP then.
    #[test]
    fn a_fall_above_two_is_named() {
        const FALL: &str = "a draining agent leaves once it has refused 2 health checks in a row, and HAProxy marks it DOWN only after";
        let table: Vec<(String, Vec<&str>)> = vec![
            (
                GOOD_HAPROXY.replace(" fall 2", ""),
                vec!["16 3 (HAProxy's default)", "17 3 (HAProxy's default)"],
            ),
            (GOOD_HAPROXY.replacen(" fall 2", " fall 4", 1), vec!["16 4"]),
            (GOOD_HAPROXY.replacen(" fall 2", " fall 1", 1), vec![]),
            (
                GOOD_HAPROXY.replace(" fall 2", "").replace(
                    "    option spop-check\n",
                    "    option spop-check\n    default-server fall 2\n",
                ),
                vec![],
            ),
            (
                GOOD_HAPROXY.replace(" fall 2", "").replace(
                    "    mode http\n",
                    "    mode http\n    default-server fall 3\n",
                ),
                vec!["17 3", "18 3"],
            ),
        ];
        for (haproxy, want) in table {
            let f = check(&files(&haproxy, GOOD_SPOE));
            let want: Vec<String> = want
                .iter()
                .map(|w| {
                    let (line, fall) = w.split_once(' ').expect("line fall");
                    let n = fall.split(' ').next().unwrap_or(fall);
                    let default = fall.strip_prefix(n).unwrap_or("");
                    format!("haproxy.cfg:{line} Fix `fall {n}`{default}: {FALL} {n}; what HAProxy sends it in between fails")
                })
                .collect();
            assert_eq!(shown(&f), want, "{haproxy}");
            assert!(f
                .iter()
                .all(|f| f.add.as_deref() == Some("fall 2 (on this line)")));
        }
    }

    #[test]
    fn the_recommended_setup_has_nothing_to_fix() {
        let f = check(&files(GOOD_HAPROXY, GOOD_SPOE));
        assert!(f.is_empty(), "{:#?}", shown(&f));
    }

    /// coraza-spoa's example as it ships: fail-closed already, one agent without a
    /// second server, no retry, 500ms.
    #[test]
    fn coraza_spoa_example_shape() {
        let haproxy = GOOD_HAPROXY
            .replace(
                "    server s2 127.0.0.1:9001 check fall 2 on-marked-down shutdown-sessions\n",
                "",
            )
            .replace(" fall 2", "")
            .replace("    option spop-check\n", "");
        let spoe = GOOD_SPOE
            .replace("    option continue-on-error\n", "")
            .replace("2s", "500ms");
        let f = check(&files(&haproxy, &spoe));
        assert_eq!(
            shown(&f),
            [
                "haproxy.cfg:13 Fix backend `coraza-spoa` has 1 agent server(s): while one restarts or drains, requests fail; two or more keep them flowing",
                "haproxy.cfg:13 Fix backend `coraza-spoa` has no `option spop-check`: HAProxy cannot see that an agent is draining and keeps sending it requests",
                "haproxy.cfg:15 Fix `fall 3` (HAProxy's default): a draining agent leaves once it has refused 2 health checks in a row, and HAProxy marks it DOWN only after 3; what HAProxy sends it in between fails",
                "coraza.cfg:2 Note no retry: a request queued on an agent connection that closes under it (an agent cut at its deadline) fails instead of being asked again",
                "coraza.cfg:6 Note a verdict must come within this, queueing included: under load this turns slowness into errors (docs/spoa.md uses 5s)",
            ]
        );
    }

    #[test]
    fn fail_open_and_misplaced_rules_are_named() {
        let haproxy = GOOD_HAPROXY
            .replace("    http-request deny deny_status 500 if { var(txn.coraza.error) -m int gt 0 }\n", "")
            .replace(
                "    filter spoe engine coraza config coraza.cfg\n",
                "    filter spoe engine coraza config coraza.cfg\n    http-request deny if { var(txn.coraza.action) -m str deny }\n",
            );
        let spoe = GOOD_SPOE.replace("    option set-on-error error\n", "");
        let f = check(&files(&haproxy, &spoe));
        let s = shown(&f);
        assert!(
            s.iter().any(|l| l.starts_with(
                "coraza.cfg:2 Fix spoe-agent `coraza-agent` has no `option set-on-error`"
            )),
            "{s:#?}"
        );
        assert!(
            s.iter().any(|l| l.starts_with(
                "haproxy.cfg:8 Fix nothing refuses a request the agent could not answer"
            )),
            "{s:#?}"
        );
        assert!(
            s.iter().any(|l| l.starts_with(
                "haproxy.cfg:7 Fix this rule runs before the agent is asked (line 8)"
            )),
            "{s:#?}"
        );
    }

    #[test]
    fn responses_sent_by_event_need_their_own_rules() {
        let spoe = format!(
            "{GOOD_SPOE}spoe-message coraza-res\n    args app=str(a) id=var(txn.coraza.id)\n    event on-http-response\n"
        )
        .replace("    groups coraza-req\n", "    groups coraza-req\n    messages coraza-res\n");
        let f = check(&files(GOOD_HAPROXY, &spoe));
        let s = shown(&f);
        assert_eq!(s.len(), 2, "{s:#?}");
        assert!(s[0].contains("nothing refuses a response"), "{s:#?}");
        assert!(
            s[1].contains("no `http-response` rule acts on the agent's `deny`"),
            "{s:#?}"
        );
    }

    #[test]
    fn no_filter_no_message_no_backend() {
        let f = check(&files("frontend web\n    bind :80\n", GOOD_SPOE));
        assert_eq!(f.len(), 1);
        assert!(f[0].what.contains("no frontend has a `filter spoe` line"));
        let haproxy = "frontend web\n    filter spoe engine coraza config coraza.cfg\n    http-request deny if { var(txn.coraza.action) -m str deny } { var(txn.coraza.error) -m int gt 0 }\n";
        let s = shown(&check(&files(haproxy, GOOD_SPOE)));
        assert!(
            s.iter()
                .any(|l| l.contains("never sends a request message")),
            "{s:#?}"
        );
        assert!(
            s.iter()
                .any(|l| l.contains("backend `coraza-spoa` is not in the HAProxy files given")),
            "{s:#?}"
        );
    }

    #[test]
    fn haproxy_31_timeouts_are_a_note() {
        let spoe = GOOD_SPOE.replace(
            "    timeout processing 2s\n",
            "    timeout hello 2s\n    timeout idle 2m\n    timeout processing 2s\n",
        );
        let f = check(&files(GOOD_HAPROXY, &spoe));
        assert_eq!(f.len(), 2, "{:#?}", shown(&f));
        assert!(f
            .iter()
            .all(|f| f.level == Level::Note && f.what.contains("3.1")));
    }
}
