// attention.cu: contiguous attention on the GPU. Layouts as the CPU variants: q/out
// [batch, q_heads, q_len, d], k/v [batch, kv_heads, kv_len, d]; GQA by index (query head h
// reads KV head h / (q_heads / kv_heads)); causal queries are the last q_len positions.
// window > 0 (causal only): the query at position p sees key j iff j <= p and p - j < window
// (transformers' sliding_window, llama.cpp's LLAMA_SWA_TYPE_STANDARD); 0 = no window.
// softcap > 0: scores become softcap * tanh(scale * q.k / softcap) before mask and softmax
// (Gemma-2); 0 = plain scores.
//
// naive_*: "standard attention" in three launches with the scores materialised in f32
//   (S = scale·QKᵀ masked → row softmax in place → O = P·V).
// flash2_d{64,128}_*: FlashAttention-2 (Dao 2023) forward: a block of 4 warps owns 64 query
//   rows (16 per warp, Q in registers), streams 64-key K/V tiles through shared memory, does
//   S = Q·Kᵀ and O += P·V with m16n8k16 tensor-core MMAs (f16/bf16 operands, f32
//   accumulators), an online softmax in the log2 domain per row, and one final 1/l. The key
//   loop starts at the block's first row's window start: tiles no row sees are not loaded.

// Score s (already scaled) after the optional soft-cap.
__device__ __forceinline__ float soft_capped(float s, float softcap) {
    return softcap > 0.0f ? softcap * tanh_f32(s / softcap) : s;
}

// Whether the query at position `pos` sees key `key` (causal horizon, sliding window).
__device__ __forceinline__ bool sees(int key, int pos, int causal, int window) {
    return (!causal || key <= pos) && (window <= 0 || pos - key < window);
}

template <typename T>
__device__ void naive_scores(const T* __restrict__ q, const T* __restrict__ k, float* __restrict__ s,
                             int hq, int hkv, int lq, int lk, int d, int causal, float scale,
                             int window, float softcap) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int i = blockIdx.y;
    const int bh = blockIdx.z;
    if (j >= lk) return;
    const int b = bh / hq, h = bh % hq, hk = h / (hq / hkv);
    const T* qr = q + ((size_t)bh * lq + i) * d;
    const T* kr = k + (((size_t)b * hkv + hk) * lk + j) * d;
    float acc = 0.0f;
    for (int e = 0; e < d; ++e) acc += to_f32(qr[e]) * to_f32(kr[e]);
    const bool visible = sees(j, lk - lq + i, causal, window);
    s[((size_t)bh * lq + i) * lk + j] = visible ? soft_capped(acc * scale, softcap) : -CUDART_INF_F;
}

// One warp per score row: max, exp, sum, normalise in place.
extern "C" __global__ void naive_softmax_f32(float* __restrict__ s, long long rows, int lk) {
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float* r = s + row * lk;
    float m = -CUDART_INF_F;
    for (int j = lane; j < lk; j += 32) m = fmaxf(m, r[j]);
    m = warp_max(m);
    float l = 0.0f;
    for (int j = lane; j < lk; j += 32) {
        const float p = exp_neg(r[j] - m);
        r[j] = p;
        l += p;
    }
    l = warp_sum(l);
    const float inv = 1.0f / l;
    for (int j = lane; j < lk; j += 32) r[j] *= inv;
}

// One thread per output element (row, e): coalesced over e, P broadcast.
template <typename T>
__device__ void naive_pv(const float* __restrict__ p, const T* __restrict__ v, T* __restrict__ o,
                         int hq, int hkv, int lq, int lk, int d) {
    const int e = threadIdx.x;
    const long long row = blockIdx.x;  // (b·hq + h)·lq + i
    if (e >= d) return;
    const long long bh = row / lq;
    const int b = (int)(bh / hq), h = (int)(bh % hq), hk = h / (hq / hkv);
    const float* pr = p + row * lk;
    const T* vb = v + ((size_t)b * hkv + hk) * lk * d;
    float acc = 0.0f;
    for (int j = 0; j < lk; ++j) acc += pr[j] * to_f32(vb[(size_t)j * d + e]);
    o[row * d + e] = from_f32<T>(acc);
}

#define NAIVE_ENTRIES(T, NAME)                                                                   \
    extern "C" __global__ void naive_scores_##NAME(const T* q, const T* k, float* s, int hq,     \
                                                   int hkv, int lq, int lk, int d, int causal,   \
                                                   float scale, int window, float softcap) {     \
        naive_scores<T>(q, k, s, hq, hkv, lq, lk, d, causal, scale, window, softcap);            \
    }                                                                                            \
    extern "C" __global__ void naive_pv_##NAME(const float* p, const T* v, T* o, int hq, int hkv, \
                                               int lq, int lk, int d) {                          \
        naive_pv<T>(p, v, o, hq, hkv, lq, lk, d);                                                \
    }
