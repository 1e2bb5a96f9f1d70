//! The TURN daemon's metrics, served by lastcall's admin listener at `/metrics`, in
//! Prometheus's text format 0.0.4 as coturn's exporter serves them.
//!
//! Two sources: the protocol core's [`Counters`] (read under the core's lock at each scrape,
//! by [`CoreMetrics`] and [`write_coturn_counters`]) and the I/O layer's own [`Metrics`]
//! (sockets, connections, TLS, the UDP I/O threads). Each number is counted once, where it is
//! known.
//!
//! coturn's names, labels and types are kept where they exist, so dashboards carry over
//! (coturn's `src/apps/relay/prom_server.c`): the gauge `turn_total_allocations{type="UDP|TCP|TLS/TCP"}`,
//! and the counters `turn_traffic_*{realm}`, `turn_total_traffic_*` and `stun_binding_*`,
//! named without `_total` as coturn names them (Prometheus text 0.0.4 allows that, OpenMetrics
//! does not, so the admin listener serves 0.0.4 and these families are written here, not by
//! prometheus-client). Unlike coturn, whose traffic counters move only when a session ends,
//! ours are live: they count every packet as it is relayed. The daemon's own counters are
//! prometheus-client's (`lastcall_turn_*_total`).

use std::sync::Arc;

use lastcall_turn_proto::{Counters, TrafficCounts};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Client transport, as coturn labels allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// UDP.
    Udp,
    /// TCP.
    Tcp,
    /// TLS over TCP.
    Tls,
}

impl Transport {
    /// coturn's label value (`socket_type_name`).
    pub fn label(self) -> &'static str {
        match self {
            Transport::Udp => "UDP",
            Transport::Tcp => "TCP",
            Transport::Tls => "TLS/TCP",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TypeLabel {
    r#type: String,
}

/// The label of a per-I/O-thread metric.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct WorkerLabel {
    /// The UDP I/O thread's index.
    pub worker: String,
}

/// The I/O layer's metrics; cheap to clone (all handles are shared atomics).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Datagrams or frames dropped because a socket or connection queue was full.
    pub send_dropped: Counter,
    /// Client TCP/TLS connections currently open.
    pub stream_connections: Gauge,
    /// TLS handshakes that failed.
    pub tls_handshake_failures: Counter,
    /// Certificate reloads that failed (the old certificate stays in use).
    pub tls_reload_failures: Counter,
    /// Certificate reloads that succeeded (a signal, or a change of the files).
    pub tls_reloads: Counter,
    /// Datagrams read by each UDP I/O thread (from clients and from peers).
    pub worker_datagrams: Family<WorkerLabel, Counter>,
    /// Wake-ups (returns from epoll_wait with something to do) of each UDP I/O thread.
    pub worker_wakeups: Family<WorkerLabel, Counter>,
}

impl Metrics {
    /// Registers the I/O layer's metrics in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "lastcall_turn_send_dropped",
            "Datagrams or frames dropped because a socket buffer or connection queue was full",
            self.send_dropped.clone(),
        );
        registry.register(
            "lastcall_turn_stream_connections",
            "Client TCP and TLS connections currently open",
            self.stream_connections.clone(),
        );
        registry.register(
            "lastcall_turn_tls_handshake_failures",
            "TLS handshakes that failed",
            self.tls_handshake_failures.clone(),
        );
        registry.register(
            "lastcall_turn_tls_reload_failures",
            "Certificate reloads that failed, on a signal or after the files changed (the previous certificate stays in use)",
            self.tls_reload_failures.clone(),
        );
        registry.register(
            "lastcall_turn_tls_reloads",
            "Certificate reloads that succeeded, on a signal or after the files changed",
            self.tls_reloads.clone(),
        );
        registry.register(
            "lastcall_turn_udp_worker_datagrams",
            "Datagrams read by each UDP I/O thread (relay-threads), from clients and peers",
            self.worker_datagrams.clone(),
        );
        registry.register(
            "lastcall_turn_udp_worker_wakeups",
            "Wake-ups of each UDP I/O thread; datagrams / wake-ups is the mean batch",
            self.worker_wakeups.clone(),
        );
    }
}

