// paged.cu: paged attention on the GPU (vLLM PagedAttention; split-KV as FlashDecoding).
// Pool layout as the CPU side: [num_blocks, kv_heads, block_size, d]; block tables i32
// [batch, max_blocks]; q/out [batch, q_heads, q_len, d]; the q_len new tokens are the last
// positions of each context (row i sees keys 0 ..= ctx − q_len + i; with window > 0 only the
// last `window` of them: key j iff j <= p and p − j < window, p = ctx − q_len + i).
// softcap > 0: scores become softcap · tanh(scale · q·k / softcap) (Gemma-2); 0 = off.
//
// paged_decode_d{64,128}_*: one block per (KV head · row chunk, sequence, partition).
//   Each warp owns 2 query rows of the KV head's group and walks the partition's keys four
//   at a time (paged_decode_k2_*: eight, their loads issued together): 8 lanes per key, each lane 8·(d/64) contiguous elements (16-byte loads), a
//   3-shuffle dot product, an online softmax per (row, key lane group) in the log2 domain,
//   merged across the 4 groups at the end. K/V rows are read once per row chunk.
//   One partition: normalised output written directly. Several: f32 partial outputs and
//   log2-sum-exp per partition, combined by paged_reduce_*. Partitions cover only the
//   positions some row of the sequence sees (from the first row's window start), so blocks
//   wholly before the window are never read and no partition is empty.
// paged_decode_pipe_d{64,128}_*: the same blocks, warps and lanes, the key loop
//   software-pipelined (the next step's K/V in flight while a step computes; see
//   paged_decode_pipe) and the online softmax rescaled once per step.
// paged_append_*: writes new tokens' K/V ([tokens, kv_heads, d]) into pool slots
//   (slot = block·block_size + offset; negative = padding, skipped).

constexpr int ROWS_PER_WARP = 2;

// The first position any of a sequence's q_len new rows sees: the first row's window start.
__device__ __forceinline__ int visible_start(int ctx, int q_len, int window) {
    return window > 0 ? max(0, ctx - q_len + 1 - window) : 0;
}

// Where a decode block's warp works: its KV head, sequence, partition (keys k_begin ..
// k_end) and first query row. False when the block has nothing to do (a partition past a
// shorter sequence's end, or a row chunk past the group's rows).
struct DecodeBlock {
    int h, b, part, group, rows, ctx, n_parts, k_begin, k_end, row0;
};
__device__ __forceinline__ bool decode_block(DecodeBlock& w, const int* __restrict__ ctx_lens,
                                             int hq, int hkv, int q_len, int part_tokens,
                                             int row_chunks, int window) {
    const int warp = threadIdx.x >> 5, chunk = blockIdx.x % row_chunks;
    w.h = blockIdx.x / row_chunks;
    w.b = blockIdx.y;
    w.part = blockIdx.z;
    w.group = hq / hkv;
    w.rows = w.group * q_len;
    w.ctx = ctx_lens[w.b];
    const int k_first = visible_start(w.ctx, q_len, window);
    w.n_parts = (w.ctx - k_first + part_tokens - 1) / part_tokens;
    if (w.part >= w.n_parts) return false;
    w.k_begin = k_first + w.part * part_tokens;
    w.k_end = min(w.ctx, w.k_begin + part_tokens);
    w.row0 = chunk * (blockDim.x >> 5) * ROWS_PER_WARP + warp * ROWS_PER_WARP;
    return w.row0 < w.rows;
}

// Whether a row whose last key is `last_key` sees key j (causal, and inside the window).
__device__ __forceinline__ bool sees(int j, int last_key, int window) {
    return j <= last_key && !(window > 0 && last_key - j >= window);
}

// The logit soft-cap in the log2 domain: s = sl2·q·k → cap·log2e · tanh(s / (cap·log2e));
// the identity when off (cap 0).
struct Softcap {
    float l2, inv;
    __device__ explicit Softcap(float cap)
        : l2(cap * 1.4426950408889634f), inv(cap > 0.0f ? 1.0f / (cap * 1.4426950408889634f) : 0.0f) {}
    __device__ float operator()(float s) const { return inv > 0.0f ? l2 * tanh_f32(s * inv) : s; }
};

