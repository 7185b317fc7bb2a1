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
its copies under one cost model.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass


# Classes of a path's token: how sure the path was of it (its conditional frequency, in
# falling bands up to 1: the only continuation seen, or inside a run of one) and how many
# occurrences say so (one, two or three, four or more: the only continuation of one
# occurrence is weaker evidence than that of sixteen). What each class is worth to the model
# being served is learned online: the policy's acceptance model keeps curves per draft kind.
_SHARE_EDGES = (0.4, 0.6, 0.8, 0.999)
_SHARES = ("F<.4", "F<.6", "F<.8", "F<1", "F1")
_EVIDENCE_EDGES = (2, 4)
_EVIDENCE = ("x1", "x2", "x4")
FREQUENCY_CLASSES = tuple(share + evidence for evidence in _EVIDENCE for share in _SHARES)


@dataclass(slots=True)
class FrequencyDraft:
    tokens: list[int]
    probs: list[float]  # the path's cumulative probability of reaching each token
    evidence: list[int]  # occurrences that continue with each token (of those on the path)
    match_len: int  # context tokens behind it
    score: float  # SuffixDecoding's score of a draft (its probs summed): expected accepted tokens

    @property
    def classes(self) -> list[int]:
        """Each token's frequency class (an index into FREQUENCY_CLASSES): how sure the path
        was of it, by P(token | tokens before it) as the occurrences count it, and on how
        many occurrences that rests. (A draft is a few tokens: plain Python beats numpy's
        fixed costs here, on every decoding step.)"""
        classes, before = [], 1.0
        for p, n in zip(self.probs, self.evidence):
            classes.append(bisect_right(_SHARE_EDGES, p / before)
                           + len(_SHARES) * bisect_right(_EVIDENCE_EDGES, n))
            before = p
        return classes


NO_DRAFT = FrequencyDraft([], [], [], 0, 0.0)
