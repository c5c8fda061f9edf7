// moe.cu: the MoE layer's routing and data movement on the GPU (Switch Transformer /
// Mixtral / GShard): router logits + softmax + top-k, capacity positions, dispatch of token
// rows into per-expert slots and the weighted combine of expert outputs.
//
// moe_route_f32: one warp per token; logits = hidden·W_gate + bias (lanes over experts), softmax in
//   f32, k rounds of warp argmax (ties to the lower expert index, NaN before every probability,
//   as the CPU's sort), weights renormalised over the chosen k or raw.
// moe_capacity_f32: one thread per assignment (token·k + rank); its position in its expert's
//   queue = the assignments to that expert ahead of it, by (token, rank) order (policy 0,
//   `order`), by probability (NaN first), ties to the lower token (policy 1, `score`), or by (rank,
//   token) order (policy 2, `gshard`: every first choice before any second choice). O(n²)
//   over tiles in shared memory: a plain reference-grade kernel. Kept when position <
//   capacity; else position −1.
// moe_dispatch_*: copies each kept assignment's token row to expert slot (expert, position).
// moe_combine_*: out[t] = Σ_rank weight · expert_out[expert, position] over kept assignments.

constexpr int ROUTE_WARPS = 4;
constexpr int MAX_EXPERTS = 256;
// A taken expert's mark in the router's probability row: below every rank_key.
constexpr float TAKEN = -2.0f;

// A probability as selection ranks it (the CPU's `decision::higher_first`): itself, or 2
// (before every probability, as torch.topk ranks NaN) for a NaN whatever its sign bit.
__device__ __forceinline__ float rank_key(float p) { return p != p ? 2.0f : p; }

extern "C" __global__ void moe_route_f32(const float* __restrict__ hidden, const float* __restrict__ gate,
                                         const float* __restrict__ bias, float* __restrict__ probs,
                                         int* __restrict__ experts, float* __restrict__ gate_probs,
                                         float* __restrict__ weights, int tokens, int dm, int n_experts,
                                         int k, int renormalize) {
    __shared__ float p[ROUTE_WARPS][MAX_EXPERTS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x * ROUTE_WARPS + warp;
    if (t >= tokens) return;
    // logits = x·W_gate + bias, W_gate [d_model, experts]: lane e reads row c coalesced.
    const float* x = hidden + (size_t)t * dm;
    float acc[MAX_EXPERTS / 32];
#pragma unroll
    for (int i = 0; i < MAX_EXPERTS / 32; ++i) acc[i] = 0.0f;
    for (int c = 0; c < dm; ++c) {
        const float xc = x[c];
        const float* g = gate + (size_t)c * n_experts;
#pragma unroll
        for (int i = 0; i < MAX_EXPERTS / 32; ++i) {
            const int e = lane + 32 * i;
            if (e < n_experts) acc[i] += xc * g[e];
        }
    }
#pragma unroll
    for (int i = 0; i < MAX_EXPERTS / 32; ++i) {
        const int e = lane + 32 * i;
        if (e < n_experts) p[warp][e] = acc[i] + bias[e];
    }
    __syncwarp();
    float mx = -CUDART_INF_F;
    for (int e = lane; e < n_experts; e += 32) mx = fmaxf(mx, p[warp][e]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < n_experts; e += 32) sum += exp_neg(p[warp][e] - mx);
    sum = warp_sum(sum);
    __syncwarp();
    for (int e = lane; e < n_experts; e += 32) {
        const float pe = exp_neg(p[warp][e] - mx) / sum;
        p[warp][e] = pe;
        probs[(size_t)t * n_experts + e] = pe;
    }
    __syncwarp();
    // k rounds of warp argmax over rank_key: a NaN probability (any NaN or infinite logit
    // makes the whole row NaN) ranks before every probability and a taken expert after
    // everything, so every round names an untaken expert in range (k <= n_experts), as the
    // CPU's `higher_first` selection does.
    float chosen_sum = 0.0f;
    for (int r = 0; r < k; ++r) {
        float best = -3.0f;
        int arg = n_experts;
        for (int e = lane; e < n_experts; e += 32) {
            const float v = rank_key(p[warp][e]);
            if (v > best || (v == best && e < arg)) { best = v; arg = e; }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, best, o);
            const int a2 = __shfl_xor_sync(0xffffffffu, arg, o);
            if (v2 > best || (v2 == best && a2 < arg)) { best = v2; arg = a2; }
        }
        const float chosen = p[warp][arg];
        __syncwarp();
        if (lane == 0) {
            experts[t * k + r] = arg;
            gate_probs[t * k + r] = chosen;
            p[warp][arg] = TAKEN;
        }
        chosen_sum += chosen;
        __syncwarp();
    }
    if (lane < k) {
        const float g = gate_probs[t * k + lane];
        weights[t * k + lane] = renormalize ? g / chosen_sum : g;
    }
}

