"""Frequency evidence beside the copies: what followed a short context across outputs.

Copying needs a context of a few tokens that occurred before; an agent that writes new prose
around short commands rarely gives one. SuffixDecoding's answer is statistics: over every
output the model wrote, how often each continuation followed the last few tokens, drafting the
most frequent path with the share of occurrences behind each token. `full` computes such
drafts from its own corpora (`agentspec.match.frequent_drafts`: S, and G with the output being
written), so they need no structure beyond the match engine's index.

The policy's acceptance model learns, online, how often the served model actually takes such
a token, by how sure the path was (its conditional frequency at that token), how many
occurrences said so and how long a context stood behind it, and weighs those drafts against
its copies under one cost model. The same curves choose the path itself: of the paths after
each context length, the one the served model is expected to take most of
(`expected_accepted`), where SuffixDecoding takes the one whose frequencies sum highest (a
long context seen once promises a path of certainties, which a model rarely follows far).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


# Classes of a path's token: how sure the path was of it (its conditional frequency, in
# falling bands up to 1: the only continuation seen, or inside a run of one) and how many
# occurrences say so (one, two or three, four or more: the only continuation of one
# occurrence is weaker evidence than that of sixteen). What each class is worth to the model
# being served is learned online: the policy's acceptance model keeps curves per draft kind.
SHARE_EDGES = np.array([0.4, 0.6, 0.8, 0.999])
_SHARES = ("F<.4", "F<.6", "F<.8", "F<1", "F1")
EVIDENCE_EDGES = np.array([2, 4])
_EVIDENCE = ("x1", "x2", "x4")
FREQUENCY_CLASSES = tuple(share + evidence for evidence in _EVIDENCE for share in _SHARES)
# what each class is worth to the served model moves slowly: a role's paths read its curves
# anew every WORTH_EVERY steps (policy.Policy.role_worth)
WORTH_EVERY = 128


def frequency_classes(probs: list[float], evidence: list[int]) -> list[int]:
    """Each token's frequency class (an index into FREQUENCY_CLASSES): how sure the path
    was of it, by P(token | tokens before it) as the occurrences count it, and on how many
    occurrences that rests. (The compiled search computes the same in its kernel.)"""
    if not probs:
        return []
    before = np.concatenate(([1.0], probs[:-1]))
    return (np.searchsorted(SHARE_EDGES, np.divide(probs, before), side="right")
            + len(_SHARES) * np.searchsorted(EVIDENCE_EDGES, evidence, side="right")).tolist()


def expected_accepted(classes: list[int], match_len: int, worth: np.ndarray) -> float:
    """A path's expected accepted tokens when its token j, of frequency class c after
    match_len + j matched tokens, is accepted with probability worth[c, match_len + j] once
    the tokens before it were (lengths past the table's read its last column)."""
    total, reached, last = 0.0, 1.0, worth.shape[1] - 1
    for j, c in enumerate(classes):
        reached *= worth[c, min(match_len + j, last)]
        total += reached
    return total


@dataclass(slots=True)
class FrequencyDraft:
    tokens: list[int]
    probs: list[float]  # the path's cumulative probability of reaching each token
    evidence: list[int]  # occurrences that continue with each token (of those on the path)
    classes: list[int]  # each token's frequency class (`frequency_classes`)
    match_len: int  # context tokens behind it
    score: float  # what it was chosen by: its expected accepted tokens (see frequent_drafts)


NO_DRAFT = FrequencyDraft([], [], [], [], 0, 0.0)
