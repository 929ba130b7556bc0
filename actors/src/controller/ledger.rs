//! The ledger: every prompt group is dispatched, scored and trained exactly once, durably.
//!
//! A group's life:
//!
//! ```text
//! dispatch ──► Dispatched ──scored──► Scored ──trained──► Trained
//!                 ▲   │                  │
//!      redispatch └───┴──────────────────┤
//!                                        └──dropped──► Dropped (reason)
//! ```
//!
//! (`dropped` and `redispatch` apply to dispatched and scored groups alike.)
//! Each transition is one JSON line appended to `RUN_DIR/ledger.jsonl` and
//! fsynced before the call returns, so a transition that returned `Ok`
//! survives a crash. [`Ledger::open`] replays the file; a torn last line (a
//! crash mid-write) is cut off, any other bad line is an error naming it.
//!
//! Resuming after a crash: the model state comes from the last checkpoint at
//! step `c`, so [`Ledger::rollback`]`(c)` returns the groups trained after
//! `c` to the in-flight set; then every group of [`Ledger::in_flight`] (its
//! rollouts or scores died with the process) is re-dispatched. Nothing is
//! lost, and since a group is marked trained only once, none is trained twice.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The ledger's file name inside the run directory.
pub const LEDGER_FILE: &str = "ledger.jsonl";

/// One line of the ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    /// A new group was sent to a rollout actor that holds policy `version`.
    Dispatch {
        /// The group.
        group: u64,
        /// Policy version of the rollout actor at dispatch.
        version: u64,
    },
    /// The group's rollouts came back scored.
    Scored {
        /// The group.
        group: u64,
    },
    /// The learner trained on the group at optimizer `step`.
    Trained {
        /// The group.
        group: u64,
        /// The optimizer step that consumed it.
        step: u64,
    },
    /// The group will never be trained.
    Dropped {
        /// The group.
        group: u64,
        /// Why (e.g. `stale: 3 versions behind`).
        reason: String,
    },
    /// The group's rollouts or scores were lost (actor failure, resume) and it was sent out again.
    Redispatch {
        /// The group.
        group: u64,
        /// Policy version of the rollout actor at re-dispatch.
        version: u64,
    },
    /// Resumed from the checkpoint of `step`: groups trained after it are in flight again.
    Rollback {
        /// The checkpoint's step.
        step: u64,
    },
}

impl Event {
    /// The group the event is about (`None` for a rollback, which touches many).
    pub fn group(&self) -> Option<u64> {
        match *self {
            Event::Dispatch { group, .. }
            | Event::Scored { group }
            | Event::Trained { group, .. }
            | Event::Dropped { group, .. }
            | Event::Redispatch { group, .. } => Some(group),
            Event::Rollback { .. } => None,
        }
    }
}

/// Where a group is in its life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum GroupState {
    /// Out at a rollout actor (or its scores are not in yet).
    Dispatched {
        /// Policy version at the latest (re-)dispatch.
        version: u64,
        /// How many times it was sent out (1 + re-dispatches).
        attempts: u32,
    },
    /// Scored, waiting for the learner.
    Scored {
        /// Policy version at the latest (re-)dispatch.
        version: u64,
        /// How many times it was sent out.
        attempts: u32,
    },
    /// Trained on; final.
    Trained {
        /// The optimizer step.
        step: u64,
        /// Policy version at the latest (re-)dispatch.
        version: u64,
        /// How many times it was sent out.
        attempts: u32,
    },
    /// Dropped; final.
    Dropped {
        /// Why.
        reason: String,
    },
}

impl GroupState {
    fn describe(&self) -> String {
        match self {
            GroupState::Dispatched { version, .. } => format!("dispatched at version {version}"),
            GroupState::Scored { .. } => "scored".to_string(),
            GroupState::Trained { step, .. } => format!("already trained at step {step}"),
            GroupState::Dropped { reason } => format!("dropped ({reason})"),
        }
    }
}

/// How many groups are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Out at rollout actors.
    pub dispatched: usize,
    /// Scored, waiting for the learner.
    pub scored: usize,
    /// Trained.
    pub trained: usize,
    /// Dropped.
    pub dropped: usize,
}

