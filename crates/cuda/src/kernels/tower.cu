// The vision tower on the tensor cores (shared docs VISION.md §3; host side src/tower.rs).
//
// Weights: the checkpoint's bf16 values times a power of two per matrix, stored fp16 (the
// upload checks that every value converts exactly). Activations: f32 values as fp16 planes,
// hi = fp16(x) and lo = fp16(x − hi) (2 planes: within ~2^-22 of x; 1 plane: hi alone), stored
// [row][plane][cols]. Products run as mma.sync m16n8k16 f16·f16 → f32. The tensor cores round
// their own sums toward zero, so each k-step's products go into a fresh f32 accumulator that is
// then added to the running sum in IEEE f32 (on the fixtures, the three-plane bf16 GEMM's
// accumulated error put the logits 7.5e-4 off). A value outside fp16's range sets *flag.

typedef unsigned short f16_t;

__device__ __forceinline__ f16_t tw_to_f16(float f) {
    f16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// v as fp16 planes: hi, and the rest lo (v − hi is exact in f32).
__device__ __forceinline__ void tw_split(float v, f16_t& hi, f16_t& lo, int* flag) {
    hi = tw_to_f16(v);
    lo = tw_to_f16(v - f16_to_f32(hi));
    if (!(fabsf(v) < 65504.0f)) *flag = 1;
}

// fp16(a) and fp16(b) in one register, a in the low half (mma fragment order).
__device__ __forceinline__ unsigned int tw_pack2(float a, float b) {
    unsigned int r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
}

__device__ __forceinline__ float tw_gelu(float x, int act) {
    if (act == 1) return 0.5f * x * (1.0f + tanhf(0.7978846f * (x + 0.044715f * x * x * x)));
    if (act == 2) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    return x;
}

// out [rows][planes][cols] from x (row r at r·ldx), grid-stride.
extern "C" __global__ void tower_split_f16(const float* __restrict__ x, int ldx, int rows, int cols, int planes,
                                           f16_t* __restrict__ out, int* __restrict__ flag) {
    size_t all = (size_t)rows * cols, step = gridDim.x * (size_t)blockDim.x;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < all; e += step) {
        int r = (int)(e / cols), c = (int)(e - (size_t)r * cols);
        f16_t hi, lo;
        tw_split(x[(size_t)r * ldx + c], hi, lo, flag);
        out[((size_t)r * planes) * cols + c] = hi;
        if (planes == 2) out[((size_t)r * planes + 1) * cols + c] = lo;
    }
}

// LayerNorm (as layer_norm_rows: f64 statistics) with the result as planes out [rows][planes][cols].
extern "C" __global__ void tower_layer_norm_f16(const float* __restrict__ x, const float* __restrict__ w,
                                                const float* __restrict__ b, int cols, float eps, int planes,
                                                f16_t* __restrict__ out, int* __restrict__ flag) {
    __shared__ double red[33];
    const float* xr = x + (size_t)blockIdx.x * cols;
    f16_t* o = out + (size_t)blockIdx.x * planes * cols;
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
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float y = (float)(((double)xr[c] - mean) * inv) * w[c] + b[c];
        f16_t hi, lo;
        tw_split(y, hi, lo, flag);
        o[c] = hi;
        if (planes == 2) o[cols + c] = lo;
    }
}

