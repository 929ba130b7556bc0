//! One OS thread per device owns its tensors.
//!
//! Actors run on tokio; tensor work never does. An actor that needs a model
//! holds a [`DeviceThread`]: the thread builds the state (a model, a learner)
//! on itself, then runs the jobs sent to it one at a time, and the actor
//! awaits each job's result without blocking a tokio worker.
use std::sync::mpsc;
use std::thread::JoinHandle;
use tokio::sync::oneshot;

/// The libtorch device for a CUDA ordinal inside this process (`None`: the
/// CPU). A GPU this process cannot see is an error that says what it sees.
pub fn torch_device(cuda: Option<usize>) -> Result<tch::Device, String> {
    let Some(i) = cuda else { return Ok(tch::Device::Cpu) };
    let seen = tch::Cuda::device_count().max(0) as usize;
    if i >= seen {
        return Err(format!(
            "CUDA device {i} is wanted, but libtorch sees {seen} (CUDA_VISIBLE_DEVICES={:?}); `launcher up --device cpu` runs the topology on the CPU",
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
        ));
    }
    Ok(tch::Device::Cuda(i))
}

type Job<S> = Box<dyn FnOnce(&mut S) + Send>;

/// The job queue of a device thread, shared with its [`DeviceJobs`] handles
/// (emptied when the thread's owner drops it, so no handle keeps it alive).
type Queue<S> = std::sync::Arc<std::sync::Mutex<Option<mpsc::Sender<Job<S>>>>>;

/// A thread that owns a state `S` (tensors) and runs jobs on it.
pub struct DeviceThread<S> {
    jobs: Queue<S>,
    thread: Option<JoinHandle<()>>,
    name: String,
}

/// The device thread is gone (its state failed to build or a job panicked).
#[derive(Debug, thiserror::Error)]
#[error("device thread {0} is gone")]
pub struct DeviceGone(pub String);

impl<S: 'static> DeviceThread<S> {
    /// Start the thread and build its state there; returns once the state is built.
    pub async fn spawn<E: Send + 'static>(name: &str, init: impl FnOnce() -> Result<S, E> + Send + 'static) -> Result<Result<Self, E>, DeviceGone> {
        let (tx, rx) = mpsc::channel::<Job<S>>();
        let (ready_tx, ready_rx) = oneshot::channel::<Result<(), E>>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut state = match init() {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Ok(job) = rx.recv() {
                    job(&mut state);
                }
            })
            .map_err(|_| DeviceGone(name.to_string()))?;
        match ready_rx.await {
            Ok(Ok(())) => Ok(Ok(DeviceThread { jobs: std::sync::Arc::new(std::sync::Mutex::new(Some(tx))), thread: Some(thread), name: name.to_string() })),
            Ok(Err(e)) => Ok(Err(e)),
            Err(_) => Err(DeviceGone(name.to_string())),
        }
    }

    /// Run `f` on the device thread and await its result.
    pub async fn run<R: Send + 'static>(&self, f: impl FnOnce(&mut S) -> R + Send + 'static) -> Result<R, DeviceGone> {
        let (tx, rx) = oneshot::channel();
        let job: Job<S> = Box::new(move |s| {
            let _ = tx.send(f(s));
        });
        send(&self.jobs, job, &self.name)?;
        rx.await.map_err(|_| DeviceGone(self.name.clone()))
    }

    /// A handle that runs jobs from any thread, blocking (an engine thread
    /// that is not tokio's); it stops working when this owner is dropped.
    pub fn jobs(&self) -> DeviceJobs<S> {
        DeviceJobs { jobs: self.jobs.clone(), name: self.name.clone() }
    }
}

fn send<S>(jobs: &Queue<S>, job: Job<S>, name: &str) -> Result<(), DeviceGone> {
    let queue = jobs.lock().unwrap_or_else(|p| p.into_inner());
    queue.as_ref().ok_or_else(|| DeviceGone(name.to_string()))?.send(job).map_err(|_| DeviceGone(name.to_string()))
}

/// Runs jobs on a [`DeviceThread`] from threads that may block.
pub struct DeviceJobs<S> {
    jobs: Queue<S>,
    name: String,
}

impl<S> Clone for DeviceJobs<S> {
    fn clone(&self) -> Self {
        DeviceJobs { jobs: self.jobs.clone(), name: self.name.clone() }
    }
}

impl<S: 'static> DeviceJobs<S> {
    /// Runs `f` on the device thread and waits for its result (never call it on a tokio worker).
    pub fn run_blocking<R: Send + 'static>(&self, f: impl FnOnce(&mut S) -> R + Send + 'static) -> Result<R, DeviceGone> {
        let (tx, rx) = mpsc::channel();
        let job: Job<S> = Box::new(move |s| {
            let _ = tx.send(f(s));
        });
        send(&self.jobs, job, &self.name)?;
        rx.recv().map_err(|_| DeviceGone(self.name.clone()))
    }
}

impl<S> Drop for DeviceThread<S> {
    fn drop(&mut self) {
        // Closing the channel ends the thread after its current job.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::torch_device;

    #[test]
    fn a_cuda_ordinal_this_process_cannot_see_is_an_error_that_says_what_it_sees() {
        assert_eq!(torch_device(None), Ok(tch::Device::Cpu));
        let seen = tch::Cuda::device_count().max(0) as usize;
        if seen > 0 {
            assert_eq!(torch_device(Some(0)), Ok(tch::Device::Cuda(0)));
        }
        let e = torch_device(Some(seen)).unwrap_err();
        assert!(e.starts_with(&format!("CUDA device {seen} is wanted, but libtorch sees {seen} (CUDA_VISIBLE_DEVICES=")), "{e}");
        assert!(e.ends_with("`launcher up --device cpu` runs the topology on the CPU"), "{e}");
    }
}