/// A ledger failure.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Reading, writing or syncing the file failed.
    #[error("{path}: {error}")]
    Io {
        /// The ledger file (or run directory).
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// A line other than the last is not a ledger event, or replays an invalid transition.
    #[error("{path}:{line}: {message}")]
    Corrupt {
        /// The ledger file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The transition is not allowed from the group's state; nothing was recorded.
    #[error("group {group}: cannot record {event}: it is {state}")]
    Transition {
        /// The group.
        group: u64,
        /// The refused event (`trained`, `scored`, …).
        event: &'static str,
        /// The group's state, in words (`not dispatched` for an unknown group).
        state: String,
    },
}

/// The durable record of every group's life in one run directory.
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    file: File,
    groups: BTreeMap<u64, GroupState>,
}

impl Ledger {
    /// Opens (or creates) `run_dir/ledger.jsonl` and replays it; a torn last line is cut off.
    pub fn open(run_dir: &Path) -> Result<Ledger, LedgerError> {
        std::fs::create_dir_all(run_dir).map_err(|error| LedgerError::Io { path: run_dir.to_path_buf(), error })?;
        let path = run_dir.join(LEDGER_FILE);
        let io = |error| LedgerError::Io { path: path.clone(), error };
        let mut file = OpenOptions::new().read(true).append(true).create(true).open(&path).map_err(io)?;
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(io)?;
        let mut groups = BTreeMap::new();
        let mut good_len = 0;
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        for (i, raw) in lines.iter().enumerate() {
            let torn = i + 1 == lines.len() && !raw.ends_with('\n');
            let corrupt = |message: String| LedgerError::Corrupt { path: path.clone(), line: i + 1, message };
            match serde_json::from_str::<Event>(raw) {
                Ok(event) => apply(&mut groups, &event).map_err(|e| corrupt(e.to_string()))?,
                Err(_) if torn => break,
                Err(e) => return Err(corrupt(format!("not a ledger event ({e})"))),
            }
            good_len += raw.len();
        }
        if good_len < text.len() {
            file.set_len(good_len as u64).map_err(io)?;
            file.sync_all().map_err(io)?;
        } else if !text.is_empty() && !text.ends_with('\n') {
            // A complete last record whose newline was lost.
            file.write_all(b"\n").map_err(io)?;
        }
        file.seek(SeekFrom::End(0)).map_err(io)?;
        Ok(Ledger { path, file, groups })
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records that a new `group` was sent out at policy `version`.
    pub fn dispatch(&mut self, group: u64, version: u64) -> Result<(), LedgerError> {
        self.record(Event::Dispatch { group, version })
    }

    /// Records that `group`'s rollouts came back scored.
    pub fn scored(&mut self, group: u64) -> Result<(), LedgerError> {
        self.record(Event::Scored { group })
    }

    /// Records that the learner trained on `group` at `step`.
    pub fn trained(&mut self, group: u64, step: u64) -> Result<(), LedgerError> {
        self.record(Event::Trained { group, step })
    }

    /// Records that `group` will never be trained, and why.
    pub fn dropped(&mut self, group: u64, reason: &str) -> Result<(), LedgerError> {
        self.record(Event::Dropped { group, reason: reason.to_string() })
    }

    /// Records that `group`'s work was lost and it was sent out again at `version`.
    pub fn redispatch(&mut self, group: u64, version: u64) -> Result<(), LedgerError> {
        self.record(Event::Redispatch { group, version })
    }

    /// Records a resume from the checkpoint of `step`: groups trained after it become in flight again.
    pub fn rollback(&mut self, step: u64) -> Result<(), LedgerError> {
        self.record(Event::Rollback { step })
    }

    /// Checks `event` against the group's state, appends it, fsyncs, then applies it.
    /// On an I/O error the in-memory state is left as it was.
    pub fn record(&mut self, event: Event) -> Result<(), LedgerError> {
        let before: Vec<(u64, Option<GroupState>)> = match event.group() {
            Some(g) => vec![(g, self.groups.get(&g).cloned())],
            None => self.groups.iter().filter(|(_, s)| matches!(s, GroupState::Trained { .. })).map(|(g, s)| (*g, Some(s.clone()))).collect(),
        };
        apply(&mut self.groups, &event)?;
        let mut line = serde_json::to_string(&event).expect("ledger events serialise");
        line.push('\n');
        let written = self.file.write_all(line.as_bytes()).and_then(|()| self.file.sync_data());
        if let Err(error) = written {
            for (g, s) in before {
                match s {
                    Some(s) => self.groups.insert(g, s),
                    None => self.groups.remove(&g),
                };
            }
            return Err(LedgerError::Io { path: self.path.clone(), error });
        }
        Ok(())
    }

    /// Groups dispatched or scored but neither trained nor dropped, in id order.
    pub fn in_flight(&self) -> Vec<u64> {
        self.groups
            .iter()
            .filter(|(_, s)| matches!(s, GroupState::Dispatched { .. } | GroupState::Scored { .. }))
            .map(|(g, _)| *g)
            .collect()
    }

    /// One more than the largest group id ever dispatched (0 for a new run).
    pub fn next_group_id(&self) -> u64 {
        self.groups.last_key_value().map_or(0, |(g, _)| g + 1)
    }

    /// The state of `group` (`None`: never dispatched).
    pub fn state(&self, group: u64) -> Option<&GroupState> {
        self.groups.get(&group)
    }

    /// Every group and its state, in id order.
    pub fn groups(&self) -> impl Iterator<Item = (u64, &GroupState)> {
        self.groups.iter().map(|(g, s)| (*g, s))
    }

    /// How many groups are in each state.
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for s in self.groups.values() {
            match s {
                GroupState::Dispatched { .. } => c.dispatched += 1,
                GroupState::Scored { .. } => c.scored += 1,
                GroupState::Trained { .. } => c.trained += 1,
                GroupState::Dropped { .. } => c.dropped += 1,
            }
        }
        c
    }
}

