// Paged attention for the CPU: query rows read keys and values in place through their
// sequence's block table (no gathered copy), 16-token tiles aligned to the blocks, softmax in
// fp32.
//
// Called through ctypes by shared/attention/native_decode.py, once per layer per step.
// Layouts (all contiguous, row-major):
//   query        (num_rows, num_heads, head_dim)
//   key_cache    (num_blocks, block_size, num_kv_heads, head_dim)   one layer's keys
//   value_cache  same as key_cache
//   block_tables (num_segments, max_blocks_per_seq) int32
//   context_lens (num_segments,) int32: the context of each segment's LAST row
//   query_lens   (num_segments,) int32, or null for one row per segment (plain decode)
//   output       (num_rows, num_heads, head_dim)
// A segment is one sequence's consecutive query rows: a decode row, or a prompt chunk's rows,
// row i of a chunk of n seeing context_len - n + 1 + i positions. A row's result depends only
// on its own query, context and cache contents: never on the other rows, the segment it came
// in or the thread count (deterministic mode relies on this, docs/deterministic.md).
//
// Four paths, each available where the CPU this was compiled for has its instructions and the
// shapes fit (path_available); the caller picks one (native_decode.py: the fastest by default,
// any available one when forced, the AVX-512F or portable one in deterministic mode):
// - AMX (paged_amx.h; bf16, Xeons since Sapphire Rapids): one work item per row; scores by AMX
//   tile matmuls on the keys as they lie in the cache, an exact softmax over the whole context,
//   values by fp32 FMAs.
// - AVX512-BF16 (paged_bf16.h; bf16): one work item per row, the same three passes with bf16
//   pair dot products (vdpbf16ps).
// - AVX-512F (head_dim a multiple of 16, either dtype): one work item per up to kRowsPerItem
//   rows of a segment, online softmax; each tile's keys and values, every KV head, are read
//   front to back once for all those rows (converted to fp32 once), and each row folds the
//   tile into its own state with the same instructions whichever rows share the tile.
// - Portable (anything else): a work item per (row, KV head), per-block scalar/omp-simd loops.
// On every path the query heads sharing a KV head are done together. paged_common.h holds what
// the paths share.
#include "paged_common.h"
#include "paged_amx.h"
#include "paged_bf16.h"