// The start of a decode block's warp: its rows' queries (scaled into the log2 domain), empty
// accumulators and the last key each row sees. A missing second row repeats the first.
template <typename T, int CH>
__device__ __forceinline__ void init_rows(const T* __restrict__ q, float (&qv)[ROWS_PER_WARP][CH * 8],
                                          float (&acc)[ROWS_PER_WARP][CH * 8],
                                          float (&m)[ROWS_PER_WARP], float (&l)[ROWS_PER_WARP],
                                          int (&last_key)[ROWS_PER_WARP], const DecodeBlock& w,
                                          int hq, int q_len, int sub, float scale) {
    constexpr int D = CH * 64;
    const float sl2 = scale * 1.4426950408889634f;
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        const int row = min(w.row0 + r, w.rows - 1);
        const int head = w.h * w.group + row / q_len, i = row % q_len;
        const T* qr = q + (((size_t)w.b * hq + head) * q_len + i) * D;
#pragma unroll
        for (int c = 0; c < CH; ++c) load8(qr + c * 64 + sub * 8, &qv[r][c * 8]);
#pragma unroll
        for (int e = 0; e < CH * 8; ++e) {
            qv[r][e] *= sl2;
            acc[r][e] = 0.0f;
        }
        m[r] = -CUDART_INF_F;
        l[r] = 0.0f;
        last_key[r] = w.ctx - q_len + i;
    }
}

// The end of a decode block's warp: merges the 4 key groups' online softmax states (lanes
// sub, sub+8, sub+16, sub+24) and writes each row's normalised output (one partition) or its
// f32 partial output and log2-sum-exp (several).
template <typename T, int CH>
__device__ __forceinline__ void finish_rows(float (&acc)[ROWS_PER_WARP][CH * 8],
                                            float (&m)[ROWS_PER_WARP], float (&l)[ROWS_PER_WARP],
                                            T* __restrict__ out, float* __restrict__ part_o,
                                            float* __restrict__ part_lse, const DecodeBlock& w,
                                            int hq, int q_len, int batch, int sub, int kg) {
    constexpr int D = CH * 64;
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
#pragma unroll
        for (int off = 8; off < 32; off <<= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m[r], off);
            const float l2 = __shfl_xor_sync(0xffffffffu, l[r], off);
            const float mnew = fmaxf(m[r], m2);
            const float c1 = mnew == -CUDART_INF_F ? 0.0f : exp2f(m[r] - mnew);
            const float c2 = mnew == -CUDART_INF_F ? 0.0f : exp2f(m2 - mnew);
            l[r] = l[r] * c1 + l2 * c2;
#pragma unroll
            for (int e = 0; e < CH * 8; ++e) {
                const float a2 = __shfl_xor_sync(0xffffffffu, acc[r][e], off);
                acc[r][e] = acc[r][e] * c1 + a2 * c2;
            }
            m[r] = mnew;
        }
    }
    if (kg != 0) return;
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        const int row = w.row0 + r;
        if (row >= w.rows) break;
        const int head = w.h * w.group + row / q_len, i = row % q_len;
        const size_t orow = ((size_t)w.b * hq + head) * q_len + i;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        if (w.n_parts == 1) {
            T* o = out + orow * D;
#pragma unroll
            for (int c = 0; c < CH; ++c)
#pragma unroll
                for (int e = 0; e < 8; ++e) o[c * 64 + sub * 8 + e] = from_f32<T>(acc[r][c * 8 + e] * inv);
        } else {
            const size_t prow = (size_t)w.part * batch * hq * q_len + orow;
            float* o = part_o + prow * D;
#pragma unroll
            for (int c = 0; c < CH; ++c)
#pragma unroll
                for (int e = 0; e < 8; ++e) o[c * 64 + sub * 8 + e] = acc[r][c * 8 + e] * inv;
            if (sub == 0) part_lse[prow] = l[r] > 0.0f ? m[r] + log2f(l[r]) : -CUDART_INF_F;
        }
    }
}

