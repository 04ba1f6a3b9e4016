// The decode matvec of Q8/Q4 weights for batched steps (≥ 16 rows), its integer work on the
// tensor cores and every output the bits decode_matvec_impl (matvec.cu) gives that row alone.
//
// decode_matvec_impl computes output (row j, token t) as: lane sl of the row's lpr lanes sums
// acc = fma(f16(s)·d, isum, acc) over groups sl, sl + lpr, ... in increasing order (isum the
// exact int32 dot of the group's 32 weight codes with the token's int8 codes, minus 8·Σq for
// Q4), then lanes_sum adds the lpr partials in xor-butterfly order. Here one int8 mma
// m16n8k32 gives isum for 16 rows × 8 tokens of one group (integer: exact), and each lane
// keeps the same f32 partials for its four outputs of the tile: the partial of sl ("leaf" sl)
// is the same fma chain, and the leaves are combined in the butterfly's order: leaf i of the
// loop is sl = bit-reverse(i), and a binary counter adds each completed subtree to its left
// sibling, so the tree is T(lo, s, n) = T(lo, 2s, n/2) + T(lo + s, 2s, n/2), the butterfly's.
//
// A block of 8 warps takes 16 tokens (blockIdx.y·16 ..), staged with stage_rows<FMT, true> in
// the mma's B-fragment order (two slots of 8 tokens), and each warp 16 weight rows at a time.

// TCD_TOKENS (the prelude): tokens per block, two n-tiles of 8.
#define TCD_BATCH 4    // groups whose weights are loaded before any is used

// Bytes of one staged n-tile (8 token slots) of `cols`: codes, then d, then Σq per group.
__device__ __forceinline__ size_t tcd_tile_bytes(int cols) { return (size_t)8 * cols + (size_t)(cols >> 5) * 64; }

// A lane's two weight rows of its warp's 16: rows g8 and g8 + 8 (g8 = lane / 4).
template <int FMT>
struct TcdRows {
    const unsigned char* w0;
    const unsigned char* w1;
    const unsigned short* s0;
    const unsigned short* s1;
};

#if __CUDA_ARCH__ >= 800
// Group ch's codes of this lane's rows: Q8 the A fragment (rows g8, g8 + 8; codes 4·tig.. and
// 16 + 4·tig..); Q4 the two 4-byte words (a[0] row g8, a[1] row g8 + 8) whose low nibbles are
// codes 4·tig.. and high nibbles 16 + 4·tig..
template <int FMT>
__device__ __forceinline__ void tcd_load_codes(const TcdRows<FMT>& rw, int ch, int tig, unsigned int* a) {
    if (FMT == 1) {
        const unsigned int* p0 = (const unsigned int*)(rw.w0 + (size_t)ch * 32) + tig;
        const unsigned int* p1 = (const unsigned int*)(rw.w1 + (size_t)ch * 32) + tig;
        a[0] = __ldg(p0);
        a[1] = __ldg(p1);
        a[2] = __ldg(p0 + 4);
        a[3] = __ldg(p1 + 4);
    } else {
        a[0] = __ldg((const unsigned int*)(rw.w0 + (size_t)ch * 16) + tig);
        a[1] = __ldg((const unsigned int*)(rw.w1 + (size_t)ch * 16) + tig);
    }
}

