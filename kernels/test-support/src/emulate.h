// emulate.h: runs the workbench's .cu kernels on the CPU, for tests on machines without a
// GPU. Compiled with g++ (-DWORKBENCH_EMULATE, this header force-included before the
// prelude). Every CUDA thread of a block is a coroutine (ucontext) on one OS thread; blocks
// run one after another. __syncthreads is a block barrier over the threads that have not
// exited; warp collectives (__shfl_xor_sync, __syncwarp, the m16n8k16 MMA) are warp barriers
// and fail the launch if a lane of the warp has exited or the warp deadlocks. __shared__
// variables are function statics: one copy, shared by the threads of the running block.
// The MMA is computed from the fragments as PTX ISA "mma.m16n8k16" lays them out, in f32.
// Not emulated: memory ordering and timing (one thread runs at a time). The schedule is
// warp-major: a warp runs until all its lanes wait at a block barrier (or end) before the
// next warp starts, which exposes a missing barrier between warps (seen: removing flash2p's
// end-of-tile __syncthreads fails the test); a race inside one warp can still hide.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <type_traits>
#include <utility>
#include <string>
#include <vector>
#include <ucontext.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

typedef unsigned int u32;
typedef unsigned short u16;

struct dim3e { unsigned x, y, z; };
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

// ---- 16-bit floats: bit containers with round-to-nearest-even conversions ----
struct __half { u16 bits; };
struct __nv_bfloat16 { u16 bits; };
struct __half2 { __half x, y; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };

