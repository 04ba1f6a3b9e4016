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
    size_t rb = WF<FMT>::row_bytes(H), rs = row_scale_words<FMT>(H);
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
    size_t rb = WF<FMT>::row_bytes(I), rs = row_scale_words<FMT>(I);
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
extern "C" __global__ void moe_gate_up_fp8(GATE_UP_ARGS) { moe_gate_up_impl<3>(gu, gs, x, ldx, idx, act, k, I, H, vec); }

#define DOWN_ARGS                                                                                                \
    const unsigned char *__restrict__ down, const unsigned short *__restrict__ ds, const float *__restrict__ act, \
        const int *__restrict__ idx, const float *__restrict__ wt, float *__restrict__ y, int k, int I, int H, int vec
extern "C" __global__ void moe_down_bf16(DOWN_ARGS) { moe_down_impl<0>(down, ds, act, idx, wt, y, k, I, H, vec); }
extern "C" __global__ void moe_down_q8(DOWN_ARGS) { moe_down_impl<1>(down, ds, act, idx, wt, y, k, I, H, vec); }
extern "C" __global__ void moe_down_q4(DOWN_ARGS) { moe_down_impl<2>(down, ds, act, idx, wt, y, k, I, H, vec); }
extern "C" __global__ void moe_down_fp8(DOWN_ARGS) { moe_down_impl<3>(down, ds, act, idx, wt, y, k, I, H, vec); }

// ---- Mixture of experts, decode (MODEL_MATH §1.6) ----

// Routing of one token by one warp (MODEL_MATH §1.6): softmax over the E logits in `row`, top-k
// by repeated argmax (ties to the lower index, as the CPU), optional renormalisation. `pr` is
// E floats of shared scratch; the chosen experts and weights go to idx[0..k), wt[0..k).
__device__ void route_warp(const float* __restrict__ row, int E, int k, int renormalize, float* pr, int* idx,
                           float* wt) {
    int lane = threadIdx.x & 31;
    float m = -SP_INF;
    for (int e0 = lane; e0 < E; e0 += 32 * 8) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = e0 + 32 * u < E ? row[e0 + 32 * u] : -SP_INF;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            if (e0 + 32 * u < E) pr[e0 + 32 * u] = v[u];
            m = fmaxf(m, v[u]);
        }
    }
    m = warp_max(m);
    float s = 0.0f;
    for (int e = lane; e < E; e += 32) {
        float v = expf(pr[e] - m);
        pr[e] = v;
        s += v;
    }
    s = warp_sum(s);
    for (int e = lane; e < E; e += 32) pr[e] /= s;
    __syncwarp();
    float picked = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = -SP_INF;
        int bi = 0x7fffffff;
        for (int e = lane; e < E; e += 32) {
            float v = pr[e];
            if (v > bv) { bv = v; bi = e; }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (bi == 0x7fffffff) { bi = 0; bv = 0.0f; }  // NaN logits: keep the index valid
        if (lane == 0) {
            idx[j] = bi;
            wt[j] = bv;
            pr[bi] = -SP_INF;
        }
        picked += bv;
        __syncwarp();
    }
    if (renormalize)
        for (int j = lane; j < k; j += 32) wt[j] /= picked;
    __syncwarp();
}


