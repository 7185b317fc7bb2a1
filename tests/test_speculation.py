"""The one speculation loop, session inference and the server's text assembly, without a model."""

from __future__ import annotations

from agentspec.drafter import FILE, PROMPT, Plain, Request
from agentspec.sessions import SessionBook, common_prefix
from agentspec.speculation import Loop, Row, accepted_prefix, take


def test_accepted_prefix_and_take():
    assert accepted_prefix([1, 2, 3], [1, 2, 9, 4]) == 2
    assert accepted_prefix([1, 2], [1]) == 1  # the target said no more (replay's end)
    assert accepted_prefix([], [5]) == 0
    assert take([4, 5, 6], 0, {5}, 10) == ([4], "stop")
    assert take([4, 5, 6], 8, set(), 10) == ([4, 5], "length")
    assert take([4, 5], 0, set(), 10) == ([4, 5], "")


class Echo:
    """A target whose choice at every position is the row's script; records rollbacks."""

    padded = False

    def __init__(self, scripts):
        self.scripts, self.rolled, self.left = scripts, [], []

    def join(self, rows):
        pass

    def clip(self, rows, drafts):
        return [d[:4] for d in drafts]

    def verify(self, rows, drafts):
        return [self.scripts[r.request.id][len(r.tokens):][:len(d) + 1]
                for r, d in zip(rows, drafts)]

    def verified_drafts(self, drafts):
        return [len(d) for d in drafts]

    def rollback(self, rows, drafts, accepted):
        self.rolled.append([len(d) - a for d, a in zip(drafts, accepted)])

    def leave(self, keep):
        self.left.append(list(keep))


class Fixed(Plain):
    def __init__(self, drafts):
        self.drafts, self.seen = drafts, []

    def propose(self, batch, padded=False):
        return [list(self.drafts.get(r.id, [])) for r in batch]

    def observe(self, request, drafted, accepted):
        self.seen.append((request.id, drafted, accepted))


def row(rid: str, max_tokens: int, stop=frozenset()) -> Row:
    return Row(Request(id=rid, session="s", tokens=[0], num_prompt=1), max_tokens, stop)


def test_loop_accepts_rolls_back_and_lets_rows_leave():
    target = Echo({"a": [1, 2, 3, 4, 5, 6], "b": [7, 8, 9]})
    drafter = Fixed({"a": [1, 2, 9, 9, 9, 9], "b": [7, 8, 9, 9]})
    done = []
    loop = Loop(target, drafter, on_finish=lambda r: done.append(r.request.id))
    loop.join([row("a", 6), row("b", 3, frozenset({9}))])
    finished = loop.step()
    assert target.rolled == [[2, 1]]  # drafts clipped to 4: a keeps 2, b keeps 3
    assert [r.request.id for r in finished] == ["b"] and done == ["b"]
    a, b = finished[0], loop.rows[0]
    assert a.tokens == [7, 8] and a.finish == "stop"  # b's third token is its stop token
    assert b.tokens == [1, 2, 3] and b.pending == 3 and b.request.tokens == [0, 1, 2, 3]
    assert target.left == [[0]]
    assert drafter.seen == [("a", 4, 2), ("b", 4, 3)]
    for _ in range(3):
        loop.step()
    assert loop.rows == [] and done == ["b", "a"] and b.tokens == [1, 2, 3, 4, 5, 6]


def test_a_timed_loop_reports_each_verification_to_the_drafter():
    class Timed(Fixed):
        def observe_step(self, verified, seconds):
            self.steps.append((verified, seconds))

    class Recorded(Echo):  # as replay's target: its verifications cost nothing
        def verified_drafts(self, drafts):
            return None

    for timed in (True, False):
        drafter = Timed({"a": [1, 2, 9], "b": [7]})
        drafter.steps = []
        target = (Echo if timed else Recorded)({"a": [1, 2, 3, 4], "b": [7, 8]})
        loop = Loop(target, drafter)
        loop.join([row("a", 4), row("b", 2)])
        loop.step()
        assert [s[0] for s in drafter.steps] == ([[3, 1]] if timed else [])
        assert all(s[1] > 0 for s in drafter.steps)


