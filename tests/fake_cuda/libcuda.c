/* libcuda.c: a stand-in for the CUDA driver library, for tests on machines without a GPU.
 * It implements the driver entry points cudarc calls on the workbench's path with host
 * memory (device pointers are host addresses) and runs kernels on the CPU emulator: every
 * library listed in $WORKBENCH_EMU_LIBS (built by kernel_test_support::emu) exports
 * emu_has/emu_run, and cuLaunchKernel hands the kernel's name, grid, block and argument array
 * to the one that has it. Events read the host clock. One device, "compute capability 9.0",
 * 132 SMs, a 50 MiB L2, no memory pools. It proves the host side (NVRTC, module loading,
 * argument packing, copies, the L2 flush of cold timings, event timing) end to end; its times
 * mean nothing. With $WORKBENCH_FAKE_CUDA_TRACE set to a path, it appends one line per
 * launch ("launch NAME"), memset ("memset BYTES") and device-to-device copy ("copy BYTES"),
 * so a test can see what the runtime queued, in order. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUevent, *CUmodule;

enum { OK = 0, INVALID_VALUE = 1, INVALID_DEVICE = 101, NOT_FOUND = 500, LAUNCH_FAILED = 719 };

typedef int (*has_fn)(const char *);
typedef int (*run_fn)(const char *, unsigned, unsigned, unsigned, unsigned, void **, char *, size_t);
struct emu_lib { has_fn has; run_fn run; };
static struct emu_lib libs[64];
static int n_libs = -1;

static void load_libs(void) {
    if (n_libs >= 0) return;
    n_libs = 0;
    const char *env = getenv("WORKBENCH_EMU_LIBS");
    if (!env) return;
    char *list = strdup(env), *save = NULL;
    for (char *p = strtok_r(list, ":", &save); p && n_libs < 64; p = strtok_r(NULL, ":", &save)) {
        void *h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
        if (!h) { fprintf(stderr, "fake libcuda: %s\n", dlerror()); continue; }
        libs[n_libs].has = (has_fn)dlsym(h, "emu_has");
        libs[n_libs].run = (run_fn)dlsym(h, "emu_run");
        if (libs[n_libs].has && libs[n_libs].run) n_libs++;
    }
    free(list);
}

struct function { char name[256]; struct emu_lib *lib; };

/* The trace file ($WORKBENCH_FAKE_CUDA_TRACE), opened at the first traced call; NULL when
 * the variable is unset. */
static FILE *trace_file(void) {
    static int opened = 0;
    static FILE *f = NULL;
    if (!opened) {
        opened = 1;
        const char *path = getenv("WORKBENCH_FAKE_CUDA_TRACE");
        if (path && *path) f = fopen(path, "a");
    }
    return f;
}

static void trace(const char *what, const char *name, size_t bytes) {
    FILE *f = trace_file();
    if (!f) return;
    if (name) fprintf(f, "%s %s\n", what, name);
    else fprintf(f, "%s %zu\n", what, bytes);
    fflush(f);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

CUresult cuInit(unsigned flags) { (void)flags; return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal != 0) return INVALID_DEVICE;
    *d = 0;
    return OK;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d;
    snprintf(name, (size_t)len, "workbench CPU emulator (fake libcuda)");
    return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    (void)d;
    switch (attr) {
    case 75: *v = 9; break;                  /* compute capability major */
    case 76: *v = 0; break;                  /* minor */
    case 16: *v = 132; break;                /* multiprocessors */
    case 38: *v = 50 << 20; break;           /* L2 bytes */
    case 1: *v = 1024; break;                /* max threads per block */
    case 8: *v = 48 << 10; break;            /* shared memory per block */
    case 97: *v = 227 << 10; break;          /* shared memory per block, opt-in */
    default: *v = 0;                         /* memory pools and the rest: unsupported */
    }
    return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { (void)d; *bytes = (size_t)16 << 30; return OK; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)0x1; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return OK; }
