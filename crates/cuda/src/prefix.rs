//! A session's state read out to the host and a session built from such pieces: the prefix
//! cache's capture and restore on CUDA. The device caches keep the CPU session's layout row for
//! row (keys and values `[tokens, n_kv, d]`, GDN conv `[K−1, C]` and recurrent
//! `[n_v, d_k, d_v]`, all f32), so the runtime keeps one host format for both backends.

use crate::device::MappedHost;
use crate::error::{CudaError, Result};
use crate::session::{CudaSession, LayerState};
use crate::{flow, CudaEngine};

/// One layer's piece of a prefix on the host.
pub enum HostLayer {
    /// Key and value rows of a run of tokens, `[tokens, n_kv, d]` each.
    Attention { keys: Vec<f32>, values: Vec<f32> },
    /// The GDN state at one position.
    Gdn { conv: Vec<f32>, recurrent: Vec<f32> },
}

/// What [`CudaEngine::session_from_prefix`] writes into one layer: key and value rows in
/// order from position 0 (one slice per cached segment), or the GDN state at the prefix's end.
pub enum PrefixLayer<'a> {
    Attention {
        keys: Vec<&'a [f32]>,
        values: Vec<&'a [f32]>,
    },
    Gdn {
        conv: &'a [f32],
        recurrent: &'a [f32],
    },
}

impl CudaEngine {
    /// Why sessions of this model cannot be cached yet, if they cannot: qwen4_exp's QSA
    /// indexer block keys and PLE rows are not read out.
    pub fn prefix_refusal(&self) -> Option<String> {
        (self.config.qsa.is_some() || self.config.ple.is_some()).then(|| {
            "the prefix cache on CUDA does not cover qwen4_exp's QSA and PLE state yet".into()
        })
    }

    /// The attention layers' key and value rows of tokens `[from, position)` (`None` for a
    /// GDN layer).
    pub fn read_kv_rows(
        &self,
        session: &CudaSession,
        from: usize,
    ) -> Result<Vec<Option<HostLayer>>> {
        self.refuse_uncovered()?;
        refuse_imaged(session)?;
        let to = session.position;
        if from > to {
            return Err(CudaError::Unsupported(format!(
                "KV rows from position {from} asked of a session at position {to}"
            )));
        }
        let width = self.config.attention.num_kv_heads * self.config.attention.head_dim;
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
                })),
                LayerState::Gdn(_) => Ok(None),
            })
            .collect()
    }

    /// Every GDN layer's conv and recurrent state at the session's position (`None` for an
    /// attention layer).
    pub fn read_recurrent(&self, session: &CudaSession) -> Result<Vec<Option<HostLayer>>> {
        self.refuse_uncovered()?;
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
        self.refuse_uncovered()?;
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
                (LayerState::Attention(kv), PrefixLayer::Attention { keys, values }) => {
                    for (cache, rows) in [(&mut kv.keys, keys), (&mut kv.values, values)] {
                        let held: usize = rows.iter().map(|part| part.len()).sum();
                        if held != position * width {
                            return Err(CudaError::Unsupported(format!(
                                "layer {n}'s cached rows hold {} tokens, not {position}",
                                held / width.max(1)
                            )));
                        }
                        let mut at = 0;
                        for part in rows {
                            self.upload(cache.at(at), part)?;
                            at += part.len();
                        }
                    }
                }
                (LayerState::Gdn(g), PrefixLayer::Gdn { conv, recurrent }) => {
                    if conv.len() != g.conv.len() || recurrent.len() != g.recurrent.len() {
                        return Err(CudaError::Unsupported(format!(
                            "layer {n}'s cached GDN state does not fit the model"
                        )));
                    }
                    self.upload(g.conv.ptr(), conv)?;
                    self.upload(g.recurrent.ptr(), recurrent)?;
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

    fn refuse_uncovered(&self) -> Result<()> {
        match self.prefix_refusal() {
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
