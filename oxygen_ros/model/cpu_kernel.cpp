// The backbone's layers of one decode step on a CPU, in one call: norms, Q/K/V, RoPE, the cache write, attention
// over each request's own slot, o_proj, MLP and residuals, for every request and every layer.
//
// Why: a decode step of a small-width backbone is hundreds of small tensor operators, each paying a dispatch and,
// in bfloat16, a library kernel's set-up; the arithmetic itself is a few MFLOP. One plain loop nest does it at
// the cost of the arithmetic. Built by `cpu_kernel.py` with the system C++ compiler for the machine it runs on.
//
// Numerics follow the eager model (`pi05.py` / `gemma.py`) operator by operator: every product accumulates in
// float32, and in bfloat16 every value the eager model stores as a bfloat16 tensor is rounded to bfloat16 at the
// same point (norm outputs, projections, each RoPE product and sum, attention weights before they multiply V,
// attention outputs, GELU, residual sums). Attention is a running softmax over blocks of 512 keys, as torch's CPU
// attention kernel runs it. What differs is only the order of float32 additions and the float32 exp/tanh
// approximations, so outputs match the eager model to float32 rounding, and bfloat16 outputs to one bfloat16
// rounding step where a float32 difference crosses one.
//
// Portable C++ with GCC vector extensions: 16 float32 lanes, which the compiler maps to AVX-512, AVX2 or SSE
// registers for the machine it builds for.

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include <unistd.h>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#define OXY_AMX 1
#endif

// AVX2 with FMA and no AVX-512: the 16-lane vectors below lower to pairs of 8-lane registers, and GCC keeps many of
// them on the stack between operations (a loop's accumulators, selects, shuffles across all 16 lanes). The hot
// parts have paths of their own on 8-lane registers there: `linear`, attention's scores, weights and weighted values
// (`scores16_avx2`, `exp_block`, `weigh_values_avx2`), `vexp_upto`, `vmax_of`, `hsum` and the float32 text head
// (`head_greedy_avx2`).
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>
#define OXY_AVX2 1
#endif

// AVX-512: fewer than 4 requests read the text head row by row (`head_greedy_rows`).
#ifdef __AVX512F__
#include <immintrin.h>
#endif

// AVX-512 BF16 (`vdpbf16ps`, without AMX tiles: AMD Zen 4 and later, Intel Cooper Lake): the bfloat16 text head
// multiplies pairs of bfloat16 elements straight from the head (`PairLanes`) instead of widening them to float32.
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define OXY_DPBF16 1
#endif

namespace {

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));
constexpr int L = 16;          // lanes
constexpr int KV_BLOCK = 512;  // keys per softmax block (torch's CPU attention kernel splits keys the same way)

// ---- element types ------------------------------------------------------------------------------------------

struct Bf16 {
    uint16_t bits;
};

inline float to_float(float x) { return x; }
inline float to_float(Bf16 x) {
    uint32_t u = static_cast<uint32_t>(x.bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint16_t bf16_bits(float f) {  // round to nearest even, NaN kept a (quiet) NaN
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (f != f) return 0x7FC0;
    return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

// `round(x)`: x as the storage type would hold it, back in float32 (the identity for float32).
template <typename T> inline float round_to(float x);
template <> inline float round_to<float>(float x) { return x; }
template <> inline float round_to<Bf16>(float x) { return to_float(Bf16{bf16_bits(x)}); }

template <typename T> inline void store(T* p, float x);
template <> inline void store<float>(float* p, float x) { *p = x; }
template <> inline void store<Bf16>(Bf16* p, float x) { p->bits = bf16_bits(x); }

inline vf vload(const float* p) {
    vf v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline vf vload(const Bf16* p) {
    vh h;
    std::memcpy(&h, p, sizeof h);
    return (vf)(__builtin_convertvector(h, vu) << 16);  // a vector cast reinterprets the bits
}
inline void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

template <typename T> inline vf vround(vf v);
template <> inline vf vround<float>(vf v) { return v; }
template <> inline vf vround<Bf16>(vf v) {
    vu u = (vu)v;
    vu r = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
    vi nan = v != v;
    return (vf)(nan ? vu{} + 0x7FC00000u : r);
}

// vround for values known to be finite (no NaN check)
template <typename T> inline vf vround_finite(vf v);
template <> inline vf vround_finite<float>(vf v) { return v; }
template <> inline vf vround_finite<Bf16>(vf v) {
    vu u = (vu)v;
    return (vf)((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u);
}

#ifdef OXY_AVX2
// On AVX2 a 16-lane vector is two 8-lane registers; `lo_hi` and `join` name them (no data moves once inlined), and
// `load8` loads 8 lanes of a row in either storage type.
inline void lo_hi(vf v, __m256& lo, __m256& hi) {
    std::memcpy(&lo, &v, sizeof lo);
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
}
inline vf join(__m256 lo, __m256 hi) {
    vf v;
    std::memcpy(&v, &lo, sizeof lo);
    std::memcpy(reinterpret_cast<char*>(&v) + sizeof lo, &hi, sizeof hi);
    return v;
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const Bf16* p) {  // widened as vload widens
    __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
#endif

inline float hsum(vf v) {  // halves folded onto each other: the sum ends in lane 0
#ifdef OXY_AVX2  // the same folds on 8-lane registers (GCC lowers the 16-lane shuffles through memory there)
    __m256 lo, hi;
    lo_hi(v, lo, hi);
    __m256 s = _mm256_add_ps(lo, hi);
    s = _mm256_add_ps(s, _mm256_permute2f128_ps(s, s, 0x01));
    s = _mm256_add_ps(s, _mm256_permute_ps(s, 0x4E));
    s = _mm256_add_ps(s, _mm256_permute_ps(s, 0xB1));
    return _mm256_cvtss_f32(s);
#else
    v += __builtin_shuffle(v, vi{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    v += __builtin_shuffle(v, vi{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    v += __builtin_shuffle(v, vi{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    v += __builtin_shuffle(v, vi{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    return v[0];
#endif
}

inline Bf16 to_bf16(Bf16 x) { return x; }
inline Bf16 to_bf16(float x) { return Bf16{bf16_bits(x)}; }

inline vf vsplat(float x) { return x - vf{}; }  // x in every lane, exactly (-0 too): one broadcast

inline float vmax_of(const float* x, int64_t n) {  // max of n values (-inf for none)
    const float ninf = -std::numeric_limits<float>::infinity();
    int64_t i = 0;
    float best = ninf;
#ifdef OXY_AVX2  // maxps(v, m) is `v > m ? v : m`, NaN included; GCC lowers the 16-lane select through memory
    __m256 m = _mm256_set1_ps(ninf);
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    for (int j = 0; j < 8; ++j) best = lanes[j] > best ? lanes[j] : best;
#else
    vf m = vsplat(ninf);
    for (; i + L <= n; i += L) {
        vf v = vload(x + i);
        m = v > m ? v : m;
    }
    for (int j = 0; j < L; ++j) best = m[j] > best ? m[j] : best;
#endif
    for (; i < n; ++i) best = x[i] > best ? x[i] : best;
    return best;
}

#ifdef OXY_AVX2
// vexp_upto's steps on one 8-lane register, each product and sum fused or not as GCC contracts the 16-lane code.
inline __m256 vexp8(__m256 x) {
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm256_blendv_ps(x, _mm256_set1_ps(-87.3f), under);
    __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic), magic);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// vround_finite on one 8-lane register.
template <typename T> inline __m256 round8_finite(__m256 v);
template <> inline __m256 round8_finite<float>(__m256 v) { return v; }
template <> inline __m256 round8_finite<Bf16>(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd);
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int32_t)0xFFFF0000u)));
}
#endif

// exp for float32 lanes x <= 88.7 (a softmax's scores minus their maximum, say): 2^n * e^r with |r| <= ln2/2 and
// a degree-6 polynomial (relative error ~2e-7); exactly 0 below the float32 normal range (so masked -inf scores
// weigh nothing).
inline vf vexp_upto(vf x) {
#ifdef OXY_AVX2
    __m256 lo, hi;
    lo_hi(x, lo, hi);
    return join(vexp8(lo), vexp8(hi));
#else
    const vf magic = vsplat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
    vi under = x < -87.3f;
    x = under ? vsplat(-87.3f) : x;
    vf n = (x * 1.44269504088896341f + magic) - magic;
    vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = vsplat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vf scale = (vf)((__builtin_convertvector(n, vi) + 127) << 23);
    return under ? vf{} : p * scale;
#endif
}

// ---- building blocks on one row (float32 working copies) -------------------------------------------------------

// out[o] = round(sum_i x[i] * w[o, i]) for `rows` rows of x (stride `in`) at once; w [out, in] in storage type T.
#ifdef OXY_AVX2
// linear on AVX2: each row's 16-lane accumulator held as two 8-lane registers (lanes 0-7, 8-15), so that 4 rows'
// accumulators stay in registers (as 16-lane vectors GCC kept them on the stack there), then folded as hsum folds
// them: the same sums in the same order as the 16-lane code.
template <typename T, int R>
inline void linear_rows_avx2(const float* x, int in, const T* w, int out, float* y) {
    for (int o = 0; o < out; ++o) {
        const T* wo = w + (size_t)o * in;
        __m256 lo[R], hi[R];
        float t[R];
        for (int k = 0; k < R; ++k) {
            lo[k] = hi[k] = _mm256_setzero_ps();
            t[k] = 0;
        }
        int i = 0;
        for (; i + L <= in; i += L) {
            __m256 wl = load8(wo + i), wh = load8(wo + i + 8);
            for (int k = 0; k < R; ++k) {
                lo[k] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (size_t)k * in + i), wl, lo[k]);
                hi[k] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (size_t)k * in + i + 8), wh, hi[k]);
            }
        }
        for (; i < in; ++i) {
            float wv = to_float(wo[i]);
            for (int k = 0; k < R; ++k) t[k] += x[(size_t)k * in + i] * wv;
        }
        for (int k = 0; k < R; ++k) y[(size_t)k * out + o] = round_to<T>(hsum(join(lo[k], hi[k])) + t[k]);
    }
}
#endif

template <typename T>
void linear(const float* x, int rows, int in, const T* w, int out, float* y) {
#ifdef OXY_AVX2
    int r = 0;
    for (; r + 4 <= rows; r += 4) linear_rows_avx2<T, 4>(x + (size_t)r * in, in, w, out, y + (size_t)r * out);
    for (; r < rows; ++r) linear_rows_avx2<T, 1>(x + (size_t)r * in, in, w, out, y + (size_t)r * out);
#else
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float* x0 = x + (size_t)r * in;
        for (int o = 0; o < out; ++o) {
            const T* wo = w + (size_t)o * in;
            vf a0{}, a1{}, a2{}, a3{};
            float t0 = 0, t1 = 0, t2 = 0, t3 = 0;
            int i = 0;
            for (; i + L <= in; i += L) {
                vf wv = vload(wo + i);
                a0 += vload(x0 + i) * wv;
                a1 += vload(x0 + in + i) * wv;
                a2 += vload(x0 + 2 * in + i) * wv;
                a3 += vload(x0 + 3 * in + i) * wv;
            }
            for (; i < in; ++i) {
                float wv = to_float(wo[i]);
                t0 += x0[i] * wv;
                t1 += x0[in + i] * wv;
                t2 += x0[2 * in + i] * wv;
                t3 += x0[3 * in + i] * wv;
            }
            y[(size_t)r * out + o] = round_to<T>(hsum(a0) + t0);
            y[(size_t)(r + 1) * out + o] = round_to<T>(hsum(a1) + t1);
            y[(size_t)(r + 2) * out + o] = round_to<T>(hsum(a2) + t2);
            y[(size_t)(r + 3) * out + o] = round_to<T>(hsum(a3) + t3);
        }
    }
    for (; r < rows; ++r) {
        const float* xr = x + (size_t)r * in;
        for (int o = 0; o < out; ++o) {
            const T* wo = w + (size_t)o * in;
            vf a{};
            float t = 0;
            int i = 0;
            for (; i + L <= in; i += L) a += vload(xr + i) * vload(wo + i);
            for (; i < in; ++i) t += xr[i] * to_float(wo[i]);
            y[(size_t)r * out + o] = round_to<T>(hsum(a) + t);
        }
    }
#endif
}

// Gemma RMSNorm of one row: round(x * rsqrt(mean(x^2) + eps) * (1 + w)).
template <typename T>
void rms_norm(const float* x, int width, const T* w, float eps, float* y) {
    float ss = 0;
    for (int i = 0; i < width; ++i) ss += x[i] * x[i];
    float r = 1.0f / std::sqrt(ss / width + eps);
    for (int i = 0; i < width; ++i) y[i] = round_to<T>(x[i] * r * (1.0f + to_float(w[i])));
}

// RoPE on one head vector (split halves), each product and the sum rounded as the eager tensors are.
template <typename T>
void rope(float* x, const float* cos, const float* sin, int d) {
    int half = d / 2;
    float tmp[1024];
    for (int j = 0; j < d; ++j) {
        float rot = j < half ? -x[j + half] : x[j - half];
        tmp[j] = round_to<T>(round_to<T>(x[j] * cos[j]) + round_to<T>(rot * sin[j]));
    }
    std::memcpy(x, tmp, sizeof(float) * d);
}

// The tanh-approximated GELU of float32 lanes: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline vf vgelu(vf x) {
    const float beta = 0.7978845608028654f;
    vf inner = (x + 0.044715f * (x * x * x)) * beta;
    inner = inner > 9.0f ? vsplat(9.0f) : inner;
    inner = inner < -9.0f ? vsplat(-9.0f) : inner;
    vf th = 1.0f - 2.0f / (vexp_upto(2.0f * inner) + 1.0f);  // |inner| <= 9: in vexp_upto's range
    return 0.5f * x * (1.0f + th);
}

// 16 x 16 transpose of rows r[0..15] in place, in four stages of two-input shuffles that each map to one
// non-destructive instruction on AVX-512 (unpack within 128-bit lanes, shuffle pairs within them, then 128-bit
// lanes twice): r[j] becomes column j.
inline vf shuffle(vf a, vf b, vi mask) { return __builtin_shuffle(a, b, mask); }

inline void transpose16(vf* r) {
    constexpr vi unpack_lo = {0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29};
    constexpr vi unpack_hi = {2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31};
    constexpr vi pairs_lo = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    constexpr vi pairs_hi = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
    constexpr vi lanes_even = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    constexpr vi lanes_odd = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    vf t[L], u[L];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = shuffle(r[2 * i], r[2 * i + 1], unpack_lo);
        t[2 * i + 1] = shuffle(r[2 * i], r[2 * i + 1], unpack_hi);
    }
    for (int i = 0; i < 4; ++i) {
        u[4 * i] = shuffle(t[4 * i], t[4 * i + 2], pairs_lo);
        u[4 * i + 1] = shuffle(t[4 * i], t[4 * i + 2], pairs_hi);
        u[4 * i + 2] = shuffle(t[4 * i + 1], t[4 * i + 3], pairs_lo);
        u[4 * i + 3] = shuffle(t[4 * i + 1], t[4 * i + 3], pairs_hi);
    }
    for (int i = 0; i < 4; ++i) {
        t[i] = shuffle(u[i], u[i + 4], lanes_even);
        t[i + 4] = shuffle(u[i], u[i + 4], lanes_odd);
        t[i + 8] = shuffle(u[i + 8], u[i + 12], lanes_even);
        t[i + 12] = shuffle(u[i + 8], u[i + 12], lanes_odd);
    }
    for (int i = 0; i < 8; ++i) {
        r[i] = shuffle(t[i], t[i + 8], lanes_even);
        r[i + 8] = shuffle(t[i], t[i + 8], lanes_odd);
    }
}

// Scores of HN query rows q [HN, d] against the 16 keys k [16, d] (d a multiple of 16): each 16 x 16 tile of the
// keys is transposed so that one lane holds one key, then every query row accumulates over the tile's dimensions.
// Written to out[h * stride + 0..15] as score * scale + mask.
template <typename T, int HN>
inline void scores16(const float* q, int d, const T* k, vf mask, float scale, float* out, int64_t stride) {
    vf acc[HN] = {};
    for (int c = 0; c < d; c += L) {
        vf cols[L];
        for (int j = 0; j < L; ++j) cols[j] = vload(k + (int64_t)j * d + c);
        transpose16(cols);  // cols[j] = dimension c + j of the 16 keys
        for (int h = 0; h < HN; ++h) {
            const float* qh = q + (size_t)h * d + c;
            for (int j = 0; j < L; ++j) acc[h] += qh[j] * cols[j];
        }
    }
    for (int h = 0; h < HN; ++h) vstore(out + (size_t)h * stride, acc[h] * scale + mask);
}

#ifdef OXY_AVX2
// 8 x 8 transpose of rows r[0..7] in place (unpacks and shuffles within 128-bit lanes, then one exchange of lanes):
// r[j] becomes column j.
inline void transpose8(__m256* r) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

// scores16 on AVX2: each half of the 16 keys as 8 x 8 tiles transposed so that one lane holds one key; every query
// row accumulates over a tile's dimensions as scores16 does, in the same order, with the same fused multiply-adds.
template <typename T, int HN>
inline void scores16_avx2(const float* q, int d, const T* k, const float* mask, float scale, float* out,
                          int64_t stride) {
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int half = 0; half < 2; ++half) {
        const T* kh = k + (int64_t)half * 8 * d;
        __m256 acc[HN];
        for (int h = 0; h < HN; ++h) acc[h] = _mm256_setzero_ps();
        for (int c = 0; c < d; c += 8) {
            __m256 cols[8];
            for (int j = 0; j < 8; ++j) cols[j] = load8(kh + (int64_t)j * d + c);
            transpose8(cols);  // cols[j] = dimension c + j of the 8 keys
            for (int h = 0; h < HN; ++h) {
                const float* qh = q + (size_t)h * d + c;
                for (int j = 0; j < 8; ++j) acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(qh[j]), cols[j], acc[h]);
            }
        }
        __m256 m = _mm256_loadu_ps(mask + half * 8);
        for (int h = 0; h < HN; ++h)
            _mm256_storeu_ps(out + (size_t)h * stride + half * 8, _mm256_add_ps(_mm256_mul_ps(acc[h], vscale), m));
    }
}
#endif

