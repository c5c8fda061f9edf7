// quant.cu: weight-only quantised GEMV/skinny GEMM Y = X·Wᵀ on the GPU, dequantising in
// registers (the llama.cpp / AWQ "dequant GEMV" pattern). W is stored row by row in the CPU
// side's byte layout (kernels/quant/src/format.rs), blocks of 32 values:
//   f16      64 bytes: 32 little-endian halves (the f16-weight baseline)
//   sym4g32  18 bytes: f16 scale, 16 bytes of LSB-first nibbles (value 2j low, 2j+1 high);
//            w = scale·(c − 8)
//   q4_0     18 bytes: f16 d, 16 bytes (value j low nibble, j+16 high); w = d·(c − 8)
//   q8_0     34 bytes: f16 d, 32 × i8; w = d·q
// X is f32 [batch, cols], Y f32 [batch, rows]; batch ≤ 8. One warp per output row, 4 warps
// per block; 4 lanes share each weight block (8 weights each) and a warp steps over 8
// consecutive blocks, so both the weights and x are read contiguously across the warp (the
// H200 run of 2026-12-04 found one lane per block, 128 B of x per lane, L1-bound at 10% of
// the copy bandwidth); each lane loads GEMV_BLOCKS_IN_FLIGHT steps before it decodes any.

constexpr int GEMV_MAX_BATCH = 8;

// Each format's block as four lanes read it: lane part p (0..3) loads its share of the block
// (Raw) and widens its 8 weights; `xoff(p, half)` is where each 4 of those 8 sit in the block's
// 32 activations (x is read as two float4 per lane, so a warp's 8 blocks read 1 KiB of x
// contiguously). The 18- and 34-byte blocks sit at 2-byte alignment: 2-byte loads.
template <int FMT> struct Fmt;
template <> struct Fmt<0> {  // f16: part p = halves 8p .. 8p+7, one 16-byte load
    static constexpr int BYTES = 64;
    using Raw = Raw8<__half>;
    __device__ static Raw load(const u8* blk, int p) {
        Raw r;
        r.v = reinterpret_cast<const uint4*>(blk)[p];
        return r;
    }
    __device__ static void decode(const Raw& r, float* w) { widen8(r, w); }
    __device__ static int xoff(int p, int half) { return 8 * p + 4 * half; }
};
// A block of an f16 scale then code bytes; part p's N bytes start at byte 2 + N·p.
template <int N> struct ScaledPart {
    u16 scale;
    u16 c[N / 2];
    __device__ static ScaledPart load(const u8* blk, int p) {
        ScaledPart r;
        const u16* h = reinterpret_cast<const u16*>(blk);
        r.scale = h[0];
#pragma unroll
        for (int i = 0; i < N / 2; ++i) r.c[i] = h[1 + (N / 2) * p + i];
        return r;
    }
    __device__ float s() const { return __half2float(__ushort_as_half(scale)); }
};
template <> struct Fmt<1> {  // sym4g32: byte j holds values 2j (low), 2j+1; part p = bytes 4p..4p+3
    static constexpr int BYTES = 18;
    using Raw = ScaledPart<4>;
    __device__ static Raw load(const u8* blk, int p) { return Raw::load(blk, p); }
    __device__ static void decode(const Raw& r, float* w) {
        const float s = r.s();
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 two = r.c[i];  // 2 bytes → 4 values
#pragma unroll
            for (int n = 0; n < 4; ++n) w[4 * i + n] = s * (float)((int)((two >> (4 * n)) & 15u) - 8);
        }
    }
    __device__ static int xoff(int p, int half) { return 8 * p + 4 * half; }
};
template <> struct Fmt<2> {  // q4_0: byte j holds values j (low), j+16; part p = bytes 4p..4p+3
    static constexpr int BYTES = 18;
    using Raw = ScaledPart<4>;
    __device__ static Raw load(const u8* blk, int p) { return Raw::load(blk, p); }
    __device__ static void decode(const Raw& r, float* w) {  // w = values 4p..4p+3, 16+4p..
        const float d = r.s();
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 two = r.c[i];
            w[2 * i] = d * (float)((int)(two & 15u) - 8);
            w[2 * i + 1] = d * (float)((int)((two >> 8) & 15u) - 8);
            w[4 + 2 * i] = d * (float)((int)((two >> 4) & 15u) - 8);
            w[4 + 2 * i + 1] = d * (float)((int)((two >> 12) & 15u) - 8);
        }
    }
    __device__ static int xoff(int p, int half) { return 4 * p + 16 * half; }
};
template <> struct Fmt<3> {  // q8_0: part p = int8 values 8p .. 8p+7
    static constexpr int BYTES = 34;
    using Raw = ScaledPart<8>;
    __device__ static Raw load(const u8* blk, int p) { return Raw::load(blk, p); }
    __device__ static void decode(const Raw& r, float* w) {
        const float d = r.s();
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 two = r.c[i];
            w[2 * i] = d * (float)(signed char)(two & 0xffu);
            w[2 * i + 1] = d * (float)(signed char)(two >> 8);
        }
    }
    __device__ static int xoff(int p, int half) { return 8 * p + 4 * half; }
};

// Block steps each lane loads before it decodes any: 8 × 8 blocks per warp in flight.
constexpr int GEMV_BLOCKS_IN_FLIGHT = 8;

// One warp per output row; 4 lanes per weight block, 8 blocks side by side per step.
template <int FMT>
__device__ void gemv(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                     int rows, int cols, int batch) {
    using F = Fmt<FMT>;
    constexpr int NF = GEMV_BLOCKS_IN_FLIGHT;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, part = lane & 3, first = lane >> 2;
    if (row >= rows) return;
    const int nb = cols / 32;
    const u8* wr = w + (size_t)row * nb * F::BYTES;
    float acc[GEMV_MAX_BATCH];
#pragma unroll
    for (int b = 0; b < GEMV_MAX_BATCH; ++b) acc[b] = 0.0f;
    for (int blk0 = first; blk0 < nb; blk0 += 8 * NF) {
        // The loads of NF blocks first (a block past the row's end reloads its last block,
        // its sum dropped: no branch, so the compiler keeps the loads together).
        typename F::Raw raw[NF];
#pragma unroll
        for (int f = 0; f < NF; ++f)
            raw[f] = F::load(wr + (size_t)min(blk0 + 8 * f, nb - 1) * F::BYTES, part);
#pragma unroll
        for (int f = 0; f < NF; ++f) {
            const bool valid = blk0 + 8 * f < nb;
            const int blk = min(blk0 + 8 * f, nb - 1);
            float wv[8];
            F::decode(raw[f], wv);
#pragma unroll
            for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
                if (b >= batch) break;
                const float* xb = x + (size_t)b * cols + blk * 32;
                const float4 v0 = *reinterpret_cast<const float4*>(xb + F::xoff(part, 0));
                const float4 v1 = *reinterpret_cast<const float4*>(xb + F::xoff(part, 1));
                const float s = wv[0] * v0.x + wv[1] * v0.y + wv[2] * v0.z + wv[3] * v0.w +
                                wv[4] * v1.x + wv[5] * v1.y + wv[6] * v1.z + wv[7] * v1.w;
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
