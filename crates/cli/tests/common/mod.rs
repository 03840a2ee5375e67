//! What every CLI test binary needs: run `pebble`, read what it did.
#![allow(dead_code)] // each test binary uses its own share

use std::process::Command;

use serde_json::Value;

/// What one run of `pebble` did.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The stdout as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

/// Runs the binary; a panic is always a failure.
pub fn pebble(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_pebble")).args(args).output().expect("the binary runs");
    let run = Run {
        code: out.status.code().expect("exited, not killed by a signal"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!run.stderr.contains("panicked"), "pebble {args:?} panicked:\n{}", run.stderr);
    run
}

/// Runs and expects success.
pub fn ok(args: &[&str]) -> Run {
    let run = pebble(args);
    assert_eq!(run.code, 0, "pebble {args:?} failed:\n{}", run.stderr);
    run
}