/// Where the core's counters are read at a scrape.
pub(crate) trait CoreCounters: Send + Sync + std::fmt::Debug + 'static {
    /// The counters and the live allocations by client transport (UDP, TCP, TLS).
    fn snapshot(&self) -> (Counters, (usize, usize, usize));

    /// With `prometheus-username-labels`, each labelled user's traffic.
    fn user_traffic(&self) -> Option<Vec<(String, TrafficCounts)>> {
        None
    }
}

/// The core's counters as metrics, read at each scrape (coturn's counter families are
/// [`coturn_counters`]'s).
#[derive(Debug)]
pub(crate) struct CoreMetrics {
    core: Arc<dyn CoreCounters>,
}

impl CoreMetrics {
    /// Registers the core's counters of `core` in `registry`.
    pub(crate) fn register(registry: &mut Registry, core: Arc<dyn CoreCounters>) {
        registry.register_collector(Box::new(CoreMetrics { core }));
    }
}

/// One of the daemon's own counters of the core: its name, help and value.
struct Exported {
    name: &'static str,
    help: &'static str,
    value: u64,
}

const fn own(name: &'static str, help: &'static str, value: u64) -> Exported {
    Exported { name, help, value }
}

/// Every counter of the core but coturn's (traffic, Binding: [`write_coturn_counters`]), as a
/// metric. The destructuring names every field: a counter added to the core does not compile
/// until it is exported here or there.
fn exported(c: &Counters) -> [Exported; 19] {
    let Counters {
        client_packets_in: _,
        client_bytes_in: _,
        client_packets_out: _,
        client_bytes_out: _,
        peer_packets_in: _,
        peer_bytes_in: _,
        peer_packets_out: _,
        peer_bytes_out: _,
        peer_dropped,
        client_data_dropped,
        malformed,
        suppressed_responses,
        ratelimited_responses,
        binding_requests: _,
        binding_responses: _,
        binding_errors: _,
        auth_failures,
        allocations_created,
        allocations_deleted,
        refused_draining,
        refused_quota,
        refused_capacity,
        peers_denied,
        events_dropped,
        bandwidth_dropped,
        refused_bandwidth,
        allocations_reclaimed,
        userdb_lookups,
        userdb_unavailable,
        userdb_cached,
    } = *c;
    [
        own("lastcall_turn_auth_failures", "Requests that failed authentication.", auth_failures),
        own("lastcall_turn_allocate_refused_draining", "Allocate requests refused (300 or 403) because the server is draining.", refused_draining),
        own("lastcall_turn_relay_port_exhausted", "Allocate requests that found no free relay port (508).", refused_capacity),
        own("lastcall_turn_allocate_refused_quota", "Allocate requests refused by user-quota or total-quota (486).", refused_quota),
        own("lastcall_turn_allocations_created", "Allocations created since start.", allocations_created),
        own("lastcall_turn_allocations_deleted", "Allocations ended since start (refreshed to 0, expired, connection closed, shutdown, reclaimed).", allocations_deleted),
        own("lastcall_turn_allocations_reclaimed", "Allocations ended while draining because their client sent nothing for drain-idle-timeout.", allocations_reclaimed),
        own("lastcall_turn_peers_denied", "CreatePermission and ChannelBind peers refused by the peer policy (403).", peers_denied),
        own("lastcall_turn_malformed", "Client datagrams or frames dropped as neither STUN nor ChannelData, or with a bad FINGERPRINT.", malformed),
        own("lastcall_turn_suppressed_responses", "Responses to unauthenticated requests dropped because they would be larger than the request (no amplification).", suppressed_responses),
        own("lastcall_turn_ratelimited_responses", "Challenges and Binding answers larger than their unauthenticated UDP request not sent: their source IP had its unauthorized-ratelimit-rps this second.", ratelimited_responses),
        own("lastcall_turn_client_data_dropped", "ChannelData and Send indications from clients dropped: no allocation, channel or permission.", client_data_dropped),
        own("lastcall_turn_peer_dropped", "Datagrams from peers dropped: no allocation on that relay or no permission for the peer.", peer_dropped),
        own("lastcall_turn_events_dropped", "Core events dropped because their queue was full.", events_dropped),
        own("lastcall_turn_bandwidth_dropped", "ChannelData, Send and peer datagrams dropped because their allocation was over max-bps.", bandwidth_dropped),
        own("lastcall_turn_allocate_refused_bandwidth", "Allocate requests refused (486) because bps-capacity was all reserved.", refused_bandwidth),
        own("lastcall_turn_userdb_lookups", "Keys and REST secrets asked of the user database (userdb, psql-userdb, redis-userdb).", userdb_lookups),
        own("lastcall_turn_userdb_unavailable", "User database lookups that failed or took longer than 3 s (their requests got 500).", userdb_unavailable),
        own("lastcall_turn_userdb_cached", "Requests answered from what was kept of the user database, without a lookup.", userdb_cached),
    ]
}

