// Gated full attention (MODEL_MATH §1.4) over a device KV cache, and qwen4_exp's QSA selection
// of the positions each query sees (MODEL_MATH §4.4).
//
// A cache is paged: keys and values of one layer are a pool of blocks [n_blocks, KV_BLOCK_TOKENS,
// n_kv, d], and a sequence's block table (i32 block ids in position order) puts position p in
// row table[p / KV_BLOCK_TOKENS]·KV_BLOCK_TOKENS + p % KV_BLOCK_TOKENS. A null table reads the
// cache as one contiguous run of rows (the vision tower, tests). Only the addresses follow the
// table: every kernel visits the keys in the order it did over a contiguous cache.

// The row of position `pos` in a paged cache (see above).
__device__ __forceinline__ size_t kv_row(const int* __restrict__ table, int pos) {
    return table ? (size_t)table[pos / KV_BLOCK_TOKENS] * KV_BLOCK_TOKENS + pos % KV_BLOCK_TOKENS : (size_t)pos;
}

// Partial NeoX RoPE of one head vector held one element per thread (x = this thread's value,
// sh = the whole vector in shared memory). cos/sin in f64 from inv_freq, cast to f32 (as the CPU).
// `slots`, when not null, holds this token's position per frequency slot (rot/2 ints: the 3-D
// interleaved mRoPE of a chunk with image rows, VISION.md §4.3); otherwise every slot uses `pos`.
__device__ __forceinline__ float rope_elem(float x, const float* sh, int j, int rot, int pos,
                                           const double* inv_freq, const int* slots = nullptr) {
    int half = rot / 2;
    if (j >= rot) return x;
    int i = j < half ? j : j - half;
    double a = (double)(slots ? slots[i] : pos) * inv_freq[i];
    float c = (float)cos(a), s = (float)sin(a);
    return j < half ? x * c - sh[j + half] * s : x * c + sh[j - half] * s;
}

// Block (t, head): head < n_h are query heads (split [query | gate], q_norm, RoPE), the rest
// key heads (k_norm, RoPE) whose keys and values go to cache row `pos`. The rotary position is
// `rpos` (pos + rope_delta after an image), or per slot from `slots` (see rope_elem).
// qkv row t: [q_proj (n_h·2d) | k_proj (n_kv·d) | v_proj (n_kv·d)].
__device__ __forceinline__ void attention_prepare_row(const float* __restrict__ row, const float* __restrict__ q_norm,
                                                      const float* __restrict__ k_norm, const double* __restrict__ inv_freq,
                                                      int rot, float* __restrict__ q_row, float* __restrict__ gate_row,
                                                      float* __restrict__ k_cache, float* __restrict__ v_cache,
                                                      const int* __restrict__ table,
                                                      int n_h, int n_kv, int d, int pos, int rpos,
                                                      const int* __restrict__ slots, float eps) {
    extern __shared__ float sh[];  // [d]
    __shared__ float red[33];
    int head = blockIdx.y, j = threadIdx.x;
    bool is_q = head < n_h;
    int kvh = head - n_h;
    const float* src = is_q ? row + (size_t)head * 2 * d : row + (size_t)n_h * 2 * d + (size_t)kvh * d;
    const float* w = is_q ? q_norm : k_norm;
    float x = j < d ? src[j] : 0.0f;
    float ss = block_sum(x * x, red);
    x = x * rsqrtf(ss / d + eps) * (1.0f + (j < d ? w[j] : 0.0f));
    if (j < d) sh[j] = x;
    __syncthreads();
    if (j >= d) return;
    float r = rope_elem(x, sh, j, rot, rpos, inv_freq, slots);
    if (is_q) {
        q_row[(size_t)head * d + j] = r;
        gate_row[(size_t)head * d + j] = src[d + j];
    } else {
        size_t at = (kv_row(table, pos) * n_kv + kvh) * d + j;
        k_cache[at] = r;
        v_cache[at] = row[(size_t)n_h * 2 * d + (size_t)n_kv * d + (size_t)kvh * d + j];
    }
}

