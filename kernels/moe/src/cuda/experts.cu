// experts.cu: the MoE layer's expert FFN as grouped GEMMs on tensor cores — every expert's
// SwiGLU over the tokens dispatched to it, one launch per GEMM stage for all experts (the
// grouped-GEMM layout of MegaBlocks and vLLM's fused_moe: the kept assignments sorted by
// expert, each expert's rows padded to whole 64-row tiles, a table naming each tile's expert).
//
// moe_up_*: h[r] = silu(x[tok(r)]·W_gate[e]) ⊙ (x[tok(r)]·W_up[e]) for the rows r of a 64-row
//   tile of expert e and 64 columns of d_ff; the rows are gathered from x by token index
//   (no separate dispatch copy; padding rows, index −1, read zeros and give h = 0). W_gate and
//   W_up are stored transposed per expert, [E, d_ff, d_model], so both MMA operands are read
//   along d_model. Two f32 accumulator sets (gate, up) on m16n8k16 MMAs; h is stored in the
//   storage type (it is the next GEMM's operand).
// moe_down_*: y[r] = h[r]·W_down[e], W_down stored transposed [E, d_model, d_ff]; y in f32.
// moe_combine_rows_*: out[t] = Σ weight · y[row] over token t's kept assignments, in their
//   order (deterministic), rounded once to the storage type.
//
// Tiles: 64×64 per block, 32-deep K steps through shared memory, 4 warps of 32×32 each
// (2 × 4 MMA tiles). Any d_model and d_ff: 16-byte loads where a row's 8 elements are all in
// range and rows are 16-byte aligned (K a multiple of 8), element loads with zero fill
// otherwise.

constexpr int XM = 64, XN = 64, XK = 32, XLD = XK + 8;

// Elements k..k+7 of `row` (K long) into shared memory, zeros past K or for a missing row.
template <typename T>
__device__ __forceinline__ void load_chunk(T* dst, const T* row, int k, int K) {
    if (row != nullptr && (K & 7) == 0 && k + 8 <= K) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(row + k);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) dst[i] = (row != nullptr && k + i < K) ? row[k + i] : from_f32<T>(0.0f);
    }
}

// The A fragments of two 16-row tiles and the B fragments of four 8-column tiles for one
// 16-deep step at column `col` of the shared tiles (PTX ISA m16n8k16 layout).
template <typename T>
__device__ __forceinline__ void a_frags(u32 (&a)[2][4], const T* as, int row0, int col) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
        const T* p = as + (row0 + mt * 16) * XLD + col;
        a[mt][0] = load2(p);
        a[mt][1] = load2(p + 8 * XLD);
        a[mt][2] = load2(p + 8);
        a[mt][3] = load2(p + 8 * XLD + 8);
    }
}

template <typename T>
__device__ __forceinline__ void b_frags(u32 (&b)[4][2], const T* bs, int row0, int col) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
        const T* p = bs + (row0 + nt * 8) * XLD + col;
        b[nt][0] = load2(p);
        b[nt][1] = load2(p + 8);
    }
}

__device__ __forceinline__ float silu(float z) { return z / (1.0f + exp2f(-z * 1.4426950408889634f)); }

// A warp's 2 × 4 MMA tiles of f32 accumulators, zeroed.
__device__ __forceinline__ void zero(float (&acc)[2][4][4]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
}

