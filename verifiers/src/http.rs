//! A verifier behind a URL: each request is POSTed as JSON, and the body of
//! the answer is the response (`{"score"}` or `{"error"}`; its `id`, when
//! present, must be the request's).
//!
//! reqwest (rustls) runs on a current-thread tokio runtime that a thread of
//! this verifier owns, so calls work from any thread, inside an async
//! runtime or not, and dropping the verifier never drops a runtime inside
//! another. A transport error, a status other than 2xx, a timeout or a body
//! that is not a response is [`Score::Unscorable`], counted.
use crate::protocol::{parse_response, quote, request_line};
use crate::{Counters, Endpoint, Request, Score, VerifierError, VerifierSpec, VerifierStats};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

/// The largest response body read.
const MAX_BODY: usize = 1 << 20;

/// An HTTP verifier. Dropping it stops its runtime (requests in flight fail).
pub struct HttpVerifier {
    spec: VerifierSpec,
    url: String,
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    counts: Arc<Counters>,
    next_id: AtomicU64,
}

/// How one exchange ended.
enum Exchange {
    Body(String),
    Timeout,
    Failed(String),
}

impl HttpVerifier {
    /// Checks the URL and starts the runtime (no request is made).
    pub fn start(spec: VerifierSpec) -> Result<Self, VerifierError> {
        let invalid = |reason: String| VerifierError::Invalid { name: spec.name.clone(), reason };
        let url = match &spec.endpoint {
            Endpoint::Url(u) if u.starts_with("http://") || u.starts_with("https://") => u.clone(),
            Endpoint::Url(u) => return Err(invalid(format!("url \"{u}\" is not http:// or https://"))),
            Endpoint::Command(_) => return Err(invalid("not a url".into())),
        };
        let client = reqwest::Client::builder()
            .timeout(spec.timeout)
            .build()
            .map_err(|e| invalid(format!("cannot build an HTTP client: {e}")))?;
        let (handle_tx, handle_rx) = mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("verifier-{}-http", spec.name))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(rt.handle().clone()));
                rt.block_on(async {
                    let _ = stopped.await;
                });
            })
            .map_err(|e| invalid(format!("cannot start its thread: {e}")))?;
        let runtime = handle_rx
            .recv()
            .unwrap_or_else(|_| Err("its thread ended".into()))
            .map_err(|e| invalid(format!("cannot start a runtime: {e}")))?;
        Ok(HttpVerifier { spec, url, client, runtime, stop: Some(stop), thread: Some(thread), counts: Arc::default(), next_id: AtomicU64::new(0) })
    }

    /// The spec it was started with.
    pub fn spec(&self) -> &VerifierSpec {
        &self.spec
    }

    /// What it did so far.
    pub fn stats(&self) -> VerifierStats {
        self.counts.snapshot()
    }

    /// POSTs every request at once, then waits for all answers.
    pub fn score_all(&self, reqs: &[Request<'_>]) -> Vec<Score> {
        let waits: Vec<(u64, mpsc::Receiver<Exchange>)> = reqs
            .iter()
            .map(|req| {
                Counters::add(&self.counts.requests);
                let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
                let (tx, rx) = mpsc::channel();
                let post = self.client.post(&self.url).header("content-type", "application/json").body(request_line(id, req));
                self.runtime.spawn(async move {
                    let _ = tx.send(exchange(post).await);
                });
                (id, rx)
            })
            .collect();
        let backstop = self.spec.timeout + Duration::from_secs(2);
        waits
            .into_iter()
            .map(|(id, rx)| {
                let ex = match rx.recv_timeout(backstop) {
                    Ok(ex) => ex,
                    Err(mpsc::RecvTimeoutError::Timeout) => Exchange::Timeout,
                    Err(mpsc::RecvTimeoutError::Disconnected) => Exchange::Failed("the verifier was shut down".into()),
                };
                self.judge(id, ex)
            })
            .collect()
    }

    /// The score an exchange gives, counted.
    fn judge(&self, id: u64, ex: Exchange) -> Score {
        let c = &self.counts;
        let fail = |counter: &AtomicU64, reason: String| {
            Counters::add(counter);
            Score::Unscorable { reason }
        };
        match ex {
            Exchange::Timeout => fail(&c.timeouts, format!("no answer within {:?}", self.spec.timeout)),
            Exchange::Failed(why) => fail(&c.lost, why),
            Exchange::Body(body) => {
                let r = parse_response(body.trim());
                match (r.id, r.outcome) {
                    (Some(other), _) if other != id => {
                        fail(&c.bad_responses, format!("not a valid response: it names id {other}, the request was {id}"))
                    }
                    (_, Err(why)) => fail(&c.bad_responses, format!("not a valid response: {why}")),
                    (_, Ok(score)) => {
                        c.answered(&score);
                        score
                    }
                }
            }
        }
    }
}

/// Sends one POST and reads at most [`MAX_BODY`] bytes of its answer.
async fn exchange(post: reqwest::RequestBuilder) -> Exchange {
    let failed = |e: reqwest::Error| if e.is_timeout() { Exchange::Timeout } else { Exchange::Failed(format!("HTTP request failed: {e}")) };
    let mut resp = match post.send().await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let status = resp.status();
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() > MAX_BODY {
                    return Exchange::Failed(format!("HTTP {status}: a body longer than {MAX_BODY} bytes"));
                }
            }
            Ok(None) => break,
            Err(e) => return failed(e),
        }
    }
    let text = String::from_utf8_lossy(&body).into_owned();
    if !status.is_success() {
        return Exchange::Failed(format!("HTTP {status}: {}", quote(text.trim())));
    }
    Exchange::Body(text)
}

impl Drop for HttpVerifier {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
