//! One data-parallel learner rank as a process (see `rlmesh_actors::learner::rank`).
fn main() -> std::process::ExitCode {
    rlmesh_actors::learner::rank::rank_main(std::env::args().skip(1))
}
