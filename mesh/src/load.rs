//! How busy this process's cores are with other programs.
//!
//! libgomp (PyTorch's OpenMP) spins between parallel regions by default. On an
//! idle machine that is the fastest choice; beside another program that keeps
//! a core busy, a spinning team of two threads waits out the scheduler's time
//! slices, and the embedded run's warm-up ran 3.5× slower (a passive wait:
//! 1.8×). The wait policy can only be chosen before the process starts
//! (libgomp reads `OMP_WAIT_POLICY` when it is loaded), so `launcher up` looks
//! at the load first and, when other programs are busy, starts itself again
//! with `OMP_WAIT_POLICY=PASSIVE`.
//!
//! Only the cores this process may run on count (its affinity mask, read from
//! `/proc/stat`'s per-core lines), and this process's own CPU time is left out.
use std::io;
use std::time::Duration;

/// Set on a process that `launcher up` started again to wait passively: why
/// (the run writes it into its progress log). Its presence also keeps the
/// new process from looking again.
pub const PASSIVE_WHY_ENV: &str = "RLMESH_PASSIVE_WAIT_WHY";

/// Other programs' load, in cores, from which an embedded run waits passively.
pub const BUSY_CORES: f64 = 0.5;

/// Busy and total ticks of the cores in `cpus`, from the text of `/proc/stat`.
pub fn ticks(stat: &str, cpus: &[usize]) -> (u64, u64) {
    let (mut busy, mut total) = (0u64, 0u64);
    for line in stat.lines() {
        let mut f = line.split_whitespace();
        let Some(n) = f.next().and_then(|h| h.strip_prefix("cpu")).and_then(|n| n.parse::<usize>().ok()) else { continue };
        if !cpus.contains(&n) {
            continue;
        }
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let v: Vec<u64> = f.take(8).map(|x| x.parse().unwrap_or(0)).collect();
        let get = |i: usize| v.get(i).copied().unwrap_or(0);
        busy += get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
        total += v.iter().sum::<u64>();
    }
    (busy, total)
}

/// This process's user + system ticks, from the text of `/proc/self/stat`.
pub fn own_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces: count fields after its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the name.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// The cores this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t filled by the kernel for this process.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return (0..std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).collect();
    }
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// Cores' worth of work other programs did on this process's cores over `window`.
pub fn busy_cores_elsewhere(window: Duration) -> io::Result<f64> {
    let cpus = allowed_cpus();
    let read = || -> io::Result<((u64, u64), u64)> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let own = own_ticks(&std::fs::read_to_string("/proc/self/stat")?).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unreadable /proc/self/stat"))?;
        Ok((ticks(&stat, &cpus), own))
    };
    let ((b0, t0), o0) = read()?;
    std::thread::sleep(window);
    let ((b1, t1), o1) = read()?;
    let total = t1.saturating_sub(t0);
    if total == 0 {
        return Ok(0.0);
    }
    let others = b1.saturating_sub(b0).saturating_sub(o1.saturating_sub(o0));
    Ok(others as f64 / total as f64 * cpus.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_count_only_the_allowed_cores_and_their_busy_fields() {
        let stat = "cpu  100 0 50 1000 5 1 2 3 0 0\n\
                    cpu0 10 1 5 100 4 1 1 1 0 0\n\
                    cpu1 20 0 10 200 1 0 1 2 0 0\n\
                    intr 12345\n";
        // cpu0: busy 10+1+5+1+1+1 = 19, total 19+100+4 = 123.
        assert_eq!(ticks(stat, &[0]), (19, 123));
        // cpu1: busy 20+10+1+2 = 33, total 33+200+1 = 234.
        assert_eq!(ticks(stat, &[0, 1]), (52, 357));
        assert_eq!(ticks(stat, &[5]), (0, 0));
    }

    #[test]
    fn own_ticks_survive_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194304 100 0 0 0 37 5 0 0 20 0 1 0 999 0 0";
        assert_eq!(own_ticks(stat), Some(42));
    }

    #[test]
    fn a_busy_program_beside_us_is_seen() {
        let mut child = std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let busy = busy_cores_elsewhere(Duration::from_millis(600));
        let _ = child.kill();
        let _ = child.wait();
        // Other tests running beside this one only add to what is seen.
        let busy = busy.unwrap();
        assert!(busy >= 0.7, "a shell spinning on one of our cores: {busy:.2} cores seen busy");
    }
}
