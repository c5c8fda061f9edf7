// quant.cu: weight-only quantised GEMV/skinny GEMM Y = X·Wᵀ on the GPU, dequantising in
// registers (the llama.cpp / AWQ "dequant GEMV" pattern). W is stored row by row in the CPU
// side's byte layout (kernels/quant/src/format.rs), blocks of 32 values:
//   f16      64 bytes: 32 little-endian halves (the f16-weight baseline)
//   sym4g32  18 bytes: f16 scale, 16 bytes of LSB-first nibbles (value 2j low, 2j+1 high);
//            w = scale·(c − 8)
//   q4_0     18 bytes: f16 d, 16 bytes (value j low nibble, j+16 high); w = d·(c − 8)
//   q8_0     34 bytes: f16 d, 32 × i8; w = d·q
// X is f32 [batch, cols], Y f32 [batch, rows]; batch ≤ 8. One warp per output row, lanes
// over the row's blocks (consecutive lanes read consecutive blocks), 4 warps per block; each
// lane loads GEMV_BLOCKS_IN_FLIGHT blocks before it decodes any.

constexpr int GEMV_MAX_BATCH = 8;

// Each format's block as loaded (Raw: registers, 16-byte loads for f16, 2-byte loads for the
// 18- and 34-byte blocks, which sit at 2-byte alignment) and widened to 32 f32 weights.
template <int FMT> struct Fmt;
template <> struct Fmt<0> {  // f16
    static constexpr int BYTES = 64;
    struct Raw { uint4 v[4]; };
    __device__ static Raw load(const u8* blk) {
        Raw r;
#pragma unroll
        for (int i = 0; i < 4; ++i) r.v[i] = reinterpret_cast<const uint4*>(blk)[i];
        return r;
    }
    __device__ static void decode(const Raw& r, float* w) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 q[4] = {r.v[i].x, r.v[i].y, r.v[i].z, r.v[i].w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                w[8 * i + 2 * k] = half_lo<__half>(q[k]);
                w[8 * i + 2 * k + 1] = half_hi<__half>(q[k]);
            }
        }
    }
};
// A block of an f16 scale and N bytes of codes, as N/2 + 1 two-byte loads.
template <int N> struct ScaledRaw {
    u16 scale;
    u16 c[N / 2];
    __device__ static ScaledRaw load(const u8* blk) {
        ScaledRaw r;
        const u16* p = reinterpret_cast<const u16*>(blk);
        r.scale = p[0];
#pragma unroll
        for (int i = 0; i < N / 2; ++i) r.c[i] = p[1 + i];
        return r;
    }
    __device__ float s() const { return __half2float(__ushort_as_half(scale)); }
};
template <> struct Fmt<1> {  // sym4g32 (f16 scale)
    static constexpr int BYTES = 18;
    using Raw = ScaledRaw<16>;
    __device__ static Raw load(const u8* blk) { return Raw::load(blk); }
    __device__ static void decode(const Raw& r, float* w) {
        const float s = r.s();
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 two = r.c[i];  // bytes 2i, 2i+1 → values 4i .. 4i+3
#pragma unroll
            for (int n = 0; n < 4; ++n) w[4 * i + n] = s * (float)((int)((two >> (4 * n)) & 15u) - 8);
        }
    }
};
template <> struct Fmt<2> {  // ggml q4_0
    static constexpr int BYTES = 18;
    using Raw = ScaledRaw<16>;
    __device__ static Raw load(const u8* blk) { return Raw::load(blk); }
    __device__ static void decode(const Raw& r, float* w) {
        const float d = r.s();
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 two = r.c[i];  // bytes 2i, 2i+1
            w[2 * i] = d * (float)((int)(two & 15u) - 8);
            w[2 * i + 16] = d * (float)((int)((two >> 4) & 15u) - 8);
            w[2 * i + 1] = d * (float)((int)((two >> 8) & 15u) - 8);
            w[2 * i + 17] = d * (float)((int)((two >> 12) & 15u) - 8);
        }
    }
};
template <> struct Fmt<3> {  // ggml q8_0
    static constexpr int BYTES = 34;
    using Raw = ScaledRaw<32>;
    __device__ static Raw load(const u8* blk) { return Raw::load(blk); }
    __device__ static void decode(const Raw& r, float* w) {
        const float d = r.s();
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const u32 two = r.c[i];
            w[2 * i] = d * (float)(signed char)(two & 0xffu);
            w[2 * i + 1] = d * (float)(signed char)(two >> 8);
        }
    }
};

// Blocks each lane loads before it decodes any: the bytes in flight per warp (4 × 32 blocks:
// 2.3 KiB of q4_0, 8 KiB of f16) that one latency must cover.
constexpr int GEMV_BLOCKS_IN_FLIGHT = 4;

template <int FMT>
__device__ void gemv(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                     int rows, int cols, int batch) {
    using F = Fmt<FMT>;
    constexpr int NF = GEMV_BLOCKS_IN_FLIGHT;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int nb = cols / 32;
    const u8* wr = w + (size_t)row * nb * F::BYTES;
    float acc[GEMV_MAX_BATCH];
#pragma unroll
    for (int b = 0; b < GEMV_MAX_BATCH; ++b) acc[b] = 0.0f;
    for (int blk0 = lane; blk0 < nb; blk0 += 32 * NF) {
        // The loads of NF blocks first (a block past the row's end reloads its last block,
        // unused), then the arithmetic.
        typename F::Raw raw[NF];
#pragma unroll
        for (int f = 0; f < NF; ++f) raw[f] = F::load(wr + (size_t)min(blk0 + 32 * f, nb - 1) * F::BYTES);
#pragma unroll
        for (int f = 0; f < NF; ++f) {
            // Past the row's end: the last block again, its sum dropped (no branch, so the
            // compiler keeps the loads above together).
            const bool valid = blk0 + 32 * f < nb;
            const int blk = min(blk0 + 32 * f, nb - 1);
            float wv[32];
            F::decode(raw[f], wv);
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
                acc[b] += valid ? s : 0.0f;
            }
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
