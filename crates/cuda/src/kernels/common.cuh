// Shared helpers for every spindle kernel. Compiled by NVRTC with no headers: bf16 values are
// raw 16-bit patterns, widened to f32 by a shift.

typedef unsigned short bf16_t;

#define SP_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float bf16_to_f32(bf16_t b) {
    return __uint_as_float(((unsigned int)b) << 16);
}

// The 8 bf16 values of a 16-byte load, widened to f32.
__device__ __forceinline__ void unpack8(uint4 v, float* out) {
    unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_f(float x) { return x * sigmoid_f(x); }
// PyTorch's softplus with threshold 20.
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32); every thread gets the result.
// `red` is shared scratch of 33 floats.
__device__ float block_sum(float v, float* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < warps ? red[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) red[32] = t;
    }
    __syncthreads();
    return red[32];
}

// Dot product of one bf16 weight row with one f32 vector, accumulated per lane (the caller
// reduces across the warp). `vec` is nonzero when both are 16-byte aligned and n % 8 == 0.
__device__ __forceinline__ float lane_dot(const bf16_t* w, const float* x, int n, int lane, int vec) {
    float acc = 0.0f;
    if (vec) {
        for (int c = lane * 8; c < n; c += 256) {
            float wf[8];
            unpack8(*(const uint4*)(w + c), wf);
            float4 x0 = *(const float4*)(x + c);
            float4 x1 = *(const float4*)(x + c + 4);
            acc += wf[0] * x0.x + wf[1] * x0.y + wf[2] * x0.z + wf[3] * x0.w
                 + wf[4] * x1.x + wf[5] * x1.y + wf[6] * x1.z + wf[7] * x1.w;
        }
    } else {
        for (int c = lane; c < n; c += 32) acc += bf16_to_f32(w[c]) * x[c];
    }
    return acc;
}
