// The AVX512-BF16 path of the paged attention kernel (paged_decode.cpp), for CPUs that compute
// bf16 pair dot products in hardware (vdpbf16ps): head dims of 32, 64, 96 or 128 and up to 8
// query heads per KV head. One work item is one query row (a decode), over every KV head.
//
// Three passes instead of an online softmax: the scores of the whole context (keys read once,
// tile by tile), then each head's exact maximum, probabilities and sum over all of them, then
// the probability-weighted sum of the values (values read once). The online form rescales its
// accumulators every tile through a chain of dependent reductions and exps; here the middle
// pass is plain vector work over contiguous scores, and the outer passes have no reductions
// at all, so the CPU overlaps their instructions.
//
// Scores and probabilities live per query head in a scratch buffer of the thread, 16 lanes a
// vector: a tile of up to 16 tokens (never crossing a block) writes 16 lanes at its first
// position, its lanes past the tile's end overwritten by the next tile. Values of two tokens
// are interleaved so one vdpbf16ps adds p_t * v_t + p_t+1 * v_t+1; the accumulators' lanes
// therefore hold dims in the unpack order (see store_head).
#pragma once

#include "paged_common.h"

#if defined(PDSERVE_HAVE_AVX512F) && defined(__AVX512BF16__)
#define PDSERVE_HAVE_AVX512_BF16 1

namespace pdserve_attention {

constexpr int kMaxBf16Group = 8;
constexpr int kMaxBf16Chunks = 4;  // 32-dim chunks of a head: head dims up to 128
constexpr int kLanes = 16;

inline __m512bh load_bf16x32(const uint16_t* src) {
    return reinterpret_cast<__m512bh>(_mm512_loadu_si512(src));
}

// A tile: up to 16 consecutive tokens of one block, starting at context position `start`.
struct Bf16Tile {
    int start;
    int num_tokens;
    int64_t row_offset;  // element offset of its first token's row (all KV heads) in a cache
};

inline Bf16Tile bf16_tile_at(int start, int context_len, const int32_t* block_table, const Shape& shape) {
    const int block = start / shape.block_size, offset = start % shape.block_size;
    const int num_tokens = std::min({kLanes, context_len - start, shape.block_size - offset});
    const int64_t row = static_cast<int64_t>(block_table[block]) * shape.block_size + offset;
    return {start, num_tokens, row * shape.num_kv_heads * shape.head_dim};
}

// The thread's scratch for one row: per query head, `stride` scores (fp32) and as many
// probabilities (bf16); stride covers the context rounded up to 16 plus one spare vector.
struct Bf16RowScratch {
    std::vector<float> scores;
    std::vector<uint16_t> probabilities;
    std::vector<float> sums;
    int stride = 0;

    void reserve(int num_heads, int context_len) {
        stride = (context_len + kLanes - 1) / kLanes * kLanes + kLanes;
        scores.resize(static_cast<size_t>(num_heads) * stride);
        probabilities.resize(static_cast<size_t>(num_heads) * stride + 2);  // a pair may read one past
        sums.resize(num_heads);
    }
    float* scores_of(int head) { return scores.data() + static_cast<int64_t>(head) * stride; }
    uint16_t* probabilities_of(int head) { return probabilities.data() + static_cast<int64_t>(head) * stride; }
};

// Unscaled scores of a tile's tokens for one query head, a lane per token (lanes past the tile
// undefined): each token's dot product as 16 partial sums, then summed across lanes at once.
template <int kChunks>
inline __m512 head_scores(const __m512bh* query, const uint16_t* keys, int row_stride, int num_tokens) {
    __m512 partial_sums[kLanes];
    for (int t = 0; t < kLanes; ++t) {
        __m512 sum = _mm512_setzero_ps();
        if (t < num_tokens)
            for (int c = 0; c < kChunks; ++c)
                sum = _mm512_dpbf16_ps(sum, query[c], load_bf16x32(keys + static_cast<int64_t>(t) * row_stride + c * 32));
        partial_sums[t] = sum;
    }
    return sum_lanes_16(partial_sums);
}

// Pass 1: every head's scaled scores over the whole context.
template <int kGroup, int kChunks>
void score_context(const uint16_t* query, const uint16_t* key_cache, const int32_t* block_table, int context_len,
                   const Shape& shape, Bf16RowScratch& scratch) {
    constexpr int head_dim = kChunks * 32;
    const int row_stride = shape.num_kv_heads * head_dim;
    const __m512 scale = _mm512_set1_ps(shape.scale);
    for (int start = 0; start < context_len;) {
        const Bf16Tile tile = bf16_tile_at(start, context_len, block_table, shape);
        if (start + tile.num_tokens < context_len) {
            const Bf16Tile next = bf16_tile_at(start + tile.num_tokens, context_len, block_table, shape);
            prefetch_bytes(key_cache + next.row_offset, next.num_tokens * row_stride * 2);
        }
        for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head) {
            const uint16_t* keys = key_cache + tile.row_offset + kv_head * head_dim;
            for (int g = 0; g < kGroup; ++g) {
                const int head = kv_head * kGroup + g;
                __m512bh query_chunks[kChunks];
                for (int c = 0; c < kChunks; ++c) query_chunks[c] = load_bf16x32(query + head * head_dim + c * 32);
                const __m512 scores = head_scores<kChunks>(query_chunks, keys, row_stride, tile.num_tokens);
                _mm512_storeu_ps(scratch.scores_of(head) + start, _mm512_mul_ps(scores, scale));
            }
        }
        start += tile.num_tokens;
    }
}

