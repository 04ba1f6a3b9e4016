// Sampling on the device (the host `spindle_runtime::sampling::Sampler`, draw given): for every
// row of logits [rows, V], penalties, then greedy or temperature, top-k, top-p, min-p and a draw
// from the softmax of what is left. Only the chosen ids leave the device.
//
// No row is sorted whole. Every survivor set of the host's algorithm is a prefix of the row in
// its sorted order (scaled logit descending, id ascending), and so is the walk of the draw:
//   sample_count_history  counts each row's history ids (rows with a penalty only);
//   sample_row_stats      per slice: the greedy (argmax) candidate, the largest scaled logit and
//                         the number of candidates (finite or +inf), and whether a raw logit
//                         is NaN or infinite (its top bit);
//   sample_histogram      per slice: count and mass exp(s - max) of the candidates in 4096
//                         buckets of the distance d = max - s (1/128 of a logit each);
//   sample_window_choose  one block per row: from the histogram, the buckets that must hold the
//                         cut and the draw (a prefix, or a window around the draw when nothing
//                         is cut), at most SAMPLE_WINDOW candidates;
//   sample_collect        per slice: the window's candidates to a per-row list, the masses
//                         above and below the window summed (f64 sums of f32 exponentials);
//   sample_pick           one block per row: the window sorted in shared memory and walked as
//                         the host does (f64 masses), the greedy rows' arg-max written.
// A row whose cut or draw cannot be settled inside a window gets SAMPLE_UNRESOLVED and the host
// samples it (rare: a cut far down a flat distribution, or a bucket of more than SAMPLE_WINDOW
// equal-looking logits).

#define SAMPLE_BUCKETS 4096
#define SAMPLE_BUCKET_SCALE 128.0f
#define SAMPLE_WINDOW 8192
#define SAMPLE_PICK_THREADS 1024
#define SAMPLE_PARAM_WORDS 16
#define SAMPLE_GREEDY 1u
#define SAMPLE_PENALISE 2u
#define SAMPLE_MASKED 4u
#define SAMPLE_UNRESOLVED 0xffffffffu
// A history count's top bit: the id is in the history (a repetition penalty), counted or not.
#define SAMPLE_SEEN 0x80000000u
// The top bit of a slice's candidate count: the slice's raw logits hold a NaN or an infinity.
#define SAMPLE_NON_FINITE_BIT 0x80000000u

// One row's parameters, SAMPLE_PARAM_WORDS words (the Rust side packs them).
struct SampleRow {
    float inv_t;           // 1 / temperature (f32, as the host computes it)
    unsigned top_k;        // 0: off
    float top_p;
    float min_p;
    float repetition;
    float presence;
    float frequency;
    unsigned flags;        // SAMPLE_GREEDY, SAMPLE_PENALISE, SAMPLE_MASKED
    unsigned history_at;   // word offset of the row's history in the parameter buffer
    unsigned history_len;
    unsigned uniform_lo;   // the draw in [0, 1), f64 bits
    unsigned uniform_hi;
    unsigned mask_at;      // word offset of the row's allowed-token bits (SAMPLE_MASKED)
    unsigned counted_from; // history ids from here on count for presence and frequency
    unsigned pad[2];
};

__device__ __forceinline__ SampleRow sample_params(const unsigned* params, int row) {
    return *reinterpret_cast<const SampleRow*>(params + (size_t)row * SAMPLE_PARAM_WORDS);
}