// f(n) with n an std::integral_constant of the head count hn (1 to 8; 8 for more): the count as a constant, so that
// a per-head loop's accumulators stay in registers.
template <typename F>
inline void with_heads(int hn, F f) {
    switch (hn) {
        case 1: return f(std::integral_constant<int, 1>{});
        case 2: return f(std::integral_constant<int, 2>{});
        case 3: return f(std::integral_constant<int, 3>{});
        case 4: return f(std::integral_constant<int, 4>{});
        case 5: return f(std::integral_constant<int, 5>{});
        case 6: return f(std::integral_constant<int, 6>{});
        case 7: return f(std::integral_constant<int, 7>{});
        default: return f(std::integral_constant<int, 8>{});
    }
}

// scores16 (scores16_avx2 on AVX2) for hn query rows, with the 16 keys' mask at `mask`.
template <typename T>
inline void scores16_n(int hn, const float* q, int d, const T* k, const float* mask, float scale, float* out,
                       int64_t stride) {
#ifdef OXY_AVX2
    with_heads(hn, [&](auto n) { scores16_avx2<T, decltype(n)::value>(q, d, k, mask, scale, out, stride); });
#else
    with_heads(hn, [&](auto n) { scores16<T, decltype(n)::value>(q, d, k, vload(mask), scale, out, stride); });
#endif
}

// out[h, j..j+15] = out[h, j..j+15] * rescale[h] + sum over keys t in [b0, b1) of p[h * stride + t] * v[t, j..j+15]
// for HN heads: each value row is read once for all of them.
template <typename T, int HN>
inline void weigh_values(const float* p, int64_t stride, const T* v, int d, int j, int64_t b0, int64_t b1,
                         const float* rescale, float* out) {
    vf acc[HN] = {};
    for (int64_t t = b0; t < b1; ++t) {
        vf row = vload(v + t * d + j);
        for (int h = 0; h < HN; ++h) acc[h] += p[(size_t)h * stride + t] * row;
    }
    for (int h = 0; h < HN; ++h) {
        float* o = out + (size_t)h * d + j;
        vstore(o, vload(o) * rescale[h] + acc[h]);
    }
}

#ifdef OXY_AVX2
// weigh_values on AVX2: each 8-lane half of the 16 value columns on its own, so HN accumulators fit the 16 registers
// (two halves at once spilled them beside every multiply-add); the same sums in the same order.
template <typename T, int HN>
inline void weigh_values_avx2(const float* p, int64_t stride, const T* v, int d, int j, int64_t b0, int64_t b1,
                              const float* rescale, float* out) {
    for (int half = j; half < j + L; half += 8) {
        __m256 acc[HN];
        for (int h = 0; h < HN; ++h) acc[h] = _mm256_setzero_ps();
        for (int64_t t = b0; t < b1; ++t) {
            __m256 row = load8(v + t * d + half);
            for (int h = 0; h < HN; ++h)
                acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(p[(size_t)h * stride + t]), row, acc[h]);
        }
        for (int h = 0; h < HN; ++h) {
            float* o = out + (size_t)h * d + half;
            _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(o), _mm256_set1_ps(rescale[h]), acc[h]));
        }
    }
}
#endif

template <typename T>
inline void weigh_values_n(int hn, const float* p, int64_t stride, const T* v, int d, int j, int64_t b0, int64_t b1,
                           const float* rescale, float* out) {
#ifdef OXY_AVX2
    with_heads(hn, [&](auto n) { weigh_values_avx2<T, decltype(n)::value>(p, stride, v, d, j, b0, b1, rescale, out); });
#else
    with_heads(hn, [&](auto n) { weigh_values<T, decltype(n)::value>(p, stride, v, d, j, b0, b1, rescale, out); });
#endif
}

// A block of a softmax's scores sc [n] (n a multiple of 16) becomes their weights exp(sc - max), rounded as T
// stores them; returns the weights' float32 sum before rounding (16 lanes' sums, folded as hsum folds them).
template <typename T>
inline float exp_block(float* sc, int64_t n, float max) {
#ifdef OXY_AVX2  // the same steps on 8-lane registers: as 16-lane vectors GCC moved them through the stack there
    __m256 vmax = _mm256_set1_ps(max), lo = _mm256_setzero_ps(), hi = lo;
    for (int64_t t = 0; t < n; t += L) {
        __m256 el = vexp8(_mm256_sub_ps(_mm256_loadu_ps(sc + t), vmax));
        __m256 eh = vexp8(_mm256_sub_ps(_mm256_loadu_ps(sc + t + 8), vmax));
        lo = _mm256_add_ps(lo, el);
        hi = _mm256_add_ps(hi, eh);
        _mm256_storeu_ps(sc + t, round8_finite<T>(el));
        _mm256_storeu_ps(sc + t + 8, round8_finite<T>(eh));
    }
    return hsum(join(lo, hi));
#else
    vf vmax = vsplat(max), vsum{};
    for (int64_t t = 0; t < n; t += L) {
        vf e = vexp_upto(vload(sc + t) - vmax);
        vsum += e;
        vstore(sc + t, vround_finite<T>(e));
    }
    return hsum(vsum);
#endif
}

