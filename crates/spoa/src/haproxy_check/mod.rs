//! `lastcall-spoa check-haproxy FILE...`: reads a user's HAProxy and SPOE files and says,
//! line by line, what differs from the fail-closed, lossless setup of `docs/spoa.md`, and
//! what to add.
//!
//! - `parse`: HAProxy's syntax (sections, words);
//! - `rules`: what is checked, on parsed files (sans-IO, table-tested);
//! - here: reading the files (and the SPOE files their `filter spoe` lines name) and
//!   printing the findings.

mod parse;
mod rules;

use std::path::{Path, PathBuf};

pub(crate) use rules::{check, Finding, Level};

/// A configuration file, read and parsed.
#[derive(Debug, Clone)]
pub(crate) struct File {
    /// Its path, as given or as a `filter spoe` line named it.
    pub(crate) path: PathBuf,
    /// Its sections.
    pub(crate) sections: Vec<parse::Section>,
}

/// Exit status: nothing to add.
pub(crate) const OK: i32 = 0;
/// Exit status: findings that change what HAProxy does (fail-closed or lossless).
pub(crate) const FINDINGS: i32 = 1;

/// Runs the check on `files`, prints the findings, returns the exit status (64 when a file
/// cannot be read).
pub fn run(paths: &[PathBuf]) -> i32 {
    let mut files = Vec::new();
    for path in paths {
        match read(path) {
            Ok(f) => files.push(f),
            Err(e) => {
                eprintln!("lastcall-spoa check-haproxy: {}: {e}", path.display());
                return lastcall::exit::CONFIG;
            }
        }
    }
    // The SPOE files the `filter spoe` lines name, when they were not given.
    let mut named = Vec::new();
    for f in &files {
        for path in rules::spoe_paths(f) {
            let known = files
                .iter()
                .chain(&named)
                .any(|g: &File| same_file(&g.path, &path));
            if !known {
                if let Ok(g) = read(&path) {
                    named.push(g);
                }
            }
        }
    }
    files.extend(named);
    let mut findings = check(&files);
    // Read top to bottom: file by file in the order given, line by line in each.
    findings.sort_by_key(|f| {
        let file = files.iter().position(|g| g.path == f.file);
        (file, f.line)
    });
    print!("{}", report(&findings));
    if findings.iter().any(|f| f.level == Level::Fix) {
        FINDINGS
    } else {
        OK
    }
}

/// The findings as printed: `FILE:LINE: what`, then `    add: ...`, then a summary.
pub(crate) fn report(findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        let level = match f.level {
            Level::Fix => "",
            Level::Note => "note: ",
        };
        out.push_str(&format!(
            "{}:{}: {level}{}\n",
            f.file.display(),
            f.line,
            f.what
        ));
        if let Some(add) = &f.add {
            for (i, l) in add.lines().enumerate() {
                let lead = if i == 0 { "    add: " } else { "         " };
                out.push_str(&format!("{lead}{l}\n"));
            }
        }
    }
    let fixes = findings.iter().filter(|f| f.level == Level::Fix).count();
    let notes = findings.len() - fixes;
    if fixes == 0 {
        out.push_str(&format!(
            "fail-closed and lossless as docs/spoa.md recommends ({notes} note(s))\n"
        ));
    } else {
        out.push_str(&format!("{fixes} to fix, {notes} note(s)\n"));
    }
    out
}

fn read(path: &Path) -> std::io::Result<File> {
    let text = std::fs::read_to_string(path)?;
    Ok(File {
        path: path.to_owned(),
        sections: parse::sections(&text),
    })
}

fn same_file(a: &Path, b: &Path) -> bool {
    a == b
        || match (a.canonicalize(), b.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
}
