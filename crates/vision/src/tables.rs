//! The grid-dependent tables of the vision tower (shared docs `VISION.md` §2.3, §3.2, §3.3),
//! computed on the host in one place for both backends: the patch order, the corners and
//! weights of the bilinear position-table interpolation, and the 2-D rotary cos/sin.

/// (row, column) in patches of every row, in the 2x2-block-major order of §2.3, frame after
/// frame.
pub fn patch_coords(gh: usize, gw: usize, m: usize, frames: usize) -> Vec<(usize, usize)> {
    let mut coords = Vec::with_capacity(frames * gh * gw);
    for _ in 0..frames {
        for bh in 0..gh / m {
            for bw in 0..gw / m {
                for ih in 0..m {
                    for iw in 0..m {
                        coords.push((bh * m + ih, bw * m + iw));
                    }
                }
            }
        }
    }
    coords
}

/// §3.2: the four table rows and f64 weights that interpolate the S x S table bilinearly
/// (align_corners=True, upper neighbours clamped) at each entry of `coords` on a gh x gw grid:
/// `[rows, 4]` each, corners (y0, x0), (y0, x1), (y1, x0), (y1, x1) as both backends sum them.
pub fn interpolation(
    side: usize,
    gh: usize,
    gw: usize,
    coords: &[(usize, usize)],
) -> (Vec<i32>, Vec<f64>) {
    let axis = |i: usize, size: usize| -> (usize, usize, f64) {
        let x = if size == 1 {
            0.0
        } else {
            i as f64 * (side - 1) as f64 / (size - 1) as f64
        };
        let lo = (x.floor() as usize).min(side - 1);
        (lo, (lo + 1).min(side - 1), x - lo as f64)
    };
    let mut index = Vec::with_capacity(coords.len() * 4);
    let mut weights = Vec::with_capacity(coords.len() * 4);
    for &(r, c) in coords {
        let (y0, y1, dy) = axis(r, gh);
        let (x0, x1, dx) = axis(c, gw);
        for (at, w) in [
            (y0 * side + x0, (1.0 - dy) * (1.0 - dx)),
            (y0 * side + x1, (1.0 - dy) * dx),
            (y1 * side + x0, dy * (1.0 - dx)),
            (y1 * side + x1, dy * dx),
        ] {
            index.push(at as i32);
            weights.push(w);
        }
    }
    (index, weights)
}

/// cos and sin `[rows, d/2]` of every row's 2-D rotary angles: the first d/4 from the patch
/// row, the next d/4 from its column (θ_v^(−2j/(d/2)), j < d/4), the angle in f32 as
/// transformers computes it (§6.2 point 11).
pub fn rope_tables(head_dim: usize, theta: f64, coords: &[(usize, usize)]) -> (Vec<f32>, Vec<f32>) {
    let (half, quarter) = (head_dim / 2, head_dim / 4);
    let inv: Vec<f64> = (0..quarter)
        .map(|j| 1.0 / theta.powf(2.0 * j as f64 / half as f64))
        .collect();
    let mut cos = Vec::with_capacity(coords.len() * half);
    let mut sin = Vec::with_capacity(coords.len() * half);
    for &(r, c) in coords {
        for (axis, &f) in std::iter::repeat_n(r, quarter)
            .chain(std::iter::repeat_n(c, quarter))
            .zip(inv.iter().cycle())
        {
            let angle = axis as f32 * f as f32;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coords_are_block_major() {
        let c = patch_coords(2, 4, 2, 1);
        assert_eq!(
            c,
            vec![
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (0, 2),
                (0, 3),
                (1, 2),
                (1, 3)
            ]
        );
    }

    /// The corners and weights, applied on the host, hit the table's corners and midpoints
    /// (a 2x2 table of one channel, 0..3, sampled on a 3x3 grid).
    #[test]
    fn interpolation_hits_the_table_corners_and_midpoints() {
        let table = [0.0f64, 1.0, 2.0, 3.0];
        let coords: Vec<(usize, usize)> =
            (0..3).flat_map(|r| (0..3).map(move |c| (r, c))).collect();
        let (index, weights) = interpolation(2, 3, 3, &coords);
        let values: Vec<f64> = (0..coords.len())
            .map(|r| {
                (0..4)
                    .map(|c| weights[4 * r + c] * table[index[4 * r + c] as usize])
                    .sum()
            })
            .collect();
        assert_eq!(values, vec![0.0, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 2.5, 3.0]);
        // Weights of each row sum to 1, indices stay inside the table.
        for r in 0..coords.len() {
            let s: f64 = weights[4 * r..4 * r + 4].iter().sum();
            assert!((s - 1.0).abs() < 1e-12);
        }
        assert!(index.iter().all(|&i| (0..4).contains(&i)));
    }

    /// A 6x10 grid on a 6x6 table: the last row and column map onto the table's last ones.
    #[test]
    fn interpolation_clamps_the_upper_neighbour() {
        let coords = vec![(5, 9), (0, 0)];
        let (index, weights) = interpolation(6, 6, 10, &coords);
        assert_eq!(index[0], 35);
        assert_eq!(weights[0], 1.0);
        assert_eq!(&weights[1..4], &[0.0, 0.0, 0.0]);
        assert_eq!(index[4], 0);
    }

    #[test]
    fn rope_tables_split_rows_and_columns() {
        // d = 8: 2 frequencies per axis; position (3, 5).
        let (cos, sin) = rope_tables(8, 10000.0, &[(3, 5)]);
        assert_eq!(cos.len(), 4);
        let inv1 = (1.0 / 10000f64.powf(2.0 / 4.0)) as f32;
        assert_eq!(cos[0], 3.0f32.cos());
        assert_eq!(sin[1], (3.0 * inv1).sin());
        assert_eq!(cos[2], 5.0f32.cos());
        assert_eq!(sin[3], (5.0 * inv1).sin());
    }
}
