//! The job's progress: lines on stderr and in `RUN_DIR/progress.log`, a live
//! bar on a terminal, ETAs, and the SIGTERM flag `launcher down` sets.
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Progress of the job: lines on stderr and in `RUN_DIR/progress.log` (logs and
/// Slurm read files), at least every [`Progress::EVERY`] during long phases, and
/// on a terminal a live bar with the step, the figures and the ETA.
pub(super) struct Progress {
    pub(super) on: bool,
    pub(super) start: Instant,
    pub(super) log: Mutex<Option<std::fs::File>>,
    pub(super) last: Mutex<Instant>,
    pub(super) bar: Mutex<Option<indicatif::ProgressBar>>,
}

impl Progress {
    /// The longest gap between two lines in a long phase.
    const EVERY: Duration = Duration::from_secs(30);

    pub(super) fn new(on: bool, start: Instant) -> Progress {
        Progress { on, start, log: Mutex::new(None), last: Mutex::new(start), bar: Mutex::new(None) }
    }

    /// From now on every line is also appended to `dir/progress.log`.
    pub(super) fn attach_log(&self, dir: &Path) {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("progress.log")).ok();
        *self.log.lock().expect("progress lock") = f;
    }

    pub(super) fn line(&self, text: String) {
        let line = format!("[{:>6.1}s] {text}", self.start.elapsed().as_secs_f64());
        if self.on {
            match self.bar.lock().expect("progress lock").as_ref() {
                Some(bar) => bar.println(&line),
                None => eprintln!("{line}"),
            }
        }
        if let Some(f) = self.log.lock().expect("progress lock").as_mut() {
            let _ = writeln!(f, "{line}");
        }
        *self.last.lock().expect("progress lock") = Instant::now();
    }

    /// Whether a long phase is due a line (none for [`Progress::EVERY`]).
    pub(super) fn due(&self) -> bool {
        self.last.lock().expect("progress lock").elapsed() >= Self::EVERY
    }

    /// A live bar of `len` steps, on a terminal only.
    pub(super) fn bar(&self, prefix: &'static str, len: u64, pos: u64) {
        use std::io::IsTerminal;
        let mut bar = self.bar.lock().expect("progress lock");
        if let Some(old) = bar.take() {
            old.finish_and_clear();
        }
        if self.on && std::io::stderr().is_terminal() {
            let b = indicatif::ProgressBar::new(len).with_position(pos).with_prefix(prefix);
            if let Ok(style) = indicatif::ProgressStyle::with_template("{prefix:>6} [{bar:30}] {pos}/{len} {msg} · ETA {eta}") {
                b.set_style(style.progress_chars("=> "));
            }
            *bar = Some(b);
        }
    }

    /// Moves the bar (if any) to `pos` with `msg`.
    pub(super) fn tick(&self, pos: u64, msg: String) {
        if let Some(b) = self.bar.lock().expect("progress lock").as_ref() {
            b.set_position(pos);
            b.set_message(msg);
        }
    }

    pub(super) fn finish_bar(&self) {
        if let Some(b) = self.bar.lock().expect("progress lock").take() {
            b.finish_and_clear();
        }
    }
}

/// Time left for `total` steps when `done` of them took `elapsed` ("?" before the first).
pub(super) fn eta(elapsed: Duration, done: u64, total: u64) -> String {
    if done == 0 {
        return "?".into();
    }
    let left = elapsed.as_secs_f64() / done as f64 * total.saturating_sub(done) as f64;
    let s = left.round() as u64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, s / 60 % 60)
    } else {
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

/// SIGTERM (what `launcher down` sends) sets the returned flag; the driver
/// checkpoints at the next step boundary and stops.
pub(super) fn stop_on_sigterm() -> Arc<std::sync::atomic::AtomicBool> {
    let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = flag.clone();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut sig) => {
            tokio::spawn(async move {
                if sig.recv().await.is_some() {
                    f.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
        Err(e) => eprintln!("SIGTERM handler not installed ({e}): launcher down will end the job without a checkpoint"),
    }
    flag
}
