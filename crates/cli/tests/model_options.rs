//! `--master-weights` and `--trainable`: model options of every planning command, sized
//! by the zoo, and rejected with exit code 2 and a message naming the flag.

mod common;

use common::{ok, pebble};

/// A small model with no tied parameters.
const MLP: [&str; 4] = ["--model", "mlp", "--batch", "4"];

fn args<'a>(command: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    std::iter::once(command).chain(MLP).chain(extra.iter().copied()).collect()
}

/// Exit code 2, one line of ours on standard error, containing every needle.
fn bad_input(args: &[&str], needles: &[&str]) {
    let run = pebble(args);
    assert_eq!(run.code, 2, "pebble {args:?} should exit 2; stderr:\n{}", run.stderr);
    assert!(run.stderr.starts_with("error: "), "pebble {args:?}: {}", run.stderr);
    assert_eq!(run.stderr.trim_end().lines().count(), 1, "pebble {args:?}: more than one line:\n{}", run.stderr);
    for n in needles {
        assert!(run.stderr.contains(n), "pebble {args:?}: `{n}` not in:\n{}", run.stderr);
    }
}

#[test]
fn trainable_outside_zero_to_one_exits_2_naming_the_flag() {
    for bad in ["0", "-0.5", "1.5", "NaN"] {
        bad_input(&args("info", &["--trainable", bad]), &["--trainable", "mlp"]);
    }
    // The same in every command that takes model options.
    bad_input(&args("graph", &["--trainable", "0"]), &["--trainable"]);
    bad_input(&args("plan", &["--budget", "100%", "--solver", "rotor", "--trainable", "0"]), &["--trainable"]);
    bad_input(&args("sweep", &["--trainable", "0"]), &["--trainable"]);
    let dir = scratch("simulate");
    let schedule = dir.join("schedule.json");
    let schedule = schedule.to_str().expect("utf-8");
    ok(&args("plan", &["--budget", "100%", "--solver", "rotor", "-o", schedule]));
    bad_input(&args("simulate", &["--budget", "100%", "--schedule", schedule, "--trainable", "0"]), &["--trainable"]);
    std::fs::remove_dir_all(&dir).ok();
}

/// A fresh directory for one test's files.
fn scratch(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pebble-model-options-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    dir
}

#[test]
fn master_weights_need_bf16() {
    bad_input(&args("info", &["--master-weights"]), &["--master-weights", "bf16"]);
    bad_input(&args("info", &["--master-weights", "--dtype", "f32"]), &["--master-weights", "bf16"]);
}

#[test]
fn the_options_need_a_model() {
    let dir = scratch("chain");
    let chain = dir.join("chain.json");
    std::fs::write(&chain, r#"{"ftime":[1],"btime":[1,1],"x":[1,1],"xbar":[1,1],"ftmp":[0],"btmp":[0,0]}"#)
        .expect("written");
    let path = chain.to_str().expect("utf-8");
    for flag in [&["--trainable", "0.5"][..], &["--master-weights"]] {
        let mut a = vec!["plan", "--chain", path, "--budget", "100", "--solver", "rotor"];
        a.extend_from_slice(flag);
        bad_input(&a, &[flag[0], "model option"]);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn static_memory_follows_the_options() {
    let info = |extra: &[&str]| ok(&args("info", &[extra, &["--json"]].concat())).json();
    let full = info(&[]);
    let p = full["params"].as_u64().expect("params");
    assert_eq!(full["static_bytes"].as_u64(), Some(4 * 4 * p));
    // bf16 weights and gradients; an fp32 master copy and Adam's two fp32 moments.
    let mixed = info(&["--dtype", "bf16", "--master-weights"]);
    assert_eq!(mixed["static_bytes"].as_u64(), Some(2 * p + 2 * p + (1 + 2) * 4 * p));
    assert_eq!(mixed["param_bytes"].as_u64(), Some(2 * p));
    // Half of each tensor trained: whole weights, about half the gradients and moments
    // (rounded up per tensor).
    let half = info(&["--trainable", "0.5"])["static_bytes"].as_u64().expect("static");
    assert!(half >= 4 * p + 12 * p.div_ceil(2) && half < 4 * p + 12 * (p / 2 + 100), "{half} for {p} parameters");
    assert_eq!(info(&["--trainable", "1"])["static_bytes"], full["static_bytes"]);
}

/// Sizes beyond any model are bad input naming the option, before anything is built:
/// each option has a bound, and a step of more than 1 PiB is refused as a whole, so no
/// byte count overflows (a batch of 10^15 used to wrap into a zoo error, exit 1; a
/// 10^8-layer GPT was killed for memory).
#[test]
fn absurd_sizes_exit_2_naming_the_option() {
    let plan = |extra: &[&str]| -> Vec<String> {
        ["plan", "--budget", "60%", "--solver", "rotor"].iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let run = |v: Vec<String>, needles: &[&str]| bad_input(&v.iter().map(String::as_str).collect::<Vec<_>>(), needles);
    run(plan(&["--model", "gpt2-small", "--batch", "999999999999999"]), &["--batch", "at most 1048576"]);
    run(plan(&["--model", "gpt", "--layers", "99999999"]), &["--layers", "at most 10000"]);
    run(plan(&["--model", "resnet50", "--image", "9999999"]), &["--image", "at most 16384"]);
    // Each option within its bound, the step beyond 1 PiB.
    run(plan(&["--model", "resnet50", "--image", "16384", "--batch", "1048576"]), &["resnet50", "1 PiB", "--batch"]);
    // The largest shapes the bounds allow: no product overflows before the check (this
    // one's FLOP count panicked in a debug build).
    run(plan(&["--model", "resnet", "--image", "16384", "--batch", "1048576", "--width", "16384"]), &["1 PiB"]);
    run(vec!["info".into(), "--model".into(), "llama2-7b".into(), "--batch".into(), "1048576".into()], &["1 PiB"]);
}

/// A run the CPU cannot hold is refused before it starts, with what it needs and what
/// the machine has free, where it used to abort on a failed allocation.
#[test]
fn a_run_beyond_the_machines_memory_exits_2() {
    if !std::path::Path::new("/proc/meminfo").exists() {
        return; // Free memory is read from Linux's /proc/meminfo.
    }
    // 6.7 TiB at 60%.
    let train =
        ["train", "--model", "gpt", "--batch", "1048576", "--budget", "60%", "--solver", "rotor", "--steps", "1"];
    bad_input(&train, &["--device", "the plan needs", "free"]);
    bad_input(&["profile", "--model", "gpt", "--batch", "1048576", "-o", "unused.json"], &["largest tensor", "free"]);
    bad_input(&["bench", "--model", "gpt", "--batch", "1048576"], &["store-all", "free"]);
}
