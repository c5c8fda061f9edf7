// quant.cu: weight-only quantised GEMV/skinny GEMM Y = X·Wᵀ on the GPU, dequantising in
// registers (the llama.cpp / AWQ "dequant GEMV" pattern). W is stored row by row in the CPU
// side's byte layout (kernels/quant/src/format.rs), blocks of 32 values:
//   f16      64 bytes: 32 little-endian halves (the f16-weight baseline)
//   sym4g32  18 bytes: f16 scale, 16 bytes of LSB-first nibbles (value 2j low, 2j+1 high);
//            w = scale·(c − 8)
//   q4_0     18 bytes: f16 d, 16 bytes (value j low nibble, j+16 high); w = d·(c − 8)
//   q8_0     34 bytes: f16 d, 32 × i8; w = d·q
// X is f32 [batch, cols], Y f32 [batch, rows]; batch ≤ 8. One warp per output row, lanes
// over the row's blocks (consecutive lanes read consecutive blocks), 4 warps per block.

constexpr int GEMV_MAX_BATCH = 8;

__device__ __forceinline__ float half_at(const u8* p) {
    return __half2float(__ushort_as_half(*reinterpret_cast<const u16*>(p)));
}

template <int FMT> struct Fmt;
template <> struct Fmt<0> {  // f16
    static constexpr int BYTES = 64;
    __device__ static void decode(const u8* blk, float* w) {
#pragma unroll
        for (int i = 0; i < 4; ++i) load8(reinterpret_cast<const __half*>(blk) + 8 * i, w + 8 * i);
    }
};
template <> struct Fmt<1> {  // sym4g32 (f16 scale)
    static constexpr int BYTES = 18;
    __device__ static void decode(const u8* blk, float* w) {
        const float s = half_at(blk);
        const u16* c = reinterpret_cast<const u16*>(blk + 2);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 two = c[i];  // bytes 2i, 2i+1 → values 4i .. 4i+3
#pragma unroll
            for (int n = 0; n < 4; ++n) w[4 * i + n] = s * (float)((int)((two >> (4 * n)) & 15u) - 8);
        }
    }
};
template <> struct Fmt<2> {  // ggml q4_0
    static constexpr int BYTES = 18;
    __device__ static void decode(const u8* blk, float* w) {
        const float d = half_at(blk);
        const u16* c = reinterpret_cast<const u16*>(blk + 2);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 two = c[i];  // bytes 2i, 2i+1
            w[2 * i] = d * (float)((int)(two & 15u) - 8);
            w[2 * i + 16] = d * (float)((int)((two >> 4) & 15u) - 8);
            w[2 * i + 1] = d * (float)((int)((two >> 8) & 15u) - 8);
            w[2 * i + 17] = d * (float)((int)((two >> 12) & 15u) - 8);
        }
    }
};
template <> struct Fmt<3> {  // ggml q8_0
    static constexpr int BYTES = 34;
    __device__ static void decode(const u8* blk, float* w) {
        const float d = half_at(blk);
        const u16* c = reinterpret_cast<const u16*>(blk + 2);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const u32 two = c[i];
            w[2 * i] = d * (float)(signed char)(two & 0xffu);
            w[2 * i + 1] = d * (float)(signed char)(two >> 8);
        }
    }
};

template <int FMT>
__device__ void gemv(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                     int rows, int cols, int batch) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int nb = cols / 32;
    const u8* wr = w + (size_t)row * nb * Fmt<FMT>::BYTES;
    float acc[GEMV_MAX_BATCH];
#pragma unroll
    for (int b = 0; b < GEMV_MAX_BATCH; ++b) acc[b] = 0.0f;
    for (int blk = lane; blk < nb; blk += 32) {
        float wv[32];
        Fmt<FMT>::decode(wr + (size_t)blk * Fmt<FMT>::BYTES, wv);
#pragma unroll
        for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
            if (b >= batch) break;
            const float4* xv = reinterpret_cast<const float4*>(x + (size_t)b * cols + blk * 32);
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float4 v = xv[i];
                s += wv[4 * i] * v.x + wv[4 * i + 1] * v.y + wv[4 * i + 2] * v.z + wv[4 * i + 3] * v.w;
            }
            acc[b] += s;
        }
    }
#pragma unroll
    for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
        if (b >= batch) break;
        const float s = warp_sum(acc[b]);
        if (lane == 0) y[(size_t)b * rows + row] = s;
    }
}

#define GEMV_ENTRY(NAME, FMT)                                                                    \
    extern "C" __global__ void                                                                 \
        gemv_##NAME(const u8* w, const float* x, float* y, int rows, int cols, int batch) {    \
        gemv<FMT>(w, x, y, rows, cols, batch);                                                 \
    }
GEMV_ENTRY(f16, 0)
GEMV_ENTRY(sym4g32, 1)
GEMV_ENTRY(q4_0, 2)
GEMV_ENTRY(q8_0, 3)