// A float as an unsigned that orders as the float does (total order: -0 below +0); NaN is 0,
// below everything.
__device__ __forceinline__ unsigned sample_key(float f) {
    if (isnan(f)) return 0u;
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float sample_unkey(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The logit of token `i` (element `at`) after the row's mask (a token whose bit is clear is
// -inf, as the host's apply_mask_words sets it before anything else) and penalties (the host's
// apply_penalties, rounded the same way: no fused multiply-add; a masked -inf stays -inf).
__device__ __forceinline__ float sample_logit(const unsigned* __restrict__ params,
                                              const float* __restrict__ logits,
                                              const unsigned* __restrict__ counts, size_t at, int i,
                                              const SampleRow& p) {
    if ((p.flags & SAMPLE_MASKED) && !((params[p.mask_at + ((unsigned)i >> 5)] >> (i & 31)) & 1u))
        return -SP_INF;
    float l = logits[at];
    if (p.flags & SAMPLE_PENALISE) {
        unsigned c = counts[at];  // SAMPLE_SEEN: in the history; below it, the ids counted
        if (c != 0u) {
            l = l > 0.0f ? __fdiv_rn(l, p.repetition) : __fmul_rn(l, p.repetition);
            unsigned counted = c & ~SAMPLE_SEEN;
            if (counted != 0u) l = __fsub_rn(l, __fadd_rn(p.presence, __fmul_rn(p.frequency, (float)counted)));
        }
    }
    return l;
}

__device__ __forceinline__ bool sample_candidate(float l) { return !isnan(l) && l != -SP_INF; }

// Distance below the maximum; with an infinite maximum every finite candidate is infinitely far.
__device__ __forceinline__ float sample_distance(float s, float m) {
    if (m == SP_INF) return s == SP_INF ? 0.0f : SP_INF;
    return m - s;
}

__device__ __forceinline__ int sample_bucket(float d) {
    return d < (float)SAMPLE_BUCKETS / SAMPLE_BUCKET_SCALE ? (int)(d * SAMPLE_BUCKET_SCALE)
                                                            : SAMPLE_BUCKETS - 1;
}

// The host's unnormalised probability: exp in f64 of the f32 difference.
__device__ __forceinline__ double sample_mass(float s, float m) {
    if (m == SP_INF) return s == SP_INF ? 1.0 : 0.0;
    return exp((double)(s - m));
}

// (key desc, id asc) is better.
__device__ __forceinline__ void sample_better(unsigned& k, unsigned& i, unsigned ok, unsigned oi) {
    if (ok > k || (ok == k && oi < i)) { k = ok; i = oi; }
}

// The row's totals from its slices' parts: greedy (key, id), largest scaled key, candidates.
__device__ __forceinline__ void sample_row_totals(const unsigned* __restrict__ parts, int row, int split,
                                                  unsigned& gk, unsigned& gi, unsigned& mk, unsigned& n) {
    gk = 0u; gi = 0xffffffffu; mk = 0u; n = 0u;
    for (int b = 0; b < split; b++) {
        const unsigned* q = parts + ((size_t)row * split + b) * 4;
        sample_better(gk, gi, q[0], q[1]);
        mk = max(mk, q[2]);
        n += q[3] & ~SAMPLE_NON_FINITE_BIT;
    }
}

// Whether any slice of the row saw a raw logit that is NaN or infinite.
__device__ __forceinline__ unsigned sample_row_non_finite(const unsigned* __restrict__ parts, int row, int split) {
    unsigned bad = 0u;
    for (int b = 0; b < split; b++) bad |= parts[((size_t)row * split + b) * 4 + 3] & SAMPLE_NON_FINITE_BIT;
    return bad ? 1u : 0u;
}

extern "C" __global__ void sample_count_history(const unsigned* __restrict__ params, int vocab,
                                                unsigned* __restrict__ counts) {
    int row = blockIdx.y;
    SampleRow p = sample_params(params, row);
    if (!(p.flags & SAMPLE_PENALISE)) return;
    const unsigned* history = params + p.history_at;
    for (unsigned j = blockIdx.x * blockDim.x + threadIdx.x; j < p.history_len; j += gridDim.x * blockDim.x) {
        unsigned id = history[j];
        if (id >= (unsigned)vocab) continue;
        unsigned* c = &counts[(size_t)row * vocab + id];
        if (j >= p.counted_from) atomicAdd(c, 1u);
        else atomicOr(c, SAMPLE_SEEN);
    }
}

// grid (split, rows). parts[row][slice] = {greedy key, greedy id, max scaled key, candidates};
// also zeroes the row's histogram for sample_histogram.
extern "C" __global__ void sample_row_stats(const unsigned* __restrict__ params, const float* __restrict__ logits,
                                            int vocab, const unsigned* __restrict__ counts,
                                            unsigned* __restrict__ parts, unsigned* __restrict__ hist) {
    __shared__ unsigned sk[32], si[32], sm[32], sn[32];
    int row = blockIdx.y, split = gridDim.x;
    SampleRow p = sample_params(params, row);
    size_t base = (size_t)row * vocab;
    int chunk = (vocab + split - 1) / split;
    int lo = blockIdx.x * chunk, hi = min(vocab, lo + chunk);
    bool greedy = p.flags & SAMPLE_GREEDY;
    unsigned gk = 0u, gi = 0xffffffffu, mk = 0u, n = 0u, bad = 0u;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        if (!isfinite(logits[base + i])) bad = SAMPLE_NON_FINITE_BIT;
        float l = sample_logit(params, logits, counts, base + i, i, p);
        // The host's argmax compares with >, so -0 and +0 tie.
        sample_better(gk, gi, sample_key(l == 0.0f ? 0.0f : l), (unsigned)i);
        if (!greedy && sample_candidate(l)) {
            n++;
            mk = max(mk, sample_key(__fmul_rn(l, p.inv_t)));
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        unsigned ok = __shfl_xor_sync(0xffffffffu, gk, o), oi = __shfl_xor_sync(0xffffffffu, gi, o);
        sample_better(gk, gi, ok, oi);
        mk = max(mk, __shfl_xor_sync(0xffffffffu, mk, o));
        n += __shfl_xor_sync(0xffffffffu, n, o);
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sk[warp] = gk; si[warp] = gi; sm[warp] = mk; sn[warp] = n | bad; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) {
            sample_better(gk, gi, sk[w], si[w]);
            mk = max(mk, sm[w]);
            n += sn[w] & ~SAMPLE_NON_FINITE_BIT;
            bad |= sn[w] & SAMPLE_NON_FINITE_BIT;
        }
        unsigned* q = parts + ((size_t)row * split + blockIdx.x) * 4;
        q[0] = gk; q[1] = gi; q[2] = mk; q[3] = (n & ~SAMPLE_NON_FINITE_BIT) | bad;
    }
    unsigned* h = hist + (size_t)row * 2 * SAMPLE_BUCKETS;
    for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < 2 * SAMPLE_BUCKETS; b += split * blockDim.x) h[b] = 0u;
}