impl Collector for CoreMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (c, (udp, tcp, tls)) = self.core.snapshot();
        let mut e = encoder.encode_descriptor(
            "turn_total_allocations",
            "Current allocations, by client transport (coturn's name and labels).",
            None,
            MetricType::Gauge,
        )?;
        for (t, n) in [
            (Transport::Udp, udp),
            (Transport::Tcp, tcp),
            (Transport::Tls, tls),
        ] {
            let label = TypeLabel {
                r#type: t.label().to_string(),
            };
            ConstGauge::new(n as u64).encode(e.encode_family(&label)?)?;
        }
        for m in exported(&c) {
            let e = encoder.encode_descriptor(m.name, m.help, None, MetricType::Counter)?;
            ConstCounter::new(m.value).encode(e)?;
        }
        Ok(())
    }
}

/// coturn's counter families (`stun_binding_*`, `turn_traffic_*{realm}`,
/// `turn_total_traffic_*`), written as coturn's exporter writes them: Prometheus text 0.0.4,
/// `# TYPE name counter`, samples named without `_total`. The admin listener appends them to
/// the registry's families at each scrape. With `users` (coturn's
/// `prometheus-username-labels`) the `turn_traffic_*` families have one sample per user,
/// labelled `realm` and `user` in that order, as coturn's, and no realm-only sample.
pub(crate) fn write_coturn_counters(
    out: &mut String,
    c: &Counters,
    realm: &str,
    users: Option<&[(String, TrafficCounts)]>,
) {
    use std::fmt::Write;
    let family = |out: &mut String, name: &str, help: &str, labels: &str, value: u64| {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{labels} {value}\n"
        );
    };
    for (name, help, value) in [
        (
            "stun_binding_request",
            "Incoming STUN Binding requests (coturn's name).",
            c.binding_requests,
        ),
        (
            "stun_binding_response",
            "Outgoing STUN Binding success responses (coturn's name).",
            c.binding_responses,
        ),
        (
            "stun_binding_error",
            "STUN Binding error responses (coturn's name).",
            c.binding_errors,
        ),
    ] {
        family(out, name, help, "", value);
    }
    let realm_label = escape_label(realm);
    let realm = format!("{{realm=\"{realm_label}\"}}");
    let flows = [
        (
            "rcv",
            "received from clients",
            c.client_packets_in,
            c.client_bytes_in,
        ),
        (
            "sent",
            "sent to clients",
            c.client_packets_out,
            c.client_bytes_out,
        ),
        (
            "peer_rcv",
            "received from peers",
            c.peer_packets_in,
            c.peer_bytes_in,
        ),
        (
            "peer_sent",
            "sent to peers",
            c.peer_packets_out,
            c.peer_bytes_out,
        ),
    ];
    for (flow, what, packets, bytes) in flows {
        for (suffix, unit, value) in [("p", "Packets", packets), ("b", "Bytes", bytes)] {
            let help = format!(
                "{unit} {what}, live (coturn's name; coturn counts them when a session ends)."
            );
            let name = format!("turn_traffic_{flow}{suffix}");
            match users {
                None => family(out, &name, &help, &realm, value),
                Some(users) => {
                    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} counter\n");
                    for (user, t) in users {
                        let _ = writeln!(
                            out,
                            "{name}{{realm=\"{realm_label}\",user=\"{}\"}} {}",
                            escape_label(user),
                            user_value(t, flow, suffix)
                        );
                    }
                }
            }
            let help = format!("{unit} {what}, live, all realms (coturn's name).");
            family(
                out,
                &format!("turn_total_traffic_{flow}{suffix}"),
                &help,
                "",
                value,
            );
        }
    }
}