// qkv [n, 3·heads·hd] → q, k rotated as vision_rope_split does, as 2 planes each:
// q, k [2][heads][n_pad][hdp] (v: tower_v_transpose_f16). Pads are left as they are (zero).
extern "C" __global__ void tower_rope_split_f16(const float* __restrict__ qkv, const float* __restrict__ cos_t,
                                                const float* __restrict__ sin_t, f16_t* __restrict__ q,
                                                f16_t* __restrict__ k, int n, int n_pad,
                                                int heads, int hd, int hdp, int* __restrict__ flag) {
    int width = heads * hd, half = hd / 2;
    size_t total = (size_t)n * width, plane_qk = (size_t)heads * n_pad * hdp;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t r = e / width;
        int col = e % width, j = col % hd, head = col / hd;
        const float* row = qkv + r * 3 * width;
        int i = j < half ? j : j - half;
        float c = cos_t[r * half + i], s = sin_t[r * half + i];
        int base = col - j;
        float qa = row[col], ka = row[width + col];
        float qo = j < half ? row[base + j + half] : row[base + j - half];
        float ko = j < half ? row[width + base + j + half] : row[width + base + j - half];
        float qv = j < half ? qa * c - qo * s : qa * c + qo * s;
        float kv = j < half ? ka * c - ko * s : ka * c + ko * s;
        f16_t hi, lo;
        size_t at = ((size_t)head * n_pad + r) * hdp + j;
        tw_split(qv, hi, lo, flag);
        q[at] = hi;
        q[plane_qk + at] = lo;
        tw_split(kv, hi, lo, flag);
        k[at] = hi;
        k[plane_qk + at] = lo;
    }
}

