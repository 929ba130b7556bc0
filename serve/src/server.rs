//! The HTTP server: routes, the guards every request passes (in-flight limit,
//! key, body size), `/v1/models`, `/health` and `/metrics`.
use crate::batcher::{Batcher, Readiness};
use crate::error::ApiError;
use crate::sessions::Auth;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rlmesh_core::tools::formats::ToolFormat;
use rlmesh_model::Tokenizer;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The metrics an endpoint updates (defined in the process's metrics table).
#[derive(Clone)]
pub struct ServeMetrics {
    /// Requests answered, by endpoint and HTTP status.
    pub requests: prometheus::IntCounterVec,
    /// Seconds from a request's arrival to its answer, by endpoint.
    pub seconds: prometheus::HistogramVec,
    /// Rows of each engine call.
    pub batch_rows: prometheus::Histogram,
    /// The process's whole registry in Prometheus' text format (served at `/metrics`).
    pub encode: Arc<dyn Fn() -> String + Send + Sync>,
}

/// What an endpoint serves and how it guards itself.
#[derive(Clone)]
pub struct ServeConfig {
    /// The model's id in `/v1/models` and requests.
    pub model_name: String,
    /// Other names a request may use for the model (e.g. the directory's name).
    pub aliases: Vec<String>,
    /// Answer whatever model a request names (agent programs in training name
    /// the model they were written for; the policy answers).
    pub any_model: bool,
    /// How the model writes tool calls.
    pub tool_format: ToolFormat,
    /// Who may call.
    pub auth: Auth,
    /// Largest request body in bytes (413 past it).
    pub max_body_bytes: usize,
    /// Most requests in flight at once (429 past it).
    pub max_in_flight: usize,
    /// Metrics to update, if the process keeps any.
    pub metrics: Option<ServeMetrics>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            model_name: "model".into(),
            aliases: vec![],
            any_model: false,
            tool_format: ToolFormat::Hermes,
            auth: Auth::Open,
            max_body_bytes: 2 << 20,
            max_in_flight: 256,
            metrics: None,
        }
    }
}

/// Shared state of the handlers.
pub(crate) struct Shared {
    pub(crate) config: ServeConfig,
    pub(crate) tokenizer: Arc<Tokenizer>,
    pub(crate) batcher: Batcher,
    in_flight: AtomicUsize,
    pub(crate) created: u64,
    ids: AtomicUsize,
}

impl Shared {
    /// A fresh id with `prefix` (`chatcmpl-…`, `call_…`).
    pub(crate) fn next_id(&self, prefix: &str) -> String {
        format!("{prefix}{:x}{:06x}", self.created, self.ids.fetch_add(1, Ordering::Relaxed))
    }

    /// The model's context, or 503 while the engine is not serving.
    pub(crate) fn context(&self) -> Result<usize, ApiError> {
        match self.batcher.readiness() {
            Readiness::Ready { context } => Ok(context),
            Readiness::Loading => Err(ApiError::unavailable("the model is still loading")),
            Readiness::Failed(why) => Err(ApiError::unavailable(format!("the engine is not serving: {why}"))),
        }
    }

    /// The sessions' say over a request's sampling (training's temperature).
    pub(crate) fn adjust(&self, key: &str, params: &mut rlmesh_model::SamplingParams) {
        if let Auth::Sessions(sessions) = &self.config.auth {
            sessions.adjust(key, params);
        }
    }

    /// 404 unless `model` names this endpoint's model (empty: the default).
    pub(crate) fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if self.config.any_model || model.is_empty() || model == self.config.model_name || self.config.aliases.iter().any(|a| a == model) {
            return Ok(());
        }
        Err(ApiError::not_found(format!("The model `{model}` does not exist. This endpoint serves `{}`.", self.config.model_name), "model_not_found"))
    }
}

