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

#[test]
fn down_signals_only_the_job_that_owns_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let probe = Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "true"]).output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => return println!("SKIPPED: unshare --pid --fork --mount-proc is not permitted here: {}", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => return println!("SKIPPED: unshare is not available: {e}"),
    }
    let o = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c", SCRIPT, "down-ns", env!("CARGO_BIN_EXE_launcher"), dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
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
