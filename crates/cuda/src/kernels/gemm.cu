// y = x·Wᵀ with W [rows, cols] row-major in one weight format (common.cuh) and f32
// activations (MODEL_MATH: every linear layer is stored [out, in]). `accumulate` adds into y.

// Prefill: a 64×64 output tile (tokens × rows) per block of 256 threads, 4×4 per thread,
// K-steps of 16 staged through shared memory; weights widened to f32 on the way in.
#define GT 64
#define GK 16
template <int FMT>
__device__ __forceinline__ void gemm_simt_impl(const unsigned char* __restrict__ W, const unsigned short* __restrict__ S,
                                               const float* __restrict__ x, float* __restrict__ y, int rows, int cols,
                                               int T, int ldx, int ldy, int accumulate) {
    __shared__ float xs[GK][GT + 4];
    __shared__ float ws[GK][GT + 4];
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    int m0 = blockIdx.y * GT, n0 = blockIdx.x * GT;
    size_t rb = WF<FMT>::row_bytes(cols);
    size_t rs = row_scale_words<FMT>(cols);
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
extern "C" __global__ void gemm_simt_bf16(GEMM_ARGS) { gemm_simt_impl<0>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate); }
extern "C" __global__ void gemm_simt_q8(GEMM_ARGS) { gemm_simt_impl<1>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate); }
extern "C" __global__ void gemm_simt_q4(GEMM_ARGS) { gemm_simt_impl<2>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate); }
extern "C" __global__ void gemm_simt_fp8(GEMM_ARGS) { gemm_simt_impl<3>(W, S, x, y, rows, cols, T, ldx, ldy, accumulate); }

// Prefill linear layers and grouped expert GEMMs on the tensor cores (mma.sync, sm_80+).
//
// Y[m, n] (+)= Σ_k A[m, k]·W[n, k]: a block of 8 warps owns a TOK-token × 128-row tile (TOK 64:
// each warp 32 × 32; the skinny kernels' TOK 16: each warp 16 × 16) and walks K in steps of 32 —
// one quantization group — through a 4-stage cp.async pipeline.
//  - Q8/Q4 weights: A holds the activations quantized to int8 per group of 32 exactly as the
//    CPU engine does (gemm_tensor_quantize_acts = spindle_kernels::quant::quantize_acts_ref); each group is an
//    int8 mma m16n8k32 and then acc += (f16(s)·d)·isum, the CPU's (and the decode kernels')
//    arithmetic. Q4 nibbles become the signed codes n − 8 on their way into the fragment.
//  - FP8 weights (sm_89+): A holds the activations quantized to e4m3 per token and group of 128
//    (gemm_fp8_quantize_acts, fp8.cu: the dynamic scheme, scale = amax/448, one f32 per 32
//    columns); each group of 32 is an e4m3 mma m16n8k32 into f32, then acc += (w_s·a_s)·sum
//    with w_s the weights' block scale of those columns.
//  - bf16 weights: A holds the f32 activations split into three bf16 planes hi + mid + lo
//    (gemm_tensor_split_acts_bf16, together within ~2^-24 of each value, as f32) and each k16 step runs three
//    bf16 mma into f32: the products are exact, so the result is the f32 GEMM's up to the order
//    of the sums.
// Dense: rows m = blockIdx.y·TOK + r < M, A row = Y row = m. Grouped (MoE): `tiles` holds
// (expert, first, count ≤ TOK) per blockIdx.y over `order` (pair ids sorted by expert, moe_group_by_expert);
// A row = pair / a_div, Y row = pair, and expert e's weights are rows e·N .. e·N + N − 1.

#define TG_K 32

