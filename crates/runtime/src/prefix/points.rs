//! Where a prompt's prefill stops to take a snapshot.

/// The positions in `(from, prompt.len()]` at which a prompt being prefilled from `from` is
/// snapshotted, ascending: every multiple of `interval`, every position holding one of
/// `markers` (the state before the marker: a chat turn starts there), and the prompt's end.
pub fn snapshot_points(
    prompt: &[u32],
    from: usize,
    interval: usize,
    markers: &[u32],
) -> Vec<usize> {
    let mut points: Vec<usize> = (from + 1..prompt.len())
        .filter(|&p| (interval > 0 && p % interval == 0) || markers.contains(&prompt[p]))
        .collect();
    if prompt.len() > from {
        points.push(prompt.len());
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_markers_and_the_end() {
        let mut prompt = vec![7u32; 10];
        prompt[0] = 1;
        prompt[3] = 1;
        prompt[8] = 1;
        assert_eq!(snapshot_points(&prompt, 0, 4, &[1]), [3, 4, 8, 10]);
        assert_eq!(snapshot_points(&prompt, 4, 4, &[1]), [8, 10]);
        assert_eq!(snapshot_points(&prompt, 9, 4, &[1]), [10]);
        assert_eq!(snapshot_points(&prompt, 10, 4, &[1]), Vec::<usize>::new());
        assert_eq!(snapshot_points(&prompt, 0, 0, &[]), [10]);
    }
}
