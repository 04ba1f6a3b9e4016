// Decode kernels (batches of at most MATVEC_MAX_TOKENS tokens): every block first stages the input
// rows in shared memory — RMS-normed when asked (the norm kernel is fused away), and for
// int8 weights quantized to int8 per group of 32 exactly as the CPU engine does
// (spindle_kernels::quant::quantize_acts_ref) — then loops over many output rows, so the
// staging is paid once per block and the grid is sized to the GPU, not to the matrix.
// Weight rows are read in 16-byte chunks, DEC_BATCH chunks per lane issued before any is
// used, by `lpr` lanes per row (several rows per warp when rows are short).
//
// Q8/Q4 dot products are integer (dp4a) per group of 32, then scaled: f16(s)·d·isum, the
// CPU's order. bf16 weights multiply f32 activations, as on the CPU.

#define DEC_BATCH 4
#define STAGE_BATCH 4

// ---- Staged activations (dynamic shared memory) ----
// FMT 0: f32 x[T][cols]. FMT 1, 2: i8 q[T][cols], then f32 d[T][cols/32], then i32 sum[T][cols/32].

template <int FMT>
struct Staged {
    const unsigned char* base;
    int cols;
    __device__ const float* xf(int t) const { return (const float*)base + (size_t)t * cols; }
    __device__ const signed char* q(int t) const { return (const signed char*)base + (size_t)t * cols; }
    __device__ const float* d(int t, int T) const {
        return (const float*)(base + (size_t)T * cols) + (size_t)t * (cols >> 5);
    }
    __device__ const int* sum(int t, int T) const {
        return (const int*)(base + (size_t)T * cols + (size_t)T * (cols >> 5) * 4) + (size_t)t * (cols >> 5);
    }
};

// Bytes stage_rows<FMT> fills for T rows of cols.
template <int FMT>
__device__ __forceinline__ size_t staged_size(int T, int cols) {
    return FMT == 0 ? (size_t)T * cols * 4 : (size_t)T * cols + (size_t)T * (cols >> 5) * 8;
}

