// Gated DeltaNet (MODEL_MATH §1.5): causal conv with state, then the token-serial delta rule
// with the gated output norm fused in.

// One thread per channel c: u[t, c] = silu(Σ_j w[c, j] · x_{t−K+1+j}[c]) over the window
// [state (K−1 rows) | x rows]; x row t is proj[t·ld + c]. The state keeps the last K−1 raw rows.
extern "C" __global__ void gdn_conv(const float* __restrict__ proj, int ld, float* __restrict__ state,
                                    const float* __restrict__ w, float* __restrict__ u, int T, int C, int K) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int past = K - 1;
    for (int t = 0; t < T; t++) {
        float acc = 0.0f;
        for (int j = 0; j < K; j++) {
            int r = t + j;  // window row
            float v = r < past ? state[(size_t)r * C + c] : proj[(size_t)(r - past) * ld + c];
            acc += w[c * K + j] * v;
        }
        u[(size_t)t * C + c] = silu_f(acc);
    }
    // New state row r = window row T + r; ascending r only reads rows not yet overwritten.
    for (int r = 0; r < past; r++) {
        int src = T + r;
        state[(size_t)r * C + c] = src < past ? state[(size_t)src * C + c] : proj[(size_t)(src - past) * ld + c];
    }
}

#define GDN_MAX_DK 128

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

// ---- Decode after a fused conv (T ≤ MV_MAX_T tokens): one block per value head ----
// `u` rows hold the conv outputs [q (n_k·d_k) | k | v (n_v·d_v)] followed by z, b, a (the
// in_proj matvec applied the conv, dmvc_*). Block h holds S_h [d_k, d_v] in shared memory;
// thread (rg, j) owns column j over rows [rg·d_k/R, (rg+1)·d_k/R). Arithmetic as gdn_recurrent.
extern "C" __global__ void __launch_bounds__(1024) gdn_heads(
    const float* __restrict__ u, int ld, int T, int nk, int nv, int dk, int dv, int z_off, int b_off, int a_off,
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
        const float* pt = u + (size_t)t * ld;
        float qn = norms[2 * t], kn = norms[2 * t + 1];
        float beta = sigmoid_f(pt[b_off + h]);
        float alpha = expf(decay * softplus_f(pt[a_off + h] + dt_bias[h]));
        float sk = 0.0f;
        for (int i = r0; i < r0 + rows; i++) sk += Sh[(size_t)i * dv] * k[i];
        red[rg * dv + j] = sk;
        __syncthreads();
        sk = 0.0f;
        for (int g = 0; g < R; g++) sk += red[g * dv + j];
        float v = pt[2 * nk * dk + h * dv + j];
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