// Pass 2: each head's probabilities exp(score - max) as bf16, and their fp32 sum.
inline void softmax_context(int num_heads, int context_len, Bf16RowScratch& scratch) {
    const int num_vectors = (context_len + kLanes - 1) / kLanes;
    const __mmask16 last = static_cast<__mmask16>(0xFFFFu >> (num_vectors * kLanes - context_len));
    for (int head = 0; head < num_heads; ++head) {
        const float* scores = scratch.scores_of(head);
        __m512 maxima = _mm512_set1_ps(-INFINITY);
        for (int v = 0; v + 1 < num_vectors; ++v) maxima = _mm512_max_ps(maxima, _mm512_loadu_ps(scores + v * kLanes));
        maxima = _mm512_mask_max_ps(maxima, last, maxima, _mm512_loadu_ps(scores + (num_vectors - 1) * kLanes));
        const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(maxima));
        __m512 sums = _mm512_setzero_ps();
        uint16_t* probabilities = scratch.probabilities_of(head);
        for (int v = 0; v < num_vectors; ++v) {
            const __mmask16 valid = v + 1 < num_vectors ? static_cast<__mmask16>(0xFFFF) : last;
            const __m512 p = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + v * kLanes), max)));
            sums = _mm512_add_ps(sums, p);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(probabilities + v * kLanes),
                                reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(p)));
        }
        probabilities[num_vectors * kLanes] = 0;  // the partner of an odd last token
        scratch.sums[head] = _mm512_reduce_add_ps(sums);
    }
}

// The bf16 pair (p_t, p_t+1) as one 32-bit lane, broadcast; p_t+1 is zero past a tile's end
// because its value row is zero there.
inline __m512bh probability_pair(const uint16_t* probabilities, int t) {
    uint32_t pair;
    std::memcpy(&pair, probabilities + t, sizeof(pair));
    return reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
}

// Pass 3: accumulators[head][...] += p * values over the whole context, a tile at a time.
// `accumulators`: per query head, 2 * kChunks vectors.
template <int kGroup, int kChunks>
void weigh_values(const uint16_t* value_cache, const int32_t* block_table, int context_len, const Shape& shape,
                  Bf16RowScratch& scratch, __m512* accumulators) {
    constexpr int head_dim = kChunks * 32;
    const int row_stride = shape.num_kv_heads * head_dim;
    for (int start = 0; start < context_len;) {
        const Bf16Tile tile = bf16_tile_at(start, context_len, block_table, shape);
        if (start + tile.num_tokens < context_len) {
            const Bf16Tile next = bf16_tile_at(start + tile.num_tokens, context_len, block_table, shape);
            prefetch_bytes(value_cache + next.row_offset, next.num_tokens * row_stride * 2);
        }
        for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head) {
            __m512 sums[kGroup][2 * kChunks];
            __m512* group_accumulators = accumulators + kv_head * kGroup * 2 * kChunks;
            for (int g = 0; g < kGroup; ++g)
                for (int c = 0; c < 2 * kChunks; ++c) sums[g][c] = group_accumulators[g * 2 * kChunks + c];
            const uint16_t* values = value_cache + tile.row_offset + kv_head * head_dim;
            for (int t = 0; t < tile.num_tokens; t += 2) {
                const uint16_t* row = values + static_cast<int64_t>(t) * row_stride;
                const bool has_next = t + 1 < tile.num_tokens;
                __m512bh low[kChunks], high[kChunks];
                for (int c = 0; c < kChunks; ++c) {
                    const __m512i first = _mm512_loadu_si512(row + c * 32);
                    const __m512i second = has_next ? _mm512_loadu_si512(row + row_stride + c * 32)
                                                    : _mm512_setzero_si512();
                    low[c] = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi16(first, second));
                    high[c] = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi16(first, second));
                }
                for (int g = 0; g < kGroup; ++g) {
                    const __m512bh pair = probability_pair(scratch.probabilities_of(kv_head * kGroup + g), start + t);
                    for (int c = 0; c < kChunks; ++c) {
                        sums[g][2 * c] = _mm512_dpbf16_ps(sums[g][2 * c], low[c], pair);
                        sums[g][2 * c + 1] = _mm512_dpbf16_ps(sums[g][2 * c + 1], high[c], pair);
                    }
                }
            }
            for (int g = 0; g < kGroup; ++g)
                for (int c = 0; c < 2 * kChunks; ++c) group_accumulators[g * 2 * kChunks + c] = sums[g][c];
        }
        start += tile.num_tokens;
    }
}

