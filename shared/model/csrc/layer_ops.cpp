// The small per-layer operations of a Llama step on the CPU, each one pass over its rows
// instead of torch's several (casts, powers, means, flips, products: ~60 us a call on a batch
// of 64 rows, most of it dispatch): RMSNorm (optionally after adding the residual) and the
// rotary embedding, in place on the queries and keys.
//
// Called through ctypes by shared/model/cpu_layer_ops.py. Both operations round exactly as
// transformers' Llama does in the model's dtype (bf16 or fp32), so the engine's output keeps
// matching it:
//   RMSNorm:  out = round(weight * round(x * rsqrt(mean(x^2) + eps)))   (x, the sum, in fp32)
//   residual: residual = round(residual + x), then RMSNorm of it
//   rotary:   out = round(round(x * cos) + round(rotate_half(x) * sin)) (cos, sin already bf16)
// Rows are independent: a row's result never depends on the others (deterministic mode).
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

inline float to_float(float value) { return value; }

inline float to_float(uint16_t value) {
    const uint32_t bits = static_cast<uint32_t>(value) << 16;
    float result;
    std::memcpy(&result, &bits, sizeof(result));
    return result;
}

// Round to the storage type: fp32 as is, bf16 to nearest even (NaN stays NaN).
inline float round_to(float value, const float*) { return value; }

inline float round_to(float value, const uint16_t*) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    if (std::isnan(value)) bits |= 0x400000u;
    else bits += 0x7fffu + ((bits >> 16) & 1u);
    bits &= 0xFFFF0000u;
    float result;
    std::memcpy(&result, &bits, sizeof(result));
    return result;
}

inline void store(float value, float* target) { *target = value; }

inline void store(float value, uint16_t* target) {  // value already rounded to bf16
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    *target = static_cast<uint16_t>(bits >> 16);
}

// The sum of squares of a row, in fp32 lanes of 16 then across them (a fixed order per row).
template <typename T>
float sum_of_squares(const T* row, int64_t cols) {
    float lanes[16] = {};
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16)
#pragma omp simd
        for (int i = 0; i < 16; ++i) {
            const float value = to_float(row[c + i]);
            lanes[i] += value * value;
        }
    for (int i = 0; c < cols; ++c, ++i) lanes[i] += to_float(row[c]) * to_float(row[c]);
    float total = 0.f;
    for (float lane : lanes) total += lane;
    return total;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// 16 lanes of bf16 <-> fp32; rounding to nearest even, NaN kept NaN (as round_to).
inline __m512 load16(const uint16_t* source) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(source))), 16));
}

inline __m512 load16(const float* source) { return _mm512_loadu_ps(source); }

inline __m512 round16(__m512 value, const float*) { return value; }

inline __m512 round16(__m512 value, const uint16_t*) {
#if defined(__AVX512BF16__)  // one instruction (it treats bf16-denormal inputs as zero)
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(value))), 16));
#endif
    const __m512i bits = _mm512_castps_si512(value);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    const __mmask16 nan = _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
    rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x400000));
    return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

inline void store16(__m512 rounded, float* target) { _mm512_storeu_ps(target, rounded); }

inline void store16(__m512 rounded, uint16_t* target) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(target),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(rounded), 16)));
}

template <typename T>
float sum_of_squares16(const T* row, int64_t cols) {
    __m512 sums = _mm512_setzero_ps();
    for (int64_t c = 0; c < cols; c += 16) {
        const __m512 value = load16(row + c);
        sums = _mm512_fmadd_ps(value, value, sums);
    }
    return _mm512_reduce_add_ps(sums);
}

// rms_norm_row for widths that are a multiple of 16.
template <typename T>
void rms_norm_row16(const T* x, T* residual, const T* weight, float eps, T* out, int64_t cols) {
    const T* source = x;
    if (residual != nullptr) {
        for (int64_t c = 0; c < cols; c += 16)
            store16(round16(_mm512_add_ps(load16(residual + c), load16(x + c)), residual), residual + c);
        source = residual;
    }
    const __m512 inverse_rms =
        _mm512_set1_ps(1.f / std::sqrt(sum_of_squares16(source, cols) / static_cast<float>(cols) + eps));
    for (int64_t c = 0; c < cols; c += 16) {
        const __m512 normalized = round16(_mm512_mul_ps(load16(source + c), inverse_rms), out);
        store16(round16(_mm512_mul_ps(load16(weight + c), normalized), out), out + c);
    }
}

