// Paged decode attention for the CPU: one query row per sequence, keys and values read in
// place through the block table (no gathered copy), online softmax one block at a time.
//
// Called through ctypes by shared/attention/native_decode.py, once per layer per step.
// Layouts (all contiguous, row-major):
//   query        (num_seqs, num_heads, head_dim)
//   key_cache    (num_blocks, block_size, num_kv_heads, head_dim)   one layer's keys
//   value_cache  same as key_cache
//   block_tables (num_seqs, max_blocks_per_seq) int32, context_lens (num_seqs,) int32
//   output       (num_seqs, num_heads, head_dim)
// Work items spread over OpenMP threads: on the AVX512-BF16 path one sequence each (every KV
// head per tile, so each tile's rows are read front to back), elsewhere (sequence, KV head)
// pairs. The query heads sharing a KV head are done together, so each key/value row is loaded
// once for all of them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

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


#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define PDSERVE_HAVE_AVX512_BF16 1

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
#endif

struct Shape {
    int num_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq;
    float scale;
};

// Running softmax state of the query heads sharing one KV head.
struct HeadGroupState {
    float queries[kMaxQueriesPerKv][kMaxHeadDim];
    float accumulators[kMaxQueriesPerKv][kMaxHeadDim];
    float running_max[kMaxQueriesPerKv];
    float running_sum[kMaxQueriesPerKv];
};

// Folds one block's `num_tokens` keys/values into the state of `group_size` query heads.
template <typename T>
void attend_block(const T* keys, const T* values, int row_stride, int num_tokens, int group_size,
                  int head_dim, HeadGroupState& state) {
    float scores[kMaxQueriesPerKv][kMaxBlockSize];
    float row[kMaxHeadDim];
    for (int t = 0; t < num_tokens; ++t) {
        load_row(keys + static_cast<int64_t>(t) * row_stride, row, head_dim);
        for (int q = 0; q < group_size; ++q) scores[q][t] = dot(state.queries[q], row, head_dim);
    }
    for (int q = 0; q < group_size; ++q) {
        float block_max = scores[q][0];
        for (int t = 1; t < num_tokens; ++t) block_max = std::fmax(block_max, scores[q][t]);
        float new_max = std::fmax(state.running_max[q], block_max);
        float correction = std::exp(state.running_max[q] - new_max);
        state.running_max[q] = new_max;
        float block_sum = 0.f;
        for (int t = 0; t < num_tokens; ++t) {
            scores[q][t] = std::exp(scores[q][t] - new_max);
            block_sum += scores[q][t];
        }
        state.running_sum[q] = state.running_sum[q] * correction + block_sum;
        float* acc = state.accumulators[q];
#pragma omp simd
        for (int d = 0; d < head_dim; ++d) acc[d] *= correction;
    }
    for (int t = 0; t < num_tokens; ++t) {
        load_row(values + static_cast<int64_t>(t) * row_stride, row, head_dim);
        for (int q = 0; q < group_size; ++q) {
            float weight = scores[q][t];
            float* acc = state.accumulators[q];
#pragma omp simd
            for (int d = 0; d < head_dim; ++d) acc[d] += weight * row[d];
        }
    }
}

template <typename T>
void decode_one(const T* query, const T* key_cache, const T* value_cache, const int32_t* block_table,
                int context_len, int kv_head, const Shape& shape, T* output) {
    const int group_size = shape.num_heads / shape.num_kv_heads;
    const int head_dim = shape.head_dim;
    const int row_stride = shape.num_kv_heads * head_dim;
    HeadGroupState state;
    for (int q = 0; q < group_size; ++q) {
        load_row(query + static_cast<int64_t>(kv_head * group_size + q) * head_dim, state.queries[q], head_dim);
        for (int d = 0; d < head_dim; ++d) state.queries[q][d] *= shape.scale;
        std::memset(state.accumulators[q], 0, sizeof(float) * head_dim);
        state.running_max[q] = -INFINITY;
        state.running_sum[q] = 0.f;
    }
    const int num_blocks = (context_len + shape.block_size - 1) / shape.block_size;
    for (int b = 0; b < num_blocks; ++b) {
        const int64_t block_offset =
            (static_cast<int64_t>(block_table[b]) * shape.block_size) * row_stride + kv_head * head_dim;
        const int num_tokens = std::min(shape.block_size, context_len - b * shape.block_size);
        attend_block(key_cache + block_offset, value_cache + block_offset, row_stride, num_tokens,
                     group_size, head_dim, state);
    }
    for (int q = 0; q < group_size; ++q) {
        float inverse_sum = 1.f / state.running_sum[q];
        for (int d = 0; d < head_dim; ++d) state.accumulators[q][d] *= inverse_sum;
        store_row(state.accumulators[q], output + static_cast<int64_t>(kv_head * group_size + q) * head_dim,
                  head_dim);
    }
}


