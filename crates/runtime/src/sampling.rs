//! Sampling: turning one row of logits into the next token id.
//!
//! The order is the one Hugging Face transformers and vLLM use: penalties on the raw logits,
//! then temperature, then the top-k, top-p and min-p filters, then a draw from the softmax of
//! what is left. Temperature 0 is greedy decoding: [`argmax`], lowest id on ties, never NaN.

use std::fmt;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spindle_kernels::softmax::argmax;

/// How to pick the next token. Neutral values switch a step off: `top_k` 0, `top_p` 1,
/// `min_p` 0, `repetition_penalty` 1, presence and frequency penalties 0.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits; 0 means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one.
    pub min_p: f32,
    /// HF/vLLM repetition penalty for tokens seen (prompt and answer): positive logits are
    /// divided by it, negative ones multiplied.
    pub repetition_penalty: f32,
    /// OpenAI presence penalty: subtracted once from every token the answer holds.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty: subtracted once per occurrence in the answer.
    pub frequency_penalty: f32,
    /// Which tokens the penalties read ([`Penalised::of`]): `None` as OpenAI and vLLM do
    /// (repetition over the prompt and the answer, presence and frequency over the answer);
    /// `Some(n)` as llama.cpp and Ollama do (`repeat_last_n`: all three over the last `n`
    /// tokens, prompt included).
    pub penalty_window: Option<usize>,
    /// Seed of the random draws; `None` seeds from the operating system.
    pub seed: Option<u64>,
}

/// The token ids a step's penalties read: the repetition penalty takes every id of `ids`,
/// the presence and frequency penalties count the ids from `counted_from` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Penalised<'a> {
    pub ids: &'a [u32],
    pub counted_from: usize,
}

impl<'a> Penalised<'a> {
    /// Nothing penalised.
    pub const NONE: Penalised<'static> = Penalised {
        ids: &[],
        counted_from: 0,
    };

    /// What `params` penalise in a sequence whose ids so far are `history` (its prompt, the
    /// first `prompt` of them, then the answer).
    pub fn of(params: &SamplingParams, history: &'a [u32], prompt: usize) -> Self {
        Self::within(params.penalty_window, history, prompt)
    }

    /// [`Penalised::of`] for a [`SamplingParams::penalty_window`].
    pub fn within(window: Option<usize>, history: &'a [u32], prompt: usize) -> Self {
        match window {
            None => Penalised {
                ids: history,
                counted_from: prompt.min(history.len()),
            },
            Some(n) => Penalised {
                ids: &history[history.len().saturating_sub(n)..],
                counted_from: 0,
            },
        }
    }

    /// Every id counted by all three penalties.
    pub fn all(ids: &'a [u32]) -> Self {
        Penalised {
            ids,
            counted_from: 0,
        }
    }
}

impl Default for SamplingParams {
    /// Greedy decoding with every filter and penalty off.
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_window: None,
            seed: None,
        }
    }
}

/// The sampling fields of a checkpoint's `generation_config.json`, as the caller parsed them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfigValues {
    pub do_sample: Option<bool>,
    pub temperature: Option<f32>,
    pub top_k: Option<i64>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
}

impl SamplingParams {
    /// The parameters transformers would use for a `generation_config.json`: greedy unless
    /// `do_sample` is true (its default is false); when sampling, absent fields take
    /// transformers' defaults (temperature 1, top_k 50, top_p 1). A `top_k` of 0 or below
    /// switches top-k off.
    pub fn from_generation_config(config: &GenerationConfigValues) -> Self {
        let neutral = Self::default();
        let penalties = Self {
            repetition_penalty: config.repetition_penalty.unwrap_or(1.0),
            presence_penalty: config.presence_penalty.unwrap_or(0.0),
            frequency_penalty: config.frequency_penalty.unwrap_or(0.0),
            ..neutral.clone()
        };
        if config.do_sample != Some(true) {
            return penalties;
        }
        Self {
            temperature: config.temperature.unwrap_or(1.0),
            top_k: usize::try_from(config.top_k.unwrap_or(50).max(0)).unwrap_or(usize::MAX),
            top_p: config.top_p.unwrap_or(1.0),
            min_p: config.min_p.unwrap_or(0.0),
            ..penalties
        }
    }

