//! The CUDA backend behind [`super::Backend`]: what it refuses to run, and the lock its
//! sessions take turns under. The refusals are compiled in every build, so they are tested
//! without a GPU.

#[cfg(feature = "cuda")]
use std::mem::ManuallyDrop;
use std::path::Path;
#[cfg(feature = "cuda")]
use std::sync::{Arc, Mutex, MutexGuard};

use spindle_cpu::experts::ExpertResidency;
#[cfg(feature = "cuda")]
use spindle_cpu::session::{BoundaryState, GdnState, KvRows, KvSegment, PleState};
use spindle_cpu::LoadOptions;
#[cfg(feature = "cuda")]
use spindle_cpu::LogitsFor;

#[cfg(feature = "cuda")]
use crate::error::{Result, RuntimeError};
#[cfg(feature = "cuda")]
use crate::measure::KernelTime;
#[cfg(feature = "cuda")]
use crate::prefix::{PrefixKv, PrefixState};
#[cfg(feature = "cuda")]
use spindle_cuda::Rows;

/// Why `options` (or the directory) cannot be run by the CUDA backend, naming the option at
/// fault: the CUDA engine reads Hugging Face checkpoints only and keeps every expert in GPU
/// memory, so installs, `--experts mapped|streamed` and `--expert-slots` are CPU features.
/// `None` when the CUDA backend can take them. (Available in every build, so the refusals are
/// tested without a GPU.)
pub fn cuda_refusal(dir: &Path, options: &LoadOptions) -> Option<String> {
    if spindle_model::install::is_install(dir) {
        return Some(format!(
            "{} is a spindle install (it has a manifest.json); the CUDA backend reads Hugging Face \
             checkpoints only: point --model at the checkpoint the install was converted from \
             (with --quant for q8/q4), or run the install with --device cpu",
            dir.display()
        ));
    }
    match options.experts {
        ExpertResidency::Resident | ExpertResidency::Auto => {}
        other => {
            return Some(format!(
                "--experts {} is not available with --device cuda: the CUDA backend keeps every \
                 expert in GPU memory (use --experts resident or auto, or --device cpu)",
                other.name()
            ))
        }
    }
    if let Some(slots) = options.expert_slots {
        return Some(format!(
            "--expert-slots {slots} is not available with --device cuda: expert slots are a \
             feature of the CPU engine's expert streaming (drop the option, or use --device cpu)"
        ));
    }
    None
}

/// One item's result of [`CudaBackend::forward_batch_step`]: the sampled token (and whether
/// the raw row was finite), and the whole row when it was asked for.
#[cfg(feature = "cuda")]
pub(super) struct StepRow {
    pub sampled: spindle_cuda::Sampled,
    pub logits: Option<Vec<f32>>,
}

/// The CUDA engine and the lock that serializes its use.
///
/// One engine has one stream and one scratch arena, and captures decode steps as CUDA graphs
/// on that stream, so two sessions must never run (or free device memory) at the same time:
/// every forward pass, session creation and drop, and every bench call (sync, bandwidth probe,
/// kernel profile) holds `lock`. Sessions of a server with `--parallel N` therefore take turns
/// step by step on the GPU.
#[cfg(feature = "cuda")]
pub struct CudaBackend {
    engine: spindle_cuda::CudaEngine,
    ordinal: usize,
    lock: Arc<Mutex<()>>,
}

#[cfg(feature = "cuda")]
impl CudaBackend {
    /// Loads `dir` onto GPU `ordinal` (the first `layers` layers when given), after refusing
    /// what only the CPU engine runs (see [`cuda_refusal`]).
    pub(super) fn load(
        dir: &Path,
        ordinal: usize,
        options: &LoadOptions,
        layers: Option<usize>,
    ) -> Result<Self> {
        if let Some(reason) = cuda_refusal(dir, options) {
            return Err(RuntimeError::Unsupported(reason));
        }
        if options.check_weights {
            spindle_model::Checkpoint::open(dir)
                .and_then(|ck| ck.check_finite())
                .map_err(spindle_cpu::EngineError::from)?;
        }
        // Without --quant the weights stay as stored (a block-FP8 checkpoint's in FP8).
        let quant = (options.quant_given
            || options.quant != spindle_model::quant::WeightFormat::Bf16)
            .then_some(options.quant);
        let mut engine =
            spindle_cuda::CudaEngine::load_as(dir, ordinal, quant, layers, !options.no_vision)?;
        if let Some(bytes) = options.kv_pool_bytes {
            engine.set_kv_pool_bytes(bytes)?;
        }
        tracing::info!(
            device = %engine.device_name(),
            graphs = engine.uses_graphs(),
            "model loaded onto CUDA device {ordinal}"
        );
        Ok(CudaBackend {
            engine,
            ordinal,
            lock: Arc::new(Mutex::new(())),
        })
    }