// Staged row strides in bytes, padded so that the fragment loads of a warp hit 32 distinct
// banks (rows of 48 and 80 bytes step 12 and 20 words).
template <int FMT, int TOK>
struct TgLayout {
    static constexpr int A_ROW = FMT == 0 ? 80 : 48;
    static constexpr int B_ROW = FMT == 0 ? 80 : (FMT == 2 ? 16 : 48);
    static constexpr int A_PLANES = FMT == 0 ? 3 : 1;  // bf16: hi, mid, lo
    static constexpr int A_CHUNKS = FMT == 0 ? 4 : 2;  // 16-byte chunks per staged A row
    static constexpr int B_CHUNKS = FMT == 0 ? 4 : (FMT == 2 ? 1 : 2);
    static constexpr int A_BYTES = TOK * A_ROW * A_PLANES;
    static constexpr int STAGE = A_BYTES + TENSOR_GEMM_ROWS * B_ROW;
};

__device__ __forceinline__ unsigned short f32_to_bf16_rn(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// Row r of the GEMM input: x[r·ldx + c], or with up ≥ 0 the SwiGLU silu(x[r·ldx + c])·x[r·ldx + up + c].
__device__ __forceinline__ float tg_input(const float* __restrict__ x, int ldx, int up, int r, int c) {
    const float* row = x + (size_t)r * ldx;
    return up >= 0 ? silu_f(row[c]) * row[up + c] : row[c];
}

// int8 activations for the Q8/Q4 GEMM: xq [rows, cols], xd [rows, cols/32]. A warp per group
// (grid-stride).
extern "C" __global__ void gemm_tensor_quantize_acts(const float* __restrict__ x, int ldx, int up, int rows, int cols,
                                                     signed char* __restrict__ xq, float* __restrict__ xd) {
    int lane = threadIdx.x & 31, groups = cols >> 5;
    size_t all = (size_t)rows * groups, step = (gridDim.x * (size_t)blockDim.x) >> 5;
    for (size_t w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; w < all; w += step) {
        int r = (int)(w / groups), g = (int)(w - (size_t)r * groups);
        int c = g * 32 + lane;
        float v = tg_input(x, ldx, up, r, c);
        float amax = warp_max(fabsf(v));
        float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
        xq[(size_t)r * cols + c] = (signed char)(int)roundf(v * inv);
        if (lane == 0) xd[w] = amax / 127.0f;
    }
}

// bf16 activations for the bf16 GEMM: row r of `out` is [hi | mid | lo] (3·cols values) with
// hi + mid + lo ≈ x to ~2^-24 (grid-stride).
extern "C" __global__ void gemm_tensor_split_acts_bf16(const float* __restrict__ x, int ldx, int up, int rows, int cols,
                                                       bf16_t* __restrict__ out) {
    size_t all = (size_t)rows * cols, step = gridDim.x * (size_t)blockDim.x;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < all; e += step) {
        int r = (int)(e / cols), c = (int)(e - (size_t)r * cols);
        float v = tg_input(x, ldx, up, r, c);
        bf16_t* row = out + (size_t)r * 3 * cols;
        bf16_t h = f32_to_bf16_rn(v);
        float rest = v - bf16_to_f32(h);
        bf16_t m = f32_to_bf16_rn(rest);
        row[c] = h;
        row[cols + c] = m;
        row[2 * cols + c] = f32_to_bf16_rn(rest - bf16_to_f32(m));
    }
}

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool ok) {
    unsigned int a = (unsigned int)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(__cvta_generic_to_global(gmem)),
                 "r"(ok ? 16 : 0));
}

template <int PENDING>
__device__ __forceinline__ void cp_async_wait_pending() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

