//! The TURN daemon's metrics, served by lastcall's admin listener at `/metrics`.
//!
//! coturn's names are kept where they exist, so dashboards carry over:
//! `turn_total_allocations{type="UDP|TCP|TLS/TCP"}` (coturn's label values) and the traffic
//! counters `turn_traffic_*{realm}` / `turn_total_traffic_*`. Unlike coturn, whose traffic
//! counters move only when a session ends, ours are live: they count every packet as it is
//! relayed. prometheus-client appends `_total` to the names of counters in the OpenMetrics
//! text, so the coturn-named counters are exposed as gauges that only ever increase (PromQL's
//! `rate()` works on them as on counters); the daemon's own counters are real counters.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Client transport, as coturn labels allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    Udp,
    Tcp,
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

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RealmLabel {
    realm: String,
}

/// A monotonically increasing value exposed as a gauge (see the module doc).
pub type Total = Gauge<u64, AtomicU64>;

/// Packets and bytes in one direction.
#[derive(Debug, Clone, Default)]
pub struct Flow {
    pub packets: Total,
    pub bytes: Total,
    total_packets: Total,
    total_bytes: Total,
}

impl Flow {
    /// Counts one packet of `len` bytes.
    #[inline]
    pub fn add(&self, len: usize) {
        let len = len as u64;
        self.packets.inc();
        self.bytes.inc_by(len);
        self.total_packets.inc();
        self.total_bytes.inc_by(len);
    }

    /// Counts `packets` packets of `bytes` bytes in all (a batch).
    #[inline]
    pub fn add_many(&self, packets: u64, bytes: u64) {
        if packets == 0 {
            return;
        }
        self.packets.inc_by(packets);
        self.bytes.inc_by(bytes);
        self.total_packets.inc_by(packets);
        self.total_bytes.inc_by(bytes);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct WorkerLabel {
    pub worker: String,
}

/// Every metric of the daemon; cheap to clone (all handles are shared atomics).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    allocations: [Gauge; 3],
    /// From clients (`turn_traffic_rcvp`, `turn_traffic_rcvb`).
    pub client_rx: Flow,
    /// To clients (`turn_traffic_sentp`, `turn_traffic_sentb`).
    pub client_tx: Flow,
    /// From peers (`turn_traffic_peer_rcvp`, `turn_traffic_peer_rcvb`).
    pub peer_rx: Flow,
    /// To peers (`turn_traffic_peer_sentp`, `turn_traffic_peer_sentb`).
    pub peer_tx: Flow,
    /// Requests that failed authentication (401 with a bad credential, 438 excluded).
    pub auth_failures: Counter,
    /// Allocate requests refused because the server is draining.
    pub refused_draining: Counter,
    /// Allocate requests that found no free relay port (508).
    pub relay_port_exhausted: Counter,
    /// Allocations created since start.
    pub allocations_created: Counter,
    /// Datagrams or frames dropped because a socket or connection queue was full.
    pub send_dropped: Counter,
    /// Client TCP/TLS connections currently open.
    pub stream_connections: Gauge,
    /// TLS handshakes that failed.
    pub tls_handshake_failures: Counter,
    /// Certificate reloads that failed (the old certificate stays in use).
    pub tls_reload_failures: Counter,
    /// Datagrams read by each UDP I/O thread (from clients and from peers).
    pub worker_datagrams: Family<WorkerLabel, Counter>,
    /// Wake-ups (returns from epoll_wait with something to do) of each UDP I/O thread.
    pub worker_wakeups: Family<WorkerLabel, Counter>,
}

impl Metrics {
    /// The live-allocations gauge of one transport.
    pub fn allocations(&self, t: Transport) -> &Gauge {
        match t {
            Transport::Udp => &self.allocations[0],
            Transport::Tcp => &self.allocations[1],
            Transport::Tls => &self.allocations[2],
        }
    }

    /// Registers everything in `registry`; `realm` labels the coturn traffic counters.
    pub fn register(&self, registry: &mut Registry, realm: &str) {
        registry.register(
            "turn_total_allocations",
            "Current allocations, by client transport (coturn's name and labels)",
            AllocationFamily {
                gauges: self.allocations.clone(),
            },
        );
        let flows = [
            ("rcv", "received from clients", &self.client_rx),
            ("sent", "sent to clients", &self.client_tx),
            ("peer_rcv", "received from peers", &self.peer_rx),
            ("peer_sent", "sent to peers", &self.peer_tx),
        ];
        for (name, what, flow) in flows {
            for (suffix, unit, metric, total) in [
                ("p", "packets", &flow.packets, &flow.total_packets),
                ("b", "bytes", &flow.bytes, &flow.total_bytes),
            ] {
                registry.register(
                    format!("turn_traffic_{name}{suffix}"),
                    format!("{unit} {what}, live (coturn's name; only increases)"),
                    RealmFamily {
                        realm: realm.to_string(),
                        metric: metric.clone(),
                    },
                );
                registry.register(
                    format!("turn_total_traffic_{name}{suffix}"),
                    format!("{unit} {what}, live, all realms (coturn's name; only increases)"),
                    total.clone(),
                );
            }
        }
        registry.register(
            "lastcall_turn_auth_failures",
            "Requests that failed authentication",
            self.auth_failures.clone(),
        );
        registry.register(
            "lastcall_turn_allocate_refused_draining",
            "Allocate requests refused (300 or 403) because the server is draining",
            self.refused_draining.clone(),
        );
        registry.register(
            "lastcall_turn_relay_port_exhausted",
            "Allocate requests that found no free relay port (508)",
            self.relay_port_exhausted.clone(),
        );
        registry.register(
            "lastcall_turn_allocations_created",
            "Allocations created since start",
            self.allocations_created.clone(),
        );
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
            "Certificate reloads that failed (the previous certificate stays in use)",
            self.tls_reload_failures.clone(),
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

/// `turn_total_allocations` with our three gauges behind the coturn labels.
#[derive(Debug)]
struct AllocationFamily {
    gauges: [Gauge; 3],
}

impl prometheus_client::encoding::EncodeMetric for AllocationFamily {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        for (t, g) in [Transport::Udp, Transport::Tcp, Transport::Tls]
            .iter()
            .zip(&self.gauges)
        {
            let label = TypeLabel {
                r#type: t.label().to_string(),
            };
            let e = encoder.encode_family(&label)?;
            g.encode(e)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Gauge
    }
}

/// A coturn traffic metric with its one `realm` label.
#[derive(Debug)]
struct RealmFamily {
    realm: String,
    metric: Total,
}

impl prometheus_client::encoding::EncodeMetric for RealmFamily {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        let label = RealmLabel {
            realm: self.realm.clone(),
        };
        let e = encoder.encode_family(&label)?;
        self.metric.encode(e)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Gauge
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_has_coturn_names() {
        let m = Metrics::default();
        let mut reg = Registry::default();
        m.register(&mut reg, "example.org");
        m.allocations(Transport::Tls).inc();
        m.client_rx.add(100);
        m.peer_tx.add(40);
        m.auth_failures.inc();
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
            text.contains("turn_traffic_rcvp{realm=\"example.org\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("turn_traffic_rcvb{realm=\"example.org\"} 100"),
            "{text}"
        );
        assert!(text.contains("turn_total_traffic_peer_sentb 40"), "{text}");
        assert!(
            text.contains("lastcall_turn_auth_failures_total 1"),
            "{text}"
        );
    }
}