template <typename T, int D, int KPI>
__device__ void paged_decode(const T* __restrict__ q, const T* __restrict__ kp,
                             const T* __restrict__ vp, const int* __restrict__ tables,
                             const int* __restrict__ ctx_lens, T* __restrict__ out,
                             float* __restrict__ part_o, float* __restrict__ part_lse, int batch,
                             int hq, int hkv, int q_len, int bs, int max_blocks, int part_tokens,
                             int row_chunks, float scale, int window, float softcap) {
    constexpr int CH = D / 64;  // 8-element chunks per lane
    const int lane = threadIdx.x & 31, sub = lane & 7, kg = lane >> 3;
    DecodeBlock w;
    if (!decode_block(w, ctx_lens, hq, hkv, q_len, part_tokens, row_chunks, window)) return;
    const int h = w.h, b = w.b, k_begin = w.k_begin, k_end = w.k_end;
    const Softcap cap(softcap);
    float qv[ROWS_PER_WARP][CH * 8];
    float acc[ROWS_PER_WARP][CH * 8];
    float m[ROWS_PER_WARP], l[ROWS_PER_WARP];
    int last_key[ROWS_PER_WARP];
    init_rows<T, CH>(q, qv, acc, m, l, last_key, w, hq, q_len, sub, scale);
    const int* table = tables + (size_t)b * max_blocks;
    // Every lane runs every step (the dot products shuffle across the warp); a key group
    // past the partition's end loads nothing and skips the update. Each step issues the
    // loads of KPI keys per key group (4·KPI per warp) before any arithmetic: the bytes in
    // flight that a memory-bound loop needs.
    for (int j0 = k_begin; j0 < k_end; j0 += 4 * KPI) {
        float kv[KPI][CH * 8], vv[KPI][CH * 8];
#pragma unroll
        for (int u = 0; u < KPI; ++u) {
            const int j = j0 + kg + 4 * u;
            if (j < k_end) {
                const size_t at = (((size_t)table[j / bs] * hkv + h) * bs + (j % bs)) * D;
#pragma unroll
                for (int c = 0; c < CH; ++c) {
                    load8(kp + at + c * 64 + sub * 8, &kv[u][c * 8]);
                    load8(vp + at + c * 64 + sub * 8, &vv[u][c * 8]);
                }
            } else {
#pragma unroll
                for (int e = 0; e < CH * 8; ++e) kv[u][e] = vv[u][e] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < KPI; ++u) {
            const int j = j0 + kg + 4 * u;
            const bool live = j < k_end;
#pragma unroll
            for (int r = 0; r < ROWS_PER_WARP; ++r) {
                float s = 0.0f;
#pragma unroll
                for (int e = 0; e < CH * 8; ++e) s += qv[r][e] * kv[u][e];
                s = group_sum(s, 8);
                // Uniform over the 8 lanes of the key: past the horizon or before the window.
                if (!live || !sees(j, last_key[r], window)) continue;
                s = cap(s);
                const float mnew = fmaxf(m[r], s);
                const float corr = exp2f(m[r] - mnew);  // m = -inf → 0
                const float p = exp2f(s - mnew);
                l[r] = l[r] * corr + p;
#pragma unroll
                for (int e = 0; e < CH * 8; ++e) acc[r][e] = acc[r][e] * corr + p * vv[u][e];
                m[r] = mnew;
            }
        }
    }
    finish_rows<T, CH>(acc, m, l, out, part_o, part_lse, w, hq, q_len, batch, sub, kg);
}

// Keys per lane group per step of the pipelined decode: 2 in the 16-bit types (a step's raw
// K/V, current and next, is 64 registers at d = 128), 1 in f32 (twice the bytes per key).
template <typename T> struct PipeKeys { static constexpr int N = 2; };
template <> struct PipeKeys<float> { static constexpr int N = 1; };

// paged_decode_pipe: paged_decode's work split, its loop software-pipelined. Each step issues
// the next step's K/V loads (their pages read a step earlier) and the page-table reads of the
// step after, then computes the current step from registers loaded a step ago: one memory
// latency per step, hidden behind the step's arithmetic, instead of paged_decode's two (table,
// then K/V) exposed back to back. Loads clamp to the partition's last key, so every lane
// loads every step without a branch; keys past the end or outside a row's view are masked.
// The online softmax rescales once per step (the max over the step's live keys), not per key.
template <typename T, int D>
__device__ void paged_decode_pipe(const T* __restrict__ q, const T* __restrict__ kp,
                                  const T* __restrict__ vp, const int* __restrict__ tables,
                                  const int* __restrict__ ctx_lens, T* __restrict__ out,
                                  float* __restrict__ part_o, float* __restrict__ part_lse,
                                  int batch, int hq, int hkv, int q_len, int bs, int max_blocks,
                                  int part_tokens, int row_chunks, float scale, int window,
                                  float softcap) {
    constexpr int CH = D / 64;
    constexpr int KPI = PipeKeys<T>::N;
    constexpr int STEP = 4 * KPI;  // keys per warp step
    const int lane = threadIdx.x & 31, sub = lane & 7, kg = lane >> 3;
    DecodeBlock w;
    if (!decode_block(w, ctx_lens, hq, hkv, q_len, part_tokens, row_chunks, window)) return;
    const int h = w.h, b = w.b, k_begin = w.k_begin, k_end = w.k_end;
    const Softcap cap(softcap);
    float qv[ROWS_PER_WARP][CH * 8];
    float acc[ROWS_PER_WARP][CH * 8];
    float m[ROWS_PER_WARP], l[ROWS_PER_WARP];
    int last_key[ROWS_PER_WARP];
    init_rows<T, CH>(q, qv, acc, m, l, last_key, w, hq, q_len, sub, scale);
    const int* table = tables + (size_t)b * max_blocks;
    // Key u of this lane's group in the step at j0 is j0 + kg + 4u; its load reads key
    // min(that, k_end − 1), a key of the partition.
    const int last = k_end - 1;
    int page[KPI];  // pages of the next step's keys
    Raw8<T> kc[KPI][CH], vc[KPI][CH];
#pragma unroll
    for (int u = 0; u < KPI; ++u) {
        const int j = min(k_begin + kg + 4 * u, last);
        const size_t at = (((size_t)table[j / bs] * hkv + h) * bs + (j % bs)) * D;
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            kc[u][c] = load_raw8(kp + at + c * 64 + sub * 8);
            vc[u][c] = load_raw8(vp + at + c * 64 + sub * 8);
        }
        page[u] = table[min(k_begin + STEP + kg + 4 * u, last) / bs];
    }
    for (int j0 = k_begin; j0 < k_end; j0 += STEP) {
        // The next step's K/V and the page-table entries of the step after it.
        Raw8<T> kn[KPI][CH], vn[KPI][CH];
#pragma unroll
        for (int u = 0; u < KPI; ++u) {
            const int j = min(j0 + STEP + kg + 4 * u, last);
            const size_t at = (((size_t)page[u] * hkv + h) * bs + (j % bs)) * D;
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                kn[u][c] = load_raw8(kp + at + c * 64 + sub * 8);
                vn[u][c] = load_raw8(vp + at + c * 64 + sub * 8);
            }
            page[u] = table[min(j0 + 2 * STEP + kg + 4 * u, last) / bs];
        }
        // Scores of the step's keys (independent chains), reduced over each key's 8 lanes.
        float sc[KPI][ROWS_PER_WARP];
#pragma unroll
        for (int u = 0; u < KPI; ++u) {
            float kf[CH * 8];
#pragma unroll
            for (int c = 0; c < CH; ++c) widen8(kc[u][c], &kf[c * 8]);
#pragma unroll
            for (int r = 0; r < ROWS_PER_WARP; ++r) {
                float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                for (int e = 0; e < CH * 8; e += 2) {
                    s0 += qv[r][e] * kf[e];
                    s1 += qv[r][e + 1] * kf[e + 1];
                }
                sc[u][r] = group_sum(s0 + s1, 8);
            }
        }
        // One rescale per row per step; masked keys (uniform over a key's 8 lanes) skipped.
#pragma unroll
        for (int r = 0; r < ROWS_PER_WARP; ++r) {
            bool live[KPI];
            float mnew = m[r];
#pragma unroll
            for (int u = 0; u < KPI; ++u) {
                const int j = j0 + kg + 4 * u;
                live[u] = j < k_end && sees(j, last_key[r], window);
                sc[u][r] = cap(sc[u][r]);
                if (live[u]) mnew = fmaxf(mnew, sc[u][r]);
            }
            if (mnew == -CUDART_INF_F) continue;  // no key of this step is live for the row
            const float corr = exp2f(m[r] - mnew);  // m = -inf → 0
            l[r] *= corr;
#pragma unroll
            for (int e = 0; e < CH * 8; ++e) acc[r][e] *= corr;
#pragma unroll
            for (int u = 0; u < KPI; ++u) {
                if (!live[u]) continue;
                const float p = exp2f(sc[u][r] - mnew);
                l[r] += p;
                float vf[CH * 8];
#pragma unroll
                for (int c = 0; c < CH; ++c) widen8(vc[u][c], &vf[c * 8]);
#pragma unroll
                for (int e = 0; e < CH * 8; ++e) acc[r][e] += p * vf[e];
            }
            m[r] = mnew;
        }
#pragma unroll
        for (int u = 0; u < KPI; ++u)
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                kc[u][c] = kn[u][c];
                vc[u][c] = vn[u][c];
            }
    }
    finish_rows<T, CH>(acc, m, l, out, part_o, part_lse, w, hq, q_len, batch, sub, kg);
}

