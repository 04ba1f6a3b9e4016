// y = x·Wᵀ with W bf16 [rows, cols] row-major and f32 activations (MODEL_MATH: every linear
// layer is stored [out, in]). `accumulate` adds into y instead of overwriting it.

#define MV_MAX_T 8

// Decode and small batches (T <= MV_MAX_T): one warp per weight row, 16-byte weight loads,
// the row read once for all T tokens. Block = 256 threads = 8 rows.
extern "C" __global__ void matvec_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                       float* __restrict__ y, int rows, int cols, int T, int ldx,
                                       int ldy, int accumulate, int vec) {
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const bf16_t* w = W + (size_t)r * cols;
    float acc[MV_MAX_T];
#pragma unroll
    for (int t = 0; t < MV_MAX_T; t++) acc[t] = 0.0f;
    if (vec) {
        for (int c = lane * 8; c < cols; c += 256) {
            float wf[8];
            unpack8(*(const uint4*)(w + c), wf);
#pragma unroll
            for (int t = 0; t < MV_MAX_T; t++) {
                if (t < T) {
                    const float* xt = x + (size_t)t * ldx + c;
                    float4 x0 = *(const float4*)xt;
                    float4 x1 = *(const float4*)(xt + 4);
                    acc[t] += wf[0] * x0.x + wf[1] * x0.y + wf[2] * x0.z + wf[3] * x0.w
                            + wf[4] * x1.x + wf[5] * x1.y + wf[6] * x1.z + wf[7] * x1.w;
                }
            }
        }
    } else {
        for (int c = lane; c < cols; c += 32) {
            float wv = bf16_to_f32(w[c]);
#pragma unroll
            for (int t = 0; t < MV_MAX_T; t++)
                if (t < T) acc[t] += wv * x[(size_t)t * ldx + c];
        }
    }
#pragma unroll
    for (int t = 0; t < MV_MAX_T; t++) {
        if (t < T) {
            float s = warp_sum(acc[t]);
            if (lane == 0) {
                float* out = y + (size_t)t * ldy + r;
                *out = accumulate ? *out + s : s;
            }
        }
    }
}

// Prefill: a 64×64 output tile (tokens × rows) per block of 256 threads, 4×4 per thread,
// K-steps of 16 staged through shared memory; bf16 widened to f32 on the way in.
#define GT 64
#define GK 16
extern "C" __global__ void gemm_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                     float* __restrict__ y, int rows, int cols, int T, int ldx,
                                     int ldy, int accumulate) {
    __shared__ float xs[GK][GT + 4];
    __shared__ float ws[GK][GT + 4];
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    int m0 = blockIdx.y * GT, n0 = blockIdx.x * GT;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < cols; k0 += GK) {
        for (int e = threadIdx.x; e < GT * GK; e += 256) {
            int m = e / GK, k = e % GK;
            int gm = m0 + m, gk = k0 + k;
            xs[k][m] = (gm < T && gk < cols) ? x[(size_t)gm * ldx + gk] : 0.0f;
            int gn = n0 + m;
            ws[k][m] = (gn < rows && gk < cols) ? bf16_to_f32(W[(size_t)gn * cols + gk]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < GK; k++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = xs[k][ty * 4 + i];
                b[i] = ws[k][tx * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int m = m0 + ty * 4 + i;
        if (m >= T) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int n = n0 + tx * 4 + j;
            if (n >= rows) continue;
            float* out = y + (size_t)m * ldy + n;
            *out = accumulate ? *out + acc[i][j] : acc[i][j];
        }
    }
}
