//! The admin HTTP listener (hyper 1, HTTP/1.1):
//!
//! | request | answer |
//! |---|---|
//! | `GET /livez` | 200 while the process runs (never falls during a drain) |
//! | `GET /readyz` | 200 while serving; 503 while starting and from the trigger on |
//! | `GET /` | 200 `ok`: coturn's health check of its Prometheus port |
//! | `GET /metrics` | OpenMetrics text (or Prometheus text 0.0.4, [`Exposition`]): the daemon's registry and `lastcall_*` |
//! | `GET /drain` | JSON [`DrainStatus`](crate::DrainStatus) |
//! | `POST /drain` | starts a drain (202 + JSON status); see below |
//! | `GET /sessions` | JSON page of the sessions a drain waits for ([`crate::sessions`]) |
//! | `DELETE /sessions/ID`, `DELETE /sessions?user=NAME` | ends sessions as the deadline would |
//! | anything else | 404 (405 for a known path with another method) |
//!
//! `POST /drain` and `/sessions` (both methods) authorisation: without `--admin-token`, only loopback peers (127.0.0.0/8,
//! ::1, IPv4-mapped loopback) may drain, others get 403. With a token, every peer,
//! loopback included, must send `Authorization: Bearer <token>`; a missing or wrong token
//! gets 401. (In a pod every container shares loopback, so a configured token is required
//! from loopback too.)
//!
//! The listener runs on a thread of its own (`lastcall-admin`, with its own single-threaded
//! runtime), so that nothing the daemon's runtime does (a busy I/O thread, a blocked task)
//! delays a liveness probe. What a stranger can hold is bounded: at most
//! [`MAX_CONNECTIONS`] connections (a new one closes the oldest, so that a probe still gets
//! in while a stranger holds connections open), [`MAX_BUFFER`] bytes buffered per
//! connection, [`HEADER_TIMEOUT`] to send a request's headers and [`IDLE_TIMEOUT`] between
//! requests.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::lifecycle::Handle;
use crate::machine::Trigger;

/// How long a client may take to send its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may stay open with nothing coming from the client (between
/// requests on a keep-alive connection, or before the first one).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Admin connections open at once; a connection beyond it closes the oldest.
pub const MAX_CONNECTIONS: usize = 256;
/// Bytes hyper buffers per connection (a request's headers must fit).
pub const MAX_BUFFER: usize = 16 * 1024;

/// Why the admin listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The address could not be bound.
    #[error("cannot bind the admin listener (--admin-addr) to {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// Its thread or runtime could not start.
    #[error("cannot start the admin listener's thread: {0}")]
    Thread(std::io::Error),
}

/// The running admin listener. It serves until the process exits (dropping this value does
/// not stop it; [`AdminServer::shutdown`] does).
#[derive(Debug)]
pub struct AdminServer {
    local_addr: Option<SocketAddr>,
    stop: Option<Arc<Notify>>,
}

impl AdminServer {
    /// The bound address (`None` when the listener is off).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Stops accepting admin connections.
    pub fn shutdown(self) {
        if let Some(stop) = self.stop {
            stop.notify_one();
        }
    }
}

/// Writes more metric families, in Prometheus text 0.0.4, at each scrape.
pub type ExtraFamilies = Arc<dyn Fn(&mut String) + Send + Sync>;

/// How `/metrics` is written.
#[derive(Clone, Default)]
pub enum Exposition {
    /// OpenMetrics 1.0 text, as prometheus-client writes the registry.
    #[default]
    OpenMetrics,
    /// Prometheus text 0.0.4 (`text/plain; version=0.0.4`), coturn's: the registry's families
    /// rewritten into it, then the families `extra` writes itself in that format (for names
    /// OpenMetrics does not allow, such as counters without `_total`).
    PrometheusText {
        /// Writes more families, in Prometheus text 0.0.4.
        extra: Option<ExtraFamilies>,
    },
}

impl std::fmt::Debug for Exposition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exposition::OpenMetrics => f.write_str("OpenMetrics"),
            Exposition::PrometheusText { extra } => f
                .debug_struct("PrometheusText")
                .field("extra", &extra.is_some())
                .finish(),
        }
    }
}

/// Binds `--admin-addr` (if set) and serves the admin endpoints on their own thread.
/// With the listener off (`--admin-addr off`) it returns an [`AdminServer`] without address.
pub async fn serve(handle: &Handle, registry: Arc<Registry>) -> Result<AdminServer, AdminError> {
    serve_with(handle, registry, Exposition::OpenMetrics).await
}

/// [`serve`], with `/metrics` written as `exposition` says.
pub async fn serve_with(
    handle: &Handle,
    registry: Arc<Registry>,
    exposition: Exposition,
) -> Result<AdminServer, AdminError> {
    let Some(addr) = handle.config().admin_addr else {
        return Ok(AdminServer {
            local_addr: None,
            stop: None,
        });
    };
    serve_addr(addr, handle, registry, exposition)
}

