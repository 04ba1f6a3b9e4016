//! Throughput of the linear kernels against the machine's memory bandwidth.
//!
//! - read / copy bandwidth: a vectorized 2-thread sum and a `copy_from_slice` over 512 MiB;
//! - matvec GB/s (weight bytes per second) per format and SIMD path, for 2048×2048 and
//!   8192×2048, cycling through enough copies of the matrix (≥ 512 MiB) that every call reads
//!   from DRAM, as decode does;
//! - matmul GFLOP/s (2·rows·cols·tokens per second) at 64 and 512 tokens.
//!
//! `cargo bench -p spindle-kernels --bench matvec [-- FILTER]` runs the lines containing FILTER.

use std::hint::black_box;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use spindle_kernels::linear::{matmul_with, matvec_with};
use spindle_kernels::Isa;
use spindle_model::quant::view::{MatRef, Weights};
use spindle_model::quant::{QuantizedMatrix, WeightFormat};

const COLD_BYTES: usize = 512 << 20;

/// Fastest seconds per call of `f`, run for about `budget`. The minimum, not the median: the
/// development machine is shared, and other work only ever slows a call down.
fn time(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < budget || samples.len() < 5 {
        let t = Instant::now();
        f();
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.into_iter().fold(f64::INFINITY, f64::min)
}

/// CPU seconds this process has used (all threads; /proc/self/stat, 10 ms ticks).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Like [`time`], also returning the mean CPU seconds per call (all threads): on a loaded
/// machine that shows the work a call costs when the wall clock shows the competition.
fn time_cpu(budget: Duration, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let (cpu0, mut calls) = (cpu_seconds(), 0usize);
    let mut best = f64::INFINITY;
    let start = Instant::now();
    while start.elapsed() < budget || calls < 5 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        calls += 1;
    }
    (best, (cpu_seconds() - cpu0) / calls as f64)
}

/// One matrix in every format, as owned storage.
struct Formats {
    f32s: Vec<f32>,
    bf16: Vec<u16>,
    f16: Vec<u16>,
    q8: QuantizedMatrix,
    q4: QuantizedMatrix,
    /// The codes again, 64-byte aligned as an install stores them: (buffer, offset).
    q8_codes: (Vec<u8>, usize),
    q4_codes: (Vec<u8>, usize),
}

/// A copy of `bytes` starting on a 64-byte boundary: (buffer, offset of the copy).
fn aligned(bytes: &[u8]) -> (Vec<u8>, usize) {
    let mut buf = vec![0u8; bytes.len() + 64];
    let off = (64 - buf.as_ptr() as usize % 64) % 64;
    buf[off..off + bytes.len()].copy_from_slice(bytes);
    (buf, off)
}

impl Formats {
    fn new(rows: usize, cols: usize, seed: u64) -> Self {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let f32s: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-0.05..0.05f32))
            .collect();
        let q8 = QuantizedMatrix::quantize(&f32s, rows, cols, WeightFormat::Q8);
        let q4 = QuantizedMatrix::quantize(&f32s, rows, cols, WeightFormat::Q4);
        Formats {
            q8_codes: aligned(&q8.qs),
            q4_codes: aligned(&q4.qs),
            q8,
            q4,
            bf16: f32s.iter().map(|&v| (v.to_bits() >> 16) as u16).collect(),
            f16: f32s
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect(),
            f32s,
        }
    }

    fn mat(&self, name: &str, rows: usize, cols: usize) -> MatRef<'_> {
        match name {
            "f32" => MatRef::new(Weights::F32(&self.f32s), rows, cols),
            "bf16" => MatRef::new(Weights::Bf16(&self.bf16), rows, cols),
            "f16" => MatRef::new(Weights::F16(&self.f16), rows, cols),
            "q8" => {
                let (buf, off) = &self.q8_codes;
                let qs = bytemuck::cast_slice(&buf[*off..*off + rows * cols]);
                MatRef::new(
                    Weights::Q8 {
                        qs,
                        scales: &self.q8.scales,
                    },
                    rows,
                    cols,
                )
            }
            _ => {
                let (buf, off) = &self.q4_codes;
                let qs = &buf[*off..*off + rows * cols / 2];
                MatRef::new(
                    Weights::Q4 {
                        qs,
                        scales: &self.q4.scales,
                    },
                    rows,
                    cols,
                )
            }
        }
    }
}

/// Σ with 16 independent partial sums, so it vectorizes and runs at load speed.
fn sum16(c: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    for b in c.chunks_exact(16) {
        for i in 0..16 {
            acc[i] += b[i];
        }
    }
    acc.iter().sum()
}