/// The count of `t` named by coturn's `flow` and `suffix` (`rcv` and `p`: packets received
/// from clients).
fn user_value(t: &TrafficCounts, flow: &str, suffix: &str) -> u64 {
    match (flow, suffix) {
        ("rcv", "p") => t.client_packets_in,
        ("rcv", _) => t.client_bytes_in,
        ("sent", "p") => t.client_packets_out,
        ("sent", _) => t.client_bytes_out,
        ("peer_rcv", "p") => t.peer_packets_in,
        ("peer_rcv", _) => t.peer_bytes_in,
        ("peer_sent", "p") => t.peer_packets_out,
        (_, _) => t.peer_bytes_out,
    }
}

/// A label value in the text format: backslash, double quote and newline escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// [`write_coturn_counters`] of `core` at each scrape, for the admin listener.
pub(crate) fn coturn_counters(
    core: Arc<dyn CoreCounters>,
    realm: &str,
) -> lastcall::admin::ExtraFamilies {
    let realm = realm.to_string();
    Arc::new(move |out: &mut String| {
        let (c, _) = core.snapshot();
        let users = core.user_traffic();
        write_coturn_counters(out, &c, &realm, users.as_deref());
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A core snapshot with fixed values.
    #[derive(Debug)]
    struct Fixed(Counters, (usize, usize, usize));

    impl CoreCounters for Fixed {
        fn snapshot(&self) -> (Counters, (usize, usize, usize)) {
            (self.0, self.1)
        }
    }

    #[test]
    fn text_has_coturn_names_and_types() {
        let m = Metrics::default();
        let mut reg = Registry::default();
        m.register(&mut reg);
        let counters = Counters {
            client_packets_in: 1,
            client_bytes_in: 100,
            peer_packets_out: 1,
            peer_bytes_out: 40,
            auth_failures: 1,
            binding_requests: 3,
            ..Counters::default()
        };
        let core: Arc<dyn CoreCounters> = Arc::new(Fixed(counters, (0, 0, 1)));
        CoreMetrics::register(&mut reg, Arc::clone(&core));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(
            text.contains("turn_total_allocations{type=\"TLS/TCP\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("turn_total_allocations{type=\"UDP\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("lastcall_turn_auth_failures_total 1"),
            "{text}"
        );
        assert!(
            !text.contains("turn_traffic"),
            "written by coturn_counters: {text}"
        );
        let mut coturn = String::new();
        coturn_counters(core, "ex\"ample.org")(&mut coturn);
        for family in [
            "# TYPE turn_traffic_rcvp counter\nturn_traffic_rcvp{realm=\"ex\\\"ample.org\"} 1\n",
            "# TYPE turn_traffic_rcvb counter\nturn_traffic_rcvb{realm=\"ex\\\"ample.org\"} 100\n",
            "# TYPE turn_total_traffic_peer_sentb counter\nturn_total_traffic_peer_sentb 40\n",
            "# TYPE stun_binding_request counter\nstun_binding_request 3\n",
            "# TYPE stun_binding_error counter\nstun_binding_error 0\n",
        ] {
            assert!(coturn.contains(family), "{family}\n{coturn}");
        }
        // 3 Binding families and 8 traffic families with and without the realm, each with its
        // HELP, TYPE and one sample.
        assert_eq!(coturn.lines().count(), (3 + 16) * 3, "{coturn}");
    }
}