def test_a_re_armed_row_keeps_its_slot_and_drop_removes_rows():
    target = Echo({"a": [1], "b": [2, 3, 4], "c": [5]})
    rows = [row("a", 1), row("b", 3)]

    def again(r):
        if r.request.id == "a":
            r.request, r.tokens, r.finish = Request("c", "s", [0], 1), [], ""
            return True

    loop = Loop(target, None, on_finish=again)
    loop.join(rows)
    loop.step()
    assert [r.request.id for r in loop.rows] == ["c", "b"] and target.left == []
    loop.drop([rows[0]])
    assert [r.request.id for r in loop.rows] == ["b"] and target.left == [[1]]


class Book(Plain):
    def __init__(self):
        self.events = []

    def register(self, session, kind, tokens, path=""):
        self.events.append(("register", session, kind, list(tokens), path))

    def drop_session(self, session):
        self.events.append(("drop", session))


def test_session_book_registers_only_what_is_new_and_drops_idle_sessions():
    d = Book()
    book = SessionBook(d, max_sessions=2, encode=lambda text: [len(text)])
    r1 = Request("r1", "s1", [1, 2, 3], 3)
    book.begin(r1, {"a.py": "xy"})
    r1.tokens += [4, 5]
    book.end(r1)
    r2 = Request("r2", "s1", [1, 2, 3, 4, 5, 6, 7], 7)
    book.begin(r2, {"a.py": "xy"})  # the same file again registers nothing
    assert d.events == [("register", "s1", FILE, [2], "a.py"),
                        ("register", "s1", PROMPT, [1, 2, 3], ""),
                        ("register", "s1", PROMPT, [6, 7], "")]
    for s in ("s2", "s3"):
        r = Request(s, s, [9], 1)
        book.begin(r)
        book.end(r)
    assert ("drop", "s2") in d.events and ("drop", "s1") not in d.events  # s1 is running


def test_a_call_joins_the_session_whose_first_prompt_it_continues():
    d = Book()
    book = SessionBook(d)
    system, task_a, task_b = list(range(100, 140)), [1, 2, 3, 4] * 3, [5, 6, 7, 8] * 3
    trailer = [90, 91]  # the chat template's generation prompt

    def call(rid: str, prompt: list[int], output: list[int]) -> str:
        r = Request(rid, "", list(prompt), len(prompt))
        book.begin(r)
        r.tokens += output
        book.end(r)
        return r.session

    a = call("a1", system + task_a + trailer, [7, 7])
    b = call("b1", system + task_b + trailer, [8])
    assert a != b and book.sessions_started == 2  # same system prompt, another task
    # a later call re-sends the history (the trailer rendered differently) and adds to it
    assert call("a2", system + task_a + [92, 7, 7, 93, 11, 12] + trailer, []) == a
    assert call("b2", system + task_b + trailer + [8, 13], []) == b
    assert book.sessions_started == 2
    named = Request("n1", "mine", system + task_a + [9], 53)
    book.begin(named)  # a session given by metadata is kept as given
    assert named.session == "mine" and book.sessions_started == 3
    assert call("x", [1, 2, 3], []) not in (a, b, "mine")  # too short to be anyone's
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_the_drafter_hears_when_a_batch_is_padded():
    """Only a padded target with more than one row asks for one width."""
    class Asked(Fixed):
        def propose(self, batch, padded=False):
            self.asked.append(padded)
            return super().propose(batch, padded)

    for padded, rows, expected in ((True, 2, True), (True, 1, False), (False, 2, False)):
        drafter = Asked({"a": [1, 2], "b": [7, 8]})
        drafter.asked = []
        target = Echo({"a": [1, 2, 3], "b": [7, 8, 9]})
        target.padded = padded
        loop = Loop(target, drafter)
        loop.join([row(rid, 3) for rid in "ab"[:rows]])
        loop.step()
        assert drafter.asked == [expected]