// Token t sits at cache row start + t and rotates by start + t + rope_delta, or, with `slots`
// not null, by slots[t·rot/2 + i] in frequency slot i (a chunk holding image rows).
extern "C" __global__ void attention_prepare(const float* __restrict__ qkv, int ld, const float* __restrict__ q_norm,
                                             const float* __restrict__ k_norm, const double* __restrict__ inv_freq,
                                             int rot, float* __restrict__ q_out, float* __restrict__ gate_out,
                                             float* __restrict__ k_cache, float* __restrict__ v_cache,
                                             const int* __restrict__ table,
                                             int n_h, int n_kv, int d, int start, const int* __restrict__ startp,
                                             int rope_delta, const int* __restrict__ slots, float eps) {
    PDL_BEGIN();
    if (startp) start = *startp;  // graph replay: the position lives in device memory
    int t = blockIdx.x;
    attention_prepare_row(qkv + (size_t)t * ld, q_norm, k_norm, inv_freq, rot, q_out + (size_t)t * n_h * d,
                          gate_out + (size_t)t * n_h * d, k_cache, v_cache, table, n_h, n_kv, d, start + t,
                          start + t + rope_delta, slots ? slots + (size_t)t * (rot / 2) : nullptr, eps);
}

// attention_prepare for B sequences of one token: block (b, head) on row b of qkv, sequence
// b's block table at kv[b], its position positions[b]; the layer's pools k_cache, v_cache.
extern "C" __global__ void attention_prepare_batch(const float* __restrict__ qkv, int ld,
                                                   const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                                   const double* __restrict__ inv_freq, int rot,
                                                   float* __restrict__ q_out, float* __restrict__ gate_out,
                                                   float* __restrict__ k_cache, float* __restrict__ v_cache,
                                                   const unsigned long long* __restrict__ kv,
                                                   const int* __restrict__ positions, int B, int n_h, int n_kv, int d,
                                                   float eps) {
    int b = blockIdx.x;
    attention_prepare_row(qkv + (size_t)b * ld, q_norm, k_norm, inv_freq, rot, q_out + (size_t)b * n_h * d,
                          gate_out + (size_t)b * n_h * d, k_cache, v_cache, (const int*)kv[b], n_h, n_kv, d,
                          positions[b], positions[b], nullptr, eps);
}

#define ATT_WARPS 4
#define ATT_MAX_PER_LANE 8  // head_dim <= 256

// Block (t, h): softmax(q·Kᵀ/√d)·V over the visible keys, times sigmoid(gate). Keys are
// 0..start+t (causal) or, when `sel` is not null, the sel_count[t] positions in row t of sel.
// Each warp runs an online softmax over every ATT_WARPS-th key; warps merge at the end.
extern "C" __global__ void attention_serial(const float* __restrict__ q, const float* __restrict__ gate,
                                            const float* __restrict__ k_cache, const float* __restrict__ v_cache,
                                            const int* __restrict__ table,
                                            const int* __restrict__ sel, const int* __restrict__ sel_count,
                                            int sel_stride, float* __restrict__ out, int n_h, int n_kv, int d,
                                            int start, const int* __restrict__ startp, float scale) {
    __shared__ float wm[ATT_WARPS], wl[ATT_WARPS];
    if (startp) start = *startp;
    __shared__ float wacc[ATT_WARPS][ATT_MAX_PER_LANE * 32];
    int t = blockIdx.x, h = blockIdx.y;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int kvh = h / (n_h / n_kv);
    const float* qh = q + ((size_t)t * n_h + h) * d;
    float qv[ATT_MAX_PER_LANE], acc[ATT_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
        int e = lane + 32 * i;
        qv[i] = e < d ? qh[e] : 0.0f;
        acc[i] = 0.0f;
    }
    int n = sel ? sel_count[t] : start + t + 1;
    float m = -SP_INF, l = 0.0f;
    for (int idx = warp; idx < n; idx += ATT_WARPS) {
        int pos = sel ? sel[(size_t)t * sel_stride + idx] : idx;
        size_t row = kv_row(table, pos);
        const float* kr = k_cache + (row * n_kv + kvh) * d;
        const float* vr = v_cache + (row * n_kv + kvh) * d;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
            int e = lane + 32 * i;
            if (e < d) dot += qv[i] * kr[e];
        }
        dot = warp_sum(dot) * scale;
        float m_new = fmaxf(m, dot);
        float corr = expf(m - m_new);
        float p = expf(dot - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
            int e = lane + 32 * i;
            acc[i] = acc[i] * corr + (e < d ? p * vr[e] : 0.0f);
        }
        m = m_new;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < ATT_MAX_PER_LANE; i++) wacc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float M = -SP_INF;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, wm[w]);
    float L = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++)
        if (wl[w] > 0.0f) L += wl[w] * expf(wm[w] - M);
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (wl[w] > 0.0f) o += wacc[w][e] * expf(wm[w] - M);
        size_t at = ((size_t)t * n_h + h) * d + e;
        out[at] = o / L * sigmoid_f(gate[at]);
    }
}