/// Binds `addr` and serves the admin endpoints there (a second address: coturn's
/// Prometheus port besides `--admin-addr`).
pub fn serve_addr(
    addr: SocketAddr,
    handle: &Handle,
    registry: Arc<Registry>,
    exposition: Exposition,
) -> Result<AdminServer, AdminError> {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|source| AdminError::Bind { addr, source })?;
    serve_listener_with(listener, handle, registry, exposition)
}

/// Serves the admin endpoints on an already bound listener, on a thread of its own.
pub fn serve_listener(
    listener: std::net::TcpListener,
    handle: &Handle,
    registry: Arc<Registry>,
) -> Result<AdminServer, AdminError> {
    serve_listener_with(listener, handle, registry, Exposition::OpenMetrics)
}

/// [`serve_listener`], with `/metrics` written as `exposition` says.
pub fn serve_listener_with(
    listener: std::net::TcpListener,
    handle: &Handle,
    registry: Arc<Registry>,
    exposition: Exposition,
) -> Result<AdminServer, AdminError> {
    let local_addr = listener.local_addr().ok();
    listener.set_nonblocking(true).map_err(AdminError::Thread)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(AdminError::Thread)?;
    let ctx = Arc::new(Ctx {
        handle: handle.clone(),
        registry,
        own: own_registry(handle),
        exposition,
        open: Open::default(),
    });
    let stop = Arc::new(Notify::new());
    let stopped = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("lastcall-admin".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(err) => {
                        tracing::error!("admin listener: {err}");
                        return;
                    }
                };
                tokio::select! {
                    () = accept_loop(listener, ctx) => {}
                    () = stopped.notified() => {}
                }
            });
        })
        .map_err(AdminError::Thread)?;
    if let Some(addr) = local_addr {
        tracing::info!(%addr, "admin listener on {addr} (/livez /readyz /metrics /drain /sessions)");
    }
    Ok(AdminServer {
        local_addr,
        stop: Some(stop),
    })
}

struct Ctx {
    handle: Handle,
    registry: Arc<Registry>,
    /// The `lastcall_*` metrics, when the daemon did not register them in its registry.
    own: Option<Registry>,
    /// How `/metrics` is written.
    exposition: Exposition,
    /// Connections open.
    open: Open,
}

/// The connections open, oldest first, each with what closes it.
#[derive(Default)]
struct Open {
    conns: Mutex<BTreeMap<u64, Arc<Notify>>>,
    next: AtomicU64,
}

impl Open {
    /// Registers a new connection; at the bound, the oldest is told to close.
    fn add(&self) -> (u64, Arc<Notify>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let close = Arc::new(Notify::new());
        let mut conns = self.conns.lock();
        if conns.len() >= MAX_CONNECTIONS {
            if let Some((_, oldest)) = conns.pop_first() {
                oldest.notify_one();
            }
        }
        conns.insert(id, Arc::clone(&close));
        (id, close)
    }

    fn remove(&self, id: u64) {
        self.conns.lock().remove(&id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.conns.lock().len()
    }
}

fn own_registry(handle: &Handle) -> Option<Registry> {
    if handle.metrics_registered() {
        return None;
    }
    let mut registry = Registry::default();
    handle.metrics().register(&mut registry);
    Some(registry)
}

async fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!("admin listener: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (id, close) = ctx.open.add();
        tokio::spawn(connection(stream, peer, Arc::clone(&ctx), id, close));
    }
}

/// Serves one admin connection to its end.
async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    ctx: Arc<Ctx>,
    id: u64,
    close: Arc<Notify>,
) {
    let posted = Arc::new(AtomicBool::new(false));
    let service = {
        let (ctx, posted) = (ctx.clone(), posted.clone());
        service_fn(move |req| {
            let (ctx, posted) = (ctx.clone(), posted.clone());
            async move { Ok::<_, Infallible>(route(&ctx, peer, &posted, req).await) }
        })
    };
    let activity = Arc::new(Notify::new());
    let io = Watched {
        inner: stream,
        activity: Arc::clone(&activity),
    };
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_BUFFER)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let exiting = ctx.handle.exiting();
    tokio::pin!(exiting);
    let result = loop {
        tokio::select! {
            result = conn.as_mut() => break result,
            () = &mut exiting => {
                // Finish the request in flight, then close (keep-alive clients too).
                conn.as_mut().graceful_shutdown();
                break conn.await;
            }
            () = activity.notified() => {}
            () = close.notified() => {
                tracing::debug!(%peer, "admin connection closed: {MAX_CONNECTIONS} open, it was the oldest");
                break Ok(());
            }
            () = tokio::time::sleep(IDLE_TIMEOUT) => {
                tracing::debug!(%peer, "admin connection idle for {IDLE_TIMEOUT:?}: closed");
                conn.as_mut().graceful_shutdown();
                break conn.await;
            }
        }
    };
    if let Err(err) = result {
        tracing::debug!(%peer, "admin connection: {err}");
    }
    if posted.load(Ordering::SeqCst) {
        ctx.handle.admin_drain_request_done();
    }
    ctx.open.remove(id);
}