// Attention of `group` query rows q [group, d] (float32, already rounded) over the first `span` keys of one K/V
// head (k, v [span, d] rows at stride d), with additive mask [stride] (0 or -inf; -inf past the span). scores is
// scratch of [group, stride] floats, stride = span rounded up to 16, so every pass runs whole vectors (the padding
// scores -inf, weights 0). Writes out [group, d] rounded.
template <typename T>
void attend(const float* q, int group, int d, const T* k, const T* v, const float* mask, int64_t span,
            int64_t stride, float scale, float* scores, float* out) {
    // scores[h, s] = q_h . k_s * scale + mask_s
    if (d % L == 0) {
        thread_local std::vector<T> tail;  // the last keys, padded with zero rows to a whole tile
        int64_t whole = span / L * L;
        if (whole < span) {
            tail.assign((size_t)L * d, T{});
            std::memcpy(tail.data(), k + whole * d, sizeof(T) * (size_t)(span - whole) * d);
        }
        for (int h0 = 0; h0 < group; h0 += 8) {
            int hn = group - h0 < 8 ? group - h0 : 8;
            for (int64_t s = 0; s < stride; s += L)
                scores16_n<T>(hn, q + (size_t)h0 * d, d, s < whole ? k + s * d : tail.data(), mask + s,
                              scale, scores + (size_t)h0 * stride + s, stride);
        }
    } else {
        for (int64_t s = 0; s < stride; ++s) {
            for (int h = 0; h < group; ++h) {
                float a = 0;
                for (int j = 0; j < d && s < span; ++j) a += q[(size_t)h * d + j] * to_float(k[s * d + j]);
                scores[(size_t)h * stride + s] = a * scale + mask[s];
            }
        }
    }
    // running softmax over key blocks, weights rounded before they multiply V: per block, every head's weights,
    // then one pass over the block's values for all heads (each value row read once)
    const float ninf = -std::numeric_limits<float>::infinity();
    float run_max[64], run_sum[64], rescale[64];
    for (int h = 0; h < group; ++h) {
        run_max[h] = ninf;
        run_sum[h] = 0;
    }
    for (size_t j = 0; j < (size_t)group * d; ++j) out[j] = 0;  // the running weighted sums of values
    for (int64_t b0 = 0; b0 < span; b0 += KV_BLOCK) {
        int64_t b1 = b0 + KV_BLOCK < span ? b0 + KV_BLOCK : span;
        int64_t b1v = b1 == span ? stride : b1;  // whole vectors: blocks start at multiples of 512
        bool any = false;
        for (int h = 0; h < group; ++h) {
            float* sc = scores + (size_t)h * stride;
            float block_max = vmax_of(sc + b0, b1v - b0);
            float new_max = block_max > run_max[h] ? block_max : run_max[h];
            if (new_max == ninf) {  // nothing visible to this head yet: its weights in this block are all zero
                for (int64_t t = b0; t < b1v; ++t) sc[t] = 0;
                rescale[h] = 1;
                continue;
            }
            any = true;
            float block_sum = exp_block<T>(sc + b0, b1v - b0, new_max);
            rescale[h] = run_max[h] == ninf ? 0.0f : std::exp(run_max[h] - new_max);
            run_sum[h] = block_sum + rescale[h] * run_sum[h];
            run_max[h] = new_max;
        }
        if (!any) continue;
        int j = 0;
        for (; j + L <= d; j += L) {
            for (int h0 = 0; h0 < group; h0 += 8) {
                int hn = group - h0 < 8 ? group - h0 : 8;
                weigh_values_n<T>(hn, scores + (size_t)h0 * stride, stride, v, d, j, b0, b1, rescale + h0,
                                  out + (size_t)h0 * d);
            }
        }
        for (; j < d; ++j) {
            for (int h = 0; h < group; ++h) {
                float a = 0;
                for (int64_t t = b0; t < b1; ++t) a += scores[(size_t)h * stride + t] * to_float(v[t * d + j]);
                float* o = out + (size_t)h * d + j;
                *o = *o * rescale[h] + a;
            }
        }
    }
    for (int h = 0; h < group; ++h) {
        float inv = 1.0f / run_sum[h];
        for (int j = 0; j < d; ++j) out[(size_t)h * d + j] = round_to<T>(out[(size_t)h * d + j] * inv);
    }
}

struct Shapes {
    int batch, width, heads, kv_heads, head_dim, mlp_dim, depth;
    float eps;
    int64_t num_slots, max_len, span;
};

template <typename T>
int decode_layers(const Shapes& sh, T* x, const void* const* weights, T* cache_k, T* cache_v, bool* valid,
                  const int64_t* slots, const int64_t* cache_index, const T* cos, const T* sin) {
    const int B = sh.batch, W = sh.width, H = sh.heads, KV = sh.kv_heads, D = sh.head_dim, M = sh.mlp_dim;
    const int G = H / KV;
    const int64_t span = sh.span, stride = (span + L - 1) / L * L;
    if (D > 1024 || H % KV != 0 || H / KV > 64) return 1;
    thread_local std::vector<float> buf;
    size_t need = (size_t)B * (2 * W + 2 * H * D + 2 * KV * D + 3 * M + 2 * D) + (size_t)B * stride +
                  (size_t)G * stride;
    if (buf.size() < need) buf.resize(need);
    float* xs = buf.data();                 // [B, W] residual stream
    float* hn = xs + (size_t)B * W;         // [B, W] normed
    float* qb = hn + (size_t)B * W;         // [B, H*D]
    float* ab = qb + (size_t)B * H * D;     // [B, H*D] attention output
    float* kb = ab + (size_t)B * H * D;     // [B, KV*D]
    float* vb = kb + (size_t)B * KV * D;    // [B, KV*D]
    float* gb = vb + (size_t)B * KV * D;    // [B, M]
    float* ub = gb + (size_t)B * M;         // [B, M]
    float* mb = ub + (size_t)B * M;         // [B, M]
    float* cs = mb + (size_t)B * M;         // [B, D] cos
    float* sn = cs + (size_t)B * D;         // [B, D] sin
    float* masks = sn + (size_t)B * D;      // [B, stride]
    float* scores = masks + (size_t)B * stride;  // [G, stride]

    const float ninf = -std::numeric_limits<float>::infinity();
    if (span > sh.max_len) return 2;
    for (int b = 0; b < B; ++b) {
        int64_t slot = slots[b], ci = cache_index[b];
        if (slot < 0 || slot >= sh.num_slots || ci < 0 || ci >= span) return 2;
    }
    for (int b = 0; b < B; ++b) {
        int64_t slot = slots[b], ci = cache_index[b];
        valid[slot * sh.max_len + ci] = true;
        const bool* vrow = valid + slot * sh.max_len;
        for (int64_t s = 0; s < stride; ++s) masks[(size_t)b * stride + s] = (s < span && vrow[s] && s <= ci) ? 0.0f : ninf;
        for (int j = 0; j < D; ++j) {
            cs[(size_t)b * D + j] = to_float(cos[(size_t)b * D + j]);
            sn[(size_t)b * D + j] = to_float(sin[(size_t)b * D + j]);
        }
    }
    for (size_t i = 0; i < (size_t)B * W; ++i) xs[i] = to_float(x[i]);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    const int64_t slot_stride = (int64_t)KV * sh.max_len * D;
    const int64_t layer_stride = sh.num_slots * slot_stride;

    for (int l = 0; l < sh.depth; ++l) {
        const void* const* lw = weights + (size_t)l * 9;
        const T* in_norm = static_cast<const T*>(lw[0]);
        const T* wq = static_cast<const T*>(lw[1]);
        const T* wk = static_cast<const T*>(lw[2]);
        const T* wv = static_cast<const T*>(lw[3]);
        const T* wo = static_cast<const T*>(lw[4]);
        const T* post_norm = static_cast<const T*>(lw[5]);
        const T* wg = static_cast<const T*>(lw[6]);
        const T* wu = static_cast<const T*>(lw[7]);
        const T* wd = static_cast<const T*>(lw[8]);
        T* lk = cache_k + l * layer_stride;
        T* lv = cache_v + l * layer_stride;

        for (int b = 0; b < B; ++b) rms_norm(xs + (size_t)b * W, W, in_norm, sh.eps, hn + (size_t)b * W);
        linear(hn, B, W, wq, H * D, qb);
        linear(hn, B, W, wk, KV * D, kb);
        linear(hn, B, W, wv, KV * D, vb);
        for (int b = 0; b < B; ++b) {
            const float* c = cs + (size_t)b * D;
            const float* s = sn + (size_t)b * D;
            for (int h = 0; h < H; ++h) rope<T>(qb + ((size_t)b * H + h) * D, c, s, D);
            for (int h = 0; h < KV; ++h) rope<T>(kb + ((size_t)b * KV + h) * D, c, s, D);
            T* slot_k = lk + slots[b] * slot_stride;
            T* slot_v = lv + slots[b] * slot_stride;
            for (int h = 0; h < KV; ++h) {
                T* kd = slot_k + ((int64_t)h * sh.max_len + cache_index[b]) * D;
                T* vd = slot_v + ((int64_t)h * sh.max_len + cache_index[b]) * D;
                for (int j = 0; j < D; ++j) {
                    store(kd + j, kb[((size_t)b * KV + h) * D + j]);
                    store(vd + j, vb[((size_t)b * KV + h) * D + j]);
                }
            }
            for (int h = 0; h < KV; ++h)
                attend<T>(qb + ((size_t)b * H + (size_t)h * G) * D, G, D, slot_k + (int64_t)h * sh.max_len * D,
                          slot_v + (int64_t)h * sh.max_len * D, masks + (size_t)b * stride, span, stride, scale, scores,
                          ab + ((size_t)b * H + (size_t)h * G) * D);
        }
        linear(ab, B, H * D, wo, W, hn);
        for (size_t i = 0; i < (size_t)B * W; ++i) xs[i] = round_to<T>(xs[i] + hn[i]);
        for (int b = 0; b < B; ++b) rms_norm(xs + (size_t)b * W, W, post_norm, sh.eps, hn + (size_t)b * W);
        linear(hn, B, W, wg, M, gb);
        linear(hn, B, W, wu, M, ub);
        size_t n = (size_t)B * M, i = 0;
        for (; i + L <= n; i += L) {
            vf g = vround<T>(vgelu(vload(gb + i)));
            vstore(mb + i, vround<T>(g * vload(ub + i)));
        }
        for (; i < n; ++i) {
            float g = round_to<T>(vgelu(vsplat(gb[i]))[0]);
            mb[i] = round_to<T>(g * ub[i]);
        }
        linear(mb, B, M, wd, W, hn);
        for (size_t j = 0; j < (size_t)B * W; ++j) xs[j] = round_to<T>(xs[j] + hn[j]);
    }
    for (size_t i = 0; i < (size_t)B * W; ++i) store(x + i, xs[i]);
    return 0;
}

// The whole decode step before the text head, in one call: the fed tokens' embeddings (each element times `scale`,
// rounded to T as the eager product is), their RoPE rows looked up by position in tables [rope_rows, D] (made
// once from the eager tables), every layer (`decode_layers`) and the final norm into out [B, W]. Returns
// decode_layers' status, or 3 for a token or a position out of range (then nothing is written).
template <typename T>
int decode_step(const Shapes& sh, const int64_t* tokens, const T* embed, int64_t vocab, float scale,
                const void* const* weights, const T* final_norm, T* cache_k, T* cache_v, bool* valid,
                const int64_t* slots, const int64_t* cache_index, const int64_t* positions, const T* rope_cos,
                const T* rope_sin, int64_t rope_rows, T* out) {
    const int B = sh.batch, W = sh.width, D = sh.head_dim;
    for (int b = 0; b < B; ++b)
        if (tokens[b] < 0 || tokens[b] >= vocab || positions[b] < 0 || positions[b] >= rope_rows) return 3;
    thread_local std::vector<T> x, cs, sn;
    thread_local std::vector<float> row, normed;
    x.resize((size_t)B * W);
    cs.resize((size_t)B * D);
    sn.resize((size_t)B * D);
    row.resize(W);
    normed.resize(W);
    for (int b = 0; b < B; ++b) {
        const T* e = embed + tokens[b] * (int64_t)W;
        for (int j = 0; j < W; ++j) store(&x[(size_t)b * W + j], to_float(e[j]) * scale);
        std::memcpy(&cs[(size_t)b * D], rope_cos + positions[b] * D, sizeof(T) * D);
        std::memcpy(&sn[(size_t)b * D], rope_sin + positions[b] * D, sizeof(T) * D);
    }
    int status = decode_layers<T>(sh, x.data(), weights, cache_k, cache_v, valid, slots, cache_index, cs.data(),
                                  sn.data());
    if (status != 0) return status;
    for (int b = 0; b < B; ++b) {
        for (int j = 0; j < W; ++j) row[j] = to_float(x[(size_t)b * W + j]);
        rms_norm<T>(row.data(), W, final_norm, sh.eps, normed.data());
        for (int j = 0; j < W; ++j) store(out + (size_t)b * W + j, normed[j]);
    }
    return 0;
}

