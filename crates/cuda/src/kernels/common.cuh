// Shared helpers for every spindle kernel. Compiled by NVRTC with no headers: bf16 values are
// raw 16-bit patterns, widened to f32 by a shift. Constants that Rust uses too
// (MATVEC_MAX_TOKENS, ATTN_SPLIT_KEYS, GDN_CHUNK, ...) are defined once in Rust
// (kernels/mod.rs, `shared_constants!`) and reach this program as `#define`s of a prelude.

typedef unsigned short bf16_t;

#define SP_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float bf16_to_f32(bf16_t b) {
    return __uint_as_float(((unsigned int)b) << 16);
}

// The 8 bf16 values of a 16-byte load, widened to f32.
__device__ __forceinline__ void unpack8(uint4 v, float* out) {
    unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_f(float x) { return x * sigmoid_f(x); }
// PyTorch's softplus with threshold 20.
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32); every thread gets the result.
// `red` is shared scratch of 33 floats.
__device__ float block_sum(float v, float* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < warps ? red[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) red[32] = t;
    }
    __syncthreads();
    return red[32];
}

// Dot product of one bf16 weight row with one f32 vector, accumulated per lane (the caller
// reduces across the warp). `vec` is nonzero when both are 16-byte aligned and n % 8 == 0.
__device__ __forceinline__ float lane_dot(const bf16_t* w, const float* x, int n, int lane, int vec) {
    float acc = 0.0f;
    if (vec) {
        for (int c = lane * 8; c < n; c += 256) {
            float wf[8];
            unpack8(*(const uint4*)(w + c), wf);
            float4 x0 = *(const float4*)(x + c);
            float4 x1 = *(const float4*)(x + c + 4);
            acc += wf[0] * x0.x + wf[1] * x0.y + wf[2] * x0.z + wf[3] * x0.w
                 + wf[4] * x1.x + wf[5] * x1.y + wf[6] * x1.z + wf[7] * x1.w;
        }
    } else {
        for (int c = lane; c < n; c += 32) acc += bf16_to_f32(w[c]) * x[c];
    }
    return acc;
}

// ---- Weight formats (MODEL: spindle_kernels::quant layouts) ----
// FMT 0: bf16 words. FMT 1 (Q8): i8 codes [rows, cols], f16 scale per 32. FMT 2 (Q4): packed
// nibbles [rows, cols/2], in group g byte j = weight 32g+j (low nibble) and 32g+16+j (high),
// w = scale·(nibble − 8). FMT 3 (FP8): e4m3fn codes [rows, cols], an f32 scale per 32 (the
// checkpoint's block scale of those columns, two 16-bit words; a row's last group may hold 16
// columns), w = e4m3(code)·scale. A
// 16-byte chunk of codes holds WF<FMT>::VALS weights; a row has WF<FMT>::row_scales 16-bit
// scale words.

__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

template <int FMT> struct WF;
template <> struct WF<0> {
    static constexpr int VALS = 8;
    __device__ static size_t row_bytes(int cols) { return (size_t)cols * 2; }
};
template <> struct WF<1> {
    static constexpr int VALS = 16;
    __device__ static size_t row_bytes(int cols) { return (size_t)cols; }
};
template <> struct WF<2> {
    static constexpr int VALS = 32;
    __device__ static size_t row_bytes(int cols) { return (size_t)cols / 2; }
};
template <> struct WF<3> {
    static constexpr int VALS = 16;
    __device__ static size_t row_bytes(int cols) { return (size_t)cols; }
};
// The GGUF K-quants (ggml.cu): codes per superblock of 256 weights (VALS: a decode chunk's).
template <> struct WF<4> {
    static constexpr int VALS = 32;
    __device__ static size_t row_bytes(int cols) { return (size_t)cols / 2; }
};
template <> struct WF<5> {
    static constexpr int VALS = 64;
    __device__ static size_t row_bytes(int cols) { return (size_t)(cols >> 8) * 192; }
};
template <> struct WF<6> {
    static constexpr int VALS = 32;
    __device__ static size_t row_bytes(int cols) { return (size_t)(cols >> 8) * 160; }
};

// 16-bit scale words per row (bf16: none are read; K-quants: per superblock of 256).
template <int FMT>
__device__ __forceinline__ size_t row_scale_words(int cols) {
    return FMT == 3   ? (size_t)((cols + 31) >> 5) * 2
           : FMT == 5 ? (size_t)(cols >> 8) * 10
           : FMT >= 4 ? (size_t)(cols >> 8) * 8
                      : (size_t)(cols >> 5);
}

