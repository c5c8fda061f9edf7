// roofline.cu: the matrix ceiling of `harness roofline --device cuda`, measured through the
// workbench's own machinery (NVRTC, the module cache, CUDA events): C = A·Bᵀ with A [M, K]
// and B [N, K] bf16 row-major, C f32. 128×128 block tiles, 32-deep K steps through shared
// memory, 8 warps of 64×32 each issuing m16n8k16 MMAs. It is NOT cuBLAS (no wgmma, no TMA,
// no pipelining), so its rate is a lower bound on the chip's bf16 matrix ceiling.

constexpr int GB_M = 128, GB_N = 128, GB_K = 32, GB_LD = GB_K + 8;

extern "C" __global__ void __launch_bounds__(256)
    gemm_bf16(const bf16* __restrict__ a, const bf16* __restrict__ b, float* __restrict__ c,
              int m, int n, int k) {
    __shared__ __align__(16) bf16 as[GB_M * GB_LD];
    __shared__ __align__(16) bf16 bs[GB_N * GB_LD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int wm = warp / 4, wn = warp % 4;
    const int m0 = blockIdx.y * GB_M, n0 = blockIdx.x * GB_N;
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += GB_K) {
        __syncthreads();
        for (int e = threadIdx.x; e < GB_M * GB_K / 8; e += blockDim.x) {
            const int r = e / (GB_K / 8), col = (e % (GB_K / 8)) * 8;
            *reinterpret_cast<uint4*>(as + r * GB_LD + col) =
                *reinterpret_cast<const uint4*>(a + (size_t)(m0 + r) * k + k0 + col);
            *reinterpret_cast<uint4*>(bs + r * GB_LD + col) =
                *reinterpret_cast<const uint4*>(b + (size_t)(n0 + r) * k + k0 + col);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GB_K / 16; ++kk) {
            const int col = kk * 16 + t4 * 2;
            u32 af[4][4], bfr[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
                const bf16* p = as + (wm * 64 + mt * 16 + g) * GB_LD + col;
                af[mt][0] = load2(p);
                af[mt][1] = load2(p + 8 * GB_LD);
                af[mt][2] = load2(p + 8);
                af[mt][3] = load2(p + 8 * GB_LD + 8);
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const bf16* p = bs + (wn * 32 + nt * 8 + g) * GB_LD + col;
                bfr[nt][0] = load2(p);
                bfr[nt][1] = load2(p + 8);
            }
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) mma16816<bf16>(acc[mt][nt], af[mt], bfr[nt]);
        }
    }
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            const int row = m0 + wm * 64 + mt * 16 + g;
            const int col = n0 + wn * 32 + nt * 8 + t4 * 2;
            c[(size_t)row * n + col] = acc[mt][nt][0];
            c[(size_t)row * n + col + 1] = acc[mt][nt][1];
            c[(size_t)(row + 8) * n + col] = acc[mt][nt][2];
            c[(size_t)(row + 8) * n + col + 1] = acc[mt][nt][3];
        }
}
