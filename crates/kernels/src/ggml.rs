//! Integer dot products of GGUF rows kept in their ggml blocks (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K;
//! layouts in `spindle_model::gguf::quants`) with activations quantized to int8 per group of
//! 32 ([`crate::QuantizedActs`]), as llama.cpp does: every 32 weights give one exact int32 sum,
//! multiplied out in f32.
//!
//! The arithmetic, which every SIMD version must reproduce bit for bit ([`dot_ggml_ref`]): eight
//! f32 lanes, group `g` of the row (32 weights) accumulating into lane `g % 8` (a K-quant
//! superblock's eight groups fill the eight lanes once), from zero; per group, with `sumi` the
//! exact integer dot of the weights' codes with the group's int8 activations, `xd` its scale
//! and `xsd` = `xd · Σ codes`:
//!
//! - Q4_K, Q5_K (code `q` in 0..16 or 0..32, 6-bit scale `sc` and min `m` of the group, f16
//!   `d` and `dmin` of the superblock): `acc = fma(d·sc, xd·sumi, acc)`, then
//!   `acc = fma(−(dmin·m), xsd, acc)` (weight = d·sc·q − dmin·m);
//! - Q6_K (code `q` in −32..32, an int8 scale per 16 weights folded into `sumi` as
//!   `sc₀·Σ₀ + sc₁·Σ₁`), Q8_0 (int8 codes), Q4_0 (code − 8): `acc = fma(d, xd·sumi, acc)`;
//!
//! then the lanes summed as `((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))`.

use half::f16;
use spindle_model::gguf::quants::GgmlType;
use spindle_model::quant::GROUP;

