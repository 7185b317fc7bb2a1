"""numba kernels for the hot paths of `agentspec.allocator.AcceptanceModel` (optional: its numpy
code is the reference and the fallback; both give identical answers).

Why: scoring a draft and learning from it are ~20 small numpy calls each, whose fixed cost,
not their work, is the time; the policy does both for every candidate at every step. Here
each is one compiled loop over the draft's positions. Compiled on first use, cached on disk.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def _hazard(t, h, pt, ph, row, b, width, weight):
    c = row * width + b
    return (h[c] + weight * ph[b] / pt[b]) / (t[c] + weight)


@njit(cache=True)
def best_length(t, h, pt, ph, rows, m, n, bin_of, width, pad, weight, costs, rate):
    """(n, gain) of AcceptanceModel.plan: the draft length whose expected accepted tokens most
    exceed rate * costs[n]."""
    p, total = 1.0, 0.0
    best_n, best = 0, -rate * costs[0]
    for j in range(min(n, len(costs) - 1)):
        b = bin_of[min(m + j, len(bin_of) - 1)] + pad
        p *= _hazard(t, h, pt, ph, rows[j], b, width, weight)
        total += p
        gain = total - rate * costs[j + 1]
        if gain > best:
            best_n, best = j + 1, gain
    return best_n, best


@njit(cache=True)
def expected(t, h, pt, ph, rows, m, n, bin_of, width, pad, weight):
    """Expected accepted tokens of the first n draft tokens."""
    p, total = 1.0, 0.0
    for j in range(n):
        p *= _hazard(t, h, pt, ph, rows[j], bin_of[min(m + j, len(bin_of) - 1)] + pad, width,
                     weight)
        total += p
    return total


@njit(cache=True)
def observe(t, h, pt, ph, rows, m, reached, matched, bin_of, width, pad, spread, window):
    """AcceptanceModel.observe of one draft: counts spread around each reached position's bin,
    then bins past the window halved (each once)."""
    for halve in range(2):
        for j in range(reached):
            b = bin_of[min(m + j, len(bin_of) - 1)] + pad
            c = rows[j] * width + b
            for o in range(len(spread)):
                d = o - len(spread) // 2
                if halve == 0:
                    w = spread[o]
                    t[c + d] += w
                    pt[b + d] += w
                    if j < matched:
                        h[c + d] += w
                        ph[b + d] += w
                else:
                    if t[c + d] > window:
                        t[c + d] *= 0.5
                        h[c + d] *= 0.5
                    if pt[b + d] > window:
                        pt[b + d] *= 0.5
                        ph[b + d] *= 0.5
