"""numba kernels for the hot paths of `agentspec.allocator.AcceptanceModel` (optional: its numpy
code is the reference and the fallback; both give identical answers).

Why: scoring a draft and learning from it are ~20 small numpy calls each, whose fixed cost,
not their work, is the time; the policy does both for every candidate at every step. Here
each is one compiled loop over the draft's positions. Compiled on first use, cached on disk.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_MIX = np.uint64(0x9E3779B97F4A7C15)  # (allocator.token_keys hashes pairs the same way)


@njit(cache=True)
def _hazard(t, h, kt, kh, pt, ph, row, b, width, kind_shift, weight):
    """The row's hazard at bin b, shrunk toward its kind's, itself shrunk toward the pool."""
    k = (row >> kind_shift) * width + b
    kind = (kh[k] + weight * ph[b] / pt[b]) / (kt[k] + weight)
    c = row * width + b
    return (h[c] + weight * kind) / (t[c] + weight)


@njit(cache=True)
def _token_key(ids, j, which, bits, kind):
    """allocator.token_keys of draft token j (`ids` holds the token before the draft first)
    of kind `kind`: which = 0 its id, 1 the id before it, 2 the pair, 3 the id with its
    kind."""
    mask = (1 << bits) - 1
    if which == 0:
        return ids[j + 1] & mask
    if which == 1:
        return (ids[j] & mask) + (1 << bits)
    first = ids[j] if which == 2 else kind
    pair = ((np.uint64(first) << np.uint64(20)) + np.uint64(ids[j + 1])) * _MIX
    return np.int64(pair >> np.uint64(64 - bits)) + (which << bits)


@njit(cache=True)
def _with_offset(hz, bias, ids, j, bits, kind):
    """The hazard with draft token j's logit offset (none when `ids` is empty)."""
    if len(ids) == 0:
        return hz
    z = 0.0
    for which in range(4):
        z += bias[0, _token_key(ids, j, which, bits, kind)]
    if z == 0.0:
        return hz
    hz = min(max(hz, 1e-6), 1.0 - 1e-6)  # (allocator.with_offset clips the same)
    return 1.0 / (1.0 + (1.0 - hz) / hz * np.exp(-z))


@njit(cache=True)
def position_hazard(t, h, kt, kh, pt, ph, rows, m, j, bin_of, width, pad, kind_shift, weight,
                    bias, ids, bits):
    """Draft token j's own hazard after a match of length m, its offsets included."""
    b = bin_of[min(m + j, len(bin_of) - 1)] + pad
    hz = _hazard(t, h, kt, kh, pt, ph, rows[j], b, width, kind_shift, weight)
    return _with_offset(hz, bias, ids, j, bits, rows[j] >> kind_shift)


@njit(cache=True)
def _logit(p):
    p = min(max(p, 1e-6), 1.0 - 1e-6)  # (allocator.logit clips the same)
    return np.log(p / (1.0 - p))


@njit(cache=True)
def blended(weights, copy_hazard, path_hazard):
    """allocator.blended: the hazard of a token a copy and a path both say."""
    z = weights[0] + weights[1] * _logit(copy_hazard) + weights[2] * _logit(path_hazard)
    return 1.0 / (1.0 + np.exp(-z))


@njit(cache=True)
def best_length(t, h, kt, kh, pt, ph, rows, m, n, bin_of, width, pad, kind_shift, weight, costs,
                rate, bias, ids, bits, agreed):
    """(n, gain) of AcceptanceModel.plan: the draft length whose expected accepted tokens most
    exceed rate * costs[n] (the first tokens' hazards `agreed`, where given). It stops
    reading the draft where no longer one can gain more."""
    p, total = 1.0, 0.0
    best_n, best = 0, -rate * costs[0]
    for j in range(min(n, len(costs) - 1)):
        p *= agreed[j] if j < len(agreed) else position_hazard(
            t, h, kt, kh, pt, ph, rows, m, j, bin_of, width, pad, kind_shift, weight, bias, ids,
            bits)
        total += p
        gain = total - rate * costs[j + 1]
        if gain > best:
            best_n, best = j + 1, gain
        if _priced_out(costs, j + 1, p / rate):
            break
    return best_n, best