fn bandwidth(filter: &str) {
    if !"bandwidth".contains(filter) {
        return;
    }
    let n = COLD_BYTES / 4;
    let src: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let mut dst = vec![0.0f32; n];
    let read = time(Duration::from_secs(2), || {
        let s: f32 = src.par_chunks(1 << 16).map(sum16).sum();
        black_box(s);
    });
    let copy = time(Duration::from_secs(2), || {
        dst.par_chunks_mut(1 << 16)
            .zip(src.par_chunks(1 << 16))
            .for_each(|(d, s)| d.copy_from_slice(s));
        black_box(&dst);
    });
    println!(
        "bandwidth  read (sum, {} threads)        {:6.1} GB/s",
        rayon::current_num_threads(),
        COLD_BYTES as f64 / read / 1e9
    );
    println!(
        "bandwidth  copy (read+write counted)   {:6.1} GB/s",
        2.0 * COLD_BYTES as f64 / copy / 1e9
    );
}

/// The matmuls of a prompt: the A3B expert shapes (gate/up 512×2048, down 2048×512) at the
/// token counts an expert sees in a 512-token prompt (8-32, top-8 of 256), and a dense
/// 2048×2048 projection at 64-512 tokens, on the best path. GFLOP/s counts 2·rows·cols·tokens
/// (for q8/q4 these are integer multiply-adds plus the scale arithmetic: "GOPS"); the last
/// column divides by the CPU time used instead (both threads: the 2-thread peak is twice the
/// 1-thread figure), which is steadier than the wall clock while other work runs.
fn prefill_shapes(filter: &str) {
    let shapes: [(usize, usize, &[usize]); 3] = [
        (512, 2048, &[2, 4, 8, 16, 32, 64]),
        (2048, 512, &[8, 16, 32]),
        (2048, 2048, &[64, 512]),
    ];
    let isa = Isa::best();
    for (rows, cols, token_counts) in shapes {
        let mut mats: Option<Formats> = None;
        for &tokens in token_counts {
            for name in ["f32", "bf16", "q8", "q4"] {
                let line = format!("prefill {rows}x{cols} t={tokens} {name:>4} {isa:?}");
                if !line.contains(filter) {
                    continue;
                }
                let m = mats.get_or_insert_with(|| Formats::new(rows, cols, 99));
                let w = m.mat(name, rows, cols);
                let x: Vec<f32> = (0..tokens * cols)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                    .collect();
                let mut y = vec![0.0f32; rows * tokens];
                let (secs, cpu) = time_cpu(Duration::from_millis(1000), || {
                    matmul_with(isa, &w, &x, tokens, &mut y);
                    black_box(&y);
                });
                let flops = 2.0 * (rows * cols * tokens) as f64;
                println!(
                    "{line:<38} {:8.3} ms {:6.1} GFLOP/s  {:6.1} GFLOP per CPU-s",
                    secs * 1e3,
                    flops / secs / 1e9,
                    flops / cpu / 1e9
                );
            }
        }
    }
}

