//! A session's state read out (to the host, or kept on the device) and a session built from
//! such pieces: the prefix cache's capture and restore on CUDA. Host pieces keep the CPU
//! session's layout row for row (keys and values `[tokens, n_kv, d]`, GDN conv `[K−1, C]` and
//! recurrent `[n_v, d_k, d_v]`, all f32), so a host piece has one format for both backends.
//! On the device, a prefix's keys and values stay in the KV pool's blocks: capture takes a
//! reference to the session's blocks ([`DeviceKv`], no copy) and restore maps them into the new
//! session's block table (the block the prefix ends in mid-way is copied when the session first
//! writes into it). GDN states are copied into buffers of their own ([`DeviceState`]) and back.

use crate::device::{DevBuf, MappedHost};
use crate::error::{CudaError, Result};
use crate::paged::{table_from_pieces, BlockTable, DeviceKv};
use crate::session::{CudaSession, LayerState};
use crate::{flow, CudaEngine};

/// One layer's piece of a prefix on the host.
pub enum HostLayer {
    /// Key and value rows of a run of tokens, `[tokens, n_kv, d]` each, and (qwen4_exp) the
    /// QSA indexer's raw keys of those tokens, `[tokens, d_i]` (empty without QSA).
    Attention {
        keys: Vec<f32>,
        values: Vec<f32>,
        indexer: Vec<f32>,
    },
    /// The GDN state at one position.
    Gdn { conv: Vec<f32>, recurrent: Vec<f32> },
}

/// Where a piece of a cached prefix is: f32 values on the host, or `len` f32 at a device
/// address (inside a [`DeviceKv`] or [`DeviceState`] the caller keeps alive).
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    Host(&'a [f32]),
    Device { ptr: u64, len: usize },
}

impl Rows<'_> {
    fn len(&self) -> usize {
        match self {
            Rows::Host(v) => v.len(),
            Rows::Device { len, .. } => *len,
        }
    }
}

/// What [`CudaEngine::session_from_prefix`] writes into one layer: key and value rows in
/// order from position 0 (one piece per cached segment; with QSA also the indexer's raw keys,
/// from which the block keys are recomputed), or the GDN state at the prefix's end.
pub enum PrefixLayer<'a> {
    Attention {
        keys: Vec<Rows<'a>>,
        values: Vec<Rows<'a>>,
        /// qwen4_exp: the QSA indexer's raw keys, pieces as `keys` (none without QSA).
        indexer: Vec<Rows<'a>>,
    },
    Gdn {
        conv: Rows<'a>,
        recurrent: Rows<'a>,
    },
}

/// qwen4_exp's PLE state at one position on the host: the n-gram history (the last
/// ngram_size − 1 ids) and each PLE layer's conv rows, in the session's layout.
#[derive(Clone, Debug, PartialEq)]
pub struct HostPle {
    pub history: Vec<i32>,
    pub conv: Vec<Vec<f32>>,
}

/// Every GDN layer's conv and recurrent state at one position, in device memory of its own
/// (one allocation: `store`, which `layers` view).
pub struct DeviceState {
    position: usize,
    layers: Vec<Option<[DevBuf<f32>; 2]>>,
    /// The allocation the layers' buffers view; kept alive with them.
    _store: DevBuf<f32>,
}

impl DeviceState {
    pub fn position(&self) -> usize {
        self.position
    }

    /// Layer `n`'s conv and recurrent state (`None` for an attention layer), valid while this
    /// state lives.
    pub fn layer(&self, n: usize) -> Option<[Rows<'static>; 2]> {
        let [conv, recurrent] = self.layers.get(n)?.as_ref()?;
        let at = |b: &DevBuf<f32>| Rows::Device {
            ptr: b.ptr(),
            len: b.len(),
        };
        Some([at(conv), at(recurrent)])
    }

    /// Layers, attention layers included (as `None`).
    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }

    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|[c, r]| (c.len() + r.len()) * 4)
            .sum()
    }
}

impl std::fmt::Debug for DeviceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceState(at {}, {} bytes)",
            self.position,
            self.bytes()
        )
    }
}

