//! The proxy actors that stand for remote actors: [`RemoteRollout`] for the
//! rollout actor of one process, [`RemoteLearner`] for the learner's ranks.
//! They take the same messages as the local actors, so the run driver cannot
//! tell them apart; each call goes out on the control or data plane and waits
//! in the `Core` for its reply.
use super::link::{Core, Reply, Route};
use super::wire::*;
use crate::learner::actor::LearnerMsg;
use crate::rollout::actor::{RolloutMsg, RolloutResult};
use crate::weight_sync::image::WeightAck;
use crate::weight_sync::parts::{parts, WEIGHT_PART_BYTES};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use std::sync::Arc;

/// A proxy for the rollout process `route` names.
pub(super) async fn proxy(core: &Arc<Core>, route: Route) -> Result<ActorRef<RolloutMsg>, String> {
    let (r, _) = Actor::spawn(None, RemoteRollout, RemoteRolloutArgs { core: core.clone(), route }).await.map_err(|e| format!("rollout proxy: {e}"))?;
    Ok(r)
}

/// Arguments of a [`RemoteRollout`] proxy.
pub struct RemoteRolloutArgs {
    pub(super) core: Arc<Core>,
    pub(super) route: Route,
}

/// Stands for the rollout actor of one process.
pub struct RemoteRollout;

impl Actor for RemoteRollout {
    type Msg = RolloutMsg;
    type State = RemoteRolloutArgs;
    type Arguments = RemoteRolloutArgs;

    async fn pre_start(&self, _myself: ActorRef<Self::Msg>, args: RemoteRolloutArgs) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(&self, myself: ActorRef<Self::Msg>, msg: Self::Msg, s: &mut RemoteRolloutArgs) -> Result<(), ActorProcessingErr> {
        let (core, process) = (&s.core, s.route.process.as_str());
        let id = core.id();
        let key = if matches!(msg, RolloutMsg::LoadWeights(..)) { s.route.key } else { 0 };
        // Groups go to their reward process, or are scored here while it is down.
        let reward = s.route.reward.as_ref().filter(|(name, _)| !core.is_down(name));
        let mut waits_on = vec![process];
        waits_on.extend(reward.map(|(name, _)| name.as_str()));
        let rx = core.expect(&waits_on, (id, key));
        // Its own process gone (not its reward process): the keeper takes over, and this proxy stops.
        let mut gone: Option<String> = None;
        let mut lost = |e: String| -> String {
            if gone.is_none() {
                gone = Some(e.clone());
            }
            e
        };
        match msg {
            RolloutMsg::Generate(req, reply) => {
                core.settled(process).await;
                let to = reward.map_or_else(|| core.my_data.clone(), |(_, data)| data.clone());
                let out = match core.tx.send(process, &ControlMsg::Generate { id, reward: to, request: Json::of(&req) }) {
                    Err(e) => Err(lost(e.to_string())),
                    Ok(()) => match core.answer(rx, process).await {
                        Ok(Reply::Data(DataMsg::Scored { result, .. } | DataMsg::Groups { result, .. })) => result.and_then(|j| j.get::<RolloutResult>("RolloutResult")),
                        Ok(Reply::Lost(p)) if p == process => Err(lost(format!("{p} is lost"))),
                        Ok(Reply::Lost(p)) => Err(format!("its reward process {p} is lost")),
                        other => Err(format!("unexpected answer {other:?}")),
                    },
                };
                let _ = reply.send(out.map_err(|e| format!("{process}: {e}")));
            }
            RolloutMsg::LoadWeights(update, reply) => {
                // In bounded parts, one at a time (the outbox's queue holds back the next).
                let update = update.to_host();
                let mut sent = Ok(());
                for part in parts(&update, WEIGHT_PART_BYTES) {
                    sent = core.out.send(&s.route.data, DataMsg::Weights { id, part }).await;
                    if sent.is_err() {
                        break;
                    }
                }
                let out: Result<WeightAck, String> = match sent {
                    Err(e) => Err(e),
                    Ok(()) => match core.answer(rx, process).await {
                        Ok(Reply::Control(ControlMsg::WeightsLoaded { result, .. })) => {
                            if let Ok(ack) = &result {
                                core.loaded(process, ack.version);
                            }
                            result
                        }
                        Ok(Reply::Lost(p)) => Err(lost(format!("{p} is lost"))),
                        other => Err(format!("unexpected answer {other:?}")),
                    },
                };
                let _ = reply.send(out.map_err(|e| format!("{process}: {e}")));
            }
        }
        if let Some(why) = gone {
            let _ = core.lost.send((process.to_string(), why));
            myself.stop(Some("its process is lost".into()));
        }
        Ok(())
    }
}

