#![allow(dead_code)]
//! Helpers shared by the mutation tests.

pub mod gguf_map;
