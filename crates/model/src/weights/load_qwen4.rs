//! Loading the weights qwen4_exp adds: hyper-connection blocks, the QSA indexer and PLE with
//! its n-gram table (whose stored hash buffers must equal what the config implies).

use crate::layout::{HyperSchema, IndexerSchema, PleSchema, TensorDef};
use crate::ngram::NgramHash;
use crate::{ModelConfig, ModelError, PleConfig, Result};

use super::source::At;
use super::{HyperWeights, IndexerWeights, NgramTable, PleWeights};

/// Loads a hyper-connection block (with `block_inject_weight` unless it is the final mixer).
pub(super) fn load_hyper(at: &At, s: &HyperSchema) -> Result<HyperWeights> {
    Ok(HyperWeights {
        norm: at.values(&s.norm)?,
        mix_down: at.mapped(&s.mix_down)?,
        mix_up: at.mapped(&s.mix_up)?,
        inject: match &s.inject {
            Some(d) => Some(at.mapped(d)?),
            None => None,
        },
    })
}

/// Loads the QSA indexer of a full-attention layer.
pub(super) fn load_indexer(at: &At, s: &IndexerSchema) -> Result<IndexerWeights> {
    Ok(IndexerWeights {
        qk_proj: at.mapped(&s.qk_proj)?,
        q_norm: at.values(&s.q_norm)?,
        k_norm: at.values(&s.k_norm)?,
    })
}

/// Checks that an int64 buffer stored in the checkpoint equals what the config implies.
fn check_buffer(at: &At, d: &TensorDef, expected: &[u64]) -> Result<()> {
    let ck = at.src.ck;
    let name = &at.name(d);
    let stored = ck.i64_values(name, &d.shape)?;
    if stored.iter().zip(expected).any(|(&s, &e)| s as u64 != e) {
        return Err(ModelError::ValueMismatch {
            path: ck.file_of(name),
            tensor: name.to_owned(),
            message: format!(
                "holds {stored:?} but the config (seed, ngram_vocab_size_base, vocab_size) gives {expected:?}; \
                 refusing to run with a different n-gram hash"
            ),
        });
    }
    Ok(())
}

/// Loads PLE layer `layer`, refusing hash buffers that disagree with the config.
pub(super) fn load_ple(
    at: &At,
    config: &ModelConfig,
    ple: &PleConfig,
    layer: usize,
) -> Result<PleWeights> {
    let ck = at.src.ck;
    let ordinal = ple.ordinal(layer).expect("layer is a PLE layer");
    let s = PleSchema::new(config, ple, ordinal);

    let hash = NgramHash::from_config(ple, ordinal, config.vocab_size);
    check_buffer(at, &s.multipliers, &hash.multipliers)?;
    check_buffer(at, &s.head_vocab_sizes, &hash.vocab_sizes)?;
    check_buffer(at, &s.head_offsets, &hash.offsets)?;

    let rows = s.table_rows;
    let table = if ck.contains(&at.name(&s.table)) {
        NgramTable {
            shards: vec![at.mapped(&s.table)?],
            shard_rows: rows,
        }
    } else {
        if rows % ple.split_parts != 0 {
            return Err(ModelError::Config {
                path: ck.dir().join("config.json"),
                message: format!(
                    "the n-gram table has {rows} rows, not divisible by split_ngram_parts {}",
                    ple.split_parts
                ),
            });
        }
        let shards = (0..ple.split_parts)
            .map(|k| at.mapped(&s.shard(k, ple.split_parts)))
            .collect::<Result<Vec<_>>>()?;
        NgramTable {
            shards,
            shard_rows: rows / ple.split_parts,
        }
    };
    Ok(PleWeights {
        hash,
        table,
        key_proj: at.mapped(&s.key_proj)?,
        value_proj: at.mapped(&s.value_proj)?,
        norm_key: at.values(&s.norm_key)?,
        norm_query: at.values(&s.norm_query)?,
        norm_conv: at.values(&s.norm_conv)?,
        conv: at.values(&s.conv)?,
        conv_kernel: ple.conv_kernel,
    })
}
