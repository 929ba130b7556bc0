//! The weight-sync group's sender: [`Publisher`] sends each policy version
//! to every rollout process through the group (`super::weights`), from the
//! controller or from learner rank 0, and forms the group again when its
//! members change.
use super::link::{Core, Reply, Route};
use super::weights::{GroupSpec, WeightGroup};
use super::wire::*;
use crate::rollout::actor::RolloutMsg;
use crate::weight_sync::image::WeightUpdate;
use ractor::ActorRef;
use std::sync::{Arc, Mutex};

/// Where a version starts from.
pub(super) enum Root {
    /// This process (the learner is here): it broadcasts the image it is given.
    Controller(Mutex<Arc<WeightGroup>>),
    /// Learner rank 0's process: it broadcasts its own weights.
    Learner { process: String, data: String },
}

/// The weight-sync group as last formed.
struct GroupState {
    epoch: u32,
    /// Its rollout processes, by slot, in rank order (rank k + 1).
    members: Vec<usize>,
    /// A broadcast failed: form it again before the next.
    broken: bool,
}

/// Sends each version to every rollout process through the weight-sync group,
/// forming the group again (one epoch higher) when its members changed or a
/// broadcast failed. A process that missed a version is marked, and the driver
/// loads the current version into it before its next request.
#[derive(Clone)]
pub struct Publisher {
    core: Arc<Core>,
    root: Arc<Root>,
    /// Rank 0's rendezvous.
    addr: String,
    /// The image goes over NCCL (every member on a GPU).
    nccl: bool,
    state: Arc<Mutex<GroupState>>,
    /// One forming at a time (the keeper forms it when a member is lost, the driver before a version).
    forming: Arc<tokio::sync::Mutex<()>>,
}

impl Publisher {
    /// The sender for a group rooted at `root` (rendezvous `addr`) over the
    /// `members` rollout processes, as first formed (epoch 0, every slot).
    pub(super) fn new(core: Arc<Core>, root: Root, addr: String, nccl: bool, members: usize) -> Publisher {
        let state = GroupState { epoch: 0, members: (0..members).collect(), broken: false };
        Publisher { core, root: Arc::new(root), addr, nccl, state: Arc::new(Mutex::new(state)), forming: Arc::default() }
    }

    /// Does the controller hold the weights it sends (the learner is in its process)?
    pub fn needs_image(&self) -> bool {
        matches!(*self.root, Root::Controller(_))
    }

    /// Did the rollout process behind proxy `actor` miss a version (restarted,
    /// or a broadcast to it failed)? Then it must be given the current one.
    pub fn missed(&self, actor: &ActorRef<RolloutMsg>) -> bool {
        self.core.process_of(actor).is_some_and(|p| self.core.missed.lock().expect("missed lock").contains(&p))
    }

    /// The group's members for this version: the live rollout processes. When
    /// they changed (or the last broadcast failed), every member and the root
    /// are told to form it again at the next epoch, ahead of the broadcast.
    pub(super) async fn members(&self) -> Result<Vec<usize>, String> {
        let _forming = self.forming.lock().await;
        let core = &self.core;
        let live: Vec<usize> = core.rollouts.lock().expect("slots lock").iter().enumerate().filter(|(_, r)| r.is_some()).map(|(i, _)| i).collect();
        let (epoch, regroup, abort) = {
            let mut st = self.state.lock().expect("group lock");
            let regroup = st.broken || st.members != live;
            // A member gone (or a failed broadcast): what the old group still waits on is aborted.
            let abort = st.broken || st.members.iter().any(|m| !live.contains(m));
            if regroup {
                st.epoch += 1;
                st.members = live.clone();
                st.broken = false;
            }
            (st.epoch, regroup, abort)
        };
        if !regroup {
            return Ok(live);
        }
        let routes = core.routes.get().ok_or("the group has no routes yet")?;
        let world = live.len() as u32 + 1;
        let spec = |rank: u32| GroupSpec { rank, world, addr: self.addr.clone(), epoch, nccl: self.nccl };
        eprintln!("[fleet] weight-sync group: forming epoch {epoch} with {} rollout process(es)", live.len());
        for (k, &i) in live.iter().enumerate() {
            let p = &routes[i].process;
            core.tx.send(p, &ControlMsg::Regroup { spec: spec(k as u32 + 1), abort }).map_err(|e| format!("{p}: {e}"))?;
        }
        match &*self.root {
            Root::Controller(g) => {
                let old = std::mem::replace(&mut *g.lock().expect("group lock"), Arc::new(WeightGroup::join(&spec(0), &core.cookie, core.listen, None)));
                if abort {
                    old.abort();
                }
            }
            Root::Learner { data, .. } => core.out.send(data, DataMsg::Learner { id: core.id(), call: Json::of(&LearnerCall::Regroup { spec: spec(0), abort }) }).await?,
        }
        Ok(live)
    }

