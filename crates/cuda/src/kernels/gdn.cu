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
