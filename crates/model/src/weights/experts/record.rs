//! An expert's gate, up and down projections inside its record of an install's expert file.

use crate::install::PartLayout;
use crate::weights::packed::{Owner, PackedMatrix};
use crate::weights::{Linear, MlpWeights};

/// The expert whose record starts at byte `base` of `owner` (parts: gate, up, down).
pub fn expert_at(owner: &Owner, base: usize, parts: &[PartLayout]) -> MlpWeights {
    let linear = |i: usize| Linear::Packed(PackedMatrix::from_part(owner, base, &parts[i]));
    MlpWeights {
        gate: linear(0),
        up: linear(1),
        down: linear(2),
    }
}
