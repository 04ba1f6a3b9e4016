//! A session's state read out (to the host, or into device buffers of its own) and a session
//! built from such pieces: the prefix cache's capture and restore on CUDA. The device caches
//! keep the CPU session's layout row for row (keys and values `[tokens, n_kv, d]`, GDN conv
//! `[K−1, C]` and recurrent `[n_v, d_k, d_v]`, all f32), so a host piece has one format for
//! both backends. Pieces kept on the device ([`DeviceKv`], [`DeviceState`]) are captured and
//! restored by copies inside device memory: a 4,000-token prefix of the 40-layer 35B-A3B
//! shape took 36 ms to restore and 40-100 ms per snapshot through the host.

use std::sync::Arc;

use crate::device::{DevBuf, MappedHost};
use crate::error::{CudaError, Result};
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

/// The attention layers' key and value rows of tokens `[start, end)` in device memory of their
/// own. Splitting one shares its buffers between the halves (no copy): the buffers are freed
/// when both halves are gone.
#[derive(Clone)]
pub struct DeviceKv {
    start: usize,
    end: usize,
    /// The position of the buffers' first row.
    base: usize,
    /// f32 per token row (n_kv · d).
    width: usize,
    /// Per layer (`None` for a GDN layer): keys and values of rows `base..`.
    layers: Arc<Vec<Option<[DevBuf<f32>; 2]>>>,
}

impl DeviceKv {
    pub fn start(&self) -> usize {
        self.start
    }

    pub fn end(&self) -> usize {
        self.end
    }

    /// Device bytes of this segment's rows.
    pub fn bytes(&self) -> usize {
        let layers = self.layers.iter().filter(|l| l.is_some()).count();
        layers * 2 * (self.end - self.start) * self.width * 4
    }

    /// `[start, at)` and `[at, end)`, sharing this segment's buffers.
    pub fn split_at(&self, at: usize) -> (DeviceKv, DeviceKv) {
        assert!(
            self.start <= at && at <= self.end,
            "split of a KV segment outside it"
        );
        let head = DeviceKv {
            end: at,
            ..self.clone()
        };
        let tail = DeviceKv {
            start: at,
            ..self.clone()
        };
        (head, tail)
    }

    /// Layer `n`'s keys and values of this segment's rows (`None` for a GDN layer), valid
    /// while this segment lives.
    pub fn rows(&self, n: usize) -> Option<[Rows<'static>; 2]> {
        let [keys, values] = self.layers.get(n)?.as_ref()?;
        let skip = (self.start - self.base) * self.width;
        let len = (self.end - self.start) * self.width;
        let at = |b: &DevBuf<f32>| Rows::Device {
            ptr: b.ptr() + (skip * 4) as u64,
            len,
        };
        Some([at(keys), at(values)])
    }
}

impl std::fmt::Debug for DeviceKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceKv({}..{}, {} bytes)",
            self.start,
            self.end,
            self.bytes()
        )
    }
}

/// Every GDN layer's conv and recurrent state at one position, in device memory of its own.
pub struct DeviceState {
    position: usize,
    layers: Vec<Option<[DevBuf<f32>; 2]>>,
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
    /// Why this model's prefix pieces cannot be kept in device buffers, if they cannot:
    /// qwen4_exp's QSA indexer keys and PLE state go through the host pieces
    /// ([`CudaEngine::read_kv_rows`], [`CudaEngine::read_ple`]), which carry them.
    pub fn device_pieces_refusal(&self) -> Option<String> {
        (self.config.qsa.is_some() || self.config.ple.is_some()).then(|| {
            "qwen4_exp's QSA indexer keys and PLE state are cached on the host, not in device buffers".into()
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
        let width = self.config.attention.num_kv_heads * self.config.attention.head_dim;
        let d_i = self.config.qsa.as_ref().map_or(0, |q| q.head_dim);
        session
            .layers
            .iter()
            .map(|layer| match layer {
                LayerState::Attention(kv) => Ok(Some(HostLayer::Attention {
                    keys: self
                        .dev
                        .download(&kv.keys, from * width, (to - from) * width)?,
                    values: self
                        .dev
                        .download(&kv.values, from * width, (to - from) * width)?,
                    indexer: match &kv.indexer {
                        Some(ix) => {
                            self.dev
                                .download(&ix.raw_keys, from * d_i, (to - from) * d_i)?
                        }
                        None => Vec::new(),
                    },
                })),
                LayerState::Gdn(_) => Ok(None),
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
                    for (cache, rows) in [(&mut kv.keys, keys), (&mut kv.values, values)] {
                        let held: usize = rows.iter().map(Rows::len).sum();
                        if held != position * width {
                            return Err(CudaError::Unsupported(format!(
                                "layer {n}'s cached rows hold {} tokens, not {position}",
                                held / width.max(1)
                            )));
                        }
                        let mut at = 0;
                        for part in rows {
                            self.put(cache.at(at), part)?;
                            at += part.len();
                        }
                    }
                    self.restore_indexer(n, kv, indexer, position)?;
                }
                (LayerState::Gdn(g), PrefixLayer::Gdn { conv, recurrent }) => {
                    if conv.len() != g.conv.len() || recurrent.len() != g.recurrent.len() {
                        return Err(CudaError::Unsupported(format!(
                            "layer {n}'s cached GDN state does not fit the model"
                        )));
                    }
                    self.put(g.conv.ptr(), conv)?;
                    self.put(g.recurrent.ptr(), recurrent)?;
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

    /// The attention layers' key and value rows of tokens `[from, position)`, copied into
    /// device buffers of their own.
    pub fn stash_kv_rows(&self, session: &CudaSession, from: usize) -> Result<DeviceKv> {
        self.refuse_device_pieces()?;
        let to = session.position;
        if from > to {
            return Err(CudaError::Unsupported(format!(
                "KV rows from position {from} asked of a session at position {to}"
            )));
        }
        let width = self.config.attention.num_kv_heads * self.config.attention.head_dim;
        let len = (to - from) * width;
        let layers = session
            .layers
            .iter()
            .map(|layer| match layer {
                LayerState::Attention(kv) => Ok(Some([
                    self.stash(kv.keys.ptr() + (from * width * 4) as u64, len)?,
                    self.stash(kv.values.ptr() + (from * width * 4) as u64, len)?,
                ])),
                LayerState::Gdn(_) => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceKv {
            start: from,
            end: to,
            base: from,
            width,
            layers: Arc::new(layers),
        })
    }

    /// Every GDN layer's conv and recurrent state at the session's position, copied into
    /// device buffers of their own.
    pub fn stash_recurrent(&self, session: &CudaSession) -> Result<DeviceState> {
        self.refuse_device_pieces()?;
        let layers = session
            .layers
            .iter()
            .map(|layer| match layer {
                LayerState::Gdn(g) => Ok(Some([
                    self.stash(g.conv.ptr(), g.conv.len())?,
                    self.stash(g.recurrent.ptr(), g.recurrent.len())?,
                ])),
                LayerState::Attention(_) => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceState {
            position: session.position,
            layers,
        })
    }

    /// A new device buffer holding `len` f32 copied from device address `src`.
    fn stash(&self, src: u64, len: usize) -> Result<DevBuf<f32>> {
        let buf = self.dev.zeros::<f32>(len)?;
        if len > 0 {
            self.dev.copy_raw(src, buf.ptr(), len * 4)?;
        }
        Ok(buf)
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
