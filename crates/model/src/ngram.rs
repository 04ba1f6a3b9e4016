//! The hashed n-gram ids of PLE (MODEL_MATH §4.6): splitmix64 multipliers, prime per-head
//! table sizes, XOR mixing and an n-gram history that resets at EOS.

use crate::PleConfig;

/// Γ, the golden-ratio increment of splitmix64.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// One splitmix64 output for state `v` (all arithmetic mod 2⁶⁴).
pub fn splitmix64(v: u64) -> u64 {
    let mut z = v.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The odd multipliers m_0..m_{n−1} of PLE layer ordinal `p`.
pub fn multipliers(seed: u64, ordinal: usize, ngram_size: usize, vocab_size: u64) -> Vec<u64> {
    let half_bound = ((i64::MAX as u64 / vocab_size) / 2).max(1);
    (0..ngram_size as u64)
        .map(|i| {
            let val = seed
                .wrapping_add(10007u64.wrapping_mul(ordinal as u64))
                .wrapping_add(GAMMA.wrapping_mul(i + 1));
            2 * (splitmix64(val) % half_bound) + 1
        })
        .collect()
}

fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    if n % 2 == 0 {
        return n == 2;
    }
    let mut d = 3;
    while d * d <= n {
        if n % d == 0 {
            return false;
        }
        d += 2;
    }
    true
}

/// Table sizes of the `heads` hash heads of ordinal `p`: head g = p·heads + h takes the
/// (g+1)-th prime ≥ `base`.
pub fn head_vocab_sizes(base: u64, ordinal: usize, heads: usize) -> Vec<u64> {
    let mut primes = Vec::with_capacity((ordinal + 1) * heads);
    let mut n = base;
    while primes.len() < (ordinal + 1) * heads {
        if is_prime(n) {
            primes.push(n);
        }
        n += 1;
    }
    primes.split_off(ordinal * heads)
}

/// Cumulative offsets of each head's rows in the table.
pub fn head_offsets(sizes: &[u64]) -> Vec<u64> {
    sizes
        .iter()
        .scan(0u64, |acc, &s| {
            let o = *acc;
            *acc += s;
            Some(o)
        })
        .collect()
}

/// The hash of one PLE layer: everything needed to turn token ids into table rows.
#[derive(Clone, Debug)]
pub struct NgramHash {
    pub multipliers: Vec<u64>,
    pub vocab_sizes: Vec<u64>,
    pub offsets: Vec<u64>,
    pub heads_per_ngram: usize,
    pub eos: u32,
}

impl NgramHash {
    /// The hash as the config defines it for PLE ordinal `p`.
    pub fn from_config(ple: &PleConfig, ordinal: usize, vocab_size: usize) -> Self {
        let vocab_sizes = head_vocab_sizes(ple.vocab_size_base, ordinal, ple.heads());
        NgramHash {
            multipliers: multipliers(ple.seed, ordinal, ple.ngram_size, vocab_size as u64),
            offsets: head_offsets(&vocab_sizes),
            vocab_sizes,
            heads_per_ngram: ple.heads_per_ngram,
            eos: ple.eos,
        }
    }

    pub fn ngram_size(&self) -> usize {
        self.multipliers.len()
    }

    /// Rows of the table, padded up to a multiple of `divisible_by`.
    pub fn padded_rows(&self, divisible_by: u64) -> u64 {
        let total = self.offsets.last().copied().unwrap_or(0)
            + self.vocab_sizes.last().copied().unwrap_or(0);
        total.div_ceil(divisible_by) * divisible_by
    }

    /// Table rows of every head for each new token, `[tokens, heads]`.
    ///
    /// `history` holds the previous ngram_size − 1 ids (EOS at the start of a sequence; see
    /// [`advance_history`]). The shift-s token of position t is ids[t−s] unless an EOS sits in
    /// ids[t−s .. t−1], in which case it is EOS.
    pub fn rows(&self, history: &[u32], ids: &[u32]) -> Vec<u64> {
        let n = self.ngram_size();
        let past = n - 1;
        debug_assert_eq!(history.len(), past);
        let mut ext: Vec<u32> = history.to_vec();
        ext.extend_from_slice(ids);
        let heads = self.vocab_sizes.len();
        let mut out = Vec::with_capacity(ids.len() * heads);
        let mut shifted = vec![0u64; n];
        for j in past..ext.len() {
            shifted[0] = ext[j] as u64;
            let mut reset = false;
            for s in 1..n {
                reset |= ext[j - s] == self.eos;
                shifted[s] = if reset {
                    self.eos as u64
                } else {
                    ext[j - s] as u64
                };
            }
            for order in 2..=n {
                let mix = (0..order).fold(0u64, |acc, i| {
                    acc ^ shifted[i].wrapping_mul(self.multipliers[i])
                });
                for h in (order - 2) * self.heads_per_ngram..(order - 1) * self.heads_per_ngram {
                    out.push(mix % self.vocab_sizes[h] + self.offsets[h]);
                }
            }
        }
        out
    }
}

