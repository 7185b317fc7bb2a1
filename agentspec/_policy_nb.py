"""numba kernel for the policy's choice of one request's draft (`CostAware.drafts` in
agentspec.policy, whose Python code is the reference and the fallback; both draft alike).

Why: a step plans the copy, searches the frequency path, plans it, and may continue it
twice, each a search and a plan; as separate calls, their arguments, candidates and keys
cost the interpreter more than the kernels' own work. Here all of it is one call.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from numba import njit

from agentspec._accept_nb import best_length, blended, learn_blend, observe, position_hazard
from agentspec._match_nb import BUF, TAIL_LEN, frequent_candidate, lookup, with_tail
from agentspec.allocator import DECAY
from agentspec.frequency import WORTH_EVERY

_NO_IDS = np.zeros(0, dtype=np.int64)


@njit(cache=True)
def plan_request(s, s_open, open_len, g, with_g, context, look_k, a, b,
                 pw, levels, mask, first, candidates, want, max_context, min_prob,
                 share_edges, evidence_edges,
                 t, h, kt, kh, pt, ph, bin_of, width, pad, kind_shift, weight, bias, bits,
                 spread, window, bias_rate, calibrate, rate_sums, blend, blend_rate,
                 max_k, search, session_text, kind_tables, token_classes, with_ids, copy_kinds,
                 repeat, agreeing, extensions, score_all, with_blend, quiet,
                 worth, drafted, accepted, revealed, worth_age, costs, copy_m, given_rows,
                 given_ids, before, ratios, sent_sums, slots, gain,
                 found, found_tokens, ids, rows, copy_ids, copy_rows, agreed, kept, kept_costs):
    """CostAware.drafts for one request: the copy (copy_m: its context length, 0: none)
    and the frequency path after `context` (`frequent_candidate`, its kinds by extension
    depth in kind_tables), each planned (`best_length`) at `rate` times a sent ratio,
    ratios[slots[i]] (i: the key's place in policy._sent_keys; 0 for the copy alone, 1
    beside a path, then the path's by its extensions, alone and, after those, beside a
    copy). A candidate is sent where it gains more than `gain` (and than the one before).
    A path sent to its end (under max_k) is continued by the path after it, up to
    `extensions` times, and sent longer where that gains more; it is scored longer either
    way. With both candidates, each token's row moves by `agreeing` times what the other
    says of it (`allocator.agreement`; 0: not at all) before either is planned, and
    `with_blend`, the tokens both say take the role's blend of their two hazards
    (`allocator.blended`), in both plans. With `quiet`, where neither is sent (gain 0,
    not padded), both are planned again at a step's rate of 1 token times the last key's
    sent ratio (`allocator.QUIET`), sent under it where that gains. Returns
    (the draft's length n, the lookup's answer as `_match_nb.lookup` gives it).

    The step is kept in the request's buffers, which the next plan learns from: the copy
    in copy_ids (the token before it, then its tokens) and copy_rows, the path in ids and
    rows, the blended hazards of the tokens both say in `agreed`, and what was decided in
    `kept` (`keep`'s layout) and kept_costs (the tokens the draft sent is expected to have
    accepted, and what it costs).

    The copy comes one of two ways. With look_k > 0 it is looked up in s here (as
    `Corpus.match`: after `context`, of at most look_k tokens, s's slots [a, b) indexed
    first), as the policy's retrieval does when s is its only source, and written in by
    `_write_copy`; else it is given (given_rows, and given_ids: the token before it and
    its tokens), found by the policy's retrieval. The path is searched for (`search`)
    after the same context.

    First it learns what the request's last step showed (drafted < 0: nothing kept; else
    the tokens drafted and accepted, and `revealed`, what the target wrote), from the
    buffers (see `_learn`), and R (`rate_sums`) and the sent ratios (`ratios`,
    `sent_sums`) it prices with are read after that, as is what a path's token is worth
    (`worth`, read anew where `worth_age` says so: see `_read_worth`).

    Its arguments come in groups, each made whole by the caller: the corpora's
    (`match.plan_reads`), theirs that never change (`match.search_constants`), the role's
    tables and what learning reads (`AcceptanceModel.kernel_tables`), the policy's
    constants (`Policy.role_constants` gives these three), then the step's own."""
    if drafted >= 0:
        _learn(t, h, kt, kh, pt, ph, bin_of, width, pad, kind_shift, weight, bias, bits,
               spread, window, bias_rate, calibrate, rate_sums, ratios, sent_sums, slots,
               with_ids, score_all, drafted, accepted, revealed, ids, rows, copy_ids,
               copy_rows, kept, kept_costs, blend, blend_rate)
    _read_worth(worth, worth_age, kind_tables[0], kt, kh, pt, ph, bin_of, width, pad,
                kind_shift, weight)
    rate = max(1.0, rate_sums[0] / rate_sums[1])
    ids[0] = before
    context = context[max(0, len(context) - levels[-1]):]  # (the longest level's tokens)
    looked = (0, 0, 0, 0, 0, 0, s[TAIL_LEN])
    copy_length = 0
    if look_k > 0:
        looked = lookup(s, context, pw, levels, first, mask, candidates, look_k, a, b)
        # (the lookup indexed the step's tokens: the search reads them)
        s = with_tail(s, looked[6])
        copy_m = looked[0]
        if copy_m:
            copy_length = _write_copy(s[BUF], looked, b, max_k, repeat, copy_kinds,
                                      token_classes, before, copy_rows, copy_ids)
    elif copy_m:
        copy_length = len(given_rows)
        copy_rows[:copy_length] = given_rows
        copy_ids[: copy_length + 1] = given_ids
    copy = copy_rows[:copy_length]
    has_copy = copy_m > 0
    # the path's ratios: the second half of slots after the copy's two where it has a rival
    # (the last slot is the quiet key's)
    quiet_key = len(slots) - 1
    path_keys = 2 + (quiet_key - 2) // 2 * has_copy
    length, m = frequent_candidate(
        s, s_open, open_len, g, with_g, context if search else context[:0], pw, levels, mask,
        want, max_k, max_context, min_prob, share_edges, evidence_edges, worth, found,
        found_tokens, session_text, kind_tables[0], token_classes, ids[:1], rows[:0], ids,
        rows)
    # how many first tokens both candidates say, and how many either could
    common = min(copy_length, length) if has_copy and m else 0
    parted = _parted(copy_ids, ids, common)
    if agreeing and common:
        _said(copy, parted, common, agreeing)
        _said(rows[:length], parted, common, agreeing)
    both = parted if with_blend else 0  # (the tokens whose hazards are blended)
    _blend(t, h, kt, kh, pt, ph, bin_of, width, pad, kind_shift, weight, bias, bits, blend,
           copy_m, copy, copy_ids, m, rows, ids, with_ids, agreed[:both])
    c_key = 1 if m else 0
    sent, n, gain = _plan_both(t, h, kt, kh, pt, ph, bin_of, width, pad, kind_shift, weight,
                               bias, bits, costs, copy, copy_m, copy_ids, rows[:length], m,
                               ids, with_ids, agreed[:both], rate * ratios[slots[c_key]],
                               rate * ratios[slots[path_keys]], gain)
    key = c_key if sent == 0 else path_keys if sent == 1 else -1
    sent_length = length if sent == 1 else 0
    if quiet and sent == -1:
        price = ratios[slots[quiet_key]]  # (a step that drafts nothing makes 1 token)
        sent, n, gain = _plan_both(t, h, kt, kh, pt, ph, bin_of, width, pad, kind_shift,
                                   weight, bias, bits, costs, copy, copy_m, copy_ids,
                                   rows[:length], m, ids, with_ids, agreed[:both], price,
                                   price, gain)
        key = quiet_key if sent >= 0 else -1
        sent_length = length if sent == 1 else 0
    for d in range(extensions if m and key != quiet_key else 0):
        if sent != 1 or n != length or n >= max_k:
            break
        # the path after the context and the path's tokens, as if the output had written them
        longer = np.empty(len(context) + length, dtype=np.int32)
        longer[: len(context)] = context
        longer[len(context):] = ids[1 : length + 1]
        more, _ = frequent_candidate(
            s, s_open, open_len, g, with_g, longer[-max_k:], pw, levels, mask, want,
            max_k - length, max_context, min_prob, share_edges, evidence_edges, worth, found,
            found_tokens, session_text, kind_tables[d + 1], token_classes, ids[: length + 1],
            rows[:length], ids, rows)
        if not more:
            break
        length += more
        e_n, e_gain = best_length(t, h, kt, kh, pt, ph, rows[:length], m, length, bin_of,
                                  width, pad, kind_shift, weight, costs,
                                  rate * ratios[slots[path_keys + d + 1]], bias,
                                  ids[: length + 1] if with_ids else _NO_IDS, bits,
                                  agreed[:both])
        if e_gain <= gain:
            break
        n, gain, sent_length, key = e_n, e_gain, length, path_keys + d + 1
    keep(kept, copy_m, copy_length, m, length, sent, sent_length, key, both)
    # (what the plan expected of the draft: its gain and what it was priced at)
    kept_costs[0] = gain + (1.0 if key == quiet_key else rate) * ratios[slots[key]] \
        * costs[n] if n else 0.0
    kept_costs[1] = costs[n]
    return n, looked


