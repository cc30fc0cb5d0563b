// The AMX path of the paged attention kernel (paged_decode.cpp), for CPUs with AMX tiles and
// their bf16 matmul (Intel Xeon since Sapphire Rapids): bf16 caches, head dims of 32, 64, 96 or
// 128, up to 8 query heads per KV head, blocks a multiple of 16 tokens. One work
// item is one query row (a decode), over every KV head, in three passes:
//
// 1. Scores. Each 16-token tile of a block is an AMX A tile as it lies in the cache (16 key
//    rows, 32 dims a row, stride = the cache's row), and the row's queries of one KV head are
//    a B tile packed once per row (VNNI: dim pairs x query heads), so one tdpbf16ps gives the
//    16 tokens' partial scores for every query head of the KV head, with no transposes or
//    lane sums. The C tile is stored into a scratch of [position][query head] scores.
// 2. Softmax, per query head with lanes = heads: each head's exact maximum over the context,
//    then exp(score - max) in place and the sums (vector work over contiguous rows).
// 3. Values, in fp32: every value row is widened from bf16 once (exact) for all the query heads
//    of its KV head, which add p * value with FMAs. On these CPUs two fp32 FMA ports outrun
//    vdpbf16ps (measured: ~4 G fp32 FMAs/s against ~1.1 G vdpbf16ps/s a core), and keeping the
//    probabilities in fp32 skips their rounding to bf16.
//
// Linux grants AMX's tile state per process on request (arch_prctl); `amx_permitted` asks
// once, and without the grant the path is unavailable.
#pragma once

#include "paged_common.h"

#if defined(PDSERVE_HAVE_AVX512F) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define PDSERVE_HAVE_AMX 1

#include <sys/syscall.h>
#include <unistd.h>

namespace pdserve_attention {

constexpr int kAmxTileRows = 16;
constexpr int kMaxAmxGroup = 8;
constexpr int kMaxAmxChunks = 4;  // head dims up to 128

inline bool amx_permitted() {
    static const bool permitted = [] {
        constexpr long kArchReqXcompPerm = 0x1023;
        constexpr long kXfeatureXtiledata = 18;
        return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
    }();
    return permitted;
}

// The ldtilecfg operand: palette 1, per tile its bytes a row and its rows.
struct alignas(64) TileConfig {
    uint8_t palette_id = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t bytes_per_row[16] = {};
    uint8_t rows[16] = {};
};

// tmm0: 16 positions x the group's scores (fp32); tmm1: 16 key rows x 32 dims (bf16);
// tmm2: 16 dim pairs x the group's queries (bf16 pairs).
inline void configure_score_tiles(int group_size) {
    TileConfig config;
    config.rows[0] = kAmxTileRows;
    config.bytes_per_row[0] = static_cast<uint16_t>(group_size * 4);
    config.rows[1] = kAmxTileRows;
    config.bytes_per_row[1] = 64;
    config.rows[2] = kAmxTileRows;
    config.bytes_per_row[2] = static_cast<uint16_t>(group_size * 4);
    _tile_loadconfig(&config);
}

// The thread's scratch for one row: the packed queries, and [position][query head] scores
// (then probabilities), a row of `stride` floats per position.
struct AmxRowScratch {
    std::vector<uint32_t> packed_queries;
    std::vector<float> scores;
    int stride = 0;