/// Shifts `ids` into the n-gram history (which keeps its length, ngram_size − 1).
pub fn advance_history(history: &mut [u32], ids: &[u32]) {
    let past = history.len();
    let mut ext: Vec<u32> = history.to_vec();
    ext.extend_from_slice(ids);
    history.copy_from_slice(&ext[ext.len() - past..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_multipliers_and_table_sizes() {
        // MODEL_MATH §4.6: seed 1234, vocab 248320, p = 0.
        assert_eq!(
            multipliers(1234, 0, 3, 248_320),
            vec![23703573157769, 20109073645365, 8052911324071]
        );
        let sizes = head_vocab_sizes(20_000_000, 0, 16);
        assert_eq!(
            sizes,
            vec![
                20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
                20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171
            ]
        );
        let hash = NgramHash {
            offsets: head_offsets(&sizes),
            vocab_sizes: sizes,
            multipliers: vec![1, 1, 1],
            heads_per_ngram: 8,
            eos: 0,
        };
        assert_eq!(hash.padded_rows(128), 320_001_536);
        assert_eq!(hash.padded_rows(128) / 128, 2_500_012);
    }

    #[test]
    fn fixture_buffers_match_the_formula() {
        // The int64 buffers stored in fixtures/qwen4_exp (seed 1234, vocab 512, base 1000).
        assert_eq!(
            multipliers(1234, 0, 3, 512),
            vec![4295158889763781, 17440218147737327, 1270917961434445]
        );
        let sizes = head_vocab_sizes(1000, 0, 4);
        assert_eq!(sizes, vec![1009, 1013, 1019, 1021]);
        assert_eq!(head_offsets(&sizes), vec![0, 1009, 2022, 3041]);
        // Ordinal 1 continues the prime sequence.
        assert_eq!(head_vocab_sizes(1000, 1, 2), vec![1019, 1021]);
    }

    #[test]
    fn splitmix64_known_value() {
        // splitmix64 seeded with 0 yields 0xE220A8397B1DCDAF as its first output.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }

    fn hand_hash() -> NgramHash {
        NgramHash {
            multipliers: vec![3, 5, 7],
            vocab_sizes: vec![11, 13, 17, 19],
            offsets: vec![0, 11, 24, 41],
            heads_per_ngram: 2,
            eos: 1,
        }
    }

    #[test]
    fn rows_by_hand_with_eos_reset() {
        let hash = hand_hash();
        let mut history = vec![1, 1];
        // Tokens 4, 6 then EOS then 9.
        let rows = hash.rows(&history, &[4, 6, 1, 9]);
        advance_history(&mut history, &[4, 6, 1, 9]);
        let row = |s0: u64, s1: u64, s2: u64| {
            let bi = (s0 * 3) ^ (s1 * 5);
            let tri = bi ^ (s2 * 7);
            vec![bi % 11, bi % 13 + 11, tri % 17 + 24, tri % 19 + 41]
        };
        let mut expect = Vec::new();
        expect.extend(row(4, 1, 1)); // start: history is EOS
        expect.extend(row(6, 4, 1));
        expect.extend(row(1, 6, 4)); // the current token may be EOS itself
        expect.extend(row(9, 1, 1)); // after EOS: both shifts reset
        assert_eq!(rows, expect);
        assert_eq!(history, vec![1, 9]);
    }

    #[test]
    fn rows_in_pieces_equal_rows_at_once() {
        let hash = hand_hash();
        let ids = [5u32, 8, 1, 1, 7, 3, 2, 1, 4];
        let all = hash.rows(&[1, 1], &ids);
        let mut history = vec![1, 1];
        let mut pieces = Vec::new();
        for &id in &ids {
            pieces.extend(hash.rows(&history, &[id]));
            advance_history(&mut history, &[id]);
        }
        assert_eq!(all, pieces);
        assert_eq!(history, vec![1, 4]);
    }
}