namespace {

using namespace pdserve_attention;

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





#ifdef PDSERVE_HAVE_AVX512F
// The AVX-512F path: bf16 is widened to fp32 exactly (see lane_of_dim), dot products and the
// weighted sum of values are fp32 FMAs, 16 lanes a vector.
constexpr int kTileTokens = 16;
// Rows of a segment per work item: each item re-reads its tiles, so more rows share more of
// the reading, fewer balance the threads better (a prompt chunk's later rows see more context).
constexpr int kRowsPerItem = 16;
// Bytes of the next tile's keys and of its values requested ahead: its first lines, which
// start the hardware prefetchers on a block they could not guess (on the session's Xeon, one
// thread, KV from memory: requesting the whole tile read ~15% slower, nothing ~5% slower).
constexpr int kPrefetchBytes = 512;

// One row's online softmax for the query heads of one KV head, views into a flat buffer:
// queries [group][head_dim] (already scaled), accumulators [group][head_dim], then the
// running max and sum of each query head.
struct RowHeadState {
    float* queries;
    float* accumulators;
    float* running_max;
    float* running_sum;
};

inline int64_t state_floats(int group_size, int head_dim) {
    return static_cast<int64_t>(group_size) * (2 * head_dim + 2);
}

inline RowHeadState state_view(float* base, int group_size, int head_dim) {
    float* maxima = base + 2 * group_size * head_dim;
    return {base, base + group_size * head_dim, maxima, maxima + group_size};
}

// Where dim d of a row sits in the fp32 lane order this path computes in. bf16 rows are
// widened 32 dims at a time from one 512-bit load: a shift gives the even dims, a mask the odd
// ones (each bf16 is the high half of its fp32), stored even dims first; a last 16 dims (head
// dims of 16 mod 32) and fp32 rows keep their order. Queries and accumulators use the same order.
template <typename T>
inline int lane_of_dim(int d, int head_dim) {
    if (std::is_same_v<T, float> || d >= head_dim / 32 * 32) return d;
    return d / 32 * 32 + (d % 2) * 16 + (d % 32) / 2;
}

template <typename T>
void start_state(const T* query, float scale, int group_size, int head_dim, RowHeadState state) {
    float row[kMaxHeadDim];
    for (int q = 0; q < group_size; ++q) {
        float* scaled = state.queries + q * head_dim;
        load_row(query + static_cast<int64_t>(q) * head_dim, row, head_dim);
        for (int d = 0; d < head_dim; ++d) scaled[lane_of_dim<T>(d, head_dim)] = row[d] * scale;
        std::memset(state.accumulators + q * head_dim, 0, sizeof(float) * head_dim);
        state.running_max[q] = -INFINITY;
        state.running_sum[q] = 0.f;
    }
}

template <typename T>
void finish_state(const RowHeadState& state, int group_size, int head_dim, T* output) {
    float row[kMaxHeadDim];
    for (int q = 0; q < group_size; ++q) {
        const float inverse_sum = 1.f / state.running_sum[q];
        const float* accumulator = state.accumulators + q * head_dim;
        for (int d = 0; d < head_dim; ++d) row[d] = accumulator[lane_of_dim<T>(d, head_dim)] * inverse_sum;
        store_row(row, output + static_cast<int64_t>(q) * head_dim, head_dim);
    }
}

// A tile's `num_rows` rows of `head_dim` values as fp32 in lane order (lane_of_dim): bf16
// widened into `scratch` (exact), fp32 used in place.
inline const float* tile_as_float(const uint16_t* source, int num_rows, int head_dim, std::vector<float>& scratch) {
    const size_t count = static_cast<size_t>(num_rows) * head_dim;
    if (scratch.size() < count) scratch.resize(count);
    float* target = scratch.data();
    const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    const int paired_dims = head_dim / 32 * 32;
    for (int row = 0; row < num_rows; ++row, source += head_dim, target += head_dim) {
        for (int d = 0; d < paired_dims; d += 32) {
            const __m512i pairs = _mm512_loadu_si512(source + d);
            _mm512_storeu_ps(target + d, _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)));
            _mm512_storeu_ps(target + d + 16, _mm512_castsi512_ps(_mm512_and_si512(pairs, high_half)));
        }
        if (paired_dims < head_dim) {
            const __m256i last = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(source + paired_dims));
            const __m512i wide = _mm512_cvtepu16_epi32(last);
            _mm512_storeu_ps(target + paired_dims, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
        }
    }
    return scratch.data();
}

inline const float* tile_as_float(const float* source, int, int, std::vector<float>&) { return source; }

// Scaled scores of `num_tokens` (1..16) keys for one query head, lanes past them -inf: each
// token's dot product as 16-lane partial sums (dims 16v + lane, v in order), then summed
// across lanes for the 16 tokens at once.
template <int kVecs>
inline __m512 tile_scores_f32(const float* query, const float* keys, int row_stride, int num_tokens) {
    __m512 query_v[kVecs];
    for (int v = 0; v < kVecs; ++v) query_v[v] = _mm512_loadu_ps(query + 16 * v);
    __m512 partial_sums[kTileTokens];
    for (int t = 0; t < kTileTokens; ++t) {
        __m512 sum = _mm512_setzero_ps();
        if (t < num_tokens)
            for (int v = 0; v < kVecs; ++v)
                sum = _mm512_fmadd_ps(query_v[v], _mm512_loadu_ps(keys + static_cast<int64_t>(t) * row_stride + 16 * v),
                                      sum);
        partial_sums[t] = sum;
    }
    const __mmask16 valid = static_cast<__mmask16>((1u << num_tokens) - 1u);
    return _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY), sum_lanes_16(partial_sums));
}

