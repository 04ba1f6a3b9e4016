//! Softmax and top-k selection.

/// In-place numerically stable softmax.
pub fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Indices of the `k` largest values, largest first; ties go to the lower index.
pub fn top_k(values: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// Index of the largest value: the greedy token of a logits row, for every backend and caller.
/// Ties go to the lowest index; NaN never wins (it is skipped wherever it stands); when there
/// is no number to pick (an empty row, or every value NaN) the result is 0.
pub fn argmax(values: &[f32]) -> usize {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in values.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_orders_by_value_then_index() {
        assert_eq!(top_k(&[0.1, 0.5, 0.5, 0.9, -1.0], 3), vec![3, 1, 2]);
    }

    #[test]
    fn argmax_takes_the_lowest_index_on_ties_and_never_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(argmax(&[0.1, 3.0, -1.0, 3.0]), 1);
        // NaN is skipped wherever it stands, first place included.
        assert_eq!(argmax(&[f32::NAN, -5.0, f32::NAN, -6.0]), 1);
        assert_eq!(argmax(&[2.0, f32::NAN, 7.0]), 2);
        // Infinities are numbers: +inf wins, and a row of -inf picks its first entry.
        assert_eq!(argmax(&[1.0, f32::INFINITY, f32::INFINITY]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
        // Nothing to pick: 0.
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut x = vec![1.0, 2.0, 3.0, 1000.0];
        softmax_in_place(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] > 0.999);
        let mut y = vec![0.0f32, (2.0f32).ln()];
        softmax_in_place(&mut y);
        assert!((y[0] - 1.0 / 3.0).abs() < 1e-6 && (y[1] - 2.0 / 3.0).abs() < 1e-6);
    }
}