#ifdef PDSERVE_HAVE_AVX512_BF16
// The AVX512-BF16 path (head_dim a multiple of 32): dot products and the probability-weighted
// sum of values both run as bf16 pair dot products accumulating in fp32 (vdpbf16ps). Value
// rows of two tokens are interleaved so one instruction adds p_t * v_t + p_t+1 * v_t+1; the
// accumulators' lanes therefore hold dims in the unpack order (see store_accumulators).
struct Bf16GroupState {
    __m512bh queries[kMaxQueriesPerKv][kMaxHeadDim / 32];
    __m512 accumulators[kMaxQueriesPerKv][kMaxHeadDim / 16];
    float running_max[kMaxQueriesPerKv];
    float running_sum[kMaxQueriesPerKv];
};

inline __m512bh load_bf16x32(const uint16_t* src) {
    return reinterpret_cast<__m512bh>(_mm512_loadu_si512(src));
}

// Scaled scores of up to 16 tokens for every query head; lanes past num_tokens are -inf.
inline void tile_scores(const uint16_t* keys, int row_stride, int num_tokens, int group_size, int num_chunks,
                        float scale, const Bf16GroupState& state, __m512* scores) {
    __m512 parts[kMaxQueriesPerKv][16];
    for (int t = 0; t < 16; ++t) {
        for (int q = 0; q < group_size; ++q) parts[q][t] = _mm512_setzero_ps();
        if (t >= num_tokens) continue;
        for (int c = 0; c < num_chunks; ++c) {
            __m512bh key = load_bf16x32(keys + static_cast<int64_t>(t) * row_stride + c * 32);
            for (int q = 0; q < group_size; ++q) parts[q][t] = _mm512_dpbf16_ps(parts[q][t], state.queries[q][c], key);
        }
    }
    const __mmask16 valid = static_cast<__mmask16>((1u << num_tokens) - 1u);
    for (int q = 0; q < group_size; ++q) {
        __m512 scaled = _mm512_mul_ps(sum_lanes_16(parts[q]), _mm512_set1_ps(scale));
        scores[q] = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY), scaled);
    }
}

// Online softmax update; returns each head's tile probabilities as bf16, two tokens per uint32.
inline void tile_probabilities(__m512* scores, int group_size, int num_chunks, Bf16GroupState& state,
                               uint32_t probability_pairs[][8]) {
    for (int q = 0; q < group_size; ++q) {
        float new_max = std::fmax(state.running_max[q], _mm512_reduce_max_ps(scores[q]));
        __m512 probabilities = exp16(_mm512_sub_ps(scores[q], _mm512_set1_ps(new_max)));
        probabilities = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(scores[q], _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ),
                                            probabilities);
        float correction = std::exp(state.running_max[q] - new_max);
        state.running_max[q] = new_max;
        state.running_sum[q] = state.running_sum[q] * correction + _mm512_reduce_add_ps(probabilities);
        __m512 correction_v = _mm512_set1_ps(correction);
        for (int c = 0; c < 2 * num_chunks; ++c)
            state.accumulators[q][c] = _mm512_mul_ps(state.accumulators[q][c], correction_v);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(probability_pairs[q]),
                            reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(probabilities)));
    }
}