// Folds `num_tokens` (1..16) keys/values of one KV head into one row's state: the scores of
// every query head, then their online-softmax updates, then the values in token order. Each
// phase's query heads are independent, so their dependency chains overlap.
template <int kVecs>
void attend_tile_f32(const float* keys, const float* values, int row_stride, int num_tokens, int group_size,
                     RowHeadState state) {
    constexpr int head_dim = kVecs * 16;
    const __mmask16 valid = static_cast<__mmask16>((1u << num_tokens) - 1u);
    __m512 scores[kMaxQueriesPerKv];
    for (int q = 0; q < group_size; ++q)
        scores[q] = tile_scores_f32<kVecs>(state.queries + q * head_dim, keys, row_stride, num_tokens);
    alignas(64) float token_weights[kMaxQueriesPerKv][kTileTokens];
    alignas(64) float max_steps[kMaxQueriesPerKv];  // old max - new max, lane q
    for (int q = 0; q < group_size; ++q) {
        const float old_max = state.running_max[q];
        const float new_max = std::fmax(old_max, _mm512_reduce_max_ps(scores[q]));
        _mm512_store_ps(token_weights[q],
                        _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(scores[q], _mm512_set1_ps(new_max)))));
        max_steps[q] = old_max - new_max;
        state.running_max[q] = new_max;
    }
    alignas(64) float corrections[kMaxQueriesPerKv];  // one exp for every query head's rescale
    const __mmask16 heads = static_cast<__mmask16>((1u << group_size) - 1u);
    _mm512_store_ps(corrections, exp16(_mm512_maskz_loadu_ps(heads, max_steps)));
    for (int q = 0; q < group_size; ++q)
        state.running_sum[q] = std::fma(state.running_sum[q], corrections[q],
                                        _mm512_reduce_add_ps(_mm512_load_ps(token_weights[q])));
    for (int q = 0; q < group_size; ++q) {
        float* accumulator = state.accumulators + q * head_dim;
        __m512 sums[kVecs];
        for (int v = 0; v < kVecs; ++v)
            sums[v] = _mm512_mul_ps(_mm512_loadu_ps(accumulator + 16 * v), _mm512_set1_ps(corrections[q]));
        for (int t = 0; t < num_tokens; ++t) {
            const __m512 weight = _mm512_set1_ps(token_weights[q][t]);
            const float* value = values + static_cast<int64_t>(t) * row_stride;
            for (int v = 0; v < kVecs; ++v) sums[v] = _mm512_fmadd_ps(weight, _mm512_loadu_ps(value + 16 * v), sums[v]);
        }
        for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(accumulator + 16 * v, sums[v]);
    }
}

// The tile starting at context position `start` of a sequence whose longest row sees
// `context_len` positions: at most 16 tokens, never past the end of a block, so a tile is
// contiguous rows of one block; `row_offset` is its first row's offset in the cache (values).
struct Tile {
    int num_tokens;
    int64_t row_offset;
};

inline Tile tile_at(int start, int context_len, const int32_t* block_table, const Shape& shape) {
    const int block = start / shape.block_size, offset = start % shape.block_size;
    const int num_tokens = std::min({kTileTokens, context_len - start, shape.block_size - offset});
    const int64_t row = static_cast<int64_t>(block_table[block]) * shape.block_size + offset;
    return {num_tokens, row * shape.num_kv_heads * shape.head_dim};
}

