//! Topology and recipe sizes are bounded at parse time, and planning is linear
//! (issue 19, defects 5, 8 and 9): huge counts are refused naming the field and
//! the bound, before anything of that size is allocated.
use rlmesh_actors::controller::plan::plan;
use rlmesh_actors::controller::recipe::Recipe;
use rlmesh_actors::controller::topology::{Topology, MAX_ACTORS_PER_PLACEMENT, MAX_PROCESSES};
use std::fmt::Write;
use std::time::{Duration, Instant};

const LOCAL: &str = include_str!("../../deploy/local.toml");

fn topology_error(text: &str) -> String {
    Topology::parse("deploy/bad.toml", text).unwrap_err().to_string()
}

fn recipe_error(text: &str) -> String {
    Recipe::parse("configs/bad.toml", text).unwrap_err().to_string()
}

/// A topology of `nodes` CPU nodes (one per host), each with `per_node` reward actors in processes of their own.
fn wide(nodes: usize, per_node: usize) -> String {
    let mut t = String::from("name = \"wide\"\n[ports]\ncontrol = 10000\ndata = 20000\nmetrics = 30000\nmaster = 40000\n");
    for n in 0..nodes {
        let _ = write!(t, "[[nodes]]\nname = \"n{n}\"\nhost = \"10.{}.{}.{}\"\n", n >> 16, (n >> 8) & 255, n & 255);
    }
    t.push_str("[controller]\nnode = \"n0\"\n[weight_sync]\nnode = \"n0\"\n[rollout]\nplacement = [{ node = \"n0\" }]\n");
    t.push_str("[learner]\nranks = 1\nplacement = [{ node = \"n0\" }]\n[reward]\nplacement = [\n");
    for n in 0..nodes {
        let _ = writeln!(t, "  {{ node = \"n{n}\", actors = {per_node} }},");
    }
    t.push_str("]\n");
    t
}

#[test]
fn actors_per_placement_are_bounded_before_they_are_allocated() {
    // `actors = 4000000000` aborted with "memory allocation of N bytes failed".
    let text = LOCAL.replacen("actors = 1, process = \"main\" }]", "actors = 4000000000, process = \"main\" }]", 1);
    let e = topology_error(&text);
    assert!(e.starts_with("deploy/bad.toml:25: field \"rollout.placement[0].actors\": at most 4096"), "{e}");
    assert!(e.contains("got 4000000000"), "{e}");
    let at_bound = LOCAL.replacen("actors = 1, process = \"main\" }]", &format!("actors = {MAX_ACTORS_PER_PLACEMENT}, process = \"main\" }}]"), 1);
    assert!(Topology::parse("ok.toml", &at_bound).is_ok());
}

#[test]
fn processes_per_topology_are_bounded() {
    // 25 nodes × 4096 = 102400 processes (+4), over the bound of 100000.
    let e = topology_error(&wide(25, 4096));
    assert!(e.contains("field \"reward.placement[24]\"") && e.contains(&format!("at most {MAX_PROCESSES} processes")), "{e}");
}

#[test]
fn planning_100k_processes_is_linear() {
    // 2000 nodes × 49 processes + 4 = 98004 processes: 70 s before (quadratic lookups), well under 10 s now.
    let text = wide(2000, 49);
    let start = Instant::now();
    let t = Topology::parse("wide.toml", &text).unwrap();
    let p = plan(&t);
    let took = start.elapsed();
    assert_eq!(p.processes.len(), 2000 * 49 + 4);
    assert!(took < Duration::from_secs(10), "parsing and planning 98004 processes took {took:?}");
    let last = p.processes.iter().find(|p| p.name == "n1999/reward-97999").unwrap();
    assert_eq!(last.ports.control, 10000 + 48);
}

