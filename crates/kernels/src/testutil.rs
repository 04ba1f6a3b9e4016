//! Random inputs for kernel tests (never zeros).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn vec(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.random_range(-1.0..1.0f32) * scale)
        .collect()
}

pub fn bf16_vec(rng: &mut StdRng, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| (rng.random_range(-1.0..1.0f32).to_bits() >> 16) as u16)
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
