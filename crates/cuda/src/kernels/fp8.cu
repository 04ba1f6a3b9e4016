// Block-FP8 weights (MODEL_MATH §9) on the tensor cores: the activations of an FP8 GEMM
// (gemm_tensor_fp8, gemm.cu) quantized to e4m3 as the checkpoint's `activation_scheme:
// dynamic` means (vLLM, transformers): per token and group of 128 columns, scale = amax/448,
// code = e4m3(x / scale) rounded to nearest even with saturation. The weight-only FP8
// kernels (decode and small batches) are the FMT 3 instances of the matvec and MoE templates.

// Two f32 values as e4m3fn codes: `hi` in the upper byte, `lo` in the lower (sm_89+).
__device__ __forceinline__ unsigned short f32x2_to_e4m3x2(float hi, float lo) {
    unsigned short d = 0;
#if __CUDA_ARCH__ >= 890
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
#else
    __trap();
#endif
    return d;
}

// xq [rows, cols] e4m3 codes and xd [rows, cols/32] f32 scales (each 32-column group carries
// the scale of its 128-column group; a row's last group may be narrower, cols % 32 == 0) of
// the GEMM input rows (tg_input: x, or the SwiGLU of x with up ≥ 0). A warp per 128-group,
// grid-stride.
extern "C" __global__ void gemm_fp8_quantize_acts(const float* __restrict__ x, int ldx, int up, int rows, int cols,
                                                  unsigned char* __restrict__ xq, float* __restrict__ xd) {
    int lane = threadIdx.x & 31, groups = (cols + 127) >> 7;
    size_t all = (size_t)rows * groups, step = (gridDim.x * (size_t)blockDim.x) >> 5;
    for (size_t w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; w < all; w += step) {
        int r = (int)(w / groups), g = (int)(w - (size_t)r * groups);
        float v[4];
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int c = g * 128 + j * 32 + lane;
            v[j] = c < cols ? tg_input(x, ldx, up, r, c) : 0.0f;
            amax = fmaxf(amax, fabsf(v[j]));
        }
        amax = warp_max(amax);
        float scale = amax / 448.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int c = g * 128 + j * 32 + lane;
            if (c < cols) {
                float q = amax != 0.0f ? v[j] / scale : 0.0f;
                xq[(size_t)r * cols + c] = (unsigned char)(f32x2_to_e4m3x2(q, q) & 0xffu);
            }
            if (lane == 0 && g * 128 + j * 32 < cols) xd[(size_t)r * (cols >> 5) + g * 4 + j] = scale;
        }
    }
}
