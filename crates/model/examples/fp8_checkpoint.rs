//! Turns a checkpoint into block FP8 and writes its exact f32 dequantization beside it
//! (`spindle_model::fp8::make`): test data and benchmark inputs for FP8 loading.
//!
//!     cargo run --release -p spindle-model --example fp8_checkpoint -- SRC FP8_OUT DEQ_OUT [ROWS COLS]
//!
//! ROWS COLS is the block (`weight_block_size`), 128 128 by default. DEQ_OUT `-` writes no
//! dequantized copy (a benchmark checkpoint: the copy takes 4 bytes per weight).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 3 && args.len() != 5 {
        eprintln!("usage: fp8_checkpoint SRC FP8_OUT DEQ_OUT [ROWS COLS]");
        std::process::exit(2);
    }
    let block = if args.len() == 5 {
        let dim = |s: &str| match s.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("block dimension {s:?}: expected a positive integer");
                std::process::exit(2);
            }
        };
        [dim(&args[3]), dim(&args[4])]
    } else {
        [128, 128]
    };
    let p = |s: &String| std::path::PathBuf::from(s);
    let deq = (args[2] != "-").then(|| p(&args[2]));
    if let Err(e) =
        spindle_model::fp8::make::write_fp8(&p(&args[0]), &p(&args[1]), deq.as_deref(), block)
    {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