// act[p·I + i] = silu(gate_e[i]·x_t)·(up_e[i]·x_t) for routed pairs p = t·k + j (e = idx[p]),
// and, when sgu is not null, act_s[t·Is + i] the same with the shared expert's [2·Is, H] matrix.
// x: the normed input rows [T, H] (stride H). One warp per output (i, pair), 32 lanes per row.
template <int FMT>
__device__ __forceinline__ void decode_moe_gate_up_impl(const unsigned char* __restrict__ gu, const unsigned short* __restrict__ gs,
                                                        const unsigned char* __restrict__ sgu, const unsigned short* __restrict__ sgs,
                                                        const float* __restrict__ x, int T, const float* __restrict__ logits,
                                                        int ld, int E, int renormalize, int* __restrict__ idx,
                                                        float* __restrict__ wt, int k, int I, int Is, int H,
                                                        float* __restrict__ act, float* __restrict__ act_s) {
    extern __shared__ __align__(16) unsigned char dsm[];
    __shared__ int sidx[MATVEC_MAX_TOKENS * MOE_MAX_K];
    __shared__ float swt[MATVEC_MAX_TOKENS * MOE_MAX_K];
    prefetch_l2_share(sgu, (size_t)2 * Is * WF<FMT>::row_bytes(H));
    PDL_WAIT();
    PDL_LAUNCH();
    // Every block routes the tokens itself (warp t, token t; the other warps start staging
    // meanwhile); block 0 publishes the choice for the down projections.
    {
        int warp = threadIdx.x >> 5;
        float* pr = (float*)(dsm + ((staged_size<FMT>(T, H) + 15) & ~(size_t)15)) + (size_t)warp * E;
        if (warp < T) route_warp(logits + (size_t)warp * ld, E, k, renormalize, pr, sidx + warp * k, swt + warp * k);
    }
    stage_rows<FMT>(x, H, T, H, nullptr, 0.0f, nullptr, dsm);  // ends with a barrier
    if (blockIdx.x == 0)
        for (int e = threadIdx.x; e < T * k; e += blockDim.x) {
            idx[e] = sidx[e];
            wt[e] = swt[e];
        }
    Staged<FMT> st{dsm, H};
    int lane = threadIdx.x & 31;
    int warps = gridDim.x * (blockDim.x >> 5);
    int nch = row_chunks<FMT>(H);
    size_t rb = WF<FMT>::row_bytes(H), rsc = row_scale_words<FMT>(H);
    int routed = T * k * I;
    int total = routed + (sgu ? T * Is : 0);
    for (int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); item < total; item += warps) {
        const unsigned char* w;
        const unsigned short* s;
        size_t g_row, u_row;
        int t;
        float* out;
        if (item < routed) {
            int p = item / I, i = item - p * I;
            t = p / k;
            g_row = (size_t)sidx[p] * 2 * I + i;
            u_row = g_row + I;
            w = gu;
            s = gs;
            out = act + item;
        } else {
            int q = item - routed;
            t = q / Is;
            int i = q - t * Is;
            g_row = i;
            u_row = (size_t)Is + i;
            w = sgu;
            s = sgs;
            out = act_s + q;
        }
        // One token per item: staged row t only.
        float ga = 0.0f, ub = 0.0f;
        {
            for (int c0 = lane; c0 < nch; c0 += 32 * DEC_BATCH) {
                Chunk<FMT> cg[DEC_BATCH], cu[DEC_BATCH];
#pragma unroll
                for (int u = 0; u < DEC_BATCH; u++) {
                    int ch = c0 + u * 32;
                    if (ch < nch) {
                        cg[u] = load_dchunk<FMT>(w + g_row * rb, s + g_row * rsc, ch);
                        cu[u] = load_dchunk<FMT>(w + u_row * rb, s + u_row * rsc, ch);
                    }
                }
#pragma unroll
                for (int u = 0; u < DEC_BATCH; u++) {
                    int ch = c0 + u * 32;
                    if (ch < nch) {
                        ga += dchunk_dot<FMT>(cg[u], st, t, T, ch);
                        ub += dchunk_dot<FMT>(cu[u], st, t, T, ch);
                    }
                }
            }
        }
        ga = warp_sum(ga);
        ub = warp_sum(ub);
        if (lane == 0) *out = silu_f(ga) * ub;
    }
}

// The down half of a token's MoE sum, in one order on every path, so that a token's output does
// not depend on which kernels ran it (this decode kernel, or the grouped kernels and
// moe_combine_slots of a batched step): each slot's dot product d (the routed experts j, then
// the shared expert) by DSLOT_LANES lanes over the row's chunks (lane l: chunks l, l + 16, ...
// in order, then lanes_sum: the grouped down kernel's arithmetic), then
// y (+)= fma(g_shared, d_shared, fma(wt_k-1, d_k-1, ... fma(wt_0, d_0, 0))).
#define DSLOT_LANES 16
#define DSLOT_BATCH 5  // slots per half-warp in flight (a warp: 2·DSLOT_BATCH slots)