    void reserve(const Shape& shape, int context_len) {
        stride = (shape.num_heads + 15) / 16 * 16;
        const size_t rows = static_cast<size_t>(context_len + kAmxTileRows);
        if (scores.size() < rows * stride) scores.resize(rows * stride);
        packed_queries.resize(static_cast<size_t>(shape.num_heads) * shape.head_dim / 2);
    }
};

// B tiles of the row's queries: for KV head h and 32-dim chunk c, 16 rows (dim pairs) of the
// group's queries, each a bf16 pair of dims (32c + 2r, 32c + 2r + 1) of one query head.
template <int kGroup, int kChunks>
void pack_queries(const uint16_t* query, int num_kv_heads, uint32_t* packed) {
    constexpr int head_dim = kChunks * 32;
    for (int kv_head = 0; kv_head < num_kv_heads; ++kv_head)
        for (int c = 0; c < kChunks; ++c) {
            uint32_t* tile = packed + (kv_head * kChunks + c) * kAmxTileRows * kGroup;
            for (int r = 0; r < kAmxTileRows; ++r)
                for (int g = 0; g < kGroup; ++g)
                    std::memcpy(tile + r * kGroup + g, query + (kv_head * kGroup + g) * head_dim + c * 32 + 2 * r, 4);
        }
}

// Pass 1: scaled scores of every position for every query head.
template <int kGroup, int kChunks>
void score_context_amx(const uint16_t* query, const uint16_t* key_cache, const int32_t* block_table,
                       int context_len, const Shape& shape, AmxRowScratch& scratch) {
    constexpr int head_dim = kChunks * 32;
    const int row_stride = shape.num_kv_heads * head_dim;
    pack_queries<kGroup, kChunks>(query, shape.num_kv_heads, scratch.packed_queries.data());
    for (int start = 0; start < context_len; start += kAmxTileRows) {
        const int64_t row = static_cast<int64_t>(block_table[start / shape.block_size]) * shape.block_size
                            + start % shape.block_size;
        const uint16_t* keys = key_cache + row * row_stride;
        if (start + kAmxTileRows < context_len) {
            const int next = start + kAmxTileRows;
            const int64_t next_row = static_cast<int64_t>(block_table[next / shape.block_size]) * shape.block_size
                                     + next % shape.block_size;
            prefetch_bytes(key_cache + next_row * row_stride, kAmxTileRows * row_stride * 2);
        }
        for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head) {
            _tile_zero(0);
            for (int c = 0; c < kChunks; ++c) {
                _tile_loadd(1, keys + kv_head * head_dim + c * 32, row_stride * 2);
                _tile_loadd(2, scratch.packed_queries.data() + (kv_head * kChunks + c) * kAmxTileRows * kGroup,
                            kGroup * 4);
                _tile_dpbf16ps(0, 1, 2);
            }
            _tile_stored(0, scratch.scores.data() + static_cast<int64_t>(start) * scratch.stride + kv_head * kGroup,
                         scratch.stride * 4);
        }
    }
}

// Pass 2: probabilities exp(scale * (score - max)) in place; returns nothing, writes each
// head's sum into `sums`.
inline void softmax_context_amx(const Shape& shape, int context_len, AmxRowScratch& scratch, float* sums) {
    const __m512 scale = _mm512_set1_ps(shape.scale);
    for (int lanes = 0; lanes < scratch.stride; lanes += 16) {
        float* column = scratch.scores.data() + lanes;
        __m512 maxima = _mm512_set1_ps(-INFINITY);
        for (int t = 0; t < context_len; ++t)
            maxima = _mm512_max_ps(maxima, _mm512_loadu_ps(column + static_cast<int64_t>(t) * scratch.stride));
        __m512 totals = _mm512_setzero_ps();
        for (int t = 0; t < context_len; ++t) {
            float* scores = column + static_cast<int64_t>(t) * scratch.stride;
            const __m512 p = exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(scores), maxima), scale));
            totals = _mm512_add_ps(totals, p);
            _mm512_storeu_ps(scores, p);
        }
        const int num_lanes = std::min(16, shape.num_heads - lanes);
        _mm512_mask_storeu_ps(sums + lanes, static_cast<__mmask16>((1u << num_lanes) - 1u), totals);
    }
}

// 32 bf16 values as two fp32 vectors, exactly: the even dims (shifted up) and the odd dims
// (masked), so lane j of each holds dim 2j or 2j + 1 of the 32.
inline void widen_bf16x32(const uint16_t* source, __m512& even, __m512& odd) {
    const __m512i pairs = _mm512_loadu_si512(source);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Pass 3: accumulators (per query head 2 * kChunks vectors, even/odd dims) += p * values.
template <int kGroup, int kChunks>
void weigh_values_amx(const uint16_t* value_cache, const int32_t* block_table, int context_len, const Shape& shape,
                      const AmxRowScratch& scratch, __m512* accumulators) {
    constexpr int head_dim = kChunks * 32;
    constexpr int kSliceChunks = kChunks < 2 ? kChunks : 2;  // 64 dims at a time: sums stay in registers
    const int row_stride = shape.num_kv_heads * head_dim;
    for (int start = 0; start < context_len; start += kAmxTileRows) {
        const int num_tokens = std::min(kAmxTileRows, context_len - start);
        const int64_t row = static_cast<int64_t>(block_table[start / shape.block_size]) * shape.block_size
                            + start % shape.block_size;
        if (start + kAmxTileRows < context_len) {
            const int next = start + kAmxTileRows;
            const int64_t next_row = static_cast<int64_t>(block_table[next / shape.block_size]) * shape.block_size
                                     + next % shape.block_size;
            prefetch_bytes(value_cache + next_row * row_stride, kAmxTileRows * row_stride * 2);
        }
        const float* probabilities = scratch.scores.data() + static_cast<int64_t>(start) * scratch.stride;
        for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head)
            for (int first_chunk = 0; first_chunk < kChunks; first_chunk += kSliceChunks) {
                __m512 sums[kGroup][2 * kSliceChunks];
                __m512* group = accumulators + kv_head * kGroup * 2 * kChunks + 2 * first_chunk;
                for (int g = 0; g < kGroup; ++g)
                    for (int v = 0; v < 2 * kSliceChunks; ++v) sums[g][v] = group[g * 2 * kChunks + v];
                const uint16_t* values = value_cache + row * row_stride + kv_head * head_dim + first_chunk * 32;
                for (int t = 0; t < num_tokens; ++t) {
                    __m512 widened[2 * kSliceChunks];
                    for (int c = 0; c < kSliceChunks; ++c)
                        widen_bf16x32(values + static_cast<int64_t>(t) * row_stride + c * 32, widened[2 * c],
                                      widened[2 * c + 1]);
                    const float* weights = probabilities + static_cast<int64_t>(t) * scratch.stride + kv_head * kGroup;
                    for (int g = 0; g < kGroup; ++g) {
                        const __m512 weight = _mm512_set1_ps(weights[g]);
                        for (int v = 0; v < 2 * kSliceChunks; ++v)
                            sums[g][v] = _mm512_fmadd_ps(weight, widened[v], sums[g][v]);
                    }
                }
                for (int g = 0; g < kGroup; ++g)
                    for (int v = 0; v < 2 * kSliceChunks; ++v) group[g * 2 * kChunks + v] = sums[g][v];
            }
    }
}