// ---- Flash-decoding for batches of at most MATVEC_MAX_TOKENS tokens (no QSA selection) ----
// The visible keys of token t (positions 0..start+t) are cut into splits of ATTN_SPLIT_KEYS; block
// (g, split, t) scores its keys against the ρ = n_h/n_kv query heads of kv head g (a thread per
// (head, key) pair), takes the split's softmax per head, and writes (max, sum, Σ p·v) to
// part[((t·n_h + h)·splits + split)·(d + 2)]. attention_decode_combine merges the splits. Blocks past the
// last visible key exit at once, so the grid can cover the cache's capacity (fixed in a graph).

// One block (g, split) of attention_decode_split for the token of row t, which sees n keys
// (q and part are the whole [tokens, ...] arrays; t indexes them).
__device__ __forceinline__ void attention_decode_split_block(const float* __restrict__ q,
                                                             const float* __restrict__ k_cache,
                                                             const float* __restrict__ v_cache,
                                                             const int* __restrict__ table,
                                                             float* __restrict__ part, int splits, int n_h,
                                                             int n_kv, int d, int t, int n, float scale) {
    // q [ρ][d], keys [ATTN_SPLIT_KEYS][d + 4] (padded: a lane per key reads without bank conflicts),
    // values [ATTN_SPLIT_KEYS][d], scores [ρ][ATTN_SPLIT_KEYS].
    extern __shared__ __align__(16) float qs[];
    int g = blockIdx.x, split = blockIdx.y;
    int k0 = split * ATTN_SPLIT_KEYS;
    if (k0 >= n) return;
    int keys = min(ATTN_SPLIT_KEYS, n - k0);
    int rho = n_h / n_kv;
    int d4 = d >> 2, kstride = d4 + 1;  // in float4
    float4* q4 = (float4*)qs;
    float4* ks = (float4*)(qs + rho * d);
    float4* vs = ks + ATTN_SPLIT_KEYS * kstride;
    float* sc = (float*)(vs + ATTN_SPLIT_KEYS * d4);
    // Stage q, K and V with asynchronous copies (all in flight at once).
    int nq = rho * d4, nk = keys * d4, total = nq + 2 * nk;
    const float4* qsrc = (const float4*)(q + ((size_t)t * n_h + (size_t)g * rho) * d);
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
        if (e < nq) {
            cp_async16(q4 + e, qsrc + e);
        } else {
            int r = e - nq;
            bool is_v = r >= nk;
            r -= is_v ? nk : 0;
            int kk = r / d4, c = r - kk * d4;
            const float4* src = (const float4*)((is_v ? v_cache : k_cache) + (kv_row(table, k0 + kk) * n_kv + g) * d) + c;
            cp_async16(is_v ? vs + kk * d4 + c : ks + kk * kstride + c, src);
        }
    }
    cp_async_wait_all();
    __syncthreads();
    // Scores: thread (hh, kk) for hh += 8.
    int kk = threadIdx.x & 31;
    for (int hh = threadIdx.x >> 5; hh < rho; hh += blockDim.x >> 5) {
        float dot = 0.0f;
        if (kk < keys) {
            const float4* kr = ks + kk * kstride;
            const float4* qv = q4 + hh * d4;
#pragma unroll 8
            for (int e = 0; e < d4; e++) {
                float4 a = kr[e], b = qv[e];
                dot += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
            }
        }
        sc[hh * ATTN_SPLIT_KEYS + kk] = kk < keys ? dot * scale : -SP_INF;
    }
    __syncthreads();
    // Softmax and Σ p·v: warp per head, lanes over the dimensions.
    int lane = threadIdx.x & 31;
    const float* vf = (const float*)vs;
    for (int hh = threadIdx.x >> 5; hh < rho; hh += blockDim.x >> 5) {
        float s = sc[hh * ATTN_SPLIT_KEYS + lane];
        float m = warp_max(s);
        float p = lane < keys ? expf(s - m) : 0.0f;
        float l = warp_sum(p);
        float acc[ATT_MAX_PER_LANE];
#pragma unroll
        for (int i = 0; i < ATT_MAX_PER_LANE; i++) acc[i] = 0.0f;
        for (int j = 0; j < keys; j++) {
            float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
            for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
                int e = lane + 32 * i;
                if (e < d) acc[i] += pj * vf[j * d + e];
            }
        }
        int h = g * rho + hh;
        float* out = part + (((size_t)t * n_h + h) * splits + split) * (d + 2);
        if (lane == 0) {
            out[0] = m;
            out[1] = l;
        }
