//! A verifier that is a long-lived child process speaking JSON lines.
//!
//! One supervisor thread owns the child: it starts it (in a process group of
//! its own, killed with `SIGKILL` if this process dies:
//! [`rlmesh_mesh::launch::own_group_tied_to_parent`]), watches it, and
//! restarts it with back-off when it crashes or hangs, at most
//! [`VerifierSpec::max_restarts`] times; past that the verifier is given up
//! and every request fails at once. Per process, a writer thread feeds stdin,
//! a reader thread matches stdout's lines to requests by id, and a third keeps
//! the end of stderr (and echoes it to this process's stderr, prefixed).
//!
//! Failures, each an explicit [`Score::Unscorable`] and counted:
//! - no answer within the timeout. When the process has printed nothing since
//!   that request was sent, it is taken as hung and restarted;
//! - the process exits: the requests it held fail, the rest wait for the restart;
//! - a line that is not a response: it fails the request it names, or, when
//!   it names none, the oldest request in flight (stdout is for responses;
//!   logs go to stderr);
//! - the verifier's own `{"error"}`.
//!
//! The child's environment gets `PYTHONUNBUFFERED=1`, so a Python verifier's
//! `print` reaches the pipe at once.
use crate::protocol::{parse_response, quote, request_line};
use crate::{Counters, Endpoint, Request, Score, VerifierError, VerifierSpec, VerifierStats};
use rlmesh_mesh::launch::{kill_group, own_group_tied_to_parent, sh_join, Signal};
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long a new process must stay up for its start to count.
const START_GRACE: Duration = Duration::from_millis(300);
/// How often the supervisor looks at its child.
const POLL: Duration = Duration::from_millis(25);
/// The longest response line read; longer is a bad response.
const MAX_LINE: usize = 1 << 20;
/// How much of stderr is kept for error messages.
const STDERR_TAIL: usize = 2048;

/// A verifier process and its supervisor. Dropping it stops the process
/// (`TERM`, then `KILL` to its whole group) and fails what is still in flight.
pub struct CommandVerifier {
    shared: Arc<Shared>,
    supervisor: Option<JoinHandle<()>>,
}

struct Shared {
    spec: VerifierSpec,
    argv: Vec<String>,
    state: Mutex<State>,
    wake: Condvar,
    counts: Counters,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// The running process's generation (each start is a new one).
    generation: u64,
    /// Lines for the running process's stdin; `None` while it (re)starts.
    stdin: Option<mpsc::Sender<String>>,
    /// The running process's pid.
    pid: Option<u32>,
    pending: BTreeMap<u64, Pending>,
    /// Requests waiting for a process.
    backlog: Vec<(u64, String)>,
    /// When the running process last printed a line.
    last_output: Option<Instant>,
    /// A timed-out request found the process silent: restart it, for this reason.
    restart: Option<String>,
    shutdown: bool,
    given_up: Option<String>,
}