// One head's output: accumulators (even/odd dims of each 32) / sum, in dim order, as bf16.
template <int kChunks>
inline void store_head_amx(const __m512* accumulators, float sum, uint16_t* output) {
    const __m512 inverse_sum = _mm512_set1_ps(1.f / sum);
    const __m512i low_dims = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i high_dims = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int c = 0; c < kChunks; ++c) {
        const __m512 even = accumulators[2 * c], odd = accumulators[2 * c + 1];
        const __m512 low = _mm512_mul_ps(_mm512_permutex2var_ps(even, low_dims, odd), inverse_sum);
        const __m512 high = _mm512_mul_ps(_mm512_permutex2var_ps(even, high_dims, odd), inverse_sum);
        _mm512_storeu_si512(output + c * 32, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high, low)));
    }
}

template <int kGroup, int kChunks>
void decode_row_amx(const uint16_t* query, const uint16_t* key_cache, const uint16_t* value_cache,
                    const int32_t* block_table, int context_len, const Shape& shape, uint16_t* output) {
    static thread_local AmxRowScratch scratch;
    static thread_local std::vector<__m512> accumulators;
    static thread_local std::vector<float> sums;
    scratch.reserve(shape, context_len);
    sums.resize(scratch.stride);
    accumulators.assign(static_cast<size_t>(shape.num_heads) * 2 * kChunks, _mm512_setzero_ps());
    configure_score_tiles(kGroup);
    score_context_amx<kGroup, kChunks>(query, key_cache, block_table, context_len, shape, scratch);
    _tile_release();
    softmax_context_amx(shape, context_len, scratch, sums.data());
    weigh_values_amx<kGroup, kChunks>(value_cache, block_table, context_len, shape, scratch, accumulators.data());
    for (int head = 0; head < shape.num_heads; ++head)
        store_head_amx<kChunks>(accumulators.data() + head * 2 * kChunks, sums[head],
                                output + static_cast<int64_t>(head) * kChunks * 32);
}

using AmxRowFunction = void (*)(const uint16_t*, const uint16_t*, const uint16_t*, const int32_t*, int,
                                const Shape&, uint16_t*);

template <int kGroup, int... kChunksMinusOne>
constexpr std::array<AmxRowFunction, kMaxAmxChunks> amx_rows_of_group(std::integer_sequence<int, kChunksMinusOne...>) {
    return {decode_row_amx<kGroup, kChunksMinusOne + 1>...};
}

template <int... kGroupMinusOne>
constexpr std::array<std::array<AmxRowFunction, kMaxAmxChunks>, kMaxAmxGroup> amx_row_table(
        std::integer_sequence<int, kGroupMinusOne...>) {
    return {amx_rows_of_group<kGroupMinusOne + 1>(std::make_integer_sequence<int, kMaxAmxChunks>{})...};
}

// The function for rows of these shapes, or null where they need another path (or the
// process may not use AMX).
inline AmxRowFunction amx_row_function(int group_size, int head_dim, int block_size) {
    static constexpr auto table = amx_row_table(std::make_integer_sequence<int, kMaxAmxGroup>{});
    if (head_dim % 32 != 0 || head_dim < 32 || head_dim > 32 * kMaxAmxChunks) return nullptr;
    if (group_size < 1 || group_size > kMaxAmxGroup || block_size % kAmxTileRows != 0) return nullptr;
    if (!amx_permitted()) return nullptr;
    return table[group_size - 1][head_dim / 32 - 1];
}

}  // namespace pdserve_attention

#endif