@njit(cache=True)
def _plan_both(t, h, kt, kh, pt, ph, bin_of, width, pad, kind_shift, weight, bias, bits, costs,
               copy, copy_m, copy_ids, path, path_m, path_ids, with_ids, agreed, copy_rate,
               path_rate, gain):
    """The copy (its rows; none: copy_m 0) and the path (none: path_m 0) each planned
    (`best_length`) at its rate: (which is sent, -1 neither, 0 the copy, 1 the path; its
    length; its gain), the one that gains more than `gain` and than the copy."""
    sent, n = -1, 0
    for which in range(2):
        rows, m, c_ids, rate = (copy, copy_m, copy_ids, copy_rate) if which == 0 \
            else (path, path_m, path_ids, path_rate)
        if not m:
            continue
        if not len(rows):
            if 0.0 > gain:  # (padded: an empty candidate plans nothing and gains nothing)
                sent, n, gain = which, 0, 0.0
            continue
        c_n, c_gain = best_length(t, h, kt, kh, pt, ph, rows, m, len(rows), bin_of, width, pad,
                                  kind_shift, weight, costs, rate, bias,
                                  c_ids[: len(rows) + 1] if with_ids else _NO_IDS, bits, agreed)
        if c_gain > gain:
            sent, n, gain = which, c_n, c_gain
    return sent, n, gain