/// Arguments of a [`RemoteLearner`] proxy.
pub struct RemoteLearnerArgs {
    pub(super) core: Arc<Core>,
    /// (rank, process, data endpoint), by rank.
    pub(super) ranks: Vec<(u32, String, String)>,
}

/// Stands for the learner's data-parallel ranks: every call goes to every rank
/// (each trains on its shard), and rank 0's answer is the answer.
pub struct RemoteLearner;

impl RemoteLearner {
    async fn call(s: &RemoteLearnerArgs, call: LearnerCall) -> Result<Reply, String> {
        let id = s.core.id();
        let json = Json::of(&call);
        let mut waits = vec![];
        for (rank, process, data) in &s.ranks {
            let rx = s.core.expect(&[process], (id, *rank));
            s.core.out.send(data, DataMsg::Learner { id, call: json.clone() }).await?;
            waits.push((*rank, process, rx));
        }
        let mut first = None;
        for (rank, process, rx) in waits {
            let r = s.core.answer(rx, process).await.map_err(|_| "the router stopped".to_string())?;
            match &r {
                Reply::Lost(p) => return Err(format!("learner rank {rank} ({p}) is lost")),
                Reply::Data(DataMsg::LearnerDone { result: Err(e), .. }) => return Err(format!("learner rank {rank} ({process}): {e}")),
                _ => {}
            }
            if rank == 0 {
                first = Some(r);
            }
        }
        first.ok_or_else(|| "no learner rank 0".to_string())
    }

    fn out(r: Result<Reply, String>) -> Result<LearnerOut, String> {
        match r? {
            Reply::Data(DataMsg::LearnerDone { result, .. }) => result.and_then(|j| j.get::<LearnerOut>("LearnerOut")),
            other => Err(format!("unexpected learner answer {other:?}")),
        }
    }
}

impl Actor for RemoteLearner {
    type Msg = LearnerMsg;
    type State = RemoteLearnerArgs;
    type Arguments = RemoteLearnerArgs;

    async fn pre_start(&self, _myself: ActorRef<Self::Msg>, args: RemoteLearnerArgs) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(&self, _myself: ActorRef<Self::Msg>, msg: Self::Msg, s: &mut RemoteLearnerArgs) -> Result<(), ActorProcessingErr> {
        let stats = |o: Result<LearnerOut, String>| match o? {
            LearnerOut::Stats(st) => Ok(st),
            other => Err(format!("expected step statistics, got {other:?}")),
        };
        match msg {
            LearnerMsg::Sft(b, reply) => {
                let _ = reply.send(stats(Self::out(Self::call(s, LearnerCall::Sft(b)).await)));
            }
            LearnerMsg::Train(b, reply) => {
                let _ = reply.send(stats(Self::out(Self::call(s, LearnerCall::Train(b)).await)));
            }
            LearnerMsg::Configure(c, reply) => {
                let _ = reply.send(Self::out(Self::call(s, LearnerCall::Configure(c)).await).map(|_| ()));
            }
            LearnerMsg::Checkpoint(root, meta, reply) => {
                let _ = reply.send(Self::out(Self::call(s, LearnerCall::Checkpoint(root, meta)).await).and_then(|o| match o {
                    LearnerOut::Path(p) => Ok(p),
                    other => Err(format!("expected a checkpoint path, got {other:?}")),
                }));
            }
            LearnerMsg::Resume(root, c, reply) => {
                let _ = reply.send(Self::out(Self::call(s, LearnerCall::Resume(root, c)).await).and_then(|o| match o {
                    LearnerOut::Meta(m) => Ok(m),
                    other => Err(format!("expected a checkpoint record, got {other:?}")),
                }));
            }
            // A version crossing processes as data is a host image, whatever was asked.
            LearnerMsg::Snapshot(version, _, reply) => match Self::call(s, LearnerCall::Snapshot(version)).await {
                Ok(Reply::Weights(update)) => {
                    let _ = reply.send(update);
                }
                // The reply port takes a weight image only: failing the call is the only way to say it failed.
                other => return Err(format!("learner snapshot v{version}: {other:?}").into()),
            },
        }
        Ok(())
    }
}