// Undoes the unpack order and normalizes: accumulator 2c lane i holds dim 32c + 8(i/4) + i%4,
// accumulator 2c+1 the dim 4 above.
template <int kChunks>
inline void store_head(const __m512* accumulators, float sum, uint16_t* output) {
    alignas(64) float lanes[kLanes];
    const float inverse_sum = 1.f / sum;
    for (int c = 0; c < 2 * kChunks; ++c) {
        _mm512_store_ps(lanes, accumulators[c]);
        const int base = (c / 2) * 32 + (c % 2) * 4;
        for (int i = 0; i < kLanes; ++i) output[base + 8 * (i / 4) + i % 4] = float_to_bf16(lanes[i] * inverse_sum);
    }
}

template <int kGroup, int kChunks>
void decode_row_bf16(const uint16_t* query, const uint16_t* key_cache, const uint16_t* value_cache,
                     const int32_t* block_table, int context_len, const Shape& shape, uint16_t* output) {
    static thread_local Bf16RowScratch scratch;
    static thread_local std::vector<__m512> accumulators;
    scratch.reserve(shape.num_heads, context_len);
    accumulators.assign(static_cast<size_t>(shape.num_heads) * 2 * kChunks, _mm512_setzero_ps());
    score_context<kGroup, kChunks>(query, key_cache, block_table, context_len, shape, scratch);
    softmax_context(shape.num_heads, context_len, scratch);
    weigh_values<kGroup, kChunks>(value_cache, block_table, context_len, shape, scratch, accumulators.data());
    for (int head = 0; head < shape.num_heads; ++head)
        store_head<kChunks>(accumulators.data() + head * 2 * kChunks, scratch.sums[head],
                            output + static_cast<int64_t>(head) * kChunks * 32);
}

using Bf16RowFunction = void (*)(const uint16_t*, const uint16_t*, const uint16_t*, const int32_t*, int,
                                 const Shape&, uint16_t*);

template <int kGroup, int... kChunksMinusOne>
constexpr std::array<Bf16RowFunction, kMaxBf16Chunks> bf16_rows_of_group(std::integer_sequence<int, kChunksMinusOne...>) {
    return {decode_row_bf16<kGroup, kChunksMinusOne + 1>...};
}

template <int... kGroupMinusOne>
constexpr std::array<std::array<Bf16RowFunction, kMaxBf16Chunks>, kMaxBf16Group> bf16_row_table(
        std::integer_sequence<int, kGroupMinusOne...>) {
    return {bf16_rows_of_group<kGroupMinusOne + 1>(std::make_integer_sequence<int, kMaxBf16Chunks>{})...};
}

// The function for rows of these shapes, or null where they need another path.
inline Bf16RowFunction bf16_row_function(int group_size, int head_dim) {
    static constexpr auto table = bf16_row_table(std::make_integer_sequence<int, kMaxBf16Group>{});
    if (head_dim % 32 != 0 || head_dim < 32 || head_dim > 32 * kMaxBf16Chunks) return nullptr;
    if (group_size < 1 || group_size > kMaxBf16Group) return nullptr;
    return table[group_size - 1][head_dim / 32 - 1];
}

}  // namespace pdserve_attention

#endif