// v (the last third of each qkv row) → vt [2][heads][hdp][n_pad], transposed through shared
// memory 32 × 32 at a time so that reads and writes both run along rows. Block (256 threads):
// rows blockIdx.y·32.., columns blockIdx.x·32.. of v.
extern "C" __global__ void tower_v_transpose_f16(const float* __restrict__ qkv, f16_t* __restrict__ vt, int n,
                                                 int n_pad, int heads, int hd, int hdp, int* __restrict__ flag) {
    __shared__ float tile[32][33];
    int width = heads * hd, tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    int r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
    for (int i = ty; i < 32; i += 8) {
        int r = r0 + i, c = c0 + tx;
        tile[i][tx] = r < n && c < width ? qkv[(size_t)r * 3 * width + 2 * width + c] : 0.0f;
    }
    __syncthreads();
    size_t plane = (size_t)heads * n_pad * hdp;
    for (int i = ty; i < 32; i += 8) {
        int c = c0 + i, r = r0 + tx;
        if (c < width && r < n) {
            f16_t hi, lo;
            tw_split(tile[tx][i], hi, lo, flag);
            size_t at = ((size_t)(c / hd) * hdp + c % hd) * n_pad + r;
            vt[at] = hi;
            vt[plane + at] = lo;
        }
    }
}

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void tw_mma(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// ---- GEMM ----
// Y[m, n] = act(scale·Σ_k A[m, k]·W[n, k] + bias[n]) for m < M, n < N: stored f32 at
// Y[m·ldy + n] (added to it with accumulate), or with P non-null as planes P [M][out_planes][N].
// A [M][PLANES][K], W [N][K], K a multiple of 8. A block of 8 warps owns a 128 × 128 tile (each
// warp 32 rows × 64 columns) and walks K in steps of 64 through a 3-stage cp.async pipeline.
#define TW_BM 128
#define TW_BN 128
#define TW_BK 64
#define TW_STAGES 3
#define TW_ROW 144  // bytes per staged row: 64 halves and 16 bytes of padding (conflict-free loads)

template <int PLANES>
__device__ __forceinline__ void tw_gemm_load(unsigned char* st, const f16_t* __restrict__ A,
                                             const f16_t* __restrict__ W, int m0, int n0, int M, int N, int K,
                                             int kt) {
#if __CUDA_ARCH__ >= 800
    int k0 = kt * TW_BK;
    for (int e = threadIdx.x; e < PLANES * TW_BM * 8; e += blockDim.x) {
        int plane = e / (TW_BM * 8), rem = e - plane * TW_BM * 8;
        int r = rem >> 3, ch = rem & 7;
        int m = m0 + r, kb = k0 + ch * 8;
        bool ok = m < M && kb < K;
        const f16_t* g = ok ? A + ((size_t)m * PLANES + plane) * K + kb : A;
        cp_async16_zfill(st + plane * TW_BM * TW_ROW + r * TW_ROW + ch * 16, g, ok);
    }
    unsigned char* bs = st + PLANES * TW_BM * TW_ROW;
    for (int e = threadIdx.x; e < TW_BN * 8; e += blockDim.x) {
        int r = e >> 3, ch = e & 7;
        int n = n0 + r, kb = k0 + ch * 8;
        bool ok = n < N && kb < K;
        const f16_t* g = ok ? W + (size_t)n * K + kb : W;
        cp_async16_zfill(bs + r * TW_ROW + ch * 16, g, ok);
    }
#endif
}

template <int PLANES>
__device__ __forceinline__ void tw_gemm_impl(const f16_t* __restrict__ W, const f16_t* __restrict__ A,
                                             const float* __restrict__ bias, float scale, float* __restrict__ Y,
                                             int ldy, int accumulate, f16_t* __restrict__ P, int out_planes, int act,
                                             int M, int N, int K, int* __restrict__ flag) {
#if __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) unsigned char tw_smem[];
    const int STAGE = (PLANES + 1) * TW_BM * TW_ROW;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int wm = warp & 3, wn = warp >> 2;  // warp tile: rows wm·32.., columns wn·64..
    int g8 = lane >> 2, tig = lane & 3;
    int m0 = blockIdx.y * TW_BM, n0 = blockIdx.x * TW_BN;

    float acc[2][8][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 8; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;

    int KT = (K + TW_BK - 1) / TW_BK;
#pragma unroll
    for (int s = 0; s < TW_STAGES - 1; s++) {
        if (s < KT) tw_gemm_load<PLANES>(tw_smem + s * STAGE, A, W, m0, n0, M, N, K, s);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait_pending<TW_STAGES - 2>();
        __syncthreads();
        int next = kt + TW_STAGES - 1;
        if (next < KT) tw_gemm_load<PLANES>(tw_smem + (next % TW_STAGES) * STAGE, A, W, m0, n0, M, N, K, next);
        asm volatile("cp.async.commit_group;\n" ::);

        const unsigned char* as = tw_smem + (kt % TW_STAGES) * STAGE;
        const unsigned char* bs = as + PLANES * TW_BM * TW_ROW;
        float part[2][8][4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < 8; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) part[mi][ni][e] = 0.0f;
#pragma unroll
        for (int h = 0; h < TW_BK / 16; h++) {
            unsigned int af[PLANES][2][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                int r = wm * 32 + mi * 16 + g8;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    int off = (r + 8 * (q & 1)) * TW_ROW + h * 32 + 16 * (q >> 1) + tig * 4;
#pragma unroll
                    for (int pl = 0; pl < PLANES; pl++)
                        af[pl][mi][q] = *(const unsigned int*)(as + pl * TW_BM * TW_ROW + off);
                }
            }
#pragma unroll
            for (int ni = 0; ni < 8; ni++) {
                int n = wn * 64 + ni * 8 + g8;
                unsigned int b0 = *(const unsigned int*)(bs + n * TW_ROW + h * 32 + tig * 4);
                unsigned int b1 = *(const unsigned int*)(bs + n * TW_ROW + h * 32 + 16 + tig * 4);
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    // The small plane first.
#pragma unroll
                    for (int pl = PLANES - 1; pl >= 0; pl--) tw_mma(part[mi][ni], af[pl][mi], b0, b1);
                }
            }
        }
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < 8; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[mi][ni][e] += part[mi][ni][e];
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");

#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 8; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int m = m0 + wm * 32 + mi * 16 + g8 + 8 * (e >> 1);
                int n = n0 + wn * 64 + ni * 8 + tig * 2 + (e & 1);
                if (m < M && n < N) {
                    float v = acc[mi][ni][e] * scale;
                    if (bias) v += bias[n];
                    v = tw_gelu(v, act);
                    if (P) {
                        f16_t hi, lo;
                        tw_split(v, hi, lo, flag);
                        P[(size_t)m * out_planes * N + n] = hi;
                        if (out_planes == 2) P[((size_t)m * 2 + 1) * N + n] = lo;
                    } else {
                        float* out = Y + (size_t)m * ldy + n;
                        *out = accumulate ? *out + v : v;
                    }
                }
            }
#endif
}

