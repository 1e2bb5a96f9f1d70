//! Logging options (`--log-format`, `--log-level`) and the tracing subscriber behind them.
//!
//! Logs go to stderr, one line per event, as text (the default) or JSON objects; a daemon
//! may send them elsewhere ([`init_to`]) or build more subscribers of the same format for
//! logs of their own ([`dispatch`]).

use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging options, to `#[command(flatten)]` into a daemon's CLI.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Log format on stderr
    #[arg(
        long,
        env = "LASTCALL_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text,
        value_name = "FORMAT"
    )]
    pub log_format: LogFormat,

    /// Log level or tracing filter directives (e.g. `debug`, `info,lastcall=debug`)
    #[arg(
        long,
        env = "LASTCALL_LOG_LEVEL",
        default_value = "info",
        value_name = "LEVEL",
        value_parser = parse_filter
    )]
    pub log_level: String,
}

impl Default for LogArgs {
    fn default() -> Self {
        LogArgs {
            log_format: LogFormat::Text,
            log_level: "info".to_string(),
        }
    }
}

fn parse_filter(text: &str) -> Result<String, String> {
    EnvFilter::try_new(text)
        .map(|_| text.to_string())
        .map_err(|err| format!("not a log level or filter: {err}"))
}

/// Installs the global tracing subscriber (stderr, text or JSON). A second call, or a
/// call after another subscriber was installed, leaves the first one in place.
pub fn init(args: &LogArgs) {
    init_to(args, BoxMakeWriter::new(std::io::stderr));
}

/// [`init`], writing to `writer` instead of stderr.
pub fn init_to(args: &LogArgs, writer: BoxMakeWriter) {
    // Err only means a subscriber is already installed: keep it.
    let _ = tracing::dispatcher::set_global_default(dispatch(args, writer));
}

/// A subscriber in the format and at the level of `args`, writing to `writer`: for the
/// global one ([`init_to`]), or for a log of a daemon's own, used with
/// `tracing::dispatcher::with_default`.
pub fn dispatch(args: &LogArgs, writer: BoxMakeWriter) -> tracing::Dispatch {
    let filter = EnvFilter::try_new(&args.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false);
    match args.log_format {
        LogFormat::Text => tracing::Dispatch::new(builder.finish()),
        LogFormat::Json => tracing::Dispatch::new(builder.json().flatten_event(true).finish()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A dispatch writes where it is told, in its format, at its level.
    #[test]
    fn a_dispatch_of_its_own() {
        let buf = Buf::default();
        let w = buf.clone();
        let args = LogArgs {
            log_format: LogFormat::Json,
            log_level: "warn".into(),
        };
        let d = dispatch(&args, BoxMakeWriter::new(move || w.clone()));
        tracing::dispatcher::with_default(&d, || {
            tracing::info!("not shown");
            tracing::warn!(rule = 942100, "shown");
        });
        let text = String::from_utf8(buf.0.lock().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains("\"rule\":942100") && text.contains("\"message\":\"shown\""),
            "{text}"
        );
    }
}
