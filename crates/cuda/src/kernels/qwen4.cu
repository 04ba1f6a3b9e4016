// qwen4_exp pieces (MODEL_MATH §4): hyper-connection mixing and injection; PLE gates, its
// dilated causal conv, and its n-gram rows hashed and gathered on the device. (QSA selection
// is with attention, in attention.cu.)

// x[t, i] = (1/n) Σ_s sigmoid(a[t, s·H + i]) · normed[t, s·H + i].
extern "C" __global__ void hyper_connection_mix(const float* __restrict__ a, const float* __restrict__ normed,
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
extern "C" __global__ void hyper_connection_inject(float* __restrict__ hs, const float* __restrict__ y,
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

// PLE n-gram rows (MODEL_MATH §4.6), as NgramHash::rows on the CPU. Block (t, h): thread 0
// hashes the n-gram of hash head h (order h / heads_per_ngram + 2) ending at token t of
// [hist (the n − 1 ids before ids[0]) | ids]; a shift past an EOS reads EOS. Then the block
// widens that table row (dtype 0 bf16, 1 f16, 2 f32; `dim` values) into eng[t, h·dim ..].
// hash = [multipliers (n) | head sizes (heads) | head offsets (heads)], heads = gridDim.y. The
// table is host memory mapped into the device: each row crosses the bus once.
extern "C" __global__ void ple_gather(const int* __restrict__ ids, const int* __restrict__ hist,
                                      const unsigned long long* __restrict__ hash, int n, int heads_per_ngram,
                                      int eos, const void* __restrict__ table, int dtype, int dim,
                                      float* __restrict__ eng) {
    __shared__ unsigned long long row;
    int t = blockIdx.x, h = blockIdx.y, heads = gridDim.y;
    if (threadIdx.x == 0) {
        int past = n - 1, order = h / heads_per_ngram + 2;
        unsigned long long mix = 0;
        bool reset = false;
        for (int s = 0; s < order; s++) {
            int j = past + t - s;  // index into [hist | ids]
            int id = j >= past ? ids[j - past] : hist[j];
            if (s > 0) {
                reset |= id == eos;
                if (reset) id = eos;
            }
            mix ^= (unsigned long long)(unsigned int)id * hash[s];
        }
        row = mix % hash[n + h] + hash[n + heads + h];
    }
    __syncthreads();
    size_t base = (size_t)row * dim;
    float* out = eng + ((size_t)t * heads + h) * dim;
    for (int e = threadIdx.x; e < dim; e += blockDim.x) {
        float v;
        if (dtype == 0) {
            v = bf16_to_f32(((const bf16_t*)table)[base + e]);
        } else if (dtype == 1) {
            v = f16_to_f32(((const unsigned short*)table)[base + e]);
        } else {
            v = ((const float*)table)[base + e];
        }
        out[e] = v;
    }
}

// hist ← the last `past` ids of [hist | ids (T)], in place (one thread: slot r reads slot
// T + r > r, not yet written).
extern "C" __global__ void ple_advance(int* __restrict__ hist, const int* __restrict__ ids, int T, int past) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    for (int r = 0; r < past; r++) {
        int src = T + r;
        hist[r] = src < past ? hist[src] : ids[src - past];
    }
}
