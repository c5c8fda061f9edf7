// emulate.h: runs the workbench's .cu kernels on the CPU, for tests on machines without a
// GPU, failing where a GPU would fail. Compiled with g++ (-DWORKBENCH_EMULATE) together with
// emulate_warp.h and emulate_math.h, in that order, before the prelude.
//
// Threads: every CUDA thread of a block is a coroutine with its own stack, switched by a few
// instructions (callee-saved registers, MXCSR; ucontext where the CPU is not x86-64).
// Blocks: two at a time ("slots"), each on its own OS thread, strictly alternating: a slot
// runs one round, taking its block from one __syncthreads to the next (warp-major: each warp
// in turn runs as far as it can, so one warp runs ahead of the others up to the barrier),
// then the other slot runs one. The later block of a pair runs first, and a slot takes the
// next block as soon as its block ends, so blocks overlap out of index order and a race
// between blocks on global memory can show.
// Shared memory: `__shared__` is `static thread_local`, so each slot's OS thread has its own
// copy of every `__shared__` variable (the module's TLS block), filled with 0xff bytes (NaN
// in f32, f16 and bf16) when each block starts: an uninitialised shared read shows.
// Failures (the launch returns the message, naming thread and block): a pointer cast to a
// type it is misaligned for (`uint4`/`float4` are 16-byte aligned, as in CUDA); a warp
// collective whose mask names an exited lane or lanes waiting with other masks, or a lane
// exiting while others wait for it; a shuffle reading a lane outside its mask; ldmatrix and
// cp.async addresses (emulate_warp.h); a thread ending with cp.async copies not waited for;
// a deadlock; a thread stack overflow. Floating point runs with FTZ and DAZ set (x86-64), as
// --use_fast_math compiles the GPU's f32 arithmetic (.ftz).
// Not emulated: memory ordering and timing (one thread runs at a time); see kernels/CUDA.md.
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <link.h>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>
#if defined(__x86_64__)
#include <xmmintrin.h>
#else
#include <ucontext.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static thread_local
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

typedef unsigned int u32;
typedef unsigned short u16;

struct dim3e { unsigned x, y, z; };
// CUDA's vector types are aligned to their size; a misaligned access through them faults.
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

// ---- 16-bit floats: bit containers with round-to-nearest-even conversions ----
struct __half { u16 bits; };
struct __nv_bfloat16 { u16 bits; };
struct alignas(4) __half2 { __half x, y; };
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };

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
#if defined(__x86_64__)
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack,
// stores the stack pointer in *save and continues on the stack `load` (saved the same way).
// No signal mask: glibc's swapcontext makes a system call per switch for it.
extern "C" __attribute__((visibility("hidden"))) void emu_switch_stack(void** save, void* load);
asm(".text\n.p2align 4\n.type emu_switch_stack,@function\n.hidden emu_switch_stack\n"
    "emu_switch_stack:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n.size emu_switch_stack, .-emu_switch_stack\n");
#endif

