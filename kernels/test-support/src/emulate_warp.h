// emulate_warp.h (after emulate.h): the warp collectives (shuffles, __syncwarp, the m16n8k16
// MMA from its PTX ISA fragment layout, ldmatrix), cp.async, and the host entry.
//
// ldmatrix: every row address must be 16-byte aligned and in shared memory. cp.async: the
// destination must be 16-byte aligned shared memory, the source 16-byte aligned and not shared
// memory. A copy joins its thread's open group; cp_async_commit closes the group;
// cp_async_wait<N> lands every group but the newest N. From issue until it lands, the
// destination holds the 0xff poison (on a GPU it is undefined: old bytes, new bytes or a mix),
// so reading it before the wait, or refilling a buffer another warp still reads, shows. The
// source is read at issue. A thread that returns with copies not landed fails the launch.
#pragma once

namespace emu {

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
    sync_warp(0xffffffffu, "mma.sync");
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
    sync_warp(0xffffffffu, "mma.sync");  // nobody overwrites the fragments before every lane read them
}

// ldmatrix.x4: lane t names row t % 8 of matrix t / 8 (16-bit elements, 8 per row).
inline void ldmatrix(u32* r, const void* my_row, bool trans) {
    check_aligned(my_row, 16, "an ldmatrix row address");
    if (!in_shared(my_row)) fail("ldmatrix: row address " + hex((uintptr_t)my_row) + " is not in shared memory");
    Warp& w = my_warp();
    int l = lane();
    w.row[l] = my_row;
    sync_warp(0xffffffffu, "ldmatrix");
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
    sync_warp(0xffffffffu, "ldmatrix");
}

// cp.async.cg 16 bytes: `bytes` (0..16) read from `src` at issue, the rest zero; queued.
inline void cp_async(void* dst, const void* src, int bytes) {
    check_aligned(dst, 16, "a cp.async destination");
    check_aligned(src, 16, "a cp.async source");
    if (!in_shared(dst)) fail("cp.async: destination " + hex((uintptr_t)dst) + " is not in shared memory");
    if (in_shared(src)) fail("cp.async: source " + hex((uintptr_t)src) + " is in shared memory, not global");
    if (bytes < 0 || bytes > 16) fail("cp.async: source size " + std::to_string(bytes) + " is not in 0..16");
    CpCopy c;
    c.dst = static_cast<unsigned char*>(dst);
    std::memset(c.data, 0, 16);
    if (bytes) std::memcpy(c.data, src, (size_t)bytes);
    std::memset(dst, 0xff, 16);  // in flight: undefined until its group lands
    me().open.push_back(c);
}

inline void cp_async_commit() {
    Thread& t = me();
    t.groups.push_back(std::move(t.open));
    t.open.clear();
}

inline void cp_async_wait(int newest_pending) {
    Thread& t = me();
    while ((int)t.groups.size() > newest_pending) {
        for (const CpCopy& c : t.groups.front()) std::memcpy(c.dst, c.data, 16);
        t.groups.erase(t.groups.begin());
    }
}

// A shuffle: every lane of `mask` publishes `v` and reads lane `src`'s.
inline float shuffle(unsigned mask, float v, int src, const char* what) {
    Warp& w = my_warp();
    const int l = lane();
    if (src < 0 || src > 31) src = l;  // out of range: a lane keeps its own value
    if (!(mask >> src & 1u))
        fail(std::string(what) + ": lane " + std::to_string(l) + " reads lane " + std::to_string(src) +
             ", outside the mask " + hex(mask));
    w.slot[l] = v;  // the previous collective ended with every lane of the mask past its read
    sync_warp(mask, what);
    const float r = w.slot[src];
    sync_warp(mask, what);
    return r;
}

}  // namespace emu

inline void __syncthreads() { emu::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::sync_warp(mask, "__syncwarp"); }
inline float __shfl_xor_sync(unsigned mask, float v, int o) {
    return emu::shuffle(mask, v, emu::lane() ^ o, "__shfl_xor_sync");
}
inline int __shfl_xor_sync(unsigned mask, int v, int o) {
    float f;
    std::memcpy(&f, &v, 4);
    f = __shfl_xor_sync(mask, f, o);
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