    pub fn engine(&self) -> &spindle_cuda::CudaEngine {
        &self.engine
    }

    /// The GPU's number (`cuda:N`).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn held(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh session, its KV caches allocated for `tokens` tokens when not 0.
    pub(super) fn new_session(&self, tokens: usize) -> Result<CudaSessionGuard> {
        let _held = self.held();
        let session = if tokens == 0 {
            self.engine.new_session()?
        } else {
            self.engine.new_session_with_capacity(tokens)?
        };
        Ok(CudaSessionGuard {
            session: ManuallyDrop::new(session),
            lock: Arc::clone(&self.lock),
            history: Vec::new(),
        })
    }

    /// The engine's forward pass over checked input.
    pub(super) fn forward(
        &self,
        session: &mut CudaSessionGuard,
        ids: &[u32],
        want: LogitsFor,
    ) -> Result<Vec<f32>> {
        let _held = self.held();
        session.feed(ids);
        Ok(self.engine.forward(&mut session.session, ids, want)?)
    }

    /// Runs `images` through the vision tower on the GPU (see `CudaEngine::encode_images`).
    pub(super) fn encode_images(
        &self,
        images: &[spindle_vision::PreparedImage],
    ) -> Result<Vec<Arc<spindle_model::mrope::ImageFeatures>>> {
        let _held = self.held();
        self.engine
            .encode_images(images)
            .map_err(|e| RuntimeError::Image(e.to_string()))
    }

    /// Queues image features on a session (see `CudaEngine::attach_images`).
    pub(super) fn attach_images(
        &self,
        session: &mut CudaSessionGuard,
        features: &[Arc<spindle_model::mrope::ImageFeatures>],
    ) -> Result<()> {
        self.engine
            .attach_images(session.session_mut(), features)
            .map_err(|e| RuntimeError::Image(e.to_string()))
    }

    /// Grows a session's caches to `tokens` tokens (see `CudaEngine::reserve`).
    pub(super) fn reserve(&self, session: &mut CudaSessionGuard, tokens: usize) -> Result<()> {
        let _held = self.held();
        Ok(self.engine.reserve(&mut session.session, tokens)?)
    }

