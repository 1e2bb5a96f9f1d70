//! The process's own metrics (`process_*`), with client_golang's names and meanings (what
//! coraza-spoa serves from Go's default registry, `prometheus/client_golang`'s
//! `process_collector_procfsenabled.go`), read from `/proc` at each scrape:
//!
//! | metric | from |
//! |---|---|
//! | `process_cpu_seconds_total` | `/proc/self/stat` utime + stime, in clock ticks |
//! | `process_resident_memory_bytes` | `/proc/self/stat` rss × the page size |
//! | `process_virtual_memory_bytes` | `/proc/self/stat` vsize |
//! | `process_virtual_memory_max_bytes` | `/proc/self/limits` "Max address space", soft (unlimited: 2⁶⁴ − 1, as Go's procfs reads it) |
//! | `process_open_fds` | the entries of `/proc/self/fd` |
//! | `process_max_fds` | `/proc/self/limits` "Max open files", soft |
//! | `process_start_time_seconds` | `/proc/stat` btime + `/proc/self/stat` starttime: when the process started, not when the metrics were registered |
//! | `process_network_receive_bytes_total`, `process_network_transmit_bytes_total` | `/proc/self/net/netstat` IpExt InOctets, OutOctets (the network namespace's) |
//! | `process_threads` | `/proc/self/stat` num_threads (not client_golang's: Go reports its threads as `go_threads`) |
//!
//! `/proc` is read with the `procfs` crate; only the two netstat numbers are parsed here
//! (procfs has no reader for that file). A value that cannot be read is left out of that
//! scrape, with a debug log line. (The `kubert-prometheus-process` collector used before
//! gives the time of registration as the start time, and cannot be told otherwise.)

use procfs::process::{LimitValue, Process};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

/// client_golang's value for an unlimited limit (`math.MaxUint64` as a float).
const UNLIMITED: f64 = u64::MAX as f64;

/// Registers the `process_*` collector in `registry`, under the prefix `process`.
pub(crate) fn register(registry: &mut Registry) {
    registry
        .sub_registry_with_prefix("process")
        .register_collector(Box::new(ProcessCollector {
            page_size: procfs::page_size(),
            ticks_per_second: procfs::ticks_per_second().max(1),
        }));
}

#[derive(Debug)]
struct ProcessCollector {
    page_size: u64,
    ticks_per_second: u64,
}

/// A gauge's value: a count, or a float (seconds; a limit that may be 2⁶⁴ − 1).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    Int(i64),
    Float(f64),
}

fn int(v: u64) -> Value {
    i64::try_from(v).map_or(Value::Float(v as f64), Value::Int)
}

/// One scrape's readings (`None`: could not be read).
#[derive(Debug, Default, PartialEq)]
struct Readings {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<Value>,
    virtual_bytes: Option<Value>,
    virtual_max_bytes: Option<Value>,
    open_fds: Option<Value>,
    max_fds: Option<Value>,
    start_time_seconds: Option<Value>,
    threads: Option<Value>,
    network: Option<(f64, f64)>,
}

fn limit(value: &LimitValue) -> Value {
    match value {
        LimitValue::Unlimited => Value::Float(UNLIMITED),
        LimitValue::Value(v) => int(*v),
    }
}

impl ProcessCollector {
    fn read(&self) -> Readings {
        let mut r = Readings::default();
        let me = match Process::myself() {
            Ok(me) => me,
            Err(e) => {
                tracing::debug!("process_* metrics: /proc/self: {e}");
                return r;
            }
        };
        let ticks = self.ticks_per_second as f64;
        match me.stat() {
            Ok(stat) => {
                r.cpu_seconds = Some((stat.utime + stat.stime) as f64 / ticks);
                r.resident_bytes = Some(int(stat.rss.saturating_mul(self.page_size)));
                r.virtual_bytes = Some(int(stat.vsize));
                r.threads = Some(Value::Int(stat.num_threads));
                match procfs::boot_time_secs() {
                    Ok(boot) => {
                        r.start_time_seconds =
                            Some(Value::Float(boot as f64 + stat.starttime as f64 / ticks));
                    }
                    Err(e) => tracing::debug!("process_start_time_seconds: /proc/stat: {e}"),
                }
            }
            Err(e) => tracing::debug!("process_* metrics: /proc/self/stat: {e}"),
        }
        match me.limits() {
            Ok(limits) => {
                r.max_fds = Some(limit(&limits.max_open_files.soft_limit));
                r.virtual_max_bytes = Some(limit(&limits.max_address_space.soft_limit));
            }
            Err(e) => tracing::debug!("process_* metrics: /proc/self/limits: {e}"),
        }
        match me.fd_count() {
            Ok(n) => r.open_fds = Some(int(n as u64)),
            Err(e) => tracing::debug!("process_open_fds: /proc/self/fd: {e}"),
        }
        match std::fs::read_to_string("/proc/self/net/netstat") {
            Ok(text) => r.network = ip_octets(&text),
            Err(e) => tracing::debug!("process_network_*: /proc/self/net/netstat: {e}"),
        }
        r
    }
}