// One head of rotate_in_place for head dims that are a multiple of 32 (halves of 16-lane vectors).
template <typename T>
void rotate_head16(T* row, const T* cos, const T* signed_sin, int head_dim) {
    const int half = head_dim / 2;
    __m512 rotated[32];  // head dims up to 512
    for (int d = 0; d < head_dim; d += 16) {
        const int partner = d < half ? d + half : d - half;
        const __m512 straight = round16(_mm512_mul_ps(load16(row + d), load16(cos + d)), row);
        const __m512 swapped = round16(_mm512_mul_ps(load16(row + partner), load16(signed_sin + d)), row);
        rotated[d / 16] = round16(_mm512_add_ps(straight, swapped), row);
    }
    for (int d = 0; d < head_dim; d += 16) store16(rotated[d / 16], row + d);
}
#define PDSERVE_LAYER_OPS_AVX512 1
#endif

template <typename T>
void rms_norm_row(const T* x, T* residual, const T* weight, float eps, T* out, int64_t cols) {
#ifdef PDSERVE_LAYER_OPS_AVX512
    if (cols % 16 == 0) return rms_norm_row16(x, residual, weight, eps, out, cols);
#endif
    const T* source = x;
    if (residual != nullptr) {
        for (int64_t c = 0; c < cols; ++c)
            store(round_to(to_float(residual[c]) + to_float(x[c]), residual), residual + c);
        source = residual;
    }
    const float inverse_rms = 1.f / std::sqrt(sum_of_squares(source, cols) / static_cast<float>(cols) + eps);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
        const float normalized = round_to(to_float(source[c]) * inverse_rms, out);
        store(round_to(to_float(weight[c]) * normalized, out), out + c);
    }
}

template <typename T>
void rms_norm(const T* x, T* residual, const T* weight, float eps, T* out, int64_t rows, int64_t cols,
              int num_threads) {
    const bool parallel = rows * cols >= (1 << 16) && num_threads > 1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (parallel)
    for (int64_t r = 0; r < rows; ++r)
        rms_norm_row(x + r * cols, residual == nullptr ? nullptr : residual + r * cols, weight, eps, out + r * cols,
                     cols);
}

// Rotates `heads` consecutive heads of each token in place ("rotate half" layout).
template <typename T>
void rotate_in_place(T* x, int64_t tokens, int64_t token_stride, int heads, int head_dim, const T* cos,
                     const T* signed_sin, int num_threads) {
    const int half = head_dim / 2;
    const bool parallel = tokens * heads * head_dim >= (1 << 16) && num_threads > 1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (parallel)
    for (int64_t t = 0; t < tokens; ++t) {
        const T* token_cos = cos + t * head_dim;
        const T* token_sin = signed_sin + t * head_dim;
        for (int h = 0; h < heads; ++h) {
            T* row = x + t * token_stride + static_cast<int64_t>(h) * head_dim;
#ifdef PDSERVE_LAYER_OPS_AVX512
            if (head_dim % 32 == 0) {
                rotate_head16(row, token_cos, token_sin, head_dim);
                continue;
            }
#endif
            float rotated[512];
#pragma omp simd
            for (int d = 0; d < head_dim; ++d) {
                const int partner = d < half ? d + half : d - half;
                const float straight = round_to(to_float(row[d]) * to_float(token_cos[d]), row);
                const float swapped = round_to(to_float(row[partner]) * to_float(token_sin[d]), row);
                rotated[d] = round_to(straight + swapped, row);
            }
            for (int d = 0; d < head_dim; ++d) store(rotated[d], row + d);
        }
    }
}

}  // namespace

extern "C" {

int pdserve_layer_ops_max_head_dim() { return 512; }

void pdserve_rms_norm_bf16(const uint16_t* x, uint16_t* residual, const uint16_t* weight, float eps, uint16_t* out,
                           int64_t rows, int64_t cols, int num_threads) {
    rms_norm(x, residual, weight, eps, out, rows, cols, num_threads);
}

void pdserve_rms_norm_f32(const float* x, float* residual, const float* weight, float eps, float* out, int64_t rows,
                          int64_t cols, int num_threads) {
    rms_norm(x, residual, weight, eps, out, rows, cols, num_threads);
}

void pdserve_rotate_in_place_bf16(uint16_t* x, int64_t tokens, int64_t token_stride, int heads, int head_dim,
                                  const uint16_t* cos, const uint16_t* signed_sin, int num_threads) {
    rotate_in_place(x, tokens, token_stride, heads, head_dim, cos, signed_sin, num_threads);
}

void pdserve_rotate_in_place_f32(float* x, int64_t tokens, int64_t token_stride, int heads, int head_dim,
                                 const float* cos, const float* signed_sin, int num_threads) {
    rotate_in_place(x, tokens, token_stride, heads, head_dim, cos, signed_sin, num_threads);
}

}  // extern "C"
