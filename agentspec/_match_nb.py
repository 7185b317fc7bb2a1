"""numba kernels for the hot paths of `agentspec.match` (optional: the numpy code there is
the reference and the fallback; both give identical answers).

Why: a numpy `Corpus.match` is ~50 small numpy calls whose fixed cost (~1 us each), not
their work, is the time.  Here a lookup is one compiled call with plain loops (hash the
context, walk the levels, verify candidates newest first, vote), and indexing a few new
tokens is another.  Kernels compile on first use and are cached on disk (cache=True), so
only the first process after an install or an edit pays the compile time.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_NEVER = -2  # what a context id that cannot be a token becomes (as in match.py)
BLOCK = 64  # candidates (or tail entries) looked at per pass
# a large tail chains each level's entries by key: head[level, key & CHAIN_MASK] is the
# newest entry of that bucket, prev[level, entry] the one before it (-1: none)
CHAIN_BUCKETS = 1 << 14
CHAIN_MASK = CHAIN_BUCKETS - 1

# A corpus as the kernels read it, one tuple (passed in as one argument; a typed list in it
# would be unboxed by way of Python on every call):
#   (keys, dirs, lows, positions, runs, tail_keys, tail_pos, tail_len, head, prev, buf)
# The sorted runs lie in the first four arrays: runs[level, r] = (key start, directory start
# (-1: plain keys), position start, entries) locates run r of a level, oldest run first. A
# run keeps plain keys (keys[start : start + entries]) or a directory on the high 16 bits
# (dirs[d : d + 2**16 + 1]) with low halves (lows[start : start + entries]); its positions
# are positions[p : p + entries]. The tail and its chains are as `index_tail` keeps them.
TAIL_LEN, BUF = 7, 10  # where a corpus tuple holds the tail's length and the token buffer


@njit(cache=True)
def _hash(s, end, q, pw):
    """sum_{i<q} s[end-1-i] * B**(i+1) mod 2**64 (the window is cut at the start of s)."""
    h = np.uint64(0)
    for i in range(min(q, end)):
        h += np.uint64(np.int64(s[end - 1 - i])) * pw[i + 1]  # -1 -> 2**64-1, as numpy casts
    return h


@njit(cache=True)
def _key_of(h, mask):
    """match._key of one hash: its high half."""
    return np.uint32(h >> np.uint64(32)) & mask


@njit(cache=True)
def _key(s, end, q, pw, mask):
    """match._key of the window of q tokens before `end` (`_hash`)."""
    return _key_of(_hash(s, end, q, pw), mask)


@njit(cache=True)
def _window_hashes(buf, x, pw, levels):
    """Per level (q tokens), the `_hash` of the window before x. `_roll` moves them on."""
    h = np.empty(len(levels), dtype=np.uint64)
    for l in range(len(levels)):
        h[l] = _hash(buf, x, levels[l], pw)
    return h


@njit(cache=True)
def _as_ids(context):
    """A lookup context as int32 ids, those that cannot be tokens (< 0) as _NEVER, never a
    token or a boundary. (One allocation: np.where, then astype, make three.)"""
    ctx = np.empty(len(context), dtype=np.int32)
    for j in range(len(context)):
        ctx[j] = context[j] if context[j] >= 0 else _NEVER
    return ctx


@njit(cache=True)
def _roll(h, buf, x, pw, levels):
    """Window hashes before x -> before x + 1: add buf[x], drop buf[x - q], all times B (one
    step per level, where computing each anew takes q: indexing a long text is ~7x faster)."""
    t = np.uint64(np.int64(buf[x]))
    for l in range(len(levels)):
        v = h[l] + t
        if x >= levels[l]:
            v -= np.uint64(np.int64(buf[x - levels[l]])) * pw[levels[l]]
        h[l] = v * pw[1]


@njit(cache=True)
def entry_keys(buf, a, b, pw, levels, mask):
    """Corpus._entries: positions e in [a, b) whose token is real, their keys (L, n)."""
    n = 0
    for x in range(a, b):
        n += buf[x] >= 0
    e = np.empty(n, dtype=np.int32)
    keys = np.empty((len(levels), n), dtype=np.uint32)
    h, j = _window_hashes(buf, a, pw, levels), 0
    for x in range(a, b):
        if buf[x] >= 0:
            e[j] = x
            for i in range(len(levels)):
                keys[i, j] = _key_of(h[i], mask)
            j += 1
        _roll(h, buf, x, pw, levels)
    return e, keys


@njit(cache=True)
def index_tail(buf, a, b, pw, levels, mask, tail_keys, tail_pos, t0, head, prev):
    """Corpus._to_tail: positions in [a, b) whose token is real, with their keys at every
    level, into the tail from t0 (and onto its chains, if it has them: head of shape
    (0, 0) when not); returns the tail's length."""
    t, h = t0, _window_hashes(buf, a, pw, levels)
    for x in range(a, b):
        if buf[x] >= 0:
            tail_pos[t] = x
            for i in range(len(levels)):
                k = _key_of(h[i], mask)
                tail_keys[i, t] = k
                if head.shape[0]:
                    _chain(head, prev, i, t, k)
            t += 1
        _roll(h, buf, x, pw, levels)
    return t


