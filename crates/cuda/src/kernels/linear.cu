// y = x·Wᵀ with W [rows, cols] row-major in one weight format (common.cuh) and f32
// activations (MODEL_MATH: every linear layer is stored [out, in]). `accumulate` adds into y.


// Decode and small batches (T <= MATVEC_MAX_TOKENS): one warp per weight row, 16-byte code loads, the
// row read once for all T tokens. Block = 256 threads = 8 rows. `vec`: cols a whole number of
// chunks and x rows 16-byte aligned.
template <int FMT>
__device__ __forceinline__ void matvec_impl(const unsigned char* __restrict__ W, const unsigned short* __restrict__ S,
                                            const float* __restrict__ x, float* __restrict__ y, int rows,
                                            int cols, int T, int ldx, int ldy, int accumulate, int vec) {
    const int V = WF<FMT>::VALS;
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const unsigned char* w = W + (size_t)r * WF<FMT>::row_bytes(cols);
    const unsigned short* s = S + (size_t)r * (cols >> 5);
    float acc[MATVEC_MAX_TOKENS];
#pragma unroll
    for (int t = 0; t < MATVEC_MAX_TOKENS; t++) acc[t] = 0.0f;
    if (vec) {
        int chunks = cols / V;
#pragma unroll 2
        for (int ch = lane; ch < chunks; ch += 32) {
            float wf[V];
            load_chunk<FMT>(w, s, ch, wf);
#pragma unroll
            for (int t = 0; t < MATVEC_MAX_TOKENS; t++)
                if (t < T) acc[t] += dot_chunk<V>(wf, x + (size_t)t * ldx + (size_t)ch * V);
        }
    } else {
        for (int c = lane; c < cols; c += 32) {
            float wv = load_one<FMT>(w, s, c);
#pragma unroll
            for (int t = 0; t < MATVEC_MAX_TOKENS; t++)
                if (t < T) acc[t] += wv * x[(size_t)t * ldx + c];
        }
    }
#pragma unroll
    for (int t = 0; t < MATVEC_MAX_TOKENS; t++) {
        if (t < T) {
            float sum = warp_sum(acc[t]);
            if (lane == 0) {
                float* out = y + (size_t)t * ldy + r;
                *out = accumulate ? *out + sum : sum;
            }
        }
    }
}

#define MATVEC_ARGS                                                                                          \
    const unsigned char *__restrict__ W, const unsigned short *__restrict__ S, const float *__restrict__ x, \
        float *__restrict__ y, int rows, int cols, int T, int ldx, int ldy, int accumulate, int vec
extern "C" __global__ void matvec_bf16(MATVEC_ARGS) { matvec_impl<0>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate, vec); }
extern "C" __global__ void matvec_q8(MATVEC_ARGS) { matvec_impl<1>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate, vec); }
extern "C" __global__ void matvec_q4(MATVEC_ARGS) { matvec_impl<2>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate, vec); }

// Prefill: a 64×64 output tile (tokens × rows) per block of 256 threads, 4×4 per thread,
// K-steps of 16 staged through shared memory; weights widened to f32 on the way in.
#define GT 64
#define GK 16
template <int FMT>
__device__ __forceinline__ void gemm_impl(const unsigned char* __restrict__ W, const unsigned short* __restrict__ S,
                                          const float* __restrict__ x, float* __restrict__ y, int rows, int cols,
                                          int T, int ldx, int ldy, int accumulate) {
    __shared__ float xs[GK][GT + 4];
    __shared__ float ws[GK][GT + 4];
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    int m0 = blockIdx.y * GT, n0 = blockIdx.x * GT;
    size_t rb = WF<FMT>::row_bytes(cols);
    int rs = cols >> 5;
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
            ws[k][m] = (gn < rows && gk < cols) ? load_one<FMT>(W + (size_t)gn * rb, S + (size_t)gn * rs, gk) : 0.0f;
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

#define GEMM_ARGS                                                                                            \
    const unsigned char *__restrict__ W, const unsigned short *__restrict__ S, const float *__restrict__ x, \
        float *__restrict__ y, int rows, int cols, int T, int ldx, int ldy, int accumulate
extern "C" __global__ void gemm_bf16(GEMM_ARGS) { gemm_impl<0>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate); }
extern "C" __global__ void gemm_q8(GEMM_ARGS) { gemm_impl<1>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate); }
extern "C" __global__ void gemm_q4(GEMM_ARGS) { gemm_impl<2>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate); }