// grid (split, rows). Adds the slice's candidates to the row's histogram: counts, then masses
// (f32, for choosing windows only; the pick recomputes every mass it uses in f64).
extern "C" __global__ void sample_histogram(const unsigned* __restrict__ params, const float* __restrict__ logits,
                                            int vocab, const unsigned* __restrict__ counts,
                                            const unsigned* __restrict__ parts, unsigned* __restrict__ hist) {
    __shared__ unsigned hc[SAMPLE_BUCKETS];
    __shared__ float hm[SAMPLE_BUCKETS];
    int row = blockIdx.y, split = gridDim.x;
    SampleRow p = sample_params(params, row);
    if (p.flags & SAMPLE_GREEDY) return;
    unsigned gk, gi, mk, n;
    sample_row_totals(parts, row, split, gk, gi, mk, n);
    if (n == 0u) return;
    float m = sample_unkey(mk);
    for (int b = threadIdx.x; b < SAMPLE_BUCKETS; b += blockDim.x) { hc[b] = 0u; hm[b] = 0.0f; }
    __syncthreads();
    size_t base = (size_t)row * vocab;
    int chunk = (vocab + split - 1) / split;
    int lo = blockIdx.x * chunk, hi = min(vocab, lo + chunk);
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float l = sample_logit(params, logits, counts, base + i, i, p);
        if (!sample_candidate(l)) continue;
        float d = sample_distance(__fmul_rn(l, p.inv_t), m);
        int b = sample_bucket(d);
        atomicAdd(&hc[b], 1u);
        atomicAdd(&hm[b], expf(-d));
    }
    __syncthreads();
    unsigned* gc = hist + (size_t)row * 2 * SAMPLE_BUCKETS;
    float* gm = reinterpret_cast<float*>(gc + SAMPLE_BUCKETS);
    for (int b = threadIdx.x; b < SAMPLE_BUCKETS; b += blockDim.x) {
        if (hc[b] != 0u) {
            atomicAdd(&gc[b], hc[b]);
            atomicAdd(&gm[b], hm[b]);
        }
    }
}