namespace emu {

// One queued cp.async: its shared-memory destination and the 16 bytes it lands there.
struct CpCopy { unsigned char* dst; unsigned char data[16]; };

enum Wait { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_COLLECTIVE };

struct Context {
#if defined(__x86_64__)
    void* sp = nullptr;
#else
    ucontext_t uc{};
#endif
};

struct Thread {
    Context ctx;
    char* stack = nullptr;
    dim3e tid{0, 0, 0};
    int linear = 0;
    bool done = false;
    Wait wait = RUNNABLE;
    unsigned wait_gen = 0;       // the block barrier generation it waits to see pass
    unsigned wait_mask = 0;      // the mask of the warp collective it waits at (0: none)
    const char* wait_what = "";  // that collective
    unsigned long passed = 0;    // warp collectives it has completed
    unsigned long wait_passed = 0;
    std::vector<CpCopy> open;                 // cp.async copies not yet committed
    std::vector<std::vector<CpCopy>> groups;  // committed groups, oldest first
    void* fake_stack = nullptr;               // AddressSanitizer's, across switches
};

struct Warp {
    unsigned exited = 0;  // lanes that have returned
    float slot[32];
    const void* row[32];
    u32 a[32][4], b[32][2];
};

struct Block {
    dim3e idx{0, 0, 0};
    std::vector<Thread> threads;
    std::vector<Warp> warps;
    int live = 0, arrived = 0;
    unsigned gen = 0;        // block barriers completed
    unsigned round_gen = 0;  // `gen` when the running round began
    int current = -1;
    std::string error;
};

constexpr size_t STACK_CANARY = 0x5eed5eed5eed5eedull;
#if defined(__SANITIZE_ADDRESS__) || defined(WORKBENCH_EMU_SANITIZE)
constexpr size_t STACK_BYTES = 256 * 1024;  // instrumented frames are larger
#else
constexpr size_t STACK_BYTES = 64 * 1024;
#endif

// One of the two interleaved blocks: the OS thread it runs on, its block, the coroutine stacks
// and that thread's copy of the module's `__shared__` variables.
struct Slot {
    std::thread worker;
    std::mutex m;
    std::condition_variable cv;
    enum { IDLE, ROUND, QUIT } cmd = IDLE;
    bool has_block = false, started = false, ran = false;
    Block block;
    char* stacks = nullptr;
    Context scheduler;
    unsigned char* smem = nullptr;
    size_t smem_bytes = 0;
    const void* sched_bottom = nullptr;
    size_t sched_size = 0;
};

struct LaunchState {
    dim3e grid{1, 1, 1}, block_dim{32, 1, 1};
    const std::function<void()>* body = nullptr;
};

inline LaunchState& launch_state() { static LaunchState s; return s; }
inline Slot*& running() { static Slot* s = nullptr; return s; }
inline Block* block() { return &running()->block; }
inline Thread& me() { Block* b = block(); return b->threads[b->current]; }
inline Warp& my_warp() { return block()->warps[me().linear / 32]; }
inline int lane() { return me().linear % 32; }

inline std::string hex(uintptr_t v) {
    char s[24];
    std::snprintf(s, sizeof s, "0x%llx", (unsigned long long)v);
    return s;
}

// AddressSanitizer's fiber annotations around every stack switch.
inline void fiber_leaving(void** fake, const void* bottom, size_t size) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_start_switch_fiber(fake, bottom, size);
#else
    (void)fake; (void)bottom; (void)size;
#endif
}
inline void fiber_arrived(void* fake, const void** bottom, size_t* size) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(fake, bottom, size);
#else
    (void)fake; (void)bottom; (void)size;
#endif
}

inline void switch_context(Context& from, Context& to) {
#if defined(__x86_64__)
    emu_switch_stack(&from.sp, to.sp);
#else
    swapcontext(&from.uc, &to.uc);
#endif
}

// The running thread gives the CPU back to its slot's scheduler; `last` when it never resumes.
inline void to_scheduler(bool last) {
    Slot* s = running();
    Thread& t = me();
    fiber_leaving(last ? nullptr : &t.fake_stack, s->sched_bottom, s->sched_size);
    switch_context(t.ctx, s->scheduler);
    fiber_arrived(t.fake_stack, &running()->sched_bottom, &running()->sched_size);
}

// Fails the launch with `why` (the first failure wins) and abandons the calling thread: the
// launch ends without running any thread further, as a faulting GPU kernel ends.
[[noreturn]] inline void fail(const std::string& why) {
    Block* b = block();
    if (b->error.empty()) b->error = why + " (thread " + std::to_string(me().linear) + ")";
    to_scheduler(true);
    std::abort();  // never resumed
}

inline void check_aligned(const void* p, size_t align, const char* what) {
    if (reinterpret_cast<uintptr_t>(p) % align != 0)
        fail(std::string("misaligned address ") + hex(reinterpret_cast<uintptr_t>(p)) + ": " + what +
             " needs " + std::to_string(align) + "-byte alignment");
}

inline bool in_shared(const void* p) {
    const unsigned char* c = static_cast<const unsigned char*>(p);
    Slot* s = running();
    return c >= s->smem && c < s->smem + s->smem_bytes;
}

inline void sync_block() {
    Block* b = block();
    Thread& t = me();
    if (++b->arrived >= b->live) { b->arrived = 0; b->gen++; return; }
    t.wait = AT_BLOCK_BARRIER;
    t.wait_gen = b->gen;
    while (b->gen == t.wait_gen) to_scheduler(false);
    t.wait = RUNNABLE;
}

