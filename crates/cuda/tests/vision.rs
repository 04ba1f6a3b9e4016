//! Image input on CUDA against the tiny vision fixtures (`qwen3_5_dense_vision`,
//! `qwen3_5_moe_vision`, made by transformers 5.17.0): the tower's intermediates, the 3-D
//! positions and rope_delta, the logits of a prompt with two images, chunked prefill cut inside
//! an image, graph and batched decode after an image, and the refusals.
//! Needs a CUDA GPU: `cargo test --release -p spindle-cuda --test vision -- --ignored`. Fixtures
//! are read from the repository's `fixtures/` (or `$SPINDLE_FIXTURES`).

use std::sync::Arc;

use spindle_cuda::{CudaBatchItem, CudaEngine, CudaError, CudaSession};
use spindle_model::forward::LogitsFor;
use spindle_model::mrope::{rope_index, ImageFeatures};
use spindle_model::quant::WeightFormat;
use spindle_testkit::{fixture, max_abs_diff, Reference};
use spindle_vision::{patchify, PreparedImage, Rgb8};

const FIXTURES: [&str; 2] = ["qwen3_5_dense_vision", "qwen3_5_moe_vision"];

/// Bound on max |Δ| of the tower's outputs against the float64 reference.
const TOWER_TOLERANCE: f32 = 1e-4;
/// Bound on max |Δlogit| (issue #20: within 1e-4).
const LOGITS_TOLERANCE: f32 = 1e-4;