@njit(cache=True)
def link_tail(tail_keys, tail_len, head, prev):
    """Chain the tail's first tail_len entries, oldest first, onto an empty head (-1s)."""
    for t in range(tail_len):
        for i in range(tail_keys.shape[0]):
            _chain(head, prev, i, t, tail_keys[i, t])


@njit(cache=True)
def _chain(head, prev, i, t, key):
    """Tail entry t, of key `key` at level i, becomes the newest of its bucket's chain."""
    bucket = key & CHAIN_MASK
    prev[i, t] = head[i, bucket]
    head[i, bucket] = t


@njit(cache=True)
def lookup(corpus, context, pw, levels, first, mask, want, k, a, b):
    """Corpus.match once the context is int32 and long enough, after indexing buf[a:b] into
    the tail (`index_tail`; the tail has room for them): (m, chosen, candidates, agree,
    agreed, n, the tail's length), the continuation being buf[chosen : chosen + n]; m = 0:
    no match."""
    _, _, _, _, _, tail_keys, tail_pos, tail_len, head, prev, buf = corpus
    tail_len = index_tail(buf, a, b, pw, levels, mask, tail_keys, tail_pos, tail_len, head,
                          prev)
    corpus = with_tail(corpus, tail_len)
    ctx = _as_ids(context)
    L = len(ctx)
    top = 0
    while top + 1 < len(levels) and levels[top + 1] <= L:
        top += 1
    # from the shortest level up, until one has no occurrence: a context's last q tokens
    # occur only where its shorter suffixes do, and most lookups find none (or a short one)
    outs, ok = np.empty((2, want), dtype=np.int32), np.empty(BLOCK, dtype=np.bool_)
    best_m, best_n, best = 0, 0, 0
    for i in range(first, top + 1):  # (levels below `first` are frequency's only)
        q = levels[i]
        cap = levels[i + 1] - 1 if i < top else L
        at = 1 - best if best_n else 0
        if 0 < best_n < want:  # all of the level below's (see `frequent`): among them
            m, n = _among(buf, outs[best, :best_n], ctx, q, cap, outs[at])
        else:
            m, n = _find(corpus, i, _key(ctx, L, q, pw, mask), ctx, q, cap, outs[at], ok)
        if not n:
            break
        best_m, best_n, best = m, n, at
    if best_n:
        chosen, members, agreed, cont = _vote(buf, outs[best, :best_n], k)
        return best_m, chosen, best_n, members, agreed, cont, tail_len
    return 0, 0, 0, 0, 0, 0, tail_len


@njit(cache=True)
def with_tail(corpus, tail_len):
    """The corpus tuple once its tail holds tail_len entries."""
    keys, dirs, lows, pos, runs, tail_keys, tail_pos, _, head, prev, buf = corpus
    return keys, dirs, lows, pos, runs, tail_keys, tail_pos, tail_len, head, prev, buf