impl CudaEngine {
    /// Why this model's prefix pieces cannot be kept on the device, if they cannot:
    /// qwen4_exp's QSA indexer keys and PLE state go through the host pieces
    /// ([`CudaEngine::read_kv_rows`], [`CudaEngine::read_ple`]), which carry them.
    pub fn device_pieces_refusal(&self) -> Option<String> {
        (self.config.qsa.is_some() || self.config.ple.is_some()).then(|| {
            "qwen4_exp's QSA indexer keys and PLE state are cached on the host, not on the device".into()
        })
    }

    /// The attention layers' key and value rows of tokens `[from, position)` (`None` for a
    /// GDN layer).
    pub fn read_kv_rows(
        &self,
        session: &CudaSession,
        from: usize,
    ) -> Result<Vec<Option<HostLayer>>> {
        refuse_imaged(session)?;
        let to = session.position;
        if from > to {
            return Err(CudaError::Unsupported(format!(
                "KV rows from position {from} asked of a session at position {to}"
            )));
        }
        let mut layers = self.read_rows(&session.kv.table, 0, from, to)?;
        // qwen4_exp: each attention layer's raw indexer keys of the same tokens.
        let d_i = self.config.qsa.as_ref().map_or(0, |q| q.head_dim);
        for (layer, state) in layers.iter_mut().zip(&session.layers) {
            if let (
                Some(HostLayer::Attention { indexer, .. }),
                LayerState::Attention(crate::session::KvCache {
                    indexer: Some(ix), ..
                }),
            ) = (layer, state)
            {
                *indexer = self
                    .dev
                    .download(&ix.raw_keys, from * d_i, (to - from) * d_i)?;
            }
        }
        Ok(layers)
    }

    /// The key and value rows of a piece of the prefix cache held in the pool's blocks, on the
    /// host (`None` for a GDN layer).
    pub fn read_device_kv(&self, piece: &DeviceKv) -> Result<Vec<Option<HostLayer>>> {
        let base = piece.start() / spindle_model::paged::BLOCK_TOKENS;
        self.read_rows(piece.table(), base, piece.start(), piece.end())
    }

    /// Rows `[from, to)` of every attention layer read through `table` (entry 0 = block
    /// `base`): gathered on the device, then one copy per layer and kind to the host.
    fn read_rows(
        &self,
        table: &BlockTable,
        base: usize,
        from: usize,
        to: usize,
    ) -> Result<Vec<Option<HostLayer>>> {
        let width = self.config.attention.num_kv_heads * self.config.attention.head_dim;
        let gathered = self.dev.zeros::<f32>((to - from) * width)?;
        (0..self.config.layers.len())
            .map(|n| {
                if self.kv_pool.layer(n).is_none() {
                    return Ok(None);
                }
                let mut kinds = Vec::with_capacity(2);
                for values in [false, true] {
                    let mut at = 0;
                    table.runs(base, from, to, |id, r, rows| {
                        let bytes = rows * width * 4;
                        self.dev.copy_raw(
                            table.row_addr(n, values, id, r),
                            gathered.at(at),
                            bytes,
                        )?;
                        at += rows * width;
                        Ok(())
                    })?;
                    kinds.push(self.download(gathered.ptr(), (to - from) * width)?);
                }
                let values = kinds.pop().expect("two kinds");
                let keys = kinds.pop().expect("two kinds");
                Ok(Some(HostLayer::Attention {
                    keys,
                    values,
                    indexer: Vec::new(),
                }))
            })
            .collect()
    }

    /// Every GDN layer's conv and recurrent state at the session's position (`None` for an
    /// attention layer).
    pub fn read_recurrent(&self, session: &CudaSession) -> Result<Vec<Option<HostLayer>>> {
        refuse_imaged(session)?;
        session
            .layers
            .iter()
            .map(|layer| match layer {
                LayerState::Gdn(g) => Ok(Some(HostLayer::Gdn {
                    conv: self.download(g.conv.ptr(), g.conv.len())?,
                    recurrent: self.download(g.recurrent.ptr(), g.recurrent.len())?,
                })),
                LayerState::Attention(_) => Ok(None),
            })
            .collect()
    }

