// qwen4_exp pieces (MODEL_MATH §4): hyper-connection mixing and injection, PLE gates and its
// dilated causal conv.

// x[t, i] = (1/n) Σ_s sigmoid(a[t, s·H + i]) · normed[t, s·H + i].
extern "C" __global__ void hc_mix(const float* __restrict__ a, const float* __restrict__ normed,
                                  float* __restrict__ x, int T, int n, int H) {
    int total = T * H;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        int t = e / H, i = e % H;
        float acc = 0.0f;
        for (int s = 0; s < n; s++) {
            size_t at = (size_t)t * n * H + (size_t)s * H + i;
            acc += sigmoid_f(a[at]) * normed[at];
        }
        x[e] = acc / n;
    }
}

// hs[t, s·H + i] += ω_ts · y[t, i], ω_ts = 2·sigmoid(o[t·ld + s] / n).
extern "C" __global__ void hc_inject(float* __restrict__ hs, const float* __restrict__ y,
                                     const float* __restrict__ o, int ld, int T, int n, int H) {
    int total = T * n * H;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        int i = e % H, s = (e / H) % n, t = e / (n * H);
        float omega = 2.0f * sigmoid_f(o[(size_t)t * ld + s] / n);
        hs[e] += omega * y[(size_t)t * H + i];
    }
}

// Block (t, s): γ = K_s·Q_s/√H, γ = sign(γ)·sqrt(max(|γ|, 1e-6)); gates[t, s·H + i] = sigmoid(γ)·V[t, i].
// keys and queries are [T, n·H] (normed); V is row t of vals (stride ldv).
extern "C" __global__ void ple_gates(const float* __restrict__ keys, const float* __restrict__ queries,
                                     const float* __restrict__ vals, int ldv, float* __restrict__ gates,
                                     int n, int H) {
    __shared__ float red[33];
    int t = blockIdx.x, s = blockIdx.y;
    size_t base = (size_t)t * n * H + (size_t)s * H;
    float dot = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) dot += keys[base + i] * queries[base + i];
    float gamma = block_sum(dot, red) * rsqrtf((float)H);
    float mag = sqrtf(fmaxf(fabsf(gamma), 1e-6f));
    gamma = copysignf(mag, gamma);  // Rust's signum: +0 → +1
    float g = sigmoid_f(gamma);
    for (int i = threadIdx.x; i < H; i += blockDim.x) gates[base + i] = g * vals[(size_t)t * ldv + i];
}

// One thread per channel c of width W: c_t = Σ_j w[c, j] · Gn_{t − dil·(K−1−j)} over
// [state ((K−1)·dil rows) | normed rows]; hs[t, c] += gates[t, c] + silu(c_t). The state keeps
// the last (K−1)·dil normed rows.
extern "C" __global__ void ple_conv(float* __restrict__ hs, const float* __restrict__ gates,
                                    const float* __restrict__ normed, float* __restrict__ state,
                                    const float* __restrict__ w, int T, int W, int K, int dil) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= W) return;
    int past = (K - 1) * dil;
    for (int t = 0; t < T; t++) {
        int now = past + t;
        float acc = 0.0f;
        for (int j = 0; j < K; j++) {
            int r = now - dil * (K - 1 - j);
            float v = r < past ? state[(size_t)r * W + c] : normed[(size_t)(r - past) * W + c];
            acc += w[c * K + j] * v;
        }
        size_t at = (size_t)t * W + c;
        hs[at] += gates[at] + silu_f(acc);
    }
    for (int r = 0; r < past; r++) {
        int src = T + r;
        state[(size_t)r * W + c] = src < past ? state[(size_t)src * W + c] : normed[(size_t)(src - past) * W + c];
    }
}
