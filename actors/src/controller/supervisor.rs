//! Supervision of the rollout actors: a failed actor (panic or error) is
//! restarted with exponential back-off until its restart budget is spent;
//! restarts are counted in the metrics and logged. The controller re-dispatches
//! the failed actor's in-flight groups (it sees the failed call).
use crate::metrics::Metrics;
use crate::rollout::actor::{RolloutActor, RolloutArgs, RolloutMsg};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The rollout actors the controller may use now (a failed one is `None` until restarted).
pub type RolloutSlots = Arc<Mutex<Vec<Option<ActorRef<RolloutMsg>>>>>;

/// Start-up arguments of the supervisor.
pub struct SupervisorArgs {
    /// One entry per rollout actor.
    pub actors: Vec<RolloutArgs>,
    /// Restarts allowed per actor.
    pub restart_budget: u32,
    /// First back-off (doubles per restart).
    pub backoff: Duration,
    /// Shared view of the live actors.
    pub slots: RolloutSlots,
    /// Metrics (restarts).
    pub metrics: Arc<Metrics>,
}

/// Supervisor state.
pub struct SupervisorState {
    args: SupervisorArgs,
    restarts: Vec<u32>,
}

/// The rollout supervisor.
pub struct RolloutSupervisor;

/// The supervisor takes no messages of its own; it only handles supervision events.
pub enum SupervisorMsg {}

// In-process only: never serialised (ractor's `cluster` feature asks every message type to say so).
impl ractor::Message for SupervisorMsg {}

impl RolloutSupervisor {
    async fn start(myself: &ActorRef<SupervisorMsg>, args: &RolloutArgs, i: usize) -> Result<ActorRef<RolloutMsg>, ActorProcessingErr> {
        let (r, _) = Actor::spawn_linked(Some(format!("rollout-{i}-{}", uniq())), RolloutActor, args.clone(), myself.get_cell()).await?;
        Ok(r)
    }
}

fn uniq() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

impl Actor for RolloutSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(&self, myself: ActorRef<Self::Msg>, args: SupervisorArgs) -> Result<SupervisorState, ActorProcessingErr> {
        let mut refs = vec![];
        for (i, a) in args.actors.iter().enumerate() {
            refs.push(Some(Self::start(&myself, a, i).await?));
            // At zero from the start, so a dashboard shows every supervised actor.
            args.metrics.actor_restarts_total.with_label_values(&[&format!("rollout-{i}")]);
            args.metrics.restart_budget_left.with_label_values(&[&format!("rollout-{i}")]).set(f64::from(args.restart_budget));
        }
        *args.slots.lock().expect("slots lock") = refs;
        let n = args.actors.len();
        Ok(SupervisorState { args, restarts: vec![0; n] })
    }

    async fn handle_supervisor_evt(&self, myself: ActorRef<Self::Msg>, evt: SupervisionEvent, state: &mut SupervisorState) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match &evt {
            SupervisionEvent::ActorFailed(cell, err) => (cell.clone(), format!("failed: {err}")),
            SupervisionEvent::ActorTerminated(cell, _, reason) => (cell.clone(), format!("terminated: {}", reason.clone().unwrap_or_default())),
            _ => return Ok(()),
        };
        let slot = {
            let mut slots = state.args.slots.lock().expect("slots lock");
            let i = slots.iter().position(|s| s.as_ref().is_some_and(|r| r.get_id() == cell.get_id()));
            if let Some(i) = i {
                slots[i] = None;
            }
            i
        };
        let Some(i) = slot else { return Ok(()) };
        let label = format!("rollout-{i}");
        if state.restarts[i] >= state.args.restart_budget {
            eprintln!("[supervisor] {label} {why}; restart budget ({}) spent, not restarting", state.args.restart_budget);
            return Ok(());
        }
        let backoff = state.args.backoff * 2u32.pow(state.restarts[i]);
        state.restarts[i] += 1;
        eprintln!("[supervisor] {label} {why}; restart {} of {} after {:?}", state.restarts[i], state.args.restart_budget, backoff);
        tokio::time::sleep(backoff).await;
        let r = Self::start(&myself, &state.args.actors[i], i).await?;
        state.args.metrics.actor_restarts_total.with_label_values(&[&label]).inc();
        state.args.metrics.restart_budget_left.with_label_values(&[&label]).set(f64::from(state.args.restart_budget - state.restarts[i]));
        state.args.slots.lock().expect("slots lock")[i] = Some(r);
        Ok(())
    }
}
