//! Image input on the CPU against the tiny vision fixtures (`qwen3_5_dense_vision`,
//! `qwen3_5_moe_vision`, made by transformers 5.17.0): preprocessing of the fixture's images,
//! the tower's intermediates, the 3-D positions, and the logits of a prompt with two images.

mod common;

use std::sync::Arc;

use common::{fixture, max_abs_diff, Reference, TempDir};
use spindle_cpu::{Engine, EngineError, LoadOptions, LogitsFor, Session};
use spindle_model::install;
use spindle_model::mrope::{rope_index, ImageFeatures};
use spindle_model::quant::WeightFormat;
use spindle_vision::{patchify, PreparedImage, Rgb8};

const FIXTURES: [&str; 2] = ["qwen3_5_dense_vision", "qwen3_5_moe_vision"];

/// Bound on max |Δ| of the tower's outputs against the float64 reference.
const TOWER_TOLERANCE: f32 = 1e-4;
/// Bound on max |Δlogit| (issue #20: within 1e-4; the text fixtures allow 2e-4).
const LOGITS_TOLERANCE: f32 = 1e-4;

struct Case {
    engine: Engine,
    reference: Reference,
    images: Vec<PreparedImage>,
    prompt: Vec<u32>,
}

impl Case {
    fn load(name: &'static str) -> Case {
        let engine = Engine::load(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
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

    fn session(&self) -> Session {
        let mut session = self.engine.new_session();
        self.engine
            .attach_images(&mut session, &self.features())
            .unwrap();
        session
    }

    fn image_token(&self) -> u32 {
        self.engine.config().vision.as_ref().unwrap().tokens.image
    }
}

#[test]
fn patchify_reproduces_the_processors_pixel_values() {
    for name in FIXTURES {
        let case = Case::load(name);
        let (shape, expected) = case.reference.f32("pixel_values");
        let ours: Vec<f32> = case.images.iter().flat_map(|i| i.pixels.clone()).collect();
        assert_eq!(ours.len(), shape[0] * shape[1]);
        let err = max_abs_diff(&ours, &expected);
        assert!(err < 1e-6, "{name}: pixel_values differ by {err}");
        let (_, grids) = case.reference.i64("image_grid_thw");
        let ours: Vec<i64> = case
            .images
            .iter()
            .flat_map(|i| [i.grid.t as i64, i.grid.h as i64, i.grid.w as i64])
            .collect();
        assert_eq!(ours, grids, "{name}: image_grid_thw");
    }
}

#[test]
fn tower_intermediates_match_transformers() {
    for name in FIXTURES {
        let case = Case::load(name);
        let traces: Vec<_> = case
            .images
            .iter()
            .map(|i| case.engine.trace_image(i).unwrap())
            .collect();
        let cat = |f: &dyn Fn(&spindle_cpu::vision::TowerTrace) -> Vec<f32>| -> Vec<f32> {
            traces.iter().flat_map(f).collect()
        };
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
        // encode_images gives the traced features.
        let features = case.features();
        assert_eq!(features[0].rows, traces[0].features.rows);
        assert_eq!((features[0].height, features[0].width), (3, 5));
    }
}

#[test]
fn positions_and_rope_delta_match_get_rope_index() {
    for name in FIXTURES {
        let case = Case::load(name);
        let (positions, delta) =
            rope_index(&case.prompt, case.image_token(), &case.features()).unwrap();
        let (shape, expected) = case.reference.i64("position_ids");
        let t = shape[1];
        for row in 0..3 {
            let ours: Vec<i64> = positions.iter().map(|p| p[row] as i64).collect();
            assert_eq!(
                ours,
                expected[row * t..(row + 1) * t],
                "{name}: position_ids row {row}"
            );
        }
        assert_eq!(
            vec![delta],
            case.reference.i64("rope_delta").1,
            "{name}: rope_delta"
        );

        // After the prompt (and each generated token) a session continues at cache index + delta.
        let mut session = case.session();
        case.engine
            .forward(&mut session, &case.prompt, LogitsFor::Last)
            .unwrap();
        assert_eq!(session.rope.delta, delta);
        let (shape, decode) = case.reference.i64("decode_position_ids");
        let g = shape[1];
        let gen = case.reference.ids("gen_ids");
        for (k, &id) in gen.iter().enumerate() {
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
fn logits_with_images_match_transformers() {
    for name in FIXTURES {
        let case = Case::load(name);
        let expected_gen = case.reference.ids("gen_ids");
        let (_, prefill_ref) = case.reference.f32("prefill_logits");
        let (_, decode_ref) = case.reference.f32("decode_logits");
        let (_, full_ref) = case.reference.f32("full_logits");
        let vocab = case.engine.config().vocab_size;

        let mut session = case.session();
        let prefill = case
            .engine
            .forward(&mut session, &case.prompt, LogitsFor::All)
            .unwrap();
        let prefill_err = max_abs_diff(&prefill, &prefill_ref);
        let mut last = prefill[prefill.len() - vocab..].to_vec();
        let (mut gen, mut decode) = (Vec::new(), Vec::new());
        for _ in 0..expected_gen.len() {
            let next = spindle_kernels::softmax::argmax(&last) as u32;
            gen.push(next);
            decode.extend_from_slice(&last);
            last = case
                .engine
                .forward(&mut session, &[next], LogitsFor::Last)
                .unwrap();
        }
        let decode_err = max_abs_diff(&decode, &decode_ref);
        println!("{name}: prefill max|Δ| {prefill_err:.2e}, decode max|Δ| {decode_err:.2e}");
        assert!(
            prefill_err < LOGITS_TOLERANCE,
            "{name}: prefill logits differ by {prefill_err}"
        );
        assert_eq!(gen, expected_gen, "{name}: greedy tokens");
        assert!(
            decode_err < LOGITS_TOLERANCE,
            "{name}: decode logits differ by {decode_err}"
        );

        // One pass over prompt + gen[..G-1] reproduces full_logits.
        let mut all = case.prompt.clone();
        all.extend_from_slice(&expected_gen[..expected_gen.len() - 1]);
        let mut session = case.session();
        let full = case
            .engine
            .forward(&mut session, &all, LogitsFor::All)
            .unwrap();
        let full_err = max_abs_diff(&full, &full_ref);
        assert!(
            full_err < LOGITS_TOLERANCE,
            "{name}: full logits differ by {full_err}"
        );
    }
}

#[test]
fn prefill_in_chunks_cut_inside_images_equals_one_pass() {
    let case = Case::load("qwen3_5_dense_vision");
    let mut whole = case.session();
    let at_once = case
        .engine
        .forward(&mut whole, &case.prompt, LogitsFor::All)
        .unwrap();
    // Cuts inside the first image (pads 6..21), between, inside the second (27..31), and a
    // token at a time through the second.
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
        // Chunks take other matmul paths than one pass (float rounding only, ~1e-5).
        assert!(
            err < 5e-5,
            "cuts {cuts:?}: chunked prefill differs by {err}"
        );
        assert_eq!(session.rope, whole.rope, "cuts {cuts:?}: rope state");
        assert!(session.rope.pending.is_empty());
    }
}

#[test]
fn images_swapped_change_the_logits() {
    // The features really are placed: the same pads with other images give other logits.
    let case = Case::load("qwen3_5_dense_vision");
    let mut session = case.session();
    let with = case
        .engine
        .forward(&mut session, &case.prompt, LogitsFor::Last)
        .unwrap();
    let mut plain = case.engine.new_session();
    let without = case
        .engine
        .forward(&mut plain, &case.prompt, LogitsFor::Last)
        .unwrap();
    assert!(max_abs_diff(&with, &without) > 1e-3);
}

#[test]
fn text_inside_an_images_pads_is_refused_by_name() {
    let case = Case::load("qwen3_5_dense_vision");
    let mut session = case.session();
    // 3 pads of the first image's 15, then ordinary text.
    let mut ids = case.prompt[..9].to_vec();
    ids.push(100);
    let err = case
        .engine
        .forward(&mut session, &ids, LogitsFor::Last)
        .unwrap_err();
    assert!(matches!(err, EngineError::Placement(_)), "{err}");
    assert!(err.to_string().contains("must be consecutive"), "{err}");
    // The session is untouched: the right tokens still run.
    assert!(session.broken.is_none());
    assert_eq!(session.position, 0);
    case.engine
        .forward(&mut session, &case.prompt, LogitsFor::Last)
        .unwrap();
}

#[test]
fn models_without_a_usable_tower_refuse_images_by_name() {
    let case = Case::load("qwen3_5_dense_vision");
    // --no-vision.
    let engine = Engine::load_with(
        &fixture("qwen3_5_dense_vision"),
        &LoadOptions {
            no_vision: true,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let err = engine.encode_images(&case.images).unwrap_err().to_string();
    assert!(err.contains("--no-vision"), "{err}");
    assert_eq!(engine.vision_bytes(), 0);
    assert!(case.engine.vision_bytes() > 0);
    // qwen3_5_dense's image_token_id (248056) is outside its 512-token vocabulary.
    let engine = Engine::load(&fixture("qwen3_5_dense")).unwrap();
    let err = engine.encode_images(&case.images).unwrap_err().to_string();
    assert!(err.contains("image_token_id 248056"), "{err}");
    // A text-only family.
    let engine = Engine::load(&fixture("qwen3_next_moe")).unwrap();
    let err = engine.encode_images(&case.images).unwrap_err().to_string();
    assert!(err.contains("no vision_config"), "{err}");
}

#[test]
fn images_that_do_not_fit_the_tower_are_refused_by_index() {
    let case = Case::load("qwen3_5_dense_vision");
    let mut odd = case.images[1].clone();
    odd.grid.w = 3;
    let err = case
        .engine
        .encode_images(&[case.images[0].clone(), odd])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("image 1:"), "{err}");
    let mut short = case.images[0].clone();
    short.pixels.pop();
    let err = case.engine.encode_images(&[short]).unwrap_err().to_string();
    assert!(err.contains("pixel values"), "{err}");
}

/// The features and the prompt's logits (every position) of `engine` on `case`'s images.
fn run_with_images(case: &Case, engine: &Engine) -> (Vec<f32>, Vec<f32>) {
    let features = engine.encode_images(&case.images).unwrap();
    let rows = features.iter().flat_map(|f| f.rows.clone()).collect();
    let mut session = engine.new_session();
    engine.attach_images(&mut session, &features).unwrap();
    let logits = engine
        .forward(&mut session, &case.prompt, LogitsFor::All)
        .unwrap();
    (rows, logits)
}

/// Converts `src` into an install under `tmp` and loads it.
fn installed(src: &std::path::Path, quant: WeightFormat, tmp: &TempDir) -> Engine {
    let dst = tmp.0.join(format!("install-{quant}"));
    let manifest = install::convert(src, &dst, quant, &mut |_| true).unwrap();
    assert_eq!(
        manifest.classes.get("vision").map(String::as_str),
        Some("bf16"),
        "{}: the tower is kept as stored",
        src.display()
    );
    Engine::load(&dst).unwrap_or_else(|e| panic!("{}: {e}", dst.display()))
}

#[test]
fn installs_keep_the_tower() {
    for name in FIXTURES {
        let case = Case::load(name);
        let (features, logits) = run_with_images(&case, &case.engine);
        let tmp = TempDir::new(&format!("vision-install-{name}"));
        // bf16: the install holds the checkpoint's bytes, so the runs agree exactly.
        let engine = installed(&fixture(name), WeightFormat::Bf16, &tmp);
        assert_eq!(engine.vision_bytes(), case.engine.vision_bytes(), "{name}");
        // The install's memory plan counts the tower as loaded.
        let plan = install::plan::MemoryPlan::new(engine.config(), WeightFormat::Bf16, 64);
        assert_eq!(plan.vision_bytes as usize, engine.vision_bytes(), "{name}");
        let (f, l) = run_with_images(&case, &engine);
        let (ferr, lerr) = (max_abs_diff(&f, &features), max_abs_diff(&l, &logits));
        println!("{name}: install vision_embeds max|Δ| {ferr:.2e}, logits {lerr:.2e}");
        assert!(
            ferr <= 1e-5,
            "{name}: installed vision_embeds differ by {ferr}"
        );
        assert!(lerr <= 1e-5, "{name}: installed logits differ by {lerr}");
        let (_, reference) = case.reference.f32("vision_embeds");
        assert!(max_abs_diff(&f, &reference) < TOWER_TOLERANCE, "{name}");
        // q8 re-encodes the text projections only: the tower's features are unchanged.
        let engine = installed(&fixture(name), WeightFormat::Q8, &tmp);
        let (f, _) = run_with_images(&case, &engine);
        assert_eq!(f, features, "{name}: a q8 install keeps the tower bf16");
    }
}

#[test]
fn block_fp8_installs_keep_the_tower_unconverted() {
    let name = "qwen3_5_moe_vision";
    let case = Case::load(name);
    let tmp = TempDir::new("vision-fp8-install");
    let (fp8, deq) = (tmp.0.join("fp8"), tmp.0.join("deq"));
    spindle_model::fp8::make::write_fp8_pair(&fixture(name), &fp8, &deq, [32, 48]).unwrap();
    let source = Engine::load(&fp8).unwrap();
    let (features, logits) = run_with_images(&case, &source);
    let engine = installed(&fp8, WeightFormat::Bf16, &tmp);
    let (f, l) = run_with_images(&case, &engine);
    // The FP8 release leaves model.visual unconverted: its features are the bf16 fixture's.
    assert_eq!(f, run_with_images(&case, &case.engine).0);
    assert_eq!(f, features);
    let err = max_abs_diff(&l, &logits);
    println!("{name}: fp8 install logits max|Δ| {err:.2e}");
    assert!(err <= 1e-5, "fp8 install logits differ by {err}");
}

#[test]
fn a_q8_tower_stays_close_to_bf16() {
    let name = "qwen3_5_dense_vision";
    let case = Case::load(name);
    let (features, _) = run_with_images(&case, &case.engine);
    let tmp = TempDir::new("vision-q8-tower");
    let dst = tmp.0.join("install");
    let manifest = install::convert_with(
        &fixture(name),
        &dst,
        WeightFormat::Bf16,
        WeightFormat::Q8,
        &mut |_| true,
    )
    .unwrap();
    // The blocks' and merger's matrices are q8; the patch embedding (a Conv3d kernel) is not.
    assert_eq!(manifest.classes["vision"], "bf16+q8");
    assert_eq!(manifest.vision_format(), WeightFormat::Q8);
    let engine = Engine::load(&dst).unwrap();
    assert!(engine.vision_bytes() < case.engine.vision_bytes());
    // The install's memory plan counts the tower as loaded, at q8.
    let plan = install::plan::MemoryPlan::new(engine.config(), WeightFormat::Bf16, 64)
        .with_vision_format(engine.config(), manifest.vision_format());
    assert_eq!(plan.vision_bytes as usize, engine.vision_bytes());
    let (f, logits) = run_with_images(&case, &engine);
    let rms = |v: &mut dyn Iterator<Item = f32>| {
        let (sum, n) = v.fold((0.0f64, 0usize), |(s, n), x| {
            (s + (x as f64).powi(2), n + 1)
        });
        (sum / n as f64).sqrt()
    };
    let relative =
        rms(&mut f.iter().zip(&features).map(|(a, b)| a - b)) / rms(&mut features.iter().copied());
    let err = max_abs_diff(&f, &features);
    println!("{name}: q8 tower vision_embeds max|Δ| {err:.2e}, relative RMS {relative:.2e}");
    assert!(err > 0.0, "the q8 tower runs its own weights");
    // q8 weights and int8 activations: 1.4% on this fixture; a misread layout gives ~100%.
    assert!(
        relative < 0.03,
        "q8 features differ by {relative} (relative RMS)"
    );
    assert!(logits.iter().all(|x| x.is_finite()));
    let err = install::convert_with(
        &fixture(name),
        &tmp.0.join("q4"),
        WeightFormat::Bf16,
        WeightFormat::Q4,
        &mut |_| true,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("--vision-quant q4"), "{err}");
}
