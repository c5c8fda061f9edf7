// spec.cu: tree attention for speculative verification (SpecInfer / Medusa tree masks) over
// a paged pool [num_blocks, kv_heads, block_size, d]. The committed context is positions
// 0..ctx of the block table; tree node j has its K/V at position ctx + j. Query r (node
// nodes[r]) attends to the whole context and to the tree nodes its mask row admits
// (ancestors and itself; mask u8 [n_tree, n_tree]). Positions are RoPE's: context key j at
// j, node a at ctx + depth[a]; with window > 0 the query at p = ctx + depth[node] sees a key
// at position j iff p − j < window (the context walk starts at p + 1 − window). softcap > 0:
// scores become softcap · tanh(scale · q·k / softcap) (Gemma-2).
//
// tree_attention_f32: one warp per (query node, query head); lanes split head_dim (≤ 128,
// up to 4 elements per lane), warp-sum dot products, one online softmax over the context
// then the admitted nodes. q/out [n_queries, q_heads, d].

extern "C" __global__ void tree_attention_f32(const float* __restrict__ q, const float* __restrict__ kp,
                                              const float* __restrict__ vp, const int* __restrict__ table,
                                              const unsigned char* __restrict__ mask,
                                              const int* __restrict__ nodes,
                                              const int* __restrict__ depths, float* __restrict__ out,
                                              int n_queries, int n_tree, int ctx, int hq, int hkv,
                                              int d, int bs, float scale, int window, float softcap) {
    const int task = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (task >= n_queries * hq) return;
    const int r = task / hq, head = task % hq, h = head / (hq / hkv);
    const int node = nodes[r];
    const float* qr = q + (size_t)task * d;
    float qv[4], acc[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int e = c * 32 + lane;
        qv[c] = e < d ? qr[e] : 0.0f;
        acc[c] = 0.0f;
    }
    float m = -CUDART_INF_F, l = 0.0f;
    const int total = ctx + n_tree;
    const int depth = depths[node];
    const int first = window > 0 ? max(0, ctx + depth + 1 - window) : 0;
    for (int pos = min(first, ctx); pos < total; ++pos) {
        if (pos >= ctx) {
            const int j = pos - ctx;
            if (!mask[(size_t)node * n_tree + j]) continue;
            if (window > 0 && depth - depths[j] >= window) continue;
        }
        const size_t at = (((size_t)table[pos / bs] * hkv + h) * bs + (pos % bs)) * d;
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int e = c * 32 + lane;
            if (e < d) s += qv[c] * kp[at + e];
        }
        s = warp_sum(s) * scale;
        if (softcap > 0.0f) s = softcap * tanh_f32(s / softcap);
        const float mnew = fmaxf(m, s);
        const float corr = exp_neg(m - mnew);
        const float p = exp_neg(s - mnew);
        l = l * corr + p;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int e = c * 32 + lane;
            acc[c] = acc[c] * corr + (e < d ? p * vp[at + e] : 0.0f);
        }
        m = mnew;
    }
    const float inv = 1.0f / l;  // the context or the node itself is always admitted
    float* o = out + (size_t)task * d;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int e = c * 32 + lane;
        if (e < d) o[e] = acc[c] * inv;
    }
}