// ---- greedy selection ---------------------------------------------------------------------------------------

// The first maximum of one row of logits, compared as their bits read as signed integers of the same width
// (`sampling.greedy_tokens` says why that is the float order wherever the maximum is positive); -1 when the
// maximum is not positive, for the caller to search as floats. Block maxima of GREEDY_BLOCK keys, then the first
// block holding the maximum is searched.
template <typename K>
int64_t first_max(const K* row, int64_t n) {
    typedef K vk __attribute__((vector_size(64)));
    constexpr int N = 64 / sizeof(K);
    constexpr int64_t BLOCK = 1024;
    K best = std::numeric_limits<K>::min();
    int64_t best_start = 0, best_end = 0;
    for (int64_t b0 = 0; b0 < n; b0 += BLOCK) {
        int64_t b1 = b0 + BLOCK < n ? b0 + BLOCK : n;
        vk m = vk{} + std::numeric_limits<K>::min();
        int64_t i = b0;
        for (; i + N <= b1; i += N) {
            vk v;
            std::memcpy(&v, row + i, sizeof v);
            m = v > m ? v : m;
        }
        K block_max = std::numeric_limits<K>::min();
        for (int j = 0; j < N; ++j) block_max = m[j] > block_max ? m[j] : block_max;
        for (; i < b1; ++i) block_max = row[i] > block_max ? row[i] : block_max;
        if (block_max > best) {
            best = block_max;
            best_start = b0;
            best_end = b1;
        }
    }
    if (best <= 0) return -1;
    for (int64_t i = best_start; i < best_end; ++i)
        if (row[i] == best) return i;
    return -1;
}


// ---- the text head and the greedy choice in one pass --------------------------------------------------------

// A greedy step needs each request's first maximum over h . W[v] for every vocabulary row v, not the [B, vocab]
// logits: the head is computed a block of vocabulary rows at a time and each block is folded into a running
// maximum per request while it is in registers, so the logits never reach memory (writing and reading back
// [50, 257152] of them costs more than the products do at a small width). A running maximum and the row it came
// from, compared with `>` in vocabulary order, keep the first maximum. In bfloat16 each product sum is rounded
// to bfloat16 before it is compared, as the eager logits are stored, so ties the rounding makes resolve to the
// first row as they do there. Vector lanes across the vocabulary (`head_greedy_lanes`, any CPU; bfloat16 on
// AVX-512 BF16's pair dot products, `head_greedy_pairs`; float32 on AVX2 without AVX-512, `head_greedy_avx2`); AMX
// tiles with lanes across requests, bfloat16 directly (`head_greedy_amx`) and float32 screened on a bfloat16 copy
// of the head, then chosen in float32 (`head_screened_amx`).

// Worker threads kept between calls: starting a thread and joining it cost about 70 us a call here, 5% of a
// one-request text head on two threads. A worker sleeps on a condition variable (it never spins: the core is the
// control path's between calls) and runs its share when a call hands one out. One call at a time has them; a
// call that finds them busy (another Python thread's) starts threads of its own. Never destroyed (workers may
// still wait on it at exit); a process forked from one that has workers starts with none and makes its own.
class Workers {
  public:
    static Workers* get() {
        static std::atomic<Workers*> current{nullptr};
        Workers* w = current.load();
        if (w == nullptr || w->pid_ != getpid()) {  // first use, or a forked child: the parent's threads are gone
            static std::mutex making;
            std::lock_guard<std::mutex> hold(making);
            w = current.load();
            if (w == nullptr || w->pid_ != getpid()) {
                w = new Workers;
                current.store(w);
            }
        }
        return w;
    }

    bool try_acquire() { return !busy_.exchange(true); }
    void release() { busy_.store(false); }

    // job(ctx, t) for t = 1 .. threads - 1 on the workers (started as needed), then `wait` for them. Only between
    // try_acquire and release.
    void start(int threads, void (*job)(void*, int), void* ctx) {
        std::lock_guard<std::mutex> lock(mutex_);
        for (; started_ < threads - 1; ++started_)  // each takes the round below
            std::thread([this, id = started_ + 1, seen = round_] { serve(id, seen); }).detach();
        job_ = job;
        ctx_ = ctx;
        wanted_ = threads;
        left_ = threads - 1;
        ++round_;
        wake_.notify_all();
    }

    void wait() {
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [this] { return left_ == 0; });
    }

  private:
    void serve(int id, uint64_t seen) {
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            wake_.wait(lock, [&] { return round_ != seen; });
            seen = round_;
            if (id >= wanted_) continue;  // a call with fewer threads than there are workers
            void (*job)(void*, int) = job_;
            void* ctx = ctx_;
            lock.unlock();
            job(ctx, id);
            lock.lock();
            if (--left_ == 0) done_.notify_one();
        }
    }

    pid_t pid_ = getpid();
    std::atomic<bool> busy_{false};
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    int started_ = 0;  // workers 1 .. started_ exist
    void (*job_)(void*, int) = nullptr;
    void* ctx_ = nullptr;
    int wanted_ = 0, left_ = 0;
    uint64_t round_ = 0;
};

// `work(t)` for t = 0 .. threads - 1, t = 0 on the calling thread; returns when all are done.
template <typename F>
void on_threads(int threads, F work) {
    if (threads <= 1) {
        work(0);
        return;
    }
    Workers* workers = Workers::get();
    if (!workers->try_acquire()) {  // another call has the workers
        std::vector<std::thread> pool;
        for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
        work(0);
        for (std::thread& th : pool) th.join();
        return;
    }
    workers->start(threads, [](void* ctx, int t) { (*static_cast<F*>(ctx))(t); }, &work);
    work(0);
    workers->wait();
    workers->release();
}

// Vector lanes across the vocabulary (the path without matrix tiles): 32 rows of the head at a time are transposed
// into wt [K][32] float32 (16 x 16 tiles in registers), then G requests at a time accumulate their 32 sums as two
// vectors, each weight vector reused by every request of the group; no lane is padding whatever the batch. Each
// request keeps a running maximum per lane (its vocabulary rows v with v % 16 == lane) and the row it came from;
// `lane_argmax` reduces the lanes at the end.
constexpr int HEAD_COLS = 32;  // vocabulary rows transposed at a time
constexpr int HEAD_GROUP = 12;  // requests a register block (24 accumulators)

template <typename T>
void transpose_block(const T* w, int64_t K, int64_t rows, float* wt) {  // rows <= 32 of w [.., K] -> wt [K][32]
    for (int half = 0; half < 2; ++half) {
        int64_t r0 = half * L;
        int64_t c = 0;
        for (; c + L <= K; c += L) {
            vf cols[L];
            for (int j = 0; j < L; ++j) cols[j] = r0 + j < rows ? vload(w + (r0 + j) * K + c) : vf{};
            transpose16(cols);
            for (int j = 0; j < L; ++j) vstore(wt + (c + j) * HEAD_COLS + r0, cols[j]);
        }
        for (; c < K; ++c)
            for (int j = 0; j < L; ++j) wt[c * HEAD_COLS + r0 + j] = r0 + j < rows ? to_float(w[(r0 + j) * K + c]) : 0.0f;
    }
}

// Folds one request's sums x for block rows half * 16 + lane (v the block's first row, `rows` of them real) into
// its running maximum per lane, each sum first rounded as the head's dtype T stores a logit. The lower 16 rows
// come first and only a strictly larger value replaces a lane's maximum, so a tie keeps the earlier row.
template <typename T>
inline void fold_lanes(vf x, int half, int64_t rows, int32_t v, vf& best, vi& index) {
    const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const vf ninf = vsplat(-std::numeric_limits<float>::infinity());
    vi row = lane + half * L;
    x = vround_finite<T>(x);
    if (rows < HEAD_COLS) x = row < (int32_t)rows ? x : ninf;  // rows past the head's end never win
    vi greater = x > best;
    best = greater ? x : best;
    index = greater ? row + v : index;
}

// out(g, half, acc[g][half]) for each request g of a group. `Staged`, for a sink that may call out (all vector
// registers are the caller's to save): from a copy in memory, in a function of its own, so that the accumulators
// need not live in memory while they add (they did, spilled beside every multiply); else inline.
template <int G, typename Out>
__attribute__((noinline)) void staged_out(const vf (&acc)[G][2], Out& out) {
    vf sums[G][2];
    std::memcpy(sums, acc, sizeof sums);
    for (int g = 0; g < G; ++g)
        for (int half = 0; half < 2; ++half) out(g, half, sums[g][half]);
}

template <bool Staged, int G, typename Out>
inline void hand_out(const vf (&acc)[G][2], Out& out) {
    if constexpr (Staged) {
        staged_out<G>(acc, out);
    } else {
        for (int g = 0; g < G; ++g)
            for (int half = 0; half < 2; ++half) out(g, half, acc[g][half]);
    }
}

// G requests' sums against a block (hf [G][K] float32, wt [K][32]): out(g, half, sums of rows half * 16 + lane).
template <bool Staged, int G, typename Out>
inline void head_group(const float* wt, int64_t K, const float* hf, Out&& out) {
    vf acc[G][2] = {};
    for (int64_t k = 0; k < K; ++k) {
        vf w0 = vload(wt + k * HEAD_COLS), w1 = vload(wt + k * HEAD_COLS + L);
        for (int g = 0; g < G; ++g) {
            vf hb = vsplat(hf[g * K + k]);
            acc[g][0] += hb * w0;
            acc[g][1] += hb * w1;
        }
    }
    hand_out<Staged, G>(acc, out);
}

// The vector path's two ways of laying out and multiplying a block: `FloatLanes` widens the head's rows (float32
// or bfloat16) and the requests' states to float32; `PairLanes` (AVX-512 BF16) keeps bfloat16 pairs. `units(K)`
// is a row's length in the layout's elements, `pack` transposes a block of up to 32 rows into [units][32], `group`
// multiplies G requests' states [G][units] with it and hands out their float32 sums; `Round` is the dtype the
// eager logits are stored in.
template <typename T>
struct FloatLanes {
    using Unit = float;
    using Round = T;
    static int64_t units(int64_t K) { return K; }
    static void pack(const T* w, int64_t K, int64_t rows, float* wt) { transpose_block(w, K, rows, wt); }
    template <bool Staged, int G, typename Out>
    static void group(const float* wt, int64_t U, const float* h, Out&& out) {
        head_group<Staged, G>(wt, U, h, out);
    }
};

