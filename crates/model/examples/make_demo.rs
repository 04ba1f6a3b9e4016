//! Writes the embedded demo checkpoint's weights and config (same as `spindle synth --shape demo`).
fn main() {
    let out = std::env::args().nth(1).expect("usage: make_demo OUT_DIR");
    let config = spindle_model::synth::demo_config(4096);
    spindle_model::synth::write_checkpoint(
        std::path::Path::new(&out),
        &config,
        0x5eed,
        usize::MAX,
        &mut |_| {},
    )
    .expect("demo written");
}