    /// One batched step over checked input (see `CudaEngine::forward_batch`), under the lock.
    pub(super) fn forward_batch(
        &self,
        items: &mut [spindle_cuda::CudaBatchItem<'_>],
    ) -> Vec<Result<Vec<f32>>> {
        let _held = self.held();
        self.engine
            .forward_batch(items)
            .into_iter()
            .map(|r| r.map_err(Into::into))
            .collect()
    }

    /// One batched step over checked input whose next tokens the device sampler chooses from
    /// each item's last row (`rows[n]`); only the ids (and whether each row was finite) come
    /// back, with the whole row of the items `whole` names. `masks` (one entry per item: its
    /// allowed-token bits, or `None`) is called once the step is launched, so it runs on the
    /// host while the GPU runs the forward pass; the masks are then uploaded and applied by the
    /// sampling kernels as they read the logits.
    pub(super) fn forward_batch_step(
        &self,
        items: &mut [spindle_cuda::CudaBatchItem<'_>],
        rows: &[spindle_cuda::RowSampling<'_>],
        whole: &[bool],
        masks: impl FnOnce() -> Vec<Option<Vec<u32>>>,
    ) -> Result<Vec<StepRow>> {
        let _held = self.held();
        let logits = self.engine.forward_batch_device(items)?;
        // The forward pass is queued on the GPU: the host computes the masks meanwhile.
        let masks = masks();
        let mut sampled = Vec::with_capacity(rows.len());
        for (k, chunk) in rows.chunks(spindle_cuda::MAX_SAMPLE_ROWS).enumerate() {
            let first = k * spindle_cuda::MAX_SAMPLE_ROWS;
            let at = logits.row_ptr(logits.item_rows(first).start);
            let chunk_masks: Vec<Option<&[u32]>> = (first..first + chunk.len())
                .map(|n| masks.get(n).and_then(|m| m.as_deref()))
                .collect();
            sampled.extend(self.engine.sample_rows_masked(at, chunk, &chunk_masks)?);
        }
        sampled
            .into_iter()
            .enumerate()
            .map(|(n, sampled)| {
                let logits = if whole.get(n).copied().unwrap_or(false) {
                    Some(self.engine.download_logits_row(&logits, n)?)
                } else {
                    None
                };
                Ok(StepRow { sampled, logits })
            })
            .collect()
    }

    /// One decode step of a checked token, the next token chosen on the device.
    pub(super) fn decode_greedy(&self, session: &mut CudaSessionGuard, id: u32) -> Result<u32> {
        let _held = self.held();
        session.feed(&[id]);
        Ok(self.engine.decode_argmax(&mut session.session, id)?)
    }

    /// Where the hidden state of a sequence fed `ids` first goes non-finite, in words (e.g.
    /// `in layer 2 (its FFN)`), found by replaying them in a fresh session with a check after
    /// every sublayer; `None` when the replay stays finite or cannot run.
    pub(super) fn locate_non_finite(&self, ids: &[u32]) -> Option<String> {
        if ids.is_empty() {
            return None;
        }
        let _held = self.held();
        match self.engine.locate_non_finite(ids) {
            Ok(site) => site.map(|site| site.to_string()),
            Err(e) => {
                tracing::warn!(error = %e, "could not replay the sequence to locate its non-finite value");
                None
            }
        }
    }

    /// The attention layers' key and value rows of tokens `[from, position)`, for the prefix
    /// cache: copied into device buffers of their own, or (when `device` is false, or the
    /// device has no room for them) to the host in the CPU session's layout.
    pub(super) fn capture_kv(
        &self,
        session: &CudaSessionGuard,
        from: usize,
        device: bool,
    ) -> Result<PrefixKv> {
        let _held = self.held();
        if device {
            match self.engine.stash_kv_rows(&session.session, from) {
                Ok(kv) => return Ok(PrefixKv::Device(kv)),
                Err(e) => tracing::debug!("KV rows cached on the host: {e}"),
            }
        }
        let layers = self.engine.read_kv_rows(&session.session, from)?;
        Ok(PrefixKv::Host(KvSegment {
            start: from,
            end: session.session.position,
            layers: layers
                .into_iter()
                .map(|layer| match layer {
                    Some(spindle_cuda::HostLayer::Attention {
                        keys,
                        values,
                        indexer,
                    }) => Some(KvRows {
                        keys,
                        values,
                        indexer_keys: indexer,
                    }),
                    _ => None,
                })
                .collect(),
        }))
    }

    /// Every GDN layer's state at the session's position, for the prefix cache: on the
    /// device, or on the host (as [`Self::capture_kv`]).
    pub(super) fn capture_state(
        &self,
        session: &CudaSessionGuard,
        device: bool,
    ) -> Result<PrefixState> {
        let _held = self.held();
        if device {
            match self.engine.stash_recurrent(&session.session) {
                Ok(state) => return Ok(PrefixState::Device(state)),
                Err(e) => tracing::debug!("GDN state cached on the host: {e}"),
            }
        }
        let layers = self.engine.read_recurrent(&session.session)?;
        let ple = self.engine.read_ple(&session.session)?.map(|p| PleState {
            history: p.history.into_iter().map(|id| id as u32).collect(),
            conv: p.conv,
        });
        Ok(PrefixState::Host(BoundaryState {
            position: session.session.position,
            layers: layers
                .into_iter()
                .map(|layer| match layer {
                    Some(spindle_cuda::HostLayer::Gdn { conv, recurrent }) => {
                        Some(GdnState { conv, recurrent })
                    }
                    _ => None,
                })
                .collect(),
            ple,
        }))
    }

    /// A new session holding a cached prefix (see `Backend::restore_prefix`), its caches
    /// allocated for `capacity` tokens; the pieces may be on the host or the device, in any mix.
    pub(super) fn restore(
        &self,
        segments: &[&PrefixKv],
        state: &PrefixState,
        ids: &[u32],
        capacity: usize,
    ) -> Result<CudaSessionGuard> {
        let layer_count = match state {
            PrefixState::Host(h) => h.layers.len(),
            PrefixState::Device(d) => d.layer_count(),
        };
        let mut position = 0;
        for segment in segments {
            let layers = match segment {
                PrefixKv::Host(h) => h.layers.len(),
                PrefixKv::Device(_) => layer_count,
                PrefixKv::Paged(_) => {
                    return Err(crate::error::RuntimeError::Request(
                        "a cached prefix held in the CPU engine's KV pool was given to CUDA".into(),
                    ))
                }
            };
            if segment.start() != position || layers != layer_count {
                return Err(crate::error::RuntimeError::Request(format!(
                    "cached prefix segments do not join up at position {position}"
                )));
            }
            position = segment.end();
        }
        if position != state.position() {
            return Err(crate::error::RuntimeError::Request(format!(
                "a cached prefix's segments end at {position} but its state is at {}",
                state.position()
            )));
        }
        let gdn: Vec<Option<[Rows<'_>; 2]>> = (0..layer_count)
            .map(|n| match state {
                PrefixState::Host(h) => h.layers[n]
                    .as_ref()
                    .map(|g| [Rows::Host(&g.conv), Rows::Host(&g.recurrent)]),
                PrefixState::Device(d) => d.layer(n),
            })
            .collect();
        let _held = self.held();
        // Pieces in the KV pool's blocks are mapped into the new session's table (no copy);
        // a prefix with pieces on the host is written row by row (pool pieces read out first).
        let pooled: Vec<&spindle_cuda::DeviceKv> = segments
            .iter()
            .filter_map(|s| match s {
                PrefixKv::Device(d) => Some(d),
                _ => None,
            })
            .collect();
        let mut session = if pooled.len() == segments.len() {
            self.engine
                .session_from_blocks(state.position(), &pooled, &gdn, capacity)?
        } else {
            let read: Vec<Option<Vec<Option<spindle_cuda::HostLayer>>>> = segments
                .iter()
                .map(|s| match s {
                    PrefixKv::Device(d) => self.engine.read_device_kv(d).map(Some),
                    _ => Ok(None),
                })
                .collect::<std::result::Result<_, _>>()?;
            let layers: Vec<spindle_cuda::PrefixLayer> = (0..layer_count)
                .map(|n| match gdn[n] {
                    Some([conv, recurrent]) => spindle_cuda::PrefixLayer::Gdn { conv, recurrent },
                    None => {
                        let rows: Vec<[Rows; 2]> = segments
                            .iter()
                            .zip(&read)
                            .filter_map(|(s, r)| kv_rows(s, r.as_deref(), n))
                            .collect();
                        spindle_cuda::PrefixLayer::Attention {
                            keys: rows.iter().map(|[k, _]| *k).collect(),
                            values: rows.iter().map(|[_, v]| *v).collect(),
                            indexer: segments.iter().filter_map(|s| indexer_rows(s, n)).collect(),
                        }
                    }
                })
                .collect();
            self.engine
                .session_from_prefix(state.position(), &layers, capacity)?
        };
        // qwen4_exp's PLE state (its pieces are on the host: the device ones are refused).
        if let PrefixState::Host(BoundaryState { ple: Some(ple), .. }) = state {
            let ple = spindle_cuda::HostPle {
                history: ple.history.iter().map(|&id| id as i32).collect(),
                conv: ple.conv.clone(),
            };
            self.engine.write_ple(&mut session, &ple)?;
        }
        Ok(CudaSessionGuard {
            session: ManuallyDrop::new(session),
            lock: Arc::clone(&self.lock),
            history: ids.to_vec(),
        })
    }

    /// Waits for the device.
    pub(super) fn sync(&self) -> Result<()> {
        let _held = self.held();
        Ok(self.engine.sync()?)
    }

    /// Read bandwidth of device memory, bytes/s (see `CudaEngine::measure_bandwidth`).
    pub(super) fn measure_bandwidth(&self, bytes: usize) -> Result<f64> {
        let _held = self.held();
        Ok(self.engine.measure_bandwidth(bytes)?)
    }

    /// The kernel time recorded since the last call (`SPINDLE_CUDA_PROFILE=1`; else empty).
    pub(super) fn kernel_profile(&self) -> Result<Vec<KernelTime>> {
        let _held = self.held();
        let lines = self.engine.device().profile_report()?;
        Ok(lines
            .into_iter()
            .map(|k| KernelTime {
                name: k.name,
                grid: k.grid,
                calls: k.calls,
                total_us: k.total_us,
            })
            .collect())
    }
}

/// A CUDA session that is dropped under its engine's lock (freeing device memory enqueues
/// work on the engine's stream).
#[cfg(feature = "cuda")]
pub struct CudaSessionGuard {
    session: ManuallyDrop<spindle_cuda::CudaSession>,
    lock: Arc<Mutex<()>>,
    /// Every id fed to the session, so a step whose logits come back non-finite can be
    /// replayed with checks ([`CudaBackend::locate_non_finite`]).
    history: Vec<u32>,
}

#[cfg(feature = "cuda")]
impl CudaSessionGuard {
    pub fn session(&self) -> &spindle_cuda::CudaSession {
        &self.session
    }

    pub(super) fn session_mut(&mut self) -> &mut spindle_cuda::CudaSession {
        &mut self.session
    }

    /// Records ids about to be fed to the session.
    pub(super) fn feed(&mut self, ids: &[u32]) {
        self.history.extend_from_slice(ids);
    }

    /// The ids a replay would feed to locate a non-finite value: none once an image has been
    /// fed, since a replay of the ids alone would not place the image's rows and would look
    /// in the wrong place (the error then suggests the CPU, which checks every step).
    pub(super) fn replay_ids(&self) -> &[u32] {
        if self.session.rope.images_started > 0 {
            &[]
        } else {
            &self.history
        }
    }
}

#[cfg(feature = "cuda")]
impl Drop for CudaSessionGuard {
    fn drop(&mut self) {
        let _held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `session` is dropped exactly once, here, and never used afterwards.
        unsafe { ManuallyDrop::drop(&mut self.session) }
    }
}

/// Layer `n`'s QSA indexer keys in a cached segment (qwen4_exp's, on the host: the device
/// pieces do not carry them, so such a model caches on the host), `None` when it has none.
#[cfg(feature = "cuda")]
fn indexer_rows(segment: &PrefixKv, n: usize) -> Option<Rows<'_>> {
    match segment {
        PrefixKv::Host(h) => h.layers[n]
            .as_ref()
            .filter(|r| !r.indexer_keys.is_empty())
            .map(|r| Rows::Host(&r.indexer_keys)),
        PrefixKv::Device(_) | PrefixKv::Paged(_) => None,
    }
}

/// Layer `n`'s keys and values in `segment` (`None` for a GDN layer): its host rows, or for a
/// piece in the KV pool the rows `read` out of it.
#[cfg(feature = "cuda")]
fn kv_rows<'a>(
    segment: &'a PrefixKv,
    read: Option<&'a [Option<spindle_cuda::HostLayer>]>,
    n: usize,
) -> Option<[Rows<'a>; 2]> {
    match segment {
        PrefixKv::Host(h) => h.layers[n]
            .as_ref()
            .map(|r| [Rows::Host(&r.keys), Rows::Host(&r.values)]),
        PrefixKv::Device(_) => match read?.get(n)? {
            Some(spindle_cuda::HostLayer::Attention { keys, values, .. }) => {
                Some([Rows::Host(keys), Rows::Host(values)])
            }
            _ => None,
        },
        // Refused by `restore` before any row is read.
        PrefixKv::Paged(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_refuses_cpu_only_options_by_name() {
        let dir = Path::new("no-such-checkpoint");
        assert_eq!(cuda_refusal(dir, &LoadOptions::default()), None);
        let auto = LoadOptions {
            experts: ExpertResidency::Auto,
            ..LoadOptions::default()
        };
        assert_eq!(cuda_refusal(dir, &auto), None);
        for (experts, name) in [
            (ExpertResidency::Streamed, "--experts streamed"),
            (ExpertResidency::Mapped, "--experts mapped"),
        ] {
            let options = LoadOptions {
                experts,
                ..LoadOptions::default()
            };
            let why = cuda_refusal(dir, &options).expect("refused");
            assert!(why.contains(name) && why.contains("--device cpu"), "{why}");
        }
        let slots = LoadOptions {
            expert_slots: Some(8),
            ..LoadOptions::default()
        };
        let why = cuda_refusal(dir, &slots).expect("refused");
        assert!(why.contains("--expert-slots 8"), "{why}");
        // CUDA has a KV block pool too: --kv-pool sizes it.
        let pool = LoadOptions {
            kv_pool_bytes: Some(1 << 30),
            ..LoadOptions::default()
        };
        assert_eq!(cuda_refusal(dir, &pool), None);
    }

    #[test]
    fn cuda_refuses_an_install_naming_the_directory() {
        let tmp = std::env::temp_dir().join(format!("spindle-backend-test-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::write(tmp.join("manifest.json"), "{}").unwrap();
        let why = cuda_refusal(&tmp, &LoadOptions::default()).expect("refused");
        let _ = std::fs::remove_dir_all(&tmp);
        assert!(
            why.contains("spindle install")
                && why.contains("Hugging Face")
                && why.contains("--device cpu")
                && why.contains(&tmp.display().to_string()),
            "{why}"
        );
    }
}