@njit(cache=True)
def _find(corpus, i, v, ctx, q, cap, out, ok):
    """Level i (length q), key v: the longest verified length m in [q, cap] of its
    occurrences and, in out[:n], the most recent len(out) of that length, most recent first
    (n = 0: none verifies). ok: room for a block's first checks (BLOCK).

    Occurrences are visited newest first (the tail backwards, along v's chain once it has
    them, then the runs newest to oldest, each slice backwards), so the first len(out) of
    the best length are the answer; once the best is cap and out is full, older ones cannot
    change it.  This is the numpy path's _occurrences + _recent / _scan."""
    keys, dirs, lows, pos, runs, tail_keys, tail_pos, tail_len, head, prev, buf = corpus
    want, L = len(out), len(ctx)
    best, n = q - 1, 0  # longest length so far (q-1: none yet); out[:n] have it
    if tail_len and head.shape[0]:  # the unsorted tail: v's entries, and its bucket's
        t = head[i, v & CHAIN_MASK]
        while t >= 0:
            if tail_keys[i, t] == v:
                best, n = _consider(buf, tail_pos[t], ctx, q, cap, out, best, n)
                if best == cap and n == want:
                    return best, n
            t = prev[i, t]
    elif tail_len:  # a small tail: all of it
        end = tail_len
        while end > 0:  # in blocks, newest first: a block without v is one SIMD pass
            start = max(0, end - BLOCK)
            block, hits = tail_keys[i, start:end], 0
            for j in range(len(block)):  # (this form vectorizes; range(start, end) does not)
                hits += block[j] == v
            for j in range(len(block) - 1 if hits else -1, -1, -1):
                if block[j] == v:
                    best, n = _consider(buf, tail_pos[start + j], ctx, q, cap, out, best, n)
                    if best == cap and n == want:
                        return best, n
            end = start
    for r in range(runs.shape[1] - 1, -1, -1):
        start, d, p, entries = runs[i, r, 0], runs[i, r, 1], runs[i, r, 2], runs[i, r, 3]
        # a, b: the entries of key v, as offsets into the run
        if d < 0:
            plain = keys[start : start + entries]
            a = np.searchsorted(plain, v)
            if a == entries or plain[a] != v:
                continue
            b = np.searchsorted(plain, v, side="right")
        else:  # directory on the high 16 bits, then the run's low halves
            lo = lows[start : start + entries]
            s, t = dirs[d + (v >> 16)], dirs[d + (v >> 16) + 1]
            low = np.uint16(v & 0xFFFF)
            a = s + np.searchsorted(lo[s:t], low)
            if a == t or lo[a] != low:
                continue
            b = s + np.searchsorted(lo[s:t], low, side="right")
        run_pos = pos[p : p + entries]
        while b > a:  # in blocks, newest first
            s = max(a, b - BLOCK)
            # first the one token each candidate needs to match, as independent loads the
            # CPU overlaps (a long slice of a big corpus is mostly cache misses); the length
            # needed only rises, so this stays a valid filter for the whole block
            t = _need(best, n, want, q)
            for j in range(b - s):
                ok[j] = buf[run_pos[s + j] - t] == ctx[L - t]
            for j in range(b - s - 1, -1, -1):
                if ok[j]:
                    best, n = _consider(buf, run_pos[s + j], ctx, q, cap, out, best, n)
                    if best == cap and n == want:
                        return best, n
            b = s
    return best, n


@njit(cache=True)
def _need(best, n, want, q):
    """The length a further (older) candidate needs to change (best, out[:n])."""
    return best + 1 if n == want else max(best, q)


@njit(cache=True)
def _consider(buf, e, ctx, q, cap, out, best, n):
    """Fold candidate e (older than every one before it) into (best, out[:n])."""
    t = _need(best, n, len(out), q)
    if buf[e - t] != ctx[len(ctx) - t]:  # one compare rules most out
        return best, n
    m = _length(buf, e, ctx, cap)
    if m < t:  # too short to matter (or a hash collision, or across a boundary)
        return best, n
    if m > best:
        out[0] = e
        return m, 1
    out[n] = e  # m == best and out is not full
    return best, n + 1


@njit(cache=True)
def _length(buf, e, ctx, cap):
    """Tokens before e that equal the context's last ones, up to cap."""
    L, j = len(ctx), 0
    while j < cap and buf[e - 1 - j] == ctx[L - 1 - j]:
        j += 1
    return j