// A warp collective over the lanes of `mask`: every lane of the mask must arrive with the same
// mask; none of them may have exited.
inline void sync_warp(unsigned mask, const char* what) {
    Block* b = block();
    Thread& t = me();
    const int l = t.linear & 31, w0 = t.linear & ~31;
    Warp& w = b->warps[t.linear >> 5];
    if (!(mask >> l & 1u))
        fail(std::string(what) + ": lane " + std::to_string(l) + " is not in its own mask " + hex(mask));
    if (w.exited & mask)
        fail(std::string(what) + ": the mask " + hex(mask) + " names lanes that have exited (" +
             hex(w.exited & mask) + ")");
    t.wait_mask = mask;
    t.wait_what = what;
    bool all = true;
    for (int o = 0; o < 32; ++o) {
        if (!(mask >> o & 1u)) continue;
        const unsigned m = b->threads[w0 + o].wait_mask;
        if (m == 0) all = false;
        else if (m != mask)
            fail(std::string(what) + ": lanes " + std::to_string(l) + " and " + std::to_string(o) +
                 " wait at warp collectives with different masks (" + hex(mask) + ", " + hex(m) + ")");
    }
    if (all) {
        for (int o = 0; o < 32; ++o)
            if (mask >> o & 1u) {
                b->threads[w0 + o].wait_mask = 0;
                b->threads[w0 + o].passed++;
            }
        return;
    }
    t.wait = AT_WARP_COLLECTIVE;
    t.wait_passed = t.passed;
    while (t.passed == t.wait_passed) to_scheduler(false);
    t.wait = RUNNABLE;
}

[[noreturn]] inline void thread_main() {
    fiber_arrived(nullptr, &running()->sched_bottom, &running()->sched_size);
    (*launch_state().body)();
    Block* b = block();
    Thread& t = me();
    size_t pending = t.open.size();
    for (auto& g : t.groups) pending += g.size();
    if (pending)
        fail("the thread returns with " + std::to_string(pending) +
             " cp.async copies not waited for (their shared-memory destinations are undefined)");
    t.done = true;
    b->live--;
    const int l = t.linear & 31, w0 = t.linear & ~31;
    b->warps[t.linear >> 5].exited |= 1u << l;
    for (int o = 0; o < 32; ++o)
        if (b->threads[w0 + o].wait_mask >> l & 1u)
            fail("lane " + std::to_string(l) + " exited while lane " + std::to_string(o) + " waits for it at " +
                 b->threads[w0 + o].wait_what + " (mask " + hex(b->threads[w0 + o].wait_mask) + ")");
    // A block barrier that now has everyone it waits for completes.
    if (b->arrived > 0 && b->arrived >= b->live) { b->arrived = 0; b->gen++; }
    to_scheduler(true);
    std::abort();
}

inline void make_context(Thread& t) {
    std::memcpy(t.stack, &STACK_CANARY, sizeof STACK_CANARY);
#if defined(__x86_64__)
    uintptr_t top = (reinterpret_cast<uintptr_t>(t.stack) + STACK_BYTES) & ~uintptr_t(15);
    uint64_t* sp = reinterpret_cast<uint64_t*>(top);
    *--sp = 0;  // thread_main's return address: it never returns
    *--sp = reinterpret_cast<uint64_t>(&thread_main);
    for (int i = 0; i < 6; ++i) *--sp = 0;  // rbp rbx r12 r13 r14 r15
    --sp;
    const u32 csr = _mm_getcsr();
    u16 cw;
    asm volatile("fnstcw %0" : "=m"(cw));
    std::memcpy(sp, &csr, 4);
    std::memcpy(reinterpret_cast<char*>(sp) + 4, &cw, 2);
    t.ctx.sp = sp;
#else
    getcontext(&t.ctx.uc);
    t.ctx.uc.uc_stack.ss_sp = t.stack;
    t.ctx.uc.uc_stack.ss_size = STACK_BYTES;
    t.ctx.uc.uc_link = nullptr;
    makecontext(&t.ctx.uc, reinterpret_cast<void (*)()>(&thread_main), 0);
#endif
}