// Stages rows x[t·ldx + c] (t < T, c < cols) into `sm` for FMT, optionally RMS-normed with a
// zero-centred weight (x·rsqrt(mean x² + eps)·(1 + nw[c])); block 0 also writes the normed rows
// to xn[t·cols + c] when xn is not null. Needs cols % 32 == 0 for FMT 1, 2 and cols % 4 == 0,
// x and ldx 16-byte aligned for all. Ends with __syncthreads().
template <int FMT>
__device__ void stage_rows(const float* __restrict__ x, int ldx, int T, int cols, const float* __restrict__ nw,
                           float eps, float* __restrict__ xn, unsigned char* sm) {
    __shared__ float part[8][MATVEC_MAX_TOKENS];
    __shared__ float rs[MATVEC_MAX_TOKENS];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int quads = cols >> 2;
    if (nw) {
        float ss[MATVEC_MAX_TOKENS];
#pragma unroll
        for (int t = 0; t < MATVEC_MAX_TOKENS; t++) ss[t] = 0.0f;
#pragma unroll
        for (int t = 0; t < MATVEC_MAX_TOKENS; t++) {
            if (t < T) {
                const float4* xr = (const float4*)(x + (size_t)t * ldx);
#pragma unroll 4
                for (int c = tid; c < quads; c += blockDim.x) {
                    float4 v = __ldg(xr + c);
                    ss[t] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
                }
            }
        }
#pragma unroll
        for (int t = 0; t < MATVEC_MAX_TOKENS; t++) {
            float s = warp_sum(ss[t]);
            if (lane == 0 && t < T) part[warp][t] = s;
        }
        __syncthreads();
        if (tid < T) {
            float s = 0.0f;
            for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += part[w][tid];
            rs[tid] = rsqrtf(s / cols + eps);
        }
        __syncthreads();
    }
    bool write_xn = xn && blockIdx.x == 0;
    // The T rows as one run of T·quads quads (a row's quads are a multiple of 8, so a group
    // never straddles rows): thread `tid` handles quads tid, tid + blockDim, ..., loading
    // STAGE_BATCH of them before using any; 8 consecutive lanes hold one group of 32.
    int all = T * quads;
    for (int c0 = 0; c0 < all; c0 += blockDim.x * STAGE_BATCH) {
        float4 vb[STAGE_BATCH];
#pragma unroll
        for (int u = 0; u < STAGE_BATCH; u++) {
            int c = c0 + u * blockDim.x + tid;
            int t = c / quads;
            vb[u] = c < all ? __ldg((const float4*)(x + (size_t)t * ldx) + (c - t * quads))
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < STAGE_BATCH; u++) {
            if (c0 + u * blockDim.x >= all) break;  // uniform across the block
            int cf = c0 + u * blockDim.x + tid;
            bool live = cf < all;
            int t = cf / quads, c = cf - t * quads;
            float4 v = vb[u];
            if (nw && live) {
                float r = rs[t];
                float4 w = __ldg((const float4*)nw + c);
                v.x = v.x * r * (1.0f + w.x);
                v.y = v.y * r * (1.0f + w.y);
                v.z = v.z * r * (1.0f + w.z);
                v.w = v.w * r * (1.0f + w.w);
            }
            if (write_xn && live) ((float4*)(xn + (size_t)t * cols))[c] = v;
            if (FMT == 0) {
                if (live) ((float4*)sm)[cf] = v;
            } else {
                float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
                for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
                float d = amax / 127.0f;
                float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
                int q0 = (int)roundf(v.x * inv), q1 = (int)roundf(v.y * inv);
                int q2 = (int)roundf(v.z * inv), q3 = (int)roundf(v.w * inv);
                int s = q0 + q1 + q2 + q3;
#pragma unroll
                for (int o = 1; o < 8; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                if (live) {
                    unsigned int packed = (q0 & 0xff) | ((q1 & 0xff) << 8) | ((q2 & 0xff) << 16) |
                                          ((unsigned int)(q3 & 0xff) << 24);
                    ((unsigned int*)sm)[cf] = packed;
                    if ((lane & 7) == 0) {
                        // Group g of the whole run = t·G + c/8.
                        int g = cf >> 3;
                        ((float*)(sm + (size_t)T * cols))[g] = d;
                        ((int*)(sm + (size_t)T * cols + (size_t)T * (cols >> 5) * 4))[g] = s;
                    }
                }
            }
        }
    }
    __syncthreads();
}

// ---- One chunk of a weight row against one staged token ----
// A chunk is one group of 32 weights for Q8 (32 bytes) and Q4 (16 bytes), 8 weights for bf16.

template <int FMT>
struct Chunk {
    uint4 a, b;  // b only for Q8
    float s;     // the group's f16 scale, widened
};

template <int FMT>
__device__ __forceinline__ Chunk<FMT> load_dchunk(const unsigned char* __restrict__ w, const unsigned short* __restrict__ s,
                                                  int ch) {
    Chunk<FMT> c;
    if (FMT == 0) {
        c.a = __ldg((const uint4*)w + ch);
        c.s = 1.0f;
    } else if (FMT == 1) {
        c.a = __ldg((const uint4*)w + 2 * ch);
        c.b = __ldg((const uint4*)w + 2 * ch + 1);
        c.s = f16_to_f32(__ldg(s + ch));
    } else {
        c.a = __ldg((const uint4*)w + ch);
        c.s = f16_to_f32(__ldg(s + ch));
    }
    return c;
}

template <int FMT>
__device__ __forceinline__ float dchunk_dot(const Chunk<FMT>& c, const Staged<FMT>& st, int t, int T, int ch) {
    if (FMT == 0) {
        const float4* x = (const float4*)(st.xf(t) + (size_t)ch * 8);
        float4 x0 = x[0], x1 = x[1];
        float w[8];
        unpack8(c.a, w);
        return w[0] * x0.x + w[1] * x0.y + w[2] * x0.z + w[3] * x0.w + w[4] * x1.x + w[5] * x1.y + w[6] * x1.z +
               w[7] * x1.w;
    } else {
        const int4* xq = (const int4*)(st.q(t) + (size_t)ch * 32);
        int4 lo = xq[0], hi = xq[1];
        int dp = 0;
        if (FMT == 1) {
            dp = __dp4a((int)c.a.x, lo.x, dp);
            dp = __dp4a((int)c.a.y, lo.y, dp);
            dp = __dp4a((int)c.a.z, lo.z, dp);
            dp = __dp4a((int)c.a.w, lo.w, dp);
            dp = __dp4a((int)c.b.x, hi.x, dp);
            dp = __dp4a((int)c.b.y, hi.y, dp);
            dp = __dp4a((int)c.b.z, hi.z, dp);
            dp = __dp4a((int)c.b.w, hi.w, dp);
        } else {
            const unsigned int m = 0x0f0f0f0fu;
            dp = __dp4a((int)(c.a.x & m), lo.x, dp);
            dp = __dp4a((int)(c.a.y & m), lo.y, dp);
            dp = __dp4a((int)(c.a.z & m), lo.z, dp);
            dp = __dp4a((int)(c.a.w & m), lo.w, dp);
            dp = __dp4a((int)((c.a.x >> 4) & m), hi.x, dp);
            dp = __dp4a((int)((c.a.y >> 4) & m), hi.y, dp);
            dp = __dp4a((int)((c.a.z >> 4) & m), hi.z, dp);
            dp = __dp4a((int)((c.a.w >> 4) & m), hi.w, dp);
            dp -= 8 * st.sum(t, T)[ch];
        }
        return c.s * st.d(t, T)[ch] * (float)dp;
    }
}

// Chunks per row of `cols` weights.
template <int FMT>
__device__ __forceinline__ int row_chunks(int cols) {
    return FMT == 0 ? cols >> 3 : cols >> 5;
}

// acc[t] += this lane's share (chunks sl, sl + lpr, ...) of row (w, s) · staged token t.
template <int FMT, int NT>
__device__ __forceinline__ void row_dots(const unsigned char* __restrict__ w, const unsigned short* __restrict__ s,
                                         const Staged<FMT>& st, int T, int nch, int sl, int lpr, float* acc) {
    for (int c0 = sl; c0 < nch; c0 += lpr * DEC_BATCH) {
        Chunk<FMT> c[DEC_BATCH];
#pragma unroll
        for (int u = 0; u < DEC_BATCH; u++) {
            int ch = c0 + u * lpr;
            if (ch < nch) c[u] = load_dchunk<FMT>(w, s, ch);
        }
#pragma unroll
        for (int u = 0; u < DEC_BATCH; u++) {
            int ch = c0 + u * lpr;
            if (ch < nch) {
#pragma unroll
                for (int t = 0; t < NT; t++)
                    if (t < T) acc[t] += dchunk_dot<FMT>(c[u], st, t, T, ch);
            }
        }
    }
}

// Sum over the lpr lanes of a sub-row (lpr a power of two; the whole warp calls it).
__device__ __forceinline__ float lanes_sum(float v, int lpr) {
    for (int o = lpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// y = x·Wᵀ for T ≤ NT tokens. Output j (j < outs) is, per token t,
//   v = row j · x_t, or with `pair` > 0: v = silu(row j · x_t) · (row j + pair · x_t) (SwiGLU);
//   v *= sigmoid(gate[t·ldg]) when gate is not null; y[t·ldy + j] = v, or += v with `accumulate`.
// Input staging as stage_rows (optional fused norm nw/eps, normed copy to xn).
// With CONV (GDN's in_proj): outputs j < cC are conv channels: y[t·ldy + j] = silu(causal conv
// over [cstate rows | this step's outputs]) as gdn_conv, and cstate keeps the last cK − 1 rows.
template <int FMT, int NT, bool CONV>
__device__ __forceinline__ void dmv_impl(const unsigned char* __restrict__ W, const unsigned short* __restrict__ S,
                                         int outs, int cols, const float* __restrict__ x, int ldx, int T,
                                         const float* __restrict__ nw, float eps, float* __restrict__ xn,
                                         float* __restrict__ y, int ldy, int accumulate, int pair,
                                         const float* __restrict__ gate, int ldg, int lpr,
                                         float* __restrict__ cstate, const float* __restrict__ cw, int cK, int cC) {
    extern __shared__ __align__(16) unsigned char dsm[];
    stage_rows<FMT>(x, ldx, T, cols, nw, eps, xn, dsm);
    Staged<FMT> st{dsm, cols};
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int subs = 32 / lpr, sub = lane / lpr, sl = lane % lpr;
    int warps = gridDim.x * (blockDim.x >> 5);
    int nch = row_chunks<FMT>(cols);
    size_t rb = WF<FMT>::row_bytes(cols), rsc = cols >> 5;
    for (int base = (blockIdx.x * (blockDim.x >> 5) + warp) * subs; base < outs; base += warps * subs) {
        int j = base + sub;
        bool live = j < outs;
        int r = live ? j : outs - 1;
        float a[NT], b[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) a[t] = b[t] = 0.0f;
        // The conv's state rows and taps, loaded before the weights so their latency overlaps.
        float cs[DECODE_CONV_WINDOW], wk[DECODE_CONV_WINDOW];
        bool conv_row = CONV && live && sl == 0 && j < cC;
        if (CONV) {
#pragma unroll
            for (int q = 0; q < DECODE_CONV_WINDOW; q++) {
                cs[q] = conv_row && q < cK - 1 ? cstate[(size_t)q * cC + j] : 0.0f;
                wk[q] = conv_row && q < cK ? cw[j * cK + q] : 0.0f;
            }
        }
        row_dots<FMT, NT>(W + (size_t)r * rb, S + (size_t)r * rsc, st, T, nch, sl, lpr, a);
        if (pair) row_dots<FMT, NT>(W + (size_t)(r + pair) * rb, S + (size_t)(r + pair) * rsc, st, T, nch, sl, lpr, b);
        if (CONV) {
#pragma unroll
            for (int t = 0; t < NT; t++) a[t] = t < T ? lanes_sum(a[t], lpr) : 0.0f;
            if (conv_row) {
                // Window row q: state row q (q < K − 1), then this step's outputs.
                int past = cK - 1;
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t < T) {
                        float acc = 0.0f;
#pragma unroll
                        for (int q = 0; q < DECODE_CONV_WINDOW; q++) {
                            if (q < cK) {
                                int w = t + q;
                                float v = w < past ? cs[w < DECODE_CONV_WINDOW ? w : 0] : a[w - past < NT ? w - past : 0];
                                acc += wk[q] * v;
                            }
                        }
                        y[(size_t)t * ldy + j] = silu_f(acc);
                    }
                }
                // T is 1 in the single-token kernels: the indices below are then constants.
                int tt = NT == 1 ? 1 : T;
#pragma unroll
                for (int q = 0; q < DECODE_CONV_WINDOW; q++) {
                    if (q < past) {
                        int w = tt + q;
                        cstate[(size_t)q * cC + j] =
                            w < past ? cs[w < DECODE_CONV_WINDOW ? w : 0] : a[w - past < NT ? w - past : 0];
                    }
                }
            } else if (live && sl == 0) {
                for (int t = 0; t < T; t++) y[(size_t)t * ldy + j] = a[t < NT ? t : 0];
            }
            continue;
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < T) {
                float v = lanes_sum(a[t], lpr);
                if (pair) v = silu_f(v) * lanes_sum(b[t], lpr);
                if (live && sl == 0) {
                    if (gate) v *= sigmoid_f(gate[(size_t)t * ldg]);
                    float* out = y + (size_t)t * ldy + j;
                    *out = accumulate ? *out + v : v;
                }
            }
        }
    }
}