@njit(cache=True)
def _vote(buf, e, k):
    """Corpus._vote over candidates e (most recent first): (chosen position, size of its
    group, agreed, continuation length)."""
    nc = len(e)
    # each candidate's next 3 tokens (the third counts only if the second is real), gathered
    # once: the pairwise compares below then stay in cache
    nxt = np.empty((nc, 3), dtype=np.int32)
    for a in range(nc):
        x = e[a]
        nxt[a, 0], nxt[a, 1] = buf[x], buf[x + 1]
        nxt[a, 2] = buf[x + 2] if buf[x + 1] >= 0 else -1
    # group[b]: the most recent candidate with b's next 3 tokens (pairwise compares are
    # cheap for max_candidates-sized lists)
    group = np.full(nc, -1, dtype=np.int64)
    best, best_size = 0, 0
    for a in range(nc):
        if group[a] >= 0:
            continue
        size = 0
        for b in range(a, nc):
            if group[b] < 0 and nxt[b, 0] == nxt[a, 0] and nxt[b, 1] == nxt[a, 1] and \
                    nxt[b, 2] == nxt[a, 2]:
                group[b] = a
                size += 1
        if size > best_size:  # strictly larger: a tie stays with the more recent group
            best, best_size = a, size
    chosen = e[best]
    n = 0
    while n < k and chosen + n < len(buf) and buf[chosen + n] >= 0:
        n += 1
    agreed = n
    for b in range(best + 1, nc):
        if group[b] == best:
            y, j = e[b], 0
            while j < agreed and y + j < len(buf) and buf[y + j] == buf[chosen + j]:
                j += 1
            agreed = j
    return chosen, best_size, agreed, n



