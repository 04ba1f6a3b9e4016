//! Building one MoE layer's experts from an install's expert file, in the chosen residency.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::install::{Install, MappedFile};
use crate::{ModelError, Result};

use super::buf::AlignedBuf;
use super::pool::ReadPool;
use super::record::expert_at;
use super::streamed::{StreamOptions, StreamedExperts};
use super::ExpertCounters;
use crate::weights::packed::Owner;
use crate::weights::MlpWeights;

/// A residency with `auto` resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Resident,
    Mapped,
    Streamed(StreamOptions),
}

/// Where an install's experts go, and the shared pieces streaming needs.
pub struct ExpertSetup {
    pub placement: Placement,
    pub pool: Option<Arc<ReadPool>>,
    pub counters: Arc<ExpertCounters>,
}

/// A layer's experts: all addressable, or behind slots.
pub enum LayerExperts {
    InMemory(Vec<MlpWeights>),
    Streamed(StreamedExperts),
}

/// The routed experts of MoE layer `layer` of `install`.
pub fn load_layer(install: &Install, layer: usize, setup: &ExpertSetup) -> Result<LayerExperts> {
    let layout = install
        .expert_layer(layer)
        .ok_or_else(|| ModelError::Index {
            path: install.path_of(crate::install::MANIFEST),
            message: format!(
                "layer {layer} is a MoE layer but the manifest lists no expert file for it"
            ),
        })?;
    let path = install.path_of(&layout.file);
    let io_err = |error| ModelError::Io {
        path: path.clone(),
        error,
    };
    let stride = layout.stride as usize;
    let owner = match setup.placement {
        Placement::Streamed(options) => {
            let pool = setup.pool.clone().expect("streaming sets up a read pool");
            let streamed = StreamedExperts::open(
                path.clone(),
                layout.clone(),
                options,
                pool,
                setup.counters.clone(),
            )
            .map_err(io_err)?;
            return Ok(LayerExperts::Streamed(streamed));
        }
        Placement::Mapped => {
            let map = MappedFile::open(&path).map_err(ModelError::from)?;
            map.advise_random();
            Owner::Mapped(map)
        }
        Placement::Resident => {
            let file = std::fs::File::open(&path).map_err(io_err)?;
            let mut buf = AlignedBuf::zeroed(stride * layout.experts);
            file.read_exact_at(buf.as_mut_slice(), 0).map_err(io_err)?;
            Owner::Heap(Arc::new(buf))
        }
    };
    Ok(LayerExperts::InMemory(
        (0..layout.experts)
            .map(|e| expert_at(&owner, e * stride, &layout.parts))
            .collect(),
    ))
}
