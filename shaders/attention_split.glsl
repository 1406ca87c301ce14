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
// SINKS (gpt-oss): each row's head has a logit that joins its softmax as one more key of value 0,
// once, where the row's output is formed (sink_norm): by the only active split, or by the merge of
// several (a sink per split would count it once per split).
//
// The including kernel declares: WG, HD4, BR, NEG; buffers o (binding 4) and, with SPLIT, opart, ml,
// counter (bindings 5-7, coherent), with SINKS sinks[n_head]; push constants p.n_tokens, p.n_head,
// p.n_head_kv, p.n_splits, p.min_chunk, p.window; shared vec4 qs[BR * HD4] and bool is_last.

// The first position the query at position `pos` may see: its sequence's start (seq_len > 0) or 0,
// and with a sliding window (p.window = W > 0) no earlier than pos - W + 1.
uint first_visible(const uint pos, const uint seq_len) {
    const uint lo = seq_len > 0 ? pos / seq_len * seq_len : 0;
    return p.window > 0 && pos + 1 > p.window ? max(lo, pos + 1 - p.window) : lo;
}

// The splits share the positions [base, n_kv), base = the first position the batch's first token
// may see (0 without a sliding window): a windowed layer's work does not grow with the context.
// Split `split` of the row block starting at row0 covers positions [begin, end) (begin >= n_kv: an
// inactive split); chunk = max(roundup(ceil((n_kv - base) / n_splits), block), min_chunk) positions
// per split; first = the first position any row of the block may see (that of its first row).
struct SplitRange { uint chunk; uint begin; uint end; uint first; uint base; };

SplitRange split_range(const uint block, const uint split, const uint row0, const uint rows_here, const uint n_gqa,
                       const uint n_past, const uint n_kv, const uint seq_len) {
    SplitRange s;
    s.base = p.window > 0 && n_past + 1 > p.window ? n_past + 1 - p.window : 0;
    s.chunk = max(((n_kv - s.base + p.n_splits - 1) / p.n_splits + block - 1) / block * block, p.min_chunk);
    s.begin = s.base + split * s.chunk;
    const uint t_last = (row0 + rows_here - 1) / n_gqa;
    s.end = min(min(s.begin + s.chunk, n_kv), n_past + t_last + 1);
    s.first = first_visible(n_past + row0 / n_gqa, seq_len);
    return s;
}

// The online-softmax step of the merge: split s's (m_s, l_s) and unnormalised O_s folded into the
// running (M, L, O): M' = max(M, m_s), L' = L e^(M - M') + l_s e^(m_s - M'), O' likewise. A split
// with no visible position (m_s = NEG) adds nothing.
void fold_split(inout float mx, inout float den, inout vec4 sum, const vec2 mls, const vec4 os, const bool live) {
    if (live && mls.x > 0.5 * NEG) {
        const float m2 = max(mx, mls.x);
        const float a = exp(mx - m2), b = exp(mls.x - m2);
        den = den * a + mls.y * b;
        sum = sum * a + os * b;
        mx = m2;
    }
}

#ifdef SINKS
// The output row orw (t * n_head + h) is O f from its unnormalised O and softmax state (m, l), the sink
// s of head h joined: M = max(m, s), f = e^(m-M) / (l e^(m-M) + e^(s-M)) (s not scaled like q.k:
// llama.cpp's soft_max / flash_attn_ext sinks). The denominator is at least 1: the term of M is e^0.
float sink_norm(const float m, const float l, const uint orw) {
    const float s = sinks[orw % p.n_head];
    const float mx = max(m, s);
    const float a = exp(m - mx);
    return a / (l * a + exp(s - mx));
}
#endif

// n_span: positions the splits share (n_kv - SplitRange.base).
void finish_rows(const uint n_span, const uint chunk, const uint split, const uint row0, const uint rows_here,
                 const uint kvh, const uint n_gqa, const uint orow[BR], const float m[BR], const float l[BR]) {
    const uint tid = gl_LocalInvocationID.x;
#ifdef SPLIT
    const uint n_active = min(p.n_splits, (n_span + chunk - 1) / chunk);
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
        // Merge: one thread per output element (row r, vec4 e) folds the splits in (fold_split), 4
        // at a time with their (m, l) and O loaded together (one round trip per 4 splits).
        for (uint idx = tid; idx < rows_here * HD4; idx += WG) {
            const uint r = idx / HD4;
            const uint e = idx - r * HD4;
            const uint row = row0 + r;
            const uint t = row / n_gqa;
            const uint orw = t * p.n_head + kvh * n_gqa + (row - t * n_gqa);
            float mx = NEG, den = 0.0;
            vec4 sum = vec4(0.0);
            for (uint sp = 0; sp < n_active; sp += 4) {
                // 4 in flight: 8 (named or in an array) measured no faster on an H100
                const uint s1 = min(sp + 1, n_active - 1), s2 = min(sp + 2, n_active - 1), s3 = min(sp + 3, n_active - 1);
                const vec2 ml0 = ml[sp * n_out_rows + orw], ml1 = ml[s1 * n_out_rows + orw];
                const vec2 ml2 = ml[s2 * n_out_rows + orw], ml3 = ml[s3 * n_out_rows + orw];
                const vec4 o0 = opart[(sp * n_out_rows + orw) * HD4 + e], o1 = opart[(s1 * n_out_rows + orw) * HD4 + e];
                const vec4 o2 = opart[(s2 * n_out_rows + orw) * HD4 + e], o3 = opart[(s3 * n_out_rows + orw) * HD4 + e];
                fold_split(mx, den, sum, ml0, o0, true);
                fold_split(mx, den, sum, ml1, o1, sp + 1 < n_active);
                fold_split(mx, den, sum, ml2, o2, sp + 2 < n_active);
                fold_split(mx, den, sum, ml3, o3, sp + 3 < n_active);
            }
#ifdef SINKS
            o[orw * HD4 + e] = sum * sink_norm(mx, den, orw);
#else
            o[orw * HD4 + e] = den > 0.0 ? sum / den : vec4(0.0);
#endif
        }
        return;
    }
#endif
    // a single (active) split: out = O / l
    [[unroll]] for (uint r = 0; r < BR; ++r) {
        if (r < rows_here) {
#ifdef SINKS
            const float f = sink_norm(m[r], l[r], orow[r]);
            for (uint e = tid; e < HD4; e += WG) o[orow[r] * HD4 + e] = qs[r * HD4 + e] * f;
#else
            for (uint e = tid; e < HD4; e += WG)
                o[orow[r] * HD4 + e] = l[r] > 0.0 ? qs[r * HD4 + e] / l[r] : vec4(0.0);
#endif
        }
    }
}