#[test]
fn an_integer_too_large_for_toml_names_its_field() {
    // "number too large to fit in target type" named no field.
    let text = LOCAL.replacen("actors = 1, process = \"main\" }]", "actors = 99999999999999999999, process = \"main\" }]", 1);
    let e = topology_error(&text);
    assert!(e.starts_with("deploy/bad.toml:25: field \"rollout.placement[0].actors\": "), "{e}");
    let e = recipe_error("reward = \"process\"\n[tasks]\nsize = 99999999999999999999\n");
    assert!(e.starts_with("configs/bad.toml:3: field \"tasks.size\": "), "{e}");
}

#[test]
fn recipe_sizes_have_upper_bounds_that_say_why() {
    let base = "reward = \"process\"\n[tasks]\nsize = 64\n";
    let cases = [
        ("[rl]\ngroup_size = 100000000\n", "rl.group_size"),
        ("[rl]\nmax_new_tokens = 1000000000\n", "rl.max_new_tokens"),
        ("[rl]\nmax_turns = 1000000\n", "rl.max_turns"),
        ("[rl]\ngroups_per_step = 100000000\n", "rl.groups_per_step"),
        ("[model]\nhidden = 1000000000\n", "model.hidden"),
        ("[model]\nlayers = 100000\n", "model.layers"),
        ("[model]\nvocab_size = 100000000\n", "model.vocab_size"),
        ("[sft]\nbatch_size = 100000000\n", "sft.batch_size"),
        ("[sft]\ntasks = 100000000000\n", "sft.tasks"),
        ("[sft]\nlr_warmup = 10000000000\n", "sft.lr_warmup"),
    ];
    for (extra, field) in cases {
        let e = recipe_error(&format!("{base}{extra}"));
        assert!(e.contains(&format!("field \"{field}\": must be at most")) && e.contains(" (") && e.contains("got"), "{field}: {e}");
    }
    for bad in [0, 4] {
        let e = recipe_error(&format!("{base}[model]\nnumber_chunk = {bad}\n"));
        assert!(e.contains("field \"model.number_chunk\": digits per number token, 1 to 3"), "{e}");
    }
    let e = recipe_error("reward = \"process\"\n[tasks]\nsize = 100000000000\n");
    assert!(e.starts_with("configs/bad.toml:3: field \"tasks.size\": must be at most"), "{e}");
    // The warm-up's optimizer: decay a share per step scaled by the lr, β₂ strictly inside (0, 1).
    for (extra, field, says) in [
        ("weight_decay = -0.1", "sft.weight_decay", "must be in [0, 1], got -0.1"),
        ("weight_decay = 1.5", "sft.weight_decay", "must be in [0, 1], got 1.5"),
        ("beta2 = 1.0", "sft.beta2", "must lie in (0, 1), got 1"),
        ("beta2 = 0", "sft.beta2", "must lie in (0, 1), got 0"),
    ] {
        let e = recipe_error(&format!("{base}[sft]\n{extra}\n"));
        assert!(e.starts_with("configs/bad.toml:5: ") && e.contains(&format!("field \"{field}\": {says}")), "{e}");
    }
}

#[test]
fn a_configuration_file_past_16_mib_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.toml");
    std::fs::File::create(&path).unwrap().set_len(200 << 20).unwrap(); // sparse: no disk, no read
    let e = Topology::load(&path).unwrap_err().to_string();
    assert!(e.ends_with("huge.toml:1: 209715200 bytes, more than the 16 MiB a configuration file may have"), "{e}");
    let e = Recipe::load(&path).unwrap_err().to_string();
    assert!(e.contains("more than the 16 MiB"), "{e}");
}

#[test]
fn the_tiny_models_size_is_bounded_as_a_whole() {
    // Each within its own bound, together 16384² × 12 × 256 ≈ 8e11 parameters.
    let e = recipe_error("reward = \"process\"\n[tasks]\nsize = 64\n[model]\nhidden = 16384\nlayers = 256\nheads = 128\nkv_heads = 8\n");
    assert!(e.contains("field \"model.hidden\": the tiny model would have") && e.contains("more than 2^30"), "{e}");
    assert!(Recipe::parse("ok.toml", "reward = \"process\"\n[tasks]\nsize = 64\n[model]\nhidden = 1024\nlayers = 8\n").is_ok());
}
