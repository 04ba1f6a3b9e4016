//! `--compare REF`: how far computed tensors are from a reference file's.

use std::collections::BTreeMap;
use std::fmt;

use crate::tensor_file::{Tensor, Values};

/// Tensors whose rows are generation steps: a run with fewer decode steps than the reference
/// is compared on the reference's first rows.
const GENERATION_TENSORS: [&str; 2] = ["gen_ids", "decode_logits"];

/// The verdict on one tensor present in both files.
#[derive(Debug)]
pub enum Outcome {
    /// f32 tensors: the largest |ours − reference| (NaN if either side has a NaN there).
    MaxAbsDiff(f32),
    /// Integer tensors: identical, or the first differing index with both values.
    Ids(Option<(usize, i64, i64)>),
    /// Shapes or dtypes that cannot be compared.
    Incompatible(String),
}

#[derive(Debug)]
pub struct TensorComparison {
    pub name: String,
    pub shape: Vec<usize>,
    pub reference_shape: Vec<usize>,
    pub outcome: Outcome,
    pub passed: bool,
}

impl fmt::Display for TensorComparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.passed { "ok" } else { "FAIL" };
        write!(f, "{:<16} {:<14}", self.name, format!("{:?}", self.shape))?;
        match &self.outcome {
            Outcome::MaxAbsDiff(d) => write!(f, " max |diff| {d:.3e}")?,
            Outcome::Ids(None) => write!(f, " identical")?,
            Outcome::Ids(Some((i, ours, theirs))) => write!(
                f,
                " differ first at index {i}: {ours} vs reference {theirs}"
            )?,
            Outcome::Incompatible(why) => write!(f, " {why}")?,
        }
        if self.shape != self.reference_shape && !matches!(self.outcome, Outcome::Incompatible(_)) {
            write!(
                f,
                " (first {} of the reference's {} rows)",
                self.shape[0], self.reference_shape[0]
            )?;
        }
        write!(f, "  {verdict}")
    }
}

/// Compares every tensor of `ours` that `reference` also holds. Logits pass when their max
/// abs diff is at most `tolerance`; integer tensors (prompt and generated ids) must be identical.
pub fn compare(
    ours: &[(&str, Tensor)],
    reference: &BTreeMap<String, Tensor>,
    tolerance: f32,
) -> Vec<TensorComparison> {
    ours.iter()
        .filter_map(|(name, tensor)| {
            let theirs = reference.get(*name)?;
            Some(compare_one(name, tensor, theirs, tolerance))
        })
        .collect()
}

fn compare_one(name: &str, ours: &Tensor, theirs: &Tensor, tolerance: f32) -> TensorComparison {
    let result = |outcome: Outcome, passed: bool| TensorComparison {
        name: name.to_owned(),
        shape: ours.shape.clone(),
        reference_shape: theirs.shape.clone(),
        outcome,
        passed,
    };
    let prefix_ok = GENERATION_TENSORS.contains(&name)
        && !ours.shape.is_empty()
        && ours.shape.len() == theirs.shape.len()
        && ours.shape[0] <= theirs.shape[0]
        && ours.shape[1..] == theirs.shape[1..];
    if ours.shape != theirs.shape && !prefix_ok {
        let why = format!(
            "shape {:?} but the reference has {:?}",
            ours.shape, theirs.shape
        );
        return result(Outcome::Incompatible(why), false);
    }
    match (&ours.values, &theirs.values) {
        (Values::F32(a), Values::F32(b)) => {
            let max = a.iter().zip(b).fold(0.0f32, |max, (x, y)| {
                let d = (x - y).abs();
                if d.is_nan() || max.is_nan() {
                    f32::NAN
                } else {
                    max.max(d)
                }
            });
            // `NaN <= tolerance` is false, so a NaN fails.
            result(Outcome::MaxAbsDiff(max), max <= tolerance)
        }
        (Values::I64(a), Values::I64(b)) => {
            let first = a.iter().zip(b).enumerate().find(|(_, (x, y))| x != y);
            let first = first.map(|(i, (x, y))| (i, *x, *y));
            result(Outcome::Ids(first), first.is_none())
        }
        (a, b) => {
            let why = format!(
                "dtype {} but the reference has {}",
                dtype_name(a),
                dtype_name(b)
            );
            result(Outcome::Incompatible(why), false)
        }
    }
}

fn dtype_name(v: &Values) -> &str {
    match v {
        Values::F32(_) => "F32",
        Values::I64(_) => "I64",
        Values::U8(_) => "U8",
        Values::Other(d) => d,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference() -> BTreeMap<String, Tensor> {
        BTreeMap::from([
            (
                "prefill_logits".to_owned(),
                Tensor::f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]),
            ),
            ("gen_ids".to_owned(), Tensor::i64(vec![3], vec![5, 6, 7])),
            (
                "decode_logits".to_owned(),
                Tensor::f32(vec![3, 1], vec![0.0, 1.0, 2.0]),
            ),
            ("full_logits".to_owned(), Tensor::f32(vec![1], vec![0.0])),
        ])
    }

    #[test]
    fn within_tolerance_passes_and_reports_the_max_diff() {
        let ours = [(
            "prefill_logits",
            Tensor::f32(vec![2, 2], vec![1.0, 2.0005, 3.0, 3.9998]),
        )];
        let out = compare(&ours, &reference(), 1e-3);
        assert_eq!(out.len(), 1);
        assert!(out[0].passed);
        let Outcome::MaxAbsDiff(d) = out[0].outcome else {
            panic!()
        };
        assert!((d - 5e-4).abs() < 1e-6, "{d}");
    }

    #[test]
    fn beyond_tolerance_or_nan_fails() {
        let far = [(
            "prefill_logits",
            Tensor::f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.1]),
        )];
        assert!(!compare(&far, &reference(), 1e-3)[0].passed);
        let nan = [(
            "prefill_logits",
            Tensor::f32(vec![2, 2], vec![f32::NAN, 2.0, 3.0, 4.0]),
        )];
        assert!(!compare(&nan, &reference(), 1e-3)[0].passed);
    }

    #[test]
    fn ids_must_be_identical_and_a_shorter_generation_compares_its_prefix() {
        let same = [
            ("gen_ids", Tensor::i64(vec![2], vec![5, 6])),
            ("decode_logits", Tensor::f32(vec![2, 1], vec![0.0, 1.0])),
        ];
        assert!(compare(&same, &reference(), 1e-3).iter().all(|c| c.passed));
        let differ = [("gen_ids", Tensor::i64(vec![3], vec![5, 9, 7]))];
        let out = compare(&differ, &reference(), 1e-3);
        assert!(!out[0].passed);
        assert!(
            out[0].to_string().contains("index 1: 9 vs reference 6"),
            "{}",
            out[0]
        );
        let longer = [("gen_ids", Tensor::i64(vec![4], vec![5, 6, 7, 8]))];
        assert!(!compare(&longer, &reference(), 1e-3)[0].passed);
    }

    #[test]
    fn prefill_shapes_must_match_exactly() {
        let ours = [("prefill_logits", Tensor::f32(vec![1, 2], vec![1.0, 2.0]))];
        let out = compare(&ours, &reference(), 1e-3);
        assert!(!out[0].passed);
        assert!(out[0].to_string().contains("[2, 2]"), "{}", out[0]);
    }
}
