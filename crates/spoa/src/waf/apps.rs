//! The applications of a configuration, compiled: one rule set per application, shared by
//! every evaluation (`Arc`), and swapped all at once by a reload.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use lastcall_modsec::{crs, RuleSet};

use crate::config::{Application, Config};

/// One compiled application.
#[derive(Debug)]
pub struct App {
    /// Its configuration.
    pub config: Application,
    /// Its compiled rules.
    pub rules: Arc<RuleSet>,
}

/// All applications, as swapped by a reload.
#[derive(Debug, Default)]
pub struct Apps {
    by_name: HashMap<String, Arc<App>>,
    default: Option<Arc<App>>,
}

impl Apps {
    /// Compiles every application of `cfg`; all compile errors are returned together.
    pub fn compile(cfg: &Config) -> Result<Apps, Vec<String>> {
        Self::compile_unless(cfg, &AtomicBool::new(false))
            .unwrap_or_else(|| Err(vec!["compilation cancelled".into()]))
    }

    /// Like [`compile`](Self::compile), but checks `cancel` before each application and
    /// returns `None` once it is set (a signal during start-up: the process then exits
    /// normally, never while libmodsecurity is compiling on another thread).
    pub fn compile_unless(cfg: &Config, cancel: &AtomicBool) -> Option<Result<Apps, Vec<String>>> {
        let mut apps = Apps::default();
        let mut errors = Vec::new();
        for a in &cfg.applications {
            if cancel.load(Ordering::SeqCst) {
                return None;
            }
            let text = directives_for(a);
            match RuleSet::from_directives(&text, &format!("application {}", a.name)) {
                Ok(rules) => {
                    let app = Arc::new(App {
                        config: a.clone(),
                        rules,
                    });
                    apps.by_name.insert(a.name.clone(), app);
                }
                Err(e) => errors.push(format!("application `{}`: {e}", a.name)),
            }
        }
        if !errors.is_empty() {
            return Some(Err(errors));
        }
        apps.default = cfg
            .default_application
            .as_ref()
            .and_then(|d| apps.by_name.get(d).cloned());
        Some(Ok(apps))
    }

    pub(super) fn find(&self, name: &str) -> Option<Arc<App>> {
        self.by_name.get(name).or(self.default.as_ref()).cloned()
    }

    /// Total rules compiled (logs).
    pub fn rule_count(&self) -> usize {
        self.by_name.values().map(|a| a.rules.rule_count()).sum()
    }
}

/// The SecLang text an application runs.
pub fn directives_for(a: &Application) -> String {
    match &a.directives {
        None => crs::debian_default_directives(&crs::CrsOptions {
            paranoia_level: a.paranoia_level,
            detect_only: a.detect_only,
            response_check: a.response_check,
            ..crs::CrsOptions::default()
        }),
        Some(d) if a.detect_only => format!("{d}\nSecRuleEngine DetectionOnly\n"),
        Some(d) => d.clone(),
    }
}