// One block per output row; thread e combines element e over the sequence's partitions:
// out = Σ 2^(lse_p − max)·o_p / Σ 2^(lse_p − max). Sequences with one partition were written
// by the decode kernel and are skipped.
template <typename T>
__device__ void paged_reduce(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                             const int* __restrict__ ctx_lens, T* __restrict__ out, int batch,
                             int hq, int q_len, int d, int part_tokens, int window) {
    const size_t row = blockIdx.x;  // (b·hq + head)·q_len + i
    const int b = (int)(row / ((size_t)hq * q_len));
    const int ctx = ctx_lens[b];
    const int n_parts = (ctx - visible_start(ctx, q_len, window) + part_tokens - 1) / part_tokens;
    if (n_parts <= 1) return;
    const size_t stride = (size_t)batch * hq * q_len;
    float mx = -CUDART_INF_F;
    for (int p = 0; p < n_parts; ++p) mx = fmaxf(mx, part_lse[p * stride + row]);
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        float num = 0.0f, den = 0.0f;
        for (int p = 0; p < n_parts; ++p) {
            const float w = exp2f(part_lse[p * stride + row] - mx);
            num += w * part_o[(p * stride + row) * d + e];
            den += w;
        }
        out[row * d + e] = from_f32<T>(num / den);
    }
}