// Inclusive prefix sum of a[0..n) in place, contiguous pieces per thread; `red` holds 33.
template <typename T>
__device__ void sample_scan(T* a, int n, T* red) {
    int per = (n + blockDim.x - 1) / blockDim.x;
    int lo = min(n, (int)threadIdx.x * per), hi = min(n, lo + per);
    T sum = 0;
    for (int j = lo; j < hi; j++) { sum += a[j]; a[j] = sum; }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    T incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        T t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    __syncthreads();
    if (lane == 31) red[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        T w = lane < (int)(blockDim.x >> 5) ? red[lane] : (T)0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            T t = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += t;
        }
        red[lane] = w;
    }
    __syncthreads();
    T offset = incl - sum + (warp > 0 ? red[warp - 1] : (T)0);
    for (int j = lo; j < hi; j++) a[j] += offset;
    __syncthreads();
}

// Sum over the block (f64); every thread gets it.
__device__ double sample_block_sum(double v, double* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += red[w];
    __syncthreads();
    return t;
}

// The first j < n with pred(j), or n; the whole block calls it and gets the answer.
template <typename F>
__device__ int sample_first(int n, F pred) {
    __shared__ int best;
    if (threadIdx.x == 0) best = n;
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        if (pred(j)) atomicMin(&best, j);
    __syncthreads();
    int r = best;
    __syncthreads();
    return r;
}

// The last j < n with pred(j), or -1.
template <typename F>
__device__ int sample_last(int n, F pred) {
    __shared__ int best;
    if (threadIdx.x == 0) best = -1;
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        if (pred(j)) atomicMax(&best, j);
    __syncthreads();
    int r = best;
    __syncthreads();
    return r;
}

__device__ __forceinline__ unsigned sample_id_of(unsigned long long key) {
    return 0xffffffffu - (unsigned)(key & 0xffffffffu);
}

__device__ __forceinline__ float sample_s_of(unsigned long long key) {
    return sample_unkey((unsigned)(key >> 32));
}

// One bucket past the last that can hold a min-p survivor (d <= -ln(min_p)), for rounding.
__device__ __forceinline__ int sample_min_p_bucket(const SampleRow& p) {
    return p.min_p > 0.0f ? min(SAMPLE_BUCKETS - 1, sample_bucket(-logf(p.min_p)) + 1) : SAMPLE_BUCKETS - 1;
}

// Widens [lo, hi] by up to four buckets on each side while the window holds at most
// SAMPLE_WINDOW candidates; hi = -1 when [lo, hi] itself is too large.
__device__ void sample_widen(const unsigned* hc, const unsigned* cc, int& lo, int& hi) {
    const int NB = SAMPLE_BUCKETS;
    unsigned c = cc[hi] - (lo > 0 ? cc[lo - 1] : 0u);
    if (c > SAMPLE_WINDOW) { hi = -1; return; }
    for (int grow = 0; grow < 4; grow++) {
        if (lo > 0 && c + hc[lo - 1] <= SAMPLE_WINDOW) { lo--; c += hc[lo]; }
        if (hi + 1 < NB && c + hc[hi + 1] <= SAMPLE_WINDOW) { hi++; c += hc[hi]; }
    }
}

// The buckets to collect: [lo, hi] (hi < 0: none fits). The first bucket whose cumulative
// count reaches top-k (bk), whose mass reaches top-p (bp), past the last min-p survivor (bm),
// and whose mass passes the draw (bd_lo, bd_hi: a margin either side). A prefix of the sorted
// row when it fits; else a window around the cut (the draw then takes a second round) or, with
// nothing cut, around the draw.
__device__ void sample_window(const SampleRow& p, unsigned n, const unsigned* hc, const unsigned* cc,
                              int bk, int bp, int bm, int bd_lo, int bd_hi, int& lo, int& hi) {
    const int NB = SAMPLE_BUCKETS;
    bool k_on = p.top_k > 0u && p.top_k < n, p_on = p.top_p < 1.0f, m_on = p.min_p > 0.0f;
    lo = 0;
    if (k_on || p_on || m_on) {
        // Top-p needs the top-k mass, so with both on the window holds the k-th candidate too.
        int c_hi = (k_on && p_on) ? bk : min(k_on ? bk : NB - 1, min(p_on ? bp : NB - 1, bm));
        int c_lo = (k_on && p_on) ? min(bp, bk) : c_hi;
        if (!k_on && !p_on) c_lo = max(0, bm - 2);
        if (cc[c_hi] <= SAMPLE_WINDOW) { hi = c_hi; return; }
        lo = c_lo;
        hi = c_hi;
    } else if (cc[bd_hi] <= SAMPLE_WINDOW) {
        hi = bd_hi;
        if (hi + 1 < NB && cc[hi + 1] <= SAMPLE_WINDOW) hi++;
        return;
    } else {
        lo = bd_lo;
        hi = bd_hi;
    }
    sample_widen(hc, cc, lo, hi);
}