#ifdef OXY_DPBF16
// A bfloat16 head on AVX-512 BF16: a row's width as K / 2 pairs of bfloat16, one pair a 32-bit unit; `pack` puts
// each pair of 16 rows in one vector (16 x 16 transposes of the units), and `group` broadcasts each request's pair
// against the block's two vectors with `vdpbf16ps` (a float32 lane adds the pair's two exact products), so the
// head is never widened to float32. The instruction takes subnormal inputs and sums as zero, which moves a logit
// only where it is below 2^-126 in magnitude.
struct PairLanes {
    using Unit = uint32_t;
    using Round = Bf16;
    static int64_t units(int64_t K) { return K / 2; }
    static void pack(const Bf16* w, int64_t K, int64_t rows, uint32_t* wt) {
        const int64_t U = K / 2;
        for (int half = 0; half < 2; ++half) {
            int64_t r0 = half * L, u = 0;
            for (; u + L <= U; u += L) {
                vf cols[L];  // 16 units of 16 rows, as float bit patterns (a transpose only moves bits)
                for (int j = 0; j < L; ++j) {
                    cols[j] = vf{};
                    if (r0 + j < rows) std::memcpy(&cols[j], w + (r0 + j) * K + 2 * u, sizeof(vf));
                }
                transpose16(cols);
                for (int j = 0; j < L; ++j) std::memcpy(wt + (u + j) * HEAD_COLS + r0, &cols[j], sizeof(vf));
            }
            for (; u < U; ++u)
                for (int j = 0; j < L; ++j) {
                    uint32_t pair = 0;
                    if (r0 + j < rows) std::memcpy(&pair, w + (r0 + j) * K + 2 * u, 4);
                    wt[u * HEAD_COLS + r0 + j] = pair;
                }
        }
    }
    template <bool Staged, int G, typename Out>
    static void group(const uint32_t* wt, int64_t U, const uint32_t* h, Out&& out) {
        __m512 acc[G][2];
        for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm512_setzero_ps();
        for (int64_t u = 0; u < U; ++u) {
            __m512bh w0 = (__m512bh)_mm512_loadu_si512(wt + u * HEAD_COLS);
            __m512bh w1 = (__m512bh)_mm512_loadu_si512(wt + u * HEAD_COLS + L);
            for (int g = 0; g < G; ++g) {
                __m512bh hb = (__m512bh)_mm512_set1_epi32((int32_t)h[g * U + u]);
                acc[g][0] = _mm512_dpbf16_ps(acc[g][0], w0, hb);
                acc[g][1] = _mm512_dpbf16_ps(acc[g][1], w1, hb);
            }
        }
        vf sums[G][2];
        for (int g = 0; g < G; ++g) sums[g][0] = (vf)acc[g][0], sums[g][1] = (vf)acc[g][1];
        hand_out<Staged, G>(sums, out);
    }
};
#endif

// The block of HEAD_COLS rows after next (from row v of the head w [.., K], within rows before v1) into cache while
// this one computes: the head streams from memory or L3. Always inlined: as a call it cost the pair head 4-5%.
template <typename T>
__attribute__((always_inline)) inline void prefetch_ahead(const T* w, int64_t K, int64_t v, int64_t v1) {
    if (v + 3 * HEAD_COLS > v1) return;
    const char* ahead = reinterpret_cast<const char*>(w + (v + 2 * HEAD_COLS) * K);
    for (int64_t b = 0; b < HEAD_COLS * K * (int64_t)sizeof(T); b += 64) __builtin_prefetch(ahead + b, 0, 3);
}

// Rows v0 .. v1 - 1 of the head w [V, K] against every request's state h [B][units] laid out for path P:
// sink(b, v, rows, half, x) for each block of `rows` rows from v, x request b's sums of rows v + half * 16 + lane
// (`Staged`: a sink that may call out, `hand_out`).
template <typename P, bool Staged = false, typename T, typename Sink>
void head_range_lanes(const typename P::Unit* h, int64_t B, int64_t K, const T* w, int64_t v0, int64_t v1,
                      Sink&& sink) {
    const int64_t U = P::units(K);
    std::vector<typename P::Unit> wt(U * HEAD_COLS);
    for (int64_t v = v0; v < v1; v += HEAD_COLS) {
        int64_t rows = v1 - v < HEAD_COLS ? v1 - v : HEAD_COLS;
        prefetch_ahead(w, K, v, v1);
        P::pack(w + v * K, K, rows, wt.data());
        int64_t b = 0;
        auto out = [&](int g, int half, vf x) __attribute__((always_inline)) { sink(b + g, v, rows, half, x); };
        for (; b + HEAD_GROUP <= B; b += HEAD_GROUP)
            P::template group<Staged, HEAD_GROUP>(wt.data(), U, h + b * U, out);
        switch (B - b) {  // the last requests, a smaller block (compile-time sizes keep it in registers)
#define OXY_GROUP(n) \
    case n: P::template group<Staged, n>(wt.data(), U, h + b * U, out); break;
            OXY_GROUP(1) OXY_GROUP(2) OXY_GROUP(3) OXY_GROUP(4) OXY_GROUP(5) OXY_GROUP(6)
            OXY_GROUP(7) OXY_GROUP(8) OXY_GROUP(9) OXY_GROUP(10) OXY_GROUP(11)
#undef OXY_GROUP
            default: break;
        }
    }
}

// The greedy choice on path P: each request's sums folded into its running maxima (`fold_lanes`).
template <typename P, typename T>
void head_range_greedy(const typename P::Unit* h, int64_t B, int64_t K, const T* w, int64_t v0, int64_t v1, vf* best,
                       vi* index) {
    head_range_lanes<P>(h, B, K, w, v0, v1, [&](int64_t b, int64_t v, int64_t rows, int half, vf x) {
        fold_lanes<typename P::Round>(x, half, rows, (int32_t)v, best[b], index[b]);
    });
}

// The first maximum across one request's lanes: the largest value, and of the lanes holding it the lowest row.
inline void lane_argmax(vf best, vi index, float* value, int32_t* row) {
    float m = best[0];
    for (int i = 1; i < L; ++i) m = best[i] > m ? best[i] : m;
    int32_t r = std::numeric_limits<int32_t>::max();
    for (int i = 0; i < L; ++i)
        if (best[i] == m && index[i] < r) r = index[i];
    *value = m;
    *row = r;
}

// Thread t's rows [*v0, *v1) of a vocabulary of V rows split over `threads` in whole blocks of `block` rows.
inline void thread_rows(int64_t V, int64_t block, int threads, int t, int64_t* v0, int64_t* v1) {
    int64_t blocks = (V + block - 1) / block;
    *v0 = blocks * t / threads * block;
    *v1 = blocks * (t + 1) / threads * block;
    *v1 = *v1 < V ? *v1 : V;
}

// The vocabulary split over `threads` in whole blocks, `range(v0, v1, best, index)` searching each (B running
// maxima per lane and their rows), then the ranges' maxima merged.
template <typename Range>
void head_greedy_over(int64_t B, int64_t V, int threads, int64_t* tokens, Range range) {
    std::vector<vf> best(threads * B);
    std::vector<vi> index(threads * B);
    auto work = [&](int t) {
        int64_t v0, v1;
        thread_rows(V, HEAD_COLS, threads, t, &v0, &v1);
        const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        for (int64_t b = 0; b < B; ++b) {  // a lane that never sees a finite value keeps its range's first row
            best[t * B + b] = vsplat(-std::numeric_limits<float>::infinity());
            index[t * B + b] = lane + (int32_t)v0;
        }
        if (v0 < v1) range(v0, v1, best.data() + t * B, index.data() + t * B);
    };
    on_threads(threads, work);
    for (int64_t b = 0; b < B; ++b) {  // ranges in vocabulary order: a later one wins only when strictly larger
        float value;
        int32_t row;
        lane_argmax(best[b], index[b], &value, &row);
        for (int t = 1; t < threads; ++t) {
            float v;
            int32_t r;
            lane_argmax(best[t * B + b], index[t * B + b], &v, &r);
            if (v > value) {
                value = v;
                row = r;
            }
        }
        tokens[b] = row;
    }
}

template <typename T>
void head_greedy_lanes(const T* h, int64_t B, int64_t K, const T* w, int64_t V, int threads, int64_t* tokens) {
    std::vector<float> hf(B * K);
    for (int64_t i = 0; i < B * K; ++i) hf[i] = to_float(h[i]);
    head_greedy_over(B, V, threads, tokens, [&](int64_t v0, int64_t v1, vf* best, vi* index) {
        head_range_greedy<FloatLanes<T>>(hf.data(), B, K, w, v0, v1, best, index);
    });
}

#ifdef OXY_DPBF16
void head_greedy_pairs(const Bf16* h, int64_t B, int64_t K, const Bf16* w, int64_t V, int threads, int64_t* tokens) {
    std::vector<uint32_t> hp(B * K / 2);  // K even: each request's state as K / 2 pairs
    std::memcpy(hp.data(), h, B * K * sizeof(Bf16));
    head_greedy_over(B, V, threads, tokens, [&](int64_t v0, int64_t v1, vf* best, vi* index) {
        head_range_greedy<PairLanes>(hp.data(), B, K, w, v0, v1, best, index);
    });
}
#endif

constexpr int64_t HEAD_ROWS_BELOW = 4;  // cpu_kernel.HEAD_GREEDY_MIN_ROWS: fewer requests go row by row

// Whether this build runs a head of this dtype and width row by row (`head_greedy_rows`, below; on AVX2 the float32
// head `head_greedy_avx2`, which reads rows as they lie at any batch).
inline bool rows_run(bool bf16, int64_t width) {
#ifdef __AVX512F__
    if (!bf16) return width % L == 0;
#endif
#ifdef OXY_DPBF16
    if (bf16) return width % (2 * L) == 0;
#endif
#ifdef OXY_AVX2  // `head_greedy_avx2` reads the head's rows as they lie at any batch
    if (!bf16) return width % 8 == 0;
#endif
    (void)bf16, (void)width;
    return false;
}

#ifdef __AVX512F__
// Few requests (below HEAD_ROWS_BELOW) on AVX-512: no transposes, whose cost the requests no longer share. Each
// of 16 vocabulary rows is multiplied with a request's state along the width into a vector of partial sums
// (`row_dot`), and `row_sums` folds the 16 vectors into one whose lane i is row i's sum; the head is read once,
// row after row, as a matrix-vector product reads it. float32 for widths of whole 16s; bfloat16 on AVX-512
// BF16's pair dot products for widths of whole 32s.

inline vf row_sums(const vf* a) {  // lane i = the sum of a[i]'s lanes (pairs of vectors halved, four times)
    constexpr vi lo1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    constexpr vi hi1 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    constexpr vi lo2 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    constexpr vi hi2 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    constexpr vi lo3 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    constexpr vi hi3 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
    constexpr vi lo4 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    constexpr vi hi4 = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    vf b[8], c[4], d[2];
    for (int j = 0; j < 8; ++j) b[j] = shuffle(a[2 * j], a[2 * j + 1], lo1) + shuffle(a[2 * j], a[2 * j + 1], hi1);
    for (int j = 0; j < 4; ++j) c[j] = shuffle(b[2 * j], b[2 * j + 1], lo2) + shuffle(b[2 * j], b[2 * j + 1], hi2);
    for (int j = 0; j < 2; ++j) d[j] = shuffle(c[2 * j], c[2 * j + 1], lo3) + shuffle(c[2 * j], c[2 * j + 1], hi3);
    return shuffle(d[0], d[1], lo4) + shuffle(d[0], d[1], hi4);
}

inline vf row_dot(const float* row, const float* h, int64_t K) {  // fused multiply-adds, one rounding each
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < K; c += L) acc = _mm512_fmadd_ps(_mm512_loadu_ps(row + c), _mm512_loadu_ps(h + c), acc);
    return (vf)acc;
}

#ifdef OXY_DPBF16
inline vf row_dot(const Bf16* row, const Bf16* h, int64_t K) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < K; c += 2 * L)
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(row + c), (__m512bh)_mm512_loadu_si512(h + c));
    return (vf)acc;
}
#endif

template <typename T>
void head_greedy_rows(const T* h, int64_t B, int64_t K, const T* w, int64_t V, int threads, int64_t* tokens) {
    head_greedy_over(B, V, threads, tokens, [&](int64_t v0, int64_t v1, vf* best, vi* index) {
        for (int64_t v = v0; v < v1; v += HEAD_COLS) {
            // no prefetch ahead (as the transposing paths have): the rows stream in order, which the hardware
            // prefetcher follows; on Zen 4 the prefetches made one request 1.4x slower (docs/benchmarks.md)
            int64_t rows = v1 - v < HEAD_COLS ? v1 - v : HEAD_COLS;
            for (int half = 0; half * L < rows; ++half)
                for (int64_t b = 0; b < B; ++b) {
                    vf a[L];
                    for (int i = 0; i < L; ++i)  // rows past the head's end: zero here, masked by fold_lanes
                        a[i] = half * L + i < rows ? row_dot(w + (v + half * L + i) * K, h + b * K, K) : vf{};
                    fold_lanes<T>(row_sums(a), half, rows, (int32_t)v, best[b], index[b]);
                }
        }
    });
}
#endif

