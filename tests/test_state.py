"""What a drafter learned, kept in a file and taken back (agentspec.state)."""

from __future__ import annotations

import numpy as np
import pytest

from agentspec import allocator
from agentspec.bench import BenchSetup, make_drafter
from agentspec.drafter import Plain
from agentspec.replay import replay
from agentspec.state import (FORMAT, SAVE_EVERY, Identity, Keeper, StateError, restore, save,
                             vocabulary_digest)
from agentspec.structure import token_bytes
from agentspec.tokens import CHATML, ChatTokenizer, tokenize_sessions
from agentspec.trace import parse_session
from conftest import session_obj, tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return ChatTokenizer(tiny_tokenizer(), CHATML)


@pytest.fixture(scope="module")
def setup(tok):
    return BenchSetup(tokenizer=tok, token_bytes=token_bytes(tok.tokenizer))


@pytest.fixture(scope="module")
def sessions(tok):
    return tokenize_sessions([parse_session(session_obj(f"s{i}", task=f"t{i % 3}"))
                              for i in range(6)], tok)


@pytest.fixture(scope="module")
def ident(setup):
    return Identity("full", "tiny", vocabulary_digest(setup.token_bytes))


class Drafts:
    """A drafter as the engine sees it, recording every draft it proposes."""

    def __init__(self, inner):
        self.inner, self.drafts = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, batch, padded=False):
        out = self.inner.propose(batch, padded)
        self.drafts.append([list(d) for d in out])
        return out


def drafts_on(drafter, sessions, batch=1) -> list:
    recorder = Drafts(drafter)
    replay(sessions, recorder, batch=batch)
    return recorder.drafts


def test_a_restored_policy_drafts_as_the_saved_one_goes_on_to(setup, sessions, ident,
                                                             tmp_path):
    path = tmp_path / "full.npz"
    saved = make_drafter("full", setup)
    replay(sessions[:3], saved)
    assert save(path, saved, ident)
    restored = make_drafter("full", setup)
    when, warnings = restore(path, restored, ident)
    assert warnings == [] and when
    assert len(restored.g.documents()) == len(saved.g.documents()) > 0
    for batch in (1, 2):  # (both go on learning alike: row by row, and as a batch)
        a, b = (make_drafter("full", setup) for _ in range(2))
        replay(sessions[:3], a)
        restore(path, b, ident)
        expected = drafts_on(a, sessions[3:], batch)
        assert drafts_on(b, sessions[3:], batch) == expected
        assert any(d for step in expected for d in step)
    # and what it took back matters: a policy that learned nothing drafts otherwise
    assert drafts_on(make_drafter("full", setup), sessions[3:]) != \
        drafts_on(restored, sessions[3:])


def test_a_state_of_another_model_is_taken_with_a_warning(setup, sessions, ident, tmp_path):
    path = tmp_path / "full.npz"
    policy = make_drafter("full", setup)
    replay(sessions[:1], policy)
    save(path, policy, Identity("full", "another", ident.tokenizer))
    _, warnings = restore(path, make_drafter("full", setup), ident)
    assert len(warnings) == 1 and "learned serving another, not tiny" in warnings[0]


def test_a_state_from_before_the_blend_is_taken_its_blend_starting_fresh(setup, sessions,
                                                                         ident, tmp_path):
    path = tmp_path / "full.npz"
    policy = make_drafter("full", setup)
    replay(sessions[:2], policy)
    save(path, policy, ident)
    with np.load(path) as z:
        blends = [k for k in z.files if k.startswith("acceptance/blend/")]
    assert blends
    _tampered(path, **{k: None for k in blends})
    restored = make_drafter("full", setup)
    restore(path, restored, ident)
    assert restored.acceptance.blends == {}
    assert restored.acceptance.blend("code")[0].tolist() == list(allocator.BLEND_START)


def test_a_drafter_that_keeps_nothing_writes_nothing(tmp_path):
    path = tmp_path / "plain.npz"
    assert not save(path, Plain(), Identity("plain", "tiny", "x"))
    assert not path.exists()


def _tampered(path, **changes):
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays.update(changes)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})


def _header(**fields) -> np.ndarray:
    import json
    return np.array(json.dumps({"format": FORMAT, "method": "full", "model": "tiny",
                                "tokenizer": fields.pop("tokenizer"), **fields}))