// Per row, SAMPLE_WIN_WORDS words of `win`: [0] lo, [1] hi of the window (hi < 0: nothing to
// collect), [2] the collect slot counter, [3] candidates above the window, [4..5] their mass,
// [6..7] the mass below the window (f64), [8..9] the second round's target (f64), [10] stage:
// SAMPLE_STAGE_DRAW when the draw needs the second round.
#define SAMPLE_WIN_WORDS 16
#define SAMPLE_STAGE_DRAW 2u
#define SAMPLE_SECOND_ROUND 0xfffffffeu

// The host's unnormalised probability in f32 arithmetic (for the sums above and below a window).
__device__ __forceinline__ double sample_mass_f32(float s, float m) {
    if (m == SP_INF) return s == SP_INF ? 1.0 : 0.0;
    return (double)expf(s - m);
}

__device__ __forceinline__ double* sample_win_at(unsigned* w, int i) { return reinterpret_cast<double*>(w) + i; }
__device__ __forceinline__ double sample_win_get(const unsigned* w, int i) { return reinterpret_cast<const double*>(w)[i]; }

// grid (rows), SAMPLE_PICK_THREADS threads, dynamic shared memory: cumulative masses (f64),
// counts and cumulative counts (u32) of the histogram. Chooses each row's window: in round 1
// for the row's cuts and draw, in round 2 around the draw target of the rows that need one.
extern "C" __global__ void __launch_bounds__(SAMPLE_PICK_THREADS)
sample_window_choose(const unsigned* __restrict__ params, const unsigned* __restrict__ parts, int split,
                     const unsigned* __restrict__ hist, unsigned* __restrict__ win, int round) {
    extern __shared__ unsigned long long sample_smem[];
    const int NB = SAMPLE_BUCKETS;
    double* hm = reinterpret_cast<double*>(sample_smem);
    unsigned* hc = reinterpret_cast<unsigned*>(hm + NB);
    unsigned* cc = hc + NB;
    __shared__ double red[33];
    __shared__ unsigned redu[33];
    int row = blockIdx.x, tid = threadIdx.x;
    SampleRow p = sample_params(params, row);
    unsigned* w = win + (size_t)row * SAMPLE_WIN_WORDS;
    unsigned gk, gi, mk, n;
    sample_row_totals(parts, row, split, gk, gi, mk, n);
    bool second = round == 2;
    bool active = second ? w[10] == SAMPLE_STAGE_DRAW : !((p.flags & SAMPLE_GREEDY) || n == 0u);
    double target = second ? sample_win_get(w, 4) : 0.0;
    __syncthreads();
    if (tid == 0) {
        w[0] = 0u; w[1] = 0xffffffffu; w[2] = 0u; w[3] = 0u;
        *sample_win_at(w, 2) = 0.0;
        *sample_win_at(w, 3) = 0.0;
        if (!second) { *sample_win_at(w, 4) = 0.0; w[10] = 0u; }
    }
    if (!active) return;
    const unsigned* ghist = hist + (size_t)row * 2 * NB;
    const float* gm = reinterpret_cast<const float*>(ghist + NB);
    double u = __hiloint2double((int)p.uniform_hi, (int)p.uniform_lo);
    for (int b = tid; b < NB; b += blockDim.x) { hc[b] = ghist[b]; cc[b] = ghist[b]; hm[b] = gm[b]; }
    __syncthreads();
    sample_scan(cc, NB, redu);
    sample_scan(hm, NB, red);  // hm is now the cumulative mass
    double zh = hm[NB - 1];
    double draw = second ? target : u * zh;
    unsigned k_eff = (p.top_k > 0u && p.top_k < n) ? p.top_k : n;
    bool k_on = k_eff < n, p_on = p.top_p < 1.0f;
    int bk = sample_first(NB, [&](int b) { return k_on && cc[b] >= k_eff; });
    int bp = sample_first(NB, [&](int b) { return p_on && hm[b] >= (double)p.top_p * zh * (1.0 + 1e-5); });
    int bd_lo = sample_first(NB, [&](int b) { return hm[b] > draw * (1.0 - 1e-5); });
    int bd_hi = sample_first(NB, [&](int b) { return hm[b] > draw * (1.0 + 1e-5); });
    if (tid == 0) {
        int lo = 0, hi;
        if (second) {
            lo = min(bd_lo, NB - 1);
            hi = min(bd_hi, NB - 1);
            sample_widen(hc, cc, lo, hi);
        } else if (sample_unkey(mk) == SP_INF) {
            // Only the +inf candidates have mass: they decide every cut and the draw.
            hi = cc[0] <= SAMPLE_WINDOW ? 0 : -1;
        } else {
            sample_window(p, n, hc, cc, min(bk, NB - 1), min(bp, NB - 1), sample_min_p_bucket(p),
                          min(bd_lo, NB - 1), min(bd_hi, NB - 1), lo, hi);
        }
        w[0] = (unsigned)lo;
        w[1] = (unsigned)hi;
    }
}