#define TW_GEMM_ARGS                                                                                          \
    const f16_t *__restrict__ W, const f16_t *__restrict__ A, const float *__restrict__ bias, float scale,   \
        float *__restrict__ Y, int ldy, int accumulate, f16_t *__restrict__ P, int out_planes, int act, int M, \
        int N, int K, int *__restrict__ flag
#define TW_GEMM_PASS W, A, bias, scale, Y, ldy, accumulate, P, out_planes, act, M, N, K, flag
extern "C" __global__ void __launch_bounds__(256, 1) tower_gemm_f16_p1(TW_GEMM_ARGS) { tw_gemm_impl<1>(TW_GEMM_PASS); }
extern "C" __global__ void __launch_bounds__(256, 1) tower_gemm_f16_p2(TW_GEMM_ARGS) { tw_gemm_impl<2>(TW_GEMM_PASS); }

// ---- Attention ----
// Bidirectional attention of one image's n rows, per head: o = softmax(q·kᵀ·scale)·v, flash
// style. q, k [2][heads][n_pad][HDP] and vt [2][heads][HDP][n_pad] (tower_rope_split_f16;
// n_pad a multiple of 128, pads zero); o as planes [n][out_planes][heads·hd]. A block of 8
// warps takes 128 query rows of one head (16 per warp) and walks the keys in tiles of 64
// through a 2-stage cp.async pipeline. Q·Kᵀ: with QKP 3, q_lo·k_hi + q_hi·k_lo and then q_hi·k_hi (QKP 1:
// the last alone); the online softmax in f32 (exp2); P·V likewise with P split into planes
// (PVP 3) or rounded once (PVP 1), each key tile's P·V summed apart and then added in f32.
#define TA_ROWS 128
#define TA_KEYS 64
#define TA_VROW 144  // bytes per staged vᵀ row: 64 keys and 16 bytes of padding

template <int HDP, int QKP, int PVP>
struct TaLayout {
    static constexpr int KPL = QKP == 3 ? 2 : 1;
    static constexpr int VPL = PVP == 3 ? 2 : 1;
    static constexpr int KROW = HDP * 2 + 16;
    static constexpr int K_BYTES = KPL * TA_KEYS * KROW;
    static constexpr int STAGE = K_BYTES + VPL * HDP * TA_VROW;
};

template <int HDP, int QKP, int PVP>
__device__ __forceinline__ void ta_load(unsigned char* st, const f16_t* __restrict__ k, const f16_t* __restrict__ vt,
                                        int head, int heads, int n_pad, int k0) {
    typedef TaLayout<HDP, QKP, PVP> L;
    const int CH = HDP / 8;
    size_t plane = (size_t)heads * n_pad * HDP;
    for (int e = threadIdx.x; e < L::KPL * TA_KEYS * CH; e += blockDim.x) {
        int p = e / (TA_KEYS * CH), rem = e - p * TA_KEYS * CH;
        int r = rem / CH, ch = rem - r * CH;
        const f16_t* g = k + p * plane + ((size_t)head * n_pad + k0 + r) * HDP + ch * 8;
        cp_async16(st + p * TA_KEYS * L::KROW + r * L::KROW + ch * 16, g);
    }
    unsigned char* vs = st + L::K_BYTES;
    for (int e = threadIdx.x; e < L::VPL * HDP * 8; e += blockDim.x) {
        int p = e / (HDP * 8), rem = e - p * HDP * 8;
        int d = rem >> 3, ch = rem & 7;
        const f16_t* g = vt + p * plane + ((size_t)head * HDP + d) * n_pad + k0 + ch * 8;
        cp_async16(vs + p * HDP * TA_VROW + d * TA_VROW + ch * 16, g);
    }
}

