//! The OpenAI-compatible server end to end, over HTTP on a loopback port, on the embedded
//! demo model (random weights: tests compare the server with itself, never with a text).

mod api;
mod apis;
mod common;
mod controls;
mod errors;
mod hostile;
mod images;
mod load;
mod special_tokens;
mod transport;