/// Applies one event to the states, or refuses it leaving them unchanged.
fn apply(groups: &mut BTreeMap<u64, GroupState>, event: &Event) -> Result<(), LedgerError> {
    let refuse = |group: u64, event: &'static str, state: Option<&GroupState>| LedgerError::Transition {
        group,
        event,
        state: state.map_or_else(|| "not dispatched".to_string(), GroupState::describe),
    };
    match *event {
        Event::Dispatch { group, version } => {
            if let Some(s) = groups.get(&group) {
                return Err(refuse(group, "dispatch", Some(s)));
            }
            groups.insert(group, GroupState::Dispatched { version, attempts: 1 });
        }
        Event::Scored { group } => match groups.get(&group) {
            Some(&GroupState::Dispatched { version, attempts }) => {
                groups.insert(group, GroupState::Scored { version, attempts });
            }
            s => return Err(refuse(group, "scored", s)),
        },
        Event::Trained { group, step } => match groups.get(&group) {
            Some(&GroupState::Scored { version, attempts }) => {
                groups.insert(group, GroupState::Trained { step, version, attempts });
            }
            s => return Err(refuse(group, "trained", s)),
        },
        Event::Dropped { group, ref reason } => match groups.get(&group) {
            Some(GroupState::Dispatched { .. } | GroupState::Scored { .. }) => {
                groups.insert(group, GroupState::Dropped { reason: reason.clone() });
            }
            s => return Err(refuse(group, "dropped", s)),
        },
        Event::Redispatch { group, version } => match groups.get(&group) {
            Some(&(GroupState::Dispatched { attempts, .. } | GroupState::Scored { attempts, .. })) => {
                groups.insert(group, GroupState::Dispatched { version, attempts: attempts + 1 });
            }
            s => return Err(refuse(group, "redispatch", s)),
        },
        Event::Rollback { step: checkpoint } => {
            for s in groups.values_mut() {
                if let GroupState::Trained { step, version, attempts } = *s {
                    if step > checkpoint {
                        *s = GroupState::Dispatched { version, attempts };
                    }
                }
            }
        }
    }
    Ok(())
}