struct Pending {
    /// The generation it was sent to (`None`: in the backlog).
    generation: Option<u64>,
    sent: Instant,
    reply: mpsc::Sender<Score>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl CommandVerifier {
    /// Starts the process; an error when it cannot be spawned or ends within
    /// its first 300 ms (with how it ended and the end of its stderr).
    pub fn start(spec: VerifierSpec) -> Result<Self, VerifierError> {
        let argv = match &spec.endpoint {
            Endpoint::Command(argv) if !argv.is_empty() && !argv[0].is_empty() => argv.clone(),
            _ => return Err(VerifierError::Invalid { name: spec.name.clone(), reason: "an empty command".into() }),
        };
        let shared = Arc::new(Shared { spec, argv, state: Mutex::new(State::default()), wake: Condvar::new(), counts: Counters::default() });
        let (started_tx, started_rx) = mpsc::channel();
        let s = shared.clone();
        let supervisor = thread::Builder::new()
            .name(format!("verifier-{}", shared.spec.name))
            .spawn(move || supervise(&s, started_tx))
            .map_err(|e| VerifierError::Start { name: shared.spec.name.clone(), command: sh_join(&shared.argv), reason: e.to_string() })?;
        let started = started_rx.recv().unwrap_or_else(|_| Err("its supervisor thread ended".into()));
        match started {
            Ok(()) => Ok(CommandVerifier { shared, supervisor: Some(supervisor) }),
            Err(reason) => {
                let _ = supervisor.join();
                Err(VerifierError::Start { name: shared.spec.name.clone(), command: sh_join(&shared.argv), reason })
            }
        }
    }

    /// The spec it was started with.
    pub fn spec(&self) -> &VerifierSpec {
        &self.shared.spec
    }

    /// What it did so far.
    pub fn stats(&self) -> VerifierStats {
        self.shared.counts.snapshot()
    }

    /// Why it was given up, if it was.
    pub fn given_up(&self) -> Option<String> {
        self.shared.lock().given_up.clone()
    }

    /// The pid (and process group) of the running process, if one runs.
    pub fn pid(&self) -> Option<u32> {
        self.shared.lock().pid
    }

    /// Sends every request, then waits for all answers (each at most the timeout).
    pub fn score_all(&self, reqs: &[Request<'_>]) -> Vec<Score> {
        let sh = &self.shared;
        let timeout = sh.spec.timeout;
        let mut waits = Vec::with_capacity(reqs.len());
        {
            let mut st = sh.lock();
            for req in reqs {
                Counters::add(&sh.counts.requests);
                if let Some(why) = &st.given_up {
                    Counters::add(&sh.counts.given_up);
                    waits.push(Err(Score::Unscorable { reason: format!("the verifier was given up: {why}") }));
                    continue;
                }
                st.next_id += 1;
                let id = st.next_id;
                let line = request_line(id, req);
                let (reply, rx) = mpsc::channel();
                let sent = st.stdin.as_ref().is_some_and(|w| w.send(line.clone()).is_ok());
                let generation = if sent {
                    Some(st.generation)
                } else {
                    st.backlog.push((id, line));
                    None
                };
                st.pending.insert(id, Pending { generation, sent: Instant::now(), reply });
                waits.push(Ok((id, rx)));
            }
        }
        let deadline = Instant::now() + timeout;
        waits
            .into_iter()
            .map(|w| match w {
                Err(score) => score,
                Ok((id, rx)) => match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(score) => score,
                    Err(_) => self.timed_out(id, &rx),
                },
            })
            .collect()
    }

    /// Request `id` got no answer in time: fail it, and restart a process that has been silent since it was sent.
    fn timed_out(&self, id: u64, rx: &mpsc::Receiver<Score>) -> Score {
        let sh = &self.shared;
        let mut st = sh.lock();
        if let Ok(score) = rx.try_recv() {
            return score;
        }
        let timeout = sh.spec.timeout;
        Counters::add(&sh.counts.timeouts);
        if let Some(p) = st.pending.remove(&id) {
            st.backlog.retain(|(i, _)| *i != id);
            let silent = st.last_output.is_none_or(|t| t < p.sent);
            if p.generation == Some(st.generation) && silent && st.restart.is_none() {
                st.restart = Some(format!("printed nothing for {timeout:?} while a request waited (hung?)"));
                sh.wake.notify_all();
            }
        }
        Score::Unscorable { reason: format!("no answer within {timeout:?}") }
    }
}

impl Drop for CommandVerifier {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.shutdown = true;
            self.shared.wake.notify_all();
        }
        if let Some(t) = self.supervisor.take() {
            let _ = t.join();
        }
    }
}

/// A running process and its threads.
struct Running {
    child: Child,
    stdin: mpsc::Sender<String>,
    threads: Vec<JoinHandle<()>>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
}

impl Running {
    fn stderr_tail(&self) -> String {
        let tail: Vec<u8> = self.stderr.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect();
        let text = String::from_utf8_lossy(&tail).trim().to_string();
        if text.is_empty() { "(nothing on stderr)".into() } else { format!("stderr: {text}") }
    }

