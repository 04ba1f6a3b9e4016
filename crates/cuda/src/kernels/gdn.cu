// Gated DeltaNet (MODEL_MATH §1.5): the causal conv with its state, then the delta rule in one
// of three forms (gdn.rs chooses):
// - decode (≤ 8 tokens, after the conv fused into in_proj): gdn_decode_heads, a block per value head;
// - prefill (> 8 tokens): the chunked form, gdn_chunk_prep (every chunk in parallel), then
//   gdn_chunk_scan (S carried through the chunks), then gdn_gated_norm;
// - the fallback for shapes those refuse: gdn_recurrent, token-serial, gated norm fused in.

// u[t, c] = silu(Σ_j w[c, j] · x_{t−K+1+j}[c]) over the window [state (K−1 rows) | x rows];
// x row t is proj[t·ld + c]. A thread per (t, c), grid-stride; the state is read, not
// changed (gdn_conv_state_update moves it on afterwards).
extern "C" __global__ void gdn_conv(const float* __restrict__ proj, int ld, const float* __restrict__ state,
                                    const float* __restrict__ w, float* __restrict__ u, int T, int C, int K) {
    int past = K - 1;
    size_t all = (size_t)T * C, step = gridDim.x * (size_t)blockDim.x;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < all; e += step) {
        int t = (int)(e / C), c = (int)(e - (size_t)t * C);
        float acc = 0.0f;
        for (int j = 0; j < K; j++) {
            int r = t + j;  // window row
            float v = r < past ? state[(size_t)r * C + c] : proj[(size_t)(r - past) * ld + c];
            acc += w[c * K + j] * v;
        }
        u[e] = silu_f(acc);
    }
}

// The conv state after T more rows: the last K−1 raw rows of [state | x]. A thread per channel;
// ascending rows only read rows not yet overwritten.
extern "C" __global__ void gdn_conv_state_update(const float* __restrict__ proj, int ld, float* __restrict__ state, int T,
                                                 int C, int K) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int past = K - 1;
    for (int r = 0; r < past; r++) {
        int src = T + r;
        state[(size_t)r * C + c] = src < past ? state[(size_t)src * C + c] : proj[(size_t)(src - past) * ld + c];
    }
}


