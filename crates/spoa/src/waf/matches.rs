//! What a transaction matched: coraza-spoa's variables (`rules_hit`, `anomaly_score`,
//! `rule_ids`, an intervention's `action`, `status`, `data`, `ruleid`) and one log line per
//! matched rule.

use lastcall_modsec::{Intervention, MatchReport, Transaction};
use spop::TypedData;

use super::App;
use crate::engine::Vars;
use crate::log::{RuleLines, RULE_TARGET};

/// Whether coraza-spoa counts rule `id` in `rules_hit` and `rule_ids`: CRS's attack ranges
/// (910000-959999) and the range its README gives local attack rules (190000-199999).
/// Exclusions, set-up and correlation rules are not attacks.
pub fn is_attack_rule(id: u32) -> bool {
    (910_000..960_000).contains(&id) || (190_000..200_000).contains(&id)
}

/// The attack rules a transaction matched so far, once each, in order (rules without a
/// message are control flow, not matches).
fn attack_rules(report: &MatchReport) -> Vec<u32> {
    let mut ids = Vec::new();
    for m in report.matches() {
        if is_attack_rule(m.id) && !m.msg.is_empty() && !ids.contains(&m.id) {
            ids.push(m.id);
        }
    }
    ids
}

/// coraza-spoa's variables for what a transaction matched: `rules_hit` (how many attack
/// rules), `anomaly_score` (CRS's inbound score), and with `exportRuleIDs` `rule_ids` (their
/// ids, comma-separated).
pub(super) fn match_vars(report: &MatchReport, export_rule_ids: bool, vars: &mut Vars) {
    let ids = attack_rules(report);
    vars.push(("rules_hit", TypedData::Int64(ids.len() as i64)));
    vars.push((
        "anomaly_score",
        TypedData::Int64(i64::from(report.estimated_inbound_score())),
    ));
    if export_rule_ids {
        let joined = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        vars.push(("rule_ids", TypedData::String(joined)));
    }
}

/// The variables of a disruptive intervention: `action`, `status`, `data`, `ruleid`.
/// The action a transaction ended with, as `coraza_actions_total` and the `action`
/// variable name it: `redirect` for an intervention with a URL, `deny` for another,
/// `allow` without one.
pub(super) fn action_name(it: Option<&Intervention>) -> &'static str {
    match it {
        Some(it) if it.url.is_some() => "redirect",
        Some(_) => "deny",
        None => "allow",
    }
}

pub(super) fn intervention_vars(it: &Intervention, report: &MatchReport, vars: &mut Vars) -> u32 {
    let action = action_name(Some(it));
    let data = it.url.clone().unwrap_or_default();
    let rule = it
        .rule_id()
        .or_else(|| {
            report
                .matches()
                .iter()
                .rev()
                .find(|m| m.disruptive)
                .map(|m| m.id)
        })
        .unwrap_or(0);
    vars.push(("action", TypedData::String(action.into())));
    vars.push(("status", TypedData::Int64(i64::from(it.status))));
    vars.push(("data", TypedData::String(data)));
    vars.push(("ruleid", TypedData::Int64(i64::from(rule))));
    rule
}

/// What a log line says about the request a rule matched in.
pub(super) struct Context<'a> {
    pub(super) tx: &'a str,
    pub(super) app: &'a App,
    pub(super) client: &'a str,
    pub(super) uri: &'a str,
}

/// Where each phase's log lines end in a transaction's report: libmodsecurity's lines,
/// but for a disruptive one, do not say their phase; the call that produced them does.
#[derive(Debug, Default, Clone)]
pub(super) struct Phases(pub(super) Vec<(usize, u8)>);

impl Phases {
    /// SecLang phase `phase` has run on `tx`: the lines logged so far and not yet placed
    /// are its.
    pub(super) fn ended(&mut self, tx: &Transaction, phase: u8) {
        self.0.push((tx.report().matches().len(), phase));
    }

    /// The phase of the report's `index`th line.
    pub(super) fn of(&self, index: usize) -> Option<u8> {
        self.0
            .iter()
            .find(|(end, _)| index < *end)
            .map(|&(_, phase)| phase)
    }
}

/// One log line per matched rule (the report's lines from `from` on), at the level
/// coraza-spoa gives its severity (WARNING warn, NOTICE and INFO info, DEBUG debug,
/// anything graver error): coraza-spoa's JSON object under `match`, or fields.
pub(super) fn log_matches(cx: &Context<'_>, report: &MatchReport, from: usize, phases: &Phases) {
    let matches = report.matches().get(from..).unwrap_or_default();
    if matches.is_empty() {
        return;
    }
    cx.app.in_log(|| {
        let coraza = cx.app.rule_lines() == RuleLines::Coraza;
        let req = crate::log::Request {
            tx: cx.tx,
            client: cx.client,
            uri: cx.uri,
        };
        for (i, m) in matches.iter().enumerate() {
            let phase = m.phase.or_else(|| phases.of(from + i));
            if coraza {
                macro_rules! line {
                    ($level:ident) => {
                        tracing::$level!(
                            target: RULE_TARGET,
                            coraza_match = crate::log::coraza_match(m, phase, &req).as_str(),
                            "rule matched"
                        )
                    };
                }
                match m.severity {
                    Some(4) => line!(warn),
                    Some(5 | 6) => line!(info),
                    Some(7) => line!(debug),
                    _ => line!(error),
                }
                continue;
            }
            let severity = m.severity.map_or("", severity_name);
            let tags = m.tags.join(",");
            macro_rules! line {
                ($level:ident) => {
                    tracing::$level!(
                        target: RULE_TARGET,
                        tx = cx.tx,
                        app = %cx.app.config.name,
                        rule_id = m.id,
                        severity,
                        msg = m.msg.as_str(),
                        data = m.data.as_str(),
                        tags = tags.as_str(),
                        disruptive = m.disruptive,
                        ambiguous = m.ambiguous.then_some(true),
                        file = m.file.as_str(),
                        line = m.file_line,
                        phase = phase.unwrap_or(0),
                        client = cx.client,
                        uri = cx.uri,
                        "rule matched"
                    )
                };
            }
            match m.severity {
                Some(4) => line!(warn),
                Some(5 | 6) => line!(info),
                Some(7) => line!(debug),
                _ => line!(error),
            }
        }
    });
}

fn severity_name(s: u8) -> &'static str {
    match s {
        0 => "EMERGENCY",
        1 => "ALERT",
        2 => "CRITICAL",
        3 => "ERROR",
        4 => "WARNING",
        5 => "NOTICE",
        6 => "INFO",
        _ => "DEBUG",
    }
}
