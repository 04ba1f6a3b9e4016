//! Chunked Gated DeltaNet (MODEL_MATH §1.5).
