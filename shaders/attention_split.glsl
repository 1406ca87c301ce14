// The split-KV part shared by the flash-attention kernels (attention.comp, attention_decode.comp):
// which KV positions a split covers (split_range), and the end of a workgroup (finish_rows): its BR
// query rows' unnormalised outputs O (shared qs[r * HD4 + e]) and softmax state (m, l) become the
// output rows.
//
// Without SPLIT, or when only one split of the KV range is active: out = O / l. With SPLIT and
// several active splits, every split writes O and (m, l) to scratch, then counts itself done on a
// per-(row block, KV head) atomic counter; the last one to finish merges all splits
// (out = sum_s e^(m_s-M) O_s / sum_s e^(m_s-M) l_s) and resets the counter to 0 for the next replay.
//
// The including kernel declares: WG, HD4, BR, NEG; buffers o (binding 4) and, with SPLIT, opart, ml,
// counter (bindings 5-7, coherent); push constants p.n_tokens, p.n_head, p.n_head_kv, p.n_splits,
// p.min_chunk; shared vec4 qs[BR * HD4] and float ps[BR * WG], red_max[BR * WG], red_sum[BR * WG],
// bool is_last.

// Split `split` of the row block starting at row0 covers positions [begin, end) of the n_kv in the
// cache (begin >= n_kv: an inactive split); chunk = max(roundup(ceil(n_kv / n_splits), block),
// min_chunk) positions per split; first = the first position any row of the block may see (its
// first row's sequence start when seq_len > 0).
struct SplitRange { uint chunk; uint begin; uint end; uint first; };

SplitRange split_range(const uint block, const uint split, const uint row0, const uint rows_here, const uint n_gqa,
                       const uint n_past, const uint n_kv, const uint seq_len) {
    SplitRange s;
    s.chunk = max(((n_kv + p.n_splits - 1) / p.n_splits + block - 1) / block * block, p.min_chunk);
    s.begin = split * s.chunk;
    const uint t_last = (row0 + rows_here - 1) / n_gqa;
    s.end = min(min(s.begin + s.chunk, n_kv), n_past + t_last + 1);
    s.first = seq_len > 0 ? (n_past + row0 / n_gqa) / seq_len * seq_len : 0;
    return s;
}

void finish_rows(const uint n_kv, const uint chunk, const uint split, const uint row0, const uint rows_here,
                 const uint kvh, const uint n_gqa, const uint orow[BR], const float m[BR], const float l[BR]) {
    const uint tid = gl_LocalInvocationID.x;
#ifdef SPLIT
    const uint n_active = min(p.n_splits, (n_kv + chunk - 1) / chunk);
    if (n_active > 1) {
        const uint n_out_rows = p.n_tokens * p.n_head;
        [[unroll]] for (uint r = 0; r < BR; ++r) {
            if (r < rows_here) {
                for (uint e = tid; e < HD4; e += WG)
                    opart[(split * n_out_rows + orow[r]) * HD4 + e] = qs[r * HD4 + e];
                if (tid == 0) ml[split * n_out_rows + orow[r]] = vec2(m[r], l[r]);
            }
        }
        // Publish the partials, then count this split done; the last split to finish merges them.
        memoryBarrierBuffer();
        barrier();
        const uint cidx = gl_WorkGroupID.x * p.n_head_kv + kvh;
        if (tid == 0) {
            const uint done = atomicAdd(counter[cidx], 1u);
            is_last = done == n_active - 1;
            if (is_last) counter[cidx] = 0u;   // every split has counted: ready for the next replay
        }
        barrier();
        if (!is_last) return;
        memoryBarrierBuffer();
        // Merge: thread sp < n_active (<= WG) takes split sp's (m, l) of each row; the weights
        // e^(m_s - M) go to ps, the denominators sum_s e^(m_s - M) l_s to red_sum (per subgroup).
        float mv[BR], lv[BR];
        [[unroll]] for (uint r = 0; r < BR; ++r) {
            mv[r] = NEG;
            lv[r] = 0.0;
            if (r < rows_here) {
                if (tid < n_active) {
                    const vec2 v = ml[tid * n_out_rows + orow[r]];
                    mv[r] = v.x;
                    lv[r] = v.y;
                }
                const float mx = subgroupMax(mv[r]);
                if (subgroupElect()) red_max[r * WG + gl_SubgroupID] = mx;
            }
        }
        barrier();
        [[unroll]] for (uint r = 0; r < BR; ++r) {
            if (r < rows_here) {
                float mx = NEG;
                for (uint sg = 0; sg < gl_NumSubgroups; ++sg) mx = max(mx, red_max[r * WG + sg]);
                const float w = tid < n_active ? exp(mv[r] - mx) : 0.0;
                ps[r * WG + tid] = w;
                const float sm = subgroupAdd(w * lv[r]);
                if (subgroupElect()) red_sum[r * WG + gl_SubgroupID] = sm;
            }
        }
        barrier();
        for (uint idx = tid; idx < rows_here * HD4; idx += WG) {
            const uint r = idx / HD4;
            const uint e = idx - r * HD4;
            const uint row = row0 + r;
            const uint t = row / n_gqa;
            const uint orw = t * p.n_head + kvh * n_gqa + (row - t * n_gqa);
            float denom = 0.0;
            for (uint sg = 0; sg < gl_NumSubgroups; ++sg) denom += red_sum[r * WG + sg];
            vec4 sum = vec4(0.0);
            uint sp = 0;
            for (; sp + 8 <= n_active; sp += 8) {   // 8 loads in flight
                vec4 a[8];
                [[unroll]] for (uint u = 0; u < 8; ++u) a[u] = opart[((sp + u) * n_out_rows + orw) * HD4 + e];
                [[unroll]] for (uint u = 0; u < 8; ++u) sum += ps[r * WG + sp + u] * a[u];
            }
            for (; sp < n_active; ++sp) sum += ps[r * WG + sp] * opart[(sp * n_out_rows + orw) * HD4 + e];
            o[orw * HD4 + e] = denom > 0.0 ? sum / denom : vec4(0.0);
        }
        return;
    }
#endif
    // a single (active) split: out = O / l
    [[unroll]] for (uint r = 0; r < BR; ++r) {
        if (r < rows_here) {
            for (uint e = tid; e < HD4; e += WG)
                o[orow[r] * HD4 + e] = l[r] > 0.0 ? qs[r * HD4 + e] / l[r] : vec4(0.0);
        }
    }
}
