//! The ledger trains every group exactly once across crashes; staleness admission per mode.
use rlmesh_actors::controller::ledger::{Counts, GroupState, Ledger, LedgerError, LEDGER_FILE};
use rlmesh_actors::controller::staleness::{admit, Admission, AheadOfLearner, Gate, Mode};
use std::io::Write;

fn lines(dir: &std::path::Path) -> usize {
    std::fs::read_to_string(dir.join(LEDGER_FILE)).unwrap().lines().count()
}

#[test]
fn ledger_allows_each_transition_once_and_refuses_the_rest_without_recording() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = Ledger::open(dir.path()).unwrap();
    assert_eq!(l.next_group_id(), 0);
    l.dispatch(0, 0).unwrap();
    l.dispatch(1, 0).unwrap();
    l.scored(0).unwrap();
    l.trained(0, 1).unwrap();
    assert_eq!(l.state(0), Some(&GroupState::Trained { step: 1, version: 0, attempts: 1 }));
    let recorded = lines(dir.path());

    let refusals: Vec<(LedgerError, &str)> = vec![
        (l.trained(0, 2).unwrap_err(), "group 0: cannot record trained: it is already trained at step 1"),
        (l.scored(7).unwrap_err(), "group 7: cannot record scored: it is not dispatched"),
        (l.trained(1, 2).unwrap_err(), "group 1: cannot record trained: it is dispatched at version 0"),
        (l.dispatch(1, 3).unwrap_err(), "group 1: cannot record dispatch: it is dispatched at version 0"),
        (l.dropped(0, "late").unwrap_err(), "group 0: cannot record dropped: it is already trained at step 1"),
        (l.redispatch(0, 2).unwrap_err(), "group 0: cannot record redispatch: it is already trained at step 1"),
    ];
    for (err, want) in refusals {
        assert!(matches!(err, LedgerError::Transition { .. }));
        assert_eq!(err.to_string(), want);
    }
    assert_eq!(lines(dir.path()), recorded, "refused transitions are not written");

    l.dropped(1, "stale: 3 versions behind").unwrap();
    assert!(l.scored(1).unwrap_err().to_string().ends_with("it is dropped (stale: 3 versions behind)"));
    assert_eq!(l.counts(), Counts { dispatched: 0, scored: 0, trained: 1, dropped: 1 });
    assert_eq!(l.next_group_id(), 2);
}

#[test]
fn ledger_redispatch_after_a_failure_counts_attempts_and_keeps_the_group_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = Ledger::open(dir.path()).unwrap();
    for g in 0..3 {
        l.dispatch(g, 4).unwrap();
    }
    l.scored(1).unwrap();
    assert_eq!(l.in_flight(), [0, 1, 2]);
    // The rollout actor holding group 0 crashed; group 1's scores were lost with the learner queue.
    l.redispatch(0, 5).unwrap();
    l.redispatch(1, 5).unwrap();
    assert_eq!(l.state(0), Some(&GroupState::Dispatched { version: 5, attempts: 2 }));
    assert_eq!(l.state(1), Some(&GroupState::Dispatched { version: 5, attempts: 2 }));
    l.scored(0).unwrap();
    l.trained(0, 1).unwrap();
    assert_eq!(l.in_flight(), [1, 2]);
}

#[test]
fn ledger_replays_after_a_crash_and_cuts_a_torn_last_line() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut l = Ledger::open(dir.path()).unwrap();
        for g in 0..4 {
            l.dispatch(g, 0).unwrap();
        }
        l.scored(0).unwrap();
        l.trained(0, 1).unwrap();
        l.scored(1).unwrap();
        l.dropped(2, "failed").unwrap();
        // Crash: the ledger is never closed, and a write was cut short.
        std::mem::forget(l);
    }
    let path = dir.path().join(LEDGER_FILE);
    let good = std::fs::read_to_string(&path).unwrap();
    std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"event\":\"trained\",\"gro").unwrap();

    let mut l = Ledger::open(dir.path()).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), good, "the torn line is cut off");
    assert_eq!(l.state(0), Some(&GroupState::Trained { step: 1, version: 0, attempts: 1 }));
    assert_eq!(l.state(1), Some(&GroupState::Scored { version: 0, attempts: 1 }));
    assert_eq!(l.state(2), Some(&GroupState::Dropped { reason: "failed".to_string() }));
    assert_eq!(l.in_flight(), [1, 3]);
    assert_eq!(l.next_group_id(), 4);
    assert!(l.trained(0, 2).is_err(), "a resumed run never trains a group twice");
    l.trained(1, 2).unwrap();
    drop(l);

    let l = Ledger::open(dir.path()).unwrap();
    assert_eq!(l.state(1), Some(&GroupState::Trained { step: 2, version: 0, attempts: 1 }));
    assert_eq!(l.counts(), Counts { dispatched: 1, scored: 0, trained: 2, dropped: 1 });
}

