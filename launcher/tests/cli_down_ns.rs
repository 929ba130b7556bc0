//! `launcher down` signals only the run's own job: a pid that is out of range,
//! reused by another process, or not the holder of the run directory's lock is
//! refused (exit 2) and nothing is signalled.
//!
//! Every case runs inside a new pid namespace (`unshare --pid --fork --mount-proc`):
//! were `down` to regress and signal whatever `status.json` names, it could reach
//! only the namespace's own processes, never the machine's (CI's included).
//! Where unshare is not permitted the test prints SKIPPED and why.
mod common;

use common::*;
use std::process::Command;

/// Runs as pid 1 of the namespace: `$1` is the launcher, `$2` a scratch run directory.
/// Prints one `case NAME rc=CODE alive=yes|no` line per case.
const SCRIPT: &str = r#"
L="$1"; D="$2"; H="$(cat /proc/sys/kernel/hostname)"
start() { cut -d' ' -f22 "/proc/$1/stat"; }
alive() { s="$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)"; [ -n "$s" ] && [ "$s" != Z ] && echo yes || echo no; }
status() { printf '{"pid": %s, "start_time": %s, "host": "%s", "phase": "rl"}' "$1" "$2" "$H" > "$D/status.json"; }
down() { "$L" down --run-dir "$D" >"$D/out" 2>&1; echo "case $1 rc=$? alive=$(alive "$2")"; sed 's/^/  | /' "$D/out"; }

sleep 30 & V=$!
for pid in 0 1 -1 4294967295 99999999 '"12"'; do
  printf '{"pid": %s}' "$pid" > "$D/status.json"; down "pid=$pid" "$V"
done
printf '{"pid": %s, "host": "%s"}' "$V" "$H" > "$D/status.json"; down no-start-time "$V"
status "$V" "$(( $(start "$V") + 1 ))"; down reused-pid "$V"
status "$V" "$(start "$V")"; down no-lock-holder "$V"

# A job that holds the run directory's lock, as `launcher up` does.
sh -c 'exec 9>>"$1/.lock"; flock -n 9 || exit 1; printf %s $$ > "$1/.lock"; exec sleep 30' job "$D" & J=$!
while [ "$(cat "$D/.lock" 2>/dev/null)" != "$J" ]; do sleep 0.05; done
status "$V" "$(start "$V")"; down lock-held-by-another "$V"
status "$J" "$(( $(start "$J") + 1 ))"; down job-with-wrong-start "$J"
status "$J" "$(start "$J")"; down the-job "$J"
echo "case bystander-at-the-end rc=0 alive=$(alive "$V")"
kill "$V"
"#;

/// Runs `script` as pid 1 of a new pid namespace with `args`; `None` (after printing
/// SKIPPED and why) where this machine does not permit one.
fn in_pid_namespace(script: &str, args: &[&str]) -> Option<String> {
    let probe = Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "true"]).output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            println!("SKIPPED: unshare --pid --fork --mount-proc is not permitted here: {}", String::from_utf8_lossy(&o.stderr).trim());
            return None;
        }
        Err(e) => {
            println!("SKIPPED: unshare is not available: {e}");
            return None;
        }
    }
    let o = Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "sh", "-c", script, "down-ns"]).args(args).output().unwrap();
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    Some(out)
}

#[test]
fn down_signals_only_the_job_that_owns_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let Some(out) = in_pid_namespace(SCRIPT, &[env!("CARGO_BIN_EXE_launcher"), dir.path().to_str().unwrap()]) else { return };
    let case = |name: &str| -> &str {
        let head = format!("case {name} ");
        out.lines().find_map(|l| l.strip_prefix(head.as_str())).unwrap_or_else(|| panic!("no case {name}:\n{out}"))
    };
    for pid in ["0", "1", "-1", "4294967295", "99999999", "\"12\""] {
        assert_eq!(case(&format!("pid={pid}")), "rc=2 alive=yes", "{out}");
    }
    for refused in ["no-start-time", "reused-pid", "no-lock-holder", "lock-held-by-another"] {
        assert_eq!(case(refused), "rc=2 alive=yes", "{refused}:\n{out}");
    }
    assert_eq!(case("job-with-wrong-start"), "rc=2 alive=yes", "{out}");
    assert_eq!(case("the-job"), "rc=0 alive=no", "{out}");
    assert_eq!(case("bystander-at-the-end"), "rc=0 alive=yes", "{out}");
    assert!(out.contains("field \"pid\": expected a process id in 2..="), "{out}");
    assert!(out.contains("is another process now") && out.contains("records no start time"), "{out}");
    assert!(out.contains("nobody holds") && out.contains(".lock is held by pid"), "{out}");
    assert!(out.contains("sent SIGTERM to pid") && out.contains("stopped after"), "{out}");
}

/// A real job (`launcher up`, in the namespace), stopped by `launcher down` once it trains.
const JOB: &str = r#"
L="$1"; D="$2"; cd "$3"
"$L" up deploy/local.toml --recipe "$4" --run-dir "$D" --metrics-addr 127.0.0.1:0 --eval-limit 2 >"$D.log" 2>&1 & J=$!
i=0
until grep -q '"phase":"rl"' "$D/status.json" 2>/dev/null; do
  sleep 0.1; i=$((i+1)); if [ $i -gt 3000 ]; then echo "case never-trained"; cat "$D.log"; kill $J; exit 0; fi
done
"$L" down --run-dir "$D"; echo "case down rc=$?"
wait $J; echo "case job rc=$?"
echo "case phase $(grep -o '"phase":"[a-z]*"' "$D/status.json")"
grep -o 'SIGTERM: stopped at RL step [0-9]*' "$D/progress.log" | sed 's/^/case log /'
"#;

#[test]
fn down_stops_a_real_job() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("long.toml");
    std::fs::write(&recipe, "reward = \"process\"\n[model]\nhidden = 32\nlayers = 1\n[tasks]\nsize = 64\nheld_out = 100\n[sft]\nsteps = 2\nbatch_size = 4\ntasks = 256\n[rl]\nsteps = 100000\ngroup_size = 2\ngroups_per_step = 2\nmax_turns = 2\nmax_new_tokens = 16\n").unwrap();
    let run = dir.path().join("run");
    let root = repo();
    let args = [env!("CARGO_BIN_EXE_launcher"), run.to_str().unwrap(), root.to_str().unwrap(), recipe.to_str().unwrap()];
    let Some(out) = in_pid_namespace(JOB, &args) else { return };
    assert!(out.contains("case down rc=0") && out.contains("sent SIGTERM to pid") && out.contains("stopped after"), "{out}");
    assert!(out.contains("case job rc=143"), "ended by SIGTERM: {out}");
    // It checkpointed at the step it stopped on, said so in its log, and left status "stopped".
    assert!(out.contains(r#"case phase "phase":"stopped""#), "{out}");
    let stopped_at: u64 = out.lines().find_map(|l| l.strip_prefix("case log SIGTERM: stopped at RL step")).and_then(|n| n.trim().parse().ok()).unwrap_or_else(|| panic!("no stop line in progress.log: {out}"));
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("checkpoints/latest/state.json")).unwrap()).unwrap();
    assert_eq!(state["meta"]["data_cursor"]["step"], stopped_at, "the newest checkpoint is of the step it stopped on: {state}");
}