/// f16 little-endian bytes at `b[0..2]` as f32.
#[inline(always)]
pub(crate) fn half_at(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K superblock (its 12 packed bytes), as
/// `spindle_model::gguf::quants::scale_min_k4` reads them, unpacked four at a time in u32 words (llama.cpp's `utmp`).
#[inline(always)]
pub(crate) fn scales_mins(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes(packed[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    let (a, b, c) = (word(0), word(1), word(2));
    let sc = [a & LOW6, (c & LOW4) | (((a >> 6) & LOW2) << 4)];
    let m = [b & LOW6, ((c >> 4) & LOW4) | (((b >> 6) & LOW2) << 4)];
    let bytes = |w: [u32; 2]| {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&w[0].to_le_bytes());
        out[4..].copy_from_slice(&w[1].to_le_bytes());
        out
    };
    (bytes(sc), bytes(m))
}

/// The lane sum of the reference arithmetic (what AVX2's `hsum` computes).
#[inline(always)]
pub(crate) fn sum_lanes(a: &[f32; 8]) -> f32 {
    let s = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (s[0] + s[2]) + (s[1] + s[3])
}

/// One group of a Q4_K/Q5_K row into its lane.
#[inline(always)]
pub(crate) fn k_lane(
    acc: &mut f32,
    (d, dmin): (f32, f32),
    (sc, m): (u8, u8),
    sumi: i32,
    xd: f32,
    xsd: f32,
) {
    let (dl, ml) = (d * sc as f32, dmin * m as f32);
    *acc = dl.mul_add(xd * sumi as f32, *acc);
    *acc = (-ml).mul_add(xsd, *acc);
}

/// Reference dot of one row in ggml blocks of `ty` with a token quantized per group of 32:
/// codes `xq`, scales `xd`, scaled sums `xsd` (one per group). See the module for the order.
pub fn dot_ggml_ref(ty: GgmlType, row: &[u8], xq: &[i8], xd: &[f32], xsd: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let dot = |codes: &mut dyn FnMut(usize) -> i32, x: &[i8]| -> i32 {
        (0..GROUP).map(|i| codes(i) * x[i] as i32).sum()
    };
    match ty {
        GgmlType::Q4K | GgmlType::Q5K => {
            let five = ty == GgmlType::Q5K;
            for (b, blk) in row.chunks_exact(ty.block_bytes()).enumerate() {
                let (d, dmin) = (half_at(&blk[0..2]), half_at(&blk[2..4]));
                let (sc, m) = scales_mins(&blk[4..16]);
                let (qh, qs) = if five {
                    (&blk[16..48], &blk[48..176])
                } else {
                    (&blk[0..0], &blk[16..144])
                };
                for g in 0..8 {
                    let at = (8 * b + g) * GROUP;
                    let q = &qs[32 * (g / 2)..];
                    let mut code = |i: usize| {
                        let low = (q[i] >> (4 * (g % 2))) & 0xF;
                        let high = if five { ((qh[i] >> g) & 1) << 4 } else { 0 };
                        (low | high) as i32
                    };
                    let sumi = dot(&mut code, &xq[at..at + GROUP]);
                    let gi = 8 * b + g;
                    k_lane(&mut acc[g], (d, dmin), (sc[g], m[g]), sumi, xd[gi], xsd[gi]);
                }
            }
        }
        GgmlType::Q6K => {
            for (b, blk) in row.chunks_exact(210).enumerate() {
                let (ql, qh, scales) = (&blk[0..128], &blk[128..192], &blk[192..208]);
                let d = half_at(&blk[208..210]);
                for g in 0..8 {
                    let (n, k) = (g / 4, g % 4);
                    let (ql, qh) = (&ql[64 * n + 32 * (k % 2)..], &qh[32 * n..]);
                    let code = |i: usize| {
                        let low = (ql[i] >> (4 * (k / 2))) & 0xF;
                        (low | (((qh[i] >> (2 * k)) & 3) << 4)) as i32 - 32
                    };
                    let x = &xq[(8 * b + g) * GROUP..];
                    let half = |h: usize| -> i32 {
                        (16 * h..16 * h + 16).map(|i| code(i) * x[i] as i32).sum()
                    };
                    let sumi = scales[2 * g] as i8 as i32 * half(0)
                        + scales[2 * g + 1] as i8 as i32 * half(1);
                    let gi = 8 * b + g;
                    acc[g] = d.mul_add(xd[gi] * sumi as f32, acc[g]);
                }
            }
        }
        GgmlType::Q8_0 | GgmlType::Q4_0 => {
            for (g, blk) in row.chunks_exact(ty.block_bytes()).enumerate() {
                let d = half_at(&blk[0..2]);
                let q = &blk[2..];
                let mut code = |i: usize| match ty {
                    GgmlType::Q8_0 => q[i] as i8 as i32,
                    _ => ((q[i % 16] >> (4 * (i / 16))) & 0xF) as i32 - 8,
                };
                let sumi = dot(&mut code, &xq[g * GROUP..(g + 1) * GROUP]);
                acc[g % 8] = d.mul_add(xd[g] * sumi as f32, acc[g % 8]);
            }
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => {
            panic!("{} is a float type, not ggml blocks", ty.name())
        }
    }
    sum_lanes(&acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QuantizedActs;
    use crate::simd::Isa;
    use crate::testutil::{rng as seeded, vec as random_vec};
    use rand::rngs::StdRng;
    use rand::Rng;
    use spindle_model::gguf::quants::{dequantize, scale_min_k4};

    pub(crate) const TYPES: [GgmlType; 5] = [
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
    ];

    /// `blocks` random blocks of `ty`: random codes, finite random f16 scales.
    pub(crate) fn random_blocks(ty: GgmlType, blocks: usize, seed: u64) -> Vec<u8> {
        let mut rng = seeded(seed);
        let mut out: Vec<u8> = (0..blocks * ty.block_bytes())
            .map(|_| rng.random::<u8>())
            .collect();
        let scale = |rng: &mut StdRng| {
            f16::from_f32(rng.random_range(-0.02..0.02f32))
                .to_bits()
                .to_le_bytes()
        };
        for blk in out.chunks_exact_mut(ty.block_bytes()) {
            match ty {
                GgmlType::Q4K | GgmlType::Q5K => {
                    blk[0..2].copy_from_slice(&scale(&mut rng));
                    blk[2..4].copy_from_slice(&scale(&mut rng));
                }
                GgmlType::Q6K => blk[208..210].copy_from_slice(&scale(&mut rng)),
                _ => blk[0..2].copy_from_slice(&scale(&mut rng)),
            }
        }
        out
    }

    #[test]
    fn scales_and_mins_unpack_as_the_dequantizer_reads_them() {
        let mut rng = seeded(9);
        for _ in 0..200 {
            let packed: Vec<u8> = (0..12).map(|_| rng.random::<u8>()).collect();
            let (sc, m) = scales_mins(&packed);
            for j in 0..8 {
                assert_eq!((sc[j], m[j]), scale_min_k4(j, &packed), "{packed:?} {j}");
            }
        }
    }

    #[test]
    fn reference_dot_is_the_dequantized_dot_on_exact_activations() {
        // Activations that are integers with 127 in every group quantize exactly (scale 1), so
        // the integer dot equals Σ w·x of the dequantized weights up to f32 rounding: this
        // checks each type's code and scale layout against `dequantize`.
        for ty in TYPES {
            let cols = 3 * 256;
            let row = random_blocks(ty, cols / ty.block_elements(), 7);
            let mut rng = seeded(3);
            let mut x: Vec<f32> = (0..cols)
                .map(|_| rng.random_range(-127..=127i32) as f32)
                .collect();
            x.iter_mut().step_by(GROUP).for_each(|v| *v = 127.0);
            let acts = QuantizedActs::quantize(&x, cols);
            assert!(acts.d.iter().all(|&d| d == 1.0));
            let (xq, xd, xsd) = acts.token(0);
            let got = dot_ggml_ref(ty, &row, xq, xd, xsd);
            let w = dequantize(ty, &row);
            let want: f64 = w.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
            let mag: f64 = w
                .iter()
                .zip(&x)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            assert!(
                (got as f64 - want).abs() <= 1e-5 * mag,
                "{}: {got} vs {want}",
                ty.name()
            );
        }
    }

    #[test]
    fn every_simd_path_matches_the_reference_bit_for_bit() {
        for ty in TYPES {
            // Rows of 1, 2 and 11 superblocks; Q8_0/Q4_0 also of 3 and 13 blocks of 32 (a
            // partial last step of eight).
            let short: &[usize] = match ty {
                GgmlType::Q8_0 | GgmlType::Q4_0 => &[96, 416],
                _ => &[],
            };
            for cols in [256, 512, 256 * 11].iter().chain(short) {
                let (cols, superblocks) = (*cols, cols.div_ceil(256));
                let row = random_blocks(ty, cols / ty.block_elements(), 11 + superblocks as u64);
                for seed in 0..4 {
                    let x = random_vec(&mut seeded(100 + seed), cols, 1.5);
                    let acts = QuantizedActs::quantize(&x, cols);
                    let (xq, xd, xsd) = acts.token(0);
                    let want = dot_ggml_ref(ty, &row, xq, xd, xsd);
                    for isa in Isa::all_available() {
                        let got = crate::linear::dot_ggml(isa, ty, &row, xq, xd, xsd);
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{} {isa:?} {superblocks} superblocks: {got} vs {want}",
                            ty.name()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn matmul_of_block_rows_is_the_reference_dot_per_row_and_token() {
        use spindle_model::quant::view::{MatRef, Weights};
        let (rows, cols) = (37, 512);
        for ty in TYPES {
            let blocks = random_blocks(ty, rows * cols / ty.block_elements(), 5);
            let w = MatRef::new(
                Weights::Ggml {
                    ty,
                    blocks: &blocks,
                },
                rows,
                cols,
            );
            for tokens in [1, 3, 40] {
                let x = random_vec(&mut seeded(tokens as u64), tokens * cols, 2.0);
                let acts = QuantizedActs::quantize(&x, cols);
                let rb = blocks.len() / rows;
                let mut want = vec![0.0f32; tokens * rows];
                for t in 0..tokens {
                    let (xq, xd, xsd) = acts.token(t);
                    for r in 0..rows {
                        let row = &blocks[r * rb..(r + 1) * rb];
                        want[t * rows + r] = dot_ggml_ref(ty, row, xq, xd, xsd);
                    }
                }
                for isa in Isa::all_available() {
                    let mut y = vec![0.0f32; tokens * rows];
                    crate::linear::matmul_with(isa, &w, &x, tokens, &mut y);
                    assert_eq!(y, want, "{} {isa:?} {tokens} tokens", ty.name());
                    let mut y = vec![0.0f32; tokens * rows];
                    let groups = [tokens / 2, tokens - tokens / 2];
                    let groups: Vec<usize> = groups.into_iter().filter(|&n| n > 0).collect();
                    crate::linear::matmul_groups_with(isa, &w, &x, &groups, &mut y);
                    assert_eq!(y, want, "{} {isa:?} groups {groups:?}", ty.name());
                }
            }
            // Rows sliced off the matrix and dequantized rows read the same blocks.
            let mut row = vec![0.0f32; cols];
            w.rows_slice(5, 3).row_to_f32(1, &mut row);
            let rb = blocks.len() / rows;
            assert_eq!(row, dequantize(ty, &blocks[6 * rb..7 * rb]));
        }
    }
}