fn device_ordinal() -> usize {
    std::env::var("SPINDLE_CUDA_DEVICE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

struct Case {
    engine: CudaEngine,
    reference: Reference,
    images: Vec<PreparedImage>,
    prompt: Vec<u32>,
}

impl Case {
    fn load(name: &'static str) -> Case {
        let engine = CudaEngine::load(&fixture(name), device_ordinal())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let reference = Reference::load(name);
        let geometry = engine
            .config()
            .vision
            .as_ref()
            .expect("vision config")
            .geometry(&fixture(name))
            .unwrap();
        let images = (0..)
            .map(|k| format!("image_{k}"))
            .take_while(|key| reference.has(key))
            .map(|key| {
                let (shape, data) = reference.u8(&key);
                let image = Rgb8 {
                    height: shape[0],
                    width: shape[1],
                    data,
                };
                patchify(&image, &geometry).unwrap()
            })
            .collect::<Vec<_>>();
        assert_eq!(images.len(), 2, "{name}: the fixture holds two images");
        let prompt = reference.ids("prompt_ids");
        Case {
            engine,
            reference,
            images,
            prompt,
        }
    }

    fn features(&self) -> Vec<Arc<ImageFeatures>> {
        self.engine.encode_images(&self.images).unwrap()
    }

    fn session(&self) -> CudaSession {
        let mut session = self.engine.new_session().unwrap();
        self.engine
            .attach_images(&mut session, &self.features())
            .unwrap();
        session
    }

    fn image_token(&self) -> u32 {
        self.engine.config().vision.as_ref().unwrap().tokens.image
    }

    /// Prefill of the prompt, then greedy decode of the reference's length: the generated
    /// ids and the logits rows each step chose from, and the prefill logits.
    fn greedy(&self, session: &mut CudaSession) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
        let vocab = self.engine.config().vocab_size;
        let steps = self.reference.ids("gen_ids").len();
        let prefill = self
            .engine
            .forward(session, &self.prompt, LogitsFor::All)
            .unwrap();
        let mut last = prefill[prefill.len() - vocab..].to_vec();
        let (mut gen, mut decode) = (Vec::new(), Vec::new());
        for _ in 0..steps {
            let next = spindle_kernels::softmax::argmax(&last) as u32;
            gen.push(next);
            decode.extend_from_slice(&last);
            last = self
                .engine
                .forward(session, &[next], LogitsFor::Last)
                .unwrap();
        }
        (prefill, gen, decode)
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tower_intermediates_match_transformers_and_the_cpu() {
    for name in FIXTURES {
        let case = Case::load(name);
        let traces: Vec<_> = case
            .images
            .iter()
            .map(|i| case.engine.trace_image(i).unwrap())
            .collect();
        let cat = |f: &dyn Fn(&spindle_cuda::TowerTrace) -> Vec<f32>| -> Vec<f32> {
            traces.iter().flat_map(f).collect()
        };
        let cpu = spindle_cpu::Engine::load(&fixture(name)).unwrap();
        let cpu_traces: Vec<_> = case
            .images
            .iter()
            .map(|i| cpu.trace_image(i).unwrap())
            .collect();
        let cpu_embeds: Vec<f32> = cpu_traces
            .iter()
            .flat_map(|t| t.features.rows.clone())
            .collect();
        for (key, ours) in [
            ("vision_patch_embed", cat(&|t| t.patch_embed.clone())),
            ("vision_blocks_out", cat(&|t| t.blocks_out.clone())),
            ("vision_embeds", cat(&|t| t.features.rows.clone())),
        ] {
            let (_, expected) = case.reference.f32(key);
            let err = max_abs_diff(&ours, &expected);
            println!("{name}: {key} max|Δ| {err:.2e}");
            assert!(err < TOWER_TOLERANCE, "{name}: {key} differs by {err}");
        }
        let err = max_abs_diff(&cat(&|t| t.features.rows.clone()), &cpu_embeds);
        println!("{name}: vision_embeds vs the CPU engine max|Δ| {err:.2e}");
        assert!(
            err < TOWER_TOLERANCE,
            "{name}: CUDA and CPU towers differ by {err}"
        );
        // encode_images gives the traced features and the merged grid.
        let features = case.features();
        assert_eq!(features[0].rows, traces[0].features.rows);
        assert_eq!((features[0].height, features[0].width), (3, 5));
        assert_eq!((features[1].height, features[1].width), (2, 2));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn positions_and_decode_positions_match_get_rope_index() {
    for name in FIXTURES {
        let case = Case::load(name);
        let (positions, delta) =
            rope_index(&case.prompt, case.image_token(), &case.features()).unwrap();
        let (shape, expected) = case.reference.i64("position_ids");
        let t = shape[1];
        for row in 0..3 {
            let ours: Vec<i64> = positions.iter().map(|p| p[row] as i64).collect();
            assert_eq!(ours, expected[row * t..(row + 1) * t], "{name}: row {row}");
        }
        assert_eq!(vec![delta], case.reference.i64("rope_delta").1, "{name}");

        // After the prompt (and each generated token) the CUDA session continues at cache
        // index + delta.
        let mut session = case.session();
        case.engine
            .forward(&mut session, &case.prompt, LogitsFor::Last)
            .unwrap();
        assert_eq!(
            session.rope.delta, delta,
            "{name}: the session's rope_delta"
        );
        assert!(session.rope.pending.is_empty());
        let (shape, decode) = case.reference.i64("decode_position_ids");
        let g = shape[1];
        for (k, &id) in case.reference.ids("gen_ids").iter().enumerate() {
            let p = session.rope.text_position(session.position) as i64;
            for row in 0..3 {
                assert_eq!(p, decode[row * g + k], "{name}: decode position {k}");
            }
            case.engine
                .forward(&mut session, &[id], LogitsFor::Last)
                .unwrap();
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn logits_with_images_match_transformers() {
    for name in FIXTURES {
        let case = Case::load(name);
        assert!(case.engine.uses_graphs(), "decode runs through graphs here");
        let expected_gen = case.reference.ids("gen_ids");
        let (_, prefill_ref) = case.reference.f32("prefill_logits");
        let (_, decode_ref) = case.reference.f32("decode_logits");
        let (_, full_ref) = case.reference.f32("full_logits");

        let mut session = case.session();
        let (prefill, gen, decode) = case.greedy(&mut session);
        let prefill_err = max_abs_diff(&prefill, &prefill_ref);
        let decode_err = max_abs_diff(&decode, &decode_ref);
        println!("{name}: prefill max|Δ| {prefill_err:.2e}, decode max|Δ| {decode_err:.2e}");
        assert!(
            prefill_err < LOGITS_TOLERANCE,
            "{name}: prefill {prefill_err}"
        );
        assert_eq!(gen, expected_gen, "{name}: greedy tokens");
        assert!(decode_err < LOGITS_TOLERANCE, "{name}: decode {decode_err}");

        // One pass over prompt + gen[..G-1] reproduces full_logits.
        let mut all = case.prompt.clone();
        all.extend_from_slice(&expected_gen[..expected_gen.len() - 1]);
        let mut session = case.session();
        let full = case
            .engine
            .forward(&mut session, &all, LogitsFor::All)
            .unwrap();
        let full_err = max_abs_diff(&full, &full_ref);
        println!("{name}: full max|Δ| {full_err:.2e}");
        assert!(full_err < LOGITS_TOLERANCE, "{name}: full {full_err}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_decode_after_an_image_equals_eager_decode() {
    let mut case = Case::load("qwen3_5_dense_vision");
    let mut session = case.session();
    let (_, gen_graph, graphed) = case.greedy(&mut session);
    case.engine.set_graphs(false);
    let mut session = case.session();
    let (_, gen_eager, eager) = case.greedy(&mut session);
    assert_eq!(gen_graph, gen_eager);
    let err = max_abs_diff(&graphed, &eager);
    assert!(err < 1e-5, "graph and eager decode differ by {err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn prefill_in_chunks_cut_inside_images_equals_one_pass() {
    let case = Case::load("qwen3_5_dense_vision");
    let mut whole = case.session();
    let at_once = case
        .engine
        .forward(&mut whole, &case.prompt, LogitsFor::All)
        .unwrap();
    // Cuts inside the first image (pads 6..21), between, inside the second (27..31), and a
    // token at a time through the second (decode-sized chunks with image rows).
    for cuts in [
        vec![9],
        vec![6, 21],
        vec![3, 12, 29],
        (26..33).collect::<Vec<_>>(),
    ] {
        let mut session = case.session();
        let mut logits = Vec::new();
        let mut from = 0;
        for &cut in cuts.iter().chain([case.prompt.len()].iter()) {
            logits.extend(
                case.engine
                    .forward(&mut session, &case.prompt[from..cut], LogitsFor::All)
                    .unwrap(),
            );
            from = cut;
        }
        let err = max_abs_diff(&logits, &at_once);
        // Chunks take other matmul paths than one pass (float rounding only).
        assert!(
            err < 5e-5,
            "cuts {cuts:?}: chunked prefill differs by {err}"
        );
        assert_eq!(session.rope, whole.rope, "cuts {cuts:?}: rope state");
        assert!(session.rope.pending.is_empty());
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn batched_steps_with_an_image_sequence_equal_each_alone() {
    let case = Case::load("qwen3_5_dense_vision");
    let vocab = case.engine.config().vocab_size;
    let text: Vec<u32> = (10..30).collect();
    // Alone: the image prompt and a text prompt, then one decode token each.
    let mut a = case.session();
    let pa = case
        .engine
        .forward(&mut a, &case.prompt, LogitsFor::Last)
        .unwrap();
    let da = case.engine.forward(&mut a, &[7], LogitsFor::Last).unwrap();
    let mut b = case.engine.new_session().unwrap();
    let pb = case.engine.forward(&mut b, &text, LogitsFor::Last).unwrap();
    let db = case.engine.forward(&mut b, &[8], LogitsFor::Last).unwrap();
    // Together: prefill as one batched step, then a decode step.
    let mut a = case.session();
    let mut b = case.engine.new_session().unwrap();
    for (ids, expected) in [
        ((case.prompt.as_slice(), text.as_slice()), (&pa, &pb)),
        ((&[7u32][..], &[8u32][..]), (&da, &db)),
    ] {
        let mut items = [
            CudaBatchItem {
                session: &mut a,
                ids: ids.0,
                want: LogitsFor::Last,
            },
            CudaBatchItem {
                session: &mut b,
                ids: ids.1,
                want: LogitsFor::Last,
            },
        ];
        let out = case.engine.forward_batch(&mut items);
        let rows: Vec<Vec<f32>> = out.into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(rows[0].len(), vocab);
        let ea = max_abs_diff(&rows[0], expected.0);
        let eb = max_abs_diff(&rows[1], expected.1);
        assert!(ea < 1e-5 && eb < 1e-5, "batched vs alone: {ea}, {eb}");
    }
    assert_ne!(a.rope.delta, 0, "the image moved the rotary positions");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn images_swapped_change_the_logits() {
    // The features really are placed: the same pads without images give other logits.
    let case = Case::load("qwen3_5_dense_vision");
    let mut session = case.session();
    let with = case
        .engine
        .forward(&mut session, &case.prompt, LogitsFor::Last)
        .unwrap();
    let mut plain = case.engine.new_session().unwrap();
    let without = case
        .engine
        .forward(&mut plain, &case.prompt, LogitsFor::Last)
        .unwrap();
    assert!(max_abs_diff(&with, &without) > 1e-3);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn refusals_name_the_cause() {
    let case = Case::load("qwen3_5_dense_vision");
    // Text inside an image's pads: refused, the session untouched.
    let mut session = case.session();
    let mut ids = case.prompt[..9].to_vec();
    ids.push(100);
    let err = case
        .engine
        .forward(&mut session, &ids, LogitsFor::Last)
        .unwrap_err();
    assert!(matches!(err, CudaError::Image(_)), "{err}");
    assert!(err.to_string().contains("must be consecutive"), "{err}");
    assert_eq!(session.position, 0);
    case.engine
        .forward(&mut session, &case.prompt, LogitsFor::Last)
        .unwrap();
    // A session past an image is not cached.
    let err = match case.engine.read_recurrent(&session) {
        Ok(_) => panic!("a session past an image was read for the prefix cache"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("past an image"), "{err}");
    // An image that does not fit the tower, by index.
    let mut odd = case.images[1].clone();
    odd.grid.w = 3;
    let err = case
        .engine
        .encode_images(&[case.images[0].clone(), odd])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("image 1:"), "{err}");
    // --no-vision.
    let engine = CudaEngine::load_with_vision(
        &fixture("qwen3_5_dense_vision"),
        device_ordinal(),
        WeightFormat::Bf16,
        None,
        false,
    )
    .unwrap();
    let err = engine.encode_images(&case.images).unwrap_err().to_string();
    assert!(err.contains("--no-vision"), "{err}");
    assert_eq!(engine.vision_bytes(), 0);
    assert!(case.engine.vision_bytes() > 0);
    // A text-only family.
    let engine = CudaEngine::load(&fixture("qwen3_next_moe"), device_ordinal()).unwrap();
    let err = engine.encode_images(&case.images).unwrap_err().to_string();
    assert!(err.contains("no vision_config"), "{err}");
}

/// Where the prefill's distance to the reference comes from: the CUDA text flow on the CPU
/// tower's features, the CPU engine on the same prompt, and the CUDA tower's features in the
/// CPU engine (printed; asserts only that each path runs).
#[test]
#[ignore = "needs a CUDA GPU"]
fn prefill_error_breakdown() {
    for name in FIXTURES {
        let case = Case::load(name);
        let (_, reference) = case.reference.f32("prefill_logits");
        let cpu = spindle_cpu::Engine::load(&fixture(name)).unwrap();
        let cpu_features = cpu.encode_images(&case.images).unwrap();
        let cuda_features = case.features();
        let cuda_with = |features: &[Arc<ImageFeatures>]| {
            let mut s = case.engine.new_session().unwrap();
            case.engine.attach_images(&mut s, features).unwrap();
            case.engine
                .forward(&mut s, &case.prompt, LogitsFor::All)
                .unwrap()
        };
        let cpu_with = |features: &[Arc<ImageFeatures>]| {
            let mut s = cpu.new_session();
            cpu.attach_images(&mut s, features).unwrap();
            cpu.forward(&mut s, &case.prompt, LogitsFor::All).unwrap()
        };
        let cuda_cuda = cuda_with(&cuda_features);
        let cuda_cpu = cuda_with(&cpu_features);
        let cpu_cpu = cpu_with(&cpu_features);
        let cpu_cuda = cpu_with(&cuda_features);
        println!(
            "{name}: vs reference: CUDA flow + CUDA tower {:.2e}, CUDA flow + CPU tower {:.2e}, CPU flow + CPU tower {:.2e}, CPU flow + CUDA tower {:.2e}; CUDA vs CPU flow (CPU tower) {:.2e}",
            max_abs_diff(&cuda_cuda, &reference),
            max_abs_diff(&cuda_cpu, &reference),
            max_abs_diff(&cpu_cpu, &reference),
            max_abs_diff(&cpu_cuda, &reference),
            max_abs_diff(&cuda_cpu, &cpu_cpu),
        );
    }
}

/// The tensor-core tower at each precision it offers, on both fixtures: the tower's outputs
/// and the prefill logits against the reference (printed, to choose the default), and the
/// default (split planes everywhere) within the bounds.
#[test]
#[ignore = "needs a CUDA GPU"]
fn tensor_core_tower_precisions() {
    use spindle_cuda::tower::TowerPrecision;
    use spindle_cuda::vision::TowerPath;
    for name in FIXTURES {
        let case = Case::load(name);
        let tower = case.engine.vision().unwrap();
        assert_eq!(
            tower.path(),
            TowerPath::Tensor(TowerPrecision::SPLIT),
            "{name}: the fixture's tower runs on the tensor cores by default"
        );
        let (_, embeds_ref) = case.reference.f32("vision_embeds");
        let (_, blocks_ref) = case.reference.f32("vision_blocks_out");
        let (_, prefill_ref) = case.reference.f32("prefill_logits");
        for precision in TowerPrecision::ALL {
            tower.set_precision(precision).unwrap();
            let traces: Vec<_> = case
                .images
                .iter()
                .map(|i| case.engine.trace_image(i).unwrap())
                .collect();
            let embeds: Vec<f32> = traces
                .iter()
                .flat_map(|t| t.features.rows.clone())
                .collect();
            let blocks: Vec<f32> = traces.iter().flat_map(|t| t.blocks_out.clone()).collect();
            let mut session = case.session();
            let prefill = case
                .engine
                .forward(&mut session, &case.prompt, LogitsFor::All)
                .unwrap();
            let (e, b, p) = (
                max_abs_diff(&embeds, &embeds_ref),
                max_abs_diff(&blocks, &blocks_ref),
                max_abs_diff(&prefill, &prefill_ref),
            );
            println!(
                "{name}: {}: vision_blocks_out {b:.2e}, vision_embeds {e:.2e}, prefill logits {p:.2e}",
                precision.describe()
            );
            if precision == TowerPrecision::SPLIT {
                assert!(
                    e < TOWER_TOLERANCE && b < TOWER_TOLERANCE,
                    "{name}: tower {e} {b}"
                );
                assert!(p < LOGITS_TOLERANCE, "{name}: prefill {p}");
            }
        }
        tower.set_precision(TowerPrecision::SPLIT).unwrap();
    }
}