#pragma unroll
        for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
            int e = lane + 32 * i;
            if (e < d) out[2 + e] = acc[i];
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) attention_decode_split(const float* __restrict__ q,
                                                                         const float* __restrict__ k_cache,
                                                                         const float* __restrict__ v_cache,
                                                                         const int* __restrict__ table,
                                                                         float* __restrict__ part, int splits, int n_h,
                                                                         int n_kv, int d, int start,
                                                                         const int* __restrict__ startp, float scale) {
    PDL_BEGIN();
    if (startp) start = *startp;
    int t = blockIdx.z;
    attention_decode_split_block(q, k_cache, v_cache, table, part, splits, n_h, n_kv, d, t, start + t + 1, scale);
}

// attention_decode_split for B sequences of one token: block (g, split, b) on row b of q and
// part, sequence b's block table at kv[b], position positions[b]; the layer's pools k_cache,
// v_cache.
extern "C" __global__ void __launch_bounds__(256) attention_decode_split_batch(
    const float* __restrict__ q, const float* __restrict__ k_cache, const float* __restrict__ v_cache,
    const unsigned long long* __restrict__ kv, float* __restrict__ part, int splits,
    int n_h, int n_kv, int d, const int* __restrict__ positions, int B, float scale) {
    int b = blockIdx.z;
    attention_decode_split_block(q, k_cache, v_cache, (const int*)kv[b], part, splits, n_h, n_kv, d, b,
                                 positions[b] + 1, scale);
}

// Block (h, t): out = (Σ_s e^{m_s − M}·acc_s) / (Σ_s e^{m_s − M}·l_s) · sigmoid(gate), over the
// splits attention_decode_split wrote for token t.
// One block (h) of attention_decode_combine for the token of row t, which sees n keys.
__device__ __forceinline__ void attention_decode_combine_block(const float* __restrict__ part, int splits,
                                                               const float* __restrict__ gate,
                                                               float* __restrict__ out, int n_h, int d, int t, int n) {
    extern __shared__ float wsp[];  // [splits]
    __shared__ float red[33];
    __shared__ float total;
    int h = blockIdx.x;
    int used = (n + ATTN_SPLIT_KEYS - 1) / ATTN_SPLIT_KEYS;
    const float* base = part + ((size_t)t * n_h + h) * splits * (d + 2);
    float m = -SP_INF;
    for (int s = threadIdx.x; s < used; s += blockDim.x) m = fmaxf(m, base[(size_t)s * (d + 2)]);
    // Block max through the shared scratch.
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : -SP_INF;
        v = warp_max(v);
        if (threadIdx.x == 0) red[32] = v;
    }
    __syncthreads();
    float M = red[32];
    float l = 0.0f;
    for (int s = threadIdx.x; s < used; s += blockDim.x) {
        const float* ps = base + (size_t)s * (d + 2);
        float w = expf(ps[0] - M);
        wsp[s] = w;
        l += w * ps[1];
    }
    l = block_sum(l, red);
    if (threadIdx.x == 0) total = l;
    __syncthreads();
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < used; s++) o += wsp[s] * base[(size_t)s * (d + 2) + 2 + e];
        size_t at = ((size_t)t * n_h + h) * d + e;
        out[at] = o / total * sigmoid_f(gate[at]);
    }
}

extern "C" __global__ void __launch_bounds__(256) attention_decode_combine(const float* __restrict__ part, int splits,
                                                                           const float* __restrict__ gate,
                                                                           float* __restrict__ out, int n_h, int d, int start,
                                                                           const int* __restrict__ startp) {
    PDL_BEGIN();
    if (startp) start = *startp;
    int t = blockIdx.y;
    attention_decode_combine_block(part, splits, gate, out, n_h, d, t, start + t + 1);
}

// attention_decode_combine for B sequences of one token: block (h, b) on row b, position
// positions[b].
extern "C" __global__ void __launch_bounds__(256) attention_decode_combine_batch(
    const float* __restrict__ part, int splits, const float* __restrict__ gate, float* __restrict__ out, int n_h,
    int d, const int* __restrict__ positions) {
    int b = blockIdx.y;
    attention_decode_combine_block(part, splits, gate, out, n_h, d, b, positions[b] + 1);
}