__device__ __forceinline__ void mma_s8(int* c, const int* a, int b0, int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// FP8 (e4m3) mma into f32: sm_89 and later (gemm_tensor_fp8 is launched there only).
__device__ __forceinline__ void mma_e4m3(float* c, const int* a, int b0, int b1) {
#if __CUDA_ARCH__ >= 890
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

__device__ __forceinline__ void mma_bf16(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One stage: A rows (TOK token rows a_row[r], −1 = none) and B rows n0.. of k0 = kt·32 .. + 31.
template <int FMT, int TOK>
__device__ __forceinline__ void tg_load(unsigned char* st, const unsigned char* __restrict__ A,
                                        const unsigned char* __restrict__ W,
                                        const int* a_row, size_t w_row0, int n0, int N, int K, int kt) {
    typedef TgLayout<FMT, TOK> L;
    int tid = threadIdx.x, k0 = kt * TG_K;
    const int elem = FMT == 0 ? 2 : 1;         // bytes per activation / bf16 weight
    const int per_chunk = 16 / elem;           // values per 16-byte chunk
    for (int e = tid; e < TOK * L::A_CHUNKS * L::A_PLANES; e += blockDim.x) {
        int plane = e / (TOK * L::A_CHUNKS);
        int rem = e - plane * TOK * L::A_CHUNKS;
        int r = rem / L::A_CHUNKS, ch = rem - r * L::A_CHUNKS;
        int kb = k0 + ch * per_chunk;
        int src = a_row[r];
        bool ok = src >= 0 && kb < K;
        // A row src holds its planes one after another (bf16: hi, mid, lo).
        const unsigned char* g = ok ? A + ((size_t)src * K * L::A_PLANES + (size_t)plane * K + kb) * elem : A;
        cp_async16_zfill(st + plane * TOK * L::A_ROW + r * L::A_ROW + ch * 16, g, ok);
    }
    unsigned char* bs = st + L::A_BYTES;
    size_t rb = FMT == 0 ? (size_t)K * 2 : (FMT == 2 ? (size_t)K / 2 : (size_t)K);
    for (int e = tid; e < TENSOR_GEMM_ROWS * L::B_CHUNKS; e += blockDim.x) {
        int r = e / L::B_CHUNKS, ch = e - r * L::B_CHUNKS;
        int n = n0 + r;
        size_t off = FMT == 0 ? (size_t)(k0 + ch * 8) * 2 : (FMT == 2 ? (size_t)(k0 / 2) : (size_t)(k0 + ch * 16));
        bool ok = n < N && (FMT != 0 || k0 + ch * 8 < K);
        const unsigned char* g = ok ? W + (w_row0 + n) * rb + off : W;
        cp_async16_zfill(bs + r * L::B_ROW + ch * 16, g, ok);
    }
}
#endif

// Q8/Q4/FP8: the scales of TENSOR_GEMM_SCALE_GROUPS groups from group g0 on, staged in shared
// memory `sc` with cp.async a whole block of groups before they are used, so that no K-step
// waits on a scale load from memory: the tile's weight rows' scales ([TENSOR_GEMM_ROWS][SG],
// f16 bits; FP8: f32 bits), then its token rows' activation scales ([TENSOR_GEMM_TOKENS][SG],
// f32; a_row −1: none). A scale past the row's groups, of a weight row ≥ N or of no token row
// is 0, as the values themselves are there.
template <int FMT, int TOK>
struct TgScales {
    static constexpr int SG = TENSOR_GEMM_SCALE_GROUPS;
    static constexpr int WSB = FMT == 3 ? 4 : 2;  // bytes of a weight scale
    static constexpr int W_BYTES = TENSOR_GEMM_ROWS * SG * WSB;
    static constexpr int BYTES = W_BYTES + TOK * SG * 4;  // one buffer
};

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cp_async4_zfill(void* smem, const void* gmem, bool ok) {
    unsigned int a = (unsigned int)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(a), "l"(__cvta_generic_to_global(gmem)),
                 "r"(ok ? 4 : 0));
}

template <int FMT, int TOK>
__device__ __forceinline__ void tg_load_scales(unsigned char* sc, const unsigned short* __restrict__ S,
                                               const float* __restrict__ ad, size_t w_row0, int n0, int N, int groups,
                                               const int* a_row, int g0) {
    typedef TgScales<FMT, TOK> C;
    int tid = threadIdx.x;
    if (FMT == 3 || (groups & 1) == 0) {
        // Words of 4 bytes: one FP8 scale, or the f16 scales of groups g, g + 1 (g0 and the
        // row's group count even, so both or neither are in the row).
        constexpr int PER = 4 / C::WSB, WORDS = C::SG / PER;
        for (int e = tid; e < TENSOR_GEMM_ROWS * WORDS; e += blockDim.x) {
            int r = e / WORDS, w = e - r * WORDS;
            int n = n0 + r, g = g0 + w * PER;
            bool ok = n < N && g < groups;
            const unsigned char* src = (const unsigned char*)S + (ok ? ((w_row0 + n) * groups + g) * C::WSB : 0);
            cp_async4_zfill(sc + (r * C::SG + w * PER) * C::WSB, src, ok);
        }
    } else {
        // An odd group count: f16 scales one at a time (not 4-byte aligned in pairs).
        unsigned short* ws = (unsigned short*)sc;
        for (int e = tid; e < TENSOR_GEMM_ROWS * C::SG; e += blockDim.x) {
            int r = e / C::SG, g = g0 + (e - r * C::SG), n = n0 + r;
            ws[e] = n < N && g < groups ? __ldg(S + (w_row0 + n) * groups + g) : (unsigned short)0;
        }
    }
    float* xs = (float*)(sc + C::W_BYTES);
    for (int e = tid; e < TOK * C::SG; e += blockDim.x) {
        int r = e / C::SG, g = g0 + (e - r * C::SG), src = a_row[r];
        bool ok = src >= 0 && g < groups;
        cp_async4_zfill(xs + e, ok ? ad + (size_t)src * groups + g : ad, ok);
    }
}
#endif

template <int FMT, int TOK>
__device__ __forceinline__ void gemm_tensor_impl(const unsigned char* __restrict__ W, const unsigned short* __restrict__ S,
                                                 const unsigned char* __restrict__ A, const unsigned char* __restrict__ Aaux,
                                                 float* __restrict__ Y, int ldy, int accumulate, int N, int K, int M,
                                                 const int* __restrict__ tiles, const int* __restrict__ order, int a_div) {
#if __CUDA_ARCH__ >= 800
    typedef TgLayout<FMT, TOK> L;
    // Warp tiles: TOK 64 as 2 × 4 warps of 32 token rows × 32 weight rows (MI = 2, NI = 4),
    // TOK 16 as 1 × 8 warps of 16 × 16 (MI = 1, NI = 2). Every output's sums are the same
    // either way: its groups in order, each an mma of the same operands.
    constexpr int MI = TOK == 16 ? 1 : 2, WM = TOK / (16 * MI), WN = 8 / WM, NI = TENSOR_GEMM_ROWS / (8 * WN);
    extern __shared__ __align__(16) unsigned char tg_smem[];
    __shared__ int a_row[TOK], y_row[TOK];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    static_assert(WM == 1 || WM == 2, "one or two warps along the tokens");
    int wm = warp & (WM - 1), wn = WM == 1 ? warp : warp >> 1;  // rows wm·16·MI.., weight rows wn·8·NI..
    int g8 = lane >> 2, tig = lane & 3;
    int n0 = blockIdx.x * TENSOR_GEMM_ROWS;
    size_t w_row0 = 0;
    if (tiles) {
        const int* t = tiles + 3 * blockIdx.y;
        int expert = t[0], first = t[1], count = t[2];
        if (count == 0) return;  // past the used tiles (whole block)
        w_row0 = (size_t)expert * N;
        if (tid < TOK) {
            int pair = tid < count ? order[first + tid] : -1;
            a_row[tid] = pair >= 0 ? pair / a_div : -1;
            y_row[tid] = pair;
        }
    } else if (tid < TOK) {
        int m = blockIdx.y * TOK + tid;
        a_row[tid] = m < M ? m : -1;
        y_row[tid] = a_row[tid];
    }
    __syncthreads();

    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;

    int groups = K >> 5;
    int KT = (K + TG_K - 1) / TG_K;
    // Q8/Q4/FP8 scales: two buffers of TENSOR_GEMM_SCALE_GROUPS groups after the stages; the
    // first block rides with the first stage, each next one is loaded a block ahead.
    typedef TgScales<FMT, TOK> SC;
    unsigned char* sc = tg_smem + TENSOR_GEMM_STAGES * L::STAGE;
    if (FMT != 0) tg_load_scales<FMT, TOK>(sc, S, (const float*)Aaux, w_row0, n0, N, groups, a_row, 0);
#pragma unroll
    for (int s = 0; s < TENSOR_GEMM_STAGES - 1; s++) {
        if (s < KT) tg_load<FMT, TOK>(tg_smem + s * L::STAGE, A, W, a_row, w_row0, n0, N, K, s);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait_pending<TENSOR_GEMM_STAGES - 2>();
        __syncthreads();
        int next = kt + TENSOR_GEMM_STAGES - 1;
        if (next < KT)
            tg_load<FMT, TOK>(tg_smem + (next % TENSOR_GEMM_STAGES) * L::STAGE, A, W, a_row, w_row0, n0, N, K, next);
        // The next block of scales, into the buffer whose groups the steps before this one used.
        if (FMT != 0 && kt % SC::SG == 0 && kt + SC::SG < KT)
            tg_load_scales<FMT, TOK>(sc + ((kt / SC::SG + 1) & 1) * SC::BYTES, S, (const float*)Aaux, w_row0, n0, N,
                                groups, a_row, kt + SC::SG);
        asm volatile("cp.async.commit_group;\n" ::);

        const unsigned char* as = tg_smem + (kt % TENSOR_GEMM_STAGES) * L::STAGE;
        const unsigned char* bs = as + L::A_BYTES;
        if (FMT == 0) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                unsigned int ap[3][MI][4];  // hi, mid, lo fragments
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    int r = wm * 16 * MI + mi * 16 + g8;
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        int off = (r + 8 * (q & 1)) * L::A_ROW + h * 32 + 16 * (q >> 1) + tig * 4;
#pragma unroll
                        for (int pl = 0; pl < 3; pl++)
                            ap[pl][mi][q] = *(const unsigned int*)(as + pl * TOK * L::A_ROW + off);
                    }
                }
#pragma unroll
                for (int ni = 0; ni < NI; ni++) {
                    int n = wn * 8 * NI + ni * 8 + g8;
                    unsigned int b0 = *(const unsigned int*)(bs + n * L::B_ROW + h * 32 + tig * 4);
                    unsigned int b1 = *(const unsigned int*)(bs + n * L::B_ROW + h * 32 + 16 + tig * 4);
#pragma unroll
                    for (int mi = 0; mi < MI; mi++) {
#pragma unroll
                        for (int pl = 0; pl < 3; pl++) mma_bf16(acc[mi][ni], ap[pl][mi], b0, b1);
                    }
                }
            }
        } else {
            // This group's scales, from the staged block: the weights' of this thread's
            // 2·NI columns, the activations' of its 2·MI token rows.
            const unsigned char* scb = sc + ((kt / SC::SG) & 1) * SC::BYTES;
            const float* xs = (const float*)(scb + SC::W_BYTES);
            int q = kt % SC::SG;
            float ws[NI][2], xd[MI][2];
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    int n = (wn * 8 * NI + ni * 8 + tig * 2 + j) * SC::SG + q;
                    ws[ni][j] = FMT == 3 ? ((const float*)scb)[n] : f16_to_f32(((const unsigned short*)scb)[n]);
                }
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) xd[mi][h] = xs[(wm * 16 * MI + mi * 16 + g8 + 8 * h) * SC::SG + q];
            int a[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                int r = wm * 16 * MI + mi * 16 + g8;
#pragma unroll
                for (int q = 0; q < 4; q++)
                    a[mi][q] = *(const int*)(as + (r + 8 * (q & 1)) * L::A_ROW + 16 * (q >> 1) + tig * 4);
            }