// h[t·ldh + r] (+)= Σ_j wt[t·k + j]·(down_{idx[t·k+j]}[r] · act_{t·k+j}) + sigmoid(sg[t·ldsg])·(sdown[r] · act_s[t])
// (the shared term when sdown is not null), summed as above. One warp per (t, r): its two
// halves take the slots in turn, DSLOT_BATCH slots' chunks in flight per lane.
template <int FMT>
__device__ __forceinline__ void decode_moe_down_impl(const unsigned char* __restrict__ dw, const unsigned short* __restrict__ ds,
                                                     const unsigned char* __restrict__ sdw, const unsigned short* __restrict__ sds,
                                                     const float* __restrict__ act, const float* __restrict__ act_s,
                                                     const int* __restrict__ idx, const float* __restrict__ wt,
                                                     const float* __restrict__ sg, int ldsg, int T, int k, int I, int Is,
                                                     int H, float* __restrict__ h, int ldh, int accumulate) {
    extern __shared__ __align__(16) unsigned char dsm[];
    __shared__ int sidx[MATVEC_MAX_TOKENS * MOE_MAX_K];
    __shared__ float swt[MATVEC_MAX_TOKENS * MOE_MAX_K];
    __shared__ float ssg[MATVEC_MAX_TOKENS];
    prefetch_l2_share(sdw, (size_t)H * WF<FMT>::row_bytes(Is));
    PDL_WAIT();
    PDL_LAUNCH();
    for (int e = threadIdx.x; e < T * k; e += blockDim.x) {
        sidx[e] = idx[e];
        swt[e] = wt[e];
    }
    if (sdw && threadIdx.x < T) ssg[threadIdx.x] = sigmoid_f(sg[(size_t)threadIdx.x * ldsg]);
    // Routed activations as T·k rows of I, then the shared ones as T rows of Is.
    size_t routed_bytes = staged_size<FMT>(T * k, I);
    routed_bytes = (routed_bytes + 15) & ~(size_t)15;
    stage_rows<FMT>(act, I, T * k, I, nullptr, 0.0f, nullptr, dsm);
    if (sdw) stage_rows<FMT>(act_s, Is, T, Is, nullptr, 0.0f, nullptr, dsm + routed_bytes);
    Staged<FMT> st{dsm, I};
    Staged<FMT> sst{dsm + routed_bytes, Is};
    int lane = threadIdx.x & 31, half = lane / DSLOT_LANES, sl = lane & (DSLOT_LANES - 1);
    int warps = gridDim.x * (blockDim.x >> 5);
    int nch = row_chunks<FMT>(I), nchs = sdw ? row_chunks<FMT>(Is) : 0;
    int most = max(nch, nchs);
    size_t rb = WF<FMT>::row_bytes(I), rsc = row_scale_words<FMT>(I);
    size_t srb = WF<FMT>::row_bytes(Is), srsc = row_scale_words<FMT>(Is);
    int slots = k + (sdw ? 1 : 0);
    for (int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); item < T * H; item += warps) {
        int t = item / H, r = item - t * H;
        float total = 0.0f;
        for (int s0 = 0; s0 < slots; s0 += 2 * DSLOT_BATCH) {
            float acc[DSLOT_BATCH];
#pragma unroll
            for (int u = 0; u < DSLOT_BATCH; u++) acc[u] = 0.0f;
            for (int ch = sl; ch < most; ch += DSLOT_LANES) {
                Chunk<FMT> c[DSLOT_BATCH];
#pragma unroll
                for (int u = 0; u < DSLOT_BATCH; u++) {
                    int s = s0 + 2 * u + half;
                    if (s < k && ch < nch) {
                        size_t row = (size_t)sidx[t * k + s] * H + r;
                        c[u] = load_dchunk<FMT>(dw + row * rb, ds + row * rsc, ch);
                    } else if (s == k && ch < nchs) {
                        c[u] = load_dchunk<FMT>(sdw + (size_t)r * srb, sds + (size_t)r * srsc, ch);
                    }
                }
#pragma unroll
                for (int u = 0; u < DSLOT_BATCH; u++) {
                    int s = s0 + 2 * u + half;
                    if (s < k && ch < nch)
                        acc[u] += dchunk_dot<FMT>(c[u], st, t * k + s, T * k, ch);
                    else if (s == k && ch < nchs)
                        acc[u] += dchunk_dot<FMT>(c[u], sst, t, T, ch);
                }
            }
#pragma unroll
            for (int u = 0; u < DSLOT_BATCH; u++) {
                float v = lanes_sum(acc[u], DSLOT_LANES);
                float v0 = __shfl_sync(0xffffffffu, v, 0), v1 = __shfl_sync(0xffffffffu, v, DSLOT_LANES);
                int s = s0 + 2 * u;
                if (s < slots) total = __fmaf_rn(s < k ? swt[t * k + s] : ssg[t], v0, total);
                if (s + 1 < slots) total = __fmaf_rn(s + 1 < k ? swt[t * k + s + 1] : ssg[t], v1, total);
            }
        }
        if (lane == 0) {
            float* out = h + (size_t)t * ldh + r;
            *out = accumulate ? *out + total : total;
        }
    }
}

