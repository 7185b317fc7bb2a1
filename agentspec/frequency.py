"""Frequency evidence beside the copies: what followed a short context across outputs.

Copying needs a context of a few tokens that occurred before; an agent that writes new prose
around short commands rarely gives one. SuffixDecoding's answer is statistics: over every
output the model wrote, how often each continuation followed the last few tokens, drafting the
most frequent path with the share of occurrences behind each token. `full` computes such
drafts from its own corpora (`agentspec.match.frequent_drafts`: S, and G with the output being
written), so they need no structure beyond the match engine's index.

The policy's acceptance model learns, online, how often the served model actually takes such
a token, by how sure the path was (its conditional frequency at that token) and how long a
context stood behind it, and weighs those drafts against its copies under one cost model.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass


# Classes of a path's conditional frequency at a token: falling bands up to 1 (the only
# continuation seen, or inside a run of one). What each class is worth to the model being
# served is learned online: the policy's acceptance model keeps curves per draft kind.
_CLASS_EDGES = (0.4, 0.6, 0.8, 0.999)
FREQUENCY_CLASSES = ("F<.4", "F<.6", "F<.8", "F<1", "F1")


@dataclass(slots=True)
class FrequencyDraft:
    tokens: list[int]
    probs: list[float]  # the path's cumulative probability of reaching each token
    match_len: int  # context tokens behind it
    score: float  # SuffixDecoding's score of a draft (its probs summed): expected accepted tokens

    @property
    def classes(self) -> list[int]:
        """Each token's frequency class (an index into FREQUENCY_CLASSES): how sure the path
        was of it, by P(token | tokens before it) as the occurrences count it. (A draft is a
        few tokens: plain Python beats numpy's fixed costs here, on every decoding step.)"""
        classes, before = [], 1.0
        for p in self.probs:
            classes.append(bisect_right(_CLASS_EDGES, p / before))
            before = p
        return classes


NO_DRAFT = FrequencyDraft([], [], 0, 0.0)