template <int HDP, int QKP, int PVP>
__device__ __forceinline__ void tw_attention_impl(const f16_t* __restrict__ q, const f16_t* __restrict__ k,
                                                  const f16_t* __restrict__ vt, f16_t* __restrict__ o, int n,
                                                  int n_pad, int heads, int hd, float scale_log2, int out_planes,
                                                  int* __restrict__ flag) {
#if __CUDA_ARCH__ >= 800
    typedef TaLayout<HDP, QKP, PVP> L;
    const int KK = HDP / 16;  // k16 steps over the head
    const int DT = HDP / 8;   // n8 tiles of the output
    extern __shared__ __align__(16) unsigned char ta_smem[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g8 = lane >> 2, tig = lane & 3;
    int head = blockIdx.y;
    int q0 = blockIdx.x * TA_ROWS + warp * 16;
    size_t plane = (size_t)heads * n_pad * HDP;

    // This warp's 16 query rows as A fragments (planes hi, lo).
    unsigned int qa[L::KPL][KK][4];
#pragma unroll
    for (int p = 0; p < L::KPL; p++)
#pragma unroll
        for (int kk = 0; kk < KK; kk++)
#pragma unroll
            for (int x = 0; x < 4; x++) {
                int r = q0 + g8 + 8 * (x & 1), c = kk * 16 + 8 * (x >> 1) + tig * 2;
                qa[p][kk][x] = *(const unsigned int*)(q + p * plane + ((size_t)head * n_pad + r) * HDP + c);
            }

    float out[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) out[d][e] = 0.0f;
    float mrow[2] = {-SP_INF, -SP_INF}, lrow[2] = {0.0f, 0.0f};

    int KT = (n + TA_KEYS - 1) / TA_KEYS;
    ta_load<HDP, QKP, PVP>(ta_smem, k, vt, head, heads, n_pad, 0);
    asm volatile("cp.async.commit_group;\n" ::);
    for (int kt = 0; kt < KT; kt++) {
        if (kt + 1 < KT) ta_load<HDP, QKP, PVP>(ta_smem + ((kt + 1) & 1) * L::STAGE, k, vt, head, heads, n_pad, (kt + 1) * TA_KEYS);
        asm volatile("cp.async.commit_group;\n" ::);
        cp_async_wait_pending<1>();
        __syncthreads();
        const unsigned char* ks = ta_smem + (kt & 1) * L::STAGE;
        const unsigned char* vs = ks + L::K_BYTES;
        int k0 = kt * TA_KEYS;

        // S = Q·Kᵀ for 64 keys: 8 tiles of 8.
        float s[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = 0.0f;
            const unsigned char* kr = ks + (nt * 8 + g8) * L::KROW + tig * 4;
#pragma unroll
            for (int kk = 0; kk < KK; kk++) {
                unsigned int h0 = *(const unsigned int*)(kr + kk * 32);
                unsigned int h1 = *(const unsigned int*)(kr + kk * 32 + 16);
                if (QKP == 3) {
                    unsigned int l0 = *(const unsigned int*)(kr + TA_KEYS * L::KROW + kk * 32);
                    unsigned int l1 = *(const unsigned int*)(kr + TA_KEYS * L::KROW + kk * 32 + 16);
                    tw_mma(s[nt], qa[L::KPL - 1][kk], h0, h1);
                    tw_mma(s[nt], qa[0][kk], l0, l1);
                }
                tw_mma(s[nt], qa[0][kk], h0, h1);
            }
        }
        // Online softmax over this tile (keys past n masked), rows g8 (e < 2) and g8 + 8.
        float mt[2] = {-SP_INF, -SP_INF};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + nt * 8 + tig * 2 + (e & 1);
                float t = key < n ? s[nt][e] * scale_log2 : -SP_INF;
                s[nt][e] = t;
                mt[e >> 1] = fmaxf(mt[e >> 1], t);
            }
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 1));
            mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 2));
            float mnew = fmaxf(mrow[h], mt[h]);
            alpha[h] = exp2f(mrow[h] - mnew);
            mrow[h] = mnew;
            lrow[h] *= alpha[h];
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(s[nt][e] - mrow[e >> 1]);
                s[nt][e] = p;
                lrow[e >> 1] += p;
            }
        // P·V for this tile, summed apart, then out = out·alpha + tile.
        float po[DT][4];