// ---- QSA indexer (MODEL_MATH §4.4): the cached positions each query's attention sees ----
// Row t of qk (stride ld, from column col0) holds the indexer's [queries (n_i·d_i) | raw key
// (d_i)] for position start + t. The device cache keeps every raw key [capacity, d_i] and the
// key of every complete block of cr positions [capacity / cr, d_i].

// Block (t, head), a thread per dimension: head < n_i norms query head `head` (q_norm) and
// rotates it at start + t into q_out [T, n_i, d_i]. head == n_i stores the raw key of start + t
// and, when that position ends a block, finishes the block's key as `extend_block_keys` on
// the CPU: the f32 mean of its cr raw keys in position order (earlier launches' from raw_keys,
// this launch's from qk), k_norm, RoPE at the block's first position.
extern "C" __global__ void qsa_prepare(const float* __restrict__ qk, int ld, int col0,
                                       const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                       const double* __restrict__ inv_freq, int rot, float* __restrict__ q_out,
                                       float* __restrict__ raw_keys, float* __restrict__ block_keys, int n_i,
                                       int d_i, int cr, int start, const int* __restrict__ startp, float eps) {
    extern __shared__ float sh[];  // [d_i]
    __shared__ float red[33];
    if (startp) start = *startp;
    int t = blockIdx.x, head = blockIdx.y, j = threadIdx.x;
    bool live = j < d_i;
    const float* row = qk + (size_t)t * ld + col0;
    int pos = start + t;
    float x;
    int at;  // the position x is rotated at
    if (head < n_i) {
        x = live ? row[head * d_i + j] : 0.0f;
        float s = 1.0f / sqrtf(block_sum(x * x, red) / d_i + eps);
        x = live ? x * (s * (1.0f + q_norm[j])) : 0.0f;
        at = pos;
    } else {
        if (live) raw_keys[(size_t)pos * d_i + j] = row[n_i * d_i + j];
        if ((pos + 1) % cr != 0) return;  // the same for the whole block
        at = pos + 1 - cr;
        float sum = 0.0f;
        for (int p = at; p <= pos; p++) {
            if (!live) continue;
            sum += p < start ? raw_keys[(size_t)p * d_i + j]
                             : qk[(size_t)(p - start) * ld + col0 + n_i * d_i + j];
        }
        x = sum / (float)cr;
        float s = 1.0f / sqrtf(block_sum(x * x, red) / d_i + eps);
        x = live ? x * (s * (1.0f + k_norm[j])) : 0.0f;
    }
    if (live) sh[j] = x;
    __syncthreads();
    if (!live) return;
    float r = rope_elem(x, sh, j, rot, at, inv_freq);
    if (head < n_i) {
        q_out[((size_t)t * n_i + head) * d_i + j] = r;
    } else {
        block_keys[(size_t)(at / cr) * d_i + j] = r;
    }
}


// The indexer's block keys of blocks [0, blocks) recomputed from its raw keys, as qsa_prepare
// writes each when its last position arrives (the same sum order, norm and RoPE, launched with
// the same threads: the same bits); for a session restored from cached raw keys. Block b.
extern "C" __global__ void qsa_block_keys(const float* __restrict__ raw_keys, const float* __restrict__ k_norm,
                                          const double* __restrict__ inv_freq, int rot,
                                          float* __restrict__ block_keys, int d_i, int cr, float eps) {
    extern __shared__ float sh[];  // [d_i]
    __shared__ float red[33];
    int j = threadIdx.x;
    bool live = j < d_i;
    int at = blockIdx.x * cr;
    float sum = 0.0f;
    for (int p = at; p < at + cr; p++) {
        if (!live) continue;
        sum += raw_keys[(size_t)p * d_i + j];
    }
    float x = sum / (float)cr;
    float s = 1.0f / sqrtf(block_sum(x * x, red) / d_i + eps);
    x = live ? x * (s * (1.0f + k_norm[j])) : 0.0f;
    if (live) sh[j] = x;
    __syncthreads();
    if (!live) return;
    block_keys[(size_t)blockIdx.x * d_i + j] = rope_elem(x, sh, j, rot, at, inv_freq);
}

