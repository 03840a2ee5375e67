//! The two outcomes `main` turns into exit codes besides success: bad input (2) and an
//! infeasible budget (1). Any other error is 1 too, but reads as a failure of pebble
//! itself (a solver whose schedule the simulator rejects, an unwritable disk).

use std::fmt;

/// The user's input is wrong: a malformed file, an unknown name, an option a model does
/// not take. The message names the flag or the field at fault. Exit code 2, as for
/// clap's own usage errors.
#[derive(Debug)]
pub struct BadInput(pub String);

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

/// Shorthand for a [`BadInput`] error.
pub fn bad(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(BadInput(message.into()))
}

/// No schedule of the solver fits the budget. Not an error of pebble's: a verdict,
/// printed as is (without `error:`), exit code 1.
#[derive(Debug)]
pub struct Infeasible(pub String);

impl fmt::Display for Infeasible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Infeasible {}

/// The exit code of an error: 2 for bad input anywhere in its chain, 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    if err.chain().any(|e| e.is::<BadInput>()) {
        2
    } else {
        1
    }
}

/// Whether the error is a closed standard output (`pebble models | head`): the reader
/// has what it wanted, so this is no failure.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|e| e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}