// grid (split, rows): each slice's candidates inside its row's window go to keys[row][slot]
// (scaled-logit key << 32 | ~id); the candidates above the window are counted, the masses above
// and below it summed.
extern "C" __global__ void sample_collect(const unsigned* __restrict__ params, const float* __restrict__ logits,
                                          int vocab, const unsigned* __restrict__ counts,
                                          const unsigned* __restrict__ parts, unsigned* __restrict__ win,
                                          unsigned long long* __restrict__ keys) {
    __shared__ double red[33];
    __shared__ unsigned s_above;
    int row = blockIdx.y, split = gridDim.x;
    unsigned* w = win + (size_t)row * SAMPLE_WIN_WORDS;
    int lo = (int)w[0], hi = (int)w[1];
    if (hi < 0) return;
    if (threadIdx.x == 0) s_above = 0u;
    SampleRow p = sample_params(params, row);
    unsigned gk, gi, mk, n;
    sample_row_totals(parts, row, split, gk, gi, mk, n);
    float m = sample_unkey(mk);
    size_t base = (size_t)row * vocab;
    unsigned long long* rkeys = keys + (size_t)row * SAMPLE_WINDOW;
    int chunk = (vocab + split - 1) / split;
    int first = blockIdx.x * chunk, last = min(vocab, first + chunk);
    double above = 0.0, below = 0.0;
    unsigned n_above = 0u;
    for (int i = first + threadIdx.x; i < last; i += blockDim.x) {
        float l = sample_logit(params, logits, counts, base + i, i, p);
        if (!sample_candidate(l)) continue;
        float s = __fmul_rn(l, p.inv_t);
        int b = sample_bucket(sample_distance(s, m));
        if (b < lo) { above += sample_mass_f32(s, m); n_above++; }
        else if (b > hi) below += sample_mass_f32(s, m);
        else {
            unsigned slot = atomicAdd(&w[2], 1u);
            if (slot < SAMPLE_WINDOW)
                rkeys[slot] = ((unsigned long long)sample_key(s) << 32) | (0xffffffffu - (unsigned)i);
        }
    }
    __syncthreads();
    if (n_above) atomicAdd(&s_above, n_above);
    above = sample_block_sum(above, red);
    below = sample_block_sum(below, red);
    if (threadIdx.x == 0) {
        if (s_above) atomicAdd(&w[3], s_above);
        if (above != 0.0) atomicAdd(sample_win_at(w, 2), above);
        if (below != 0.0) atomicAdd(sample_win_at(w, 3), below);
    }
}

// Loads the row's collected window into shared memory, sorts it (scaled logit descending, id
// ascending) and fills cum with the inclusive prefix sums of the host's masses. Returns its size.
__device__ int sample_sort_window(int nw, float m, const unsigned long long* __restrict__ gkeys,
                                  unsigned long long* keys, double* cum, double* red) {
    int tid = threadIdx.x;
    int npad = 1;
    while (npad < nw) npad <<= 1;
    for (int j = tid; j < npad; j += blockDim.x) keys[j] = j < nw ? gkeys[j] : 0ull;
    __syncthreads();
    for (int k = 2; k <= npad; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = tid; i < npad; i += blockDim.x) {
                int ixj = i ^ j;
                if (ixj > i) {
                    unsigned long long a = keys[i], b = keys[ixj];
                    bool desc = (i & k) == 0;
                    if (desc ? a < b : a > b) { keys[i] = b; keys[ixj] = a; }
                }
            }
            __syncthreads();
        }
    }
    for (int j = tid; j < nw; j += blockDim.x) cum[j] = sample_mass(sample_s_of(keys[j]), m);
    __syncthreads();
    sample_scan(cum, nw, red);
    return nw;
}