    /// Whether sampling reduces to the arg-max.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Checks every field's range; the error names the first field out of range.
    pub fn validate(&self) -> Result<(), InvalidSamplingParams> {
        let check = |ok: bool, field: &'static str, value: f32, expected: &'static str| {
            if ok {
                Ok(())
            } else {
                Err(InvalidSamplingParams {
                    field,
                    value,
                    expected,
                })
            }
        };
        let t = self.temperature;
        check(
            t.is_finite() && t >= 0.0,
            "temperature",
            t,
            "a finite value >= 0",
        )?;
        let p = self.top_p;
        check(p > 0.0 && p <= 1.0, "top_p", p, "in (0, 1]")?;
        let m = self.min_p;
        check((0.0..=1.0).contains(&m), "min_p", m, "in [0, 1]")?;
        let r = self.repetition_penalty;
        check(
            r.is_finite() && r > 0.0,
            "repetition_penalty",
            r,
            "a finite value > 0",
        )?;
        let pp = self.presence_penalty;
        check(pp.is_finite(), "presence_penalty", pp, "finite")?;
        let fp = self.frequency_penalty;
        check(fp.is_finite(), "frequency_penalty", fp, "finite")
    }
}

/// A sampling parameter outside its range.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidSamplingParams {
    pub field: &'static str,
    pub value: f32,
    pub expected: &'static str,
}

impl fmt::Display for InvalidSamplingParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sampling parameter {} is {} but must be {}",
            self.field, self.value, self.expected
        )
    }
}

impl std::error::Error for InvalidSamplingParams {}

/// Picks tokens from logits with fixed, validated parameters and its own random stream.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Scratch: (token id, scaled logit, then probability) of the surviving candidates.
    candidates: Vec<(u32, f32, f64)>,
    /// Scratch: the penalised ids (id·2, +1 where presence and frequency count it), sorted.
    sorted_history: Vec<u64>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self, InvalidSamplingParams> {
        params.validate()?;
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Ok(Self {
            params,
            rng,
            candidates: Vec::new(),
            sorted_history: Vec::new(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from one row of logits `[V]`. The penalties are applied to
    /// `logits` in place for the tokens `penalised` names ([`Penalised::of`]). NaN logits are
    /// never picked; if every logit is NaN or -inf the result is 0.
    pub fn sample(&mut self, logits: &mut [f32], penalised: Penalised<'_>) -> u32 {
        let uniform = self.next_uniform();
        self.sample_with(logits, penalised, uniform)
    }

    /// The random draw the next [`Sampler::sample`] would use, consuming the random stream
    /// exactly as `sample` does: one uniform value in [0, 1) per non-greedy step, none when
    /// greedy. `sample(l, h)` is `sample_with(l, h, next_uniform())`, so a device sampler
    /// handed this value (and the same parameters) picks the token the host would have.
    pub fn next_uniform(&mut self) -> Option<f64> {
        (!self.params.is_greedy()).then(|| self.rng.random::<f64>())
    }

    /// [`Sampler::sample`] with the uniform draw given: `uniform` is what
    /// [`Sampler::next_uniform`] returned for this step (ignored when greedy; a non-greedy
    /// step given `None` takes the most likely surviving candidate).
    pub fn sample_with(
        &mut self,
        logits: &mut [f32],
        penalised: Penalised<'_>,
        uniform: Option<f64>,
    ) -> u32 {
        self.apply_penalties(logits, penalised);
        if self.params.is_greedy() {
            return argmax(logits) as u32;
        }
        let inv_t = 1.0 / self.params.temperature;
        self.candidates.clear();
        self.candidates.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite() || **l == f32::INFINITY)
                .map(|(i, &l)| (i as u32, l * inv_t, 0.0)),
        );
        if self.candidates.is_empty() {
            return argmax(logits) as u32;
        }
        self.keep_top_k();
        self.softmax_sorted();
        self.keep_top_p();
        self.keep_min_p();
        self.draw(uniform.unwrap_or(0.0))
    }

    /// The penalties for every distinct token of `penalised`: the repetition penalty on each,
    /// then presence and frequency on those counted (`presence + frequency · count`).
    fn apply_penalties(&mut self, logits: &mut [f32], penalised: Penalised<'_>) {
        let p = &self.params;
        if p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
            return;
        }
        self.sorted_history.clear();
        self.sorted_history.extend(
            penalised
                .ids
                .iter()
                .enumerate()
                .map(|(j, &id)| (id as u64) << 1 | (j >= penalised.counted_from) as u64),
        );
        self.sorted_history.sort_unstable();
        for run in self.sorted_history.chunk_by(|a, b| a >> 1 == b >> 1) {
            let Some(logit) = logits.get_mut((run[0] >> 1) as usize) else {
                continue;
            };
            if *logit > 0.0 {
                *logit /= p.repetition_penalty;
            } else {
                *logit *= p.repetition_penalty;
            }
            let count = run.iter().filter(|&&x| x & 1 == 1).count();
            if count > 0 {
                *logit -= p.presence_penalty + p.frequency_penalty * count as f32;
            }
        }
    }

    /// Keeps the `top_k` highest scaled logits (ties to the lower id).
    fn keep_top_k(&mut self) {
        let k = self.params.top_k;
        if k > 0 && k < self.candidates.len() {
            self.candidates.select_nth_unstable_by(k - 1, by_logit_desc);
            self.candidates.truncate(k);
        }
    }

    /// Sorts candidates by descending logit and fills in their softmax probabilities.
    fn softmax_sorted(&mut self) {
        self.candidates.sort_unstable_by(by_logit_desc);
        let max = self.candidates[0].1;
        let mut total = 0.0f64;
        for c in &mut self.candidates {
            // An +inf maximum makes every other candidate impossible.
            c.2 = if max == f32::INFINITY {
                f64::from(u8::from(c.1 == f32::INFINITY))
            } else {
                f64::from(c.1 - max).exp()
            };
            total += c.2;
        }
        for c in &mut self.candidates {
            c.2 /= total;
        }
    }

    /// Keeps the shortest most-likely prefix whose probability mass reaches `top_p`.
    fn keep_top_p(&mut self) {
        let top_p = f64::from(self.params.top_p);
        if top_p >= 1.0 {
            return;
        }
        let mut mass = 0.0;
        let mut keep = self.candidates.len();
        for (i, c) in self.candidates.iter().enumerate() {
            mass += c.2;
            if mass >= top_p {
                keep = i + 1;
                break;
            }
        }
        self.candidates.truncate(keep);
    }

    /// Drops candidates less likely than `min_p` times the most likely one.
    fn keep_min_p(&mut self) {
        let min_p = f64::from(self.params.min_p);
        if min_p <= 0.0 {
            return;
        }
        let threshold = min_p * self.candidates[0].2;
        self.candidates.retain(|c| c.2 >= threshold);
    }

    /// Draws from the surviving candidates in proportion to their probabilities, with
    /// `uniform` in [0, 1) as the random draw.
    fn draw(&self, uniform: f64) -> u32 {
        let total: f64 = self.candidates.iter().map(|c| c.2).sum();
        let mut target = uniform * total;
        for c in &self.candidates {
            if target < c.2 {
                return c.0;
            }
            target -= c.2;
        }
        // Rounding left the target past the end: the last candidate with mass.
        self.candidates
            .iter()
            .rev()
            .find(|c| c.2 > 0.0)
            .map_or(self.candidates[0].0, |c| c.0)
    }
}

