//! The chunked GDN prefill (`gdn_chunk_prep`, `gdn_chunk_scan`, `gdn_gated_norm`) against the
//! token-serial `gdn_recurrent` on fresh random inputs: outputs and final state, from a
//! non-zero initial state, over chunk edges, the scan's windows and a prompt split in two.
//! Needs a CUDA GPU: `cargo test --release -p spindle-cuda --test gdn_chunked -- --ignored --nocapture`.

use spindle_cuda::{delta_rule_on_host, DeltaForm, DeltaInputs, Device};
use spindle_model::GdnConfig;

/// Bound on max|Δ| / max|reference| (outputs and state separately).
const TOLERANCE: f32 = 1e-4;

/// Token counts: one token, either side of a 64-token chunk, several chunks, and more than
/// the 1024 tokens the scan takes per window.
const TOKENS: [usize; 6] = [1, 63, 64, 65, 300, 1100];

fn device_ordinal() -> usize {
    std::env::var("SPINDLE_CUDA_DEVICE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn open() -> Device {
    Device::open(device_ordinal()).unwrap_or_else(|e| panic!("{e}"))
}

/// (n_k, n_v, d_k, d_v, gate is sigmoid): the real head shape with GQA, a small one without,
/// the fixtures' shape, and odd sizes (d_k not a multiple of 8, d_v not of 32).
const SHAPES: [(usize, usize, usize, usize, bool); 4] = [
    (2, 4, 128, 128, false),
    (4, 4, 32, 64, true),
    (2, 4, 16, 16, false),
    (1, 3, 20, 40, true),
];

fn config(nk: usize, nv: usize, dk: usize, dv: usize) -> GdnConfig {
    GdnConfig {
        num_key_heads: nk,
        num_value_heads: nv,
        key_head_dim: dk,
        value_head_dim: dv,
        conv_kernel: 4,
    }
}

/// splitmix64: uniform f32 in [lo, hi).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    }

    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.next()
    }

    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// One layer's random operands for `tokens` tokens.
struct Case {
    g: GdnConfig,
    u: Vec<f32>,
    zba: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    norm: Vec<f32>,
    state: Vec<f32>,
    gate_sigmoid: bool,
}

impl Case {
    fn random(rng: &mut Rng, shape: (usize, usize, usize, usize, bool), tokens: usize) -> Self {
        let (nk, nv, dk, dv, gate_sigmoid) = shape;
        let g = config(nk, nv, dk, dv);
        let channels = g.conv_channels();
        // z, then b and a (logits of β and of the decay's softplus).
        let mut zba = Vec::with_capacity(tokens * (nv * dv + 2 * nv));
        for _ in 0..tokens {
            zba.extend(rng.vec(nv * dv, -3.0, 3.0));
            zba.extend(rng.vec(2 * nv, -4.0, 4.0));
        }
        Case {
            // SiLU outputs of the conv lie above −0.28.
            u: rng.vec(tokens * channels, -0.28, 2.0),
            zba,
            // exp(A_log) from 0.05 (decay ≈ 1 over long runs) to 7 (underflow within a chunk).
            a_log: rng.vec(nv, -3.0, 2.0),
            dt_bias: rng.vec(nv, -1.0, 1.0),
            norm: rng.vec(dv, 0.5, 1.5),
            state: rng.vec(nv * dk * dv, -0.5, 0.5),
            gate_sigmoid,
            g,
        }
    }

    fn inputs(&self, tokens: std::ops::Range<usize>) -> DeltaInputs<'_> {
        let (nv, dv) = (self.g.num_value_heads, self.g.value_head_dim);
        let (c, w) = (self.g.conv_channels(), nv * dv + 2 * nv);
        DeltaInputs {
            u: &self.u[tokens.start * c..tokens.end * c],
            zba: &self.zba[tokens.start * w..tokens.end * w],
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            norm: &self.norm,
            eps: 1e-6,
            gate_sigmoid: self.gate_sigmoid,
        }
    }

    /// Runs tokens `0..T` in pieces split at `cuts`, in `form`; returns (output, final state).
    fn run(&self, dev: &Device, cuts: &[usize], form: DeltaForm) -> (Vec<f32>, Vec<f32>) {
        let tokens = self.u.len() / self.g.conv_channels();
        let mut state = self.state.clone();
        let mut out = Vec::new();
        let mut bounds = vec![0];
        bounds.extend_from_slice(cuts);
        bounds.push(tokens);
        for piece in bounds.windows(2) {
            let x = self.inputs(piece[0]..piece[1]);
            let (o, ran) = delta_rule_on_host(dev, &self.g, &x, &mut state, form)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(ran, form, "{:?}: the {form:?} form did not run", self.g);
            out.extend(o);
        }
        (out, state)
    }
}

/// max|a − b| / max|b| (NaN counts as infinite).
fn relative_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-30);
    let worst = a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() {
            f32::INFINITY
        } else {
            m.max(d)
        }
    });
    worst / scale
}

fn check(dev: &Device, case: &Case, cuts: &[usize], label: &str) {
    let (serial_out, serial_state) = case.run(dev, &[], DeltaForm::Serial);
    let (chunked_out, chunked_state) = case.run(dev, cuts, DeltaForm::Chunked);
    let (eo, es) = (
        relative_diff(&chunked_out, &serial_out),
        relative_diff(&chunked_state, &serial_state),
    );
    println!("{label}: max|Δ|/max|ref| output {eo:.2e}, state {es:.2e}");
    assert!(
        eo < TOLERANCE && es < TOLERANCE,
        "{label}: chunked differs from serial (output {eo:.2e}, state {es:.2e})"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn chunked_prefill_equals_token_serial() {
    let dev = open();
    let mut rng = Rng(0x5eed_0001);
    for shape in SHAPES {
        for tokens in TOKENS {
            let case = Case::random(&mut rng, shape, tokens);
            check(&dev, &case, &[], &format!("{shape:?}, T = {tokens}"));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn chunked_prefill_in_two_calls_equals_token_serial() {
    let dev = open();
    let mut rng = Rng(0x5eed_0002);
    for shape in SHAPES {
        // Cuts inside a chunk and on a chunk edge; the second piece starts from the first's state.
        for (tokens, cut) in [(300, 130), (300, 128), (129, 1)] {
            let case = Case::random(&mut rng, shape, tokens);
            let label = format!("{shape:?}, T = {tokens} cut at {cut}");
            check(&dev, &case, &[cut], &label);
        }
    }
}
