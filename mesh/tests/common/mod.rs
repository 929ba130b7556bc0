//! The custom harness of the multi-process tests: each test binary is also its
//! own peer process, so it runs its tests itself and prints cargo's closing line.
use std::time::Instant;

/// Runs the tests whose names contain a command-line filter (all without one),
/// prints `N passed, N failed` and exits 101 when one failed.
pub fn run(tests: &[(&str, fn())]) {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let (mut passed, mut failed) = (0, 0);
    for (name, f) in tests {
        if !filter.is_empty() && !filter.iter().any(|p| name.contains(p.as_str())) {
            continue;
        }
        let t0 = Instant::now();
        match std::panic::catch_unwind(f) {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({:.2} s)", t0.elapsed().as_secs_f64());
            }
            Err(_) => {
                failed += 1;
                println!("test {name} ... FAILED");
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(101);
    }
}