#ifdef OXY_AVX2
// The float32 head on AVX2 (K a multiple of 8): 8 vocabulary rows at a time, read straight from the head; each
// request's 8 dot products accumulate one per register over the width, then fold into one register whose lane i
// is row i's sum; each request keeps a running maximum per lane and its row, as `head_group` does. The 8 rows
// (2 KB at width 64) stay in L1 while every request passes over them, so the head is read from memory once.
inline __m256 fold8(const __m256* a) {  // lane i = the sum of a[i]'s lanes
    __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// Rows v0 .. v1 - 1: best/index [B][8] get each request's per-lane maximum and its row.
void head_range_avx2(const float* h, int64_t B, int64_t K, const float* w, int64_t v0, int64_t v1, float* best,
                     int32_t* index) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t b = 0; b < B; ++b) {
        _mm256_storeu_ps(best + b * 8, ninf);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(index + b * 8),
                            _mm256_add_epi32(lane, _mm256_set1_epi32((int32_t)v0)));
    }
    for (int64_t v = v0; v < v1; v += 8) {
        int64_t rows = v1 - v < 8 ? v1 - v : 8;
        const float* r[8];
        for (int i = 0; i < 8; ++i) r[i] = w + (v + (i < rows ? i : 0)) * K;  // past the end: row v, masked below
        __m256 row = _mm256_castsi256_ps(_mm256_add_epi32(lane, _mm256_set1_epi32((int32_t)v)));
        __m256 inside = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)rows), lane));
        for (int64_t b = 0; b < B; ++b) {
            const float* hb = h + b * K;
            __m256 acc[8];
            for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
            for (int64_t c = 0; c < K; c += 8) {
                __m256 hc = _mm256_loadu_ps(hb + c);
                for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(hc, _mm256_loadu_ps(r[i] + c), acc[i]);
            }
            __m256 x = _mm256_blendv_ps(ninf, fold8(acc), inside);  // rows past the end never win
            __m256 kept = _mm256_loadu_ps(best + b * 8);
            __m256 greater = _mm256_cmp_ps(x, kept, _CMP_GT_OQ);  // strictly: a lane keeps its earlier row on a tie
            _mm256_storeu_ps(best + b * 8, _mm256_blendv_ps(kept, x, greater));
            __m256 at = _mm256_loadu_ps(reinterpret_cast<const float*>(index + b * 8));
            _mm256_storeu_ps(reinterpret_cast<float*>(index + b * 8), _mm256_blendv_ps(at, row, greater));
        }
    }
}

void head_greedy_avx2(const float* h, int64_t B, int64_t K, const float* w, int64_t V, int threads,
                      int64_t* tokens) {
    std::vector<float> best(threads * B * 8, -std::numeric_limits<float>::infinity());
    std::vector<int32_t> index(threads * B * 8, std::numeric_limits<int32_t>::max());
    on_threads(threads, [&](int t) {
        int64_t v0, v1;
        thread_rows(V, 8, threads, t, &v0, &v1);
        if (v0 < v1) head_range_avx2(h, B, K, w, v0, v1, best.data() + t * B * 8, index.data() + t * B * 8);
    });
    for (int64_t b = 0; b < B; ++b) {  // the largest value; of the lanes and ranges holding it, the lowest row
        float value = -std::numeric_limits<float>::infinity();
        int32_t row = std::numeric_limits<int32_t>::max();
        for (int t = 0; t < threads; ++t)
            for (int i = 0; i < 8; ++i) {
                float x = best[(t * B + b) * 8 + i];
                int32_t r = index[(t * B + b) * 8 + i];
                if (x > value || (x == value && r < row)) {
                    value = x;
                    row = r;
                }
            }
        tokens[b] = row;
    }
}
#endif

// The intra-op threads a head pass splits its vocabulary over: at least 1, and 1 when there are fewer whole tiles.
inline int usable_threads(int threads, int64_t vocab) { return threads < 1 || vocab / 16 < threads ? 1 : threads; }

// The euclidean norm of x [n], summed in double.
inline double norm2(const float* x, int64_t n) {
    double ss = 0;
    for (int64_t k = 0; k < n; ++k) ss += (double)x[k] * x[k];
    return std::sqrt(ss);
}

// x as a float32 no smaller than x.
inline float float_up(double x) {
    float f = (float)x;
    return (double)f < x ? std::nextafter(f, std::numeric_limits<float>::infinity()) : f;
}

#if defined(OXY_AMX) || defined(OXY_DPBF16)
// ---- float32 heads: screened on bfloat16 copies (tiles or pair dot products), chosen in float32 ----
//
// A float32 head's products cost 4-6x the bfloat16 tiles' on vector lanes (2x AVX-512 BF16's pair dot products'),
// and a greedy step needs only the largest. The tiles (or the pair dot products) compute every row's sum from
// bfloat16 copies of h and the head (`approx`); |approx - exact|
// <= bound(b, r) = c ||h_b|| ||w_r|| + a_b, where `exact` is the float32 sum the vector-lane path computes:
// rounding each factor to bfloat16 moves a product by at most 2^-7 + 2^-16 of |h_i w_i|, both float32 sums of K
// terms are off by at most K 2^-24 of sum |h_i w_i|, which is at most ||h|| ||w|| (Cauchy-Schwarz); c is 1.5 times
// their sum, the margin covering the norms' and the bounds' own float32 rounding; a_b covers the tiles' flushing of
// values below float32's normal range. AVX-512 BF16's `vdpbf16ps` is specified as the tiles' `tdpbf16ps` is (each
// of a pair's two products added with its own rounding, subnormal inputs and results taken as zero), so one bound
// holds for both. A row can be the exact maximum only if approx + bound is at least every row's approx - bound,
// so each request keeps the rows that pass that test against the running maximum of lower bounds, and computes
// the survivors' exact sums: the first exact maximum among them is the vector-lane path's answer, bit for bit. A
// request with more than SCREEN_KEEP survivors (a head of many equal rows, say) is searched on vector lanes
// instead.
constexpr size_t SCREEN_KEEP = 256;

struct Candidate {
    float upper;
    int32_t row;
};

struct Kept {  // one request's rows that passed the screen so far, in vocabulary order
    std::vector<Candidate> rows;
    bool too_many = false;
};

inline void keep(Kept& k, Candidate c, float lower) {
    if (k.too_many) return;
    if (k.rows.size() == 2 * SCREEN_KEEP) {  // drop the rows the lower bound has passed since they were kept
        size_t n = 0;
        for (const Candidate& x : k.rows)
            if (x.upper >= lower) k.rows[n++] = x;
        k.rows.resize(n);
        if (n > SCREEN_KEEP) {
            k.too_many = true;
            k.rows.clear();
            return;
        }
    }
    k.rows.push_back(c);
}

// The float32 sum the vector-lane path computes for one row (in order over the width, one fused multiply-add a
// term where the build has them, as there).
inline float dot_in_order(const float* a, const float* b, int64_t K) {
    float s = 0;
    for (int64_t k = 0; k < K; ++k) s += a[k] * b[k];
    return s;
}

// The bound's scales for requests with norms h_norms [B] against a head whose largest row norm is max_norm:
// hs[b] (times a row's norm) and as[b] (the flushing term), and gs[b], the largest bound of any row.
inline void screen_scales(int64_t K, const float* h_norms, int64_t B, float max_norm, float* hs, float* as,
                          float* gs) {
    const double rel = 1.5 * (std::ldexp(1.0, -7) + std::ldexp(1.0, -16) + 2.0 * (double)K * std::ldexp(1.0, -24));
    for (int64_t b = 0; b < B; ++b) {
        hs[b] = float_up(rel * h_norms[b]);
        as[b] = float_up(4.0 * (double)K * std::ldexp(1.0, -126) * ((double)h_norms[b] + max_norm + 1.0));
        gs[b] = float_up((double)max_norm * hs[b] + as[b]);
    }
}

// A request's first exact maximum among its kept rows whose upper bound reaches `lower` (in vocabulary order):
// *row = -1 for none, -2 when it kept too many; *value its exact sum.
inline void exact_best(const float* hb, const float* w, int64_t K, const Kept& k, float lower, float* value,
                       int32_t* row) {
    float best = -std::numeric_limits<float>::infinity();
    int32_t at = -1;
    for (const Candidate& x : k.rows) {
        if (x.upper < lower) continue;
        float e = dot_in_order(hb, w + (int64_t)x.row * K, K);
        if (at < 0 || e > best) {
            best = e;
            at = x.row;
        }
    }
    *value = best;
    *row = k.too_many ? -2 : at;
}

// Merges the threads' answers [threads][B] in vocabulary order (a later range wins only when strictly larger),
// then rows from `tail` to V (those no range covered), into tokens; -1 for a request any range gave up on.
inline void merge_screened(const float* values, const int32_t* rows, int threads, int64_t B, const float* h,
                           const float* w, int64_t K, int64_t tail, int64_t V, int64_t* tokens) {
    for (int64_t b = 0; b < B; ++b) {
        float value = 0;
        int32_t row = -1;
        for (int t = 0; t < threads && row != -2; ++t) {
            int32_t r = rows[t * B + b];
            if (r == -2 || (r >= 0 && (row < 0 || values[t * B + b] > value))) {
                value = values[t * B + b];
                row = r;
            }
        }
        for (int64_t v = tail; v < V && row != -2; ++v) {
            float e = dot_in_order(h + b * K, w + v * K, K);
            if (row < 0 || e > value) {
                value = e;
                row = (int32_t)v;
            }
        }
        tokens[b] = row == -2 ? -1 : row;
    }
}

#endif

#ifdef OXY_DPBF16
inline float hmax(vf v) {  // the largest lane (halves folded onto each other, as in hsum)
    for (vi half : {vi{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7},
                    vi{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11},
                    vi{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}}) {
        vf other = __builtin_shuffle(v, half);
        v = other > v ? other : v;
    }
    return v[0] > v[1] ? v[0] : v[1];
}

// Screens the sums x of rows r0 + lane (`n` of them real) for one request against its running lower bound, keeping
// the rows whose upper bound reaches it (the bound's scales hs, as as in `screen_scales`).
__attribute__((noinline)) void screen_rows(vf x, int64_t r0, int64_t n, const float* norms, float hs, float as,
                                           float& lower, Kept& kept) {
    alignas(64) float nr[L] = {};
    for (int i = 0; i < L && i < n; ++i) nr[i] = norms[r0 + i];
    vf bound = vload(nr) * vsplat(hs) + vsplat(as);
    vf lo = x - bound, up = x + bound;  // rows past the end: -inf both
    float m = hmax(lo);
    lower = m > lower ? m : lower;
    vi pass = up >= vsplat(lower);
    for (int i = 0; i < L && i < n; ++i)
        if (pass[i]) keep(kept, Candidate{up[i], (int32_t)(r0 + i)}, lower);
}

