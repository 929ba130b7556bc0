//! The batcher: concurrent requests become one engine call.
//!
//! Requests arrive as [`Job`]s on a queue. The batcher thread owns the
//! [`Engine`]; it takes the first waiting job, waits a short window for more,
//! then runs every waiting job that can share a batch in one `generate` call:
//! greedy jobs together, unseeded sampled jobs with the same temperature, top-p
//! and top-k together (one sampler seed for the batch), and a job with its own
//! seed alone (its tokens then depend on its seed only). Each job's `n` samples
//! are `n` rows of the batch with the same prompt (prefilled once). The batch
//! runs to the longest job's `max_tokens`; each job's rows are cut to its own.
use crate::engine::{Engine, TopTokens};
use rlmesh_model::{Completion, FinishReason, SamplingParams};
use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// One request's generation work.
pub struct Job {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Samples wanted.
    pub n: usize,
    /// Sampling; `max_new_tokens` is this job's own limit.
    pub params: SamplingParams,
    /// The request set a seed (sampled jobs with a seed run in a batch of their own).
    pub seeded: bool,
    /// Most likely tokens wanted per generated position (0: none).
    pub top_logprobs: usize,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Result<JobOutput, String>>,
}

/// What a [`Job`] produced.
#[derive(Debug)]
pub struct JobOutput {
    /// The `n` completions.
    pub completions: Vec<Completion>,
    /// Per completion, per generated token, the most likely tokens (empty unless asked).
    pub top: Vec<Vec<TopTokens>>,
    /// The policy version that sampled them.
    pub version: u64,
    /// Rows in the engine batch this job ran in (its own included).
    pub batch_rows: usize,
}

/// Whether the engine is ready to serve.
#[derive(Clone, Debug, PartialEq)]
pub enum Readiness {
    /// The engine is being built (weights loading).
    Loading,
    /// Serving; the model's context in tokens.
    Ready {
        /// Context length.
        context: usize,
    },
    /// The engine could not be built, or its thread ended.
    Failed(String),
}

/// How the batcher groups work.
#[derive(Clone, Debug)]
pub struct BatchPolicy {
    /// How long the first waiting job waits for others to share its batch.
    pub wait: Duration,
    /// Most rows (samples) in one engine call.
    pub max_rows: usize,
}

impl Default for BatchPolicy {
    fn default() -> Self {
        BatchPolicy { wait: Duration::from_millis(2), max_rows: 64 }
    }
}

/// The handle requests use: a queue to the batcher thread and its readiness.
pub struct Batcher {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    readiness: Arc<Mutex<Readiness>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Batcher {
    /// Starts the batcher thread; `build` makes the engine on it (the batcher
    /// reports [`Readiness::Loading`] until it returns). `batch_rows` observes
    /// the rows of every engine call.
    pub fn spawn<E, F>(build: F, policy: BatchPolicy, batch_rows: Option<prometheus::Histogram>) -> Batcher
    where
        E: Engine,
        F: FnOnce() -> Result<E, String> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Job>();
        let readiness = Arc::new(Mutex::new(Readiness::Loading));
        let state = readiness.clone();
        let thread = std::thread::Builder::new()
            .name("serve-batcher".into())
            .spawn(move || {
                let mut engine = match build() {
                    Ok(e) => e,
                    Err(e) => {
                        *state.lock().unwrap_or_else(|p| p.into_inner()) = Readiness::Failed(e);
                        return;
                    }
                };
                *state.lock().unwrap_or_else(|p| p.into_inner()) = Readiness::Ready { context: engine.context() };
                run(&mut engine, &rx, &policy, batch_rows.as_ref());
                *state.lock().unwrap_or_else(|p| p.into_inner()) = Readiness::Failed("the engine has shut down".into());
            })
            .expect("spawning the batcher thread");
        Batcher { jobs: Mutex::new(Some(tx)), readiness, thread: Mutex::new(Some(thread)) }
    }

    /// Whether the engine serves now.
    pub fn readiness(&self) -> Readiness {
        self.readiness.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Queues a job; gives it back when the batcher is gone.
    pub fn submit(&self, job: Job) -> Result<(), Box<Job>> {
        match self.jobs.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(tx) => tx.send(job).map_err(|e| Box::new(e.0)),
            None => Err(Box::new(job)),
        }
    }