@njit(cache=True)
def frequent(s, s_open, open_len, g, with_g, context, pw, levels, mask, want, k, max_context,
             min_prob, share_edges, evidence_edges, worth, found, found_tokens):
    """match.frequent_drafts once the context is int32: a request writes at the end of
    corpus s (its open document starts at buffer index s_open and holds open_len tokens),
    g holds other outputs (read only with_g); both are corpus tuples. Draft 0 is from
    s, draft 1 from every output (g's and s's open document). Written into `found` (6 + 2k
    floats) and `found_tokens` (6k), as returning arrays costs more than the search: the
    length, context length m (0: none) and score of each draft (found[3d : 3d + 3]), the
    probabilities of each (found[6 + dk :]), and from found_tokens[3dk] its tokens, their
    evidence and their frequency classes (`agentspec.frequency.frequency_classes`, by the edges
    given), one after the other (one read each). A path's score is its expected accepted
    tokens under `worth` (`agentspec.frequency.expected_accepted`; an empty one: its
    probabilities summed)."""
    s_buf, g_buf = s[BUF], g[BUF]
    ctx = _as_ids(context)
    L = len(ctx)
    # (few allocations: each costs more between the interpreter's work than in a loop)
    outs, ok = np.empty((len(levels), 2 * want), dtype=np.int32), np.empty(BLOCK, np.bool_)
    conts = np.empty((2 * want, max(min(L, max_context), 1)), dtype=np.int32)
    lens_rows = np.empty((2, 2 * want), dtype=np.int64)
    lens, rows = lens_rows[0], lens_rows[1]
    paths = np.empty((5, k), dtype=np.int64)  # each source's last tokens and evidence
    classes = paths[4]
    counts = np.empty(2 * len(levels), dtype=np.int64)  # each level's from s, from g
    floats = np.zeros(2 * k + 2)
    scores = floats[2 * k :]
    # each source's last path: over how many rows, with the context counted or not, and its
    # length (a shorter m over the same rows has its prefix: no need to find it again)
    last = np.empty((2, 3), dtype=np.int64)
    found[:6] = 0
    # the occurrences of each level, from the shortest up to the first that has none in
    # either corpus: a context's last q tokens occur only where its shorter suffixes do,
    # and most long contexts occur nowhere. Where a corpus had fewer than `want` of a
    # level, those were all of them, so its longer levels' are among them: filtered, not
    # looked up again
    read, all_s, all_g = 0, False, False
    while read < len(levels) and levels[read] <= min(L, max_context):
        q, out_s, out_g = levels[read], outs[read, :want], outs[read, want:]
        v = _key(ctx, L, q, pw, mask)
        below_s, below_g = outs[read - 1, :want], outs[read - 1, want:]  # (where read > 0)
        if all_s:
            counts[2 * read] = _among(s_buf, below_s[: counts[2 * read - 2]], ctx, q, q,
                                      out_s)[1]
        else:
            counts[2 * read] = _recent(s, read, v, ctx, q, out_s, ok)
            all_s = counts[2 * read] < want
        if not with_g:
            counts[2 * read + 1] = 0
        elif all_g:
            counts[2 * read + 1] = _among(g_buf, below_g[: counts[2 * read - 1]], ctx, q, q,
                                          out_g)[1]
        else:
            counts[2 * read + 1] = _recent(g, read, v, ctx, q, out_g, ok)
            all_g = counts[2 * read + 1] < want
        if counts[2 * read] + counts[2 * read + 1] == 0:
            break
        read += 1
    for i in range(read - 1, -1, -1):
        q, out_s, out_g = levels[i], outs[i, :want], outs[i, want:]
        # each occurrence's context length up to the next level's (or max_context): a path
        # is drafted after every length found, from the occurrences at least that long
        top = min(L, max_context, levels[i + 1] - 1 if i + 1 < len(levels) else L)
        if scores[0] >= min(top, k) and scores[1] >= min(top, k):  # a path after m tokens
            break  # has at most m, each no likelier than 1: neither this level nor shorter
        n_s, n_g = counts[2 * i], counts[2 * i + 1]
        n = n_s + n_g
        _gather(s_buf, out_s[:n_s], ctx, top, min(top, k), conts[:n_s], lens[:n_s])
        _gather(g_buf, out_g[:n_g], ctx, top, min(top, k), conts[n_s:n], lens[n_s:n])
        last[:, 0] = 0  # (no path over this level's rows yet)
        for m in range(top, q - 1, -1):
            # the context is an occurrence too, its next token unwritten, where its last m
            # tokens lie in the text being written (as a suffix tree over that text counts)
            itself = 1 if m <= open_len else 0
            for d in range(2):  # from s; from outputs (s's open document, then g)
                if scores[d] >= m:
                    continue
                r = 0
                for j in range(n if d else n_s):
                    if lens[j] >= m and (d == 0 or j >= n_s or out_s[j] >= s_open):
                        rows[r] = j
                        r += 1
                if r == 0:
                    continue
                tokens, evidence = paths[2 * d], paths[2 * d + 1]
                probs = floats[d * k : (d + 1) * k]
                if r == last[d, 0] and itself == last[d, 1]:  # the rows of a longer m
                    length = min(last[d, 2], m, k)
                else:
                    length = _path(conts, rows[:r], itself, min(m, k), min_prob, tokens, probs,
                                   evidence)
                    last[d, 0], last[d, 1], last[d, 2] = r, itself, length
                score, before, reached = 0.0, 1.0, 1.0
                for j in range(length):
                    classes[j] = _frequency_class(probs[j] / before, evidence[j], share_edges,
                                                  evidence_edges)
                    before = probs[j]
                    if worth.shape[0]:
                        reached *= worth[d, classes[j], min(m + j, worth.shape[2] - 1)]
                        score += reached
                    else:
                        score += probs[j]
                if score > scores[d]:
                    scores[d] = score
                    found[3 * d], found[3 * d + 1], found[3 * d + 2] = length, m, score
                    found[6 + d * k : 6 + d * k + length] = probs[:length]
                    at = 3 * d * k
                    found_tokens[at : at + length] = tokens[:length]
                    found_tokens[at + length : at + 2 * length] = evidence[:length]
                    found_tokens[at + 2 * length : at + 3 * length] = classes[:length]


