"""Finding, parsing and applying model-written diffs: strict round trips, leniency, refusals."""

from __future__ import annotations

import difflib
import os
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentspec.agents.patch import (PatchError, apply_patch, extract_diff, parse_diff,
                                    safe_path)

FAST = settings(max_examples=50, deadline=None)


def udiff(old: str, new: str, name: str = "f.py") -> str:
    """difflib's unified diff, with the '\\ No newline' marks it leaves out."""
    out = []
    for line in difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                     f"a/{name}", f"b/{name}"):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file (its bytes), folder and symlink under root."""
    seen: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            seen[rel] = ("link:" + os.readlink(p) if p.is_symlink()
                         else "dir" if p.is_dir() else p.read_bytes())
    return seen


def repo(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text.encode())
    return root


DIFF = ("--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
        " def add(a, b):\n-    return a - b\n+    return a + b\n")

# Short lines from characters that mean something to a diff parser.
LINE = st.text(alphabet="ab -+@\\\t", max_size=4)


@st.composite
def texts(draw):
    lines = draw(st.lists(LINE, max_size=10))
    return "\n".join(lines) + ("\n" if lines and draw(st.booleans()) else "")


@FAST
@given(old=texts(), new=texts())
def test_difflib_diffs_apply_strictly(old, new):
    assume(old != new)
    with tempfile.TemporaryDirectory() as d:
        root = repo(Path(d), {"f.py": old})
        done = apply_patch(udiff(old, new), root)
        assert (root / "f.py").read_bytes().decode() == new
        assert (done.files, done.mode, done.notes) == (["f.py"], "strict", [])


# --- leniency: edits of files whose non-blank lines are unique, so each hunk fits one place


@st.composite
def edits(draw, blanks: bool = False):
    """(old, new): numbered lines (and blank ones) with some deleted, replaced, inserted."""
    old, new, k = [], [], 0
    for i in range(draw(st.integers(1, 25))):
        line = "" if blanks and draw(st.integers(0, 3)) == 0 else f"line {i}"
        old.append(line)
        what = draw(st.sampled_from(["keep"] * 4 + ["drop", "replace", "insert"]))
        if what in ("replace", "insert"):
            new.append(f"new {k}")
            k += 1
        if what in ("keep", "insert"):
            new.append(line)
    assume(new != old)
    return "\n".join(old) + "\n", "\n".join(new) + ("\n" if new else "")


def rewrite(diff: str, body) -> str:
    """The diff with each hunk line replaced by body(line), a list of lines."""
    out = []
    for line in diff.splitlines():
        out += [line] if line.startswith(("--- ", "+++ ", "@@")) else body(line)
    return "\n".join(out) + "\n"


def lenient(old: str, new: str, diff: str):
    with tempfile.TemporaryDirectory() as d:
        root = repo(Path(d), {"f.py": old})
        done = apply_patch(diff, root)
        assert (root / "f.py").read_text() == new
    assert done.mode == "lenient" and done.notes[0].startswith("strict: ")
    return done


@FAST
@given(pair=edits(), shift=st.integers(1, 30))
def test_wrong_line_numbers(pair, shift):
    old, new = pair
    diff = udiff(old, new)
    moved = re.sub(r"^@@ -(\d+)(,\d+)? \+(\d+)",
                   lambda m: f"@@ -{int(m[1]) + shift}{m[2] or ''} +{int(m[3]) + shift}",
                   diff, flags=re.M)
    done = lenient(old, new, moved)
    assert any("applied at line" in n for n in done.notes[1:])


@FAST
@given(pair=edits())
def test_forgotten_plus_marks(pair):
    old, new = pair
    diff = udiff(old, new)
    assume("\n+new" in diff)
    done = lenient(old, new, rewrite(diff, lambda l: [l[1:] if l.startswith("+new") else l]))
    assert any("unmarked line(s) as added" in n for n in done.notes[1:])


@FAST
@given(pair=edits())
def test_trailing_spaces(pair):
    old, new = pair
    diff = udiff(old, new)
    done = lenient(old, new, rewrite(diff, lambda l: [l + "  " if l[:1] in " -" else l]))
    assert any("whitespace" in n for n in done.notes[1:])


@FAST
@given(pair=edits(blanks=True))
def test_blank_context_dropped(pair):
    old, new = pair
    diff = udiff(old, new)
    # a dropped blank line stays where the file has it, before the next old line: drop only
    # those between two old lines, with no added line between
    lines = diff.splitlines()

    def anchor(near: list[str]) -> bool:
        line = next((line for line in near if line != " "), "@@")
        return line[:1] in " -" and bool(line[1:].strip())

    def keep(i: int) -> bool:
        return lines[i] != " " or not (anchor(lines[i + 1:]) and anchor(lines[i - 1::-1]))

    dropped = "\n".join(line for i, line in enumerate(lines) if keep(i)) + "\n"
    assume(dropped != diff)
    lenient(old, new, dropped)


@FAST
@given(pair=edits(blanks=True))
def test_blank_context_added(pair):
    old, new = pair
    diff = udiff(old, new)
    added = rewrite(diff, lambda l: [" ", l] if l.startswith(" line") else [l])
    assume(added != diff)
    lenient(old, new, added)


def test_indented_line_without_its_plus(tmp_path):
    repo(tmp_path, {"calc.py": "def add(a, b):\n    return a - b\n"})
    diff = DIFF.replace("\n+    return a + b", "\n    return a + b")
    done = apply_patch(diff, tmp_path)
    assert (tmp_path / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert done.mode == "lenient"
    assert done.notes[1] == "calc.py hunk 1: took 1 unmarked line(s) as added"


def test_unmarked_context_and_nearest_place(tmp_path):
    block = "def f():\n    return 1\n"
    repo(tmp_path, {"m.py": block + "\n" * 10 + block})
    # context without its ' ' mark; the block is twice in the file: line 13 is nearer to 14
    diff = "--- m.py\n+++ m.py\n@@ -14,2 +14,2 @@\ndef f():\n-    return 1\n+    return 2\n"
    done = apply_patch(diff, tmp_path)
    assert (tmp_path / "m.py").read_text() == block + "\n" * 10 + block.replace("1", "2")
    assert done.notes[1] == ("m.py hunk 1: applied at line 13, not 14; "
                             "took 1 unmarked line(s) as context")


def test_a_hunk_that_fits_nowhere_writes_nothing(tmp_path):
    repo(tmp_path, {"x.py": "a\nb\n", "y.py": "c\nd\n"})
    before = snapshot(tmp_path)
    diff = ("--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n+B\n"
            "--- a/y.py\n+++ b/y.py\n@@ -1,2 +1,2 @@\n c\n-e\n+E\n")
    with pytest.raises(PatchError, match=r"y.py hunk 1: doesn't fit .* line 2 is 'd'"):
        apply_patch(diff, tmp_path)
    assert snapshot(tmp_path) == before


# --- malformed diffs: PatchError or success, and nothing written on PatchError

JUNK = st.sampled_from([
    "--- a/f.py", "+++ b/f.py", "--- /dev/null", "+++ /dev/null", "@@ -1 +1 @@",
    "@@ -0,0 +1,2 @@", "@@ -3,2 +3 @@", "@@ junk @@", "diff --git a/f.py b/f.py", "",
    "\\ No newline at end of file", "```", "+x", "-a", " a", "a", "--- ../x.py",
    "+++ /etc/passwd", "+++ b/sub", "--- a/sub/g.txt", "+++ b/sub/g.txt/h",
]) | st.text(max_size=12)


@st.composite
def mutated(draw):
    old, new = draw(texts()), draw(texts())
    lines = udiff(old, new).splitlines() or ["--- a/f.py", "+++ b/f.py"]
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines)))
        what = draw(st.sampled_from(["drop", "insert", "garble", "dup"]))
        if what == "insert" or i == len(lines):
            lines.insert(i, draw(JUNK))
        elif what == "drop":
            del lines[i]
        elif what == "dup":
            lines.insert(i, lines[i])
        else:
            j = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:j] + draw(st.text(max_size=3)) + lines[i][j + 1:]
    return old, "\n".join(lines) + "\n"


def raises_only_patch_error(old: str, diff: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        top = Path(d)
        repo(top, {"x.py": "outside\n", "repo/f.py": old, "repo/sub/g.txt": "g\n"})
        before = snapshot(top)
        try:
            apply_patch(diff, top / "repo")
        except PatchError:
            assert snapshot(top) == before
        else:
            after = snapshot(top)
            assert {k: v for k, v in after.items() if not k.startswith("repo")} == \
                {k: v for k, v in before.items() if not k.startswith("repo")}


@settings(max_examples=120, deadline=None)
@given(case=mutated())
def test_mutated_diffs(case):
    raises_only_patch_error(*case)


@settings(max_examples=80, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("-+@ \n\tab/.,01\\`") | st.characters(),
                    max_size=200))
def test_arbitrary_text(text):
    raises_only_patch_error("a\nb\n", text)


# --- paths


@pytest.mark.parametrize("old,new", [
    ("/etc/passwd", "/etc/passwd"), ("../x.py", "../x.py"), ("a/../../x.py", "b/../../x.py"),
    ("/dev/null", "b/../x.py"), ("/dev/null", "/tmp/evil.py"), ("a/link/x.py", "b/link/x.py"),
    ("/dev/null", "b/link/new.py"), ("a//etc/passwd", "b//etc/passwd"),
])
def test_paths_outside_are_refused(tmp_path, old, new):
    outside = repo(tmp_path / "outside", {"x.py": "root\n"})
    root = repo(tmp_path / "repo", {"ok.py": "root\n"})
    (root / "link").symlink_to(outside, target_is_directory=True)
    before = snapshot(tmp_path)
    hunk = "@@ -0,0 +1 @@\n+evil\n" if old == "/dev/null" else "@@ -1 +1 @@\n-root\n+evil\n"
    # a good file first: it must not be written either
    diff = f"--- a/ok.py\n+++ b/ok.py\n@@ -1 +1 @@\n-root\n+fine\n--- {old}\n+++ {new}\n{hunk}"
    with pytest.raises(PatchError, match="refusing"):
        apply_patch(diff, root)
    assert snapshot(tmp_path) == before


def test_safe_path(tmp_path):
    assert safe_path(tmp_path, "src/x.py") == tmp_path.resolve() / "src" / "x.py"
    for bad in ["", ".", "/x", "../x", "src/../../x", "a\0b"]:
        with pytest.raises(PatchError):
            safe_path(tmp_path, bad)


def test_a_and_b_prefixes(tmp_path):
    repo(tmp_path, {"x.py": "top\n", "a/x.py": "in a\n", "a/only.py": "only\n"})
    apply_patch("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-top\n+TOP\n", tmp_path)  # git's reading
    apply_patch("--- a/x.py\n+++ a/x.py\n@@ -1 +1 @@\n-in a\n+IN A\n", tmp_path)  # no prefixes
    apply_patch("--- a/only.py\n+++ b/only.py\n@@ -1 +1 @@\n-only\n+ONLY\n", tmp_path)  # exists
    apply_patch("--- x.py\n+++ x.py\n@@ -1 +1 @@\n-TOP\n+Top\n", tmp_path)
    assert snapshot(tmp_path) == {"x.py": b"Top\n", "a": "dir", "a/x.py": b"IN A\n",
                                  "a/only.py": b"ONLY\n"}


# --- creating and deleting files, line endings


def test_create_and_delete(tmp_path):
    repo(tmp_path, {"old.py": "a\nb\n"})
    diff = ("diff --git a/new/mod.py b/new/mod.py\nnew file mode 100644\nindex 0000000..1111111\n"
            "--- /dev/null\n+++ b/new/mod.py\n@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n"
            "diff --git a/old.py b/old.py\ndeleted file mode 100644\n"
            "--- a/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n")
    done = apply_patch(diff, tmp_path)
    assert (done.files, done.mode) == (["new/mod.py", "old.py"], "strict")
    assert snapshot(tmp_path) == {"new": "dir", "new/mod.py": b"x = 1\ny = 2\n"}
    with pytest.raises(PatchError, match="new/mod.py: the diff creates it but it exists"):
        apply_patch(diff, tmp_path)
    with pytest.raises(PatchError, match="no such file"):
        apply_patch("--- a/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n", tmp_path)


def test_a_file_in_the_way_of_a_folder(tmp_path):
    repo(tmp_path, {"x": "x\n"})
    new = "--- /dev/null\n+++ b/{}\n@@ -0,0 +1 @@\n+y\n"
    for diff in [new.format("x/y"), new.format("z") + new.format("z/y"),
                 new.format("z/y") + new.format("z")]:
        with pytest.raises(PatchError, match="is a file|not a regular file"):
            apply_patch(diff, tmp_path)
        assert snapshot(tmp_path) == {"x": b"x\n"}
    # deleting x first makes room for a folder x
    apply_patch("--- a/x\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n" + new.format("x/y"), tmp_path)
    assert snapshot(tmp_path) == {"x": "dir", "x/y": b"y\n"}


def test_line_endings_kept(tmp_path):
    repo(tmp_path, {"w.txt": "a\r\nb\r\nc", "u.txt": "a\nb"})
    apply_patch("--- w.txt\n+++ w.txt\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
                "--- u.txt\n+++ u.txt\n@@ -1,2 +1,2 @@\n-a\n+A\n b\n", tmp_path)
    assert (tmp_path / "w.txt").read_bytes() == b"a\r\nB\r\nc"
    assert (tmp_path / "u.txt").read_bytes() == b"A\nb"


# --- parsing and extraction


def test_parse_tolerates_sloppy_headers():
    text = ("--- a/calc.py\t2024-01-01 10:00:00.000 +0100\n+++ b/calc.py 2024-01-02 11:00:00\n"
            "@@ -3 +3 @@ def add\n-x\n\\ No newline at end of file\n+y\n"
            "Some words after the diff.\n")
    [fp] = parse_diff(text)
    assert (fp.old_path, fp.new_path) == ("a/calc.py", "b/calc.py")
    [h] = fp.hunks
    assert (h.old_start, h.old_len, h.new_start, h.new_len) == (3, 1, 3, 1)
    assert h.lines == ["-x", "\\ No newline at end of file", "+y"]


@pytest.mark.parametrize("text,error", [
    ("just words\n", "no '---'/'[+]{3}' file headers"),
    ("@@ -1 +1 @@\n-a\n+b\n", "line 1: hunk without a '---'/'[+]{3}' file header"),
    ("--- a/x\n+++ b/x\n@@ -START,COUNT +START,COUNT @@\n-a\n", "line 3: unparseable hunk"),
    # a lone '---' ends the file before it: its hunk must not land on x
    ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n--- a/y\n@@ -1 +1 @@\n-c\n+d\n",
     "line 7: hunk without"),
])
def test_parse_errors(text, error):
    with pytest.raises(PatchError, match=error):
        parse_diff(text)


def test_extract_diff():
    fenced = f"Here is the fix:\n```diff\n{DIFF}```\nand a test:\n```patch\n{DIFF}```\nDone."
    assert extract_diff(fenced) == DIFF + DIFF
    assert extract_diff(f"```diff\n{DIFF}") == DIFF  # cut off before its closing fence
    assert extract_diff(f"The bug is in calc.py.\n\n{DIFF}") == DIFF
    assert extract_diff(f"Prose.\ndiff --git a/calc.py b/calc.py\n{DIFF}").startswith("diff --git")
    assert len(parse_diff(extract_diff(f"```\n{DIFF}```\nThat's all.\n"))[0].hunks[0].lines) == 3
    for text in ["No diff here.", "```python\nx = 1\n```", "--- a list item\n- another\n"]:
        with pytest.raises(PatchError, match="no diff found in the output"):
            extract_diff(text)
