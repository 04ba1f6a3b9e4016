// GGUF K-quant weights as the file stores them (MODEL: spindle_model::quant::ggml), split at
// upload into codes and per-superblock scale words (DevFormat::Q4K/Q5K/Q6K, matrix.rs), no
// value changed. A superblock is 256 weights of a row, eight groups of 32:
//  - FMT 4 (Q4_K): codes 128 bytes per superblock, llama.cpp's qs (byte l of pair j: weight
//    64j + l in the low nibble, 64j + 32 + l in the high); scale words 8 (16 bytes): f16 d,
//    f16 dmin, the 12 bytes of packed 6-bit scales and mins. w = d·sc_g·q − dmin·m_g.
//  - FMT 6 (Q5_K): codes 160 bytes, qh (32) then qs (128): weight 64j + l (+32) takes bit 2j
//    (2j + 1) of qh[l] as its fifth bit; scale words as Q4_K.
//  - FMT 5 (Q6_K): codes 192 bytes, ql (128) then qh (64) as stored; scale words 10 (20 bytes):
//    the 16 int8 scales (one per 16 weights), f16 d, two zero bytes. w = d·sc·(q − 32).
// The decode kernels (decode_staging.cuh) read them in chunks against int8 activations staged
// per group of 32, as the CPU's block kernels do (spindle_kernels::ggml: an exact integer sum
// per group, its scale and the activations' scale applied in f32; the Q4_K/Q5_K min term from
// the staged group sums).

// The 6-bit scales (sc[0..8]) and mins (m[0..8]) of a Q4_K/Q5_K superblock header as two words
// each, byte g = group g (llama.cpp's utmp unpacking).
__device__ __forceinline__ void kq_scales_mins(uint4 h, unsigned int* sc, unsigned int* m) {
    sc[0] = h.y & 0x3f3f3f3fu;
    sc[1] = (h.w & 0x0f0f0f0fu) | (((h.y >> 6) & 0x03030303u) << 4);
    m[0] = h.z & 0x3f3f3f3fu;
    m[1] = ((h.w >> 4) & 0x0f0f0f0fu) | (((h.z >> 6) & 0x03030303u) << 4);
}

__device__ __forceinline__ unsigned int byte_of(const unsigned int* w, int g) {
    return (w[g >> 2] >> (8 * (g & 3))) & 0xffu;
}