@njit(cache=True)
def frequent_candidate(s, s_open, open_len, g, with_g, context, pw, levels, mask, want, k,
                       max_context, min_prob, share_edges, evidence_edges, worth, found,
                       found_tokens, session_text, kinds, token_classes, prefix_ids,
                       prefix_rows, ids, rows):
    """`frequent`, then the one of its two drafts a policy drafts, written as a candidate:
    the draft from s where `session_text` and it scores higher, else the one from every
    output. ids: prefix_ids (the token before the draft, then any tokens the draft goes on
    from), then the draft's tokens; rows: prefix_rows, then each draft token's row, its
    kind (kinds[0] from s, kinds[1] from every output, by frequency class) plus its token
    class (token_classes, ids past it taking its last; empty: none). Returns (draft
    tokens written, context length m); m = 0: no draft."""
    frequent(s, s_open, open_len, g, with_g, context, pw, levels, mask, want, k, max_context,
             min_prob, share_edges, evidence_edges, worth, found, found_tokens)
    d = 0 if session_text and found[2] > found[5] else 1
    length, m = np.int64(found[3 * d]), np.int64(found[3 * d + 1])
    if m == 0:
        return 0, 0
    p = len(prefix_rows)
    ids[: p + 1] = prefix_ids
    rows[:p] = prefix_rows
    at = 3 * d * k
    for j in range(length):
        token = found_tokens[at + j]
        row = kinds[d, found_tokens[at + 2 * length + j]]
        if len(token_classes):
            row += token_classes[min(token, len(token_classes) - 1)]
        ids[p + 1 + j] = token
        rows[p + j] = row
    return length, m


@njit(cache=True)
def _frequency_class(share, evidence, share_edges, evidence_edges):
    """One token's class, as agentspec.frequency.frequency_classes gives it."""
    band = 0
    while band < len(share_edges) and share >= share_edges[band]:
        band += 1
    support = 0
    while support < len(evidence_edges) and evidence >= evidence_edges[support]:
        support += 1
    return band + (len(share_edges) + 1) * support


@njit(cache=True)
def _recent(corpus, i, v, ctx, q, out, ok):
    """The most recent len(out) occurrences of the context's last q tokens (level i, key v)
    into out, most recent first; returns how many (ok: as `_find`'s)."""
    _, n = _find(corpus, i, v, ctx, q, q, out, ok)
    return n


@njit(cache=True)
def _among(buf, e, ctx, q, cap, out):
    """`_find` of a level whose occurrences are all among e (fewer than len(out), most
    recent first: every occurrence of a shorter suffix of the context), by the same
    test, in the same order."""
    best, n = q - 1, 0
    for j in range(len(e)):
        best, n = _consider(buf, e[j], ctx, q, cap, out, best, n)
    return best, n


@njit(cache=True)
def _gather(buf, e, ctx, top, cap, conts, lens):
    """For each occurrence e[j]: the cap tokens after it (conts[j], -1 from where it ended)
    and how many context tokens before it match, up to top (lens[j])."""
    for j in range(len(e)):
        ended = False
        for c in range(cap):
            t = buf[e[j] + c]
            ended = ended or t < 0
            conts[j, c] = -1 if ended else t
        lens[j] = _length(buf, e[j], ctx, top)


@njit(cache=True)
def _path(conts, rows, unwritten, cap, min_prob, tokens, probs, evidence):
    """The most frequent path through the continuations conts[rows] (most recent first; -1
    where one ended), at most cap tokens: at each step the token most of the rows still on
    the path continue with (a tie goes to the most recent), its probability the product of
    those shares; it stops before a token whose probability falls under min_prob. Fills
    tokens, probs and evidence (how many rows continue with each token), returns its
    length. rows is left holding, first, the rows still on the path."""
    alive = rows  # rows still on the path
    n, p, j = len(alive), 1.0, 0
    while j < cap and n > 0:
        others = unwritten if j == 0 else 0  # occurrences whose next token is not known
        token, count = -1, 0
        for a in range(n):
            if n - a <= count:  # the rest cannot outnumber it
                break
            t = conts[alive[a], j]
            if t < 0 or t == token:
                continue
            first = True  # or counted at a more recent row already
            for b in range(a):
                if conts[alive[b], j] == t:
                    first = False
                    break
            if not first:
                continue
            c = 0
            for b in range(a, n):
                c += conts[alive[b], j] == t
            if c > count:
                token, count = t, c
        if count == 0 or p * count / (n + others) < min_prob:
            break
        p = p * count / (n + others)
        tokens[j], probs[j], evidence[j] = token, p, count
        j += 1
        w = 0
        for a in range(n):
            if conts[alive[a], j - 1] == token:
                alive[w] = alive[a]
                w += 1
        n = w
    return j