/// Descending by logit, then ascending by id.
fn by_logit_desc(a: &(u32, f32, f64), b: &(u32, f32, f64)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(params: SamplingParams) -> Sampler {
        Sampler::new(params).expect("valid parameters")
    }

    fn seeded(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            seed: Some(7),
            ..SamplingParams::default()
        }
    }

    /// Logits whose softmax is exactly `probs`.
    fn logits_of(probs: &[f64]) -> Vec<f32> {
        probs.iter().map(|p| p.ln() as f32).collect()
    }

    /// How often each token is drawn in `draws` samples.
    fn histogram(s: &mut Sampler, logits: &[f32], draws: usize) -> Vec<usize> {
        let mut counts = vec![0; logits.len()];
        for _ in 0..draws {
            let mut row = logits.to_vec();
            counts[s.sample(&mut row, Penalised::NONE) as usize] += 1;
        }
        counts
    }

    fn softmax(logits: &[f32], temperature: f32) -> Vec<f64> {
        let scaled: Vec<f64> = logits.iter().map(|&l| f64::from(l / temperature)).collect();
        let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let exp: Vec<f64> = scaled.iter().map(|l| (l - max).exp()).collect();
        let total: f64 = exp.iter().sum();
        exp.iter().map(|e| e / total).collect()
    }

    /// Pearson's chi-square statistic of observed counts against expected probabilities.
    fn chi_square(counts: &[usize], probs: &[f64]) -> f64 {
        let n: usize = counts.iter().sum();
        counts
            .iter()
            .zip(probs)
            .map(|(&c, &p)| {
                let expected = p * n as f64;
                (c as f64 - expected).powi(2) / expected
            })
            .sum()
    }

    #[test]
    fn temperature_zero_is_argmax_with_lowest_index_on_ties() {
        let mut s = sampler(SamplingParams::default());
        assert_eq!(s.sample(&mut [0.1, 3.0, -1.0, 3.0], Penalised::NONE), 1);
        assert_eq!(
            s.sample(&mut [f32::NAN, -5.0, f32::NAN], Penalised::NONE),
            1
        );
        assert_eq!(s.sample(&mut [f32::NEG_INFINITY; 3], Penalised::NONE), 0);
    }

    #[test]
    fn seeded_sampling_is_deterministic() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
        let draws = |seed| {
            let mut s = sampler(SamplingParams {
                seed: Some(seed),
                ..seeded(1.0)
            });
            (0..200)
                .map(|_| s.sample(&mut logits.clone(), Penalised::NONE))
                .collect::<Vec<u32>>()
        };
        assert_eq!(draws(42), draws(42));
        assert_ne!(draws(42), draws(43));
    }

    #[test]
    fn next_uniform_consumes_the_stream_as_sample_does() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
        let params = SamplingParams {
            top_k: 20,
            top_p: 0.9,
            ..seeded(0.8)
        };
        let mut host = sampler(params.clone());
        let mut split = sampler(params);
        let mut differ = false;
        let mut previous = None;
        for _ in 0..200 {
            let a = host.sample(&mut logits.clone(), Penalised::NONE);
            let u = split.next_uniform();
            assert!(u.is_some_and(|u| (0.0..1.0).contains(&u)));
            differ |= previous.is_some() && previous != u;
            previous = u;
            assert_eq!(
                split.sample_with(&mut logits.clone(), Penalised::NONE, u),
                a
            );
        }
        assert!(differ, "the draws must vary");
        assert_eq!(sampler(SamplingParams::default()).next_uniform(), None);
    }

    #[test]
    fn temperature_one_follows_the_softmax() {
        let logits = [1.0, 0.5, 0.0, -0.5, 2.0];
        let counts = histogram(&mut sampler(seeded(1.0)), &logits, 20_000);
        // Chi-square with 4 degrees of freedom: 18.47 is the 0.1% critical value.
        let chi2 = chi_square(&counts, &softmax(&logits, 1.0));
        assert!(chi2 < 18.47, "chi2 {chi2} for counts {counts:?}");
    }

    #[test]
    fn temperature_scales_the_distribution() {
        let logits = [1.0, 0.5, 0.0, -0.5, 2.0];
        let counts = histogram(&mut sampler(seeded(2.5)), &logits, 20_000);
        let chi2 = chi_square(&counts, &softmax(&logits, 2.5));
        assert!(chi2 < 18.47, "chi2 {chi2} for counts {counts:?}");
        // The same counts are far from the temperature-1 distribution.
        assert!(chi_square(&counts, &softmax(&logits, 1.0)) > 100.0);
    }

    #[test]
    fn top_k_keeps_the_k_most_likely() {
        let logits = [0.0, 3.0, 1.0, 2.9, -1.0];
        let params = SamplingParams {
            top_k: 2,
            ..seeded(1.0)
        };
        let counts = histogram(&mut sampler(params), &logits, 2_000);
        assert_eq!((counts[0], counts[2], counts[4]), (0, 0, 0), "{counts:?}");
        assert!(counts[1] > 0 && counts[3] > 0, "{counts:?}");
        // The two survivors keep their relative odds: e^0.1 : 1.
        let probs = softmax(&[3.0, 2.9], 1.0);
        assert!(chi_square(&[counts[1], counts[3]], &probs) < 10.83);
    }

    #[test]
    fn top_p_keeps_the_smallest_prefix_reaching_p() {
        let logits = logits_of(&[0.5, 0.3, 0.15, 0.05]);
        let support = |top_p| {
            let counts = histogram(
                &mut sampler(SamplingParams {
                    top_p,
                    ..seeded(1.0)
                }),
                &logits,
                2_000,
            );
            counts.iter().map(|&c| c > 0).collect::<Vec<bool>>()
        };
        assert_eq!(support(0.5), [true, false, false, false]);
        assert_eq!(support(0.79), [true, true, false, false]);
        assert_eq!(support(0.81), [true, true, true, false]);
        assert_eq!(support(1.0), [true, true, true, true]);
    }

    #[test]
    fn min_p_drops_tokens_below_a_fraction_of_the_best() {
        let logits = logits_of(&[0.5, 0.3, 0.15, 0.05]);
        let support = |min_p| {
            let counts = histogram(
                &mut sampler(SamplingParams {
                    min_p,
                    ..seeded(1.0)
                }),
                &logits,
                2_000,
            );
            counts.iter().map(|&c| c > 0).collect::<Vec<bool>>()
        };
        // Thresholds: 0.25 * 0.5 = 0.125 keeps 0.15; 0.7 * 0.5 = 0.35 keeps only the best.
        assert_eq!(support(0.25), [true, true, true, false]);
        assert_eq!(support(0.7), [true, false, false, false]);
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
        let mut s = sampler(SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        });
        let mut logits = [2.0, -1.0, 1.5, 0.5];
        // Token 0 is penalised to 1.0, below token 2.
        assert_eq!(s.sample(&mut logits, Penalised::all(&[0, 1, 0])), 2);
        assert_eq!(logits, [1.0, -2.0, 1.5, 0.5]);
    }

    #[test]
    fn presence_and_frequency_penalties_follow_openai() {
        let mut s = sampler(SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..SamplingParams::default()
        });
        let mut logits = [1.0, 1.0, 1.0, 0.0];
        // Out-of-range ids in the history are ignored.
        s.sample(&mut logits, Penalised::all(&[2, 1, 2, 99]));
        assert_eq!(logits, [1.0, 1.0 - 0.75, 1.0 - 1.0, 0.0]);
    }

    #[test]
    fn presence_and_frequency_count_the_answer_and_repetition_everything() {
        let params = SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..SamplingParams::default()
        };
        let mut s = sampler(params.clone());
        // Prompt [0, 1, 1], answer [1, 2]: token 0 only repeated (prompt), token 1 repeated and
        // counted once (the answer's), token 2 repeated and counted once, token 3 untouched.
        let history = [0, 1, 1, 1, 2];
        let mut logits = [2.0, 2.0, -1.0, 4.0];
        s.sample(&mut logits, Penalised::of(&params, &history, 3));
        assert_eq!(logits, [1.0, 1.0 - 0.75, -2.0 - 0.75, 4.0]);
        // A window of 2 (llama.cpp, Ollama): only [1, 2] are read, both counted.
        let windowed = SamplingParams {
            penalty_window: Some(2),
            ..params
        };
        let mut s = sampler(windowed.clone());
        let mut logits = [2.0, 2.0, -1.0, 4.0];
        s.sample(&mut logits, Penalised::of(&windowed, &history, 3));
        assert_eq!(logits, [2.0, 1.0 - 0.75, -2.0 - 0.75, 4.0]);
        // A window of 0 reads nothing.
        let none = SamplingParams {
            penalty_window: Some(0),
            ..windowed
        };
        let penalised = Penalised::of(&none, &history, 3);
        assert!(penalised.ids.is_empty());
    }

    #[test]
    fn generation_config_values_map_as_transformers_does() {
        let qwen = GenerationConfigValues {
            do_sample: Some(true),
            temperature: Some(0.6),
            top_k: Some(20),
            top_p: Some(0.95),
            ..Default::default()
        };
        let p = SamplingParams::from_generation_config(&qwen);
        assert_eq!(
            (p.temperature, p.top_k, p.top_p, p.min_p),
            (0.6, 20, 0.95, 0.0)
        );
        let defaults = SamplingParams::from_generation_config(&GenerationConfigValues {
            do_sample: Some(true),
            ..Default::default()
        });
        assert_eq!((defaults.temperature, defaults.top_k), (1.0, 50));
        let greedy = SamplingParams::from_generation_config(&GenerationConfigValues {
            temperature: Some(0.7),
            repetition_penalty: Some(1.1),
            ..Default::default()
        });
        assert!(greedy.is_greedy());
        assert_eq!(greedy.repetition_penalty, 1.1);
    }

    #[test]
    fn out_of_range_parameters_are_refused_by_name() {
        let bad = [
            SamplingParams {
                temperature: -1.0,
                ..Default::default()
            },
            SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            SamplingParams {
                min_p: 1.5,
                ..Default::default()
            },
            SamplingParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            SamplingParams {
                frequency_penalty: f32::NAN,
                ..Default::default()
            },
        ];
        let fields = [
            "temperature",
            "top_p",
            "min_p",
            "repetition_penalty",
            "frequency_penalty",
        ];
        for (params, field) in bad.into_iter().zip(fields) {
            let err = Sampler::new(params).unwrap_err();
            assert_eq!(err.field, field);
            assert!(err.to_string().contains(field), "{err}");
        }
    }
}