#pragma unroll
        for (int d = 0; d < DT; d++)
#pragma unroll
            for (int e = 0; e < 4; e++) po[d][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < TA_KEYS / 16; kk++) {
            unsigned int ph[4], pl[4];
#pragma unroll
            for (int x = 0; x < 4; x++) {
                // x: (rows g8 | g8 + 8) × (keys tig·2 | 8 + tig·2) of this k16 step; P ≤ 1.
                const float* src = s[2 * kk + (x >> 1)] + 2 * (x & 1);
                ph[x] = tw_pack2(src[0], src[1]);
                if (PVP == 3) {
                    float r0 = src[0] - f16_to_f32((f16_t)(ph[x] & 0xffffu));
                    float r1 = src[1] - f16_to_f32((f16_t)(ph[x] >> 16));
                    pl[x] = tw_pack2(r0, r1);
                }
            }
#pragma unroll
            for (int d = 0; d < DT; d++) {
                if (d * 8 >= hd) continue;
                const unsigned char* vr = vs + (d * 8 + g8) * TA_VROW + kk * 32 + tig * 4;
                unsigned int h0 = *(const unsigned int*)vr;
                unsigned int h1 = *(const unsigned int*)(vr + 16);
                if (PVP == 3) {
                    unsigned int l0 = *(const unsigned int*)(vr + HDP * TA_VROW);
                    unsigned int l1 = *(const unsigned int*)(vr + HDP * TA_VROW + 16);
                    tw_mma(po[d], pl, h0, h1);
                    tw_mma(po[d], ph, l0, l1);
                }
                tw_mma(po[d], ph, h0, h1);
            }
        }
#pragma unroll
        for (int d = 0; d < DT; d++)
#pragma unroll
            for (int e = 0; e < 4; e++) out[d][e] = out[d][e] * alpha[e >> 1] + po[d][e];
        __syncthreads();  // the next iteration's load reuses this stage
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");

    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float l = lrow[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv[h] = 1.0f / l;
    }
    int width = heads * hd;
#pragma unroll
    for (int d = 0; d < DT; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = q0 + g8 + 8 * (e >> 1), dim = d * 8 + tig * 2 + (e & 1);
            if (row < n && dim < hd) {
                float v = out[d][e] * inv[e >> 1];
                f16_t hi, lo;
                tw_split(v, hi, lo, flag);
                size_t at = (size_t)row * out_planes * width + head * hd + dim;
                o[at] = hi;
                if (out_planes == 2) o[at + width] = lo;
            }
        }
#endif
}

#define TA_ARGS                                                                                               \
    const f16_t *__restrict__ q, const f16_t *__restrict__ k, const f16_t *__restrict__ vt, f16_t *__restrict__ o, \
        int n, int n_pad, int heads, int hd, float scale_log2, int out_planes, int *__restrict__ flag
#define TA_PASS q, k, vt, o, n, n_pad, heads, hd, scale_log2, out_planes, flag
#define TA_KERNEL(NAME, HDP, QKP, PVP) \
    extern "C" __global__ void __launch_bounds__(256) NAME(TA_ARGS) { tw_attention_impl<HDP, QKP, PVP>(TA_PASS); }
TA_KERNEL(tower_attention_h16, 16, 3, 3)
TA_KERNEL(tower_attention_h32, 32, 3, 3)
TA_KERNEL(tower_attention_h48, 48, 3, 3)
TA_KERNEL(tower_attention_h64, 64, 3, 3)
TA_KERNEL(tower_attention_h80, 80, 3, 3)
TA_KERNEL(tower_attention_h32_fast, 32, 1, 1)
TA_KERNEL(tower_attention_h80_fast, 80, 1, 1)
TA_KERNEL(tower_attention_h32_qk, 32, 3, 1)
TA_KERNEL(tower_attention_h80_qk, 80, 3, 1)
