// Mixture of experts on the device (MODEL_MATH §1.6): routing, then every (token, expert)
// pair's SwiGLU, then the weighted sum of the selected experts' down projections.

// One block per token: softmax over the E router logits (row t of `logits`, stride ld), top-k
// by repeated argmax (ties to the lower expert index, as the CPU), optional renormalisation.
extern "C" __global__ void moe_route(const float* __restrict__ logits, int ld, int E, int k,
                                     int renormalize, int* __restrict__ idx, float* __restrict__ wt) {
    extern __shared__ float p[];  // [E]
    __shared__ float red[33];
    __shared__ int chosen;
    int t = blockIdx.x;
    const float* row = logits + (size_t)t * ld;
    float m = -SP_INF;
    for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, row[e]);
    // block max through the sum helper's scratch: reduce per warp, then over warps.
    m = warp_max(m);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : -SP_INF;
        v = warp_max(v);
        if (threadIdx.x == 0) red[32] = v;
    }
    __syncthreads();
    m = red[32];
    float s = 0.0f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float v = expf(row[e] - m);
        p[e] = v;
        s += v;
    }
    s = block_sum(s, red);
    for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] /= s;
    __syncthreads();
    // Top-k by repeated block argmax; ties go to the lower expert index.
    __shared__ float rv[32];
    __shared__ int ri[32];
    __shared__ float picked_sum;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) picked_sum = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = -SP_INF;
        int bi = 0x7fffffff;
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            if (p[e] > bv) { bv = p[e]; bi = e; }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { rv[warp] = bv; ri[warp] = bi; }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < (int)(blockDim.x >> 5); w++)
                if (rv[w] > bv || (rv[w] == bv && ri[w] < bi)) { bv = rv[w]; bi = ri[w]; }
            if (bi == 0x7fffffff) { bi = 0; bv = 0.0f; }  // NaN logits: keep the index valid
            idx[t * k + j] = bi;
            wt[t * k + j] = bv;
            picked_sum += bv;
            p[bi] = -SP_INF;
        }
        __syncthreads();
    }
    if (renormalize && threadIdx.x < k) wt[t * k + threadIdx.x] /= picked_sum;
}

// act[p, i] = silu(gate_e[i]·x_t) · (up_e[i]·x_t) for pair p = t·k + j, e = idx[p].
// `gu` is [E·2I, H] (per expert gate rows, then up rows) in format FMT. One warp per (i, p).
template <int FMT>
__device__ __forceinline__ void moe_gate_up_impl(const unsigned char* __restrict__ gu, const unsigned short* __restrict__ gs,
                                                 const float* __restrict__ x, int ldx, const int* __restrict__ idx,
                                                 float* __restrict__ act, int k, int I, int H, int vec) {
    int lane = threadIdx.x & 31;
    int i = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int p = blockIdx.y;
    if (i >= I) return;
    int t = p / k, e = idx[p];
    size_t rb = WF<FMT>::row_bytes(H), rs = H >> 5;
    size_t g_row = (size_t)e * 2 * I + i, u_row = g_row + I;
    const float* xt = x + (size_t)t * ldx;
    float g = warp_sum(row_dot<FMT>(gu + g_row * rb, gs + g_row * rs, xt, H, lane, vec));
    float u = warp_sum(row_dot<FMT>(gu + u_row * rb, gs + u_row * rs, xt, H, lane, vec));
    if (lane == 0) act[(size_t)p * I + i] = silu_f(g) * u;
}

// y[t, r] += Σ_j wt[t·k + j] · down_{idx[t·k+j]}[r]·act[t·k + j]. `down` is [E·H, I] in format
// FMT. One warp per (r, t); with `vec` the lanes share the k·I/V chunks of all k rows.
template <int FMT>
__device__ __forceinline__ void moe_down_impl(const unsigned char* __restrict__ down, const unsigned short* __restrict__ ds,
                                              const float* __restrict__ act, const int* __restrict__ idx,
                                              const float* __restrict__ wt, float* __restrict__ y, int k, int I,
                                              int H, int vec) {
    const int V = WF<FMT>::VALS;
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int t = blockIdx.y;
    if (r >= H) return;
    size_t rb = WF<FMT>::row_bytes(I), rs = I >> 5;
    float total = 0.0f;
    if (vec) {
        int per_row = I / V;
        for (int item = lane; item < k * per_row; item += 32) {
            int j = item / per_row, ch = item - j * per_row;
            int p = t * k + j;
            size_t row = (size_t)idx[p] * H + r;
            float wf[V];
            load_chunk<FMT>(down + row * rb, ds + row * rs, ch, wf);
            total += wt[p] * dot_chunk<V>(wf, act + (size_t)p * I + (size_t)ch * V);
        }
        total = warp_sum(total);
    } else {
        for (int j = 0; j < k; j++) {
            int p = t * k + j;
            size_t row = (size_t)idx[p] * H + r;
            float s = warp_sum(row_dot<FMT>(down + row * rb, ds + row * rs, act + (size_t)p * I, I, lane, 0));
            total += wt[p] * s;
        }
    }
    if (lane == 0) y[(size_t)t * H + r] += total;
}

#define GATE_UP_ARGS                                                                                           \
    const unsigned char *__restrict__ gu, const unsigned short *__restrict__ gs, const float *__restrict__ x, \
        int ldx, const int *__restrict__ idx, float *__restrict__ act, int k, int I, int H, int vec
extern "C" __global__ void moe_gate_up_bf16(GATE_UP_ARGS) { moe_gate_up_impl<0>(gu, gs, x, ldx, idx, act, k, I, H, vec); }
extern "C" __global__ void moe_gate_up_q8(GATE_UP_ARGS) { moe_gate_up_impl<1>(gu, gs, x, ldx, idx, act, k, I, H, vec); }
extern "C" __global__ void moe_gate_up_q4(GATE_UP_ARGS) { moe_gate_up_impl<2>(gu, gs, x, ldx, idx, act, k, I, H, vec); }

#define DOWN_ARGS                                                                                                \
    const unsigned char *__restrict__ down, const unsigned short *__restrict__ ds, const float *__restrict__ act, \
        const int *__restrict__ idx, const float *__restrict__ wt, float *__restrict__ y, int k, int I, int H, int vec
extern "C" __global__ void moe_down_bf16(DOWN_ARGS) { moe_down_impl<0>(down, ds, act, idx, wt, y, k, I, H, vec); }
extern "C" __global__ void moe_down_q8(DOWN_ARGS) { moe_down_impl<1>(down, ds, act, idx, wt, y, k, I, H, vec); }
extern "C" __global__ void moe_down_q4(DOWN_ARGS) { moe_down_impl<2>(down, ds, act, idx, wt, y, k, I, H, vec); }