// Leaf sl: v[j][e] = Σ over groups sl, sl + lpr, ... (in order) of fma(f16(s)·d, isum, ·), for
// n-tile j < ntiles and C-fragment element e (row g8 + 8·(e / 2), token 8j + 2·tig + e % 2).
template <int FMT>
__device__ __forceinline__ void tcd_leaf(const TcdRows<FMT>& rw, const unsigned char* __restrict__ sm, int cols,
                                         int sl, int lpr, int ntiles, float (&v)[2][4]) {
    int lane = threadIdx.x & 31, tig = lane & 3;
    int nch = cols >> 5;
    size_t tile = tcd_tile_bytes(cols), dofs = (size_t)8 * cols, sofs = dofs + (size_t)nch * 32;
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) v[j][e] = 0.0f;
    for (int c0 = sl; c0 < nch; c0 += lpr * TCD_BATCH) {
        unsigned int a[TCD_BATCH][4];
        float s0[TCD_BATCH], s1[TCD_BATCH];
#pragma unroll
        for (int u = 0; u < TCD_BATCH; u++) {
            int ch = c0 + u * lpr;
            if (ch < nch) {
                tcd_load_codes<FMT>(rw, ch, tig, a[u]);
                s0[u] = f16_to_f32(__ldg(rw.s0 + ch));
                s1[u] = f16_to_f32(__ldg(rw.s1 + ch));
            }
        }
#pragma unroll
        for (int u = 0; u < TCD_BATCH; u++) {
            int ch = c0 + u * lpr;
            if (ch < nch) {
                int af[4];
                if (FMT == 1) {
                    af[0] = (int)a[u][0];
                    af[1] = (int)a[u][1];
                    af[2] = (int)a[u][2];
                    af[3] = (int)a[u][3];
                } else {
                    const unsigned int m = 0x0f0f0f0fu;
                    af[0] = (int)(a[u][0] & m);
                    af[1] = (int)(a[u][1] & m);
                    af[2] = (int)((a[u][0] >> 4) & m);
                    af[3] = (int)((a[u][1] >> 4) & m);
                }
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    if (j < ntiles) {
                        const unsigned char* st = sm + j * tile;
                        uint2 b = *(const uint2*)(st + ((size_t)ch * 32 + lane) * 8);
                        float2 d = *(const float2*)(st + dofs + ((size_t)ch * 8 + 2 * tig) * 4);
                        int c[4] = {0, 0, 0, 0};
                        mma_s8(c, af, (int)b.x, (int)b.y);
                        if (FMT == 2) {
                            // Nibbles as stored (0..15): isum − 8·Σq, as chunk_isum's caller.
                            int2 q = *(const int2*)(st + sofs + ((size_t)ch * 8 + 2 * tig) * 4);
                            c[0] -= 8 * q.x;
                            c[1] -= 8 * q.y;
                            c[2] -= 8 * q.x;
                            c[3] -= 8 * q.y;
                        }
                        // dchunk_dot's f16(s)·d·isum, accumulated as row_dots does.
                        v[j][0] = __fmaf_rn(__fmul_rn(s0[u], d.x), (float)c[0], v[j][0]);
                        v[j][1] = __fmaf_rn(__fmul_rn(s0[u], d.y), (float)c[1], v[j][1]);
                        v[j][2] = __fmaf_rn(__fmul_rn(s1[u], d.x), (float)c[2], v[j][2]);
                        v[j][3] = __fmaf_rn(__fmul_rn(s1[u], d.y), (float)c[3], v[j][3]);
                    }
                }
            }
        }
    }
}

// The dot products of this lane's rows with its tokens, their lpr leaves summed in
// lanes_sum's butterfly order (lpr a power of two ≤ 32).
template <int FMT>
__device__ __forceinline__ void tcd_dots(const TcdRows<FMT>& rw, const unsigned char* __restrict__ sm, int cols,
                                         int lpr, int ntiles, float (&out)[2][4]) {
    int levels = __ffs(lpr) - 1;
    float stack[5][2][4];  // stack[k]: the completed left subtree of 2^k leaves awaiting its sibling
    for (int i = 0; i < lpr; i++) {
        int sl = levels == 0 ? 0 : (int)(__brev((unsigned int)i) >> (32 - levels));
        float cur[2][4];
        tcd_leaf<FMT>(rw, sm, cols, sl, lpr, ntiles, cur);
        // Leaf i completes the subtrees of 2, 4, ... leaves for each trailing 1 bit of i;
        // at its first 0 bit k the result waits in stack[k] for its right sibling.
        bool carry = true;
#pragma unroll
        for (int k = 0; k < 5; k++) {
            if (carry && k < levels) {
                if ((i >> k) & 1) {
#pragma unroll
                    for (int j = 0; j < 2; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) cur[j][e] = stack[k][j][e] + cur[j][e];
                } else {
#pragma unroll
                    for (int j = 0; j < 2; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) stack[k][j][e] = cur[j][e];
                    carry = false;
                }
            }
        }
        if (i == lpr - 1) {
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) out[j][e] = cur[j][e];
        }
    }
}
#endif