    /// Starts version `version` towards every live rollout process (`image`: the
    /// weights, when [`Publisher::needs_image`]); the future ends when every
    /// process has checked and loaded it, with the seconds the broadcast took.
    /// A failure marks the processes that did not load it and breaks the group
    /// (it is formed again for the next version).
    pub async fn publish(&self, version: u64, image: Option<WeightUpdate>) -> Result<impl std::future::Future<Output = Result<f64, String>> + Send + 'static, String> {
        let core = &self.core;
        let members = match self.members().await {
            Ok(m) => m,
            Err(e) => {
                self.state.lock().expect("group lock").broken = true;
                return Err(e);
            }
        };
        let routes = core.routes.get().ok_or("the group has no routes yet")?;
        let epoch = self.state.lock().expect("group lock").epoch;
        let id = core.id();
        let mut acks = vec![];
        // A receipt also fails when the root is lost: the broadcast it waits for will not come.
        let root = match &*self.root {
            Root::Learner { process, .. } => Some(process.as_str()),
            Root::Controller(_) => None,
        };
        for &i in &members {
            let Route { process, key, .. } = &routes[i];
            let waits_on: Vec<&str> = std::iter::once(process.as_str()).chain(root).collect();
            let (settled, settling) = tokio::sync::watch::channel(false);
            core.settling.lock().expect("settling lock").insert(process.clone(), settling);
            acks.push((process.clone(), core.expect(&waits_on, (id, *key)), settled));
            if let Err(e) = core.tx.send(process, &ControlMsg::Receive { id }) {
                core.lose(process, &e.to_string(), false);
                let _ = core.lost.send((process.clone(), e.to_string()));
            }
        }
        let sent: std::pin::Pin<Box<dyn std::future::Future<Output = Result<f64, String>> + Send>> = match &*self.root {
            Root::Controller(g) => {
                let update = image.ok_or("the controller sends the weights but was given none")?;
                let pending = g.lock().expect("group lock").send(update);
                Box::pin(async move { pending.wait().await })
            }
            Root::Learner { process, data } => {
                let rx = core.expect(&[process], (id, 0));
                core.out.send(data, DataMsg::Learner { id, call: Json::of(&LearnerCall::Publish(version)) }).await?;
                let process = process.clone();
                // Not under the call timeout: the broadcast waits for every member, so a
                // stalled receiver would be blamed on rank 0. The ring bounds each of its
                // waits, and the receivers' acknowledgements below are under the timeout.
                Box::pin(async move {
                    match rx.await {
                        Ok(Reply::Data(DataMsg::LearnerDone { result, .. })) => match result.and_then(|j| j.get::<LearnerOut>("LearnerOut"))? {
                            LearnerOut::Published(secs) => Ok(secs),
                            other => Err(format!("{process}: expected a publication, got {other:?}")),
                        },
                        Ok(Reply::Lost(p)) => Err(format!("{p} is lost")),
                        other => Err(format!("{process}: unexpected answer {other:?}")),
                    }
                })
            }
        };
        let (core, state) = (core.clone(), self.state.clone());
        Ok(async move {
            // The receivers' acknowledgements are awaited beside the broadcast, each under
            // the call timeout: a stalled receiver is taken down, which aborts the group's
            // collective, rather than holding the broadcast for the ring's own bound.
            let waits: Vec<_> = acks
                .into_iter()
                .map(|(process, rx, settled)| {
                    let core = core.clone();
                    tokio::spawn(async move {
                        let r = core.answer(rx, &process).await;
                        // Loaded, refused or lost: requests to it may go out (versions is set below).
                        if let Ok(Reply::Control(ControlMsg::WeightsLoaded { result: Ok(ack), .. })) = &r {
                            core.loaded(&process, ack.version);
                        }
                        let _ = settled.send(true);
                        (process, r)
                    })
                })
                .collect();
            let sent = sent.await;
            // Every member answers (a broken ring fails each receipt at once), so each one's outcome is known.
            let mut first_err = sent.as_ref().err().cloned();
            for wait in waits {
                let Ok((process, answer)) = wait.await else { continue };
                let err = match answer {
                    // Recorded by its wait above.
                    Ok(Reply::Control(ControlMsg::WeightsLoaded { result: Ok(_), .. })) => continue,
                    Ok(Reply::Control(ControlMsg::WeightsLoaded { result: Err(e), .. })) => format!("{process}: v{version}: {e}"),
                    Ok(Reply::Lost(p)) => format!("{p} is lost"),
                    other => format!("{process}: unexpected answer {other:?}"),
                };
                core.mark_missed(&process);
                first_err.get_or_insert(err);
            }
            match first_err {
                None => sent,
                Some(e) => {
                    // Unless the group was formed again meanwhile (a lost member's abort failed this one).
                    let mut st = state.lock().expect("group lock");
                    if st.epoch == epoch {
                        st.broken = true;
                    }
                    Err(e)
                }
            }
        })
    }
}
