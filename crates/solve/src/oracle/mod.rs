//! Exhaustive searches that import no solver's code, to check the solvers against:
//! `brute` over rematerialization sequences, `brute_offload` over sequences with
//! transfers (scored by the simulator).

pub mod brute;
pub mod brute_offload;