// A float32 head screened on AVX-512 BF16's pair dot products (`PairLanes` over the bfloat16 copy wb, with h
// rounded to nearest bfloat16 as the copy is), then chosen in float32, as on tiles; lanes hold vocabulary rows, so
// each request keeps one running lower bound. Every request of h [B, K] (K even); tokens[b] as head_screened_pass.
void head_screened_pairs(const float* h, int64_t B, int64_t K, const float* w, const Bf16* wb, const float* norms,
                         float max_norm, const float* h_norms, int64_t V, int threads, int64_t* tokens) {
    const int64_t U = K / 2;
    std::vector<uint32_t> hp(B * U);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t u = 0; u < U; ++u)
            hp[b * U + u] = (uint32_t)bf16_bits(h[b * K + 2 * u]) | (uint32_t)bf16_bits(h[b * K + 2 * u + 1]) << 16;
    std::vector<float> hs(B), as(B), gs(B), values(threads * B);
    std::vector<int32_t> rows(threads * B);
    screen_scales(K, h_norms, B, max_norm, hs.data(), as.data(), gs.data());
    on_threads(threads, [&](int t) {
        std::vector<float> lower(B, -std::numeric_limits<float>::infinity());
        std::vector<Kept> kept(B);
        int64_t v0, v1;
        thread_rows(V, HEAD_COLS, threads, t, &v0, &v1);
        const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        const vf ninf = vsplat(-std::numeric_limits<float>::infinity());
        if (v0 < v1)
            head_range_lanes<PairLanes, true>(hp.data(), B, K, wb, v0, v1, [&](int64_t b, int64_t v, int64_t n,
                                                                                 int half, vf x)
                                                                                 __attribute__((always_inline)) {
                if (n < HEAD_COLS) x = lane < (int32_t)(n - half * L) ? x : ninf;  // rows past the head's end
                // no row of the half-block can pass unless its largest sum plus the largest bound does
                if (hmax(x) + gs[b] >= lower[b])
                    screen_rows(x, v + half * L, n - half * L, norms, hs[b], as[b], lower[b], kept[b]);
            });
        for (int64_t b = 0; b < B; ++b)  // the survivors' exact sums, in vocabulary order
            exact_best(h + b * K, w, K, kept[b], lower[b], &values[t * B + b], &rows[t * B + b]);
    });
    merge_screened(values.data(), rows.data(), threads, B, h, w, K, V, V, tokens);
}
#endif

#ifdef OXY_AMX
// AMX: bfloat16 tiles of 16 vocabulary rows x 32 of the width (read straight from the head, a row at a time)
// times the requests' hidden states in the tiles' pair-interleaved layout, accumulated in float32 tiles of 16
// vocabulary rows x 16 requests. Linux hands out the tile registers only on request, once per process.
constexpr int HEAD_LANES = 64;  // AMX: requests per pass (4 vectors); larger batches take several passes

bool amx_granted() {
    static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return granted;
}

struct alignas(64) TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

// Up to 16 * NB rows of h [B, K] (float32 rounded to nearest bfloat16, or bfloat16) in the tiles' layout:
// [K / 32][NB][16 pairs][16 requests][2], requests past B zero.
template <typename T>
std::vector<Bf16> pair_tiles(const T* h, int64_t B, int64_t K, int NB) {
    std::vector<Bf16> hp(K / 32 * NB * 512, Bf16{0});
    for (int64_t b = 0; b < B; ++b)
        for (int64_t k = 0; k < K; ++k)
            hp[((k / 32 * NB + b / 16) * 16 + k % 32 / 2) * 32 + b % 16 * 2 + k % 2] = to_bf16(h[b * K + k]);
    return hp;
}

