//! Shared helpers for the engine's fixture tests (see `spindle-testkit`).

#![allow(unused_imports)]

pub use spindle_testkit::{copy_fixture, fixture, fixtures, max_abs_diff, Reference};
