// y = x·Wᵀ with W [rows, cols] row-major in one weight format (common.cuh) and f32
// activations (MODEL_MATH: every linear layer is stored [out, in]). `accumulate` adds into y.


// Decode and small batches (T <= MATVEC_MAX_TOKENS): one warp per weight row, 16-byte code loads, the
// row read once for all T tokens. Block = 256 threads = 8 rows. `vec`: cols a whole number of
// chunks and x rows 16-byte aligned.
template <int FMT>
__device__ __forceinline__ void matvec_impl(const unsigned char* __restrict__ W, const unsigned short* __restrict__ S,
                                            const float* __restrict__ x, float* __restrict__ y, int rows,
                                            int cols, int T, int ldx, int ldy, int accumulate, int vec) {
    const int V = WF<FMT>::VALS;
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const unsigned char* w = W + (size_t)r * WF<FMT>::row_bytes(cols);
    const unsigned short* s = S + (size_t)r * row_scale_words<FMT>(cols);
    float acc[MATVEC_MAX_TOKENS];
#pragma unroll
    for (int t = 0; t < MATVEC_MAX_TOKENS; t++) acc[t] = 0.0f;
    if (vec) {
        int chunks = cols / V;
#pragma unroll 2
        for (int ch = lane; ch < chunks; ch += 32) {
            float wf[V];
            load_chunk<FMT>(w, s, ch, wf);
#pragma unroll
            for (int t = 0; t < MATVEC_MAX_TOKENS; t++)
                if (t < T) acc[t] += dot_chunk<V>(wf, x + (size_t)t * ldx + (size_t)ch * V);
        }
    } else {
        for (int c = lane; c < cols; c += 32) {
            float wv = load_one<FMT>(w, s, c);
#pragma unroll
            for (int t = 0; t < MATVEC_MAX_TOKENS; t++)
                if (t < T) acc[t] += wv * x[(size_t)t * ldx + c];
        }
    }
#pragma unroll
    for (int t = 0; t < MATVEC_MAX_TOKENS; t++) {
        if (t < T) {
            float sum = warp_sum(acc[t]);
            if (lane == 0) {
                float* out = y + (size_t)t * ldy + r;
                *out = accumulate ? *out + sum : sum;
            }
        }
    }
}

#define MATVEC_ARGS                                                                                          \
    const unsigned char *__restrict__ W, const unsigned short *__restrict__ S, const float *__restrict__ x, \
        float *__restrict__ y, int rows, int cols, int T, int ldx, int ldy, int accumulate, int vec
extern "C" __global__ void matvec_bf16(MATVEC_ARGS) { matvec_impl<0>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate, vec); }
extern "C" __global__ void matvec_q8(MATVEC_ARGS) { matvec_impl<1>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate, vec); }
extern "C" __global__ void matvec_q4(MATVEC_ARGS) { matvec_impl<2>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate, vec); }
extern "C" __global__ void matvec_fp8(MATVEC_ARGS) { matvec_impl<3>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate, vec); }

// ---- Decode matvec (batches of at most MATVEC_MAX_TOKENS tokens, inputs staged as in decode_staging.cuh) ----

