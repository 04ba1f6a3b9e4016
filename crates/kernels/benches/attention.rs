//! Attention of one query head over a cache read contiguously (`HeadCache`) or through a block
//! table (`PagedHeads`, blocks of `BLOCK_TOKENS` tokens in separate allocations): the cost of
//! paging the KV cache. Fastest of many calls (the development machine is shared).
//!
//! `cargo bench -p spindle-kernels --bench attention`

use std::hint::black_box;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use spindle_kernels::attention::{attend, HeadCache, PagedHeads};
use spindle_model::paged::BLOCK_TOKENS;

fn time(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < budget || n < 5 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        n += 1;
    }
    best
}

fn main() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let heads = 2;
    for d in [32, 128, 256] {
        for tokens in [512, 4096, 32768] {
            let width = heads * d;
            let mut random =
                |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0f32)).collect() };
            let (k, v, q) = (random(tokens * width), random(tokens * width), random(d));
            let blocks = |rows: &[f32]| -> Vec<Vec<f32>> {
                rows.chunks(BLOCK_TOKENS * width)
                    .map(|c| {
                        let mut b = vec![0.0; BLOCK_TOKENS * width];
                        b[..c.len()].copy_from_slice(c);
                        b
                    })
                    .collect()
            };
            let (kb, vb) = (blocks(&k), blocks(&v));
            let kb: Vec<&[f32]> = kb.iter().map(Vec::as_slice).collect();
            let vb: Vec<&[f32]> = vb.iter().map(Vec::as_slice).collect();
            let mut scores = Vec::new();
            let mut out = vec![0.0; d];
            let budget = Duration::from_millis(300);
            let contiguous = time(budget, || {
                let c = |data| HeadCache {
                    data,
                    heads,
                    head_dim: d,
                };
                attend(&q, c(&k), c(&v), 1, 0..tokens, 0.1, &mut scores, &mut out);
                black_box(&out);
            });
            let paged = time(budget, || {
                let p = |blocks| PagedHeads {
                    blocks,
                    heads,
                    head_dim: d,
                };
                attend(&q, p(&kb), p(&vb), 1, 0..tokens, 0.1, &mut scores, &mut out);
                black_box(&out);
            });
            println!(
                "head_dim {d:>3}, {tokens:>5} tokens: contiguous {:>8.1} us, paged {:>8.1} us ({:+.1}%)",
                contiguous * 1e6,
                paged * 1e6,
                (paged / contiguous - 1.0) * 100.0
            );
        }
    }
}