#pragma unroll
            for (int ni = 0; ni < NI; ni++) {
                int n = wn * 8 * NI + ni * 8 + g8;
                int b0, b1;
                if (FMT == 1 || FMT == 3) {
                    b0 = *(const int*)(bs + n * L::B_ROW + tig * 4);
                    b1 = *(const int*)(bs + n * L::B_ROW + 16 + tig * 4);
                } else {
                    // Byte j of the group holds value j (low nibble) and j + 16 (high nibble).
                    unsigned int w = *(const unsigned int*)(bs + n * L::B_ROW + tig * 4);
                    b0 = (int)__vsub4(w & 0x0f0f0f0fu, 0x08080808u);
                    b1 = (int)__vsub4((w >> 4) & 0x0f0f0f0fu, 0x08080808u);
                }
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    if (FMT == 3) {
                        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        mma_e4m3(c, a[mi], b0, b1);
#pragma unroll
                        for (int e = 0; e < 4; e++) acc[mi][ni][e] += ws[ni][e & 1] * xd[mi][e >> 1] * c[e];
                    } else {
                        int c[4] = {0, 0, 0, 0};
                        mma_s8(c, a[mi], b0, b1);
#pragma unroll
                        for (int e = 0; e < 4; e++) acc[mi][ni][e] += ws[ni][e & 1] * xd[mi][e >> 1] * (float)c[e];
                    }
                }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");

