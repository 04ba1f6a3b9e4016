//! Attention over a paged KV cache (keys and values in 16-token blocks of a pool, reached through
//! a block table) gives the same bits as over the same rows stored contiguously, through every
//! attention kernel the model runs (tiled prefill, serial, flash-decoding split + combine): on
//! random data, with one block, many blocks, lengths that are not multiples of 16 and a
//! shuffled table whose other blocks hold garbage. Needs a CUDA GPU:
//! `cargo test --release -p spindle-cuda --test paged -- --ignored`.

use spindle_cuda::testing::{self, AttentionPath};
use spindle_cuda::Device;
use spindle_model::paged::{blocks_for, BLOCK_TOKENS};
use spindle_testkit::Rng;

fn device() -> Device {
    let ordinal = std::env::var("SPINDLE_CUDA_DEVICE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Device::open(ordinal).unwrap_or_else(|e| panic!("{e}"))
}

/// A table of `blocks` distinct ids, shuffled, from a pool of twice as many blocks.
fn shuffled_table(rng: &mut Rng, blocks: usize) -> Vec<i32> {
    let mut ids: Vec<i32> = (0..2 * blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        let j = (rng.unit() * (i + 1) as f32) as usize % (i + 1);
        ids.swap(i, j);
    }
    ids.truncate(blocks);
    ids
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn paged_attention_equals_contiguous_bit_for_bit() {
    let dev = device();
    let mut rng = Rng(0x9a9ed);
    let mut ran = 0;
    // (start, tokens): inside one block, one whole block, across blocks, long and unaligned.
    let cases = [
        (0, 1),
        (5, 3),
        (0, 16),
        (15, 2),
        (37, 8),
        (37, 20),
        (100, 64),
        (703, 9),
        (1000, 100),
    ];
    for (n_h, n_kv, d) in [(16, 2, 256), (8, 8, 128), (6, 3, 64)] {
        for &(start, tokens) in &cases {
            let heads = (n_h, n_kv, d);
            let visible = start + tokens;
            let q = rng.signed_vec(tokens * n_h * d, 1.0);
            let gate = rng.signed_vec(tokens * n_h * d, 2.0);
            let keys = rng.signed_vec(visible * n_kv * d, 1.0);
            let values = rng.signed_vec(visible * n_kv * d, 1.0);
            let blocks = shuffled_table(&mut rng, blocks_for(visible));
            let capacity = visible.next_multiple_of(256);
            let mut paths = vec![AttentionPath::Serial];
            if tokens > 8 {
                paths.push(AttentionPath::Tiled);
            }
            if tokens <= 64 {
                paths.push(AttentionPath::Split { capacity });
            }
            for path in paths {
                let run = |table: Option<&[i32]>| {
                    testing::attention_paged_of(
                        &dev, &q, &gate, &keys, &values, heads, tokens, start, path, table,
                    )
                    .unwrap()
                };
                let (Some(flat), Some(paged)) = (run(None), run(Some(&blocks))) else {
                    continue;
                };
                assert!(flat.iter().all(|v| v.is_finite()), "{path:?}");
                assert!(
                    flat == paged,
                    "{path:?}, heads {heads:?}, {tokens} tokens after {start} ({} blocks of {BLOCK_TOKENS}): paged differs from contiguous",
                    blocks.len()
                );
                ran += 1;
            }
        }
    }
    assert!(ran >= 50, "only {ran} comparisons ran");
}