inline bool runnable(const Block& b, const Thread& t) {
    if (t.done) return false;
    // A barrier that completes during a round releases its threads in the next one: a round
    // takes the block from one barrier to the next.
    if (t.wait == AT_BLOCK_BARRIER) return b.round_gen > t.wait_gen;
    if (t.wait == AT_WARP_COLLECTIVE) return t.passed != t.wait_passed;
    return true;
}

inline void resume(Slot& s, Thread& t) {
    Block& b = s.block;
    b.current = t.linear;
    void* fake = nullptr;
    fiber_leaving(&fake, t.stack, STACK_BYTES);
    switch_context(s.scheduler, t.ctx);
    fiber_arrived(fake, nullptr, nullptr);
    if (b.error.empty() && std::memcmp(t.stack, &STACK_CANARY, sizeof STACK_CANARY) != 0)
        b.error = "thread stack overflow (thread " + std::to_string(t.linear) + ")";
}

// This OS thread's copy of the module's `__shared__` variables: its TLS block.
inline thread_local unsigned char tls_anchor;
inline int find_tls(dl_phdr_info* info, size_t, void* data) {
    auto* s = static_cast<Slot*>(data);
    const uintptr_t here = reinterpret_cast<uintptr_t>(&find_tls);
    bool mine = false;
    size_t bytes = 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const auto& ph = info->dlpi_phdr[i];
        const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
        if (ph.p_type == PT_LOAD && here >= lo && here < lo + ph.p_memsz) mine = true;
        if (ph.p_type == PT_TLS) bytes = ph.p_memsz;
    }
    if (!mine) return 0;
    s->smem = static_cast<unsigned char*>(info->dlpi_tls_data);
    s->smem_bytes = s->smem ? bytes : 0;
    return 1;
}

// Starts the slot's next block: shared memory poisoned, every thread at its entry.
inline void start_block(Slot& s, unsigned linear_block) {
    const LaunchState& ls = launch_state();
    Block& b = s.block;
    const unsigned n = ls.block_dim.x;
    b.idx = {linear_block % ls.grid.x, linear_block / ls.grid.x % ls.grid.y,
             linear_block / (ls.grid.x * ls.grid.y)};
    b.threads.resize(n);
    b.warps.assign(n / 32, Warp{});
    b.live = (int)n;
    b.arrived = 0;
    b.gen = 0;
    b.current = -1;
    b.error.clear();
    std::memset(s.smem, 0xff, s.smem_bytes);
#if defined(__SANITIZE_ADDRESS__)
    ASAN_UNPOISON_MEMORY_REGION(s.stacks, n * STACK_BYTES);  // frames of abandoned threads
#endif
    for (unsigned i = 0; i < n; ++i) {
        Thread& t = b.threads[i];
        t.tid = {i, 0, 0};
        t.linear = (int)i;
        t.done = false;
        t.wait = RUNNABLE;
        t.wait_mask = 0;
        t.passed = t.wait_passed = 0;
        t.open.clear();
        t.groups.clear();
        t.fake_stack = nullptr;
        t.stack = s.stacks + (size_t)i * STACK_BYTES;
        make_context(t);
    }
}

// One round of the slot's block: each warp in turn runs as far as it can (warp-major) up to
// the next block barrier. Returns whether any thread ran.
inline bool round(Slot& s) {
    Block& b = s.block;
    b.round_gen = b.gen;
    bool any = false;
    for (size_t wi = 0; wi < b.warps.size() && b.error.empty(); ++wi) {
        for (bool ran = true; ran && b.error.empty();) {
            ran = false;
            for (size_t i = wi * 32; i < wi * 32 + 32 && b.error.empty(); ++i) {
                if (!runnable(b, b.threads[i])) continue;
                ran = any = true;
                resume(s, b.threads[i]);
            }
        }
    }
    return any;
}