CUresult cuCtxSetCurrent(CUcontext c) { (void)c; return OK; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = (CUcontext)0x1; return OK; }
CUresult cuCtxSynchronize(void) { return OK; }
CUresult cuCtxGetStreamPriorityRange(int *lo, int *hi) { *lo = 0; *hi = 0; return OK; }
CUresult cuStreamCreate(CUstream *s, unsigned flags) { (void)flags; *s = malloc(1); return OK; }
CUresult cuStreamCreateWithPriority(CUstream *s, unsigned flags, int p) { (void)p; return cuStreamCreate(s, flags); }
CUresult cuStreamDestroy_v2(CUstream s) { free(s); return OK; }
CUresult cuStreamSynchronize(CUstream s) { (void)s; return OK; }
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned f) { (void)s; (void)e; (void)f; return OK; }
/* 256-byte aligned, as cuMemAlloc's allocations are, and poisoned with 0xff bytes (NaN in
 * f32, f16 and bf16): a kernel or a copy that reads device memory nobody wrote sees NaN, as
 * it would see garbage on a GPU, instead of whatever malloc left there. */
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    size_t rounded = ((n ? n : 1) + 255) / 256 * 256;
    void *m = aligned_alloc(256, rounded);
    if (!m) return 2; /* out of memory */
    memset(m, 0xff, rounded);
    *p = (CUdeviceptr)(uintptr_t)m;
    return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); return OK; }
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return cuMemAlloc_v2(p, n); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return cuMemFree_v2(p); }
CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total) { *free_b = (size_t)8 << 30; *total = (size_t)16 << 30; return OK; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { memcpy((void *)(uintptr_t)d, s, n); return OK; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { memcpy(d, (void *)(uintptr_t)s, n); return OK; }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
    trace("copy", NULL, n);
    memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n);
    return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) { (void)st; return cuMemcpyHtoD_v2(d, s, n); }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return cuMemcpyDtoH_v2(d, s, n); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return cuMemcpyDtoD_v2(d, s, n); }
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
    trace("memset", NULL, n);
    memset((void *)(uintptr_t)d, v, n);
    return OK;
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { (void)s; return cuMemsetD8_v2(d, v, n); }
CUresult cuModuleLoadData(CUmodule *m, const void *image) { *m = strdup((const char *)image); return OK; }
CUresult cuModuleUnload(CUmodule m) { free(m); return OK; }
CUresult cuModuleGetFunction(void **f, CUmodule m, const char *name) {
    char pattern[300];
    snprintf(pattern, sizeof pattern, ".entry %s(", name);
    if (!strstr((const char *)m, pattern)) return NOT_FOUND;
    load_libs();
    for (int i = 0; i < n_libs; ++i) {
        if (libs[i].has(name)) {
            struct function *fn = calloc(1, sizeof *fn);
            snprintf(fn->name, sizeof fn->name, "%s", name);
            fn->lib = &libs[i];
            *f = fn;
            return OK;
        }
    }
    fprintf(stderr, "fake libcuda: no emulator library has %s (WORKBENCH_EMU_LIBS)\n", name);
    return NOT_FOUND;
}
CUresult cuFuncGetAttribute(int *v, int a, void *f) { (void)a; (void)f; *v = 0; return OK; }
CUresult cuFuncSetAttribute(void *f, int a, int v) { (void)f; (void)a; (void)v; return OK; }
// Every kernel: 8 blocks per multiprocessor (what the plans assumed before they asked).
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, void *f, int threads,
                                                              size_t smem, unsigned flags) {
    (void)f; (void)threads; (void)smem; (void)flags;
    *n = 8;
    return OK;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned smem, CUstream s, void **params, void **extra) {
    (void)s; (void)extra;
    struct function *fn = f;
    if (by != 1 || bz != 1 || smem != 0) return INVALID_VALUE;
    trace("launch", fn->name, 0);
    char err[512] = {0};
    int rc = fn->lib->run(fn->name, gx, gy, gz, bx, params, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "fake libcuda: %s failed: %s\n", fn->name, err);
        return LAUNCH_FAILED;
    }
    return OK;
}
CUresult cuEventCreate(CUevent *e, unsigned flags) { (void)flags; *e = calloc(1, sizeof(double)); return OK; }
CUresult cuEventDestroy_v2(CUevent e) { free(e); return OK; }
CUresult cuEventRecord(CUevent e, CUstream s) { (void)s; *(double *)e = now_ms(); return OK; }
CUresult cuEventSynchronize(CUevent e) { (void)e; return OK; }
CUresult cuEventQuery(CUevent e) { (void)e; return OK; }
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { *ms = (float)(*(double *)b - *(double *)a); return OK; }
CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }
CUresult cuGetErrorName(CUresult e, const char **s) {
    *s = e == LAUNCH_FAILED ? "CUDA_ERROR_LAUNCH_FAILED" : e == NOT_FOUND ? "CUDA_ERROR_NOT_FOUND" : "CUDA_ERROR_FAKE";
    return OK;
}
CUresult cuGetErrorString(CUresult e, const char **s) { return cuGetErrorName(e, s); }