    /// Ends the process group (`TERM` and `grace` first, when given), reaps the child, joins its threads.
    fn stop(mut self, grace: Option<Duration>) {
        let pid = self.child.id();
        if let Some(grace) = grace {
            let _ = kill_group(pid, Signal::Term);
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = kill_group(pid, Signal::Kill);
        let _ = self.child.wait();
        drop(self.stdin);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Starts a process of generation `generation` with its three threads.
fn spawn(sh: &Arc<Shared>, generation: u64) -> Result<Running, String> {
    let mut cmd = Command::new(&sh.argv[0]);
    cmd.args(&sh.argv[1..]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).env("PYTHONUNBUFFERED", "1");
    if let Some(d) = &sh.spec.cwd {
        cmd.current_dir(d);
    }
    own_group_tied_to_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let (tx, rx) = mpsc::channel::<String>();
    let tail = Arc::new(Mutex::new(VecDeque::new()));
    let name = &sh.spec.name;
    let mut threads = Vec::new();
    let mut named = |what: &str, f: Box<dyn FnOnce() + Send>| {
        thread::Builder::new().name(format!("verifier-{name}-{what}")).spawn(f).map(|t| threads.push(t))
    };
    let spawned = named("stdin", Box::new(move || write_lines(stdin.expect("piped"), rx)))
        .and_then(|_| {
            let s = sh.clone();
            named("stdout", Box::new(move || read_lines(&s, generation, stdout.expect("piped"))))
        })
        .and_then(|_| {
            let (t, prefix) = (tail.clone(), format!("[verifier {name}] "));
            named("stderr", Box::new(move || keep_stderr(stderr.expect("piped"), &t, &prefix)))
        });
    let running = Running { child, stdin: tx, threads, stderr: tail };
    match spawned {
        Ok(()) => Ok(running),
        Err(e) => {
            running.stop(None);
            Err(format!("cannot start its threads: {e}"))
        }
    }
}

fn write_lines(mut stdin: ChildStdin, lines: mpsc::Receiver<String>) {
    for mut line in lines {
        line.push('\n');
        if stdin.write_all(line.as_bytes()).and_then(|()| stdin.flush()).is_err() {
            return;
        }
    }
}

fn keep_stderr(stderr: impl Read, tail: &Mutex<VecDeque<u8>>, prefix: &str) {
    for line in BufReader::new(stderr).split(b'\n') {
        let Ok(line) = line else { return };
        eprintln!("{prefix}{}", String::from_utf8_lossy(&line));
        let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
        t.extend(line.iter().copied().chain([b'\n']));
        while t.len() > STDERR_TAIL {
            t.pop_front();
        }
    }
}

/// Reads response lines until the process closes stdout.
fn read_lines(sh: &Shared, generation: u64, stdout: impl Read) {
    let mut r = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.by_ref().take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if buf.len() > MAX_LINE && buf.last() != Some(&b'\n') {
            // Skip the rest of an overlong line; it counts once.
            let mut rest = Vec::new();
            while matches!(r.by_ref().take(MAX_LINE as u64).read_until(b'\n', &mut rest), Ok(n) if n > 0 && rest.last() != Some(&b'\n')) {
                rest.clear();
            }
            on_line(sh, generation, &format!("(a line longer than {MAX_LINE} bytes)"), true);
            continue;
        }
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim();
        if !line.is_empty() {
            on_line(sh, generation, line, false);
        }
    }
}

/// Matches one stdout line to its request.
fn on_line(sh: &Shared, generation: u64, line: &str, overlong: bool) {
    let counts = &sh.counts;
    let r = if overlong {
        crate::protocol::Response { id: None, outcome: Err(line.to_string()) }
    } else {
        parse_response(line)
    };
    let mut st = sh.lock();
    if st.generation == generation {
        st.last_output = Some(Instant::now());
    }
    let ours = |st: &State, id: u64| st.pending.get(&id).is_some_and(|p| p.generation == Some(generation));
    let (id, outcome) = match (r.id, r.outcome) {
        (Some(id), outcome) if ours(&st, id) => (id, outcome),
        (Some(id), _) if id <= st.next_id => {
            // An answer to a request that already failed (timed out): too late.
            Counters::add(&counts.late);
            return;
        }
        (id, outcome) => {
            let why = match (id, outcome) {
                (_, Err(why)) => why,
                (None, Ok(_)) => format!("a response without \"id\": {}", quote(line)),
                (Some(id), Ok(_)) => format!("a response to id {id}, which was never sent"),
            };
            // Whom it fails: the oldest request this process holds.
            match st.pending.iter().find(|(_, p)| p.generation == Some(generation)).map(|(id, _)| *id) {
                Some(oldest) => (oldest, Err(format!("{why} (stdout is for responses only; log to stderr)"))),
                None => {
                    Counters::add(&counts.bad_responses);
                    return;
                }
            }
        }
    };
    let p = st.pending.remove(&id).unwrap_or_else(|| unreachable!("found above"));
    let score = match outcome {
        Ok(score) => {
            counts.answered(&score);
            score
        }
        Err(why) => {
            Counters::add(&counts.bad_responses);
            Score::Unscorable { reason: format!("not a valid response: {why}") }
        }
    };
    let _ = p.reply.send(score);
}

/// Fails every request `which` selects with `reason`, counting each in `counter`.
fn fail_where(st: &mut State, counter: &std::sync::atomic::AtomicU64, reason: &str, which: impl Fn(&Pending) -> bool) {
    let ids: Vec<u64> = st.pending.iter().filter(|(_, p)| which(p)).map(|(id, _)| *id).collect();
    for id in ids {
        if let Some(p) = st.pending.remove(&id) {
            Counters::add(counter);
            let _ = p.reply.send(Score::Unscorable { reason: reason.to_string() });
        }
    }
    let State { backlog, pending, .. } = st;
    backlog.retain(|(id, _)| pending.contains_key(id));
}

/// The supervisor: start, watch, restart within the budget, stop on shutdown.
fn supervise(sh: &Arc<Shared>, started: mpsc::Sender<Result<(), String>>) {
    let mut started = Some(started);
    let mut restarts = 0u32;
    loop {
        let generation = sh.lock().generation + 1;
        let ended = match spawn(sh, generation) {
            Err(reason) => match started.take() {
                Some(tx) => {
                    let _ = tx.send(Err(reason));
                    return;
                }
                None => format!("could not be started again: {reason}"),
            },
            Ok(mut running) => {
                {
                    let mut st = sh.lock();
                    st.generation = generation;
                    st.pid = Some(running.child.id());
                    st.stdin = Some(running.stdin.clone());
                    st.last_output = None;
                    st.restart = None;
                    for (id, line) in std::mem::take(&mut st.backlog) {
                        if let Some(p) = st.pending.get_mut(&id) {
                            p.generation = Some(generation);
                            p.sent = Instant::now();
                            let _ = running.stdin.send(line);
                        }
                    }
                }
                if let Some(tx) = started.take() {
                    let deadline = Instant::now() + START_GRACE;
                    while Instant::now() < deadline {
                        if let Ok(Some(status)) = running.child.try_wait() {
                            let _ = running.child.wait();
                            thread::sleep(Duration::from_millis(50)); // let stderr drain
                            let why = format!("it ended at once ({status}); {}", running.stderr_tail());
                            detach(sh);
                            running.stop(None);
                            let _ = tx.send(Err(why));
                            return;
                        }
                        thread::sleep(Duration::from_millis(10));
                    }
                    let _ = tx.send(Ok(()));
                }
                let (why, crashed) = watch(sh, &mut running);
                let Some(why) = why else {
                    detach(sh);
                    running.stop(Some(Duration::from_millis(300)));
                    let mut st = sh.lock();
                    fail_where(&mut st, &sh.counts.lost, "the verifier was shut down", |_| true);
                    return;
                };
                let why = if crashed {
                    thread::sleep(Duration::from_millis(50)); // let stderr drain
                    Counters::add(&sh.counts.crashes);
                    format!("{why}; {}", running.stderr_tail())
                } else {
                    why
                };
                detach(sh);
                running.stop(None);
                let mut st = sh.lock();
                let reason = format!("the verifier process {why}");
                fail_where(&mut st, &sh.counts.lost, &reason, |p| p.generation == Some(generation));
                reason
            }
        };
        let mut st = sh.lock();
        if st.shutdown {
            fail_where(&mut st, &sh.counts.lost, "the verifier was shut down", |_| true);
            return;
        }
        if restarts >= sh.spec.max_restarts {
            let why = format!("{ended}, after {restarts} restart(s) (max_restarts = {})", sh.spec.max_restarts);
            fail_where(&mut st, &sh.counts.given_up, &format!("the verifier was given up: {why}"), |_| true);
            st.given_up = Some(why);
            return;
        }
        restarts += 1;
        let backoff = Duration::from_millis(200 << (restarts - 1).min(5)).min(Duration::from_secs(5));
        let (st, _) = sh.wake.wait_timeout_while(st, backoff, |s| !s.shutdown).unwrap_or_else(|p| p.into_inner());
        if st.shutdown {
            let mut st = st;
            fail_where(&mut st, &sh.counts.lost, "the verifier was shut down", |_| true);
            return;
        }
        drop(st);
        Counters::add(&sh.counts.restarts);
    }
}

/// Forgets the running process's stdin (so its writer thread can end) and pid.
fn detach(sh: &Shared) {
    let mut st = sh.lock();
    (st.stdin, st.pid) = (None, None);
}

/// Waits until the process ends (`(reason, true)`), a hang is reported
/// (`(reason, false)`), or shutdown (`(None, false)`).
fn watch(sh: &Shared, running: &mut Running) -> (Option<String>, bool) {
    let mut st = sh.lock();
    loop {
        if st.shutdown {
            return (None, false);
        }
        if let Some(why) = st.restart.take() {
            return (Some(why), false);
        }
        match running.child.try_wait() {
            Ok(Some(status)) => return (Some(format!("exited ({status})")), true),
            Ok(None) => {}
            Err(e) => return (Some(format!("could not be waited for ({e})")), true),
        }
        st = sh.wake.wait_timeout(st, POLL).unwrap_or_else(|p| p.into_inner()).0;
    }
}
