// Gated full attention (MODEL_MATH §1.4) over a device KV cache [capacity, n_kv, d].

// Partial NeoX RoPE of one head vector held one element per thread (x = this thread's value,
// sh = the whole vector in shared memory). cos/sin in f64 from inv_freq, cast to f32 (as the CPU).
__device__ __forceinline__ float rope_elem(float x, const float* sh, int j, int rot, int pos,
                                           const double* inv_freq) {
    int half = rot / 2;
    if (j >= rot) return x;
    int i = j < half ? j : j - half;
    double a = (double)pos * inv_freq[i];
    float c = (float)cos(a), s = (float)sin(a);
    return j < half ? x * c - sh[j + half] * s : x * c + sh[j - half] * s;
}

// Block (t, head): head < n_h are query heads (split [query | gate], q_norm, RoPE), the rest
// key heads (k_norm, RoPE) whose keys and values go to cache row start + t.
// qkv row t: [q_proj (n_h·2d) | k_proj (n_kv·d) | v_proj (n_kv·d)].
extern "C" __global__ void attn_prep(const float* __restrict__ qkv, int ld, const float* __restrict__ q_norm,
                                     const float* __restrict__ k_norm, const double* __restrict__ inv_freq,
                                     int rot, float* __restrict__ q_out, float* __restrict__ gate_out,
                                     float* __restrict__ k_cache, float* __restrict__ v_cache,
                                     int n_h, int n_kv, int d, int start, const int* __restrict__ startp,
                                     float eps) {
    extern __shared__ float sh[];  // [d]
    if (startp) start = *startp;  // graph replay: the position lives in device memory
    __shared__ float red[33];
    int t = blockIdx.x, head = blockIdx.y, j = threadIdx.x;
    const float* row = qkv + (size_t)t * ld;
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
    float r = rope_elem(x, sh, j, rot, start + t, inv_freq);
    if (is_q) {
        q_out[((size_t)t * n_h + head) * d + j] = r;
        gate_out[((size_t)t * n_h + head) * d + j] = src[d + j];
    } else {
        size_t at = ((size_t)(start + t) * n_kv + kvh) * d + j;
        k_cache[at] = r;
        v_cache[at] = row[(size_t)n_h * 2 * d + (size_t)n_kv * d + (size_t)kvh * d + j];
    }
}

#define ATT_WARPS 4
#define ATT_MAX_PER_LANE 8  // head_dim <= 256

// Block (t, h): softmax(q·Kᵀ/√d)·V over the visible keys, times sigmoid(gate). Keys are
// 0..start+t (causal) or, when `sel` is not null, the sel_count[t] positions in row t of sel.
// Each warp runs an online softmax over every ATT_WARPS-th key; warps merge at the end.
extern "C" __global__ void attn_decode(const float* __restrict__ q, const float* __restrict__ gate,
                                       const float* __restrict__ k_cache, const float* __restrict__ v_cache,
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
        const float* kr = k_cache + ((size_t)pos * n_kv + kvh) * d;
        const float* vr = v_cache + ((size_t)pos * n_kv + kvh) * d;
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