@njit(cache=True)
def _read_worth(worth, age, kinds, kt, kh, pt, ph, bin_of, width, pad, kind_shift, weight):
    """`Policy.role_worth` of a role (worth[source, class, copy length], age: its reads
    since it was read anew; none: no worth): the frequency kinds' curves (kinds[source,
    class], their first rows), as `AcceptanceModel.kind_hazards` reads them, every
    WORTH_EVERY reads."""
    if len(age) == 0:
        return
    if age[0] >= WORTH_EVERY:
        for source in range(worth.shape[0]):
            for c in range(worth.shape[1]):
                for length in range(worth.shape[2]):
                    b = bin_of[min(length, len(bin_of) - 1)] + pad
                    k = (kinds[source, c] >> kind_shift) * width + b
                    worth[source, c, length] = (kh[k] + weight * ph[b] / pt[b]) \
                        / (kt[k] + weight)
        age[0] = 0
    age[0] += 1


@njit(cache=True)
def keep(kept, copy_m, copy_length, path_m, path_length, sent, sent_length, key, both):
    """A step as `kept` holds it: the copy's context length (0: none) and length, the
    path's (a path has both or neither), which was sent (-1 none, 0 the copy, 1 the path),
    the path's length in the draft sent, the sent draft's key (its place in
    policy._sent_keys; -1 none), and how many first tokens took blended hazards."""
    kept[0], kept[1], kept[2], kept[3] = copy_m, copy_length, path_m, path_length
    kept[4], kept[5], kept[6], kept[7] = sent, sent_length, key, both