// Query rows 0..num_rows-1 of one sequence, row r seeing the first first_context + r
// positions. The tiles are walked once for all the rows; a row takes each tile's tokens up to
// its own position (its last tile is cut where its context ends, exactly as if it were alone).
template <typename T, int kVecs>
void attend_rows(const T* queries, const T* key_cache, const T* value_cache, const int32_t* block_table,
                 int first_context, int num_rows, const Shape& shape, T* outputs) {
    constexpr int head_dim = kVecs * 16;
    const int group_size = shape.num_heads / shape.num_kv_heads;
    const int row_stride = shape.num_kv_heads * head_dim;
    const int64_t row_elements = static_cast<int64_t>(shape.num_heads) * head_dim;
    const int64_t per_state = state_floats(group_size, head_dim);
    static thread_local std::vector<float> states, key_tile, value_tile;
    states.resize(static_cast<size_t>(num_rows) * shape.num_kv_heads * per_state);
    auto state_of = [&](int row, int kv_head) {
        return state_view(states.data() + (static_cast<int64_t>(row) * shape.num_kv_heads + kv_head) * per_state,
                          group_size, head_dim);
    };
    for (int row = 0; row < num_rows; ++row)
        for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head)
            start_state(queries + row * row_elements + kv_head * group_size * head_dim, shape.scale, group_size,
                        head_dim, state_of(row, kv_head));
    const int last_context = first_context + num_rows - 1;
    for (int start = 0; start < last_context;) {
        const Tile tile = tile_at(start, last_context, block_table, shape);
        const int next = start + tile.num_tokens;
        if (next < last_context) {
            const Tile following = tile_at(next, last_context, block_table, shape);
            prefetch_rows(key_cache + following.row_offset, value_cache + following.row_offset,
                          std::min(kPrefetchBytes, following.num_tokens * row_stride * static_cast<int>(sizeof(T))));
        }
        const int tile_rows = tile.num_tokens * shape.num_kv_heads;
        const float* keys = tile_as_float(key_cache + tile.row_offset, tile_rows, head_dim, key_tile);
        const float* values = tile_as_float(value_cache + tile.row_offset, tile_rows, head_dim, value_tile);
        for (int row = std::max(0, start + 1 - first_context); row < num_rows; ++row) {
            const int num_tokens = std::min(tile.num_tokens, first_context + row - start);
            for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head)
                attend_tile_f32<kVecs>(keys + kv_head * head_dim, values + kv_head * head_dim, row_stride, num_tokens,
                                       group_size, state_of(row, kv_head));
        }
        start = next;
    }
    for (int row = 0; row < num_rows; ++row)
        for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head)
            finish_state(state_of(row, kv_head), group_size, head_dim,
                         outputs + row * row_elements + kv_head * group_size * head_dim);
}

template <typename T>
using RowsFunction = void (*)(const T*, const T*, const T*, const int32_t*, int, int, const Shape&, T*);

template <typename T, int... kVecsMinusOne>
RowsFunction<T> rows_function_in(int head_dim, std::integer_sequence<int, kVecsMinusOne...>) {
    static constexpr RowsFunction<T> functions[] = {attend_rows<T, kVecsMinusOne + 1>...};
    return functions[head_dim / 16 - 1];
}

// The AVX-512F function for this head_dim, or null where the shape needs the portable path.
template <typename T>
RowsFunction<T> avx512f_rows_function(int head_dim) {
    if (head_dim % 16 != 0 || head_dim < 16 || head_dim > kMaxHeadDim) return nullptr;
    return rows_function_in<T>(head_dim, std::make_integer_sequence<int, kMaxHeadDim / 16>{});
}
#endif

enum class Path { kPortable = 0, kAvx512F = 1, kAvx512Bf16 = 2, kAmx = 3 };

// Whether this build can run rows of these shapes on `path` (the portable path runs anything).
template <typename T>
bool path_available(Path path, int group_size, int head_dim, int block_size) {
    switch (path) {
        case Path::kPortable:
            return true;
        case Path::kAvx512F:
#ifdef PDSERVE_HAVE_AVX512F
            return avx512f_rows_function<T>(head_dim) != nullptr;
#else
            return false;
#endif
        case Path::kAvx512Bf16:
#ifdef PDSERVE_HAVE_AVX512_BF16
            return std::is_same_v<T, uint16_t> && bf16_row_function(group_size, head_dim) != nullptr;
#else
            return false;
#endif
        case Path::kAmx:
#ifdef PDSERVE_HAVE_AMX
            return std::is_same_v<T, uint16_t> && amx_row_function(group_size, head_dim, block_size) != nullptr;
#else
            (void)block_size;
            return false;
#endif
    }
    return false;
}