// Block (chunk, r), a warp per key block: token t = t0 + r scores block b = chunk·QSA_WARPS +
// warp as scores[r·ld + b] = Σ_h max(0, q_h·K_b) · scale, for each of its complete blocks
// (b < (start + t + 1) / cr) when it sees more than `budget` positions. Warps past the live
// blocks exit at once, so the grid can cover the cache's capacity (fixed in a graph).
extern "C" __global__ void __launch_bounds__(QSA_WARPS * 32) qsa_score_blocks(const float* __restrict__ q,
                                                                       const float* __restrict__ block_keys,
                                                                       float* __restrict__ scores, int ld, int t0,
                                                                       int n_i, int d_i, int cr, int budget,
                                                                       int start, const int* __restrict__ startp,
                                                                       float scale) {
    if (startp) start = *startp;
    int r = blockIdx.y, t = t0 + r;
    int visible = start + t + 1;
    int b = blockIdx.x * QSA_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (visible <= budget || b >= visible / cr) return;  // the same for the whole warp
    const float* key = block_keys + (size_t)b * d_i;
    const float* qt = q + (size_t)t * n_i * d_i;
    float total = 0.0f;
    for (int h = 0; h < n_i; h++) {
        float dot = 0.0f;
        for (int e = lane; e < d_i; e += 32) dot += qt[h * d_i + e] * key[e];
        total += fmaxf(warp_sum(dot), 0.0f);
    }
    if (lane == 0) scores[(size_t)r * ld + b] = total * scale;
}

// A float's place in Rust's f32::total_cmp order, as an unsigned integer.
__device__ __forceinline__ unsigned int total_order_key(float x) {
    unsigned int u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// How many threads of the block before this one, and in all, have `flag` set (every thread
// of the block calls it; `warp_counts` is shared scratch of 32 ints).
__device__ void block_count(bool flag, int* before, int* total, int* warp_counts) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    unsigned int ballot = __ballot_sync(0xffffffffu, flag);
    __syncthreads();  // the previous call's counts are read
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int off = 0, all = 0;
    for (int w = 0; w < warps; w++) {
        int c = warp_counts[w];
        off += w < warp ? c : 0;
        all += c;
    }
    *before = off + __popc(ballot & ((1u << lane) - 1u));
    *total = all;
}


// Block r: the positions token t = t0 + r attends to, ascending, into sel[t·stride ..] and
// their count into counts[t] (what attention_serial reads). Within the budget: every visible
// position. Beyond it: the tokens of the top min(max_blocks, nb) of its nb complete blocks by
// score (scores row r; ties to the earlier block, as the CPU's top_k), then the partial tail.
// The k-th largest score is found by a radix select over total_cmp keys (8 bits a pass), then
// the blocks above it and the earliest ones equal to it are written in block order.
extern "C" __global__ void __launch_bounds__(QSA_PICK_THREADS) qsa_pick_blocks(const float* __restrict__ scores,
                                                                       int ld, int t0, int* __restrict__ sel,
                                                                       int* __restrict__ counts, int stride, int cr,
                                                                       int budget, int max_blocks, int start,
                                                                       const int* __restrict__ startp) {
    __shared__ unsigned int hist[256];
    __shared__ int warp_counts[32];
    __shared__ unsigned int pick_prefix;
    __shared__ int pick_remaining;
    if (startp) start = *startp;
    int r = blockIdx.x, t = t0 + r;
    int visible = start + t + 1;
    int* out = sel + (size_t)t * stride;
    if (visible <= budget) {
        for (int j = threadIdx.x; j < visible; j += blockDim.x) out[j] = j;
        if (threadIdx.x == 0) counts[t] = visible;
        return;
    }
    int nb = visible / cr;
    int k = min(max_blocks, nb);  // ≥ 1: the config makes budget a positive multiple of cr
    const float* sc = scores + (size_t)r * ld;
    int lane = threadIdx.x & 31;
    int tail = nb * cr;
    for (int j = threadIdx.x; j < visible - tail; j += blockDim.x) out[k * cr + j] = tail + j;
    if (threadIdx.x == 0) counts[t] = k * cr + visible - tail;

    // Radix select: after the pass at `shift`, `prefix` holds the top bits of the k-th largest
    // key and `remaining` how many keys with those bits still count towards k.
    unsigned int prefix = 0, mask = 0;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int base = 0; base < nb; base += blockDim.x) {
            int b = base + threadIdx.x;
            unsigned int u = b < nb ? total_order_key(sc[b]) : 0u;
            unsigned int digit = (b < nb && (u & mask) == prefix) ? (u >> shift) & 255u : 256u;
            // Lanes with the same digit add once (scores often share their top bits); 256
            // marks a lane with no candidate.
            unsigned int peers = __match_any_sync(0xffffffffu, digit);
            if (digit < 256u && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], (unsigned int)__popc(peers));
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            // Lane l holds digits 255 − 8l down to 248 − 8l; a scan from the top finds the digit
            // at which the count of larger-or-equal keys reaches `remaining`.
            unsigned int c[8], own = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                c[i] = hist[255 - 8 * lane - i];
                own += c[i];
            }
            unsigned int incl = own;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                unsigned int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            unsigned int above = incl - own, need = (unsigned int)remaining;
            if (above < need && incl >= need) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    if (above + c[i] >= need) {
                        pick_prefix = prefix | ((unsigned int)(255 - 8 * lane - i) << shift);
                        pick_remaining = (int)(need - above);
                        break;
                    }
                    above += c[i];
                }
            }
        }
        __syncthreads();
        prefix = pick_prefix;
        remaining = pick_remaining;
        mask |= 255u << shift;
        __syncthreads();  // everyone has read pick_* and hist before the next pass
    }

    // The k − remaining blocks above the threshold and the first `remaining` equal to it.
    int taken_equal = 0, written = 0;
    for (int base = 0; base < nb; base += blockDim.x) {
        int b = base + threadIdx.x;
        unsigned int u = b < nb ? total_order_key(sc[b]) : 0u;
        bool above = b < nb && u > prefix, equal = b < nb && u == prefix;
        int eq_before, eq_total;
        block_count(equal, &eq_before, &eq_total, warp_counts);
        bool take = above || (equal && taken_equal + eq_before < remaining);
        int take_before, take_total;
        block_count(take, &take_before, &take_total, warp_counts);
        if (take) {
            int* dst = out + (size_t)(written + take_before) * cr;
            for (int j = 0; j < cr; j++) dst[j] = b * cr + j;
        }
        taken_equal += eq_total;
        written += take_total;
    }
}