@njit(cache=True)
def _parted(copy_ids, path_ids, common):
    """Where a copy and a path (their ids: the token before them, then theirs) part within
    their first `common` tokens (`common` where they do not)."""
    parted = 0
    while parted < common and copy_ids[parted + 1] == path_ids[parted + 1]:
        parted += 1
    return parted


@njit(cache=True)
def _blend(t, h, kt, kh, pt, ph, bin_of, width, pad, kind_shift, weight, bias, bits, blend,
           copy_m, copy_rows, copy_ids, path_m, path_rows, path_ids, with_ids, agreed):
    """AcceptanceModel.agreed_hazards of the first len(agreed) tokens, which a copy and a
    path both say (their ids: the token before them, then theirs; their offsets read where
    with_ids), written into `agreed`."""
    copy_offsets = copy_ids if with_ids else _NO_IDS
    path_offsets = path_ids if with_ids else _NO_IDS
    for j in range(len(agreed)):
        agreed[j] = blended(
            blend[0],
            position_hazard(t, h, kt, kh, pt, ph, copy_rows, copy_m, j, bin_of, width, pad,
                            kind_shift, weight, bias, copy_offsets, bits),
            position_hazard(t, h, kt, kh, pt, ph, path_rows, path_m, j, bin_of, width, pad,
                            kind_shift, weight, bias, path_offsets, bits))


@njit(cache=True)
def _learn(t, h, kt, kh, pt, ph, bin_of, width, pad, kind_shift, weight, bias, bits, spread,
           window, bias_rate, calibrate, rate_sums, ratios, sent_sums, slots, with_ids,
           score_all, drafted, accepted, revealed, ids, rows, copy_ids, copy_rows, kept,
           kept_costs, blend, blend_rate):
    """`CostAware.learn` of the step kept in the buffers (see `plan_request`), given the
    tokens drafted and accepted and what the target wrote (revealed). In the same order:
    the blend stepped where the plan blended (`learn_blend`, with the hazards before this
    step), the candidates scored (all of them with score_all, else the draft sent up to
    the target's token after it) and observed, the row charged to R, the draft's sent
    ratio moved."""
    copy_m, copy_length, path_m, path_length = kept[0], kept[1], kept[2], kept[3]
    sent, sent_length, key, both = kept[4], kept[5], kept[6], kept[7]
    if both:
        known = min(both, len(revealed))
        matched = _matched(ids, revealed, known)
        learn_blend(t, h, kt, kh, pt, ph, bin_of, width, pad, kind_shift, weight, bias, bits,
                    blend, blend_rate, copy_m, copy_rows, copy_ids if with_ids else _NO_IDS,
                    path_m, rows, ids if with_ids else _NO_IDS, known, matched)
    if (score_all or sent == 0) and copy_m:
        _observe_scored(t, h, kt, kh, pt, ph, bin_of, width, pad, kind_shift, weight, bias,
                        bits, spread, window, bias_rate, copy_m, copy_rows[:copy_length],
                        copy_ids[: copy_length + 1], with_ids,
                        copy_length if score_all else min(copy_length, drafted + 1), revealed)
    if (score_all or sent == 1) and path_length:
        length = path_length if score_all else sent_length  # (the draft sent stops there)
        _observe_scored(t, h, kt, kh, pt, ph, bin_of, width, pad, kind_shift, weight, bias,
                        bits, spread, window, bias_rate, path_m, rows[:length],
                        ids[: length + 1], with_ids,
                        length if score_all else min(length, drafted + 1), revealed)
    rate_sums[0] = rate_sums[0] * DECAY + accepted + 1
    rate_sums[1] = rate_sums[1] * DECAY + 1 + kept_costs[1]
    if drafted and calibrate:
        slot = slots[key]
        sent_sums[slot, 0] = sent_sums[slot, 0] * DECAY + kept_costs[0]
        sent_sums[slot, 1] = sent_sums[slot, 1] * DECAY + accepted
        ratios[slot] = min(2.0, max(0.5, sent_sums[slot, 0] / sent_sums[slot, 1]))