constexpr int CAP_TILE = 256;

extern "C" __global__ void moe_capacity_f32(const int* __restrict__ experts, const float* __restrict__ gate_probs,
                                            int* __restrict__ positions, int n, int k, int capacity,
                                            int policy) {
    __shared__ int te[CAP_TILE];
    __shared__ float tp[CAP_TILE];
    const int a = blockIdx.x * blockDim.x + threadIdx.x;
    const int ea = a < n ? experts[a] : -1;
    const float pa = a < n ? gate_probs[a] : 0.0f;
    const int ta = a / k;
    int ahead = 0;
    for (int base = 0; base < n; base += CAP_TILE) {
        __syncthreads();
        for (int i = threadIdx.x; i < CAP_TILE; i += blockDim.x) {
            const int b = base + i;
            te[i] = b < n ? experts[b] : -1;
            tp[i] = b < n ? gate_probs[b] : 0.0f;
        }
        __syncthreads();
        const int lim = min(CAP_TILE, n - base);
        for (int i = 0; i < lim; ++i) {
            if (te[i] != ea) continue;
            const int b = base + i;
            bool before;
            if (policy == 1) {
                const float kb = rank_key(tp[i]), ka = rank_key(pa);
                before = kb > ka || (kb == ka && b / k < ta);
            }
            else if (policy == 2) before = b % k < a % k || (b % k == a % k && b / k < ta);
            else before = b < a;
            ahead += before;
        }
    }
    if (a < n) positions[a] = ahead < capacity ? ahead : -1;
}

template <typename T>
__device__ void moe_dispatch(const T* __restrict__ x, const int* __restrict__ experts,
                             const int* __restrict__ positions, T* __restrict__ slots, int k,
                             int dm, int capacity) {
    const int a = blockIdx.x;
    const int pos = positions[a];
    if (pos < 0) return;
    const T* src = x + (size_t)(a / k) * dm;
    T* dst = slots + ((size_t)experts[a] * capacity + pos) * dm;
    for (int c = threadIdx.x; c < dm; c += blockDim.x) dst[c] = src[c];
}

template <typename T>
__device__ void moe_combine(const T* __restrict__ expert_out, const int* __restrict__ experts,
                            const int* __restrict__ positions, const float* __restrict__ weights,
                            T* __restrict__ out, int k, int dm, int capacity) {
    const int t = blockIdx.x;
    for (int c = threadIdx.x; c < dm; c += blockDim.x) {
        float acc = 0.0f;
        for (int r = 0; r < k; ++r) {
            const int a = t * k + r;
            const int pos = positions[a];
            if (pos < 0) continue;
            acc += weights[a] * to_f32(expert_out[((size_t)experts[a] * capacity + pos) * dm + c]);
        }
        out[(size_t)t * dm + c] = from_f32<T>(acc);
    }
}

#define MOE_ENTRIES(T, NAME)                                                                     \
    extern "C" __global__ void moe_dispatch_##NAME(const T* x, const int* experts,             \
                                                   const int* positions, T* slots, int k,      \
                                                   int dm, int capacity) {                     \
        moe_dispatch<T>(x, experts, positions, slots, k, dm, capacity);                        \
    }                                                                                          \
    extern "C" __global__ void moe_combine_##NAME(const T* expert_out, const int* experts,     \
                                                  const int* positions, const float* weights,  \
                                                  T* out, int k, int dm, int capacity) {       \
        moe_combine<T>(expert_out, experts, positions, weights, out, k, dm, capacity);         \
    }
MOE_ENTRIES(float, f32)
MOE_ENTRIES(__half, f16)
MOE_ENTRIES(bf16, bf16)