inline void attend_tile_bf16(const uint16_t* keys, const uint16_t* values, int row_stride, int num_tokens,
                             int group_size, int head_dim, float scale, Bf16GroupState& state) {
    const int num_chunks = head_dim / 32;
    __m512 scores[kMaxQueriesPerKv];
    uint32_t probability_pairs[kMaxQueriesPerKv][8];
    tile_scores(keys, row_stride, num_tokens, group_size, num_chunks, scale, state, scores);
    tile_probabilities(scores, group_size, num_chunks, state, probability_pairs);
    for (int t = 0; t < num_tokens; t += 2) {
        const uint16_t* row = values + static_cast<int64_t>(t) * row_stride;
        const bool has_next = t + 1 < num_tokens;
        for (int c = 0; c < num_chunks; ++c) {
            __m512i first = _mm512_loadu_si512(row + c * 32);
            __m512i second = has_next ? _mm512_loadu_si512(row + row_stride + c * 32) : _mm512_setzero_si512();
            __m512bh low = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi16(first, second));
            __m512bh high = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi16(first, second));
            for (int q = 0; q < group_size; ++q) {
                __m512bh pair = reinterpret_cast<__m512bh>(_mm512_set1_epi32(probability_pairs[q][t / 2]));
                state.accumulators[q][2 * c] = _mm512_dpbf16_ps(state.accumulators[q][2 * c], low, pair);
                state.accumulators[q][2 * c + 1] = _mm512_dpbf16_ps(state.accumulators[q][2 * c + 1], high, pair);
            }
        }
    }
}

// Undoes the unpack order: accumulator 2c lane i holds dim 32c + 8(i/4) + i%4, 2c+1 the dim 4 above.
inline void store_accumulators(const Bf16GroupState& state, int q, int head_dim, uint16_t* output) {
    float lanes[16];
    float inverse_sum = 1.f / state.running_sum[q];
    for (int c = 0; c < head_dim / 16; ++c) {
        _mm512_storeu_ps(lanes, state.accumulators[q][c]);
        const int base = (c / 2) * 32 + (c % 2) * 4;
        for (int i = 0; i < 16; ++i) output[base + 8 * (i / 4) + i % 4] = float_to_bf16(lanes[i] * inverse_sum);
    }
}

// Requests a tile's key and value rows (all KV heads: `num_bytes` contiguous bytes each) ahead
// of their use; the blocks are scattered, so the hardware prefetchers cannot guess the next one.
inline void prefetch_rows(const uint16_t* keys, const uint16_t* values, int num_bytes) {
    const char* key_bytes = reinterpret_cast<const char*>(keys);
    const char* value_bytes = reinterpret_cast<const char*>(values);
    for (int byte = 0; byte < num_bytes; byte += 64) {
        _mm_prefetch(key_bytes + byte, _MM_HINT_T0);
        _mm_prefetch(value_bytes + byte, _MM_HINT_T0);
    }
}