// Round 1 of one non-greedy row (n candidates, maximum scaled logit m): the chosen id,
// SAMPLE_SECOND_ROUND (the draw's target stored in the window record) or SAMPLE_UNRESOLVED.
// The window holds positions [ca, ca + nw) of the sorted row; every cut of the host's algorithm
// is a prefix length, found here when it falls inside the window.
__device__ unsigned sample_pick_row(const SampleRow& p, float m, unsigned n, unsigned* w,
                                    const unsigned long long* __restrict__ gkeys,
                                    unsigned long long* keys, double* cum) {
    __shared__ double red[33];
    int lo = (int)w[0], hi = (int)w[1];
    unsigned collected = w[2], ca = w[3];
    double ma = sample_win_get(w, 2), mb = sample_win_get(w, 3);
    if (hi < 0 || collected == 0u || collected > SAMPLE_WINDOW) return SAMPLE_UNRESOLVED;
    double u = __hiloint2double((int)p.uniform_hi, (int)p.uniform_lo);
    unsigned k_eff = (p.top_k > 0u && p.top_k < n) ? p.top_k : n;
    bool k_on = k_eff < n, p_on = p.top_p < 1.0f, m_on = p.min_p > 0.0f;
    int bm = sample_min_p_bucket(p);
    int nw = sample_sort_window((int)collected, m, gkeys, keys, cum, red);
    if (m == SP_INF) {
        // Every other candidate has mass 0: the row's answer is the same with the +inf ones alone.
        n = collected;
        k_eff = min(k_eff, n);
        k_on = k_eff < n;
        mb = 0.0;
    }
    auto mass = [&](int j) { return sample_mass(sample_s_of(keys[j]), m); };
    double window_mass = cum[nw - 1];
    const unsigned INF = 0xffffffffu;
    unsigned top = ca + (unsigned)nw;  // positions [ca, top) are in the window
    // The softmax denominator: the top-k set's mass (-1: not known here).
    double z = k_on ? ((k_eff > ca && k_eff <= top) ? ma + cum[k_eff - ca - 1] : -1.0)
                    : ma + window_mass + mb;
    unsigned s_end = min(k_eff, top);  // the top-k set's end, or the window's
    unsigned lp = n, lm = n;
    bool unknown = false;
    if (p_on) {
        if (z < 0.0 || ma / z >= (double)p.top_p) return SAMPLE_UNRESOLVED;
        int lim = (int)(s_end - ca);
        int j = sample_first(lim, [&](int j) { return (ma + cum[j]) / z >= (double)p.top_p; });
        if (j < lim) lp = ca + j + 1;
        else if (k_eff <= top) lp = k_eff;
        else { lp = INF; unknown = true; }
    }
    if (m_on) {
        // Everything above the window must survive min-p (its distance is below lo / scale).
        if (lo > 0 && expf(-(float)lo / SAMPLE_BUCKET_SCALE) < p.min_p * 1.001f) return SAMPLE_UNRESOLVED;
        double zz = z > 0.0 ? z : 1.0;
        double threshold = (double)p.min_p * (1.0 / zz);  // the best candidate's mass is 1
        unsigned range_end = min(s_end, lp);
        int range = range_end > ca ? (int)(range_end - ca) : 0;
        int j = sample_first(range, [&](int j) { return mass(j) / zz < threshold; });
        if (j < range) lm = ca + j;
        else if (range_end == min(k_eff, lp)) lm = n;
        else if (range_end == top && hi >= bm) lm = top;  // everything past the window is below
        else { lm = INF; unknown = true; }
    }
    unsigned l = max(1u, min(k_eff, min(lp, lm)));
    if ((l > top && (unknown || l != n)) || l <= ca) return SAMPLE_UNRESOLVED;
    double target = u * (l <= top ? ma + cum[l - ca - 1] : ma + window_mass + mb);
    double t = target - ma;
    int walk = (int)(min(l, top) - ca);
    int j = t >= 0.0 ? sample_first(walk, [&](int j) { return t < cum[j]; }) : walk;
    if (j < walk) return sample_id_of(keys[j]);
    if (t < 0.0 || l > top) {
        // The draw lies above or below the window: a second round around it.
        if (threadIdx.x == 0) { *sample_win_at(w, 4) = target; w[10] = SAMPLE_STAGE_DRAW; }
        return SAMPLE_SECOND_ROUND;
    }
    // Rounding left the target past the end: the last candidate with mass, as the host.
    int last = sample_last(walk, [&](int j) { return mass(j) > 0.0; });
    if (last < 0) return ca == 0 ? sample_id_of(keys[0]) : SAMPLE_UNRESOLVED;
    return sample_id_of(keys[last]);
}