// For each block of 16 vocabulary rows v in [v0, v1) (a multiple of 16 apart): c[j][r][i] = the float32 sum over
// the width of request 16 j + i's row of hp times head row v + r (w [V, K] bfloat16), then `block(v, c)`. Sets up
// the tiles on the calling thread and puts back whatever it had configured (a library's kernel) after. Tiles
// 0..NB-1 accumulate, 4 holds the head's block, 5 and 6 the requests'.
template <int NB, typename F>
void tile_blocks(const Bf16* hp, const Bf16* w, int64_t K, int64_t v0, int64_t v1, F&& block) {
    TileConfig saved, cfg{};
    _tile_storeconfig(&saved);
    cfg.palette = 1;
    for (int t = 0; t < 7; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    alignas(64) float c[NB][16][16];
    const int64_t stride = K * (int64_t)sizeof(Bf16);
    const char* end = reinterpret_cast<const char*>(w + v1 * K);
    for (int64_t v = v0; v < v1; v += 16) {
        // the head's rows 8 blocks ahead into L1: after a step's layers have streamed the K/V through the caches
        // the hardware prefetcher alone left the tile loads waiting (5.8 against 7.4-7.8 ms, layers and head of a
        // bfloat16 batch-50 step at the real vocabulary, docs/benchmarks.md)
        const char* ahead = reinterpret_cast<const char*>(w + (v + 8 * 16) * K);
        for (int64_t b = 0; b < 16 * stride && ahead + b < end; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
        _tile_zero(0);
        if (NB > 1) _tile_zero(1);
        if (NB > 2) _tile_zero(2);
        if (NB > 3) _tile_zero(3);
        for (int64_t kc = 0; kc < K / 32; ++kc) {
            const Bf16* b = hp + kc * NB * 512;
            _tile_loadd(4, w + v * K + kc * 32, stride);
            _tile_loadd(5, b, 64);
            _tile_dpbf16ps(0, 4, 5);
            if (NB > 1) {
                _tile_loadd(6, b + 512, 64);
                _tile_dpbf16ps(1, 4, 6);
            }
            if (NB > 2) {
                _tile_loadd(5, b + 1024, 64);
                _tile_dpbf16ps(2, 4, 5);
            }
            if (NB > 3) {
                _tile_loadd(6, b + 1536, 64);
                _tile_dpbf16ps(3, 4, 6);
            }
        }
        _tile_stored(0, c[0], 64);
        if (NB > 1) _tile_stored(1, c[1], 64);
        if (NB > 2) _tile_stored(2, c[2], 64);
        if (NB > 3) _tile_stored(3, c[3], 64);
        block(v, c);
    }
    if (saved.palette)
        _tile_loadconfig(&saved);
    else
        _tile_release();
}

// Whether any lane of any of the NB vectors is set.
template <int NB>
inline bool any_lane(const vi* set) {
    vi any = set[0];
    for (int j = 1; j < NB; ++j) any |= set[j];
    for (int i = 0; i < L; ++i)
        if (any[i]) return true;
    return false;
}

// The largest of a block's 16 rows of c[j] (per request lane).
inline vf block_max(const float (*cj)[16]) {
    vf m = vload(cj[0]);
    for (int r = 1; r < 16; ++r) {
        vf x = vload(cj[r]);
        m = x > m ? x : m;
    }
    return m;
}

// ---- bfloat16 heads: the greedy choice straight from the tiles ----

struct Best {  // per request of a pass: the running maximum and its vocabulary row
    vf value[HEAD_LANES / L];
    vi index[HEAD_LANES / L];
};

inline void fold(Best& best, int j, vf x, int32_t v) {
    x = vround_finite<Bf16>(x);
    vi greater = x > best.value[j];
    best.value[j] = greater ? x : best.value[j];
    best.index[j] = greater ? vi{} + v : best.index[j];
}

// One pass over the head on matrix tiles for up to HEAD_LANES requests: rows h [B, K], head [V, K], each
// request's first maximum into tokens. The vocabulary's whole tiles are split into `threads` contiguous ranges,
// one per thread, merged in order; the rows after the last whole tile (fewer than 16) are plain dot products.
template <int NB>
void head_greedy_pass(const Bf16* h, int64_t B, int64_t K, const Bf16* w, int64_t V, int threads,
                      int64_t* tokens) {
    std::vector<Best> bests(threads);
    for (Best& b : bests)
        for (int j = 0; j < HEAD_LANES / L; ++j) {
            b.value[j] = vsplat(-std::numeric_limits<float>::infinity());
            b.index[j] = vi{};
        }
    std::vector<Bf16> hp = pair_tiles(h, B, K, NB);
    int64_t tiles = V / 16;
    auto work = [&](int t) {
        Best& best = bests[t];
        tile_blocks<NB>(hp.data(), w, K, tiles * t / threads * 16, tiles * (t + 1) / threads * 16,
                        [&](int64_t v, const float (*c)[16][16]) {
            // A rounded value beats the running maximum only if the raw one does (rounding is monotonic), and
            // past the first blocks few do: the block's raw maxima screen it, the fold runs only when one passes.
            vi beats[NB];
            for (int j = 0; j < NB; ++j) beats[j] = block_max(c[j]) > best.value[j];
            if (!any_lane<NB>(beats)) return;
            for (int r = 0; r < 16; ++r)
                for (int j = 0; j < NB; ++j) fold(best, j, vload(c[j][r]), (int32_t)(v + r));
        });
    };
    on_threads(threads, work);
    for (int64_t b = 0; b < B; ++b) {
        int j = (int)(b / L), lane = (int)(b % L);
        float value = bests[0].value[j][lane];
        int32_t index = bests[0].index[j][lane];
        for (int t = 1; t < threads; ++t)
            if (bests[t].value[j][lane] > value) {
                value = bests[t].value[j][lane];
                index = bests[t].index[j][lane];
            }
        for (int64_t v = tiles * 16; v < V; ++v) {
            float sum = 0;
            for (int64_t k = 0; k < K; ++k) sum += to_float(h[b * K + k]) * to_float(w[v * K + k]);
            float x = round_to<Bf16>(sum);
            if (x > value) {
                value = x;
                index = (int32_t)v;
            }
        }
        tokens[b] = index;
    }
}

struct Screen {  // one thread's, per request of a pass
    vf lower[HEAD_LANES / L];  // the running maximum of lower bounds; +inf in lanes past the batch (never pass)
    Kept kept[HEAD_LANES];
};

// Every request of h [B, K] (B <= HEAD_LANES) through the float32 head w [V, K] with its bfloat16 copy wb and its
// rows' norms; tokens[b] = the first exact maximum, or -1 for a request with too many survivors.
template <int NB>
void head_screened_pass(const float* h, int64_t B, int64_t K, const float* w, const Bf16* wb, const float* norms,
                        float max_norm, const float* h_norms, int64_t V, int threads, int64_t* tokens) {
    alignas(64) float hs[HEAD_LANES] = {}, as[HEAD_LANES] = {}, gs[HEAD_LANES] = {};
    screen_scales(K, h_norms, B, max_norm, hs, as, gs);
    vf H[NB], A[NB], gate[NB];
    for (int j = 0; j < NB; ++j) {
        H[j] = vload(hs + 16 * j);
        A[j] = vload(as + 16 * j);
        gate[j] = vload(gs + 16 * j);
    }
    std::vector<Bf16> hp = pair_tiles(h, B, K, NB);
    std::vector<Screen> screens(threads);
    std::vector<float> values(threads * B);
    std::vector<int32_t> rows(threads * B);
    int64_t tiles = V / 16;
    auto work = [&](int t) {
        Screen& s = screens[t];
        for (int j = 0; j < NB; ++j)
            for (int i = 0; i < L; ++i)
                s.lower[j][i] = 16 * j + i < B ? -std::numeric_limits<float>::infinity()
                                               : std::numeric_limits<float>::infinity();
        tile_blocks<NB>(hp.data(), wb, K, tiles * t / threads * 16, tiles * (t + 1) / threads * 16,
                        [&](int64_t v, const float (*c)[16][16]) {
            // no row of the block can pass unless its largest sum plus the largest bound does
            vi pass[NB];
            for (int j = 0; j < NB; ++j) pass[j] = block_max(c[j]) + gate[j] >= s.lower[j];
            if (!any_lane<NB>(pass)) return;
            for (int r = 0; r < 16; ++r) {
                float n = norms[v + r];
                for (int j = 0; j < NB; ++j) {
                    vf x = vload(c[j][r]), bound = n * H[j] + A[j];
                    vf lower = x - bound, upper = x + bound;
                    s.lower[j] = lower > s.lower[j] ? lower : s.lower[j];
                    vi kept = upper >= s.lower[j];
                    for (int i = 0; i < L; ++i)
                        if (kept[i]) keep(s.kept[16 * j + i], Candidate{upper[i], (int32_t)(v + r)}, s.lower[j][i]);
                }
            }
        });
        for (int64_t b = 0; b < B; ++b)  // the survivors' exact sums, in vocabulary order
            exact_best(h + b * K, w, K, s.kept[b], s.lower[b / L][b % L], &values[t * B + b], &rows[t * B + b]);
    };
    on_threads(threads, work);
    merge_screened(values.data(), rows.data(), threads, B, h, w, K, tiles * 16, V, tokens);
}

template <typename F>
void by_passes(int64_t B, F pass) {  // pass(NB, first request, requests) for HEAD_LANES requests at a time
    for (int64_t b0 = 0; b0 < B; b0 += HEAD_LANES) {
        int64_t n = B - b0 < HEAD_LANES ? B - b0 : HEAD_LANES;
        pass((int)((n + L - 1) / L), b0, n);
    }
}

void head_greedy_amx(const Bf16* h, int64_t B, int64_t K, const Bf16* w, int64_t V, int threads, int64_t* tokens) {
    by_passes(B, [&](int nb, int64_t b0, int64_t n) {
        const Bf16* hb = h + b0 * K;
        switch (nb) {
            case 1: return head_greedy_pass<1>(hb, n, K, w, V, threads, tokens + b0);
            case 2: return head_greedy_pass<2>(hb, n, K, w, V, threads, tokens + b0);
            case 3: return head_greedy_pass<3>(hb, n, K, w, V, threads, tokens + b0);
            default: return head_greedy_pass<4>(hb, n, K, w, V, threads, tokens + b0);
        }
    });
}

void head_screened_amx(const float* h, int64_t B, int64_t K, const float* w, const Bf16* wb, const float* norms,
                       float max_norm, const float* h_norms, int64_t V, int threads, int64_t* tokens) {
    by_passes(B, [&](int nb, int64_t b0, int64_t n) {
        const float* hb = h + b0 * K;
        const float* hn = h_norms + b0;
        switch (nb) {
            case 1: return head_screened_pass<1>(hb, n, K, w, wb, norms, max_norm, hn, V, threads, tokens + b0);
            case 2: return head_screened_pass<2>(hb, n, K, w, wb, norms, max_norm, hn, V, threads, tokens + b0);
            case 3: return head_screened_pass<3>(hb, n, K, w, wb, norms, max_norm, hn, V, threads, tokens + b0);
            default: return head_screened_pass<4>(hb, n, K, w, wb, norms, max_norm, hn, V, threads, tokens + b0);
        }
    });
}
#endif

}  // namespace

extern "C" {

// tokens[r] = the first maximum of logits row r (rows at `stride` elements), or -1 where the caller must search.
void oxy_greedy(int width, const void* logits, int64_t rows, int64_t n, int64_t stride, int64_t* tokens) {
    for (int64_t r = 0; r < rows; ++r) {
        if (width == 2)
            tokens[r] = first_max(static_cast<const int16_t*>(logits) + r * stride, n);
        else
            tokens[r] = first_max(static_cast<const int32_t*>(logits) + r * stride, n);
    }
}


// Returns 0 on success; 1 for unsupported shapes, 2 for an index out of range (then nothing is written).
int oxy_decode_layers(int bf16, int batch, int width, int heads, int kv_heads, int head_dim, int mlp_dim,
                      int depth, float eps, void* x, const void* const* weights, void* cache_k, void* cache_v,
                      int64_t num_slots, int64_t max_len, bool* valid, const int64_t* slots,
                      const int64_t* cache_index, int64_t span, const void* cos, const void* sin) {
    Shapes sh{batch, width, heads, kv_heads, head_dim, mlp_dim, depth, eps, num_slots, max_len, span};
    if (bf16)
        return decode_layers<Bf16>(sh, static_cast<Bf16*>(x), weights, static_cast<Bf16*>(cache_k),
                                   static_cast<Bf16*>(cache_v), valid, slots, cache_index,
                                   static_cast<const Bf16*>(cos), static_cast<const Bf16*>(sin));
    return decode_layers<float>(sh, static_cast<float*>(x), weights, static_cast<float*>(cache_k),
                                static_cast<float*>(cache_v), valid, slots, cache_index,
                                static_cast<const float*>(cos), static_cast<const float*>(sin));
}

// `decode_step` above: tokens [B] long, embed [vocab, W], rope tables [rope_rows, head_dim], out [B, W].
int oxy_decode_step(int bf16, int batch, int width, int heads, int kv_heads, int head_dim, int mlp_dim, int depth,
                    float eps, const int64_t* tokens, const void* embed, int64_t vocab, float scale,
                    const void* const* weights, const void* final_norm, void* cache_k, void* cache_v,
                    int64_t num_slots, int64_t max_len, bool* valid, const int64_t* slots, const int64_t* cache_index,
                    const int64_t* positions, int64_t span, const void* rope_cos, const void* rope_sin,
                    int64_t rope_rows, void* out) {
    Shapes sh{batch, width, heads, kv_heads, head_dim, mlp_dim, depth, eps, num_slots, max_len, span};
    if (bf16)
        return decode_step<Bf16>(sh, tokens, static_cast<const Bf16*>(embed), vocab, scale, weights,
                                 static_cast<const Bf16*>(final_norm), static_cast<Bf16*>(cache_k),
                                 static_cast<Bf16*>(cache_v), valid, slots, cache_index, positions,
                                 static_cast<const Bf16*>(rope_cos), static_cast<const Bf16*>(rope_sin), rope_rows,
                                 static_cast<Bf16*>(out));
    return decode_step<float>(sh, tokens, static_cast<const float*>(embed), vocab, scale, weights,
                              static_cast<const float*>(final_norm), static_cast<float*>(cache_k),
                              static_cast<float*>(cache_v), valid, slots, cache_index, positions,
                              static_cast<const float*>(rope_cos), static_cast<const float*>(rope_sin), rope_rows,
                              static_cast<float*>(out));
}

// tokens[b] = the first maximum over the vocabulary of h[b] . head[v] (h [B, K], head [V, K], both contiguous, in
// the model's dtype): the greedy choice from a decode step's final hidden states without its logits. `amx` asks
// for the bfloat16 tile path; returns 0, or 1 when asked for tiles this build or this process cannot use (then
// nothing is written).
int oxy_head_greedy(int bf16, int amx, int threads, const void* h, int64_t batch, int64_t width, const void* head,
                    int64_t vocab, int64_t* tokens) {
    threads = usable_threads(threads, vocab);
    if (amx) {
#ifdef OXY_AMX
        if (!bf16 || width % 32 != 0 || !amx_granted()) return 1;
        head_greedy_amx(static_cast<const Bf16*>(h), batch, width, static_cast<const Bf16*>(head), vocab, threads,
                        tokens);
        return 0;
#else
        return 1;
#endif
    }
#ifdef __AVX512F__
    if (batch < HEAD_ROWS_BELOW && rows_run(bf16, width)) {
        if (!bf16)
            head_greedy_rows(static_cast<const float*>(h), batch, width, static_cast<const float*>(head), vocab,
                             threads, tokens);
#ifdef OXY_DPBF16
        else
            head_greedy_rows(static_cast<const Bf16*>(h), batch, width, static_cast<const Bf16*>(head), vocab,
                             threads, tokens);
#endif
        return 0;
    }
#endif
#ifdef OXY_AVX2
    if (!bf16 && width % 8 == 0) {
        head_greedy_avx2(static_cast<const float*>(h), batch, width, static_cast<const float*>(head), vocab, threads,
                         tokens);
        return 0;
    }
#endif
#ifdef OXY_DPBF16
    if (bf16 && width % 2 == 0) {
        head_greedy_pairs(static_cast<const Bf16*>(h), batch, width, static_cast<const Bf16*>(head), vocab, threads,
                          tokens);
        return 0;
    }
#endif
    if (bf16)
        head_greedy_lanes(static_cast<const Bf16*>(h), batch, width, static_cast<const Bf16*>(head), vocab, threads,
                          tokens);
    else
        head_greedy_lanes(static_cast<const float*>(h), batch, width, static_cast<const float*>(head), vocab,
                          threads, tokens);
    return 0;
}

// head_greedy for a float32 head [V, K] (`head`) with its bfloat16 copy (`head_bf16`, rounded to nearest) and its
// rows' euclidean norms (`norms`, rounded up; `max_norm` their largest), screened on the matrix tiles (`amx`) or
// on AVX-512 BF16's pair dot products: the same tokens as the vector-lane path. Returns 0; 1 when this build or
// process cannot screen that way or the width does not suit it (whole tiles; even for pairs), nothing written.
// Hidden states or a head too large for the screen's bounds to be finite (or not finite at all) take the
// vector-lane path, as do requests the screen cannot narrow down.
int oxy_head_greedy_screened(int amx, int threads, const float* h, int64_t batch, int64_t width, const float* head,
                             const void* head_bf16, const float* norms, float max_norm, int64_t vocab,
                             int64_t* tokens) {
    bool tiles = false, pairs = false;
#ifdef OXY_AMX
    tiles = amx && width % 32 == 0 && amx_granted();
#endif
#ifdef OXY_DPBF16
    pairs = !amx && width % 2 == 0;
#endif
    if (!tiles && !pairs) return 1;
#if defined(OXY_AMX) || defined(OXY_DPBF16)
    threads = usable_threads(threads, vocab);
    std::vector<float> h_norms(batch);
    bool bounded = std::isfinite(max_norm) && max_norm < 1e37f;
    for (int64_t b = 0; b < batch && bounded; ++b) {
        double n = norm2(h + b * width, width);
        // finite, and every sum and bound below 1e37 whatever the rounding (no bfloat16 rounds up past float32's
        // range, no float32 sum overflows)
        bounded = std::isfinite(n) && n < 1e37 && n * max_norm < 1e36;
        h_norms[b] = float_up(n);
    }
    const Bf16* wb = static_cast<const Bf16*>(head_bf16);
    if (!bounded) {
        for (int64_t b = 0; b < batch; ++b) tokens[b] = -1;
    }
#ifdef OXY_AMX
    else if (tiles) {
        head_screened_amx(h, batch, width, head, wb, norms, max_norm, h_norms.data(), vocab, threads, tokens);
    }
#endif
#ifdef OXY_DPBF16
    else if (pairs) {
        head_screened_pairs(h, batch, width, head, wb, norms, max_norm, h_norms.data(), vocab, threads, tokens);
    }
#endif
    std::vector<int64_t> rest;  // requests the screen left to the vector lanes
    for (int64_t b = 0; b < batch; ++b)
        if (tokens[b] < 0) rest.push_back(b);
    if (!rest.empty()) {
        std::vector<float> hr(rest.size() * width);
        for (size_t i = 0; i < rest.size(); ++i)
            std::memcpy(hr.data() + i * width, h + rest[i] * width, sizeof(float) * width);
        std::vector<int64_t> out(rest.size());
        head_greedy_lanes(hr.data(), (int64_t)rest.size(), width, head, vocab, threads, out.data());
        for (size_t i = 0; i < rest.size(); ++i) tokens[rest[i]] = out[i];
    }
    return 0;
#else
    (void)threads, (void)h, (void)batch, (void)head, (void)head_bf16, (void)norms, (void)max_norm, (void)vocab,
        (void)tokens;
    return 1;
#endif
}

// norms[v] = the euclidean norm of row v of a float32 matrix w [V, K], summed in double and rounded up.
void oxy_row_norms(const float* w, int64_t rows, int64_t width, float* norms) {
    for (int64_t v = 0; v < rows; ++v) norms[v] = float_up(norm2(w + v * width, width));
}

// The batch below which a build with the row path reads the head row by row.
int64_t oxy_head_rows_below() { return HEAD_ROWS_BELOW; }

// 1 when this build runs a head of this dtype and width for fewer than HEAD_ROWS_BELOW requests row by row
// (`head_greedy_rows`; on AVX2 `head_greedy_avx2`), else 0 (then such batches take the vector lanes).
int oxy_has_row_head(int bf16, int64_t width) { return rows_run(bf16, width); }

// 1 when this build has the bfloat16 head on AVX-512 BF16's pair dot products (`PairLanes`, even widths).
int oxy_has_pair_head() {
#ifdef OXY_DPBF16
    return 1;
#else
    return 0;
#endif
}

// 1 when this build has its AVX2 paths (`OXY_AVX2`: the float32 head `head_greedy_avx2` for widths of whole 8s at
// any batch, attention and the linear layers on 8-lane registers).
int oxy_has_avx2() {
#ifdef OXY_AVX2
    return 1;
#else
    return 0;
#endif
}

// 1 when this build has the AMX tile path and this process may use it.
int oxy_has_amx() {
#ifdef OXY_AMX
    return amx_granted() ? 1 : 0;
#else
    return 0;
#endif
}

}  // extern "C"
