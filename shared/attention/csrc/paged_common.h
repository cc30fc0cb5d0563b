// Helpers shared by the paths of the paged attention kernel (paged_decode.cpp): bf16
// conversions, the problem's shape, and the AVX-512 building blocks (exp, lane sums, prefetch).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#define PDSERVE_HAVE_AVX512F 1
#endif

namespace pdserve_attention {

constexpr int kMaxHeadDim = 256;
constexpr int kMaxQueriesPerKv = 16;
constexpr int kMaxBlockSize = 64;

inline float bf16_to_float(uint16_t value) {
    uint32_t bits = static_cast<uint32_t>(value) << 16;
    float result;
    std::memcpy(&result, &bits, sizeof(result));
    return result;
}

inline uint16_t float_to_bf16(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
    return static_cast<uint16_t>(bits >> 16);
}

inline void load_row(const uint16_t* src, float* dst, int head_dim) {
#pragma omp simd
    for (int d = 0; d < head_dim; ++d) dst[d] = bf16_to_float(src[d]);
}

inline void load_row(const float* src, float* dst, int head_dim) {
    std::memcpy(dst, src, sizeof(float) * head_dim);
}

inline void store_row(const float* src, uint16_t* dst, int head_dim) {
    for (int d = 0; d < head_dim; ++d) dst[d] = float_to_bf16(src[d]);
}

inline void store_row(const float* src, float* dst, int head_dim) {
    std::memcpy(dst, src, sizeof(float) * head_dim);
}

inline float dot(const float* a, const float* b, int head_dim) {
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int d = 0; d < head_dim; ++d) sum += a[d] * b[d];
    return sum;
}


#ifdef PDSERVE_HAVE_AVX512F

// exp(x) for 16 lanes: 2^n * e^r with n = round(x / ln 2), |r| <= ln(2) / 2, a degree-6
// Taylor polynomial for e^r (relative error < 2e-7), -inf -> 0.
inline __m512 exp16(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693359375f);
    const __m512 ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
    x = _mm512_max_ps(x, _mm512_set1_ps(-88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
    r = _mm512_fnmadd_ps(n, ln2_lo, r);
    __m512 poly = _mm512_set1_ps(1.f / 720.f);
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f / 120.f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f / 24.f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f / 6.f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(0.5f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(poly, n);
}

// Sums each of 16 vectors' lanes: lane t of the result is the sum of vectors[t]'s lanes.
inline __m512 sum_lanes_16(__m512* v) {
    for (int i = 0; i < 8; ++i)  // 4-lane groups of two vectors interleaved, half summed
        v[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {
        __m512d a = _mm512_castps_pd(v[2 * i]), b = _mm512_castps_pd(v[2 * i + 1]);
        v[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int i = 0; i < 2; ++i)
        v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88), _mm512_shuffle_f32x4(v[0], v[1], 0xDD));
}

// Requests `num_bytes` contiguous bytes ahead of their use, a cache line at a time.
inline void prefetch_bytes(const void* start, int num_bytes) {
    const char* bytes = reinterpret_cast<const char*>(start);
    for (int byte = 0; byte < num_bytes; byte += 64) _mm_prefetch(bytes + byte, _MM_HINT_T0);
}

// Requests a tile's key and value rows (all KV heads: `num_bytes` contiguous bytes each) ahead
// of their use; the blocks are scattered, so the hardware prefetchers cannot guess the next one.
inline void prefetch_rows(const void* keys, const void* values, int num_bytes) {
    const char* key_bytes = reinterpret_cast<const char*>(keys);
    const char* value_bytes = reinterpret_cast<const char*>(values);
    for (int byte = 0; byte < num_bytes; byte += 64) {
        _mm_prefetch(key_bytes + byte, _MM_HINT_T0);
        _mm_prefetch(value_bytes + byte, _MM_HINT_T0);
    }
}
#endif

struct Shape {
    int num_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq;
    float scale;
};

}  // namespace pdserve_attention