inline void worker(Slot& s) {
#if defined(__x86_64__)
    _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ | DAZ, as the GPU's .ftz arithmetic
#endif
    *static_cast<volatile unsigned char*>(&tls_anchor) = 0;  // allocates the TLS block here
    dl_iterate_phdr(find_tls, &s);
    for (;;) {
        std::unique_lock<std::mutex> lock(s.m);
        s.cv.wait(lock, [&] { return s.cmd != Slot::IDLE; });
        if (s.cmd == Slot::QUIT) return;
        running() = &s;
        if (s.smem == nullptr) {
            s.block.error = "the module's __shared__ storage (its TLS block) was not found";
        } else {
            if (!s.started) {
                start_block(s, s.block.idx.x);
                s.started = true;
            }
            s.ran = round(s);
        }
        running() = nullptr;
        s.cmd = Slot::IDLE;
        s.cv.notify_all();
    }
}

inline void command(Slot& s, decltype(Slot::cmd) c) {
    std::unique_lock<std::mutex> lock(s.m);
    s.cmd = c;
    s.cv.notify_all();
    if (c == Slot::ROUND) s.cv.wait(lock, [&] { return s.cmd == Slot::IDLE; });
}

// Reused across launches: each slot's coroutine stacks.
inline std::unique_ptr<char[]>& stack_pool(int slot, size_t bytes) {
    static std::unique_ptr<char[]> pool[2];
    static size_t size[2] = {0, 0};
    if (size[slot] < bytes) {
        pool[slot].reset(new char[bytes]);
        size[slot] = bytes;
    }
    return pool[slot];
}

// Runs `body` for every thread of every block; returns "" or the first failure.
inline std::string run(dim3e grid, unsigned threads, const std::function<void()>& body) {
    if (threads == 0 || threads % 32 != 0 || threads > 1024) return "block size must be a multiple of 32, at most 1024";
    const unsigned long blocks = (unsigned long)grid.x * grid.y * grid.z;
    if (blocks == 0) return "";
    LaunchState& ls = launch_state();
    ls.grid = grid;
    ls.block_dim = {threads, 1, 1};
    ls.body = &body;
    const int nslots = blocks > 1 ? 2 : 1;
    Slot slots[2];
    for (int i = 0; i < nslots; ++i) {
        slots[i].stacks = stack_pool(i, (size_t)threads * STACK_BYTES).get();
        slots[i].worker = std::thread(worker, std::ref(slots[i]));
    }
    unsigned long next = 0;
    std::string error;
    for (bool active = true; active && error.empty();) {
        active = false;
        for (int i = 0; i < nslots; ++i)  // an idle slot takes the next block
            if (!slots[i].has_block && next < blocks) {
                slots[i].has_block = true;
                slots[i].started = false;
                slots[i].block.idx = {(unsigned)next++, 0, 0};  // the linear index until it starts
            }
        for (int i = nslots - 1; i >= 0 && error.empty(); --i) {  // the later block first
            Slot& s = slots[i];
            if (!s.has_block) continue;
            active = true;
            command(s, Slot::ROUND);
            const Block& b = s.block;
            std::string why = b.error;
            if (why.empty() && b.live > 0 && !s.ran) why = "deadlock: threads wait at a barrier others never reach";
            if (!why.empty())
                error = why + " (block " + std::to_string(b.idx.x) + "," + std::to_string(b.idx.y) + "," +
                        std::to_string(b.idx.z) + ")";
            else if (b.live == 0)
                s.has_block = false;
        }
    }
    for (int i = 0; i < nslots; ++i) {
        command(slots[i], Slot::QUIT);
        slots[i].worker.join();
    }
    return error;
}

}  // namespace emu

#define threadIdx (emu::me().tid)
#define blockIdx (emu::block()->idx)
#define blockDim (emu::launch_state().block_dim)
#define gridDim (emu::launch_state().grid)

// Every pointer cast checks that the address suits the type it casts to (CUDA faults on a
// misaligned access; every cast in the kernels is dereferenced where it is made).
template <typename To, typename From> inline To emu_reinterpret_cast(From p) {
    static_assert(!std::is_reference<To>::value, "the emulator checks pointer casts only");
    if constexpr (std::is_pointer<To>::value && std::is_pointer<From>::value) {
        using P = typename std::remove_cv<typename std::remove_pointer<To>::type>::type;
        if constexpr (!std::is_void<P>::value)
            emu::check_aligned(reinterpret_cast<const void*>(p), alignof(P), "a pointer cast to an aligned type");
    }
    return reinterpret_cast<To>(p);
}
#define reinterpret_cast emu_reinterpret_cast