// Where accumulator element e of MMA tile (mt, nt) lands: row and column in the block's
// output tile, for the lane (g = lane / 4, t4 = lane % 4) of warp (wm, wn).
__device__ __forceinline__ int acc_row(int wm, int mt, int g, int e) { return wm * 32 + mt * 16 + g + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int acc_col(int wn, int nt, int t4, int e) { return wn * 32 + nt * 8 + t4 * 2 + (e & 1); }

template <typename T>
__device__ void moe_up(const T* __restrict__ x, const T* __restrict__ wg, const T* __restrict__ wu,
                       const int* __restrict__ rows, const int* __restrict__ tile_expert,
                       T* __restrict__ h, int dm, int ff) {
    __shared__ __align__(16) T as[XM * XLD];
    __shared__ __align__(16) T gs[XN * XLD];
    __shared__ __align__(16) T us[XN * XLD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3, wm = warp >> 1, wn = warp & 1;
    const int m0 = blockIdx.y * XM, n0 = blockIdx.x * XN;
    const size_t expert = (size_t)tile_expert[blockIdx.y];
    const T* wge = wg + expert * ff * dm;
    const T* wue = wu + expert * ff * dm;
    float ag[2][4][4], au[2][4][4];
    zero(ag);
    zero(au);
    for (int k0 = 0; k0 < dm; k0 += XK) {
        __syncthreads();
        for (int c = threadIdx.x; c < XM * XK / 8; c += blockDim.x) {
            const int r = c / (XK / 8), col = (c % (XK / 8)) * 8;
            const int tok = rows[m0 + r];
            const int n = n0 + r;
            load_chunk(as + r * XLD + col, tok >= 0 ? x + (size_t)tok * dm : nullptr, k0 + col, dm);
            load_chunk(gs + r * XLD + col, n < ff ? wge + (size_t)n * dm : nullptr, k0 + col, dm);
            load_chunk(us + r * XLD + col, n < ff ? wue + (size_t)n * dm : nullptr, k0 + col, dm);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < XK / 16; ++kk) {
            const int col = kk * 16 + t4 * 2;
            u32 a[2][4], bg[4][2], bu[4][2];
            a_frags(a, as, wm * 32 + g, col);
            b_frags(bg, gs, wn * 32 + g, col);
            b_frags(bu, us, wn * 32 + g, col);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    mma16816<T>(ag[mt][nt], a[mt], bg[nt]);
                    mma16816<T>(au[mt][nt], a[mt], bu[nt]);
                }
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = m0 + acc_row(wm, mt, g, e), col = n0 + acc_col(wn, nt, t4, e);
                if (col < ff) h[(size_t)row * ff + col] = from_f32<T>(silu(ag[mt][nt][e]) * au[mt][nt][e]);
            }
}

template <typename T>
__device__ void moe_down(const T* __restrict__ h, const T* __restrict__ wd, const int* __restrict__ tile_expert,
                         float* __restrict__ y, int dm, int ff) {
    __shared__ __align__(16) T as[XM * XLD];
    __shared__ __align__(16) T bs[XN * XLD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3, wm = warp >> 1, wn = warp & 1;
    const int m0 = blockIdx.y * XM, n0 = blockIdx.x * XN;
    const T* wde = wd + (size_t)tile_expert[blockIdx.y] * dm * ff;
    float acc[2][4][4];
    zero(acc);
    for (int k0 = 0; k0 < ff; k0 += XK) {
        __syncthreads();
        for (int c = threadIdx.x; c < XM * XK / 8; c += blockDim.x) {
            const int r = c / (XK / 8), col = (c % (XK / 8)) * 8;
            const int n = n0 + r;
            load_chunk(as + r * XLD + col, h + (size_t)(m0 + r) * ff, k0 + col, ff);
            load_chunk(bs + r * XLD + col, n < dm ? wde + (size_t)n * ff : nullptr, k0 + col, ff);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < XK / 16; ++kk) {
            const int col = kk * 16 + t4 * 2;
            u32 a[2][4], b[4][2];
            a_frags(a, as, wm * 32 + g, col);
            b_frags(b, bs, wn * 32 + g, col);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) mma16816<T>(acc[mt][nt], a[mt], b[nt]);
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = m0 + acc_row(wm, mt, g, e), col = n0 + acc_col(wn, nt, t4, e);
                if (col < dm) y[(size_t)row * dm + col] = acc[mt][nt][e];
            }
}

template <typename T>
__device__ void moe_combine_rows(const float* __restrict__ y, const int* __restrict__ token_starts,
                                 const int* __restrict__ token_rows, const float* __restrict__ token_weights,
                                 T* __restrict__ out, int dm) {
    const int t = blockIdx.x;
    const int first = token_starts[t], last = token_starts[t + 1];
    for (int c = threadIdx.x; c < dm; c += blockDim.x) {
        float acc = 0.0f;
        for (int i = first; i < last; ++i) acc += token_weights[i] * y[(size_t)token_rows[i] * dm + c];
        out[(size_t)t * dm + c] = from_f32<T>(acc);
    }
}

#define EXPERT_ENTRIES(T, NAME)                                                                    \
    extern "C" __global__ void __launch_bounds__(128)                                              \
        moe_up_##NAME(const T* x, const T* wg, const T* wu, const int* rows, const int* tile_expert, \
                      T* h, int dm, int ff) {                                                      \
        moe_up<T>(x, wg, wu, rows, tile_expert, h, dm, ff);                                        \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                              \
        moe_down_##NAME(const T* h, const T* wd, const int* tile_expert, float* y, int dm, int ff) { \
        moe_down<T>(h, wd, tile_expert, y, dm, ff);                                                \
    }                                                                                              \
    extern "C" __global__ void moe_combine_rows_##NAME(const float* y, const int* token_starts,    \
                                                       const int* token_rows,                      \
                                                       const float* token_weights, T* out, int dm) { \
        moe_combine_rows<T>(y, token_starts, token_rows, token_weights, out, dm);                  \
    }
EXPERT_ENTRIES(__half, f16)
EXPERT_ENTRIES(bf16, bf16)