    /// Stops taking jobs, lets the queued ones finish and joins the thread.
    pub fn shutdown(&self) {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Which jobs may share an engine call.
#[derive(Clone, Debug, PartialEq)]
enum Key {
    Greedy { stops: Vec<String>, stop_ids: Vec<u32> },
    Sampled { temperature: u64, top_p: u64, top_k: i64, stops: Vec<String>, stop_ids: Vec<u32> },
    Alone,
}

fn key(job: &Job) -> Key {
    let p = &job.params;
    if p.temperature == 0.0 {
        Key::Greedy { stops: p.stop_strings.clone(), stop_ids: p.stop_token_ids.clone() }
    } else if job.seeded {
        Key::Alone
    } else {
        Key::Sampled { temperature: p.temperature.to_bits(), top_p: p.top_p.to_bits(), top_k: p.top_k, stops: p.stop_strings.clone(), stop_ids: p.stop_token_ids.clone() }
    }
}

/// The batcher loop: until the queue closes, take a batch and run it.
fn run<E: Engine>(engine: &mut E, rx: &mpsc::Receiver<Job>, policy: &BatchPolicy, batch_rows: Option<&prometheus::Histogram>) {
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut batch_seed: u64 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    loop {
        if waiting.is_empty() {
            match rx.recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => return,
            }
            let deadline = Instant::now() + policy.wait;
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                match rx.recv_timeout(left) {
                    Ok(job) => waiting.push_back(job),
                    Err(_) => break,
                }
            }
        }
        waiting.extend(rx.try_iter());
        let batch = take_batch(&mut waiting, policy.max_rows, engine.context());
        batch_seed = next_seed(batch_seed);
        run_batch(engine, batch, batch_seed, batch_rows);
    }
}

/// The first waiting job and every later one that can share its engine call
/// (same key, rows and context permitting); the rest keep waiting in order.
fn take_batch(waiting: &mut VecDeque<Job>, max_rows: usize, context: usize) -> Vec<Job> {
    let first = waiting.pop_front().expect("a batch starts from a waiting job");
    let k = key(&first);
    let (mut rows, mut longest, mut most_new) = (first.n, first.prompt.len(), first.params.max_new_tokens);
    let mut batch = vec![first];
    if k == Key::Alone {
        return batch;
    }
    let mut rest = VecDeque::new();
    while let Some(job) = waiting.pop_front() {
        let (l, m) = (longest.max(job.prompt.len()), most_new.max(job.params.max_new_tokens));
        if key(&job) == k && rows + job.n <= max_rows && l + m <= context {
            (rows, longest, most_new) = (rows + job.n, l, m);
            batch.push(job);
        } else {
            rest.push_back(job);
        }
    }
    *waiting = rest;
    batch
}

fn run_batch<E: Engine>(engine: &mut E, batch: Vec<Job>, seed: u64, batch_rows: Option<&prometheus::Histogram>) {
    let first = &batch[0].params;
    let params = SamplingParams {
        max_new_tokens: batch.iter().map(|j| j.params.max_new_tokens).max().unwrap_or(1),
        seed: if batch[0].seeded { first.seed } else { seed },
        ..first.clone()
    };
    let prompts: Vec<Vec<u32>> = batch.iter().flat_map(|j| std::iter::repeat_n(j.prompt.clone(), j.n)).collect();
    let rows = prompts.len();
    if let Some(h) = batch_rows {
        h.observe(rows as f64);
    }
    let version = engine.version();
    let mut out = match engine.generate(&prompts, &params) {
        Ok(c) => c.into_iter(),
        Err(e) => {
            for job in batch {
                let _ = job.reply.send(Err(e.clone()));
            }
            return;
        }
    };
    for job in batch {
        let mut completions: Vec<Completion> = out.by_ref().take(job.n).collect();
        for c in &mut completions {
            cut(c, job.params.max_new_tokens);
        }
        let mut top = vec![];
        let mut failed = None;
        if job.top_logprobs > 0 {
            for c in &completions {
                let seq: Vec<u32> = job.prompt.iter().chain(&c.tokens).copied().collect();
                match engine.top_logprobs(&seq, job.prompt.len(), job.top_logprobs, job.params.temperature) {
                    Ok(t) => top.push(t),
                    Err(e) => failed = Some(e),
                }
            }
        }
        let _ = job.reply.send(match failed {
            Some(e) => Err(e),
            None => Ok(JobOutput { completions, top, version, batch_rows: rows }),
        });
    }
}

/// Cuts a completion that ran past its own job's limit (its batch ran longer).
fn cut(c: &mut Completion, max_new_tokens: usize) {
    if c.tokens.len() > max_new_tokens {
        c.tokens.truncate(max_new_tokens);
        c.logprobs.truncate(max_new_tokens);
        c.finish = FinishReason::Length;
    }
}

/// The next unseeded batch's sampler seed (a splitmix64 step).
fn next_seed(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
