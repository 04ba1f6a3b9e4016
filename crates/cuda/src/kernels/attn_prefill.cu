// Causal attention for prefill (MODEL_MATH §1.4), tiled: block (query tile, kv head g) holds
// the queries of all ρ = n_h/n_kv heads of g for ATTN_PREFILL_ROWS/ρ consecutive tokens in shared memory
// and walks the visible keys in tiles of ATTN_PREFILL_KEYS, each K and V row read from the cache once per
// block instead of once per (token, head). Online softmax in f32, as attn_decode; the output is
// multiplied by sigmoid(gate). Thread (r, j) owns row r = tid/4 (head r / per, token r % per)
// and its keys j, j + 4, ... of each tile and its value columns 4j, 4j + 16, ...


extern "C" __global__ void __launch_bounds__(256) attn_prefill(
    const float* __restrict__ q, const float* __restrict__ gate, const float* __restrict__ k_cache,
    const float* __restrict__ v_cache, float* __restrict__ out, int T, int n_h, int n_kv, int d, int start,
    float scale) {
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
    int pos = start + t;  // this row's position; keys 0..pos are visible
    int last = start + min(t0 + per, T) - 1;  // the block's last visible key
    for (int k0 = 0; k0 <= last; k0 += ATTN_PREFILL_KEYS) {
        __syncthreads();  // the previous tile is consumed
        for (int e = tid; e < ATTN_PREFILL_KEYS * quads; e += blockDim.x) {
            int kk = e / quads, c = e - kk * quads;
            int kp = k0 + kk;
            float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
            if (kp <= last) {
                size_t at = ((size_t)kp * n_kv + g) * d;
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
        float4 gv = *(const float4*)(gate + at);
        float4 o = acc[i];
        o.x = o.x * inv * sigmoid_f(gv.x);
        o.y = o.y * inv * sigmoid_f(gv.y);
        o.z = o.z * inv * sigmoid_f(gv.z);
        o.w = o.w * inv * sigmoid_f(gv.w);
        *(float4*)(out + at) = o;
    }
}
