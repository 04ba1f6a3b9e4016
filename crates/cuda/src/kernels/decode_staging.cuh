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
// FMT 0, 3: f32 x[T][cols]. FMT 1, 2: i8 q[T][cols], then f32 d[T][cols/32], then i32 sum[T][cols/32].
// A row of q holds the first 16 codes of every group of 32 (16 bytes per group, in group order),
// then the last 16 of every group: lanes that read consecutive groups read consecutive 16-byte
// words (no bank conflicts), where whole 32-byte groups side by side would conflict two-way.

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
    return FMT == 0 || FMT == 3 ? (size_t)T * cols * 4 : (size_t)T * cols + (size_t)T * (cols >> 5) * 8;
}

// Stages rows x[t·ldx + c] (t < T, c < cols) into `sm` for FMT, optionally RMS-normed with a
// zero-centred weight (x·rsqrt(mean x² + eps)·(1 + nw[c])); block 0 also writes the normed rows
// to xn[t·cols + c] when xn is not null. Needs cols % 32 == 0 for FMT 1, 2 and cols % 4 == 0,
// x and ldx 16-byte aligned for all. Ends with __syncthreads().
// FRAG (FMT 1, 2 only; T ≤ 8): the same values laid out for the int8 mma's B fragments
// (matvec_tc.cu): eight token slots whatever T; per group g, 32 lane pairs of words, lane
// 4·t + i holding codes 4i..4i+3 (then 16 + 4i..) of token t: word (32·g + 4·t + i)·2 + half;
// then f32 d[g][8 slots], then i32 sum[g][8 slots].
template <int FMT, bool FRAG = false>
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
            if (FMT == 0 || FMT == 3) {
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
                    // Quad c & 7 of group c >> 3: quads 0-3 in the row's first half, 4-7 in
                    // its second.
                    int word = FRAG ? (((c >> 3) * 32 + t * 4 + (c & 3)) * 2 + ((c >> 2) & 1))
                                    : t * quads + ((c & 4) ? (quads >> 1) : 0) + ((c >> 3) << 2) + (c & 3);
                    ((unsigned int*)sm)[word] = packed;
                    if ((lane & 7) == 0) {
                        // Group g of the whole run = t·G + c/8 (FRAG: slot t of group c/8).
                        int slots = FRAG ? 8 : T;
                        int g = FRAG ? (c >> 3) * 8 + t : cf >> 3;
                        ((float*)(sm + (size_t)slots * cols))[g] = d;
                        ((int*)(sm + (size_t)slots * cols + (size_t)slots * (cols >> 5) * 4))[g] = s;
                    }
                }
            }
        }
    }
    __syncthreads();
}

// ---- One chunk of a weight row against one staged token ----
// A chunk is one group of 32 weights for Q8 (32 bytes) and Q4 (16 bytes), 8 weights for bf16,
// 16 weights (half a scale group) for FP8; for the GGUF K-quants see ggml.cu (Q4_K, Q5_K: 32
// weights, halves of two groups; Q6_K: 64 weights, halves of four groups).

template <int FMT>
struct Chunk {
    uint4 a, b;  // b only for Q8 and Q5_K (its qh bytes)
    uint4 c;     // Q6_K's qh bytes
    float s;     // the group's f16 scale, widened; FP8: the f32 scale times 2^8; Q4_K/Q5_K:
                 // d·sc of the first group; Q6_K: d
    float s1, m0, m1;  // Q4_K/Q5_K: d·sc of the second group, dmin·m of both
    int sc4;           // Q6_K: the int8 scales of the four groups' halves
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
    } else if (FMT == 3) {
        c.a = __ldg((const uint4*)w + ch);
        c.s = fp8_scale256(s, ch >> 1);
    } else if (FMT == 4 || FMT == 6) {
        kq_load_chunk<FMT>(w, s, ch, c.a, c.b, c.s, c.s1, c.m0, c.m1);
    } else if (FMT == 5) {
        q6k_load_chunk(w, s, ch, c.a, c.b, c.c, c.sc4, c.s);
    } else {
        c.a = __ldg((const uint4*)w + ch);
        c.s = f16_to_f32(__ldg(s + ch));
    }
    return c;
}