// One query row: where it is in `query`/`output`, what it sees.
struct RowRef {
    int64_t row;
    int context_len;
    const int32_t* block_table;
};

// Consecutive rows of one segment, the first seeing first_context positions: a work item of
// the AVX-512F path.
struct RowSpan {
    int64_t first_row;
    int first_context;
    int num_rows;
    const int32_t* block_table;
};

struct Segments {
    const int32_t* block_tables;
    const int32_t* context_lens;
    const int32_t* query_lens;  // null: one row each
    int num_segments;

    int query_len(int segment) const { return query_lens == nullptr ? 1 : query_lens[segment]; }

    // Every segment's rows, cut into spans of at most max_rows.
    std::vector<RowSpan> spans(int max_rows, const Shape& shape) const {
        std::vector<RowSpan> result;
        int64_t first_row = 0;
        for (int segment = 0; segment < num_segments; ++segment) {
            const int num_rows = query_len(segment);
            const int32_t* table = block_tables + static_cast<int64_t>(segment) * shape.max_blocks_per_seq;
            const int first_context = context_lens[segment] - num_rows + 1;
            for (int done = 0; done < num_rows; done += max_rows)
                result.push_back({first_row + done, first_context + done, std::min(max_rows, num_rows - done), table});
            first_row += num_rows;
        }
        return result;
    }

    std::vector<RowRef> rows(const Shape& shape) const {
        std::vector<RowRef> result;
        for (const RowSpan& span : spans(1, shape))
            result.push_back({span.first_row, span.first_context, span.block_table});
        return result;
    }
};

template <typename T>
void attend_all(const T* query, const T* key_cache, const T* value_cache, const Segments& segments, T* output,
                const Shape& shape, Path path, int num_threads) {
    const int64_t row_elements = static_cast<int64_t>(shape.num_heads) * shape.head_dim;
#ifdef PDSERVE_HAVE_AMX
    if constexpr (std::is_same_v<T, uint16_t>) {
        if (path == Path::kAmx) {
            const AmxRowFunction attend =
                amx_row_function(shape.num_heads / shape.num_kv_heads, shape.head_dim, shape.block_size);
            const std::vector<RowRef> rows = segments.rows(shape);
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
            for (size_t i = 0; i < rows.size(); ++i)
                attend(query + rows[i].row * row_elements, key_cache, value_cache, rows[i].block_table,
                       rows[i].context_len, shape, output + rows[i].row * row_elements);
            return;
        }
    }
#endif
#ifdef PDSERVE_HAVE_AVX512_BF16
    if constexpr (std::is_same_v<T, uint16_t>) {
        if (path == Path::kAvx512Bf16) {
            const Bf16RowFunction attend = bf16_row_function(shape.num_heads / shape.num_kv_heads, shape.head_dim);
            const std::vector<RowRef> rows = segments.rows(shape);
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
            for (size_t i = 0; i < rows.size(); ++i)
                attend(query + rows[i].row * row_elements, key_cache, value_cache, rows[i].block_table,
                       rows[i].context_len, shape, output + rows[i].row * row_elements);
            return;
        }
    }
#endif
#ifdef PDSERVE_HAVE_AVX512F
    if (path == Path::kAvx512F) {
        const RowsFunction<T> attend = avx512f_rows_function<T>(shape.head_dim);
        std::vector<RowSpan> spans = segments.spans(kRowsPerItem, shape);
        std::stable_sort(spans.begin(), spans.end(), [](const RowSpan& a, const RowSpan& b) {
            return a.first_context + a.num_rows > b.first_context + b.num_rows;  // longest first
        });
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
        for (size_t i = 0; i < spans.size(); ++i)
            attend(query + spans[i].first_row * row_elements, key_cache, value_cache, spans[i].block_table,
                   spans[i].first_context, spans[i].num_rows, shape, output + spans[i].first_row * row_elements);
        return;
    }
#endif
    (void)path;
    const std::vector<RowRef> rows = segments.rows(shape);
    const int64_t num_items = static_cast<int64_t>(rows.size()) * shape.num_kv_heads;
#pragma omp parallel for schedule(dynamic, 4) num_threads(num_threads)
    for (int64_t item = 0; item < num_items; ++item) {
        const RowRef& row = rows[item / shape.num_kv_heads];
        decode_one(query + row.row * row_elements, key_cache, value_cache, row.block_table, row.context_len,
                   static_cast<int>(item % shape.num_kv_heads), shape, output + row.row * row_elements);
    }
}

}  // namespace