inline float emu_bits_f(u32 b) { float f; std::memcpy(&f, &b, 4); return f; }
inline u32 emu_f_bits(float f) { u32 b; std::memcpy(&b, &f, 4); return b; }
inline float __half2float(__half h) { _Float16 v; std::memcpy(&v, &h.bits, 2); return (float)v; }
inline __half __float2half_rn(float f) { _Float16 v = (_Float16)f; __half h; std::memcpy(&h.bits, &v, 2); return h; }
inline float __bfloat162float(__nv_bfloat16 b) { return emu_bits_f((u32)b.bits << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    u32 b = emu_f_bits(f);
    __nv_bfloat16 r;
    if (std::isnan(f)) { r.bits = (u16)((b >> 16) | 0x40); return r; }
    b += 0x7fffu + ((b >> 16) & 1u);
    r.bits = (u16)(b >> 16);
    return r;
}
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
inline __half __ushort_as_half(u16 v) { return {v}; }
inline float __uint_as_float(u32 v) { return emu_bits_f(v); }
#define CUDART_INF_F INFINITY

// ---- the thread model ----
namespace emu {

struct Thread {
    ucontext_t ctx;
    std::vector<char> stack;
    dim3e tid;
    int linear = 0;
    bool done = false;
};

struct Warp {
    int live = 32;        // lanes that have not exited
    int exited = 0;
    int arrived = 0;
    unsigned gen = 0;
    float slot[32];
    const void* row[32];
    u32 a[32][4], b[32][2];
};

struct Block {
    std::vector<Thread> threads;
    std::vector<Warp> warps;
    int live = 0, arrived = 0;
    unsigned gen = 0;
    int current = -1;
    ucontext_t scheduler;
    std::function<void()> body;
    std::string error;
};

inline Block*& block() { static Block* b = nullptr; return b; }
inline dim3e& grid_idx() { static dim3e g; return g; }
inline dim3e& grid_dim() { static dim3e g; return g; }
inline dim3e& block_dim() { static dim3e g; return g; }

inline Thread& me() { return block()->threads[block()->current]; }

inline void yield() { swapcontext(&me().ctx, &block()->scheduler); }

inline void fail(const std::string& why) {
    if (block()->error.empty()) block()->error = why;
}

inline void sync_block() {
    Block* b = block();
    unsigned gen = b->gen;
    if (++b->arrived >= b->live) { b->arrived = 0; b->gen++; return; }
    while (b->gen == gen) {
        yield();
        if (!b->error.empty()) return;
    }
}

inline Warp& my_warp() { return block()->warps[me().linear / 32]; }
inline int lane() { return me().linear % 32; }

inline void sync_warp() {
    Warp& w = my_warp();
    if (w.exited) fail("warp collective after a lane of the warp exited (thread " + std::to_string(me().linear) + ")");
    unsigned gen = w.gen;
    if (++w.arrived >= w.live) { w.arrived = 0; w.gen++; return; }
    while (w.gen == gen) {
        yield();
        if (!block()->error.empty()) return;
    }
}

inline void trampoline() {
    block()->body();
    Thread& t = me();
    t.done = true;
    Block* b = block();
    b->live--;
    Warp& w = b->warps[t.linear / 32];
    w.live--;
    w.exited++;
    // A barrier that now has everyone it waits for completes.
    if (b->arrived > 0 && b->arrived >= b->live) { b->arrived = 0; b->gen++; }
    if (w.arrived > 0 && w.arrived >= w.live) { w.arrived = 0; w.gen++; }
    swapcontext(&t.ctx, &b->scheduler);
}

// Runs `body` for every thread of every block; returns "" or the first error.
inline std::string run(dim3e grid, unsigned threads, const std::function<void()>& body) {
    if (threads == 0 || threads % 32 != 0 || threads > 1024) return "block size must be a multiple of 32, at most 1024";
    grid_dim() = grid;
    block_dim() = {threads, 1, 1};
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                Block b;
                b.body = body;
                b.threads.resize(threads);
                b.warps.resize(threads / 32);
                b.live = (int)threads;
                block() = &b;
                grid_idx() = {x, y, z};
                for (unsigned i = 0; i < threads; ++i) {
                    Thread& t = b.threads[i];
                    t.tid = {i, 0, 0};
                    t.linear = (int)i;
                    t.stack.resize(64 * 1024);
                    getcontext(&t.ctx);
                    t.ctx.uc_stack.ss_sp = t.stack.data();
                    t.ctx.uc_stack.ss_size = t.stack.size();
                    t.ctx.uc_link = nullptr;
                    makecontext(&t.ctx, trampoline, 0);
                }
                for (;;) {
                    bool any = false;
                    unsigned gen_before = b.gen;
                    std::vector<unsigned> wgen;
                    for (auto& w : b.warps) wgen.push_back(w.gen);
                    int finished_before = 0;
                    for (auto& t : b.threads) finished_before += t.done;
                    // Warp-major: each warp runs as far as it can (through its own warp
                    // barriers) before the next one starts, so one warp gets as far ahead of
                    // the others as a block barrier allows. A barrier missing between warps
                    // then shows as a wrong result rather than hiding in lockstep.
                    for (size_t wi = 0; wi < b.warps.size() && b.error.empty(); ++wi) {
                        Warp& w = b.warps[wi];
                        for (;;) {
                            unsigned wg = w.gen, bg = b.gen;
                            int arrived = b.arrived, done = 0;
                            for (unsigned i = wi * 32; i < wi * 32 + 32; ++i) done += b.threads[i].done;
                            for (unsigned i = wi * 32; i < wi * 32 + 32; ++i) {
                                if (b.threads[i].done) continue;
                                any = true;
                                b.current = (int)i;
                                swapcontext(&b.scheduler, &b.threads[i].ctx);
                                if (!b.error.empty()) break;
                            }
                            int done_after = 0;
                            for (unsigned i = wi * 32; i < wi * 32 + 32; ++i) done_after += b.threads[i].done;
                            if (!b.error.empty() || done_after == 32) break;
                            if (w.gen == wg && b.gen == bg && b.arrived == arrived && done_after == done) break;
                        }
                    }
                    if (!b.error.empty() || !any) break;
                    int finished = 0;
                    for (auto& t : b.threads) finished += t.done;
                    bool progressed = b.gen != gen_before || finished != finished_before;
                    for (size_t i = 0; i < b.warps.size(); ++i) progressed |= b.warps[i].gen != wgen[i];
                    if (!progressed) { b.error = "deadlock: threads wait at a barrier others never reach"; break; }
                }
                block() = nullptr;
                if (!b.error.empty()) return b.error + " (block " + std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(z) + ")";
            }
    return "";
}

// f32 value of element `i` of a fragment register holding two 16-bit values.
template <typename T> inline float half_of(u32 r, int i);
template <> inline float half_of<__half>(u32 r, int i) { return __half2float({(u16)(i ? r >> 16 : r & 0xffff)}); }
template <> inline float half_of<__nv_bfloat16>(u32 r, int i) { return __bfloat162float({(u16)(i ? r >> 16 : r & 0xffff)}); }

// D += A·B for the warp's 16×8×16 tile, from every lane's fragments.
template <typename T> inline void mma(float* d, const u32* a, const u32* b) {
    Warp& w = my_warp();
    int l = lane();
    for (int i = 0; i < 4; ++i) w.a[l][i] = a[i];
    w.b[l][0] = b[0];
    w.b[l][1] = b[1];
    sync_warp();
    // Rebuild A (16×16) and B (16×8): lane = 4·group + t4.
    float A[16][16], B[16][8];
    for (int ln = 0; ln < 32; ++ln) {
        int g = ln >> 2, t4 = ln & 3;
        for (int h = 0; h < 2; ++h) {
            A[g][t4 * 2 + h] = half_of<T>(w.a[ln][0], h);
            A[g + 8][t4 * 2 + h] = half_of<T>(w.a[ln][1], h);
            A[g][t4 * 2 + 8 + h] = half_of<T>(w.a[ln][2], h);
            A[g + 8][t4 * 2 + 8 + h] = half_of<T>(w.a[ln][3], h);
            B[t4 * 2 + h][g] = half_of<T>(w.b[ln][0], h);
            B[t4 * 2 + 8 + h][g] = half_of<T>(w.b[ln][1], h);
        }
    }
    int g = l >> 2, t4 = l & 3;
    for (int e = 0; e < 4; ++e) {
        int row = g + (e >= 2 ? 8 : 0), col = t4 * 2 + (e & 1);
        float s = 0.0f;
        for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
        d[e] += s;
    }
    sync_warp();  // nobody overwrites the fragments before every lane has read them
}

// ldmatrix.x4: lane t names row t % 8 of matrix t / 8 (16-bit elements, 8 per row).
inline void ldmatrix(u32* r, const void* my_row, bool trans) {
    Warp& w = my_warp();
    int l = lane();
    w.row[l] = my_row;
    sync_warp();
    int g = l >> 2, t4 = l & 3;
    for (int i = 0; i < 4; ++i) {
        u16 lo, hi;
        if (!trans) {
            const u16* row = static_cast<const u16*>(w.row[i * 8 + g]);
            lo = row[2 * t4];
            hi = row[2 * t4 + 1];
        } else {
            lo = static_cast<const u16*>(w.row[i * 8 + 2 * t4])[g];
            hi = static_cast<const u16*>(w.row[i * 8 + 2 * t4 + 1])[g];
        }
        r[i] = (u32)lo | ((u32)hi << 16);
    }
    sync_warp();
}

}  // namespace emu