// Weight c of a row (codes w, scale words s) as f32: the dequantizers' arithmetic
// (spindle_model::quant::ggml::dequantize), so the values are theirs bit for bit.
template <int FMT>
__device__ __forceinline__ float ggml_value(const unsigned char* w, const unsigned short* s, int c) {
    int sb = c >> 8, i = c & 255;
    if (FMT == 4 || FMT == 6) {
        uint4 h = ((const uint4*)s)[sb];
        unsigned int sc[2], m[2];
        kq_scales_mins(h, sc, m);
        int g = i >> 5, l = i & 31, j = g >> 1;
        const unsigned char* codes = w + (size_t)sb * (FMT == 4 ? 128 : 160);
        const unsigned char* qs = codes + (FMT == 4 ? 0 : 32);
        int q = (qs[32 * j + l] >> (4 * (g & 1))) & 15;
        if (FMT == 6) q |= ((codes[l] >> g) & 1) << 4;
        float d = f16_to_f32((unsigned short)(h.x & 0xffffu)), dmin = f16_to_f32((unsigned short)(h.x >> 16));
        return d * (float)byte_of(sc, g) * (float)q - dmin * (float)byte_of(m, g);
    } else {
        const unsigned char* codes = w + (size_t)sb * 192;
        const unsigned short* sw = s + (size_t)sb * 10;
        int n = i >> 7, r = i & 127, k = r >> 5, l = r & 31;
        int low = (codes[64 * n + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15;
        int high = (codes[128 + 32 * n + l] >> (2 * k)) & 3;
        int sc = (int)(signed char)((const unsigned char*)sw)[8 * n + 2 * k + (l >> 4)];
        float d = f16_to_f32(sw[8]);
        return d * (float)sc * (float)((low | (high << 4)) - 32);
    }
}

// out[r·cols + c] = weight (r, c) of a [rows, cols] matrix (tests: the device's reading of the
// stored blocks against the host dequantizers). Grid-stride.
template <int FMT>
__device__ __forceinline__ void ggml_dequantize_impl(const unsigned char* __restrict__ W, const unsigned short* __restrict__ S,
                                                     int rows, int cols, float* __restrict__ out) {
    size_t all = (size_t)rows * cols, step = gridDim.x * (size_t)blockDim.x;
    size_t rb = (size_t)(cols >> 8) * (FMT == 4 ? 128 : (FMT == 6 ? 160 : 192));
    size_t rs = (size_t)(cols >> 8) * (FMT == 5 ? 10 : 8);
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < all; e += step) {
        size_t r = e / cols;
        int c = (int)(e - r * cols);
        out[e] = ggml_value<FMT>(W + r * rb, S + r * rs, c);
    }
}

#define GGML_DQ_ARGS \
    const unsigned char *__restrict__ W, const unsigned short *__restrict__ S, int rows, int cols, float *__restrict__ out
extern "C" __global__ void ggml_dequantize_q4k(GGML_DQ_ARGS) { ggml_dequantize_impl<4>(W, S, rows, cols, out); }
extern "C" __global__ void ggml_dequantize_q6k(GGML_DQ_ARGS) { ggml_dequantize_impl<5>(W, S, rows, cols, out); }
extern "C" __global__ void ggml_dequantize_q5k(GGML_DQ_ARGS) { ggml_dequantize_impl<6>(W, S, rows, cols, out); }

// ---- Decode chunks ----
// Q4_K / Q5_K: a chunk is 16 bytes of qs, 32 weights: half h of groups g0 = 2j and g1 = 2j + 1
// of a superblock (bytes 16h .. 16h + 15 of pair j), so a row has cols/32 chunks as Q4 does.
// The min term, which needs the whole group's activation sum, rides on the h = 0 chunk.
// Q6_K: a chunk is 64 weights, half h (16 weights) of the four groups of one 128-half n of a
// superblock: 16 bytes of ql for groups 0 and 2, 16 for groups 1 and 3, 16 of qh.

// Chunk ch of a Q4_K/Q5_K row: its codes (a; Q5_K: the 16 qh bytes in b) and the scales of
// its two groups (d·sc, dmin·m, the mins zero on h = 1 chunks).
template <int FMT>
__device__ __forceinline__ void kq_load_chunk(const unsigned char* __restrict__ w, const unsigned short* __restrict__ s,
                                              int ch, uint4& a, uint4& b, float& s0, float& s1, float& m0,
                                              float& m1) {
    int sb = ch >> 3, j = (ch >> 1) & 3, h = ch & 1;
    if (FMT == 4) {
        a = __ldg((const uint4*)w + ch);
    } else {
        const uint4* codes = (const uint4*)(w + (size_t)sb * 160);
        b = __ldg(codes + h);             // qh[16h .. 16h + 15]
        a = __ldg(codes + 2 + 2 * j + h);  // qs pair j, half h
    }
    uint4 hd = __ldg((const uint4*)s + sb);
    unsigned int sc[2], m[2];
    kq_scales_mins(hd, sc, m);
    float d = f16_to_f32((unsigned short)(hd.x & 0xffffu)), dmin = f16_to_f32((unsigned short)(hd.x >> 16));
    unsigned int scw = sc[j >> 1] >> (16 * (j & 1)), mw = m[j >> 1] >> (16 * (j & 1));
    s0 = d * (float)(scw & 0xffu);
    s1 = d * (float)((scw >> 8) & 0xffu);
    m0 = h ? 0.0f : dmin * (float)(mw & 0xffu);
    m1 = h ? 0.0f : dmin * (float)((mw >> 8) & 0xffu);
}

// The integer sums of a Q4_K/Q5_K chunk with its int8 activations: i0 over group g0's half
// (x0), i1 over group g1's (x1). Q5_K's fifth bits: bit 2j (g0) and 2j + 1 (g1) of qh.
template <int FMT>
__device__ __forceinline__ void kq_isums(uint4 a, uint4 b, int j, int4 x0, int4 x1, int& i0, int& i1) {
    const unsigned int m4 = 0x0f0f0f0fu;
    unsigned int aw[4] = {a.x, a.y, a.z, a.w}, hw[4] = {b.x, b.y, b.z, b.w};
    int xv0[4] = {x0.x, x0.y, x0.z, x0.w}, xv1[4] = {x1.x, x1.y, x1.z, x1.w};
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        unsigned int lo = aw[i] & m4, hi = (aw[i] >> 4) & m4;
        if (FMT == 6) {
            lo |= ((hw[i] >> (2 * j)) & 0x01010101u) << 4;
            hi |= ((hw[i] >> (2 * j + 1)) & 0x01010101u) << 4;
        }
        s0 = __dp4a((int)lo, xv0[i], s0);
        s1 = __dp4a((int)hi, xv1[i], s1);
    }
    i0 = s0;
    i1 = s1;
}

// Chunk ch of a Q6_K row: ql for groups 0/2 (a), ql for groups 1/3 (b), qh (c); the four int8
// scales of its groups' halves (byte k = group k) and d.
__device__ __forceinline__ void q6k_load_chunk(const unsigned char* __restrict__ w, const unsigned short* __restrict__ s,
                                               int ch, uint4& a, uint4& b, uint4& c, int& sc4, float& d) {
    int sb = ch >> 2, n = (ch >> 1) & 1, h = ch & 1;
    const unsigned char* codes = w + (size_t)sb * 192;
    a = __ldg((const uint4*)(codes + 64 * n + 16 * h));
    b = __ldg((const uint4*)(codes + 64 * n + 32 + 16 * h));
    c = __ldg((const uint4*)(codes + 128 + 32 * n + 16 * h));
    const unsigned int* sw = (const unsigned int*)(s + (size_t)sb * 10);
    unsigned int w0 = __ldg(sw + 2 * n), w1 = __ldg(sw + 2 * n + 1);
    // Scales 8n + 2k + h for k = 0..3: bytes h, 2 + h of w0 and of w1.
    sc4 = (int)__byte_perm(w0, w1, h ? 0x7531 : 0x6420);
    d = f16_to_f32(__ldg(s + (size_t)sb * 10 + 8));
}

// The signed 6-bit codes (q − 32) of group k of a Q6_K chunk, four bytes per word.
__device__ __forceinline__ unsigned int q6k_codes(unsigned int a, unsigned int b, unsigned int c, int k) {
    unsigned int ql = k & 1 ? b : a;
    unsigned int lo = (ql >> (4 * (k >> 1))) & 0x0f0f0f0fu;
    unsigned int hi = ((c >> (2 * k)) & 0x03030303u) << 4;
    return __vsub4(lo | hi, 0x20202020u);
}