/// A connection that signals every read and write that moved bytes (for the idle timer).
struct Watched {
    inner: tokio::net::TcpStream,
    activity: Arc<Notify>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.notify_one();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.notify_one();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

async fn route<B>(
    ctx: &Ctx,
    peer: SocketAddr,
    posted: &AtomicBool,
    req: Request<B>,
) -> Response<Full<Bytes>> {
    let handle = &ctx.handle;
    match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/livez") => text(StatusCode::OK, "ok\n"),
        // coturn documents `GET /` on its Prometheus port as a health check.
        (&Method::GET | &Method::HEAD, "/") => text(StatusCode::OK, "ok\n"),
        (&Method::GET | &Method::HEAD, "/readyz") => {
            if handle.is_ready() {
                text(StatusCode::OK, "ready\n")
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("{}\n", handle.phase()),
                )
            }
        }
        (&Method::GET | &Method::HEAD, "/metrics") => metrics(ctx),
        (&Method::GET | &Method::HEAD, "/drain") => json(StatusCode::OK, &handle.status()),
        (&Method::POST, "/drain") => post_drain(ctx, peer, posted, &req).await,
        (method, path) if path == "/sessions" || path.starts_with("/sessions/") => {
            sessions(ctx, peer, posted, method, &req)
        }
        (_, "/" | "/livez" | "/readyz" | "/metrics" | "/drain") => {
            text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

async fn post_drain<B>(
    ctx: &Ctx,
    peer: SocketAddr,
    posted: &AtomicBool,
    req: &Request<B>,
) -> Response<Full<Bytes>> {
    let handle = &ctx.handle;
    if let Some(refused) = authorize(ctx, peer, req, "POST /drain") {
        return refused;
    }
    tracing::info!(%peer, "POST /drain accepted");
    if !posted.swap(true, Ordering::SeqCst) {
        // The exit waits for this connection to close, so the caller gets its answer.
        handle.admin_drain_request_open();
    }
    handle.start_drain(Trigger::Admin);
    // Give the lifecycle task a moment so the answer shows the new phase.
    let _ = tokio::time::timeout(Duration::from_secs(1), handle.drain_started()).await;
    json(StatusCode::ACCEPTED, &handle.status())
}

/// `POST /drain`'s rule, for every write and for what `/sessions` shows: with
/// `--admin-token`, its bearer token from every peer (401); without, loopback peers only
/// (403). `Some`: the refusal to send.
fn authorize<B>(
    ctx: &Ctx,
    peer: SocketAddr,
    req: &Request<B>,
    what: &str,
) -> Option<Response<Full<Bytes>>> {
    match &ctx.handle.config().admin_token {
        Some(token) => {
            if !bearer_matches(req, token) {
                tracing::warn!(%peer, "{what} refused: missing or wrong bearer token");
                let mut resp = text(StatusCode::UNAUTHORIZED, "bearer token required\n");
                resp.headers_mut()
                    .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return Some(resp);
            }
        }
        None => {
            if !is_loopback(peer.ip()) {
                tracing::warn!(%peer, "{what} refused: not a loopback peer and no --admin-token");
                return Some(text(
                    StatusCode::FORBIDDEN,
                    &format!("{what} is for loopback peers unless --admin-token is set\n"),
                ));
            }
        }
    }
    None
}

/// `GET /sessions`, `DELETE /sessions/ID`, `DELETE /sessions?user=NAME`.
fn sessions<B>(
    ctx: &Ctx,
    peer: SocketAddr,
    posted: &AtomicBool,
    method: &Method,
    req: &Request<B>,
) -> Response<Full<Bytes>> {
    use crate::sessions::{parse_end, parse_list, EndAnswer, EndQuery, ListAnswer};
    let path = req.uri().path();
    let query = req.uri().query();
    let listing = matches!(*method, Method::GET | Method::HEAD);
    if !listing && *method != Method::DELETE {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    if listing && path != "/sessions" {
        return text(
            StatusCode::NOT_FOUND,
            "not found (GET /sessions lists them; DELETE /sessions/ID ends one)\n",
        );
    }
    let what = format!("{method} {path}");
    if let Some(refused) = authorize(ctx, peer, req, &what) {
        return refused;
    }
    let Some(table) = ctx.handle.session_table() else {
        return text(StatusCode::NOT_FOUND, "this daemon lists no sessions\n");
    };
    if listing {
        let q = match parse_list(query) {
            Ok(q) => q,
            Err(e) => return text(StatusCode::BAD_REQUEST, &format!("{e}\n")),
        };
        let page = table.page(q.after, q.limit);
        let next = if page.more {
            page.sessions
                .last()
                .and_then(|s| s.get("id"))
                .and_then(serde_json::Value::as_u64)
        } else {
            None
        };
        return json_compact(
            StatusCode::OK,
            &ListAnswer {
                total: page.total,
                after: q.after,
                limit: q.limit,
                next,
                sessions: page.sessions,
            },
        );
    }
    // Ending the last session of a drain ends the process: the exit waits for this
    // connection to close, so the caller gets its answer (as for POST /drain).
    if !posted.swap(true, Ordering::SeqCst) {
        ctx.handle.admin_drain_request_open();
    }
    let ended =
        match parse_end(path, query) {
            Err(e) => return text(StatusCode::BAD_REQUEST, &format!("{e}\n")),
            Ok(EndQuery::Id(id)) => match table.end(id) {
                Some(s) => vec![s],
                None => return text(StatusCode::NOT_FOUND, &format!("no session {id}\n")),
            },
            Ok(EndQuery::User(user)) => match table.end_user(&user) {
                None => return text(
                    StatusCode::BAD_REQUEST,
                    "this daemon's sessions have no user; end them by id (DELETE /sessions/ID)\n",
                ),
                Some(v) if v.is_empty() => {
                    return text(
                        StatusCode::NOT_FOUND,
                        &format!("no session of user {user}\n"),
                    )
                }
                Some(v) => v,
            },
        };
    ctx.handle.metrics().ended.inc_by(ended.len() as u64);
    let ids: Vec<u64> = ended
        .iter()
        .filter_map(|s| s.get("id").and_then(serde_json::Value::as_u64))
        .collect();
    tracing::info!(%peer, ended = ended.len(), ?ids, "{what}: session(s) ended by the operator");
    json_compact(StatusCode::OK, &EndAnswer { ended })
}

fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

fn bearer_matches<B>(req: &Request<B>, token: &str) -> bool {
    let Some(value) = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some((scheme, presented)) = value.trim().split_once(' ') else {
        return false;
    };
    scheme.eq_ignore_ascii_case("bearer")
        && constant_time_eq(presented.trim().as_bytes(), token.as_bytes())
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn metrics(ctx: &Ctx) -> Response<Full<Bytes>> {
    let mut body = String::new();
    let mut ok = prometheus_client::encoding::text::encode(&mut body, &ctx.registry).is_ok();
    if let Some(own) = &ctx.own {
        // Both encodings end with `# EOF`; keep only the last one.
        if let Some(stripped) = body.strip_suffix("# EOF\n") {
            body.truncate(stripped.len());
        }
        ok &= prometheus_client::encoding::text::encode(&mut body, own).is_ok();
    }
    if !ok {
        return text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n");
    }
    let content_type = match &ctx.exposition {
        Exposition::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        Exposition::PrometheusText { extra } => {
            body = crate::exposition::to_prometheus_text(&body);
            if let Some(extra) = extra {
                extra(&mut body);
            }
            crate::exposition::PROMETHEUS_TEXT
        }
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Full<Bytes>> {
    json_with(status, serde_json::to_string_pretty(value))
}

/// JSON on one line: `/sessions`' pages, up to a thousand sessions each.
fn json_compact<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Full<Bytes>> {
    json_with(status, serde_json::to_string(value))
}

fn json_with(
    status: StatusCode,
    encoded: Result<String, serde_json::Error>,
) -> Response<Full<Bytes>> {
    match encoded {
        Ok(mut body) => {
            body.push('\n');
            let mut resp = Response::new(Full::new(Bytes::from(body)));
            *resp.status_mut() = status;
            resp.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            resp
        }
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode status\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Lifecycle, OnSigterm, Phase, TerminationConfig};
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn ctx(token: Option<&str>, register: bool) -> (Lifecycle, Ctx) {
        let mut cfg =
            TerminationConfig::new(OnSigterm::Drain, Duration::ZERO, Duration::from_secs(30));
        cfg.admin_token = token.map(str::to_string);
        let lifecycle = Lifecycle::without_signals(cfg);
        let mut registry = Registry::default();
        let daemon_metric: Counter = Counter::default();
        daemon_metric.inc();
        registry.register("daemon_things", "Things", daemon_metric);
        if register {
            lifecycle.register_metrics(&mut registry);
        }
        let handle = lifecycle.handle();
        let ctx = Ctx {
            own: own_registry(&handle),
            handle,
            registry: Arc::new(registry),
            exposition: Exposition::OpenMetrics,
            open: Open::default(),
        };
        (lifecycle, ctx)
    }

    fn req(method: Method, path: &str, auth: Option<&str>) -> Request<()> {
        let mut builder = Request::builder().method(method).uri(path);
        if let Some(auth) = auth {
            builder = builder.header(AUTHORIZATION, auth);
        }
        builder.body(()).unwrap()
    }

    async fn call(ctx: &Ctx, peer: &str, r: Request<()>) -> (u16, String) {
        let posted = AtomicBool::new(false);
        let resp = route(ctx, peer.parse().unwrap(), &posted, r).await;
        let status = resp.status().as_u16();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    const LOOPBACK: &str = "127.0.0.1:4000";
    const REMOTE: &str = "10.1.2.3:4000";

    /// A table of ids 1..=n (unit tests of the routes; the daemons' tests use theirs).
    struct Numbers(Mutex<Vec<u64>>);

    impl crate::sessions::SessionTable for Numbers {
        fn page(&self, after: u64, limit: usize) -> crate::sessions::SessionPage {
            let ids = self.0.lock();
            let rest: Vec<u64> = ids.iter().copied().filter(|&i| i > after).collect();
            crate::sessions::SessionPage {
                total: ids.len() as u64,
                sessions: rest
                    .iter()
                    .take(limit)
                    .map(|i| serde_json::json!({ "id": i }))
                    .collect(),
                more: rest.len() > limit,
            }
        }
        fn end(&self, id: u64) -> Option<serde_json::Value> {
            let mut ids = self.0.lock();
            let at = ids.iter().position(|&i| i == id)?;
            ids.remove(at);
            Some(serde_json::json!({ "id": id }))
        }
    }

    fn with_numbers(ctx: &Ctx, n: u64) {
        ctx.handle
            .provide_sessions(Arc::new(Numbers(Mutex::new((1..=n).collect()))));
    }

    #[tokio::test]
    async fn sessions_are_paged_in_id_order() {
        let (_lc, ctx) = ctx(None, true);
        let (code, body) = call(&ctx, LOOPBACK, req(Method::GET, "/sessions", None)).await;
        assert_eq!(
            (code, body.as_str()),
            (404, "this daemon lists no sessions\n")
        );
        with_numbers(&ctx, 5);
        let page = |body: &str| -> serde_json::Value { serde_json::from_str(body).unwrap() };
        let (code, body) = call(&ctx, LOOPBACK, req(Method::GET, "/sessions", None)).await;
        assert_eq!(code, 200, "{body}");
        let p = page(&body);
        assert_eq!(p["total"], 5);
        assert_eq!(p["limit"], 100);
        assert_eq!(p["next"], serde_json::Value::Null);
        assert_eq!(p["sessions"].as_array().unwrap().len(), 5);
        let (_, body) = call(&ctx, LOOPBACK, req(Method::GET, "/sessions?limit=2", None)).await;
        let p = page(&body);
        assert_eq!(p["sessions"], serde_json::json!([{"id": 1}, {"id": 2}]));
        assert_eq!(p["next"], 2);
        let (_, body) = call(
            &ctx,
            LOOPBACK,
            req(Method::GET, "/sessions?limit=2&after=4", None),
        )
        .await;
        let p = page(&body);
        assert_eq!(p["sessions"], serde_json::json!([{"id": 5}]));
        assert_eq!(p["next"], serde_json::Value::Null);
        assert_eq!(p["after"], 4);
        for (path, says) in [
            ("/sessions?limit=0", "limit: `0` is not valid; give 1 to 1000 (default 100)\n"),
            ("/sessions?limit=5000", "limit: `5000` is not valid; give 1 to 1000 (default 100)\n"),
            ("/sessions?after=abc", "after: `abc` is not a session id; give the `next` of the previous page (a whole number)\n"),
            ("/sessions?sort=age", "unknown parameter `sort`; GET /sessions takes limit and after\n"),
        ] {
            let (code, body) = call(&ctx, LOOPBACK, req(Method::GET, path, None)).await;
            assert_eq!((code, body.as_str()), (400, says), "{path}");
        }
        let (code, _) = call(&ctx, LOOPBACK, req(Method::GET, "/sessions/3", None)).await;
        assert_eq!(code, 404);
        let (code, _) = call(&ctx, LOOPBACK, req(Method::POST, "/sessions", None)).await;
        assert_eq!(code, 405);
    }

    #[tokio::test]
    async fn sessions_end_one_at_a_time_and_are_counted() {
        let (_lc, ctx) = ctx(None, true);
        with_numbers(&ctx, 3);
        let (code, body) = call(&ctx, LOOPBACK, req(Method::DELETE, "/sessions/2", None)).await;
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v, serde_json::json!({"ended": [{"id": 2}]}));
        let (code, body) = call(&ctx, LOOPBACK, req(Method::DELETE, "/sessions/2", None)).await;
        assert_eq!((code, body.as_str()), (404, "no session 2\n"));
        let (code, body) = call(&ctx, LOOPBACK, req(Method::DELETE, "/sessions/two", None)).await;
        assert_eq!(
            (code, body.as_str()),
            (
                400,
                "`two` is not a session id (a whole number, as GET /sessions lists them)\n"
            )
        );
        // This table has no users.
        let (code, body) = call(
            &ctx,
            LOOPBACK,
            req(Method::DELETE, "/sessions?user=alice", None),
        )
        .await;
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("have no user"), "{body}");
        let (_, body) = call(&ctx, LOOPBACK, req(Method::GET, "/metrics", None)).await;
        assert!(body.contains("lastcall_sessions_ended_total 1\n"), "{body}");
        let (_, body) = call(&ctx, LOOPBACK, req(Method::GET, "/sessions", None)).await;
        assert!(body.contains("\"total\":2"), "{body}");
    }

    #[tokio::test]
    async fn sessions_follow_the_rule_of_post_drain() {
        let (_lc, ctx) = ctx(None, true);
        with_numbers(&ctx, 3);
        for method in [Method::GET, Method::DELETE] {
            let path = if method == Method::GET {
                "/sessions"
            } else {
                "/sessions/1"
            };
            let (code, body) = call(&ctx, REMOTE, req(method.clone(), path, None)).await;
            assert_eq!(code, 403, "{method} {body}");
            assert_eq!(
                body,
                format!("{method} {path} is for loopback peers unless --admin-token is set\n")
            );
        }
        let (code, _) = call(
            &ctx,
            "[::ffff:127.0.0.1]:1",
            req(Method::GET, "/sessions", None),
        )
        .await;
        assert_eq!(code, 200);
        let (_lc, ctx) = self::ctx(Some("s3cret"), true);
        with_numbers(&ctx, 3);
        for peer in [LOOPBACK, REMOTE] {
            for auth in [None, Some("Bearer nope")] {
                let (code, _) = call(&ctx, peer, req(Method::DELETE, "/sessions/1", auth)).await;
                assert_eq!(code, 401, "{peer} {auth:?}");
                let (code, _) = call(&ctx, peer, req(Method::GET, "/sessions", auth)).await;
                assert_eq!(code, 401, "{peer} {auth:?}");
            }
        }
        let (code, _) = call(
            &ctx,
            REMOTE,
            req(Method::GET, "/sessions", Some("Bearer s3cret")),
        )
        .await;
        assert_eq!(code, 200);
        let (code, _) = call(
            &ctx,
            REMOTE,
            req(Method::DELETE, "/sessions/1", Some("Bearer s3cret")),
        )
        .await;
        assert_eq!(code, 200);
    }

    #[tokio::test]
    async fn metrics_hold_the_daemon_registry_and_lastcall() {
        for register in [false, true] {
            let (_lc, ctx) = ctx(None, register);
            let _g = ctx.handle.session(crate::PeerId::named("x"));
            let (code, body) = call(&ctx, REMOTE, req(Method::GET, "/metrics", None)).await;
            assert_eq!(code, 200);
            assert!(body.contains("daemon_things_total 1"), "{body}");
            assert!(body.contains("lastcall_sessions 1"), "{body}");
            assert!(body.contains("lastcall_peers 1"), "{body}");
            assert!(body.contains("lastcall_drain_phase 0"), "{body}");
            assert!(body.contains("lastcall_sessions_refused_total 0"), "{body}");
            assert!(body.contains("lastcall_drain_duration_seconds"), "{body}");
            assert!(
                body.contains("lastcall_drain_deadline_timestamp_seconds 0"),
                "{body}"
            );
            assert!(body.contains("lastcall_drain_timeout_seconds 30"), "{body}");
            // The process's own, under client_golang's names (coraza-spoa serves them), once.
            for name in [
                "process_cpu_seconds_total ",
                "process_resident_memory_bytes ",
                "process_virtual_memory_bytes ",
                "process_open_fds ",
                "process_max_fds ",
                "process_threads ",
                "process_start_time_seconds ",
            ] {
                let line = body
                    .lines()
                    .find(|l| l.starts_with(name))
                    .unwrap_or_else(|| panic!("no {name}in {body}"));
                let value: f64 = line[name.len()..].trim().parse().unwrap();
                assert!(value > 0.0 || name.starts_with("process_cpu"), "{line}");
                assert_eq!(body.matches(&format!("\n{name}")).count(), 1, "{body}");
            }
            assert_eq!(body.matches("# EOF").count(), 1, "{body}");
            assert!(body.ends_with("# EOF\n"));
        }
    }

    #[tokio::test]
    async fn prometheus_text_rewrites_the_registry_and_adds_the_daemons_own_families() {
        let (_lc, mut ctx) = ctx(None, true);
        ctx.exposition = Exposition::PrometheusText {
            extra: Some(Arc::new(|out: &mut String| {
                out.push_str("# TYPE coturn_named counter\ncoturn_named 4\n");
            })),
        };
        let resp = metrics(&ctx);
        assert_eq!(
            resp.headers().get(CONTENT_TYPE).unwrap(),
            "text/plain; version=0.0.4; charset=utf-8"
        );
        let (code, body) = call(&ctx, REMOTE, req(Method::GET, "/metrics", None)).await;
        assert_eq!(code, 200);
        assert!(
            body.contains("# TYPE daemon_things_total counter\ndaemon_things_total 1\n"),
            "{body}"
        );
        assert!(body.contains("# TYPE lastcall_sessions gauge\n"), "{body}");
        assert!(
            body.ends_with("# TYPE coturn_named counter\ncoturn_named 4\n"),
            "{body}"
        );
        assert!(!body.contains("# EOF"), "{body}");
    }

    #[tokio::test]
    async fn routes() {
        let (_lc, ctx) = ctx(None, true);
        assert_eq!(
            call(&ctx, REMOTE, req(Method::GET, "/livez", None)).await.0,
            200
        );
        assert_eq!(
            call(&ctx, REMOTE, req(Method::GET, "/readyz", None))
                .await
                .0,
            200
        );
        // coturn's health check of its Prometheus port.
        assert_eq!(
            call(&ctx, REMOTE, req(Method::GET, "/", None)).await,
            (200, "ok\n".to_string())
        );
        assert_eq!(
            call(&ctx, REMOTE, req(Method::POST, "/", None)).await.0,
            405
        );
        assert_eq!(
            call(&ctx, REMOTE, req(Method::GET, "/drain/x", None))
                .await
                .0,
            404
        );
        assert_eq!(
            call(&ctx, REMOTE, req(Method::DELETE, "/drain", None))
                .await
                .0,
            405
        );
        let (code, body) = call(&ctx, REMOTE, req(Method::GET, "/drain", None)).await;
        assert_eq!(code, 200);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["phase"], "serving");
        assert_eq!(json["trigger"], serde_json::Value::Null);
    }

    #[tokio::test]
    async fn readiness_is_down_while_starting() {
        let lifecycle = Lifecycle::build(
            TerminationConfig::new(OnSigterm::Drain, Duration::ZERO, Duration::from_secs(30)),
            Phase::Starting,
        );
        let handle = lifecycle.handle();
        let ctx = Ctx {
            own: own_registry(&handle),
            handle: handle.clone(),
            registry: Arc::new(Registry::default()),
            exposition: Exposition::OpenMetrics,
            open: Open::default(),
        };
        let (tx, rx) = futures::channel::mpsc::unbounded::<crate::Trigger>();
        let run = tokio::spawn(lifecycle.drive(Box::pin(rx)));
        let (code, body) = call(&ctx, REMOTE, req(Method::GET, "/readyz", None)).await;
        assert_eq!((code, body.as_str()), (503, "starting\n"));
        assert_eq!(
            call(&ctx, REMOTE, req(Method::GET, "/livez", None)).await.0,
            200
        );
        let (_, body) = call(&ctx, REMOTE, req(Method::GET, "/metrics", None)).await;
        assert!(body.contains("lastcall_drain_phase 4"), "{body}");
        let (_, body) = call(&ctx, REMOTE, req(Method::GET, "/drain", None)).await;
        assert!(body.contains("\"phase\": \"starting\""), "{body}");
        handle.ready();
        handle.watch().changed().await;
        assert_eq!(
            call(&ctx, REMOTE, req(Method::GET, "/readyz", None))
                .await
                .0,
            200
        );
        let (_, body) = call(&ctx, REMOTE, req(Method::GET, "/metrics", None)).await;
        assert!(body.contains("lastcall_drain_phase 0"), "{body}");
        drop(tx);
        handle.start_drain(crate::Trigger::Api);
        assert_eq!(run.await.unwrap().outcome.reason, crate::EndReason::Idle);
    }

    #[tokio::test]
    async fn post_drain_without_token_is_for_loopback_only() {
        let (lc, ctx) = ctx(None, true);
        let (tx, rx) = futures::channel::mpsc::unbounded::<crate::Trigger>();
        let run = tokio::spawn(lc.run_with(rx));
        let (code, _) = call(&ctx, REMOTE, req(Method::POST, "/drain", None)).await;
        assert_eq!(code, 403);
        let (code, _) = call(
            &ctx,
            "[::ffff:10.1.2.3]:1",
            req(Method::POST, "/drain", None),
        )
        .await;
        assert_eq!(code, 403);
        assert_eq!(ctx.handle.phase(), Phase::Serving);
        let _g = ctx.handle.session(crate::PeerId::named("x"));
        let (code, body) = call(&ctx, "[::1]:1", req(Method::POST, "/drain", None)).await;
        assert_eq!(code, 202, "{body}");
        assert!(body.contains("\"trigger\": \"POST /drain\""), "{body}");
        assert_eq!(ctx.handle.phase(), Phase::Refusing);
        assert_eq!(
            call(&ctx, REMOTE, req(Method::GET, "/readyz", None))
                .await
                .0,
            503
        );
        assert_eq!(
            call(&ctx, REMOTE, req(Method::GET, "/livez", None)).await.0,
            200
        );
        drop(tx);
        drop(_g);
        let outcome = run.await.unwrap();
        assert_eq!(outcome.trigger, Some(crate::Trigger::Admin));
    }

    #[tokio::test]
    async fn post_drain_with_token_requires_it_from_every_peer() {
        let (lc, ctx) = ctx(Some("s3cret"), true);
        let (_tx, rx) = futures::channel::mpsc::unbounded::<crate::Trigger>();
        let run = tokio::spawn(lc.run_with(rx));
        let _g = ctx.handle.session(crate::PeerId::named("x"));
        for (peer, auth) in [
            (LOOPBACK, None),
            (LOOPBACK, Some("Bearer wrong")),
            (LOOPBACK, Some("Basic czNjcmV0")),
            (LOOPBACK, Some("Bearer s3cre")),
            (LOOPBACK, Some("s3cret")),
            (REMOTE, None),
        ] {
            let (code, _) = call(&ctx, peer, req(Method::POST, "/drain", auth)).await;
            assert_eq!(code, 401, "{peer} {auth:?}");
        }
        assert_eq!(ctx.handle.phase(), Phase::Serving);
        let (code, _) = call(
            &ctx,
            REMOTE,
            req(Method::POST, "/drain", Some("bearer s3cret")),
        )
        .await;
        assert_eq!(code, 202);
        assert_eq!(ctx.handle.phase(), Phase::Refusing);
        drop(_g);
        run.await.unwrap();
    }

    #[tokio::test]
    async fn bad_requests_do_not_hurt_the_listener() {
        let lifecycle = Lifecycle::without_signals(TerminationConfig::new(
            OnSigterm::Drain,
            Duration::ZERO,
            Duration::from_secs(30),
        ));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server =
            serve_listener(listener, &lifecycle.handle(), Arc::new(Registry::default())).unwrap();
        let addr = server.local_addr().unwrap();
        let long_header = format!("GET /livez HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(1 << 20));
        let bad: Vec<Vec<u8>> = vec![
            b"GARBAGE\r\n\r\n".to_vec(),
            b"GET /livez HTTP/9.9\r\n\r\n".to_vec(),
            b"\xff\xfe\x00\x01\r\n\r\n".to_vec(),
            b"GET /\xff HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            b"POST /drain HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n".to_vec(),
            b"POST /drain HTTP/1.1\r\nAuthorization: \xff\xff\r\nContent-Length: 0\r\n\r\n"
                .to_vec(),
            long_header.into_bytes(),
        ];
        for bytes in bad {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let _ = s.write_all(&bytes).await;
            let _ = s.shutdown().await;
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        }
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        assert!(
            out.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&out)
        );
        server.shutdown();
    }

    /// The listener answers while the runtime that started it is blocked: it has a thread
    /// and a runtime of its own.
    #[test]
    fn answers_while_the_daemon_runtime_is_blocked() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let lifecycle = Lifecycle::without_signals(TerminationConfig::new(
            OnSigterm::Drain,
            Duration::ZERO,
            Duration::from_secs(30),
        ));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = runtime.block_on(async {
            serve_listener(listener, &lifecycle.handle(), Arc::new(Registry::default())).unwrap()
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let probe = std::thread::spawn(move || {
            let _ = rx.recv();
            let started = std::time::Instant::now();
            let reply = blocking_get(addr, "/livez");
            (reply, started.elapsed())
        });
        // The daemon's only runtime thread is busy (an evaluation, a blocked task).
        runtime.block_on(async {
            tx.send(()).unwrap();
            std::thread::sleep(Duration::from_secs(3));
        });
        let (reply, took) = probe.join().unwrap();
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(took < Duration::from_secs(2), "answered after {took:?}");
        server.shutdown();
    }

    /// A connection beyond the bound closes the oldest (a probe still gets in); an idle one
    /// is closed after `IDLE_TIMEOUT`; the listener answers throughout.
    #[tokio::test(start_paused = true)]
    async fn strangers_cannot_hold_it() {
        let lc = Lifecycle::without_signals(TerminationConfig::new(
            OnSigterm::Drain,
            Duration::ZERO,
            Duration::from_secs(30),
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ctx = Arc::new(Ctx {
            own: own_registry(&lc.handle()),
            handle: lc.handle(),
            registry: Arc::new(Registry::default()),
            exposition: Exposition::OpenMetrics,
            open: Open::default(),
        });
        tokio::spawn(accept_loop(listener, Arc::clone(&ctx)));
        let mut held = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        while ctx.open.len() < MAX_CONNECTIONS {
            tokio::task::yield_now().await;
        }
        let mut probe = tokio::net::TcpStream::connect(addr).await.unwrap();
        probe
            .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(1), probe.read_to_end(&mut answer))
            .await
            .expect("the probe is answered at once")
            .unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200"));
        let mut buf = [0u8; 256];
        let mut oldest = held.remove(0);
        let got = tokio::time::timeout(Duration::from_secs(1), oldest.read(&mut buf)).await;
        assert!(
            matches!(got, Ok(Ok(0) | Err(_))),
            "the oldest is closed: {got:?}"
        );
        // One of them keeps its connection alive after a request, then falls silent.
        held[0]
            .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let n = held[0].read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        let started = tokio::time::Instant::now();
        for mut s in held {
            let got = tokio::time::timeout(IDLE_TIMEOUT * 2, s.read(&mut buf)).await;
            assert!(
                matches!(got, Ok(Ok(0) | Err(_))),
                "closed when idle: {got:?}"
            );
        }
        assert!(started.elapsed() <= IDLE_TIMEOUT + Duration::from_secs(1));
        while ctx.open.len() > 0 {
            tokio::task::yield_now().await;
        }
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        assert!(out.starts_with(b"HTTP/1.1 200"));
    }

    fn blocking_get(addr: SocketAddr, path: &str) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn loopback_and_tokens() {
        assert!(is_loopback("127.0.0.1".parse().unwrap()));
        assert!(is_loopback("127.1.2.3".parse().unwrap()));
        assert!(is_loopback("::1".parse().unwrap()));
        assert!(is_loopback("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!is_loopback("10.0.0.1".parse().unwrap()));
        assert!(!is_loopback("::ffff:10.0.0.1".parse().unwrap()));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