/// A running endpoint: its address; dropping it (or [`Endpoint::shutdown`]) stops it.
pub struct Endpoint {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl Endpoint {
    /// Serves `batcher` on `listener` (a bound tokio listener) until shut down.
    pub fn start(listener: tokio::net::TcpListener, config: ServeConfig, tokenizer: Arc<Tokenizer>, batcher: Batcher) -> std::io::Result<Endpoint> {
        let addr = listener.local_addr()?;
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let shared = Arc::new(Shared { config, tokenizer, batcher, in_flight: AtomicUsize::new(0), created, ids: AtomicUsize::new(0) });
        let app = router(shared.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await;
        });
        Ok(Endpoint { addr, stop: Some(stop), task: Some(task), shared })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/v1`, what `OPENAI_BASE_URL` is set to.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Whether the engine serves now.
    pub fn readiness(&self) -> Readiness {
        self.shared.batcher.readiness()
    }

    /// Stops accepting, lets open requests finish, then stops the engine.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let shared = self.shared.clone();
        let _ = tokio::task::spawn_blocking(move || shared.batcher.shutdown()).await;
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(shared)
}

/// Counts a request in flight for as long as it lives.
pub(crate) struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The guards of a POST: the in-flight limit (429), the key (401) and the body
/// size (413). Returns the body and the key.
async fn admit<'a>(s: &'a Shared, headers: &HeaderMap, body: Body) -> Result<(InFlight<'a>, Bytes, String), ApiError> {
    let n = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let guard = InFlight(&s.in_flight);
    if n > s.config.max_in_flight {
        return Err(ApiError::too_many(s.config.max_in_flight));
    }
    let key = bearer(headers);
    authorize(&s.config.auth, &key)?;
    let bytes = read_body(body, s.config.max_body_bytes).await?;
    Ok((guard, bytes, key))
}

/// The body, or 413 past `limit` bytes. An oversized body is still read (up to
/// 16 times the limit, then the connection is dropped) so that a client that
/// sends it whole before reading gets the answer rather than a broken pipe.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = vec![];
    let mut seen = 0usize;
    while let Some(frame) = stream.next().await {
        let frame = frame.map_err(|e| ApiError::bad_request(format!("reading the body: {e}"), None))?;
        seen = seen.saturating_add(frame.len());
        if seen > limit.saturating_mul(16) {
            break;
        }
        if seen <= limit {
            buf.extend_from_slice(&frame);
        }
    }
    if seen > limit {
        return Err(ApiError::too_large(limit));
    }
    Ok(Bytes::from(buf))
}

fn bearer(headers: &HeaderMap) -> String {
    let value = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
    value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")).unwrap_or("").trim().to_string()
}

pub(crate) fn authorize(auth: &Auth, key: &str) -> Result<(), ApiError> {
    match auth {
        Auth::Open => Ok(()),
        Auth::Key(k) if k == key => Ok(()),
        Auth::Key(_) if key.is_empty() => Err(ApiError::unauthorized("You didn't provide an API key: pass it as `Authorization: Bearer KEY`.")),
        Auth::Key(_) => Err(ApiError::unauthorized("Incorrect API key provided.")),
        Auth::Sessions(sessions) => sessions.check(key).map_err(ApiError::unauthorized),
    }
}

/// Answers `result`, counting it under `endpoint`.
fn answer(s: &Shared, endpoint: &str, started: Instant, result: Result<Response, ApiError>) -> Response {
    let response = result.unwrap_or_else(IntoResponse::into_response);
    if let Some(m) = &s.config.metrics {
        m.requests.with_label_values(&[endpoint, response.status().as_str()]).inc();
        m.seconds.with_label_values(&[endpoint]).observe(started.elapsed().as_secs_f64());
    }
    response
}

async fn chat_completions(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let result = async {
        let (_guard, bytes, key) = admit(&s, &headers, body).await?;
        crate::complete::chat(&s, &bytes, &key).await
    }
    .await;
    answer(&s, "chat", started, result)
}

async fn completions(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let result = async {
        let (_guard, bytes, key) = admit(&s, &headers, body).await?;
        crate::complete::text(&s, &bytes, &key).await
    }
    .await;
    answer(&s, "completions", started, result)
}

async fn models(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&s.config.auth, &bearer(&headers)) {
        return e.into_response();
    }
    let context = match s.batcher.readiness() {
        Readiness::Ready { context } => json!(context),
        _ => json!(null),
    };
    let name = &s.config.model_name;
    Json(json!({"object": "list", "data": [{"id": name, "object": "model", "created": s.created, "owned_by": "rlmesh", "root": name, "parent": null, "max_model_len": context}]}))
        .into_response()
}

async fn health(State(s): State<Arc<Shared>>) -> Response {
    match s.context() {
        Ok(_) => StatusCode::OK.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    match &s.config.metrics {
        Some(m) => ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], (m.encode)()).into_response(),
        None => ApiError::not_found("this endpoint keeps no metrics", "not_found").into_response(),
    }
}

async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError::not_found(format!("no route {}", uri.path()), "not_found").into_response()
}
