// The vision tower's small kernels (shared docs VISION.md §3) and the scatter of image rows
// into a step's embeddings (§4.1).

// y[r, c] += b[c] for r < rows, c < cols.
extern "C" __global__ void bias_add_rows(float* __restrict__ y, const float* __restrict__ b, int rows, int cols) {
    size_t n = (size_t)rows * cols;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        y[e] += b[e % cols];
}

// y[r, c] = gelu(y[r, c] + b[c]): the tanh form (gelu_pytorch_tanh, the blocks) when erf_form is
// 0, else the exact erf form (nn.GELU(), the merger).
extern "C" __global__ void bias_gelu_rows(float* __restrict__ y, const float* __restrict__ b, int rows, int cols,
                                          int erf_form) {
    size_t n = (size_t)rows * cols;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        float x = y[e] + b[e % cols];
        float g;
        if (erf_form) {
            g = 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
        } else {
            g = 0.5f * x * (1.0f + tanhf(0.7978846f * (x + 0.044715f * x * x * x)));
        }
        y[e] = g;
    }
}

// Sum over the block in f64 (the CPU's LayerNorm accumulates in f64).
__device__ double block_sum_f64(double v, double* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int warps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double t = lane < warps ? red[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane == 0) red[32] = t;
    }
    __syncthreads();
    return red[32];
}

// LayerNorm with bias (eps as given): block r normalises row r of x [rows, cols] into y,
// mean and variance in f64 as the CPU does.
extern "C" __global__ void layer_norm_rows(const float* __restrict__ x, float* __restrict__ y,
                                           const float* __restrict__ w, const float* __restrict__ b, int cols,
                                           float eps) {
    __shared__ double red[33];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    double s = 0.0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += (double)xr[c];
    double mean = block_sum_f64(s, red) / cols;
    double v = 0.0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        double d = (double)xr[c] - mean;
        v += d * d;
    }
    double var = block_sum_f64(v, red) / cols;
    double inv = 1.0 / sqrt(var + (double)eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = (float)(((double)xr[c] - mean) * inv) * w[c] + b[c];
}

// h[r, k] += Σ_c weights[4r + c]·table[index[4r + c], k] (f64 sum, in corner order): the
// position table bilinearly interpolated to the image's grid, indices and weights from the host.
extern "C" __global__ void vision_pos_embed_add(float* __restrict__ h, const float* __restrict__ table,
                                                const int* __restrict__ index, const double* __restrict__ weights,
                                                int rows, int d) {
    size_t n = (size_t)rows * d;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t r = e / d, k = e % d;
        double v = 0.0;
        for (int c = 0; c < 4; c++) v += weights[4 * r + c] * (double)table[(size_t)index[4 * r + c] * d + k];
        h[e] += (float)v;
    }
}

// qkv [n, 3·heads·hd] (rows q, k, v, each head-major) → q, k, v [n, heads, hd], q and k rotated
// over the whole head by rotate_half with cos/sin [n, hd/2] (the 2-D vision RoPE).
extern "C" __global__ void vision_rope_split(const float* __restrict__ qkv, const float* __restrict__ cos_t,
                                             const float* __restrict__ sin_t, float* __restrict__ q,
                                             float* __restrict__ k, float* __restrict__ v, int n, int heads,
                                             int hd) {
    int width = heads * hd, half = hd / 2;
    size_t total = (size_t)n * width;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t r = e / width;
        int col = e % width, j = col % hd;
        const float* row = qkv + r * 3 * width;
        int i = j < half ? j : j - half;
        float c = cos_t[r * half + i], s = sin_t[r * half + i];
        int base = col - j;
        float qa = row[col], ka = row[width + col];
        float qo = j < half ? row[base + j + half] : row[base + j - half];
        float ko = j < half ? row[width + base + j + half] : row[width + base + j - half];
        q[e] = j < half ? qa * c - qo * s : qa * c + qo * s;
        k[e] = j < half ? ka * c - ko * s : ka * c + ko * s;
        v[e] = row[2 * width + col];
    }
}

// h[index[r]·streams·hidden + s·hidden + i] = src[r·hidden + i] for every stream s: image
// features replace their pads' embeddings.
extern "C" __global__ void scatter_rows(const float* __restrict__ src, const int* __restrict__ index,
                                        float* __restrict__ h, int n, int hidden, int streams) {
    size_t total = (size_t)n * hidden;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t r = e / hidden, i = e % hidden;
        float x = src[e];
        for (int s = 0; s < streams; s++) h[((size_t)index[r] * streams + s) * hidden + i] = x;
    }
}
