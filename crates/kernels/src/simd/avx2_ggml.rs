//! AVX2 dots of rows in ggml blocks with int8 activations: the arithmetic of
//! [`crate::ggml::dot_ggml_ref`] bit for bit (the integer sums of a superblock's eight groups
//! land in one register's eight lanes, then the same f32 operations run lane-wise). Reached
//! through [`super::Isa::Avx2`] or `Avx512` (a superset) only.

use std::arch::x86_64::*;

use crate::ggml::{half_at, scales_mins, sum_lanes};
use crate::quant::QuantizedActs;
use spindle_model::gguf::quants::GgmlType;
use spindle_model::quant::GROUP;

/// Lane `i` = Σ of the eight i32 lanes of `v[i]` (exact).
#[inline]
#[target_feature(enable = "avx2")]
fn sum8(v: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    let a = _mm256_hadd_epi32(h01, h23);
    let b = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256(a, b, 0x20),
        _mm256_permute2x128_si256(a, b, 0x31),
    )
}

/// Signed codes `q` (−128 < q) times int8 activations `x`, pairs summed to i16 (the sign
/// trick: |q| · x·sign(q)).
#[inline]
#[target_feature(enable = "avx2")]
fn signed_pairs(q: __m256i, x: __m256i) -> __m256i {
    _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// 32 bytes at `p` (unaligned).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at `p`.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// See [`crate::ggml::dot_ggml_ref`]; `row` whole blocks of `ty`, `xq` its columns, `xd` and
/// `xsd` one per 32 of them.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_ggml(ty: GgmlType, row: &[u8], xq: &[i8], xd: &[f32], xsd: &[f32]) -> f32 {
    let blocks = row.len() / ty.block_bytes();
    let groups = blocks * ty.block_elements() / GROUP;
    assert!(xq.len() >= groups * GROUP && xd.len() >= groups && xsd.len() >= groups);
    match ty {
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => dot_k(ty, row, xq, xd, xsd),
        GgmlType::Q8_0 | GgmlType::Q4_0 => dot_32(ty, row, xq, xd),
        _ => panic!("{} is a float type, not ggml blocks", ty.name()),
    }
}

/// A K-quant superblock unpacked for the integer dots: its 8 groups' codes (unsigned for
/// Q4_K/Q5_K, signed for Q6_K, whose int8 scales per 16 weights are `scales`), and per lane
/// the f32 factors `dl` (d·sc; Q6_K: d) and `ml` (dmin·m; unused for Q6_K).
struct Superblock {
    codes: [__m256i; 8],
    scales: [__m256i; 8],
    dl: __m256,
    ml: __m256,
    signed: bool,
}