#define threadIdx (emu::me().tid)
#define blockIdx (emu::grid_idx())
#define blockDim (emu::block_dim())
#define gridDim (emu::grid_dim())

inline void __syncthreads() { emu::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::sync_warp(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    emu::Warp& w = emu::my_warp();
    int l = emu::lane();
    w.slot[l] = v;  // the previous collective ended with every lane past its read
    emu::sync_warp();
    float r = w.slot[l ^ o];
    emu::sync_warp();
    return r;
}
inline int __shfl_xor_sync(unsigned m, int v, int o) {
    float f;
    std::memcpy(&f, &v, 4);
    f = __shfl_xor_sync(m, f, o);
    int r;
    std::memcpy(&r, &f, 4);
    return r;
}

// The host entry: launches entry `f` with arguments as CUDA passes them (pointers to values).
namespace emu {
template <typename... A, size_t... I>
inline void call(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}
template <typename... A>
inline std::string launch(void (*f)(A...), dim3e grid, unsigned threads, void** args) {
    return run(grid, threads, [=] { call(f, args, std::index_sequence_for<A...>{}); });
}
}  // namespace emu

#define EMU_ENTRY(name)                                                         \
    if (std::strcmp(entry, #name) == 0) {                                       \
        std::string e = emu::launch(name, grid, threads, args);                 \
        std::snprintf(err, err_len, "%s", e.c_str());                           \
        return e.empty() ? 0 : 1;                                               \
    }