// ---- Prefill ----

// Causal attention for prefill (MODEL_MATH §1.4), tiled: block (query tile, kv head g) holds
// the queries of all ρ = n_h/n_kv heads of g for ATTN_PREFILL_ROWS/ρ consecutive tokens in shared memory
// and walks the visible keys in tiles of ATTN_PREFILL_KEYS, each K and V row read from the cache once per
// block instead of once per (token, head). Online softmax in f32, as attention_serial; the output is
// multiplied by sigmoid(gate) (gate null: not gated). With causal = 0 every query sees all T keys
// (the vision tower's bidirectional attention within an image). Thread (r, j) owns row r = tid/4 (head r / per, token r % per)
// and its keys j, j + 4, ... of each tile and its value columns 4j, 4j + 16, ...


extern "C" __global__ void __launch_bounds__(256) attention_prefill_tiled(
    const float* __restrict__ q, const float* __restrict__ gate, const float* __restrict__ k_cache,
    const float* __restrict__ v_cache, const int* __restrict__ table, float* __restrict__ out, int T, int n_h,
    int n_kv, int d, int start,
    int causal, float scale) {
    extern __shared__ __align__(16) float ap_smem[];
    int ld = d + 4;  // padded rows: float4 reads of 8 rows in a warp hit distinct banks
    float* qs = ap_smem;                   // [ATTN_PREFILL_ROWS][ld]
    float* ks = qs + ATTN_PREFILL_ROWS * ld;         // [ATTN_PREFILL_KEYS][ld]
    float* vs = ks + ATTN_PREFILL_KEYS * ld;         // [ATTN_PREFILL_KEYS][ld]
    float* ps = vs + ATTN_PREFILL_KEYS * ld;         // [ATTN_PREFILL_ROWS][ATTN_PREFILL_KEYS + 1]
    int rho = n_h / n_kv, per = ATTN_PREFILL_ROWS / rho;  // tokens per block
    int g = blockIdx.y, t0 = blockIdx.x * per;
    int tid = threadIdx.x, r = tid >> 2, j = tid & 3;
    int hh = r / per, tr = r - hh * per;
    int t = t0 + tr, h = g * rho + hh;
    bool live = hh < rho && t < T;
    int quads = d >> 2;

    // Queries of the block, pre-scaled.
    for (int e = tid; e < ATTN_PREFILL_ROWS * quads; e += blockDim.x) {
        int row = e / quads, c = e - row * quads;
        int rh = row / per, rt = t0 + (row - rh * per);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (rh < rho && rt < T) {
            v = ((const float4*)(q + ((size_t)rt * n_h + g * rho + rh) * d))[c];
            v.x *= scale; v.y *= scale; v.z *= scale; v.w *= scale;
        }
        ((float4*)(qs + row * ld))[c] = v;
    }

    float4 acc[16];  // columns 4j + 16i, i < quads/4 (d ≤ 256)
#pragma unroll
    for (int i = 0; i < 16; i++) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float m = -SP_INF, l = 0.0f;
    // This row's last visible key (causal: its own position; else every key of the T), and
    // the block's.
    int pos = causal ? start + t : start + T - 1;
    int last = causal ? start + min(t0 + per, T) - 1 : start + T - 1;
    for (int k0 = 0; k0 <= last; k0 += ATTN_PREFILL_KEYS) {
        __syncthreads();  // the previous tile is consumed
        for (int e = tid; e < ATTN_PREFILL_KEYS * quads; e += blockDim.x) {
            int kk = e / quads, c = e - kk * quads;
            int kp = k0 + kk;
            float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
            if (kp <= last) {
                size_t at = (kv_row(table, kp) * n_kv + g) * d;
                kv = ((const float4*)(k_cache + at))[c];
                vv = ((const float4*)(v_cache + at))[c];
            }
            ((float4*)(ks + kk * ld))[c] = kv;
            ((float4*)(vs + kk * ld))[c] = vv;
        }
        __syncthreads();
        // Scores of this thread's ATTN_PREFILL_KEYS / 4 keys.
        float s[ATTN_PREFILL_KEYS / 4];
#pragma unroll
        for (int u = 0; u < ATTN_PREFILL_KEYS / 4; u++) s[u] = 0.0f;
        const float4* qr = (const float4*)(qs + r * ld);
        for (int c = 0; c < quads; c++) {
            float4 a = qr[c];
#pragma unroll
            for (int u = 0; u < ATTN_PREFILL_KEYS / 4; u++) {
                float4 b = ((const float4*)(ks + (j + 4 * u) * ld))[c];
                s[u] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
            }
        }
        float tile_max = -SP_INF;
#pragma unroll
        for (int u = 0; u < ATTN_PREFILL_KEYS / 4; u++) {
            int kp = k0 + j + 4 * u;
            if (!live || kp > pos) s[u] = -SP_INF;
            tile_max = fmaxf(tile_max, s[u]);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        float m_new = fmaxf(m, tile_max);
        float corr = m_new == -SP_INF ? 1.0f : expf(m - m_new);
        float psum = 0.0f;
#pragma unroll
        for (int u = 0; u < ATTN_PREFILL_KEYS / 4; u++) {
            float p = s[u] == -SP_INF ? 0.0f : expf(s[u] - m_new);
            ps[r * (ATTN_PREFILL_KEYS + 1) + j + 4 * u] = p;
            psum += p;
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        psum += __shfl_xor_sync(0xffffffffu, psum, 2);
        l = l * corr + psum;
        m = m_new;
        __syncwarp();  // the row's 4 threads share a warp
        const float* pr = ps + r * (ATTN_PREFILL_KEYS + 1);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            if (4 * j + 16 * i >= d) break;
            float4 o = acc[i];
            o.x *= corr; o.y *= corr; o.z *= corr; o.w *= corr;
            for (int kk = 0; kk < ATTN_PREFILL_KEYS; kk++) {
                float p = pr[kk];
                float4 v = ((const float4*)(vs + kk * ld))[j + 4 * i];
                o.x += p * v.x; o.y += p * v.y; o.z += p * v.z; o.w += p * v.w;
            }
            acc[i] = o;
        }
    }
    if (!live) return;
    float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int c = 4 * j + 16 * i;
        if (c >= d) break;
        size_t at = ((size_t)t * n_h + h) * d + c;
        float4 o = acc[i];
        if (gate) {
            float4 gv = *(const float4*)(gate + at);
            o.x = o.x * inv * sigmoid_f(gv.x);
            o.y = o.y * inv * sigmoid_f(gv.y);
            o.z = o.z * inv * sigmoid_f(gv.z);
            o.w = o.w * inv * sigmoid_f(gv.w);
        } else {
            o.x *= inv; o.y *= inv; o.z *= inv; o.w *= inv;
        }
        *(float4*)(out + at) = o;
    }
}
