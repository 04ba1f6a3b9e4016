// Norms.

// Zero-centred RMSNorm (MODEL_MATH §1.1), grouped: block (t, g) normalises
// x[t·ldx + g·group .. +group] and multiplies by (1 + w[g·group + i]).
extern "C" __global__ void rms_norm_zero_centred(const float* __restrict__ x, int ldx, float* __restrict__ y,
                                                 int ldy, const float* __restrict__ w, int group, float eps) {
    __shared__ float red[33];
    PDL_BEGIN();
    int t = blockIdx.x, g = blockIdx.y;
    const float* xr = x + (size_t)t * ldx + (size_t)g * group;
    float* yr = y + (size_t)t * ldy + (size_t)g * group;
    const float* wr = w + (size_t)g * group;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < group; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float s = rsqrtf(ss / group + eps);
    for (int i = threadIdx.x; i < group; i += blockDim.x) yr[i] = xr[i] * s * (1.0f + wr[i]);
}
