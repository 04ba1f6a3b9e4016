//! The checks a forward pass's input passes once, in [`crate::Backend::forward`], before any
//! backend sees it: the backends trust what they are given.

use spindle_model::ModelConfig;

/// Token ids a model cannot be fed, named by what is wrong with them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("token id {id} at prompt position {position} is outside the vocabulary (vocab_size {vocab_size})")]
    InvalidToken {
        id: u32,
        position: usize,
        vocab_size: usize,
    },

    #[error("the sequence would reach {requested} tokens, beyond the model's context of {limit} (max_position_embeddings)")]
    ContextOverflow { requested: usize, limit: usize },

    #[error("forward called with no tokens")]
    EmptyInput,
}

/// Refuses an empty input, a token outside the vocabulary and a sequence longer than the
/// context, for `ids` fed to a session that has already seen `position` tokens.
pub fn check_input(config: &ModelConfig, position: usize, ids: &[u32]) -> Result<(), InputError> {
    if ids.is_empty() {
        return Err(InputError::EmptyInput);
    }
    let vocab_size = config.vocab_size;
    if let Some((i, &id)) = ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= vocab_size)
    {
        return Err(InputError::InvalidToken {
            id,
            position: position + i,
            vocab_size,
        });
    }
    let requested = position + ids.len();
    if requested > config.max_position_embeddings {
        return Err(InputError::ContextOverflow {
            requested,
            limit: config.max_position_embeddings,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ModelConfig {
        let dir = crate::demo_dir().expect("the embedded demo checkpoint");
        ModelConfig::from_dir(&dir).expect("the demo's config.json")
    }

    #[test]
    fn tokens_in_the_vocabulary_within_the_context_pass() {
        let config = config();
        let last = config.vocab_size as u32 - 1;
        assert_eq!(check_input(&config, 0, &[0, last]), Ok(()));
        let room = config.max_position_embeddings;
        assert_eq!(check_input(&config, room - 1, &[1]), Ok(()));
    }

    #[test]
    fn an_empty_input_is_refused() {
        let err = check_input(&config(), 0, &[]).unwrap_err();
        assert_eq!(err, InputError::EmptyInput);
        assert!(err.to_string().contains("no tokens"), "{err}");
    }

    #[test]
    fn a_token_outside_the_vocabulary_is_refused_naming_it_and_its_position() {
        let config = config();
        let v = config.vocab_size;
        let err = check_input(&config, 5, &[1, 2, v as u32, 3]).unwrap_err();
        assert_eq!(
            err,
            InputError::InvalidToken {
                id: v as u32,
                position: 7,
                vocab_size: v
            }
        );
        let text = err.to_string();
        assert!(
            text.contains(&v.to_string()) && text.contains("position 7") && text.contains("vocab"),
            "{text}"
        );
    }

    #[test]
    fn a_sequence_past_the_context_is_refused_with_both_lengths() {
        let config = config();
        let limit = config.max_position_embeddings;
        let err = check_input(&config, limit - 1, &[1, 2]).unwrap_err();
        assert_eq!(
            err,
            InputError::ContextOverflow {
                requested: limit + 1,
                limit
            }
        );
        let text = err.to_string();
        assert!(
            text.contains(&(limit + 1).to_string()) && text.contains(&limit.to_string()),
            "{text}"
        );
    }
}