@njit(cache=True)
def _observe_scored(t, h, kt, kh, pt, ph, bin_of, width, pad, kind_shift, weight, bias, bits,
                    spread, window, bias_rate, m, c_rows, c_ids, with_ids, scored, revealed):
    """One candidate (its first `scored` tokens, c_ids[1:], against `revealed`) observed,
    as `AcceptanceModel.observe` takes it (`allocator.scored`: known, matched)."""
    known = min(scored, len(revealed))
    matched = _matched(c_ids, revealed, known)
    reached = min(matched + 1, known)
    if reached > 0 and m > 0:
        observe(t, h, kt, kh, pt, ph, c_rows[:reached], m, reached, matched, bin_of, width,
                pad, kind_shift, spread, window, weight, bias, c_ids if with_ids else _NO_IDS,
                bits, bias_rate)


@njit(cache=True)
def _matched(c_ids, revealed, known):
    """How many of a candidate's first `known` tokens (c_ids: the token before it, then its
    tokens) the target wrote (`revealed`), in order: `allocator.scored`'s matched."""
    matched = 0
    while matched < known and c_ids[matched + 1] == revealed[matched]:
        matched += 1
    return matched


@njit(cache=True)
def _said(rows, parted, n, step):
    """One candidate's rows moved by `step` times what the other says of each token
    (`allocator.agreement`: 0 alone, 1 agrees, 2 differs): agrees before `parted`, differs
    from there where the two parted inside their common n tokens, else alone."""
    for j in range(len(rows)):
        if j < parted:
            rows[j] += step
        elif parted < n:
            rows[j] += 2 * step


@njit(cache=True)
def _write_copy(buf, looked, end, max_k, repeat, kinds, token_classes, before, rows, ids):
    """The continuation `lookup` chose (looked: its answer) as a copy candidate: its ids
    (`before`, then its tokens) and rows into ids and rows; returns its length. One that
    runs up to the end of the buffer (a continuation stops before a boundary, so it ends
    there only in the open document, the output being written) repeats, with `repeat`,
    to max_k tokens, as `Policy._written` repeats it; its kind is kinds[0, 1 or 2] by the
    agreement of its occurrences, as `policy.draft_kind` gives it, and kinds[3 or 4] past
    the common prefix of the occurrences' continuations."""
    _, chosen, occurrences, agree, agreed, n, _ = looked
    length = max_k if repeat and 0 < n < max_k and chosen + n == end else n
    agreement = 0 if occurrences <= 1 else 1 if agree == occurrences else 2
    kind, parted = kinds[agreement], kinds[agreement + 2 if agreement else 0]
    ids[0] = before
    for j in range(length):
        token = buf[chosen + j % n]
        ids[j + 1] = token
        rows[j] = kind if j < agreed else parted
        if len(token_classes):
            rows[j] += token_classes[min(token, len(token_classes) - 1)]
    return length


def drop_stale_cache(folder: Path, stem: str, digest: str) -> None:
    """Drop the cached kernels of module `stem` in `folder` unless they were compiled from
    the sources whose `digest` is given, then mark the folder with it.

    numba keys a cached function to its own file only, but this module's kernels compile
    in those of `_match_nb` and `_accept_nb` and two constants of other modules. A pull or
    an edit that changed those and left this file alone would run stale code: against
    today's layouts (a changed tuple or mask is a crash), or measured as if new."""
    stamp = folder / f"{stem}.depends"
    if stamp.is_file() and stamp.read_text() == digest:
        return
    for cached in folder.glob(f"{stem}.*.nb[ic]"):
        cached.unlink()
    stamp.write_text(digest)


def _sources_digest() -> str:
    """What this module's kernels compile in from elsewhere."""
    here = Path(__file__)
    sources = b"".join(here.with_name(name).read_bytes()
                       for name in ("_match_nb.py", "_accept_nb.py"))
    return hashlib.sha256(sources + repr((DECAY, WORTH_EVERY)).encode()).hexdigest()


try:  # (where numba keeps this module's cache; another numba's layout, or no cache: skip)
    drop_stale_cache(Path(plan_request._cache._cache_path), Path(__file__).stem,
                     _sources_digest())
except (AttributeError, OSError):
    pass