// One block per v-head h, thread j owns column j of S_h [d_k, d_v] in registers.
// Per token: l2-normalise q, k of key head h/ρ; β = sigmoid(b); α = exp(−exp(A_log)·softplus(a + dt_bias));
// S ← αS; e = β(v − Sᵀk); S += k⊗e; o = Sᵀq; out = rmsnorm(o)·w·act(z).
// u is [T, C] (conv output, channels [q | k | v]); b, a, z are read from proj rows.
extern "C" __global__ void gdn_recurrent(const float* __restrict__ u, int C,
                                         const float* __restrict__ proj, int ld, int z_off, int b_off, int a_off,
                                         float* __restrict__ state, const float* __restrict__ a_log,
                                         const float* __restrict__ dt_bias, const float* __restrict__ norm_w,
                                         float* __restrict__ out, int T, int nk, int nv, int dk, int dv,
                                         float eps, int gate_sigmoid) {
    __shared__ float qs[GDN_MAX_DK], ks[GDN_MAX_DK];
    __shared__ float red[33];
    int h = blockIdx.x, j = threadIdx.x;
    int rho = nv / nk, kh = h / rho;
    bool own = j < dv;
    float s[GDN_MAX_DK];
    float* S = state + (size_t)h * dk * dv;
#pragma unroll
    for (int i = 0; i < GDN_MAX_DK; i++) s[i] = (own && i < dk) ? S[(size_t)i * dv + j] : 0.0f;
    float decay = -expf(a_log[h]);
    float q_scale = rsqrtf((float)dk);
    for (int t = 0; t < T; t++) {
        const float* ut = u + (size_t)t * C;
        const float* pt = proj + (size_t)t * ld;
        for (int i = j; i < dk; i += blockDim.x) {
            qs[i] = ut[kh * dk + i];
            ks[i] = ut[nk * dk + kh * dk + i];
        }
        __syncthreads();
        float pq = 0.0f, pk = 0.0f;
        for (int i = j; i < dk; i += blockDim.x) {
            pq += qs[i] * qs[i];
            pk += ks[i] * ks[i];
        }
        float qn = q_scale / sqrtf(block_sum(pq, red) + 1e-6f);
        float kn = 1.0f / sqrtf(block_sum(pk, red) + 1e-6f);
        float beta = sigmoid_f(pt[b_off + h]);
        float alpha = expf(decay * softplus_f(pt[a_off + h] + dt_bias[h]));
        float o = 0.0f;
        if (own) {
            float v = ut[2 * nk * dk + h * dv + j];
            float sk = 0.0f;
#pragma unroll
            for (int i = 0; i < GDN_MAX_DK; i++)
                if (i < dk) sk += s[i] * ks[i];
            float e = beta * (v - alpha * sk * kn);
#pragma unroll
            for (int i = 0; i < GDN_MAX_DK; i++) {
                if (i < dk) {
                    s[i] = alpha * s[i] + ks[i] * kn * e;
                    o += s[i] * qs[i];
                }
            }
            o *= qn;
        }
        float ss = block_sum(own ? o * o : 0.0f, red);
        if (own) {
            float z = pt[z_off + h * dv + j];
            float g = gate_sigmoid ? sigmoid_f(z) : silu_f(z);
            out[((size_t)t * nv + h) * dv + j] = o * rsqrtf(ss / dv + eps) * norm_w[j] * g;
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < GDN_MAX_DK; i++)
        if (own && i < dk) S[(size_t)i * dv + j] = s[i];
}

// ---- Decode after a fused conv (T ≤ MATVEC_MAX_TOKENS tokens): one block per value head ----
// `u` rows hold the conv outputs [q (n_k·d_k) | k | v (n_v·d_v)] followed by z, b, a (the
// in_proj matvec applied the conv, decode_matvec_conv_*). Block h holds S_h [d_k, d_v] in shared memory;
// thread (rg, j) owns column j over rows [rg·d_k/R, (rg+1)·d_k/R). Arithmetic as gdn_recurrent.
// q, k, v are read from rows of u (stride ld), z, b, a from rows of p (stride ldp): the same
// rows when the conv was fused into in_proj.
__device__ __forceinline__ void gdn_decode_heads_body(
    const float* __restrict__ u, int ld, const float* __restrict__ p, int ldp, int T, int nk, int nv, int dk, int dv,
    int z_off, int b_off, int a_off,
    float* __restrict__ state, const float* __restrict__ a_log, const float* __restrict__ dt_bias,
    const float* __restrict__ norm_w, float* __restrict__ out, float eps, int gate_sigmoid, int R) {
    extern __shared__ __align__(16) float hsm[];
    int h = blockIdx.x, tid = threadIdx.x;
    int kh = h / (nv / nk);
    int width = dv < 32 ? dv : 32;  // lanes of one head in a warp
    float* S = hsm;                 // [d_k][d_v]
    float* qk = S + (size_t)dk * dv;  // [T][2][d_k]
    float* norms = qk + T * 2 * dk;   // [T][2]
    float* red = norms + 2 * T;       // [R][d_v]
    float* sq = red + R * dv;         // [d_v / width]
    float* Sg = state + (size_t)h * dk * dv;
    int n4 = dk * dv / 4;
    for (int e = tid; e < n4; e += blockDim.x) cp_async16((float4*)S + e, (const float4*)Sg + e);
    for (int e = tid; e < T * 2 * dk; e += blockDim.x) {
        int t = e / (2 * dk), r = e - t * 2 * dk;
        int which = r / dk, i = r - which * dk;
        qk[e] = u[(size_t)t * ld + (size_t)which * nk * dk + (size_t)kh * dk + i];
    }
    cp_async_wait_all();
    __syncthreads();
    int lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    for (int pr = warp; pr < 2 * T; pr += warps) {
        const float* src = qk + pr * dk;
        float ss = 0.0f;
        for (int i = lane; i < dk; i += 32) ss += src[i] * src[i];
        ss = warp_sum(ss);
        if (lane == 0) norms[pr] = (pr & 1) == 0 ? rsqrtf((float)dk) / sqrtf(ss + 1e-6f) : 1.0f / sqrtf(ss + 1e-6f);
    }
    __syncthreads();
    int j = tid % dv, rg = tid / dv;
    int rows = dk / R, r0 = rg * rows;
    float* Sh = S + j;  // column j: Sh[i·d_v]
    float decay = -expf(a_log[h]);
    for (int t = 0; t < T; t++) {
        const float* q = qk + t * 2 * dk;
        const float* k = q + dk;
        const float* ut = u + (size_t)t * ld;
        const float* pt = p + (size_t)t * ldp;
        float qn = norms[2 * t], kn = norms[2 * t + 1];
        float beta = sigmoid_f(pt[b_off + h]);
        float alpha = expf(decay * softplus_f(pt[a_off + h] + dt_bias[h]));
        float sk = 0.0f;
        for (int i = r0; i < r0 + rows; i++) sk += Sh[(size_t)i * dv] * k[i];
        red[rg * dv + j] = sk;
        __syncthreads();
        sk = 0.0f;
        for (int g = 0; g < R; g++) sk += red[g * dv + j];
        float v = ut[2 * nk * dk + h * dv + j];
        float e = beta * (v - alpha * sk * kn);
        float o = 0.0f;
        for (int i = r0; i < r0 + rows; i++) {
            float si = alpha * Sh[(size_t)i * dv] + k[i] * kn * e;
            Sh[(size_t)i * dv] = si;
            o += si * q[i];
        }
        __syncthreads();
        red[rg * dv + j] = o;
        __syncthreads();
        o = 0.0f;
        for (int g = 0; g < R; g++) o += red[g * dv + j];
        o *= qn;
        float ss = o * o;
        for (int off = width >> 1; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        int parts = dv / width;
        if (rg == 0 && (j % width) == 0) sq[j / width] = ss;
        __syncthreads();
        float tot = 0.0f;
        for (int w = 0; w < parts; w++) tot += sq[w];
        if (rg == 0) {
            float z = pt[z_off + h * dv + j];
            float gz = gate_sigmoid ? sigmoid_f(z) : silu_f(z);
            out[((size_t)t * nv + h) * dv + j] = o * rsqrtf(tot / dv + eps) * norm_w[j] * gz;
        }
        __syncthreads();
    }
    for (int e = tid; e < n4; e += blockDim.x) ((float4*)Sg)[e] = ((const float4*)S)[e];
}

extern "C" __global__ void __launch_bounds__(1024) gdn_decode_heads(
    const float* __restrict__ u, int ld, int T, int nk, int nv, int dk, int dv, int z_off, int b_off, int a_off,
    float* __restrict__ state, const float* __restrict__ a_log, const float* __restrict__ dt_bias,
    const float* __restrict__ norm_w, float* __restrict__ out, float eps, int gate_sigmoid, int R) {
    prefetch_l2_range(state + (size_t)blockIdx.x * dk * dv, 0, (size_t)dk * dv * 4);
    PDL_BEGIN();
    gdn_decode_heads_body(u, ld, u, ld, T, nk, nv, dk, dv, z_off, b_off, a_off, state, a_log, dt_bias, norm_w, out,
                          eps, gate_sigmoid, R);
}

// gdn_decode_heads on a conv output apart from the projection: q, k, v from rows of u [T, ld]
// (gdn_conv's output), z, b, a from rows of p [T, ldp] (the in_proj output). The same
// arithmetic, for the few-token rows of one sequence inside a larger step.
extern "C" __global__ void __launch_bounds__(1024) gdn_decode_heads_rows(
    const float* __restrict__ u, int ld, const float* __restrict__ p, int ldp, int T, int nk, int nv, int dk, int dv,
    int z_off, int b_off, int a_off, float* __restrict__ state, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float* __restrict__ out, float eps,
    int gate_sigmoid, int R) {
    gdn_decode_heads_body(u, ld, p, ldp, T, nk, nv, dk, dv, z_off, b_off, a_off, state, a_log, dt_bias, norm_w, out,
                          eps, gate_sigmoid, R);
}

// ---- Batched decode: B sequences, one token each, one launch per op ----
// Row b of proj [B, ld] is sequence b's in_proj output. Its conv (window [state_b | row b], as
// gdn_conv) replaces channels [0, C) of the row in place, and state_b moves on by the raw row.
// states[b] is sequence b's conv state [K−1, C]. A thread per (b, c), grid-stride.
extern "C" __global__ void gdn_conv_decode_batch(float* __restrict__ proj, int ld,
                                                 const unsigned long long* __restrict__ states,
                                                 const float* __restrict__ w, int B, int C, int K) {
    size_t all = (size_t)B * C, step = gridDim.x * (size_t)blockDim.x;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < all; e += step) {
        int b = (int)(e / C), c = (int)(e - (size_t)b * C);
        float* st = (float*)states[b];
        float* x = proj + (size_t)b * ld + c;
        float raw = *x;
        float acc = 0.0f;
        for (int j = 0; j < K; j++) {
            float v = j < K - 1 ? st[(size_t)j * C + c] : raw;
            acc += w[c * K + j] * v;
        }
        for (int r = 0; r + 1 < K - 1; r++) st[(size_t)r * C + c] = st[(size_t)(r + 1) * C + c];
        if (K > 1) st[(size_t)(K - 2) * C + c] = raw;
        *x = silu_f(acc);
    }
}

// gdn_decode_heads for B sequences of one token: block (h, b) runs value head h of sequence b
// on row b of u [B, ld] (after gdn_conv_decode_batch), its recurrent state at states[b] and
// output row b of out [B, n_v·d_v]. Shared memory as gdn_decode_heads with T = 1.
extern "C" __global__ void __launch_bounds__(1024) gdn_decode_heads_batch(
    const float* __restrict__ u, int ld, int nk, int nv, int dk, int dv, int z_off, int b_off, int a_off,
    const unsigned long long* __restrict__ states, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float* __restrict__ out, float eps,
    int gate_sigmoid, int R) {
    int b = blockIdx.y;
    gdn_decode_heads_body(u + (size_t)b * ld, ld, u + (size_t)b * ld, ld, 1, nk, nv, dk, dv, z_off, b_off, a_off,
                          (float*)states[b], a_log, dt_bias, norm_w, out + (size_t)b * nv * dv, eps, gate_sigmoid, R);
}

// ---- Prefill: the chunked form (MODEL_MATH §1.5 "Chunked prefill form") ----
// Per value head h and chunk of L ≤ GDN_CHUNK tokens (local index i), with g_i = ln α_i ≤ 0,
// c_i = Σ_{s≤i} g_s and D_ij = exp(c_i − c_j) for j ≤ i:
//   A  = strict_lower(β_i (k̂_i·k̂_j) D_ij);   [U | W] = (I + A)⁻¹ [β⊙V | β⊙e^c⊙K̂]
//   V' = U − W S;   O = (e^c⊙Q̂) S + P V',  P = (Q̂ K̂ᵀ) ⊙ D (with the diagonal);
//   S  ← e^{c_L} S + (e^{c_L − c}⊙K̂)ᵀ V'.
// (V' row i is the delta e_i of the recurrence; see kernels::gdn_chunked on the CPU.) Every
// exponent is ≤ 0; factors below e^-87 are 0, as on the CPU.
//
// gdn_chunk_prep computes everything that does not depend on S into one record per (h, chunk):
//   P [CH][CH] | Qd = e^c⊙Q̂ [CH][ldk] | Kd = e^{c_L − c}⊙K̂ [CH][ldk] | W [CH][ldk] | U [CH][d_v]
//   | e^{c_L} | 3 unused,
// rows ≥ L and columns ≥ d_k all zero. ldk ≥ d_k is a multiple of 4 with ldk/4 odd (float4
// rows that a quarter-warp reads at 8 different row starts without bank conflicts); gdn.rs
// chooses it. Records are [n_v][⌈T/CH⌉] in that order.


// e^x for the non-positive log-decays: 0 below e^-87, where f32 leaves the normal range.
__device__ __forceinline__ float decay_exp(float x) { return x < -87.0f ? 0.0f : expf(x); }

// Floats in one record (layout above).
__device__ __forceinline__ size_t gdn_record_len(int ldk, int dv) {
    return (size_t)GDN_CHUNK * GDN_CHUNK + 3 * (size_t)GDN_CHUNK * ldk + (size_t)GDN_CHUNK * dv + 4;
}

// Grid (⌈T/CH⌉, n_v), GDN_PREP_THREADS threads; dynamic shared 4·(2·CH·ldk + CH² + 5·CH) bytes.
// u is the conv output [T, C] (channels [q | k | v]); b and a are read from proj rows [T, ld].
// Needs d_k ≤ 128 (the scan's rows) and ldk as above.
extern "C" __global__ void __launch_bounds__(GDN_PREP_THREADS) gdn_chunk_prep(
    const float* __restrict__ u, int C, const float* __restrict__ proj, int ld, int b_off, int a_off,
    const float* __restrict__ a_log, const float* __restrict__ dt_bias, float* __restrict__ rec, int T, int nk,
    int nv, int dk, int dv, int ldk) {
    const int CH = GDN_CHUNK;
    extern __shared__ __align__(16) float psm[];
    float* Q = psm;           // [CH][ldk]: q̂, zero outside rows < L and columns < d_k
    float* K = Q + CH * ldk;  // [CH][ldk]: k̂, likewise
    float* A = K + CH * ldk;  // [CH][CH]: strictly lower
    float* c = A + CH * CH;   // [CH]: g, then its cumulative sum (g = 0 past L)
    float* ec = c + CH;       // [CH]: e^{c_i}
    float* beta = ec + CH;    // [CH]: 0 past L
    float* inv = beta + CH;   // [2·CH]: the l2-norm factors of the q rows, then the k rows
    int chunk = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    int n_chunks = (T + CH - 1) / CH;
    int t0 = chunk * CH, L = min(CH, T - t0);
    int kh = h / (nv / nk);
    int dkp = (dk + 3) & ~3;
    const float* ut = u + (size_t)t0 * C;
    float* rp = rec + ((size_t)h * n_chunks + chunk) * gdn_record_len(ldk, dv);
    float* Pg = rp;                  // [CH][CH]
    float* Qd = Pg + CH * CH;        // [CH][ldk]
    float* Kd = Qd + CH * ldk;       // [CH][ldk]
    float* Wg = Kd + CH * ldk;       // [CH][ldk]
    float* Ug = Wg + CH * ldk;       // [CH][d_v], then e^{c_L}

    for (int e = tid; e < CH * ldk; e += GDN_PREP_THREADS) {
        int i = e / ldk, d = e - i * ldk;
        bool in = i < L && d < dk;
        Q[e] = in ? ut[(size_t)i * C + kh * dk + d] : 0.0f;
        K[e] = in ? ut[(size_t)i * C + nk * dk + kh * dk + d] : 0.0f;
    }
    float decay = -expf(a_log[h]);
    for (int i = tid; i < CH; i += GDN_PREP_THREADS) {
        float b = 0.0f, g = 0.0f;
        if (i < L) {
            const float* pt = proj + (size_t)(t0 + i) * ld;
            b = sigmoid_f(pt[b_off + h]);
            g = decay * softplus_f(pt[a_off + h] + dt_bias[h]);
        }
        beta[i] = b;
        c[i] = g;
    }
    __syncthreads();

    // l2 norms as gdn_recurrent: q̂ = q·d_k^-½/√(Σq²+1e-6), k̂ = k/√(Σk²+1e-6); c = cumsum(g).
    int lane = tid & 31, warp = tid >> 5;
    for (int row = warp; row < 2 * CH; row += GDN_PREP_THREADS / 32) {
        const float* x = row < CH ? Q + row * ldk : K + (row - CH) * ldk;
        float ss = 0.0f;
        for (int d = lane; d < dk; d += 32) ss += x[d] * x[d];
        ss = warp_sum(ss);
        if (lane == 0) inv[row] = (row < CH ? rsqrtf((float)dk) : 1.0f) / sqrtf(ss + 1e-6f);
    }
    if (tid == 0) {
        float acc = 0.0f;
        for (int i = 0; i < CH; i++) {
            acc += c[i];
            c[i] = acc;
        }
    }
    __syncthreads();
    for (int e = tid; e < CH * ldk; e += GDN_PREP_THREADS) {
        int i = e / ldk;
        Q[e] *= inv[i];
        K[e] *= inv[CH + i];
    }
    for (int i = tid; i < CH; i += GDN_PREP_THREADS) ec[i] = decay_exp(c[i]);
    __syncthreads();

    // A and P: thread (row group i0, column j) takes rows i = i0 + 4m. A warp shares i0
    // (its K/Q rows i are broadcasts) and reads 32 rows j (conflict-free by the choice of ldk).
    float c_last = c[L - 1];
    {
        const int GROUPS = GDN_PREP_THREADS / CH;  // 4
        const int RM = CH / GROUPS;                // 16 rows per thread
        int j = tid % CH, i0 = tid / CH;
        float kk[RM], qk[RM];
#pragma unroll
        for (int m = 0; m < RM; m++) kk[m] = qk[m] = 0.0f;
        for (int d = 0; d < dkp; d += 4) {
            float4 kj = *(const float4*)(K + j * ldk + d);
#pragma unroll
            for (int m = 0; m < RM; m++) {
                int i = i0 + m * GROUPS;
                float4 ki = *(const float4*)(K + i * ldk + d);
                float4 qi = *(const float4*)(Q + i * ldk + d);
                kk[m] += ki.x * kj.x + ki.y * kj.y + ki.z * kj.z + ki.w * kj.w;
                qk[m] += qi.x * kj.x + qi.y * kj.y + qi.z * kj.z + qi.w * kj.w;
            }
        }
#pragma unroll
        for (int m = 0; m < RM; m++) {
            int i = i0 + m * GROUPS;
            float dij = j <= i ? decay_exp(c[i] - c[j]) : 0.0f;
            A[i * CH + j] = (j < i && i < L) ? beta[i] * kk[m] * dij : 0.0f;
            Pg[i * CH + j] = (j <= i && i < L) ? qk[m] * dij : 0.0f;
        }
    }
    for (int e = tid; e < CH * ldk; e += GDN_PREP_THREADS) {
        int i = e / ldk;
        Qd[e] = ec[i] * Q[e];
        Kd[e] = decay_exp(c_last - c[i]) * K[e];
    }
    int wpad = ldk - dk;  // W's zero columns
    for (int e = tid; e < CH * wpad; e += GDN_PREP_THREADS) {
        int i = e / wpad;
        Wg[i * ldk + dk + (e - i * wpad)] = 0.0f;
    }
    if (tid == 0) Ug[CH * dv] = decay_exp(c_last);
    __syncthreads();

    // [U | W] = (I + A)⁻¹ [β⊙V | β⊙e^c⊙K̂] by forward substitution, a thread per column n
    // (n < d_v: U, else W column n − d_v): x_i = rhs_i − Σ_{j<i} A_ij x_j. Rows ≥ L come out 0.
    const float* vt = ut + 2 * nk * dk + h * dv;
    for (int n = tid; n < dv + dk; n += GDN_PREP_THREADS) {
        bool is_u = n < dv;
        float x[GDN_CHUNK];
#pragma unroll
        for (int i = 0; i < CH; i++) {
            float r;
            if (is_u) r = i < L ? beta[i] * vt[(size_t)i * C + n] : 0.0f;
            else r = beta[i] * ec[i] * K[i * ldk + (n - dv)];
#pragma unroll
            for (int j = 0; j < i; j++) r -= A[i * CH + j] * x[j];
            x[i] = r;
        }
        float* dst = is_u ? Ug + n : Wg + (n - dv);
        int ldd = is_u ? dv : ldk;
#pragma unroll
        for (int i = 0; i < CH; i++) dst[(size_t)i * ldd] = x[i];
    }
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(p)));
}

