//! ggml tensor types spindle reads from GGUF files, and their scalar dequantizers (after
//! ggml's `dequantize_row_*` in `ggml-quants.c`; checked against the `gguf` Python package's
//! `gguf.quants.dequantize`, see `tests/gguf_quants.rs`).

use half::f16;

/// A ggml tensor type spindle reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4K,
    Q5K,
    Q6K,
}

impl GgmlType {
    pub const SUPPORTED: &'static str = "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K";

    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            30 => GgmlType::Bf16,
            _ => return None,
        })
    }

    /// The ggml name of type id `id`, known or not (for messages).
    pub fn name_of(id: u32) -> &'static str {
        const NAMES: [&str; 40] = [
            "F32",
            "F16",
            "Q4_0",
            "Q4_1",
            "Q4_2",
            "Q4_3",
            "Q5_0",
            "Q5_1",
            "Q8_0",
            "Q8_1",
            "Q2_K",
            "Q3_K",
            "Q4_K",
            "Q5_K",
            "Q6_K",
            "Q8_K",
            "IQ2_XXS",
            "IQ2_XS",
            "IQ3_XXS",
            "IQ1_S",
            "IQ4_NL",
            "IQ3_S",
            "IQ2_S",
            "IQ4_XS",
            "I8",
            "I16",
            "I32",
            "I64",
            "F64",
            "IQ1_M",
            "BF16",
            "Q4_0_4_4",
            "Q4_0_4_8",
            "Q4_0_8_8",
            "TQ1_0",
            "TQ2_0",
            "IQ4_NL_4_4",
            "IQ4_NL_4_8",
            "IQ4_NL_8_8",
            "MXFP4",
        ];
        NAMES.get(id as usize).copied().unwrap_or("unknown")
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Bf16 => "BF16",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
        }
    }

    /// Elements per block (1 for the float types).
    pub fn block_elements(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => 1,
            GgmlType::Q8_0 | GgmlType::Q4_0 => 32,
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::Bf16 => 2,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4K => 144,
            GgmlType::Q5K => 176,
            GgmlType::Q6K => 210,
        }
    }
}

fn half(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// Dequantizes `bytes` of type `ty` (whole blocks) to f32.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let n = bytes.len() / ty.block_bytes() * ty.block_elements();
    let mut out = vec![0.0; n];
    dequantize_into(ty, bytes, &mut out);
    out
}

/// Dequantizes `bytes` of type `ty` (whole blocks) into `out`, which holds exactly their
/// elements (a row of a matrix kept in its blocks: embedding lookups, tiles).
pub fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(
        out.len(),
        bytes.len() / ty.block_bytes() * ty.block_elements(),
        "{} bytes dequantized into a slice of another length",
        ty.name()
    );
    let mut out = Filler { out, at: 0 };
    match ty {
        GgmlType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        GgmlType::F16 => out.extend(bytes.chunks_exact(2).map(half)),
        GgmlType::Bf16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)),
        ),
        GgmlType::Q8_0 => {
            for block in bytes.chunks_exact(34) {
                let d = half(&block[0..2]);
                out.extend(block[2..].iter().map(|&q| q as i8 as f32 * d));
            }
        }
        GgmlType::Q4_0 => {
            for block in bytes.chunks_exact(18) {
                let d = half(&block[0..2]);
                let qs = &block[2..];
                out.extend(qs.iter().map(|&q| ((q & 0xf) as i32 - 8) as f32 * d));
                out.extend(qs.iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
            }
        }
        GgmlType::Q4K => {
            for block in bytes.chunks_exact(144) {
                let (d, min) = (half(&block[0..2]), half(&block[2..4]));
                let scales = &block[4..16];
                let qs = &block[16..];
                for j in 0..4 {
                    let (sc1, m1) = scale_min_k4(2 * j, scales);
                    let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
                    let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
                    let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
                    let q = &qs[32 * j..32 * j + 32];
                    out.extend(q.iter().map(|&q| d1 * (q & 0xf) as f32 - m1));
                    out.extend(q.iter().map(|&q| d2 * (q >> 4) as f32 - m2));
                }
            }
        }
        GgmlType::Q5K => {
            for block in bytes.chunks_exact(176) {
                let (d, min) = (half(&block[0..2]), half(&block[2..4]));
                let scales = &block[4..16];
                let qh = &block[16..48];
                let qs = &block[48..];
                for j in 0..4 {
                    let (sc1, m1) = scale_min_k4(2 * j, scales);
                    let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
                    let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
                    let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
                    let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
                    let ql = &qs[32 * j..32 * j + 32];
                    out.extend(ql.iter().zip(qh).map(|(&q, &h)| {
                        d1 * ((q & 0xf) + if h & u1 != 0 { 16 } else { 0 }) as f32 - m1
                    }));
                    out.extend(ql.iter().zip(qh).map(|(&q, &h)| {
                        d2 * ((q >> 4) + if h & u2 != 0 { 16 } else { 0 }) as f32 - m2
                    }));
                }
            }
        }
        GgmlType::Q6K => {
            for block in bytes.chunks_exact(210) {
                let (ql, qh, sc) = (&block[0..128], &block[128..192], &block[192..208]);
                let d = half(&block[208..210]);
                for n in 0..2 {
                    let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
                    let mut y = [0.0f32; 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        let s = |k: usize| d * sc[is + k] as i8 as f32;
                        y[l] = s(0) * q1 as f32;
                        y[l + 32] = s(2) * q2 as f32;
                        y[l + 64] = s(4) * q3 as f32;
                        y[l + 96] = s(6) * q4 as f32;
                    }
                    out.extend_from_slice(&y);
                }
            }
        }
    }
}

/// Writes values one after another into a slice (the dequantizers' `Vec`-like sink).
struct Filler<'a> {
    out: &'a mut [f32],
    at: usize,
}

impl Filler<'_> {
    fn extend(&mut self, values: impl IntoIterator<Item = f32>) {
        for v in values {
            self.out[self.at] = v;
            self.at += 1;
        }
    }

    fn extend_from_slice(&mut self, values: &[f32]) {
        self.out[self.at..self.at + values.len()].copy_from_slice(values);
        self.at += values.len();
    }
}

/// Scale and min of sub-block `j` of a Q4_K/Q5_K block (6 bits each, packed in 12 bytes).
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_and_q4_0_follow_their_block_layout() {
        // Q8_0: d = 0.5, codes -3, 4, ...
        let mut block = vec![0u8; 34];
        block[0..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        block[2] = (-3i8) as u8;
        block[3] = 4;
        let y = dequantize(GgmlType::Q8_0, &block);
        assert_eq!((y.len(), y[0], y[1], y[2]), (32, -1.5, 2.0, 0.0));
        // Q4_0: low nibbles are elements 0..16, high nibbles 16..32, offset 8.
        let mut block = vec![0x88u8; 18];
        block[0..2].copy_from_slice(&f16::from_f32(2.0).to_bits().to_le_bytes());
        block[2] = 0xa1; // element 0: 1 - 8, element 16: 10 - 8
        let y = dequantize(GgmlType::Q4_0, &block);
        assert_eq!((y[0], y[16], y[1]), (-14.0, 4.0, 0.0));
    }
}