// One block per new token: copies its kv_heads·d values of K and V into the pool slot.
template <typename T>
__device__ void paged_append(const T* __restrict__ k_new, const T* __restrict__ v_new,
                             const int* __restrict__ slots, T* __restrict__ kp, T* __restrict__ vp,
                             int hkv, int d, int bs) {
    const int t = blockIdx.x;
    const int slot = slots[t];
    if (slot < 0) return;
    const int blk = slot / bs, off = slot % bs;
    for (int c = threadIdx.x; c < hkv * d; c += blockDim.x) {
        const int h = c / d, e = c % d;
        const size_t dst = (((size_t)blk * hkv + h) * bs + off) * d + e;
        const size_t src = (size_t)t * hkv * d + c;
        kp[dst] = k_new[src];
        vp[dst] = v_new[src];
    }
}

// The loops behind the decode entries: KEYS1/KEYS2 = paged_decode with 1 or 2 keys per lane
// group per step, PIPE = paged_decode_pipe.
#define KEYS1(T, D) paged_decode<T, D, 1>
#define KEYS2(T, D) paged_decode<T, D, 2>
#define PIPE(T, D) paged_decode_pipe<T, D>
#define PAGED_DECODE_ENTRY(T, NAME, D, LOOP, PREFIX)                                              \
    extern "C" __global__ void __launch_bounds__(256) PREFIX##D##_##NAME(                        \
        const T* q, const T* kp, const T* vp, const int* tables, const int* ctx_lens, T* out,    \
        float* part_o, float* part_lse, int batch, int hq, int hkv, int q_len, int bs,           \
        int max_blocks, int part_tokens, int row_chunks, float scale, int window,                \
        float softcap) {                                                                         \
        LOOP(T, D)(q, kp, vp, tables, ctx_lens, out, part_o, part_lse, batch, hq, hkv, q_len,    \
                   bs, max_blocks, part_tokens, row_chunks, scale, window, softcap);             \
    }
#define PAGED_ENTRIES(T, NAME)                                                                    \
    PAGED_DECODE_ENTRY(T, NAME, 64, KEYS1, paged_decode_d)                                        \
    PAGED_DECODE_ENTRY(T, NAME, 128, KEYS1, paged_decode_d)                                       \
    PAGED_DECODE_ENTRY(T, NAME, 64, KEYS2, paged_decode_k2_d)                                     \
    PAGED_DECODE_ENTRY(T, NAME, 128, KEYS2, paged_decode_k2_d)                                    \
    PAGED_DECODE_ENTRY(T, NAME, 64, PIPE, paged_decode_pipe_d)                                    \
    PAGED_DECODE_ENTRY(T, NAME, 128, PIPE, paged_decode_pipe_d)                                   \
    extern "C" __global__ void paged_reduce_##NAME(const float* part_o, const float* part_lse,   \
                                                   const int* ctx_lens, T* out, int batch,       \
                                                   int hq, int q_len, int d, int part_tokens,    \
                                                   int window) {                                 \
        paged_reduce<T>(part_o, part_lse, ctx_lens, out, batch, hq, q_len, d, part_tokens,       \
                        window);                                                                 \
    }                                                                                            \
    extern "C" __global__ void paged_append_##NAME(const T* k_new, const T* v_new,               \
                                                   const int* slots, T* kp, T* vp, int hkv,      \
                                                   int d, int bs) {                              \
        paged_append<T>(k_new, v_new, slots, kp, vp, hkv, d, bs);                                \
    }
PAGED_ENTRIES(float, f32)
PAGED_ENTRIES(__half, f16)
PAGED_ENTRIES(bf16, bf16)
