//! The crate's own tokio runtime, the bridge from rlmesh-core's synchronous
//! tool handlers to rmcp's async client.
//!
//! Tool calls arrive on the executor's tool threads (plain OS threads, see
//! `rlmesh_core::tools::execute`); each call's future is spawned here and the
//! calling thread waits on a channel, so no caller ever blocks one of this
//! runtime's workers, and the runtime lives as long as the process (children
//! started from its workers keep their parent-death signal armed).
use std::future::Future;
use std::sync::OnceLock;
use tokio::runtime::{Builder, Runtime};

/// Worker threads of the runtime: the work is waiting on pipes and sockets.
const WORKERS: usize = 2;

fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name("rlmesh-mcp")
            .enable_all()
            .build()
            .expect("rlmesh-mcp: cannot start its tokio runtime")
    })
}

/// Runs `fut` to completion on the crate's runtime and waits for its value on
/// this thread. The future runs to the end even if this thread is abandoned
/// (a tool call past the executor's limit), so a restart it began completes.
pub(crate) fn block_on<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().expect("rlmesh-mcp: a task of its runtime panicked")
}

/// Starts `fut` on the crate's runtime without waiting for it.
pub(crate) fn spawn<F>(fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    runtime().spawn(fut);
}