// One sequence, every KV head: each tile's keys (then values) of all heads are one contiguous
// run of rows, read front to back, which the hardware prefetchers follow; visiting one head's
// slice of every row instead (a work item per KV head) ran at a third of the memory bandwidth.
void decode_seq_bf16_avx512(const uint16_t* query, const uint16_t* key_cache, const uint16_t* value_cache,
                            const int32_t* block_table, int context_len, const Shape& shape, uint16_t* output) {
    const int group_size = shape.num_heads / shape.num_kv_heads;
    const int head_dim = shape.head_dim;
    const int row_stride = shape.num_kv_heads * head_dim;
    static thread_local std::vector<Bf16GroupState> states;
    states.resize(shape.num_kv_heads);
    for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head) {
        Bf16GroupState& state = states[kv_head];
        for (int q = 0; q < group_size; ++q) {
            const uint16_t* query_row = query + static_cast<int64_t>(kv_head * group_size + q) * head_dim;
            for (int c = 0; c < head_dim / 32; ++c) state.queries[q][c] = load_bf16x32(query_row + c * 32);
            for (int c = 0; c < head_dim / 16; ++c) state.accumulators[q][c] = _mm512_setzero_ps();
            state.running_max[q] = -INFINITY;
            state.running_sum[q] = 0.f;
        }
    }
    for (int start = 0; start < context_len;) {
        const int block = start / shape.block_size, offset = start % shape.block_size;
        const int num_tokens = std::min({16, context_len - start, shape.block_size - offset});
        const int64_t row_offset = (static_cast<int64_t>(block_table[block]) * shape.block_size + offset) * row_stride;
        const int next = start + num_tokens;
        if (next < context_len) {
            const int next_block = next / shape.block_size, next_offset = next % shape.block_size;
            const int next_tokens = std::min({16, context_len - next, shape.block_size - next_offset});
            const int64_t next_row = (static_cast<int64_t>(block_table[next_block]) * shape.block_size + next_offset)
                                     * row_stride;
            prefetch_rows(key_cache + next_row, value_cache + next_row,
                          next_tokens * row_stride * static_cast<int>(sizeof(uint16_t)));
        }
        for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head)
            attend_tile_bf16(key_cache + row_offset + kv_head * head_dim, value_cache + row_offset + kv_head * head_dim,
                             row_stride, num_tokens, group_size, head_dim, shape.scale, states[kv_head]);
        start += num_tokens;
    }
    for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head)
        for (int q = 0; q < group_size; ++q)
            store_accumulators(states[kv_head], q, head_dim,
                               output + static_cast<int64_t>(kv_head * group_size + q) * head_dim);
}
#endif

template <typename T>
void decode_all(const T* query, const T* key_cache, const T* value_cache, const int32_t* block_tables,
                const int32_t* context_lens, T* output, int num_seqs, const Shape& shape, int num_threads) {
    const int64_t seq_stride = static_cast<int64_t>(shape.num_heads) * shape.head_dim;
#ifdef PDSERVE_HAVE_AVX512_BF16
    if constexpr (std::is_same_v<T, uint16_t>) {
        if (shape.head_dim % 32 == 0) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
            for (int seq = 0; seq < num_seqs; ++seq)
                decode_seq_bf16_avx512(query + seq * seq_stride, key_cache, value_cache,
                                       block_tables + static_cast<int64_t>(seq) * shape.max_blocks_per_seq,
                                       context_lens[seq], shape, output + seq * seq_stride);
            return;
        }
    }
#endif
    const int64_t num_items = static_cast<int64_t>(num_seqs) * shape.num_kv_heads;
#pragma omp parallel for schedule(dynamic, 4) num_threads(num_threads)
    for (int64_t item = 0; item < num_items; ++item) {
        const int seq = static_cast<int>(item / shape.num_kv_heads);
        const int kv_head = static_cast<int>(item % shape.num_kv_heads);
        decode_one(query + seq * seq_stride, key_cache, value_cache,
                   block_tables + static_cast<int64_t>(seq) * shape.max_blocks_per_seq, context_lens[seq],
                   kv_head, shape, output + seq * seq_stride);
    }
}

}  // namespace

extern "C" {

// Limits the caller checks before calling (returned so Python never hard-codes them).
int pdserve_paged_decode_max_head_dim() { return kMaxHeadDim; }
int pdserve_paged_decode_max_queries_per_kv() { return kMaxQueriesPerKv; }
int pdserve_paged_decode_max_block_size() { return kMaxBlockSize; }

void pdserve_paged_decode_bf16(const uint16_t* query, const uint16_t* key_cache, const uint16_t* value_cache,
                               const int32_t* block_tables, const int32_t* context_lens, uint16_t* output,
                               int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size,
                               int max_blocks_per_seq, float scale, int num_threads) {
    Shape shape{num_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq, scale};
    decode_all(query, key_cache, value_cache, block_tables, context_lens, output, num_seqs, shape, num_threads);
}

void pdserve_paged_decode_f32(const float* query, const float* key_cache, const float* value_cache,
                              const int32_t* block_tables, const int32_t* context_lens, float* output,
                              int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size,
                              int max_blocks_per_seq, float scale, int num_threads) {
    Shape shape{num_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq, scale};
    decode_all(query, key_cache, value_cache, block_tables, context_lens, output, num_seqs, shape, num_threads);
}

}  // extern "C"