// decode_matvec_impl<FMT, MATVEC_MAX_TOKENS, false> for the same arguments, T > 8: blocks of
// row blockIdx.y of the grid take tokens 16·y .. 16·y + 15.
template <int FMT>
__device__ __forceinline__ void decode_matvec_tc_impl(const unsigned char* __restrict__ W, const unsigned short* __restrict__ S,
                                                      int outs, int cols, const float* __restrict__ x, int ldx, int T,
                                                      const float* __restrict__ nw, float eps, float* __restrict__ xn,
                                                      float* __restrict__ y, int ldy, int accumulate, int pair,
                                                      const float* __restrict__ gate, int ldg, int lpr) {
#if __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) unsigned char dsm[];
    int t0 = blockIdx.y * TCD_TOKENS;
    x += (size_t)t0 * ldx;
    y += (size_t)t0 * ldy;
    if (xn) xn += (size_t)t0 * cols;
    if (gate) gate += (size_t)t0 * ldg;
    T = min(T - t0, TCD_TOKENS);
    prefetch_l2_share(W, (size_t)(outs + pair) * WF<FMT>::row_bytes(cols));
    prefetch_l2_share(S, (size_t)(outs + pair) * row_scale_words<FMT>(cols) * 2);
    PDL_WAIT();
    PDL_LAUNCH();
    size_t tile = tcd_tile_bytes(cols);
    int ntiles = (T + 7) >> 3;
    for (int j = 0; j < ntiles; j++)
        stage_rows<FMT, true>(x + (size_t)j * 8 * ldx, ldx, min(T - 8 * j, 8), cols, nw, eps,
                              xn ? xn + (size_t)j * 8 * cols : nullptr, dsm + j * tile);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g8 = lane >> 2, tig = lane & 3;
    int warps = gridDim.x * (blockDim.x >> 5);
    size_t rb = WF<FMT>::row_bytes(cols), rsc = row_scale_words<FMT>(cols);
    for (int base = (blockIdx.x * (blockDim.x >> 5) + warp) * 16; base < outs; base += warps * 16) {
        int r0 = min(base + g8, outs - 1), r1 = min(base + g8 + 8, outs - 1);
        float a[2][4], b[2][4];
        TcdRows<FMT> rw{W + (size_t)r0 * rb, W + (size_t)r1 * rb, S + (size_t)r0 * rsc, S + (size_t)r1 * rsc};
        tcd_dots<FMT>(rw, dsm, cols, lpr, ntiles, a);
        if (pair) {
            TcdRows<FMT> ru{W + (size_t)(r0 + pair) * rb, W + (size_t)(r1 + pair) * rb, S + (size_t)(r0 + pair) * rsc,
                            S + (size_t)(r1 + pair) * rsc};
            tcd_dots<FMT>(ru, dsm, cols, lpr, ntiles, b);
        }
        // decode_matvec_impl's epilogue, statement for statement.
#pragma unroll
        for (int j = 0; j < 2; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int t = j * 8 + 2 * tig + (e & 1), r = base + g8 + 8 * (e >> 1);
                if (t < T) {
                    float v = a[j][e];
                    if (pair) v = silu_f(v) * b[j][e];
                    if (r < outs) {
                        if (gate) v *= sigmoid_f(gate[(size_t)t * ldg]);
                        float* out = y + (size_t)t * ldy + r;
                        *out = accumulate ? *out + v : v;
                    }
                }
            }
        }
    }
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(256) decode_matvec_tc_q8(DMV_ARGS) { decode_matvec_tc_impl<1>(DMV_PASS); }
extern "C" __global__ void __launch_bounds__(256) decode_matvec_tc_q4(DMV_ARGS) { decode_matvec_tc_impl<2>(DMV_PASS); }
