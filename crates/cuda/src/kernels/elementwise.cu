// Embedding, norms and small elementwise steps.

// h[t, s·H + i] = E[ids[t], i] for every stream s.
extern "C" __global__ void embed_bf16(const bf16_t* __restrict__ E, const int* __restrict__ ids,
                                      float* __restrict__ h, int T, int hidden, int streams) {
    PDL_BEGIN();
    size_t n = (size_t)T * streams * hidden;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int i = e % hidden;
        int t = e / ((size_t)streams * hidden);
        h[e] = bf16_to_f32(E[(size_t)ids[t] * hidden + i]);
    }
}

// y[i] += x[i].
extern "C" __global__ void add_in_place(float* __restrict__ y, const float* __restrict__ x, int n) {
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) y[e] += x[e];
}

// out[t, i] = silu(in[t·ld + gate_off + i]) · in[t·ld + up_off + i], i < n.
extern "C" __global__ void swiglu(const float* __restrict__ in, int ld, int gate_off, int up_off,
                                  float* __restrict__ out, int T, int n) {
    int total = T * n;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        int t = e / n, i = e % n;
        const float* row = in + (size_t)t * ld;
        out[e] = silu_f(row[gate_off + i]) * row[up_off + i];
    }
}

// out[t, i] = silu(in[t·ld + i] · scale), i < n.
extern "C" __global__ void silu_scaled(const float* __restrict__ in, int ld, float scale,
                                       float* __restrict__ out, int T, int n) {
    int total = T * n;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        int t = e / n, i = e % n;
        out[e] = silu_f(in[(size_t)t * ld + i] * scale);
    }
}

// y[t, i] *= sigmoid(gate[t·ld]) (the shared expert's gate).
extern "C" __global__ void scale_by_sigmoid(float* __restrict__ y, const float* __restrict__ gate,
                                            int ld, int T, int n) {
    int total = T * n;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        int t = e / n;
        y[e] *= sigmoid_f(gate[(size_t)t * ld]);
    }
}

// dst[r, i] = src[rows[r], i] for r < n, i < width (the wanted rows of a batched step).
extern "C" __global__ void gather_rows(const float* __restrict__ src, const int* __restrict__ rows,
                                       float* __restrict__ dst, int n, int width) {
    size_t total = (size_t)n * width;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t r = e / width, i = e % width;
        dst[e] = src[(size_t)rows[r] * width + i];
    }
}