/// Expert matmuls as a prompt runs them: 512×2048 at 16 tokens (and 2-4, the batch sizes
/// where per-row dots and the GEMM meet), cycling through 96 distinct matrices (more than the
/// L3 holds in every format), so the weights come from DRAM.
fn prefill_cold_experts(filter: &str) {
    let (rows, cols, copies) = (512usize, 2048usize, 96usize);
    let isa = Isa::best();
    let mut mats: Vec<Formats> = Vec::new();
    for (tokens, name) in [
        (2, "q4"),
        (3, "q4"),
        (4, "q4"),
        (16, "bf16"),
        (16, "q8"),
        (16, "q4"),
    ] {
        let line = format!("prefill cold experts {rows}x{cols} t={tokens} {name:>4} {isa:?}");
        if !line.contains(filter) {
            continue;
        }
        if mats.is_empty() {
            mats = (0..copies)
                .map(|i| Formats::new(rows, cols, 1000 + i as u64))
                .collect();
        }
        let x: Vec<f32> = (0..tokens * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let mut y = vec![0.0f32; rows * tokens];
        let mut i = 0;
        let (secs, cpu) = time_cpu(Duration::from_millis(1000), || {
            matmul_with(
                isa,
                &mats[i % copies].mat(name, rows, cols),
                &x,
                tokens,
                &mut y,
            );
            black_box(&y);
            i += 1;
        });
        let flops = 2.0 * (rows * cols * tokens) as f64;
        println!(
            "{line:<38} {:8.3} ms {:6.1} GFLOP/s  {:6.1} GFLOP per CPU-s",
            secs * 1e3,
            flops / secs / 1e9,
            flops / cpu / 1e9
        );
    }
}

/// Decode-sized Q4 matmuls (1-8 tokens: one sequence, or a batch of decoding sequences) with
/// the weights in DRAM: 8192×2048 cycling through 64 copies (an LM head's rows, 600 MB), and
/// 512×2048 through 512 (routed experts, 300 MB), and one 512×2048 in cache. Run once as is and once with
/// `SPINDLE_GEMM=legacy` (the per-row dots) to compare the kernels in one session.
fn decode_cold(filter: &str) {
    let isa = Isa::best();
    for (rows, cols, copies) in [
        (8192usize, 2048usize, 64usize),
        (512, 2048, 512),
        (512, 2048, 1),
    ] {
        let mut mats: Vec<QuantizedMatrix> = Vec::new();
        for tokens in [1usize, 2, 4, 8] {
            let heat = if copies == 1 { "hot" } else { "cold" };
            let line = format!("decode {heat} {rows}x{cols} t={tokens} q4 {isa:?}");
            if !line.contains(filter) {
                continue;
            }
            if mats.is_empty() {
                let mut rng = rand::rngs::StdRng::seed_from_u64(2000);
                let f32s: Vec<f32> = (0..rows * cols)
                    .map(|_| rng.random_range(-0.05..0.05f32))
                    .collect();
                let q = QuantizedMatrix::quantize(&f32s, rows, cols, WeightFormat::Q4);
                mats = (0..copies).map(|_| q.clone()).collect();
            }
            let x: Vec<f32> = (0..tokens * cols)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let mut y = vec![0.0f32; rows * tokens];
            let mut i = 0;
            let (secs, cpu) = time_cpu(Duration::from_millis(1500), || {
                matmul_with(isa, &mats[i % copies].mat(), &x, tokens, &mut y);
                black_box(&y);
                i += 1;
            });
            let bytes = mats[0].mat().size_bytes() as f64;
            let ops = 2.0 * (rows * cols * tokens) as f64;
            println!(
                "{line:<38} {:8.1} µs {:6.1} GB/s {:6.1} GOP/s {:6.1} GOP per CPU-s",
                secs * 1e6,
                bytes / secs / 1e9,
                ops / secs / 1e9,
                ops / cpu / 1e9
            );
        }
    }
}

fn main() {
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    println!(
        "threads {}, best path {:?}",
        rayon::current_num_threads(),
        Isa::best()
    );
    bandwidth(&filter);
    prefill_shapes(&filter);
    prefill_cold_experts(&filter);
    decode_cold(&filter);
    let isas = Isa::all_available();
    for (rows, cols) in [(2048usize, 2048usize), (8192, 2048)] {
        let wanted = ["matvec", "matmul"]
            .iter()
            .any(|k| format!("{k} {rows}x{cols}").contains(&filter) || filter.contains(k));
        if !wanted {
            continue;
        }
        // Enough distinct copies that the working set leaves the caches (measured with bf16).
        let copies = (COLD_BYTES / (rows * cols * 2)).max(2);
        let mats: Vec<Formats> = (0..copies)
            .map(|i| Formats::new(rows, cols, i as u64))
            .collect();
        for name in ["f32", "bf16", "f16", "q8", "q4"] {
            for &isa in &isas {
                let line = format!("matvec {rows}x{cols} {name:>4} {isa:?}");
                if !line.contains(&filter) {
                    continue;
                }
                let x: Vec<f32> = (0..cols)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                    .collect();
                let mut y = vec![0.0f32; rows];
                let mut i = 0;
                let secs = time(Duration::from_millis(700), || {
                    matvec_with(isa, &mats[i % copies].mat(name, rows, cols), &x, &mut y);
                    black_box(&y);
                    i += 1;
                });
                let bytes = mats[0].mat(name, rows, cols).size_bytes() as f64;
                println!(
                    "{line:<34} {:8.1} µs {:6.1} GB/s",
                    secs * 1e6,
                    bytes / secs / 1e9
                );
            }
        }
        for tokens in [4usize, 8, 16, 64, 512] {
            for name in ["f32", "bf16", "q8", "q4"] {
                for &isa in &isas {
                    let line = format!("matmul {rows}x{cols} t={tokens} {name:>4} {isa:?}");
                    if !line.contains(&filter) || (isa == Isa::Scalar && tokens > 16) {
                        continue;
                    }
                    let x: Vec<f32> = (0..tokens * cols)
                        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                        .collect();
                    let mut y = vec![0.0f32; rows * tokens];
                    let w = mats[0].mat(name, rows, cols);
                    let secs = time(Duration::from_millis(1500), || {
                        matmul_with(isa, &w, &x, tokens, &mut y);
                        black_box(&y);
                    });
                    let flops = 2.0 * (rows * cols * tokens) as f64;
                    println!(
                        "{line:<34} {:8.2} ms {:6.1} GFLOP/s",
                        secs * 1e3,
                        flops / secs / 1e9
                    );
                }
            }
        }
    }
}