#[test]
fn ledger_keeps_a_complete_last_record_whose_newline_was_lost() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(LEDGER_FILE), "{\"event\":\"dispatch\",\"group\":0,\"version\":0}\n{\"event\":\"scored\",\"group\":0}").unwrap();
    let mut l = Ledger::open(dir.path()).unwrap();
    assert_eq!(l.state(0), Some(&GroupState::Scored { version: 0, attempts: 1 }));
    l.trained(0, 1).unwrap();
    drop(l);
    assert_eq!(lines(dir.path()), 3);
    assert!(matches!(Ledger::open(dir.path()).unwrap().state(0), Some(GroupState::Trained { step: 1, .. })));
}

#[test]
fn ledger_refuses_a_corrupt_line_before_the_end_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(LEDGER_FILE);
    std::fs::write(&path, "{\"event\":\"dispatch\",\"group\":0,\"version\":0}\ngarbage\n{\"event\":\"scored\",\"group\":0}\n").unwrap();
    let err = Ledger::open(dir.path()).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}:2: not a ledger event", path.display())), "{err}");

    std::fs::write(&path, "{\"event\":\"dispatch\",\"group\":0,\"version\":0}\n{\"event\":\"trained\",\"group\":0,\"step\":1}\n").unwrap();
    let err = Ledger::open(dir.path()).unwrap_err().to_string();
    assert_eq!(err, format!("{}:2: group 0: cannot record trained: it is dispatched at version 0", path.display()));
}

#[test]
fn ledger_rollback_to_a_checkpoint_returns_later_groups_to_flight_and_loses_none() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = Ledger::open(dir.path()).unwrap();
    for (g, step) in [(0, 1), (1, 1), (2, 2), (3, 3)] {
        l.dispatch(g, step - 1).unwrap();
        l.scored(g).unwrap();
        l.trained(g, step).unwrap();
    }
    l.dispatch(4, 3).unwrap();
    drop(l);

    // Resume from the checkpoint of step 1: steps 2 and 3 were never saved.
    let mut l = Ledger::open(dir.path()).unwrap();
    l.rollback(1).unwrap();
    assert_eq!(l.in_flight(), [2, 3, 4]);
    for g in l.in_flight() {
        l.redispatch(g, 1).unwrap();
    }
    for g in [2, 3, 4] {
        l.scored(g).unwrap();
        l.trained(g, 2).unwrap();
    }
    assert!(l.trained(0, 2).is_err() && l.trained(1, 2).is_err());
    drop(l);
    let l = Ledger::open(dir.path()).unwrap();
    let trained: Vec<u64> = l.groups().filter(|(_, s)| matches!(s, GroupState::Trained { .. })).map(|(g, _)| g).collect();
    assert_eq!(trained, [0, 1, 2, 3, 4], "every group trained exactly once in the surviving model state");
    assert_eq!(l.state(3), Some(&GroupState::Trained { step: 2, version: 1, attempts: 2 }));
}

#[test]
fn staleness_admission_per_mode() {
    let cases = [
        (Mode::Sync, 5, 5, Admission::Train { staleness: 0 }),
        (Mode::Sync, 4, 5, Admission::Stale { staleness: 1 }),
        (Mode::OneStepOff, 4, 5, Admission::Train { staleness: 1 }),
        (Mode::OneStepOff, 3, 5, Admission::Stale { staleness: 2 }),
        (Mode::Async { max_staleness: 3 }, 2, 5, Admission::Train { staleness: 3 }),
        (Mode::Async { max_staleness: 3 }, 1, 5, Admission::Stale { staleness: 4 }),
        (Mode::Async { max_staleness: 3 }, 5, 5, Admission::Train { staleness: 0 }),
    ];
    for (mode, v, learner, want) in cases {
        assert_eq!(admit(mode, v, learner), Ok(want), "{mode:?}: v = {v}, V = {learner}");
    }
    let ahead = admit(Mode::Async { max_staleness: 3 }, 6, 5).unwrap_err();
    assert_eq!(ahead, AheadOfLearner { group_version: 6, learner_version: 5 });
}

#[test]
fn staleness_gate_counts_admitted_and_stale_groups() {
    let mut gate = Gate::new(Mode::OneStepOff);
    for v in [5, 4, 3, 2, 5] {
        gate.admit(v, 5).unwrap();
    }
    assert!(gate.admit(9, 5).is_err());
    assert_eq!((gate.admitted, gate.stale), (3, 2));
}
