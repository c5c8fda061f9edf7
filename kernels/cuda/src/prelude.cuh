// prelude.cuh: prepended to every family's .cu by kernel_common::cuda_source!.
// Storage types (f32, f16, bf16) widened to f32 for arithmetic, warp reductions, and the
// m16n8k16 tensor-core MMA (f16/bf16 operands, f32 accumulators) as inline PTX.
#ifndef WORKBENCH_EMULATE
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math_constants.h>
#endif

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Sum over `width` consecutive lanes (width a power of two ≤ 32).
__device__ __forceinline__ float group_sum(float x, int width) {
    for (int o = width >> 1; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// tanh(x) to f32 accuracy (absolute error about 1e-7). Under --use_fast_math `tanhf` compiles
// to tanh.approx.f32, whose relative error is 2^-11: a soft-capped score of 50 off by 0.02.
__device__ __forceinline__ float tanh_f32(float x) {
    const float t = exp2f(-2.8853900817779268f * fabsf(x));  // e^(-2|x|)
    return copysignf((1.0f - t) / (1.0f + t), x);
}

// exp(x) for x ≤ 0 or -inf (-inf → 0), through exp2.
__device__ __forceinline__ float exp_neg(float x) {
    return x == -CUDART_INF_F ? 0.0f : exp2f(x * 1.4426950408889634f);
}

// Two f32 values packed into one register of two 16-bit operands (low half = first).
template <typename T> __device__ __forceinline__ u32 pack2(float lo, float hi);
template <> __device__ __forceinline__ u32 pack2<__half>(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<u32*>(&h);
}
template <> __device__ __forceinline__ u32 pack2<bf16>(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<u32*>(&h);
}

// Two 16-bit values from memory as one register (they must be adjacent, 4-byte aligned).
template <typename T> __device__ __forceinline__ u32 load2(const T* p) {
    return *reinterpret_cast<const u32*>(p);
}

// Two non-adjacent 16-bit values packed into one register (low half = lo).
template <typename T> __device__ __forceinline__ u32 join2(T lo, T hi) {
    u16 a = *reinterpret_cast<u16*>(&lo);
    u16 b = *reinterpret_cast<u16*>(&hi);
    return (u32)a | ((u32)b << 16);
}

// D = A·B + C for one 16×8×16 tile: A row-major 16×16 (4 regs), B column-major 16×8
// (2 regs), C/D 16×8 f32 (4 regs). Fragment layout of PTX ISA "mma.m16n8k16".
template <typename T> __device__ __forceinline__ void mma16816(float* d, const u32* a, const u32* b);
#ifdef WORKBENCH_EMULATE
template <> inline void mma16816<__half>(float* d, const u32* a, const u32* b) { emu::mma<__half>(d, a, b); }
template <> inline void mma16816<bf16>(float* d, const u32* a, const u32* b) { emu::mma<bf16>(d, a, b); }
#else
template <> __device__ __forceinline__ void mma16816<__half>(float* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void mma16816<bf16>(float* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// The two 16-bit halves of a register widened to f32 (bit operations: no local memory).
template <typename H> __device__ __forceinline__ float half_lo(u32 v);
template <typename H> __device__ __forceinline__ float half_hi(u32 v);
template <> __device__ __forceinline__ float half_lo<__half>(u32 v) { return __half2float(__ushort_as_half((u16)(v & 0xffffu))); }
template <> __device__ __forceinline__ float half_hi<__half>(u32 v) { return __half2float(__ushort_as_half((u16)(v >> 16))); }
template <> __device__ __forceinline__ float half_lo<bf16>(u32 v) { return __uint_as_float(v << 16); }
template <> __device__ __forceinline__ float half_hi<bf16>(u32 v) { return __uint_as_float(v & 0xffff0000u); }

// 8 consecutive storage elements as loaded (one 16-byte load for f16/bf16, two for f32), to
// be widened to f32 by widen8 where they are used: loads issued a step ahead hold half the
// registers of their floats in the 16-bit types.
template <typename T> struct Raw8 { uint4 v; };
template <> struct Raw8<float> { float4 a, b; };
template <typename T> __device__ __forceinline__ Raw8<T> load_raw8(const T* p) {
    Raw8<T> r;
    r.v = *reinterpret_cast<const uint4*>(p);
    return r;
}
template <> __device__ __forceinline__ Raw8<float> load_raw8<float>(const float* p) {
    Raw8<float> r;
    r.a = *reinterpret_cast<const float4*>(p);
    r.b = *reinterpret_cast<const float4*>(p + 4);
    return r;
}
template <typename T> __device__ __forceinline__ void widen8(const Raw8<T>& r, float* out) {
    out[0] = half_lo<T>(r.v.x); out[1] = half_hi<T>(r.v.x);
    out[2] = half_lo<T>(r.v.y); out[3] = half_hi<T>(r.v.y);
    out[4] = half_lo<T>(r.v.z); out[5] = half_hi<T>(r.v.z);
    out[6] = half_lo<T>(r.v.w); out[7] = half_hi<T>(r.v.w);
}
template <> __device__ __forceinline__ void widen8<float>(const Raw8<float>& r, float* out) {
    out[0] = r.a.x; out[1] = r.a.y; out[2] = r.a.z; out[3] = r.a.w;
    out[4] = r.b.x; out[5] = r.b.y; out[6] = r.b.z; out[7] = r.b.w;
}
// 8 consecutive storage elements widened to f32 at once (16-byte loads for f16/bf16, two for
// f32).
template <typename T> __device__ __forceinline__ void load8(const T* p, float* out) {
    widen8(load_raw8(p), out);
}

// Four 8×8 matrices of 16-bit values from shared memory in MMA fragment layout (ldmatrix):
// lane t names row t % 8 of matrix t / 8; register i of lane t receives matrix i's elements
// (t / 4, 2·(t % 4)) and (t / 4, 2·(t % 4) + 1) — or, transposed, (2·(t % 4), t / 4) and
// (2·(t % 4) + 1, t / 4). Rows must be 16-byte aligned.
#ifdef WORKBENCH_EMULATE
template <typename T> inline void ldmatrix_x4(u32* r, const T* row) { emu::ldmatrix(r, row, false); }
template <typename T> inline void ldmatrix_x4_trans(u32* r, const T* row) { emu::ldmatrix(r, row, true); }
// 16 bytes global → shared, asynchronously; only `bytes` (0 or 16) are read, the rest
// zero-filled. Both addresses 16-byte aligned. The copy belongs to the thread's open group,
// which cp_async_commit closes; cp_async_wait<N> waits until at most the newest N groups are
// still in flight. The emulator queues the copies and lands them at the wait (emulate_warp.h).
inline void cp_async16(void* dst, const void* src, int bytes) { emu::cp_async(dst, src, bytes); }
inline void cp_async_commit() { emu::cp_async_commit(); }
template <int N> inline void cp_async_wait() { emu::cp_async_wait(N); }
#else
template <typename T> __device__ __forceinline__ void ldmatrix_x4(u32* r, const T* row) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
template <typename T> __device__ __forceinline__ void ldmatrix_x4_trans(u32* r, const T* row) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#endif
