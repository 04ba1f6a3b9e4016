//! What one batched step runs: every decoding sequence's next token first, then chunks of the
//! prompts still being prefilled, oldest first, until the step's token budget is spent. A
//! long prompt is spread over several steps, so it never holds back anyone's next token.

/// What a running sequence needs from the next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// One token: the one sampled last step.
    Decode,
    /// `remaining` prompt tokens not yet fed.
    Prefill { remaining: usize },
}

/// Tokens each sequence feeds in the next step (`0`: sits this step out), for `work` in
/// admission order and a budget of `budget` tokens. Decode tokens are always all taken (the
/// scheduler keeps `max_seqs <= budget`); prompt chunks fill what is left in order, so the
/// oldest prefill advances first and a later one only gets what the earlier left over.
pub fn plan_step(work: &[Work], budget: usize) -> Vec<usize> {
    let decodes = work.iter().filter(|w| **w == Work::Decode).count();
    let mut left = budget.saturating_sub(decodes);
    work.iter()
        .map(|w| match *w {
            Work::Decode => 1,
            Work::Prefill { remaining } => {
                let take = remaining.min(left);
                left -= take;
                take
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_first_then_prompt_chunks_in_order() {
        let work = [
            Work::Prefill { remaining: 300 },
            Work::Decode,
            Work::Prefill { remaining: 500 },
            Work::Decode,
            Work::Prefill { remaining: 10 },
        ];
        // 2 decode tokens, then 300 of the first prompt, 210 of the second, none of the third.
        assert_eq!(plan_step(&work, 512), [300, 1, 210, 1, 0]);
        assert_eq!(plan_step(&work, 2), [0, 1, 0, 1, 0]);
        assert_eq!(plan_step(&work, 4096), [300, 1, 500, 1, 10]);
    }

    #[test]
    fn a_long_prompt_is_chunked_over_steps() {
        let mut remaining = 1000;
        let mut steps = 0;
        while remaining > 0 {
            let take = plan_step(&[Work::Decode, Work::Prefill { remaining }], 256)[1];
            assert!(take > 0 && take <= 255);
            remaining -= take;
            steps += 1;
        }
        assert_eq!(steps, 4);
    }
}
