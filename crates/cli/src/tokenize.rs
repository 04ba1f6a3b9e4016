//! `spindle tokenize`: the token ids (and pieces) a model's tokenizer gives a text. Needs only
//! the tokenizer files of the model directory, not the weights.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use serde_json::json;

use crate::model_dir;

#[derive(Debug, Args)]
pub struct TokenizeArgs {
    /// Model directory holding tokenizer.json, or a GGUF file. Default: the embedded demo.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,

    /// Print `{"ids": [...], "pieces": [...]}` instead of comma-separated ids.
    #[arg(long)]
    pub json: bool,

    /// Treat special-token text (`<|im_start|>`) as plain text instead of special tokens.
    #[arg(long)]
    pub no_special: bool,

    /// The text to tokenize.
    pub text: String,
}

pub fn run(args: &TokenizeArgs) -> Result<ExitCode> {
    let dir = model_dir::resolve(args.model.as_ref())?;
    let tokenizer = spindle_runtime::model::load_tokenizer(&dir)?;
    let ids = tokenizer.encode(&args.text, !args.no_special)?;
    if args.json {
        // Each token's text; a token holding part of a UTF-8 character shows its byte-level
        // piece instead of a replacement character.
        let pieces = ids
            .iter()
            .map(|&id| {
                let text = tokenizer.decode(&[id], false)?;
                Ok(match tokenizer.id_to_piece(id) {
                    Some(piece) if text.contains('\u{FFFD}') => piece,
                    _ => text,
                })
            })
            .collect::<Result<Vec<_>, spindle_text::TextError>>()?;
        println!("{}", json!({"ids": ids, "pieces": pieces}));
    } else {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", list.join(","));
    }
    Ok(ExitCode::SUCCESS)
}