#define DMV_ARGS                                                                                                \
    const unsigned char *__restrict__ W, const unsigned short *__restrict__ S, int outs, int cols,             \
        const float *__restrict__ x, int ldx, int T, const float *__restrict__ nw, float eps,                  \
        float *__restrict__ xn, float *__restrict__ y, int ldy, int accumulate, int pair,                      \
        const float *__restrict__ gate, int ldg, int lpr
#define DMV_PASS W, S, outs, cols, x, ldx, T, nw, eps, xn, y, ldy, accumulate, pair, gate, ldg, lpr
#define DMV_NOCONV nullptr, nullptr, 0, 0
extern "C" __global__ void __launch_bounds__(256) dmv_bf16_t1(DMV_ARGS) { dmv_impl<0, 1, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) dmv_q8_t1(DMV_ARGS) { dmv_impl<1, 1, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) dmv_q4_t1(DMV_ARGS) { dmv_impl<2, 1, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) dmv_bf16_t8(DMV_ARGS) { dmv_impl<0, MATVEC_MAX_TOKENS, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) dmv_q8_t8(DMV_ARGS) { dmv_impl<1, MATVEC_MAX_TOKENS, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) dmv_q4_t8(DMV_ARGS) { dmv_impl<2, MATVEC_MAX_TOKENS, false>(DMV_PASS, DMV_NOCONV); }
#define DMVC_ARGS DMV_ARGS, float *__restrict__ cstate, const float *__restrict__ cw, int cK, int cC
#define DMVC_PASS DMV_PASS, cstate, cw, cK, cC
extern "C" __global__ void __launch_bounds__(256) dmvc_bf16_t1(DMVC_ARGS) { dmv_impl<0, 1, true>(DMVC_PASS); }
extern "C" __global__ void __launch_bounds__(256) dmvc_q8_t1(DMVC_ARGS) { dmv_impl<1, 1, true>(DMVC_PASS); }
extern "C" __global__ void __launch_bounds__(256) dmvc_q4_t1(DMVC_ARGS) { dmv_impl<2, 1, true>(DMVC_PASS); }
extern "C" __global__ void __launch_bounds__(256) dmvc_bf16_t8(DMVC_ARGS) { dmv_impl<0, MATVEC_MAX_TOKENS, true>(DMVC_PASS); }
extern "C" __global__ void __launch_bounds__(256) dmvc_q8_t8(DMVC_ARGS) { dmv_impl<1, MATVEC_MAX_TOKENS, true>(DMVC_PASS); }
extern "C" __global__ void __launch_bounds__(256) dmvc_q4_t8(DMVC_ARGS) { dmv_impl<2, MATVEC_MAX_TOKENS, true>(DMVC_PASS); }