/// `IpExt: ... InOctets OutOctets ...` from `/proc/self/net/netstat`: a line of names, then
/// a line of values with the same prefix.
fn ip_octets(netstat: &str) -> Option<(f64, f64)> {
    let mut lines = netstat.lines().filter(|l| l.starts_with("IpExt:"));
    let names: Vec<&str> = lines.next()?.split_whitespace().collect();
    let values: Vec<&str> = lines.next()?.split_whitespace().collect();
    let get = |name: &str| -> Option<f64> {
        let i = names.iter().position(|n| *n == name)?;
        values.get(i)?.parse::<u64>().ok().map(|v| v as f64)
    };
    Some((get("InOctets")?, get("OutOctets")?))
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let r = self.read();
        let mut gauge = |name: &str, help: &str, unit: Option<Unit>, value: Option<Value>| {
            let Some(value) = value else {
                return Ok(());
            };
            let e = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
            match value {
                Value::Int(v) => ConstGauge::new(v).encode(e),
                Value::Float(v) => ConstGauge::new(v).encode(e),
            }
        };
        gauge(
            "resident_memory",
            "Resident memory size in bytes.",
            Some(Unit::Bytes),
            r.resident_bytes,
        )?;
        gauge(
            "virtual_memory",
            "Virtual memory size in bytes.",
            Some(Unit::Bytes),
            r.virtual_bytes,
        )?;
        gauge(
            "virtual_memory_max",
            "Maximum amount of virtual memory available in bytes.",
            Some(Unit::Bytes),
            r.virtual_max_bytes,
        )?;
        gauge(
            "open_fds",
            "Number of open file descriptors.",
            None,
            r.open_fds,
        )?;
        gauge(
            "max_fds",
            "Maximum number of open file descriptors.",
            None,
            r.max_fds,
        )?;
        gauge(
            "start_time",
            "Start time of the process since unix epoch in seconds.",
            Some(Unit::Seconds),
            r.start_time_seconds,
        )?;
        gauge(
            "threads",
            "Number of OS threads in the process.",
            None,
            r.threads,
        )?;
        let mut counter = |name: &str, help: &str, unit: Option<Unit>, value: f64| {
            let e = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
            ConstCounter::new(value).encode(e)
        };
        if let Some(cpu) = r.cpu_seconds {
            counter(
                "cpu",
                "Total user and system CPU time spent in seconds.",
                Some(Unit::Seconds),
                cpu,
            )?;
        }
        if let Some((received, sent)) = r.network {
            counter(
                "network_receive",
                "Number of bytes received by the process over the network.",
                Some(Unit::Bytes),
                received,
            )?;
            counter(
                "network_transmit",
                "Number of bytes sent by the process over the network.",
                Some(Unit::Bytes),
                sent,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape() -> String {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    fn value(text: &str, name: &str) -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in {text}"));
        line[name.len()..].trim().parse().unwrap()
    }

    /// The start time is the process's, from /proc as client_golang reads it: read here
    /// independently (field 22 of /proc/self/stat, after the command in parentheses, and
    /// /proc/stat's btime); the metrics are registered well after the process started.
    #[test]
    fn the_start_time_is_the_processs() {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let starttime: f64 = after.split(' ').nth(19).unwrap().parse().unwrap();
        let btime: f64 = std::fs::read_to_string("/proc/stat")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let expected = btime + starttime / procfs::ticks_per_second() as f64;
        let text = scrape();
        let got = value(&text, "process_start_time_seconds");
        assert!((got - expected).abs() < 1e-6, "{got} vs {expected}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            got <= now + 1.0 && got > now - 86_400.0,
            "{got} vs now {now}"
        );
    }

    /// Every metric, once, with its type; the limits as `ulimit` reports them to a child
    /// (which inherits them).
    #[test]
    fn every_metric_with_its_type() {
        let text = scrape();
        for (name, kind) in [
            ("process_cpu_seconds_total", "counter"),
            ("process_resident_memory_bytes", "gauge"),
            ("process_virtual_memory_bytes", "gauge"),
            ("process_virtual_memory_max_bytes", "gauge"),
            ("process_open_fds", "gauge"),
            ("process_max_fds", "gauge"),
            ("process_start_time_seconds", "gauge"),
            ("process_threads", "gauge"),
            ("process_network_receive_bytes_total", "counter"),
            ("process_network_transmit_bytes_total", "counter"),
        ] {
            let family = name.strip_suffix("_total").unwrap_or(name);
            assert!(
                text.contains(&format!("# TYPE {family} {kind}\n")),
                "{name}: {text}"
            );
            assert_eq!(
                text.lines()
                    .filter(|l| l.starts_with(&format!("{name} ")))
                    .count(),
                1,
                "{text}"
            );
        }
        assert!(value(&text, "process_resident_memory_bytes") > 0.0);
        assert!(value(&text, "process_open_fds") >= 3.0);
        let ulimit = |flag: &str| {
            let out = std::process::Command::new("sh")
                .args(["-c", &format!("ulimit -S {flag}")])
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        };
        let max_fds = ulimit("-n");
        assert_eq!(
            value(&text, "process_max_fds"),
            max_fds.parse::<f64>().unwrap_or(UNLIMITED),
            "ulimit -n {max_fds}"
        );
        let vm = ulimit("-v");
        let expected = match vm.as_str() {
            "unlimited" => UNLIMITED,
            kib => kib.parse::<f64>().unwrap() * 1024.0,
        };
        assert_eq!(
            value(&text, "process_virtual_memory_max_bytes"),
            expected,
            "ulimit -v {vm}"
        );
    }

    #[test]
    fn netstat_octets() {
        let text = "TcpExt: SyncookiesSent X\nTcpExt: 0 1\nIpExt: InNoRoutes InOctets OutOctets\nIpExt: 0 1234 5678\n";
        assert_eq!(ip_octets(text), Some((1234.0, 5678.0)));
        assert_eq!(ip_octets("IpExt: InOctets\n"), None);
        assert_eq!(ip_octets("IpExt: InOctets OutOctets\nIpExt: x 1\n"), None);
        assert_eq!(ip_octets(""), None);
    }
}