@njit(cache=True)
def _priced_out(costs, a, p):
    """Whether tokens after the a-th, each accepted with probability at most p (a draft's
    are no likelier than the one before), cost more than they add at every longer length.
    (The first length is the usual answer: the loop ends at once while drafts still pay.)"""
    for i in range(a + 1, len(costs)):
        if costs[i] - costs[a] <= p * (i - a):
            return False
    return True


@njit(cache=True)
def expected(t, h, kt, kh, pt, ph, rows, m, n, bin_of, width, pad, kind_shift, weight, bias, ids,
             bits, agreed):
    """Expected accepted tokens of the first n draft tokens."""
    p, total = 1.0, 0.0
    for j in range(n):
        p *= agreed[j] if j < len(agreed) else position_hazard(
            t, h, kt, kh, pt, ph, rows, m, j, bin_of, width, pad, kind_shift, weight, bias, ids,
            bits)
        total += p
    return total


@njit(cache=True)
def learn_blend(t, h, kt, kh, pt, ph, bin_of, width, pad, kind_shift, weight, bias, bits, blend,
                blend_rate, copy_m, copy_rows, copy_ids, path_m, path_rows, path_ids, n,
                matched):
    """AcceptanceModel.learn_blend: the first n tokens both candidates said, of which the
    first `matched` were right, each reached one a step of the blend, in order."""
    for j in range(min(n, matched + 1)):
        copy_hazard = position_hazard(t, h, kt, kh, pt, ph, copy_rows, copy_m, j, bin_of, width,
                                      pad, kind_shift, weight, bias, copy_ids, bits)
        path_hazard = position_hazard(t, h, kt, kh, pt, ph, path_rows, path_m, j, bin_of, width,
                                      pad, kind_shift, weight, bias, path_ids, bits)
        error = (1.0 if j < matched else 0.0) - blended(blend[0], copy_hazard, path_hazard)
        for w in range(3):
            x = 1.0 if w == 0 else _logit(copy_hazard if w == 1 else path_hazard)
            blend[1, w] += (error * x) ** 2
            blend[0, w] += blend_rate * error * x / np.sqrt(1.0 + blend[1, w])


@njit(cache=True)
def _add(t, h, c, w, hit):
    t[c] += w
    if hit:
        h[c] += w


@njit(cache=True)
def _halve(t, h, c, window):
    if t[c] > window:
        t[c] *= 0.5
        h[c] *= 0.5


@njit(cache=True)
def observe(t, h, kt, kh, pt, ph, rows, m, reached, matched, bin_of, width, pad, kind_shift,
            spread, window, weight, bias, ids, bits, bias_rate):
    """AcceptanceModel.observe of one draft: each reached position's logit offsets take a step
    toward its outcome (with the hazards before this draft), then counts spread around each
    reached position's bin (in the row's, the kind's and the pooled table), then bins past
    the window halved (each once)."""
    if len(ids):
        for j in range(reached):
            kind = rows[j] >> kind_shift
            error = (1.0 if j < matched else 0.0) - position_hazard(
                t, h, kt, kh, pt, ph, rows, m, j, bin_of, width, pad, kind_shift, weight, bias,
                ids, bits)
            for which in range(4):  # (AdaGrad: see allocator.BIAS_RATE)
                key = _token_key(ids, j, which, bits, kind)
                bias[1, key] += error * error
                bias[0, key] += bias_rate * error / np.sqrt(1.0 + bias[1, key])
    for halve in range(2):
        for j in range(reached):
            b = bin_of[min(m + j, len(bin_of) - 1)] + pad
            c = rows[j] * width + b
            k = (rows[j] >> kind_shift) * width + b
            for o in range(len(spread)):
                d = o - len(spread) // 2
                if halve == 0:
                    w, hit = spread[o], j < matched
                    _add(t, h, c + d, w, hit)
                    _add(kt, kh, k + d, w, hit)
                    _add(pt, ph, b + d, w, hit)
                else:
                    _halve(t, h, c + d, window)
                    _halve(kt, kh, k + d, window)
                    _halve(pt, ph, b + d, window)