#define DGU_ARGS                                                                                                  \
    const unsigned char *__restrict__ gu, const unsigned short *__restrict__ gs, const unsigned char *__restrict__ sgu, \
        const unsigned short *__restrict__ sgs, const float *__restrict__ x, int T, const float *__restrict__ logits,     \
        int ld, int E, int renormalize, int *__restrict__ idx, float *__restrict__ wt, int k, int I, int Is, int H,      \
        float *__restrict__ act, float *__restrict__ act_s
#define DGU_PASS gu, gs, sgu, sgs, x, T, logits, ld, E, renormalize, idx, wt, k, I, Is, H, act, act_s
extern "C" __global__ void __launch_bounds__(256) decode_moe_gate_up_bf16(DGU_ARGS) { decode_moe_gate_up_impl<0>(DGU_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_moe_gate_up_q8(DGU_ARGS) { decode_moe_gate_up_impl<1>(DGU_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_moe_gate_up_q4(DGU_ARGS) { decode_moe_gate_up_impl<2>(DGU_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_moe_gate_up_fp8(DGU_ARGS) { decode_moe_gate_up_impl<3>(DGU_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_moe_gate_up_q4k(DGU_ARGS) { decode_moe_gate_up_impl<4>(DGU_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_moe_gate_up_q6k(DGU_ARGS) { decode_moe_gate_up_impl<5>(DGU_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_moe_gate_up_q5k(DGU_ARGS) { decode_moe_gate_up_impl<6>(DGU_PASS); }

#define DDOWN_ARGS                                                                                                \
    const unsigned char *__restrict__ dw, const unsigned short *__restrict__ ds, const unsigned char *__restrict__ sdw, \
        const unsigned short *__restrict__ sds, const float *__restrict__ act, const float *__restrict__ act_s,          \
        const int *__restrict__ idx, const float *__restrict__ wt, const float *__restrict__ sg, int ldsg, int T, int k,  \
        int I, int Is, int H, float *__restrict__ h, int ldh, int accumulate
#define DDOWN_PASS dw, ds, sdw, sds, act, act_s, idx, wt, sg, ldsg, T, k, I, Is, H, h, ldh, accumulate
extern "C" __global__ void __launch_bounds__(256) decode_moe_down_bf16(DDOWN_ARGS) { decode_moe_down_impl<0>(DDOWN_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_moe_down_q8(DDOWN_ARGS) { decode_moe_down_impl<1>(DDOWN_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_moe_down_q4(DDOWN_ARGS) { decode_moe_down_impl<2>(DDOWN_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_moe_down_fp8(DDOWN_ARGS) { decode_moe_down_impl<3>(DDOWN_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_moe_down_q4k(DDOWN_ARGS) { decode_moe_down_impl<4>(DDOWN_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_moe_down_q6k(DDOWN_ARGS) { decode_moe_down_impl<5>(DDOWN_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_moe_down_q5k(DDOWN_ARGS) { decode_moe_down_impl<6>(DDOWN_PASS); }

// ---- Grouped small-batch experts (batched decode): each chosen expert's weights read once ----
// A batched decode step of 9-128 tokens picks each expert for a few tokens. The pairs are
// sorted by expert (moe_group_by_expert); a block takes one tile (an expert and up to
// TENSOR_GEMM_TOKENS of its pairs) and a slice of that expert's rows, loads each weight chunk
// once and dots it with every pair of the tile (GS_TOK pairs per pass). Activations are int8
// per group of 32 in global memory (gemm_tensor_quantize_acts, the CPU's quantization), dotted
// as dchunk_dot does: (f16(s)·d)·isum. No tile is padded: a pair costs its dot products only.

#define GS_TOK 4       // pairs per pass over the weight chunks
#define GS_ROWS 2      // gate_up: output rows (gate and up row each) per warp
#define GS_BATCH 2     // gate_up: chunks per row and lane in flight
#define GD_ROWS 8      // down: output rows per warp (16 lanes per row)
#define GD_TOK 2       // down: pairs per pass over the weight chunks
#define GD_BATCH 2     // down: chunks per row and lane in flight

// The block's tile: (expert, first, count) from `tiles` (pairs sorted by expert), or with
// dense > 0 one matrix for all `dense` rows (the shared expert: "expert" 0, pair = row, rows
// blockIdx.y·MATVEC_MAX_TOKENS on: a small matrix, read again per tile from L2, in enough
// blocks to fill the GPU).
__device__ __forceinline__ void grouped_tile(const int* __restrict__ tiles, int dense, int& e, int& first, int& count) {
    if (dense > 0) {
        e = 0;
        first = blockIdx.y * MATVEC_MAX_TOKENS;
        count = max(0, min(MATVEC_MAX_TOKENS, dense - first));
    } else {
        const int* tile = tiles + 3 * blockIdx.y;
        e = tile[0];
        first = tile[1];
        count = tile[2];
    }
}

// Pair `n` of the block's tile (-1 past its count): order[first + n], or first + n when dense.
__device__ __forceinline__ int grouped_pair(const int* __restrict__ order, int first, int n, int count) {
    if (n >= count) return -1;
    return order ? __ldg(order + first + n) : first + n;
}

// One Q8/Q4 chunk against the int8 activations of one row (`q` its codes, `d` its scales).
template <int FMT>
__device__ __forceinline__ float gchunk_dot(const Chunk<FMT>& c, const signed char* __restrict__ q,
                                            const float* __restrict__ d, int ch) {
    const int4* xq = (const int4*)(q + (size_t)ch * 32);
    int4 lo = __ldg(xq), hi = __ldg(xq + 1);
    int dp = chunk_isum<FMT>(c, lo, hi);
    if (FMT == 2) {
        const int ones = 0x01010101;
        int sum = 0;
        sum = __dp4a(ones, lo.x, sum);
        sum = __dp4a(ones, lo.y, sum);
        sum = __dp4a(ones, lo.z, sum);
        sum = __dp4a(ones, lo.w, sum);
        sum = __dp4a(ones, hi.x, sum);
        sum = __dp4a(ones, hi.y, sum);
        sum = __dp4a(ones, hi.z, sum);
        sum = __dp4a(ones, hi.w, sum);
        dp -= 8 * sum;
    }
    return c.s * __ldg(d + ch) * (float)dp;
}

// act[p·I + i] = silu(gate_e[i]·x_t)·(up_e[i]·x_t) for the pairs p = t·k + j of the block's tile
// (expert e): x as int8 rows xq [T, H], scales xd [T, H/32]. One warp per GS_ROWS rows i, its
// lanes over the chunks of the gate and up rows (lane l: chunks l, l + 32, ... in order, as the
// decode kernel sums them).
template <int FMT>
__device__ __forceinline__ void grouped_gate_up_impl(const unsigned char* __restrict__ gu, const unsigned short* __restrict__ gs,
                                                     const signed char* __restrict__ xq, const float* __restrict__ xd,
                                                     const int* __restrict__ tiles, const int* __restrict__ order, int k,
                                                     int I, int H, float* __restrict__ act, int dense) {
    int e, first, count;
    grouped_tile(tiles, dense, e, first, count);
    int lane = threadIdx.x & 31;
    int i0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * GS_ROWS;
    if (count == 0 || i0 >= I) return;  // uniform per warp
    int nch = H >> 5;
    size_t rb = WF<FMT>::row_bytes(H), rsc = H >> 5;
    for (int t0 = 0; t0 < count; t0 += GS_TOK) {
        int pair[GS_TOK];
#pragma unroll
        for (int u = 0; u < GS_TOK; u++) pair[u] = grouped_pair(order, first, t0 + u, count);
        float ga[GS_ROWS][GS_TOK], ub[GS_ROWS][GS_TOK];
#pragma unroll
        for (int r = 0; r < GS_ROWS; r++)
#pragma unroll
            for (int u = 0; u < GS_TOK; u++) ga[r][u] = ub[r][u] = 0.0f;
        for (int c0 = lane; c0 < nch; c0 += 32 * GS_BATCH) {
            Chunk<FMT> cg[GS_ROWS][GS_BATCH], cu[GS_ROWS][GS_BATCH];
#pragma unroll
            for (int r = 0; r < GS_ROWS; r++) {
                size_t g_row = (size_t)e * 2 * I + i0 + r, u_row = g_row + I;
#pragma unroll
                for (int b = 0; b < GS_BATCH; b++) {
                    int ch = c0 + b * 32;
                    if (ch < nch && i0 + r < I) {
                        cg[r][b] = load_dchunk<FMT>(gu + g_row * rb, gs + g_row * rsc, ch);
                        cu[r][b] = load_dchunk<FMT>(gu + u_row * rb, gs + u_row * rsc, ch);
                    }
                }
            }
#pragma unroll
            for (int b = 0; b < GS_BATCH; b++) {
                int ch = c0 + b * 32;
                if (ch >= nch) break;
#pragma unroll
                for (int u = 0; u < GS_TOK; u++) {
                    if (pair[u] < 0) break;
                    int t = pair[u] / k;
                    const signed char* q = xq + (size_t)t * H;
                    const float* d = xd + (size_t)t * rsc;
#pragma unroll
                    for (int r = 0; r < GS_ROWS; r++) {
                        if (i0 + r < I) {
                            ga[r][u] += gchunk_dot<FMT>(cg[r][b], q, d, ch);
                            ub[r][u] += gchunk_dot<FMT>(cu[r][b], q, d, ch);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < GS_TOK; u++) {
            if (pair[u] < 0) break;  // uniform per warp
#pragma unroll
            for (int r = 0; r < GS_ROWS; r++) {
                float g = warp_sum(ga[r][u]), v = warp_sum(ub[r][u]);
                if (lane == 0 && i0 + r < I) act[(size_t)pair[u] * I + i0 + r] = silu_f(g) * v;
            }
        }
    }
}

// out[p·H + r] = down_e[r]·act_p for the pairs p of the block's tile (expert e), act as int8
// rows aq [pairs, I], scales ad [pairs, I/32]. One warp per GD_ROWS rows r, 16 lanes per row
// (a released expert's down row has 16 chunks of 32): lane l takes rows 2j + l/16 (j < 4) and
// chunks l%16, l%16 + 16, ..., GD_BATCH chunks per row in flight.
template <int FMT>
__device__ __forceinline__ void grouped_down_impl(const unsigned char* __restrict__ dw, const unsigned short* __restrict__ ds,
                                                  const signed char* __restrict__ aq, const float* __restrict__ ad,
                                                  const int* __restrict__ tiles, const int* __restrict__ order, int I, int H,
                                                  float* __restrict__ out, int dense) {
    int e, first, count;
    grouped_tile(tiles, dense, e, first, count);
    int lane = threadIdx.x & 31;
    int r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * GD_ROWS;
    if (count == 0 || r0 >= H) return;  // uniform per warp
    const int LPR = 16, RPL = GD_ROWS / 2;
    int nch = I >> 5;
    int sl = lane & (LPR - 1), sr = lane / LPR;
    size_t rb = WF<FMT>::row_bytes(I), rsc = I >> 5;
    for (int t0 = 0; t0 < count; t0 += GD_TOK) {
        int pair[GD_TOK];
#pragma unroll
        for (int u = 0; u < GD_TOK; u++) pair[u] = grouped_pair(order, first, t0 + u, count);
        float acc[RPL][GD_TOK];
#pragma unroll
        for (int j = 0; j < RPL; j++)
#pragma unroll
            for (int u = 0; u < GD_TOK; u++) acc[j][u] = 0.0f;
        for (int c0 = sl; c0 < nch; c0 += LPR * GD_BATCH) {
            Chunk<FMT> c[RPL][GD_BATCH];
#pragma unroll
            for (int j = 0; j < RPL; j++) {
                int r = r0 + 2 * j + sr;
                size_t row = (size_t)e * H + r;
#pragma unroll
                for (int b = 0; b < GD_BATCH; b++) {
                    int ch = c0 + b * LPR;
                    if (r < H && ch < nch) c[j][b] = load_dchunk<FMT>(dw + row * rb, ds + row * rsc, ch);
                }
            }
#pragma unroll
            for (int b = 0; b < GD_BATCH; b++) {
                int ch = c0 + b * LPR;
                if (ch >= nch) break;
#pragma unroll
                for (int u = 0; u < GD_TOK; u++) {
                    if (pair[u] < 0) break;
                    const signed char* q = aq + (size_t)pair[u] * I;
                    const float* d = ad + (size_t)pair[u] * rsc;
#pragma unroll
                    for (int j = 0; j < RPL; j++)
                        if (r0 + 2 * j + sr < H) acc[j][u] += gchunk_dot<FMT>(c[j][b], q, d, ch);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < GD_TOK; u++) {
            if (pair[u] < 0) break;  // uniform per warp
#pragma unroll
            for (int j = 0; j < RPL; j++) {
                float v = lanes_sum(acc[j][u], LPR);
                int r = r0 + 2 * j + sr;
                if (sl == 0 && r < H) out[(size_t)pair[u] * H + r] = v;
            }
        }
    }
}

#define GGU_ARGS                                                                                                  \
    const unsigned char *__restrict__ gu, const unsigned short *__restrict__ gs, const signed char *__restrict__ xq, \
        const float *__restrict__ xd, const int *__restrict__ tiles, const int *__restrict__ order, int k, int I, int H, \
        float *__restrict__ act, int dense
#define GDOWN_ARGS                                                                                                \
    const unsigned char *__restrict__ dw, const unsigned short *__restrict__ ds, const signed char *__restrict__ aq, \
        const float *__restrict__ ad, const int *__restrict__ tiles, const int *__restrict__ order, int I, int H,       \
        float *__restrict__ out, int dense
extern "C" __global__ void __launch_bounds__(256) moe_grouped_gate_up_q8(GGU_ARGS) {
    grouped_gate_up_impl<1>(gu, gs, xq, xd, tiles, order, k, I, H, act, dense);
}
extern "C" __global__ void __launch_bounds__(256) moe_grouped_gate_up_q4(GGU_ARGS) {
    grouped_gate_up_impl<2>(gu, gs, xq, xd, tiles, order, k, I, H, act, dense);
}
extern "C" __global__ void __launch_bounds__(256) moe_grouped_down_q8(GDOWN_ARGS) {
    grouped_down_impl<1>(dw, ds, aq, ad, tiles, order, I, H, out, dense);
}
extern "C" __global__ void __launch_bounds__(256) moe_grouped_down_q4(GDOWN_ARGS) {
    grouped_down_impl<2>(dw, ds, aq, ad, tiles, order, I, H, out, dense);
}

// ---- Grouped expert GEMMs (prefill): pairs sorted by expert, weighted sums combined ----

// Sorts the `pairs` (token, expert) pairs by expert for the grouped GEMMs: `order` lists the
// pair ids of expert 0, then of expert 1, ...; tiles[3j ..] = (expert, first index into order,
// count ≤ tile) for the used tiles and count 0 for the rest up to max_tiles. One block; the
// order within an expert varies from run to run, which no result depends on (each output row
// is computed from its own input row alone).
extern "C" __global__ void moe_group_by_expert(const int* __restrict__ idx, int pairs, int E, int* __restrict__ order,
                                               int* __restrict__ tiles, int max_tiles, int tile) {
    extern __shared__ int moe_sort_sh[];  // count[E], start[E], tile_start[E]
    __shared__ int used;
    int* count = moe_sort_sh;
    int* start = moe_sort_sh + E;
    int* tstart = moe_sort_sh + 2 * E;
    int tid = threadIdx.x;
    for (int e = tid; e < E; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int p = tid; p < pairs; p += blockDim.x) atomicAdd(&count[idx[p]], 1);
    __syncthreads();
    if (tid == 0) {
        int s = 0, ts = 0;
        for (int e = 0; e < E; e++) {
            start[e] = s;
            tstart[e] = ts;
            s += count[e];
            ts += (count[e] + tile - 1) / tile;
        }
        used = ts;
    }
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x)
        for (int j = 0; j * tile < count[e]; j++) {
            int* t = tiles + 3 * (tstart[e] + j);
            t[0] = e;
            t[1] = start[e] + j * tile;
            t[2] = min(tile, count[e] - j * tile);
        }
    for (int t = used + tid; t < max_tiles; t += blockDim.x) {
        tiles[3 * t] = 0;
        tiles[3 * t + 1] = 0;
        tiles[3 * t + 2] = 0;
    }
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int p = tid; p < pairs; p += blockDim.x) {
        int e = idx[p];
        order[start[e] + atomicAdd(&count[e], 1)] = p;
    }
}

// y[t, r] += Σ_j wt[t·k + j] · out[(t·k + j)·H + r]: the routed experts' weighted sum
// (grid-stride).
extern "C" __global__ void moe_combine(const float* __restrict__ out, const float* __restrict__ wt,
                                       float* __restrict__ y, int T, int k, int H) {
    size_t all = (size_t)T * H, step = gridDim.x * (size_t)blockDim.x;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < all; e += step) {
        int t = (int)(e / H), r = (int)(e - (size_t)t * H);
        float total = 0.0f;
        for (int j = 0; j < k; j++) total += wt[t * k + j] * out[((size_t)t * k + j) * H + r];
        y[e] += total;
    }
}

// Routing of a batched decode step, one warp per token (8 per block) with route_warp, the decode
// kernels' arithmetic: idx/wt [T, k] from the router logits (row t of `logits`, stride ld).
// Dynamic shared memory: 8·E floats.
extern "C" __global__ void __launch_bounds__(256) moe_route_warps(const float* __restrict__ logits, int ld, int E, int k,
                                                                  int renormalize, int T, int* __restrict__ idx,
                                                                  float* __restrict__ wt) {
    extern __shared__ float route_sh[];
    int warp = threadIdx.x >> 5;
    int t = blockIdx.x * (blockDim.x >> 5) + warp;
    if (t >= T) return;  // uniform per warp; route_warp syncs the warp only
    route_warp(logits + (size_t)t * ld, E, k, renormalize, route_sh + (size_t)warp * E, idx + (size_t)t * k,
               wt + (size_t)t * k);
}

// y[t·ldy + r] (+)= the slots' sum in decode_moe_down's order: fma over the routed pairs'
// unweighted outputs out[(t·k + j)·H + r] with wt[t·k + j], j in order, then (out_s not null)
// the shared expert's out_s[t·H + r] with sigmoid(sg[t·ldsg]) (grid-stride).
extern "C" __global__ void moe_combine_slots(const float* __restrict__ out, const float* __restrict__ wt,
                                             const float* __restrict__ out_s, const float* __restrict__ sg, int ldsg,
                                             float* __restrict__ y, int ldy, int T, int k, int H, int accumulate) {
    size_t all = (size_t)T * H, step = gridDim.x * (size_t)blockDim.x;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < all; e += step) {
        int t = (int)(e / H), r = (int)(e - (size_t)t * H);
        float total = 0.0f;
        for (int j = 0; j < k; j++) total = __fmaf_rn(wt[t * k + j], out[((size_t)t * k + j) * H + r], total);
        if (out_s) total = __fmaf_rn(sigmoid_f(sg[(size_t)t * ldsg]), out_s[(size_t)t * H + r], total);
        float* o = y + (size_t)t * ldy + r;
        *o = accumulate ? *o + total : total;
    }
}
