//! Logging options (`--log-format`, `--log-level`) and the tracing subscriber behind them.
//!
//! Logs go to stderr, one line per event, as text (the default) or JSON objects.

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
    let filter = EnvFilter::try_new(&args.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    // Err only means a subscriber is already installed: keep it.
    let _ = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