// The four e4m3fn codes of `w` (byte 0 first) as f32, each divided by 2^8: a code's sign,
// exponent and mantissa bits placed in an f16 (exponent bias 15 against 7) give its value
// times 2^-8 exactly, subnormals included. Callers fold the 2^8 into the block scale.
__device__ __forceinline__ void e4m3x4_div256(unsigned int w, float* out) {
    unsigned int lo = __byte_perm(w, 0u, 0x4140);  // codes 0, 1 in the low bytes of two halves
    unsigned int hi = __byte_perm(w, 0u, 0x4342);  // codes 2, 3
    lo = ((lo & 0x007f007fu) << 7) | ((lo & 0x00800080u) << 8);
    hi = ((hi & 0x007f007fu) << 7) | ((hi & 0x00800080u) << 8);
    out[0] = f16_to_f32((unsigned short)(lo & 0xffffu));
    out[1] = f16_to_f32((unsigned short)(lo >> 16));
    out[2] = f16_to_f32((unsigned short)(hi & 0xffffu));
    out[3] = f16_to_f32((unsigned short)(hi >> 16));
}

// The scale of FP8 group g (of 32 columns) times 2^8 (see e4m3x4_div256).
__device__ __forceinline__ float fp8_scale256(const unsigned short* s, int g) {
    return __ldg((const float*)s + g) * 256.0f;
}

// The weights of 16-byte chunk `ch` of a row (codes `w`, that row's scales `s`), as f32.
template <int FMT>
__device__ __forceinline__ void load_chunk(const unsigned char* w, const unsigned short* s, int ch, float* out);

template <>
__device__ __forceinline__ void load_chunk<0>(const unsigned char* w, const unsigned short* s, int ch, float* out) {
    unpack8(*(const uint4*)(w + (size_t)ch * 16), out);
}

template <>
__device__ __forceinline__ void load_chunk<1>(const unsigned char* w, const unsigned short* s, int ch, float* out) {
    uint4 v = *(const uint4*)(w + (size_t)ch * 16);
    float d = f16_to_f32(s[ch >> 1]);
    unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int b = 0; b < 4; b++) out[4 * i + b] = d * (float)(signed char)((words[i] >> (8 * b)) & 0xff);
    }
}

template <>
__device__ __forceinline__ void load_chunk<2>(const unsigned char* w, const unsigned short* s, int ch, float* out) {
    uint4 v = *(const uint4*)(w + (size_t)ch * 16);
    float d = f16_to_f32(s[ch]);
    unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int b = 0; b < 4; b++) {
            unsigned int byte = (words[i] >> (8 * b)) & 0xff;
            out[4 * i + b] = d * (float)((int)(byte & 15) - 8);
            out[16 + 4 * i + b] = d * (float)((int)(byte >> 4) - 8);
        }
    }
}

template <>
__device__ __forceinline__ void load_chunk<3>(const unsigned char* w, const unsigned short* s, int ch, float* out) {
    uint4 v = *(const uint4*)(w + (size_t)ch * 16);
    float d = fp8_scale256(s, ch >> 1);
    unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        e4m3x4_div256(words[i], out + 4 * i);
#pragma unroll
        for (int b = 0; b < 4; b++) out[4 * i + b] *= d;
    }
}

// Weight c of a row, one at a time (unaligned fallbacks and the GEMM's tile loads).
template <int FMT>
__device__ __forceinline__ float load_one(const unsigned char* w, const unsigned short* s, int c);

template <>
__device__ __forceinline__ float load_one<0>(const unsigned char* w, const unsigned short* s, int c) {
    return bf16_to_f32(((const bf16_t*)w)[c]);
}

template <>
__device__ __forceinline__ float load_one<1>(const unsigned char* w, const unsigned short* s, int c) {
    return f16_to_f32(s[c >> 5]) * (float)(signed char)w[c];
}

template <>
__device__ __forceinline__ float load_one<2>(const unsigned char* w, const unsigned short* s, int c) {
    int g = c >> 5, j = c & 31;
    unsigned int byte = w[g * 16 + (j & 15)];
    unsigned int nib = j < 16 ? (byte & 15) : (byte >> 4);
    return f16_to_f32(s[g]) * (float)((int)nib - 8);
}

template <>
__device__ __forceinline__ float load_one<3>(const unsigned char* w, const unsigned short* s, int c) {
    float v[4];
    e4m3x4_div256((unsigned int)w[c], v);
    return fp8_scale256(s, c >> 5) * v[0];
}