// Round 2 of a row: the candidate where the cumulative mass passes the stored target.
__device__ unsigned sample_draw_row(float m, const unsigned* w, const unsigned long long* __restrict__ gkeys,
                                    unsigned long long* keys, double* cum) {
    __shared__ double red[33];
    int hi = (int)w[1];
    unsigned collected = w[2];
    if (hi < 0 || collected == 0u || collected > SAMPLE_WINDOW) return SAMPLE_UNRESOLVED;
    int nw = sample_sort_window((int)collected, m, gkeys, keys, cum, red);
    double t = sample_win_get(w, 4) - sample_win_get(w, 2);
    if (t < 0.0) return SAMPLE_UNRESOLVED;
    int j = sample_first(nw, [&](int j) { return t < cum[j]; });
    return j < nw ? sample_id_of(keys[j]) : SAMPLE_UNRESOLVED;
}

// grid (rows), SAMPLE_PICK_THREADS threads, dynamic shared memory: SAMPLE_WINDOW keys (u64)
// and cumulative masses (f64). Round 1: out[row] is the chosen id, SAMPLE_SECOND_ROUND or
// SAMPLE_UNRESOLVED (the host samples the row), and out[rows + row] is 1 when the row's raw
// logits hold a NaN or an infinity (0 otherwise). Round 2: the rows left for it get their id.
// The last round clears the rows' history counts.
extern "C" __global__ void __launch_bounds__(SAMPLE_PICK_THREADS)
sample_pick(const unsigned* __restrict__ params, int vocab, unsigned* __restrict__ counts,
            const unsigned* __restrict__ parts, int split, unsigned* __restrict__ win,
            const unsigned long long* __restrict__ keys, unsigned* __restrict__ out, int round, int last) {
    extern __shared__ unsigned long long sample_smem[];
    unsigned long long* skeys = sample_smem;
    double* cum = reinterpret_cast<double*>(skeys + SAMPLE_WINDOW);
    int row = blockIdx.x;
    SampleRow p = sample_params(params, row);
    unsigned gk, gi, mk, n;
    sample_row_totals(parts, row, split, gk, gi, mk, n);
    unsigned* w = win + (size_t)row * SAMPLE_WIN_WORDS;
    const unsigned long long* rkeys = keys + (size_t)row * SAMPLE_WINDOW;
    if (round == 1) {
        unsigned result;
        if ((p.flags & SAMPLE_GREEDY) || n == 0u) result = gi == 0xffffffffu ? 0u : gi;
        else result = sample_pick_row(p, sample_unkey(mk), n, w, rkeys, skeys, cum);
        if (threadIdx.x == 0) {
            out[row] = result;
            out[gridDim.x + row] = sample_row_non_finite(parts, row, split);
        }
    } else if (w[10] == SAMPLE_STAGE_DRAW) {
        unsigned result = sample_draw_row(sample_unkey(mk), w, rkeys, skeys, cum);
        if (threadIdx.x == 0) out[row] = result;
    }
    if (last && (p.flags & SAMPLE_PENALISE)) {
        __syncthreads();
        const unsigned* history = params + p.history_at;
        for (unsigned j = threadIdx.x; j < p.history_len; j += blockDim.x) {
            unsigned id = history[j];
            if (id < (unsigned)vocab) counts[(size_t)row * vocab + id] = 0u;
        }
    }
}