NAIVE_ENTRIES(float, f32)
NAIVE_ENTRIES(__half, f16)
NAIVE_ENTRIES(bf16, bf16)

constexpr int FA_BR = 64;    // query rows per block (16 per warp)
constexpr int FA_BC = 64;    // keys per tile
constexpr int FA_PAD = 8;    // row padding of the shared tiles (16 bytes: no bank conflicts)


// ---- pieces shared by flash2 and flash2p (one warp's 16 query rows; lane = 4·g + t4) ----

// Q rows g and g+8 of the warp as A fragments, dims kk·16 + 2·t4 (+8); zero past q_len.
template <typename T, int D>
__device__ __forceinline__ void load_q_fragments(const T* qb, int r_lo, int r_hi, int lq, int t4,
                                                 u32 (&qa)[D / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int c = kk * 16 + t4 * 2;
        qa[kk][0] = r_lo < lq ? load2(qb + (size_t)r_lo * D + c) : 0u;
        qa[kk][1] = r_hi < lq ? load2(qb + (size_t)r_hi * D + c) : 0u;
        qa[kk][2] = r_lo < lq ? load2(qb + (size_t)r_lo * D + c + 8) : 0u;
        qa[kk][3] = r_hi < lq ? load2(qb + (size_t)r_hi * D + c + 8) : 0u;
    }
}

// The first key any row of the block starting at query row `row0` sees: its window start.
__device__ __forceinline__ int first_key(int row0, int offset, int causal, int window) {
    return (causal && window > 0) ? max(0, offset + row0 + 1 - window) : 0;
}

// One tile's scores S (16 rows × BC keys from key j0) → probabilities P in place: scale
// (soft-cap when softcap > 0) into the log2 domain, mask (past kv_len; causal future; before
// the row's window), then the online softmax per row — the quad of lanes sharing a row agrees
// on its max, the running sums and O are rescaled.
template <int D, int BC>
__device__ __forceinline__ void online_softmax(float (&s)[BC / 8][4], float (&acc)[D / 8][4],
                                               float (&m)[2], float (&l)[2], int j0, int r_lo,
                                               int r_hi, int lk, int causal, int window,
                                               int offset, float scale, float softcap, int t4) {
    constexpr float LOG2E = 1.4426950408889634f;
    const float sl2 = scale * LOG2E;
    const float cap_in = softcap > 0.0f ? scale / softcap : 0.0f, cap_out = softcap * LOG2E;
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = j0 + nt * 8 + t4 * 2 + (e & 1);
            const int row = (e < 2) ? r_lo : r_hi;
            const bool ok = key < lk && sees(key, offset + row, causal, window);
            const float x = softcap > 0.0f ? cap_out * tanh_f32(s[nt][e] * cap_in) : s[nt][e] * sl2;
            s[nt][e] = ok ? x : -CUDART_INF_F;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float mx = -CUDART_INF_F;
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mnew = fmaxf(m[r], mx);
        const float corr = (m[r] == -CUDART_INF_F) ? 0.0f : exp2f(m[r] - mnew);
        m[r] = mnew;
        l[r] *= corr;
#pragma unroll
        for (int nd = 0; nd < D / 8; ++nd) {
            acc[nd][2 * r] *= corr;
            acc[nd][2 * r + 1] *= corr;
        }
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) {
#pragma unroll
            for (int e = 2 * r; e < 2 * r + 2; ++e) {
                const float p = (mnew == -CUDART_INF_F) ? 0.0f : exp2f(s[nt][e] - mnew);
                s[nt][e] = p;
                l[r] += p;
            }
        }
    }
}

