//! Output: plain lines, and a live progress line (rewritten in place on a terminal, printed
//! every few seconds otherwise, e.g. in CI). Write errors (a closed pipe) are ignored.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Prints a line to stdout, ignoring write errors.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, $($arg)*);
        let _ = out.flush();
    }};
}

/// The live progress line.
pub(crate) struct Ticker {
    tty: bool,
    /// Terminal width (progress lines are cut to fit, so `\r` can rewrite them).
    columns: usize,
    every: Duration,
    last: Option<Instant>,
    shown: bool,
    origin: Instant,
}

impl Ticker {
    /// `origin` is the demo's start (the line shows seconds since then).
    pub(crate) fn new(origin: Instant) -> Ticker {
        let tty = std::io::stdout().is_terminal();
        let every = if tty {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(1)
        };
        Ticker {
            tty,
            columns: if tty { columns() } else { usize::MAX },
            every,
            last: None,
            shown: false,
            origin,
        }
    }

    /// Whether a progress line is due now.
    pub(crate) fn due(&self) -> bool {
        self.last.is_none_or(|l| l.elapsed() >= self.every)
    }

    /// Shows `line` if a progress line is due.
    pub(crate) fn tick(&mut self, line: impl FnOnce() -> String) {
        if !self.due() {
            return;
        }
        self.last = Some(Instant::now());
        let text = format!(
            "  [{:5.1}s] {}",
            self.origin.elapsed().as_secs_f64(),
            line()
        );
        let mut out = std::io::stdout().lock();
        if self.tty {
            let text: String = text.chars().take(self.columns.saturating_sub(1)).collect();
            let _ = write!(out, "\r\x1b[2K{text}");
            self.shown = true;
        } else {
            let _ = writeln!(out, "{text}");
        }
        let _ = out.flush();
    }

    /// Prints an event on its own line (above the progress line on a terminal).
    pub(crate) fn event(&mut self, msg: &str) {
        self.clear();
        say!("  [{:5.1}s] {msg}", self.origin.elapsed().as_secs_f64());
        // The next progress line comes one interval after the event.
        self.last = Some(Instant::now());
    }

    /// Removes the progress line (on a terminal).
    pub(crate) fn clear(&mut self) {
        if self.tty && self.shown {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "\r\x1b[2K");
            let _ = out.flush();
            self.shown = false;
        }
    }
}

/// The terminal's width: `$COLUMNS`, else `stty size`, else 80.
fn columns() -> usize {
    if let Some(c) = std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()) {
        return c;
    }
    std::fs::File::open("/dev/tty")
        .ok()
        .and_then(|tty| {
            std::process::Command::new("stty")
                .arg("size")
                .stdin(tty)
                .stderr(std::process::Stdio::null())
                .output()
                .ok()
        })
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
        })
        .filter(|c: &usize| *c >= 20)
        .unwrap_or(80)
}