// Σ w·q over one Q8/Q4 chunk and the 32 int8 activations lo (first 16) and hi (last 16), in
// dp4a steps; Q4 nibbles as stored (0..15: the caller subtracts 8·Σq).
template <int FMT>
__device__ __forceinline__ int chunk_isum(const Chunk<FMT>& c, int4 lo, int4 hi) {
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
    }
    return dp;
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
    } else if (FMT == 3) {
        // Weight-only: e4m3 values (exact in f32) against the staged f32 inputs, then the scale.
        const float4* x = (const float4*)(st.xf(t) + (size_t)ch * 16);
        unsigned int words[4] = {c.a.x, c.a.y, c.a.z, c.a.w};
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float w[4];
            e4m3x4_div256(words[i], w);
            float4 xv = x[i];
            dot += w[0] * xv.x + w[1] * xv.y + w[2] * xv.z + w[3] * xv.w;
        }
        return c.s * dot;
    } else if (FMT == 4 || FMT == 6) {
        // Groups g0 = 2·(ch/2) and g0 + 1 of the row, half ch & 1 of each.
        int g0 = (ch >> 1) << 1, h = ch & 1;
        const signed char* q = st.q(t) + h * (st.cols >> 1);
        int4 x0 = *(const int4*)(q + (size_t)g0 * 16);
        int4 x1 = *(const int4*)(q + (size_t)(g0 + 1) * 16);
        int i0, i1;
        kq_isums<FMT>(c.a, c.b, (ch >> 1) & 3, x0, x1, i0, i1);
        const float* d = st.d(t, T) + g0;
        const int* sum = st.sum(t, T) + g0;
        // weight = d·sc·q − dmin·m: fma(d·sc, xd·Σq·x, ·), then fma(−dmin·m, xd·Σx, ·) per group,
        // the CPU's order (spindle_kernels::ggml::k_lane).
        float acc = __fmaf_rn(c.s, d[0] * (float)i0, 0.0f);
        acc = __fmaf_rn(-c.m0, d[0] * (float)sum[0], acc);
        acc = __fmaf_rn(c.s1, d[1] * (float)i1, acc);
        return __fmaf_rn(-c.m1, d[1] * (float)sum[1], acc);
    } else if (FMT == 5) {
        // Groups 8·(ch/4) + 4·((ch/2) & 1) + k, half ch & 1 of each.
        int g0 = ((ch >> 2) << 3) + (((ch >> 1) & 1) << 2), h = ch & 1;
        const signed char* q = st.q(t) + h * (st.cols >> 1);
        const float* d = st.d(t, T) + g0;
        unsigned int aw[4] = {c.a.x, c.a.y, c.a.z, c.a.w}, bw[4] = {c.b.x, c.b.y, c.b.z, c.b.w};
        unsigned int cw[4] = {c.c.x, c.c.y, c.c.z, c.c.w};
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int4 x = *(const int4*)(q + (size_t)(g0 + k) * 16);
            int xv[4] = {x.x, x.y, x.z, x.w};
            int dp = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) dp = __dp4a((int)q6k_codes(aw[i], bw[i], cw[i], k), xv[i], dp);
            int sc = (int)(signed char)((c.sc4 >> (8 * k)) & 0xff);
            acc = __fmaf_rn(d[k], (float)(sc * dp), acc);
        }
        return c.s * acc;
    } else {
        const signed char* q = st.q(t);
        int4 lo = *(const int4*)(q + (size_t)ch * 16);
        int4 hi = *(const int4*)(q + (st.cols >> 1) + (size_t)ch * 16);
        int dp = chunk_isum<FMT>(c, lo, hi);
        if (FMT == 2) dp -= 8 * st.sum(t, T)[ch];
        return c.s * st.d(t, T)[ch] * (float)dp;
    }
}

// Chunks per row of `cols` weights.
template <int FMT>
__device__ __forceinline__ int row_chunks(int cols) {
    return FMT == 0 ? cols >> 3 : (FMT == 3 ? cols >> 4 : (FMT == 5 ? cols >> 6 : cols >> 5));
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