// P's C fragments of key step kk (16 keys) re-packed as an A fragment.
template <typename T, int BC>
__device__ __forceinline__ void p_fragment(const float (&s)[BC / 8][4], int kk, u32 (&pa)[4]) {
    pa[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    pa[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    pa[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// One final 1/l per row (the quad's partial sums first), O written as pairs.
template <typename T, int D>
__device__ __forceinline__ void store_output(T* ob, const float (&acc)[D / 8][4], float (&l)[2],
                                             int r_lo, int r_hi, int lq, int t4) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        l[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    }
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
        const int c = nd * 8 + t4 * 2;
        if (r_lo < lq)
            *reinterpret_cast<u32*>(ob + (size_t)r_lo * D + c) = pack2<T>(acc[nd][0] * l[0], acc[nd][1] * l[0]);
        if (r_hi < lq)
            *reinterpret_cast<u32*>(ob + (size_t)r_hi * D + c) = pack2<T>(acc[nd][2] * l[1], acc[nd][3] * l[1]);
    }
}

template <typename T, int D>
__device__ void flash2(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       T* __restrict__ o, int hq, int hkv, int lq, int lk, int causal,
                       float scale, int window, float softcap) {
    constexpr int LD = D + FA_PAD;
    __shared__ __align__(16) T ks[FA_BC * LD];
    __shared__ __align__(16) T vs[FA_BC * LD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.y;
    const int b = bh / hq, h = bh % hq, hk = h / (hq / hkv);
    const int row0 = blockIdx.x * FA_BR + warp * 16;
    const T* qb = q + (size_t)bh * lq * D;
    const T* kb = k + ((size_t)b * hkv + hk) * lk * D;
    const T* vb = v + ((size_t)b * hkv + hk) * lk * D;
    const int r_lo = row0 + g, r_hi = row0 + g + 8;

    u32 qa[D / 16][4];
    load_q_fragments<T, D>(qb, r_lo, r_hi, lq, t4, qa);
    float acc[D / 8][4];
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
        acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;
    float m[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float l[2] = {0.0f, 0.0f};
    const int offset = lk - lq;  // causal: row i sits at position offset + i
    const int last_row = min(lq, (int)blockIdx.x * FA_BR + FA_BR) - 1;
    const int kend = causal ? min(lk, offset + last_row + 1) : lk;
    const int kbegin = first_key((int)blockIdx.x * FA_BR, offset, causal, window);

    for (int j0 = kbegin; j0 < kend; j0 += FA_BC) {
        __syncthreads();  // the previous tile is no longer read
        for (int c = threadIdx.x; c < FA_BC * D / 8; c += blockDim.x) {
            const int r = c / (D / 8), col = (c % (D / 8)) * 8;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (j0 + r < lk) {
                kv = *reinterpret_cast<const uint4*>(kb + (size_t)(j0 + r) * D + col);
                vv = *reinterpret_cast<const uint4*>(vb + (size_t)(j0 + r) * D + col);
            }
            *reinterpret_cast<uint4*>(ks + r * LD + col) = kv;
            *reinterpret_cast<uint4*>(vs + r * LD + col) = vv;
        }
        __syncthreads();

        // S = Q·Kᵀ: 16 rows × 64 keys per warp, as 8 n-tiles of 8 keys.
        float s[FA_BC / 8][4];
#pragma unroll
        for (int nt = 0; nt < FA_BC / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int nt = 0; nt < FA_BC / 8; ++nt) {
                const T* kr = ks + (nt * 8 + g) * LD + kk * 16 + t4 * 2;
                u32 bf[2] = {load2(kr), load2(kr + 8)};
                mma16816<T>(s[nt], qa[kk], bf);
            }
        }
        online_softmax<D, FA_BC>(s, acc, m, l, j0, r_lo, r_hi, lk, causal, window, offset, scale,
                                 softcap, t4);
        // O += P·V: P re-packed from C fragments into A fragments, V read transposed.
#pragma unroll
        for (int kk = 0; kk < FA_BC / 16; ++kk) {
            u32 pa[4];
            p_fragment<T, FA_BC>(s, kk, pa);
            const int key = kk * 16 + t4 * 2;
#pragma unroll
            for (int nd = 0; nd < D / 8; ++nd) {
                const int dim = nd * 8 + g;
                u32 bf[2] = {join2(vs[key * LD + dim], vs[(key + 1) * LD + dim]),
                             join2(vs[(key + 8) * LD + dim], vs[(key + 9) * LD + dim])};
                mma16816<T>(acc[nd], pa, bf);
            }
        }
    }
    store_output<T, D>(o + (size_t)bh * lq * D, acc, l, r_lo, r_hi, lq, t4);
}

#define FLASH2_ENTRY(T, NAME, D)                                                                  \
    extern "C" __global__ void __launch_bounds__(128)                                            \
        flash2_d##D##_##NAME(const T* q, const T* k, const T* v, T* o, int hq, int hkv, int lq,  \
                             int lk, int causal, float scale, int window, float softcap) {       \
        flash2<T, D>(q, k, v, o, hq, hkv, lq, lk, causal, scale, window, softcap);               \
    }
FLASH2_ENTRY(__half, f16, 64)
FLASH2_ENTRY(__half, f16, 128)
FLASH2_ENTRY(bf16, bf16, 64)
FLASH2_ENTRY(bf16, bf16, 128)

// flash2p_d{64,128}_*: the same algorithm with the K/V tiles double-buffered by cp.async (tile
// t+1 streams in while tile t is computed) and the K and V B-fragments read with ldmatrix (V
// transposed on the way), four fragments per instruction. 64-key tiles at d 64, 32-key tiles
// at d 128 (two stages of K and V within the 48 KiB of static shared memory).
template <typename T, int D, int BC>
__device__ void flash2p(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                        T* __restrict__ o, int hq, int hkv, int lq, int lk, int causal, float scale,
                        int window, float softcap) {
    constexpr int LD = D + FA_PAD;
    __shared__ __align__(16) T ks[2][BC * LD];
    __shared__ __align__(16) T vs[2][BC * LD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.y;
    const int b = bh / hq, h = bh % hq, hk = h / (hq / hkv);
    const int row0 = blockIdx.x * FA_BR + warp * 16;
    const T* qb = q + (size_t)bh * lq * D;
    const T* kb = k + ((size_t)b * hkv + hk) * lk * D;
    const T* vb = v + ((size_t)b * hkv + hk) * lk * D;
    const int r_lo = row0 + g, r_hi = row0 + g + 8;

    u32 qa[D / 16][4];
    load_q_fragments<T, D>(qb, r_lo, r_hi, lq, t4, qa);
    float acc[D / 8][4];
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;
    float m[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float l[2] = {0.0f, 0.0f};
    const int offset = lk - lq;
    const int last_row = min(lq, (int)blockIdx.x * FA_BR + FA_BR) - 1;
    const int kend = causal ? min(lk, offset + last_row + 1) : lk;
    const int kbegin = first_key((int)blockIdx.x * FA_BR, offset, causal, window);
    const int tiles = max(0, kend - kbegin + BC - 1) / BC;
    // Rows past kv_len are zero-filled (a 0-byte source).
    auto load_tile = [&](int tile, int stage) {
        const int j0 = kbegin + tile * BC;
        for (int c = threadIdx.x; c < BC * D / 8; c += blockDim.x) {
            const int r = c / (D / 8), col = (c % (D / 8)) * 8;
            const bool in = j0 + r < lk;
            const size_t src = (size_t)(in ? j0 + r : 0) * D + col;
            cp_async16(&ks[stage][r * LD + col], kb + src, in ? 16 : 0);
            cp_async16(&vs[stage][r * LD + col], vb + src, in ? 16 : 0);
        }
        cp_async_commit();
    };
    if (tiles > 0) load_tile(0, 0);
    // ldmatrix: lane names row (lane % 8) of matrix (lane / 8).
    const int mat = lane >> 3, mrow = lane & 7;
    for (int t = 0; t < tiles; ++t) {
        const int stage = t & 1;
        if (t + 1 < tiles) {
            load_tile(t + 1, stage ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // tile t is in shared memory for every thread
        const T* kt = ks[stage];
        const T* vt = vs[stage];
        const int j0 = kbegin + t * BC;
        float s[BC / 8][4];
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < BC / 16; ++np) {
                // Matrices: keys np·16 + {0, 8} × dims kk·16 + {0, 8} → b0, b1 of 2 n-tiles.
                u32 r[4];
                ldmatrix_x4(r, kt + (np * 16 + (mat >> 1) * 8 + mrow) * LD + kk * 16 + (mat & 1) * 8);
                const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                mma16816<T>(s[2 * np], qa[kk], b0);
                mma16816<T>(s[2 * np + 1], qa[kk], b1);
            }
        }
        online_softmax<D, BC>(s, acc, m, l, j0, r_lo, r_hi, lk, causal, window, offset, scale,
                              softcap, t4);
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
            u32 pa[4];
            p_fragment<T, BC>(s, kk, pa);
#pragma unroll
            for (int np = 0; np < D / 16; ++np) {
                // Matrices: keys kk·16 + {0, 8} × dims np·16 + {0, 8}, transposed → b0, b1 of
                // the dim n-tiles 2·np and 2·np + 1.
                u32 r[4];
                ldmatrix_x4_trans(r, vt + (kk * 16 + (mat & 1) * 8 + mrow) * LD + np * 16 + (mat >> 1) * 8);
                const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                mma16816<T>(acc[2 * np], pa, b0);
                mma16816<T>(acc[2 * np + 1], pa, b1);
            }
        }
        __syncthreads();  // the stage is refilled two tiles on: everyone has read it
    }
    store_output<T, D>(o + (size_t)bh * lq * D, acc, l, r_lo, r_hi, lq, t4);
}

#define FLASH2P_ENTRY(T, NAME, D, BC)                                                             \
    extern "C" __global__ void __launch_bounds__(128)                                            \
        flash2p_d##D##_##NAME(const T* q, const T* k, const T* v, T* o, int hq, int hkv, int lq, \
                              int lk, int causal, float scale, int window, float softcap) {      \
        flash2p<T, D, BC>(q, k, v, o, hq, hkv, lq, lk, causal, scale, window, softcap);          \
    }
FLASH2P_ENTRY(__half, f16, 64, 64)
FLASH2P_ENTRY(__half, f16, 128, 32)
FLASH2P_ENTRY(bf16, bf16, 64, 64)
FLASH2P_ENTRY(bf16, bf16, 128, 32)
