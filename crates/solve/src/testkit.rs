//! Emptied: the test fixtures moved to the `pebble-testkit` crate (a dev-dependency).
//! This file goes with the `mod testkit;` line in `lib.rs`.