// y = x·Wᵀ for T ≤ NT tokens (or T ≤ NT·gridDim.y in groups of NT, see below). Output j (j < outs) is, per token t,
//   v = row j · x_t, or with `pair` > 0: v = silu(row j · x_t) · (row j + pair · x_t) (SwiGLU);
//   v *= sigmoid(gate[t·ldg]) when gate is not null; y[t·ldy + j] = v, or += v with `accumulate`.
// Input staging as stage_rows (optional fused norm nw/eps, normed copy to xn).
// With CONV (GDN's in_proj): outputs j < cC are conv channels: y[t·ldy + j] = silu(causal conv
// over [cstate rows | this step's outputs]) as gdn_conv, and cstate keeps the last cK − 1 rows.
template <int FMT, int NT, bool CONV>
__device__ __forceinline__ void decode_matvec_impl(const unsigned char* __restrict__ W, const unsigned short* __restrict__ S,
                                                   int outs, int cols, const float* __restrict__ x, int ldx, int T,
                                                   const float* __restrict__ nw, float eps, float* __restrict__ xn,
                                                   float* __restrict__ y, int ldy, int accumulate, int pair,
                                                   const float* __restrict__ gate, int ldg, int lpr,
                                                   float* __restrict__ cstate, const float* __restrict__ cw, int cK, int cC) {
    extern __shared__ __align__(16) unsigned char dsm[];
    // More than NT rows (a batched step): blocks of row blockIdx.y of the grid take rows
    // NT·y .. NT·y + NT − 1, staged and dotted exactly as a launch of those rows alone, so
    // every row keeps the bits it has decoded alone while one launch serves the whole step.
    if (NT > 1 && !CONV && gridDim.y > 1) {
        int t0 = blockIdx.y * NT;
        x += (size_t)t0 * ldx;
        y += (size_t)t0 * ldy;
        if (xn) xn += (size_t)t0 * cols;
        if (gate) gate += (size_t)t0 * ldg;
        T = min(T - t0, NT);
    }
    prefetch_l2_share(W, (size_t)(outs + pair) * WF<FMT>::row_bytes(cols));
    prefetch_l2_share(S, (size_t)(outs + pair) * row_scale_words<FMT>(cols) * 2);
    PDL_WAIT();
    PDL_LAUNCH();
    stage_rows<FMT>(x, ldx, T, cols, nw, eps, xn, dsm);
    Staged<FMT> st{dsm, cols};
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int subs = 32 / lpr, sub = lane / lpr, sl = lane % lpr;
    int warps = gridDim.x * (blockDim.x >> 5);
    int nch = row_chunks<FMT>(cols);
    size_t rb = WF<FMT>::row_bytes(cols), rsc = row_scale_words<FMT>(cols);
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
extern "C" __global__ void __launch_bounds__(256) decode_matvec_bf16_t1(DMV_ARGS) { decode_matvec_impl<0, 1, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_q8_t1(DMV_ARGS) { decode_matvec_impl<1, 1, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_q4_t1(DMV_ARGS) { decode_matvec_impl<2, 1, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_bf16_t8(DMV_ARGS) { decode_matvec_impl<0, MATVEC_MAX_TOKENS, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_q8_t8(DMV_ARGS) { decode_matvec_impl<1, MATVEC_MAX_TOKENS, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_q4_t8(DMV_ARGS) { decode_matvec_impl<2, MATVEC_MAX_TOKENS, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_fp8_t1(DMV_ARGS) { decode_matvec_impl<3, 1, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_fp8_t8(DMV_ARGS) { decode_matvec_impl<3, MATVEC_MAX_TOKENS, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_q4k_t1(DMV_ARGS) { decode_matvec_impl<4, 1, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_q4k_t8(DMV_ARGS) { decode_matvec_impl<4, MATVEC_MAX_TOKENS, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_q6k_t1(DMV_ARGS) { decode_matvec_impl<5, 1, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_q6k_t8(DMV_ARGS) { decode_matvec_impl<5, MATVEC_MAX_TOKENS, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_q5k_t1(DMV_ARGS) { decode_matvec_impl<6, 1, false>(DMV_PASS, DMV_NOCONV); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_q5k_t8(DMV_ARGS) { decode_matvec_impl<6, MATVEC_MAX_TOKENS, false>(DMV_PASS, DMV_NOCONV); }
#define DMVC_ARGS DMV_ARGS, float *__restrict__ cstate, const float *__restrict__ cw, int cK, int cC
#define DMVC_PASS DMV_PASS, cstate, cw, cK, cC
extern "C" __global__ void __launch_bounds__(256) decode_matvec_conv_bf16_t1(DMVC_ARGS) { decode_matvec_impl<0, 1, true>(DMVC_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_conv_q8_t1(DMVC_ARGS) { decode_matvec_impl<1, 1, true>(DMVC_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_conv_q4_t1(DMVC_ARGS) { decode_matvec_impl<2, 1, true>(DMVC_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_conv_bf16_t8(DMVC_ARGS) { decode_matvec_impl<0, MATVEC_MAX_TOKENS, true>(DMVC_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_conv_q8_t8(DMVC_ARGS) { decode_matvec_impl<1, MATVEC_MAX_TOKENS, true>(DMVC_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_conv_q4_t8(DMVC_ARGS) { decode_matvec_impl<2, MATVEC_MAX_TOKENS, true>(DMVC_PASS); }