BAD = [  # (what is wrong, how to make it so, what the error says)
    ("not an archive", lambda p, t: p.write_bytes(b'{"format": "agentspec.state/4"}'),
     "not a readable state file (not the .npz archive agentspec writes)"),
    ("empty", lambda p, t: p.write_bytes(b""), "not a readable state file"),
    ("one array", lambda p, t: np.save(p.open("wb"), np.zeros(3)), "not a readable state file"),
    ("a cut archive", lambda p, t: p.write_bytes(p.read_bytes()[:200]),
     "not a readable state file"),
    ("no header", lambda p, t: _tampered(p, header=None), "no valid header"),
    ("another format", lambda p, t: _tampered(p, header=_header(tokenizer=t, format="x/9")),
     "format 'x/9'"),
    ("an older agentspec's",  # (its offsets without their squared errors)
     lambda p, t: _tampered(p, header=_header(tokenizer=t, format="agentspec.state/3")),
     "format 'agentspec.state/3', not 'agentspec.state/4' (pass another --state"),
    ("another method", lambda p, t: _tampered(p, header=_header(tokenizer=t, method="global")),
     "learned with method 'global', not 'full'"),
    ("another vocabulary", lambda p, t: _tampered(p, header=_header(tokenizer="0" * 16)),
     "learned with tokenizer vocabulary"),
    ("a table missing", lambda p, t: _tampered(p, **{"acceptance/bias": None}),
     "no array 'bias'"),
    ("offsets cut short", lambda p, t: _tampered(p, **{"acceptance/bias": np.zeros(5)}),
     "token offsets of shape (5,)"),
    ("negative squared errors",
     lambda p, t: _tampered(p, **{"acceptance/bias": -np.ones((2, 4 << allocator.BIAS_BITS))}),
     "negative squared errors"),
    ("negative counts", lambda p, t: _tampered(p, **{"acceptance/pool/0": -np.ones((2, 68))}),
     "not one of (trials, hits) counts"),
    ("a blend cut short", lambda p, t: _tampered(p, **{"acceptance/blend/0": np.zeros(3)}),
     "the blend of role"),
    ("G's lengths off", lambda p, t: _tampered(p, **{"g/lengths": np.array([1, 2])}),
     "G's outputs must be token ids"),
    ("step costs", lambda p, t: _tampered(p, **{"costs/moments": np.zeros((2, 2))}),
     "step costs: moments must be 5 x 5"),
]


@pytest.mark.parametrize("why,spoil,says", BAD, ids=[b[0] for b in BAD])
def test_a_bad_state_file_is_refused_in_one_line_and_left_as_it_is(setup, sessions, ident,
                                                                   tmp_path, why, spoil, says):
    path = tmp_path / "full.npz"
    policy = make_drafter("full", setup)
    replay(sessions[:2], policy)
    save(path, policy, ident)
    spoil(path, ident.tokenizer)
    before = path.read_bytes()
    with pytest.raises(StateError) as e:
        restore(path, make_drafter("full", setup), ident)
    message = str(e.value)
    assert message.startswith(f"state {path}: ") and says in message and "\n" not in message
    assert path.read_bytes() == before


def test_a_state_that_cannot_be_written_says_so(setup, ident, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(StateError, match="cannot write it"):
        save(tmp_path / "file" / "full.npz", make_drafter("full", setup), ident)
    assert [p.name for p in tmp_path.iterdir()] == ["file"]  # (no temporary file left)


def test_a_keeper_saves_every_16_requests_when_idle_and_when_closed(setup, sessions, ident,
                                                                   tmp_path):
    path = tmp_path / "full.npz"
    stale = tmp_path / "full.npz.k2j4.tmp"  # a write its process was killed in
    stale.write_bytes(b"half")
    policy = make_drafter("full", setup)
    keeper = Keeper(path, policy, ident)
    assert keeper.start() == (None, [])  # nothing to take back; the file is written at once
    assert not stale.exists()

    def outputs_kept() -> int:
        keeper.wait()
        with np.load(path) as z:
            return len(z["g/lengths"])

    assert outputs_kept() == 0
    for s in range(3):
        replay(sessions[s : s + 1], policy)  # its outputs join G
        for _ in range(SAVE_EVERY - 1):
            keeper.finished(idle=False)
        assert outputs_kept() == len(policy.g.documents()) - len(sessions[s].calls)
        keeper.finished(idle=False)  # the 16th
        assert outputs_kept() == len(policy.g.documents())
    replay(sessions[3:4], policy)
    keeper.finished(idle=True)  # falling idle saves at once
    assert outputs_kept() == len(policy.g.documents())
    replay(sessions[4:5], policy)
    assert keeper.close() and outputs_kept() == len(policy.g.documents())
    saved, warnings = Keeper(path, make_drafter("full", setup), ident).start()
    assert saved and warnings == []