    /// A new session at `position` holding a cached prefix, its caches allocated for at
    /// least `capacity` tokens. Its next step continues as the session the pieces were read
    /// from would have.
    pub fn session_from_prefix(
        &self,
        position: usize,
        layers: &[PrefixLayer<'_>],
        capacity: usize,
    ) -> Result<CudaSession> {
        let mut session = self.new_session()?;
        if layers.len() != session.layers.len() {
            return Err(CudaError::Unsupported(format!(
                "a cached prefix has {} layers but the model {}",
                layers.len(),
                session.layers.len()
            )));
        }
        flow::ensure_capacity(self, &mut session, capacity.max(position))?;
        let width = self.config.attention.num_kv_heads * self.config.attention.head_dim;
        for (n, (state, piece)) in session.layers.iter_mut().zip(layers).enumerate() {
            match (state, piece) {
                (
                    LayerState::Attention(kv),
                    PrefixLayer::Attention {
                        keys,
                        values,
                        indexer,
                    },
                ) => {
                    for (is_values, rows) in [(false, keys), (true, values)] {
                        let held: usize = rows.iter().map(Rows::len).sum();
                        if held != position * width {
                            return Err(CudaError::Unsupported(format!(
                                "layer {n}'s cached rows hold {} tokens, not {position}",
                                held / width.max(1)
                            )));
                        }
                        let mut at = 0;
                        for part in rows {
                            let tokens = part.len() / width.max(1);
                            let uploaded;
                            let src = match *part {
                                Rows::Host(data) => {
                                    uploaded = self.dev.upload(data)?;
                                    uploaded.ptr()
                                }
                                Rows::Device { ptr, .. } => ptr,
                            };
                            let table = &session.kv.table;
                            let mut read = 0;
                            table.runs(0, at, at + tokens, |id, r, count| {
                                let bytes = count * width * 4;
                                self.dev.copy_raw(
                                    src + (read * width * 4) as u64,
                                    table.row_addr(n, is_values, id, r),
                                    bytes,
                                )?;
                                read += count;
                                Ok(())
                            })?;
                            at += tokens;
                        }
                    }
                    self.restore_indexer(n, kv, indexer, position)?;
                }
                (LayerState::Gdn(g), PrefixLayer::Gdn { conv, recurrent }) => {
                    put_gdn(self, n, g, conv, recurrent)?;
                }
                _ => {
                    return Err(CudaError::Unsupported(format!(
                        "layer {n}'s kind differs in a cached prefix"
                    )))
                }
            }
        }
        session.position = position;
        Ok(session)
    }

    /// A new session at `position` whose keys and values are the blocks of `pieces` (contiguous
    /// from 0, in order; mapped into its block table, not copied) and whose GDN layers hold
    /// `gdn` (one entry per layer: conv and recurrent state, `None` for an attention layer),
    /// room made for `capacity` tokens. The block the prefix ends in mid-way stays shared until
    /// the session first writes into it (then it gets a copy of its own).
    pub fn session_from_blocks(
        &self,
        position: usize,
        pieces: &[&DeviceKv],
        gdn: &[Option<[Rows<'_>; 2]>],
        capacity: usize,
    ) -> Result<CudaSession> {
        self.refuse_device_pieces()?;
        let mut session = self.new_session()?;
        if gdn.len() != session.layers.len() {
            return Err(CudaError::Unsupported(format!(
                "a cached prefix has {} layers but the model {}",
                gdn.len(),
                session.layers.len()
            )));
        }
        let mut at = 0;
        for piece in pieces {
            if piece.start() != at {
                return Err(CudaError::Unsupported(format!(
                    "cached prefix pieces do not join up at position {at}"
                )));
            }
            at = piece.end();
        }
        if at != position {
            return Err(CudaError::Unsupported(format!(
                "cached prefix pieces end at {at}, not at {position}"
            )));
        }
        let table = table_from_pieces(&self.kv_pool, pieces, position)?;
        session.kv.set(&self.dev, table)?;
        session.position = position;
        for (n, (state, piece)) in session.layers.iter_mut().zip(gdn).enumerate() {
            match (state, piece) {
                (LayerState::Gdn(g), Some([conv, recurrent])) => {
                    put_gdn(self, n, g, conv, recurrent)?
                }
                (LayerState::Attention(_), None) => {}
                _ => {
                    return Err(CudaError::Unsupported(format!(
                        "layer {n}'s kind differs in a cached prefix"
                    )))
                }
            }
        }
        flow::ensure_capacity(self, &mut session, capacity.max(position))?;
        Ok(session)
    }

    /// The attention layers' keys and values of tokens `[from, position)` as references to the
    /// session's blocks (no copy; the session copies a block it shares before writing into it).
    pub fn stash_kv_rows(&self, session: &CudaSession, from: usize) -> Result<DeviceKv> {
        self.refuse_device_pieces()?;
        refuse_imaged(session)?;
        let to = session.position;
        if from > to {
            return Err(CudaError::Unsupported(format!(
                "KV rows from position {from} asked of a session at position {to}"
            )));
        }
        Ok(DeviceKv::new(&session.kv.table, from, to))
    }

    /// Every GDN layer's conv and recurrent state at the session's position, copied into
    /// device buffers of their own.
    pub fn stash_recurrent(&self, session: &CudaSession) -> Result<DeviceState> {
        self.refuse_device_pieces()?;
        let total = session
            .layers
            .iter()
            .map(|layer| match layer {
                LayerState::Gdn(g) => g.conv.len() + g.recurrent.len(),
                LayerState::Attention(_) => 0,
            })
            .sum();
        // One allocation for all layers (a snapshot of 30 layers as 60 allocations took ~1 ms).
        let store = self.dev.zeros::<f32>(total)?;
        let mut used = 0;
        let mut copy = |src: u64, len: usize| -> Result<DevBuf<f32>> {
            let view = store.view(used, len);
            if len > 0 {
                self.dev.copy_raw(src, view.ptr(), len * 4)?;
            }
            used += len;
            Ok(view)
        };
        let layers = session
            .layers
            .iter()
            .map(|layer| match layer {
                LayerState::Gdn(g) => Ok(Some([
                    copy(g.conv.ptr(), g.conv.len())?,
                    copy(g.recurrent.ptr(), g.recurrent.len())?,
                ])),
                LayerState::Attention(_) => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceState {
            position: session.position,
            layers,
            _store: store,
        })
    }

    /// Writes `rows` at device address `dst`: uploaded from the host, or copied on the device.
    fn put(&self, dst: u64, rows: &Rows<'_>) -> Result<()> {
        match *rows {
            Rows::Host(data) => self.upload(dst, data),
            Rows::Device { len: 0, .. } => Ok(()),
            Rows::Device { ptr, len } => self.dev.copy_raw(ptr, dst, len * 4),
        }
    }

    /// `len` f32 at device address `src`, copied to the host through the page-locked staging.
    fn download(&self, src: u64, len: usize) -> Result<Vec<f32>> {
        let mut staging = self.staging()?;
        let staging = staging.as_mut().expect("allocated by staging()");
        self.dev.download_staged(staging, src, len)
    }

    /// Copies `data` to device address `dst` through the page-locked staging.
    fn upload(&self, dst: u64, data: &[f32]) -> Result<()> {
        let mut staging = self.staging()?;
        let staging = staging.as_mut().expect("allocated by staging()");
        self.dev.upload_staged(staging, dst, data)
    }

    fn staging(&self) -> Result<std::sync::MutexGuard<'_, Option<MappedHost>>> {
        const STAGING_BYTES: usize = 64 << 20;
        let mut staging = self
            .prefix_staging
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if staging.is_none() {
            *staging = Some(self.dev.mapped_host(STAGING_BYTES)?);
        }
        Ok(staging)
    }

    /// qwen4_exp's PLE state at the session's position (`None` for the other families).
    pub fn read_ple(&self, session: &CudaSession) -> Result<Option<HostPle>> {
        refuse_imaged(session)?;
        let Some(ple) = &session.ple else {
            return Ok(None);
        };
        Ok(Some(HostPle {
            history: self.dev.download(&ple.history, 0, ple.history.len())?,
            conv: ple
                .conv
                .iter()
                .map(|c| self.dev.download(c, 0, c.len()))
                .collect::<Result<_>>()?,
        }))
    }

    /// Writes qwen4_exp's PLE state (as [`CudaEngine::read_ple`] read it) into `session`, after
    /// [`CudaEngine::session_from_prefix`]: the n-gram history and each PLE layer's conv rows.
    pub fn write_ple(&self, session: &mut CudaSession, ple: &HostPle) -> Result<()> {
        let Some(state) = &mut session.ple else {
            return Err(CudaError::Unsupported(
                "a cached prefix carries PLE state but the model has no PLE layers".into(),
            ));
        };
        let fits = ple.history.len() == state.history.len()
            && ple.conv.len() == state.conv.len()
            && ple
                .conv
                .iter()
                .zip(&state.conv)
                .all(|(a, b)| a.len() == b.len());
        if !fits {
            return Err(CudaError::Unsupported(
                "a cached prefix's PLE state does not fit the model".into(),
            ));
        }
        self.dev.write(&mut state.history, 0, &ple.history)?;
        for (rows, buf) in ple.conv.iter().zip(&mut state.conv) {
            self.upload(buf.ptr(), rows)?;
        }
        Ok(())
    }

    /// Layer `n`'s QSA indexer from cached raw keys (pieces in order from position 0): the
    /// raw keys written, the block keys of every complete block recomputed from them. Nothing
    /// for a layer without QSA, which must be given no indexer rows.
    fn restore_indexer(
        &self,
        n: usize,
        kv: &crate::session::KvCache,
        rows: &[Rows<'_>],
        position: usize,
    ) -> Result<()> {
        let (Some(ix), Some(q)) = (kv.indexer.as_ref(), self.config.qsa.as_ref()) else {
            if rows.iter().any(|r| r.len() > 0) {
                return Err(CudaError::Unsupported(format!(
                    "layer {n}'s cached prefix holds QSA indexer keys but the layer has no indexer"
                )));
            }
            return Ok(());
        };
        let held: usize = rows.iter().map(Rows::len).sum();
        if held != position * q.head_dim {
            return Err(CudaError::Unsupported(format!(
                "layer {n}'s cached indexer keys hold {} tokens, not {position}",
                held / q.head_dim.max(1)
            )));
        }
        let mut at = 0;
        for part in rows {
            self.put(ix.raw_keys.at(at), part)?;
            at += part.len();
        }
        let crate::weights::GpuMixer::Attention(w) = &self.gpu.layers[n].mixer else {
            return Err(CudaError::Unsupported(format!(
                "layer {n}'s kind differs in a cached prefix"
            )));
        };
        let Some(indexer_w) = w.indexer.as_ref() else {
            return Err(CudaError::Unsupported(format!(
                "layer {n} has indexer keys but no indexer weights"
            )));
        };
        crate::attention::rebuild_block_keys(
            &self.dev,
            &self.config,
            indexer_w,
            &self.inv_freq,
            kv,
            position,
        )
    }

    fn refuse_device_pieces(&self) -> Result<()> {
        match self.device_pieces_refusal() {
            Some(why) => Err(CudaError::Unsupported(why)),
            None => Ok(()),
        }
    }
}

/// Writes a cached GDN state into layer `n`'s state.
fn put_gdn(
    e: &CudaEngine,
    n: usize,
    g: &mut crate::session::GdnState,
    conv: &Rows<'_>,
    recurrent: &Rows<'_>,
) -> Result<()> {
    if conv.len() != g.conv.len() || recurrent.len() != g.recurrent.len() {
        return Err(CudaError::Unsupported(format!(
            "layer {n}'s cached GDN state does not fit the model"
        )));
    }
    e.put(g.conv.ptr(), conv)?;
    e.put(g.recurrent.ptr(), recurrent)
}

/// A restored session starts at rope_delta 0 with no image fed: state that depends on an image
/// is never cached (as on the CPU; images queued but not reached yet do not count).
fn refuse_imaged(session: &CudaSession) -> Result<()> {
    if session.rope.images_started > 0 {
        return Err(CudaError::Unsupported(
            "a session past an image's pads cannot be cached (its rotary positions are not its token positions)".into(),
        ));
    }
    Ok(())
}
