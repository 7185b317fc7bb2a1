"""numba kernel for the policy's choice of one request's draft (`CostAware.drafts` in
agentspec.policy, whose Python code is the reference and the fallback; both draft alike).

Why: a step plans the copy, searches the frequency path, plans it, and may continue it
twice, each a search and a plan; as separate calls, their arguments, candidates and keys
cost the interpreter more than the kernels' own work. Here all of it is one call.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from agentspec._accept_nb import best_length
from agentspec._match_nb import frequent_candidate

_NO_IDS = np.zeros(0, dtype=np.int64)


@njit(cache=True)
def plan_request(s_runs, s_tail_keys, s_tail_pos, s_tail_len, s_head, s_prev, s_buf, s_open,
                 open_len, g_runs, g_tail_keys, g_tail_pos, g_tail_len, g_head, g_prev, g_buf,
                 with_g, context, pw, levels, mask, want, max_k, max_context, min_prob,
                 share_edges, evidence_edges, worth, found, found_tokens, session_text,
                 kind_tables, token_classes, t, h, kt, kh, pt, ph, bin_of, width, pad,
                 kind_shift, weight, bias, bits, with_ids, costs, copy_m, copy_rows, copy_ids,
                 rate, ratios, slots, gain, extensions, ids, rows):
    """CostAware.drafts for one request: the copy (copy_m: its context length, 0: none;
    copy_rows, copy_ids as its Candidate holds them) and the frequency path after `context`
    (`frequent_candidate`, the token before it in ids[0], its kinds by extension depth in
    kind_tables), each planned (`best_length`) at `rate` times a sent ratio (ratios[slots[i]]:
    the copy's at i = 1 if there is a path, else 0; the path's at i = 2 + its extensions, see
    policy._sent_keys); a candidate is sent where it gains more
    than `gain` (and than the one before). A path sent to its end (under max_k) is
    continued by the path after it, up to `extensions` times, and sent longer where that
    gains more; it is scored longer either way. The path lands in ids (the token before,
    then its tokens) and rows. Returns (sent: -1 none, 0 the copy, 1 the path; its length
    n; its gain; the path's length, 0: none; the path's context length m; the extensions
    in the draft sent; the path's length in the draft sent)."""
    has_copy = copy_m > 0
    length, m = frequent_candidate(
        s_runs, s_tail_keys, s_tail_pos, s_tail_len, s_head, s_prev, s_buf, s_open, open_len,
        g_runs, g_tail_keys, g_tail_pos, g_tail_len, g_head, g_prev, g_buf, with_g, context, pw,
        levels, mask, want, max_k, max_context, min_prob, share_edges, evidence_edges, worth,
        found, found_tokens, session_text, kind_tables[0], token_classes, ids[:1], rows[:0],
        ids, rows)
    sent, n, depth, sent_length = -1, 0, 0, 0
    if has_copy and len(copy_rows):
        c_n, c_gain = best_length(t, h, kt, kh, pt, ph, copy_rows, copy_m, len(copy_rows),
                                  bin_of, width, pad, kind_shift, weight, costs,
                                  rate * ratios[slots[1 if m else 0]], bias, copy_ids, bits)
        if c_gain > gain:
            sent, n, gain = 0, c_n, c_gain
    elif has_copy and 0.0 > gain:  # (an empty copy plans nothing and gains nothing)
        sent, n, gain = 0, 0, 0.0
    if not m:
        return sent, n, gain, 0, 0, 0, 0
    f_n, f_gain = best_length(t, h, kt, kh, pt, ph, rows[:length], m, length, bin_of, width,
                              pad, kind_shift, weight, costs, rate * ratios[slots[2]], bias,
                              ids[: length + 1] if with_ids else _NO_IDS, bits)
    if f_gain > gain:
        sent, n, gain, sent_length = 1, f_n, f_gain, length
    for d in range(extensions):
        if sent != 1 or n != length or n >= max_k:
            break
        # the path after the context and the path's tokens, as if the output had written them
        longer = np.empty(len(context) + length, dtype=np.int32)
        longer[: len(context)] = context
        longer[len(context):] = ids[1 : length + 1]
        more, _ = frequent_candidate(
            s_runs, s_tail_keys, s_tail_pos, s_tail_len, s_head, s_prev, s_buf, s_open,
            open_len, g_runs, g_tail_keys, g_tail_pos, g_tail_len, g_head, g_prev, g_buf,
            with_g, longer[-max_k:], pw, levels, mask, want, max_k - length, max_context, min_prob,
            share_edges, evidence_edges, worth, found, found_tokens, session_text,
            kind_tables[d + 1], token_classes, ids[: length + 1], rows[:length], ids, rows)
        if not more:
            break
        length += more
        e_n, e_gain = best_length(t, h, kt, kh, pt, ph, rows[:length], m, length, bin_of,
                                  width, pad, kind_shift, weight, costs,
                                  rate * ratios[slots[3 + d]], bias,
                                  ids[: length + 1] if with_ids else _NO_IDS, bits)
        if e_gain <= gain:
            break
        n, gain, depth, sent_length = e_n, e_gain, d + 1, length
    return sent, n, gain, length, m, depth, sent_length