/// Unpacks one superblock of `ty` (`blk` its bytes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack(ty: GgmlType, blk: &[u8]) -> Superblock {
    let mask = _mm256_set1_epi8(0x0F);
    let mut codes = [_mm256_setzero_si256(); 8];
    let mut scales = [_mm256_set1_epi16(1); 8];
    if ty == GgmlType::Q6K {
        assert!(blk.len() >= 210);
        let three = _mm256_set1_epi8(3);
        let off = _mm256_set1_epi8(32);
        let sc = &blk[192..208];
        // SAFETY: `blk` is one 210-byte block (ql 0..128, qh 128..192): every load reads 32
        // bytes inside it.
        unsafe {
            for n in 0..2 {
                let ql = blk.as_ptr().add(64 * n);
                let qh = load(blk.as_ptr().add(128 + 32 * n));
                let (l0, l1) = (load(ql), load(ql.add(32)));
                for k in 0..4 {
                    let g = 4 * n + k;
                    let nib = match k {
                        0 => _mm256_and_si256(l0, mask),
                        1 => _mm256_and_si256(l1, mask),
                        2 => _mm256_and_si256(_mm256_srli_epi16(l0, 4), mask),
                        _ => _mm256_and_si256(_mm256_srli_epi16(l1, 4), mask),
                    };
                    let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k as i32));
                    let h = _mm256_slli_epi16(_mm256_and_si256(h, three), 4);
                    codes[g] = _mm256_sub_epi8(_mm256_or_si256(nib, h), off);
                    scales[g] = _mm256_set_m128i(
                        _mm_set1_epi16(sc[2 * g + 1] as i8 as i16),
                        _mm_set1_epi16(sc[2 * g] as i8 as i16),
                    );
                }
            }
        }
        return Superblock {
            codes,
            scales,
            dl: _mm256_set1_ps(half_at(&blk[208..210])),
            ml: _mm256_setzero_ps(),
            signed: true,
        };
    }
    let five = ty == GgmlType::Q5K;
    assert!(blk.len() >= if five { 176 } else { 144 });
    let (d, dmin) = (half_at(&blk[0..2]), half_at(&blk[2..4]));
    let (sc, m) = scales_mins(&blk[4..16]);
    let one = _mm256_set1_epi8(1);
    // SAFETY: `blk` holds the block's bytes (qh at 16..48 for Q5_K, then 128 bytes of codes):
    // every load reads 32 bytes inside it; `sc` and `m` hold 8 bytes each.
    unsafe {
        let (qh, qs) = if five {
            (load(blk.as_ptr().add(16)), blk.as_ptr().add(48))
        } else {
            (_mm256_setzero_si256(), blk.as_ptr().add(16))
        };
        for j in 0..4 {
            let q = load(qs.add(32 * j));
            let mut lo = _mm256_and_si256(q, mask);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
            if five {
                let bit = |k: i32| {
                    let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(k));
                    _mm256_slli_epi16(_mm256_and_si256(h, one), 4)
                };
                lo = _mm256_or_si256(lo, bit(2 * j as i32));
                hi = _mm256_or_si256(hi, bit(2 * j as i32 + 1));
            }
            codes[2 * j] = lo;
            codes[2 * j + 1] = hi;
        }
        let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
            sc.as_ptr() as *const __m128i
        )));
        let m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
            m.as_ptr() as *const __m128i
        )));
        Superblock {
            codes,
            scales,
            dl: _mm256_mul_ps(_mm256_set1_ps(d), sc),
            ml: _mm256_mul_ps(_mm256_set1_ps(dmin), m),
            signed: false,
        }
    }
}

/// `acc` after one superblock `u` against one token's 256 activations `x` with their 8 group
/// scales `xd` and scaled sums `xsd` (the reference's per-lane operations).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn step(u: &Superblock, x: &[i8], xd: &[f32], xsd: &[f32], acc: __m256) -> __m256 {
    assert!(x.len() >= 256 && xd.len() >= 8 && xsd.len() >= 8);
    let ones16 = _mm256_set1_epi16(1);
    let mut v = [_mm256_setzero_si256(); 8];
    // SAFETY: the loads read x[32g..32g + 32] for g < 8 and 8 values of `xd`/`xsd` (asserted).
    unsafe {
        for (g, vg) in v.iter_mut().enumerate() {
            let xg = load(x.as_ptr().add(32 * g) as *const u8);
            *vg = if u.signed {
                _mm256_madd_epi16(signed_pairs(u.codes[g], xg), u.scales[g])
            } else {
                _mm256_madd_epi16(_mm256_maddubs_epi16(u.codes[g], xg), ones16)
            };
        }
        let t = _mm256_mul_ps(_mm256_loadu_ps(xd.as_ptr()), _mm256_cvtepi32_ps(sum8(&v)));
        let acc = _mm256_fmadd_ps(u.dl, t, acc);
        if u.signed {
            acc
        } else {
            _mm256_fnmadd_ps(u.ml, _mm256_loadu_ps(xsd.as_ptr()), acc)
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_k(ty: GgmlType, row: &[u8], xq: &[i8], xd: &[f32], xsd: &[f32]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, blk) in row.chunks_exact(ty.block_bytes()).enumerate() {
        let u = unpack(ty, blk);
        acc = step(&u, &xq[256 * b..], &xd[8 * b..], &xsd[8 * b..], acc);
    }
    hsum(acc)
}

/// One K-quant row dotted with every token of `acts` (`out [tokens]`), each superblock
/// unpacked once for all tokens; every value the bits [`dot_ggml`] gives for its token.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dots_ggml(ty: GgmlType, row: &[u8], acts: &QuantizedActs, out: &mut [f32]) {
    if !matches!(ty, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K) {
        for (t, o) in out.iter_mut().enumerate() {
            let (xq, xd, xsd) = acts.token(t);
            // SAFETY: the caller's promise (AVX2 + FMA + F16C) carries over.
            *o = unsafe { dot_ggml(ty, row, xq, xd, xsd) };
        }
        return;
    }
    let (cols, groups) = (acts.cols, acts.cols / GROUP);
    assert!(row.len() / ty.block_bytes() * 256 == cols && acts.tokens() >= out.len());
    ACC.with(|acc| {
        let mut acc = acc.borrow_mut();
        acc.clear();
        acc.resize(out.len(), [0.0; 8]);
        for (b, blk) in row.chunks_exact(ty.block_bytes()).enumerate() {
            let u = unpack(ty, blk);
            for (t, a) in acc.iter_mut().enumerate() {
                let x = &acts.qs[t * cols + 256 * b..];
                let g = t * groups + 8 * b;
                // SAFETY: `a` holds 8 f32.
                unsafe {
                    let v = step(
                        &u,
                        x,
                        &acts.d[g..],
                        &acts.sd[g..],
                        _mm256_loadu_ps(a.as_ptr()),
                    );
                    _mm256_storeu_ps(a.as_mut_ptr(), v);
                }
            }
        }
        for (o, a) in out.iter_mut().zip(acc.iter()) {
            // SAFETY: `a` holds 8 f32.
            *o = hsum(unsafe { _mm256_loadu_ps(a.as_ptr()) });
        }
    })
}