// Grid (⌈d_v/32⌉, n_v), GDN_SCAN_THREADS threads; dynamic shared 4·(CH² + 3·CH·ldk + CH·32 +
// dkp·32) bytes (dkp = d_k rounded up to 4). Block (s, h) carries columns [32s, 32s + 32) of
// S_h (the delta rule's columns are independent) through the chunks in order, writing the
// raw read-out o [T, n_v·d_v] (before the gated norm). Thread (ty = warp, tx = lane) owns column
// 32s + tx; rows i = ty + 16m (m < 4) of the chunk and rows 8ty … 8ty + 7 of S.
extern "C" __global__ void __launch_bounds__(GDN_SCAN_THREADS) gdn_chunk_scan(
    const float* __restrict__ rec, float* __restrict__ state, float* __restrict__ out, int T, int nv, int dk,
    int dv, int ldk) {
    const int CH = GDN_CHUNK, NT = GDN_SCAN_THREADS, SC = GDN_SCAN_COLS;
    const int RM = CH / (NT / 32);  // 4 chunk rows per thread
    extern __shared__ __align__(16) float ssm[];
    float* P = ssm;             // [CH][CH]   } a copy of the record's head
    float* Qd = P + CH * CH;    // [CH][ldk]  }
    float* Kd = Qd + CH * ldk;  // [CH][ldk]  }
    float* W = Kd + CH * ldk;   // [CH][ldk]  }
    float* V = W + CH * ldk;    // [CH][SC]: this block's columns of U, then V'
    int dkp = (dk + 3) & ~3;
    float* S = V + CH * SC;     // [dkp][SC]: this block's columns of S_h, rows ≥ d_k zero
    int h = blockIdx.y, tid = threadIdx.x, tx = tid & 31, ty = tid >> 5;
    int c0 = blockIdx.x * SC, col = c0 + tx;
    bool own = col < dv;
    int n_chunks = (T + CH - 1) / CH;
    size_t head_len = (size_t)CH * CH + 3 * (size_t)CH * ldk;  // P | Qd | Kd | W
    size_t rec_len = gdn_record_len(ldk, dv);
    float* Sg = state + (size_t)h * dk * dv;
    for (int e = tid; e < dkp * SC; e += NT) {
        int d = e / SC, cc = c0 + e % SC;
        S[e] = (d < dk && cc < dv) ? Sg[(size_t)d * dv + cc] : 0.0f;
    }
    for (int chunk = 0; chunk < n_chunks; chunk++) {
        const float* r = rec + ((size_t)h * n_chunks + chunk) * rec_len;
        int t0 = chunk * CH, L = min(CH, T - t0);
        for (int e = tid; e < (int)(head_len / 4); e += NT) cp_async16(ssm + 4 * e, r + 4 * e);
        for (int e = tid; e < CH * SC; e += NT) {
            int i = e / SC, cc = c0 + e % SC;
            V[e] = cc < dv ? r[head_len + (size_t)i * dv + cc] : 0.0f;
        }
        float gl = r[head_len + (size_t)CH * dv];
        if (chunk + 1 < n_chunks)  // the next record towards L2 while this one is worked on
            for (size_t e = (size_t)tid * 32; e < rec_len; e += (size_t)NT * 32) prefetch_l2(r + rec_len + e);
        cp_async_wait_all();
        __syncthreads();

        // V' = U − W S, and (e^c⊙Q̂) S kept for the read-out.
        float ws[RM], qs[RM];
#pragma unroll
        for (int m = 0; m < RM; m++) ws[m] = qs[m] = 0.0f;
        for (int d = 0; d < dkp; d += 4) {
            float s0 = S[d * SC + tx], s1 = S[(d + 1) * SC + tx];
            float s2 = S[(d + 2) * SC + tx], s3 = S[(d + 3) * SC + tx];
#pragma unroll
            for (int m = 0; m < RM; m++) {
                int i = ty + m * (NT / 32);
                float4 w = *(const float4*)(W + i * ldk + d);
                float4 q = *(const float4*)(Qd + i * ldk + d);
                ws[m] += w.x * s0 + w.y * s1 + w.z * s2 + w.w * s3;
                qs[m] += q.x * s0 + q.y * s1 + q.z * s2 + q.w * s3;
            }
        }
#pragma unroll
        for (int m = 0; m < RM; m++) V[(ty + m * (NT / 32)) * SC + tx] -= ws[m];
        __syncthreads();

        // o_i = (e^c⊙Q̂ S)_i + Σ_{j≤i} P_ij V'_j.
#pragma unroll
        for (int m = 0; m < RM; m++) {
            int i = ty + m * (NT / 32);
            if (i < L) {
                float o = qs[m];
                for (int j = 0; j <= i; j++) o += P[i * CH + j] * V[j * SC + tx];
                if (own) out[((size_t)(t0 + i) * nv + h) * dv + col] = o;
            }
        }
        // S ← e^{c_L} S + Kdᵀ V' on this thread's rows (no other thread reads them until the
        // barrier below).
        int d0 = ty * 8;
        if (d0 < dkp) {
            bool two = d0 + 4 < dkp;  // the second group of 4 rows exists
            float acc[8];
#pragma unroll
            for (int q = 0; q < 8; q++) acc[q] = (q < 4 || two) ? gl * S[(d0 + q) * SC + tx] : 0.0f;
            for (int j = 0; j < L; j++) {
                float v = V[j * SC + tx];
                float4 k0 = *(const float4*)(Kd + j * ldk + d0);
                acc[0] += k0.x * v;
                acc[1] += k0.y * v;
                acc[2] += k0.z * v;
                acc[3] += k0.w * v;
                if (two) {
                    float4 k1 = *(const float4*)(Kd + j * ldk + d0 + 4);
                    acc[4] += k1.x * v;
                    acc[5] += k1.y * v;
                    acc[6] += k1.z * v;
                    acc[7] += k1.w * v;
                }
            }
#pragma unroll
            for (int q = 0; q < 8; q++)
                if (q < 4 || two) S[(d0 + q) * SC + tx] = acc[q];
        }
        __syncthreads();
    }
    for (int e = tid; e < dk * SC; e += NT) {
        int d = e / SC, cc = c0 + e % SC;
        if (cc < dv) Sg[(size_t)d * dv + cc] = S[e];
    }
}

// The gated output norm of the chunked form, in place on o [T, n_v·d_v]: a warp per (t, h),
// out = o·rsqrt(mean(o²) + eps)·w·act(z) as in gdn_recurrent (act: sigmoid or SiLU).
extern "C" __global__ void gdn_gated_norm(float* __restrict__ o, const float* __restrict__ proj, int ld, int z_off,
                                          const float* __restrict__ norm_w, int T, int nv, int dv, float eps,
                                          int gate_sigmoid) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= T * nv) return;
    int t = row / nv, h = row - t * nv;
    float* x = o + (size_t)row * dv;
    const float* z = proj + (size_t)t * ld + z_off + h * dv;
    float ss = 0.0f;
    for (int j = lane; j < dv; j += 32) ss += x[j] * x[j];
    float scale = rsqrtf(warp_sum(ss) / dv + eps);
    for (int j = lane; j < dv; j += 32) {
        float g = gate_sigmoid ? sigmoid_f(z[j]) : silu_f(z[j]);
        x[j] = x[j] * scale * norm_w[j] * g;
    }
}