// Σ wf[i]·x[i] over one chunk (x 16-byte aligned).
template <int V>
__device__ __forceinline__ float dot_chunk(const float* wf, const float* x) {
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < V / 4; i++) {
        float4 xv = ((const float4*)x)[i];
        a += wf[4 * i] * xv.x + wf[4 * i + 1] * xv.y + wf[4 * i + 2] * xv.z + wf[4 * i + 3] * xv.w;
    }
    return a;
}

// One lane's part of the dot product of weight row (w, s) with x over n columns.
template <int FMT>
__device__ __forceinline__ float row_dot(const unsigned char* w, const unsigned short* s, const float* x, int n,
                                         int lane, int vec) {
    const int V = WF<FMT>::VALS;
    float acc = 0.0f;
    if (vec) {
        int chunks = n / V;
        for (int ch = lane; ch < chunks; ch += 32) {
            float wf[V];
            load_chunk<FMT>(w, s, ch, wf);
            acc += dot_chunk<V>(wf, x + (size_t)ch * V);
        }
    } else {
        for (int c = lane; c < n; c += 32) acc += load_one<FMT>(w, s, c) * x[c];
    }
    return acc;
}

// Asynchronous 16-byte copies global → shared, finished (for the calling thread) by
// cp_async_wait_all(); a plain copy before sm_80.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
    unsigned int a = (unsigned int)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(__cvta_generic_to_global(gmem)));
#else
    *(uint4*)smem = *(const uint4*)gmem;
#endif
}

__device__ __forceinline__ void cp_async_wait_all() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

// ---- Programmatic dependent launch (sm_90; device/pdl.rs) ----
// A kernel whose PTX holds griddepcontrol.wait is launched with programmatic stream
// serialization: it may start while its predecessor on the stream still runs. PDL_WAIT()
// blocks until the predecessor has finished and its writes are visible, so a kernel that uses
// it calls it in every thread before its first read of anything an earlier kernel wrote and
// before its first write of anything an earlier kernel reads; only index math, reads of
// weights (never written on the device) and L2 prefetches (which change no value) come
// before. PDL_LAUNCH() lets the next kernel's blocks start (they wait in their own
// PDL_WAIT()); it comes after PDL_WAIT(), so when any block of a kernel runs, every kernel
// before its predecessor has finished. Before sm_90 both are nothing (and the kernels are
// launched plainly).
#if __CUDA_ARCH__ >= 900
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT() ((void)0)
#define PDL_LAUNCH() ((void)0)
#endif
// The two at a kernel's start, for kernels with no prologue of their own.
#define PDL_BEGIN() \
    do {            \
        PDL_WAIT();   \
        PDL_LAUNCH(); \
    } while (0)

// The most bytes of one matrix the blocks of a launch prefetch together (a part of the L2, so
// that a large matrix's prefetch does not evict its own first lines).
#define PREFETCH_L2_MAX (16u << 20)

// 0: the prefetches below are off (`SPINDLE_CUDA_L2_PREFETCH=0`, set when the device opens).
__constant__ int spindle_l2_prefetch = 1;

// Asks L2 to fetch bytes [lo, hi) from p, 128-byte lines spread over the block's threads. A
// hint that changes no value: it may run before PDL_WAIT().
__device__ __forceinline__ void prefetch_l2_range(const void* p, size_t lo, size_t hi) {
#if __CUDA_ARCH__ >= 900
    if (!spindle_l2_prefetch) return;
    size_t base = (size_t)__cvta_generic_to_global(p);
    for (size_t off = (lo & ~(size_t)127) + (size_t)threadIdx.x * 128; off < hi; off += (size_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off));
#endif
}

// This block's share of a prefetch of [p, p + n) by the whole launch: the blocks of grid
// row 0 split the first PREFETCH_L2_MAX bytes evenly (nothing when p is null).
__device__ __forceinline__ void prefetch_l2_share(const void* p, size_t n) {
    if (p == nullptr || blockIdx.y != 0 || blockIdx.z != 0) return;
    n = n < (size_t)PREFETCH_L2_MAX ? n : (size_t)PREFETCH_L2_MAX;
    size_t per = (n + gridDim.x - 1) / gridDim.x;
    size_t lo = per * blockIdx.x, hi = lo + per < n ? lo + per : n;
    prefetch_l2_range(p, lo, hi);
}