thread_local! {
    /// Each worker's per-token lane accumulators for [`dots_ggml`].
    static ACC: std::cell::RefCell<Vec<[f32; 8]>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Q8_0 and Q4_0 (blocks of 32): eight blocks per step, a partial last step lane by lane.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_32(ty: GgmlType, row: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let bytes = ty.block_bytes();
    let mask = _mm256_set1_epi8(0x0F);
    let eight = _mm256_set1_epi8(8);
    let ones16 = _mm256_set1_epi16(1);
    let groups = row.len() / bytes;
    let codes = |g: usize| -> __m256i {
        let p = &row[g * bytes + 2..(g + 1) * bytes];
        // SAFETY: `p` is the block's codes: 32 bytes (Q8_0) or 16 (Q4_0).
        unsafe {
            match ty {
                GgmlType::Q8_0 => load(p.as_ptr()),
                _ => {
                    let q = _mm_loadu_si128(p.as_ptr() as *const __m128i);
                    let q = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
                    _mm256_sub_epi8(_mm256_and_si256(q, mask), eight)
                }
            }
        }
    };
    let mut acc = _mm256_setzero_ps();
    let full = groups / 8 * 8;
    for g0 in (0..full).step_by(8) {
        let mut v = [_mm256_setzero_si256(); 8];
        let mut d = [0.0f32; 8];
        for k in 0..8 {
            let g = g0 + k;
            d[k] = half_at(&row[g * bytes..]);
            // SAFETY: group g's 32 activations are inside `xq` (asserted by the caller).
            let x = unsafe { load(xq.as_ptr().add(g * GROUP) as *const u8) };
            v[k] = _mm256_madd_epi16(signed_pairs(codes(g), x), ones16);
        }
        // SAFETY: `d` has 8 values and `xd` covers groups g0..g0 + 8.
        unsafe {
            let sumi = _mm256_cvtepi32_ps(sum8(&v));
            let t = _mm256_mul_ps(_mm256_loadu_ps(xd.as_ptr().add(g0)), sumi);
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(d.as_ptr()), t, acc);
        }
    }
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    for g in full..groups {
        let d = half_at(&row[g * bytes..]);
        // SAFETY: as above.
        let x = unsafe { load(xq.as_ptr().add(g * GROUP) as *const u8) };
        let p = _mm256_madd_epi16(signed_pairs(codes(g), x), ones16);
        let mut s = [0i32; 8];
        // SAFETY: `s` holds 8 i32.
        unsafe { _mm256_storeu_si256(s.as_mut_ptr() as *mut __m256i, p) };
        let sumi: i32 = s.iter().sum();
        lanes[g % 8] = d.mul_add(xd[g] * sumi as f32, lanes[g % 8]);
    }
    sum_lanes(&lanes)
}