#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int yr = y_row[wm * 16 * MI + mi * 16 + g8 + 8 * (e >> 1)];
                int n = n0 + wn * 8 * NI + ni * 8 + tig * 2 + (e & 1);
                if (yr >= 0 && n < N) {
                    float* out = Y + (size_t)yr * ldy + n;
                    *out = accumulate ? *out + acc[mi][ni][e] : acc[mi][ni][e];
                }
            }
#endif
}

#define TGEMM_ARGS                                                                                          \
    const unsigned char *__restrict__ W, const unsigned short *__restrict__ S,                             \
        const unsigned char *__restrict__ A, const unsigned char *__restrict__ Aaux, float *__restrict__ Y, \
        int ldy, int accumulate, int N, int K, int M, const int *__restrict__ tiles,                        \
        const int *__restrict__ order, int a_div
#define TGEMM_PASS W, S, A, Aaux, Y, ldy, accumulate, N, K, M, tiles, order, a_div
extern "C" __global__ void __launch_bounds__(256) gemm_tensor_bf16(TGEMM_ARGS) { gemm_tensor_impl<0, TENSOR_GEMM_TOKENS>(TGEMM_PASS); }
extern "C" __global__ void __launch_bounds__(256) gemm_tensor_q8(TGEMM_ARGS) { gemm_tensor_impl<1, TENSOR_GEMM_TOKENS>(TGEMM_PASS); }
extern "C" __global__ void __launch_bounds__(256) gemm_tensor_q4(TGEMM_ARGS) { gemm_tensor_impl<2, TENSOR_GEMM_TOKENS>(TGEMM_PASS); }
extern "C" __global__ void __launch_bounds__(256) gemm_tensor_fp8(TGEMM_ARGS) { gemm_tensor_impl<3, TENSOR_GEMM_TOKENS>(TGEMM_PASS); }
// Tiles of TENSOR_GEMM_SKINNY_TOKENS tokens: a few tokens (a short prompt chunk), or experts that
// see one or two tokens each; the same bits as the wide tiles.
extern "C" __global__ void __launch_bounds__(256) gemm_tensor_skinny_bf16(TGEMM_ARGS) { gemm_tensor_impl<0, TENSOR_GEMM_SKINNY_TOKENS>(TGEMM_PASS); }
extern "C" __global__ void __launch_bounds__(256) gemm_tensor_skinny_q8(TGEMM_ARGS) { gemm_tensor_impl<1, TENSOR_GEMM_SKINNY_TOKENS>(TGEMM_PASS); }
extern "C" __global__ void __launch_bounds__(256) gemm_tensor_skinny_q4(TGEMM_ARGS) { gemm_tensor_impl<2, TENSOR_GEMM_SKINNY_TOKENS>(TGEMM_PASS); }
extern "C" __global__ void __launch_bounds__(256) gemm_tensor_skinny_fp8(TGEMM_ARGS) { gemm_tensor_impl<3, TENSOR_GEMM_SKINNY_TOKENS>(TGEMM_PASS); }