extern "C" {

// Limits the caller checks before calling (returned so Python never hard-codes them).
int pdserve_paged_decode_max_head_dim() { return kMaxHeadDim; }
int pdserve_paged_decode_max_queries_per_kv() { return kMaxQueriesPerKv; }
int pdserve_paged_decode_max_block_size() { return kMaxBlockSize; }

// Writes each new token's key and value row (`row_bytes` each, contiguous; consecutive tokens
// `token_stride` bytes apart) at its slot of the caches (slot = block * block_size + offset).
// The caller checks every slot is inside the caches.
void pdserve_store_kv(const char* keys, const char* values, int64_t token_stride, const int64_t* slots,
                      int64_t num_tokens, int64_t row_bytes, char* key_cache, char* value_cache) {
    for (int64_t t = 0; t < num_tokens; ++t) {
        std::memcpy(key_cache + slots[t] * row_bytes, keys + t * token_stride, row_bytes);
        std::memcpy(value_cache + slots[t] * row_bytes, values + t * token_stride, row_bytes);
    }
}

// Path numbers: 0 portable, 1 AVX-512F, 2 AVX512-BF16, 3 AMX; each faster than the one before.
// 1 when this build can run rows of these shapes on `path`, else 0.
int pdserve_paged_attention_path_available(int path, int group_size, int head_dim, int block_size, int is_bf16) {
    if (path < 0 || path > 3) return 0;
    const Path chosen = static_cast<Path>(path);
    return is_bf16 ? path_available<uint16_t>(chosen, group_size, head_dim, block_size)
                   : path_available<float>(chosen, group_size, head_dim, block_size);
}

// `path` must be available for the shapes (the caller checks with the two functions above).
void pdserve_paged_attention_bf16(const uint16_t* query, const uint16_t* key_cache, const uint16_t* value_cache,
                                  const int32_t* block_tables, const int32_t* context_lens, const int32_t* query_lens,
                                  uint16_t* output, int num_segments, int num_heads, int num_kv_heads, int head_dim,
                                  int block_size, int max_blocks_per_seq, float scale, int path, int num_threads) {
    Shape shape{num_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq, scale};
    Segments segments{block_tables, context_lens, query_lens, num_segments};
    attend_all(query, key_cache, value_cache, segments, output, shape, static_cast<Path>(path), num_threads);
}

void pdserve_paged_attention_f32(const float* query, const float* key_cache, const float* value_cache,
                                 const int32_t* block_tables, const int32_t* context_lens, const int32_t* query_lens,
                                 float* output, int num_segments, int num_heads, int num_kv_heads, int head_dim,
                                 int block_size, int max_blocks_per_seq, float scale, int path, int num_threads) {
    Shape shape{num_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq, scale};
    Segments segments{block_tables, context_lens, query_lens, num_segments};
    attend_all(query, key_cache, value_cache, segments, output, shape, static_cast<Path>(path), num_threads);
}

}  // extern "C"