// ---- Mixture of experts, decode (MODEL_MATH §1.6) ----

#define DOWN_BATCH 8  // chunks per lane in flight in the down projections

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
__device__ __forceinline__ void dmoe_gate_up_impl(const unsigned char* __restrict__ gu, const unsigned short* __restrict__ gs,
                                                  const unsigned char* __restrict__ sgu, const unsigned short* __restrict__ sgs,
                                                  const float* __restrict__ x, int T, const float* __restrict__ logits,
                                                  int ld, int E, int renormalize, int* __restrict__ idx,
                                                  float* __restrict__ wt, int k, int I, int Is, int H,
                                                  float* __restrict__ act, float* __restrict__ act_s) {
    extern __shared__ __align__(16) unsigned char dsm[];
    __shared__ int sidx[MATVEC_MAX_TOKENS * MOE_MAX_K];
    __shared__ float swt[MATVEC_MAX_TOKENS * MOE_MAX_K];
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
    size_t rb = WF<FMT>::row_bytes(H), rsc = H >> 5;
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

// h[t·ldh + r] (+)= Σ_j wt[t·k + j]·(down_{idx[t·k+j]}[r] · act_{t·k+j}) + sigmoid(sg[t·ldsg])·(sdown[r] · act_s[t])
// (the shared term when sdown is not null). One warp per (t, r): the lanes share the chunks of
// all k (+1) rows, so every lane has DOWN_BATCH loads in flight.
template <int FMT>
__device__ __forceinline__ void dmoe_down_impl(const unsigned char* __restrict__ dw, const unsigned short* __restrict__ ds,
                                               const unsigned char* __restrict__ sdw, const unsigned short* __restrict__ sds,
                                               const float* __restrict__ act, const float* __restrict__ act_s,
                                               const int* __restrict__ idx, const float* __restrict__ wt,
                                               const float* __restrict__ sg, int ldsg, int T, int k, int I, int Is,
                                               int H, float* __restrict__ h, int ldh, int accumulate) {
    extern __shared__ __align__(16) unsigned char dsm[];
    __shared__ int sidx[MATVEC_MAX_TOKENS * MOE_MAX_K];
    __shared__ float swt[MATVEC_MAX_TOKENS * MOE_MAX_K];
    __shared__ float ssg[MATVEC_MAX_TOKENS];
    for (int e = threadIdx.x; e < T * k; e += blockDim.x) {
        sidx[e] = idx[e];
        swt[e] = wt[e];
    }
    if (sdw && threadIdx.x < T) ssg[threadIdx.x] = sigmoid_f(sg[(size_t)threadIdx.x * ldsg]);
    // Routed activations as T·k rows of I, then the shared ones as T rows of Is.
    size_t routed_bytes = FMT == 0 ? (size_t)T * k * I * 4 : (size_t)T * k * I + (size_t)T * k * (I >> 5) * 8;
    routed_bytes = (routed_bytes + 15) & ~(size_t)15;
    stage_rows<FMT>(act, I, T * k, I, nullptr, 0.0f, nullptr, dsm);
    if (sdw) stage_rows<FMT>(act_s, Is, T, Is, nullptr, 0.0f, nullptr, dsm + routed_bytes);
    Staged<FMT> st{dsm, I};
    Staged<FMT> sst{dsm + routed_bytes, Is};
    int lane = threadIdx.x & 31;
    int warps = gridDim.x * (blockDim.x >> 5);
    int nch = row_chunks<FMT>(I), nchs = row_chunks<FMT>(Is);
    size_t rb = WF<FMT>::row_bytes(I), rsc = I >> 5;
    size_t srb = WF<FMT>::row_bytes(Is), srsc = Is >> 5;
    int routed_chunks = k * nch;
    int all_chunks = routed_chunks + (sdw ? nchs : 0);
    for (int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); item < T * H; item += warps) {
        int t = item / H, r = item - t * H;
        float acc = 0.0f;
        for (int c0 = lane; c0 < all_chunks; c0 += 32 * DOWN_BATCH) {
            Chunk<FMT> c[DOWN_BATCH];
#pragma unroll
            for (int u = 0; u < DOWN_BATCH; u++) {
                int q = c0 + u * 32;
                if (q < routed_chunks) {
                    int j = q / nch, ch = q - j * nch;
                    size_t row = (size_t)sidx[t * k + j] * H + r;
                    c[u] = load_dchunk<FMT>(dw + row * rb, ds + row * rsc, ch);
                } else if (q < all_chunks) {
                    c[u] = load_dchunk<FMT>(sdw + (size_t)r * srb, sds + (size_t)r * srsc, q - routed_chunks);
                }
            }
#pragma unroll
            for (int u = 0; u < DOWN_BATCH; u++) {
                int q = c0 + u * 32;
                if (q < routed_chunks) {
                    int j = q / nch, ch = q - j * nch;
                    acc += swt[t * k + j] * dchunk_dot<FMT>(c[u], st, t * k + j, T * k, ch);
                } else if (q < all_chunks) {
                    acc += ssg[t] * dchunk_dot<FMT>(c[u], sst, t, T, q - routed_chunks);
                }
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) {
            float* out = h + (size_t)t * ldh + r;
            *out = accumulate ? *out + acc : acc;
        }
    }
}

#define DGU_ARGS                                                                                                  \
    const unsigned char *__restrict__ gu, const unsigned short *__restrict__ gs, const unsigned char *__restrict__ sgu, \
        const unsigned short *__restrict__ sgs, const float *__restrict__ x, int T, const float *__restrict__ logits,     \
        int ld, int E, int renormalize, int *__restrict__ idx, float *__restrict__ wt, int k, int I, int Is, int H,      \
        float *__restrict__ act, float *__restrict__ act_s
#define DGU_PASS gu, gs, sgu, sgs, x, T, logits, ld, E, renormalize, idx, wt, k, I, Is, H, act, act_s
extern "C" __global__ void __launch_bounds__(256) dmoe_gate_up_bf16(DGU_ARGS) { dmoe_gate_up_impl<0>(DGU_PASS); }
extern "C" __global__ void __launch_bounds__(256) dmoe_gate_up_q8(DGU_ARGS) { dmoe_gate_up_impl<1>(DGU_PASS); }
extern "C" __global__ void __launch_bounds__(256) dmoe_gate_up_q4(DGU_ARGS) { dmoe_gate_up_impl<2>(DGU_PASS); }

#define DDOWN_ARGS                                                                                                \
    const unsigned char *__restrict__ dw, const unsigned short *__restrict__ ds, const unsigned char *__restrict__ sdw, \
        const unsigned short *__restrict__ sds, const float *__restrict__ act, const float *__restrict__ act_s,          \
        const int *__restrict__ idx, const float *__restrict__ wt, const float *__restrict__ sg, int ldsg, int T, int k,  \
        int I, int Is, int H, float *__restrict__ h, int ldh, int accumulate
#define DDOWN_PASS dw, ds, sdw, sds, act, act_s, idx, wt, sg, ldsg, T, k, I, Is, H, h, ldh, accumulate
extern "C" __global__ void __launch_bounds__(256) dmoe_down_bf16(DDOWN_ARGS) { dmoe_down_impl<0>(DDOWN_PASS); }
extern "C" __global__ void __launch_bounds__(256) dmoe_down_q8(DDOWN_ARGS) { dmoe_down_impl<1>(DDOWN_PASS); }
extern "C" __global__ void __launch_bounds__(256) dmoe_down_q4(DDOWN_ARGS) { dmoe_down_impl<2>(DDOWN_PASS); }

// Routing for T tokens, one warp per token: softmax over the E logits (row t of `logits`,
// stride ld), top-k by repeated argmax (ties to the lower index), optional renormalisation —
// moe_route's results, without block-wide barriers. p is scratch of T·E floats.
// ---- Greedy token: argmax over n values in two stages in one launch ----
// Every block finds its best (value, first index) and writes it to part[blockIdx]; the last
// block to finish (counted in *done, reset for the next launch) reduces the parts into out[0].
extern "C" __global__ void argmax_multi(const float* __restrict__ x, int n, float* __restrict__ part_v,
                                        int* __restrict__ part_i, unsigned int* __restrict__ done,
                                        int* __restrict__ out) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    __shared__ bool last;
    float v = -SP_INF;
    int best = 0x7fffffff;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        float xe = x[e];
        if (xe > v) { v = xe; best = e; }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, best, o);
        if (ov > v || (ov == v && oi < best)) { v = ov; best = oi; }
    }
    if (lane == 0) { bv[warp] = v; bi[warp] = best; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (bv[w] > v || (bv[w] == v && bi[w] < best)) { v = bv[w]; best = bi[w]; }
        part_v[blockIdx.x] = v;
        part_i[blockIdx.x] = best;
        __threadfence();
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    v = -SP_INF;
    best = 0x7fffffff;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) {
        float pv = ((volatile float*)part_v)[b];
        int pi = ((volatile int*)part_i)[b];
        if (pv > v || (pv == v && pi < best)) { v = pv; best = pi; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, best, o);
        if (ov > v || (ov == v && oi < best)) { v = ov; best = oi; }
    }
    __syncthreads();
    if (lane == 0) { bv[warp] = v; bi[warp] = best; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (bv[w] > v || (bv[w] == v && bi[w] < best)) { v = bv[w]; best = bi[w]; }
        out[0] = best == 0x7fffffff ? 0 : best;
        *done = 0;
    }
}
