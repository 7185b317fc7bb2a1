"""Unified diffs in model output: find them, parse them, apply them to a folder.

The `code` role's model (often small and sloppy) writes a unified diff; the `run` role applies
it to a scratch copy of the repository. `apply_patch` first applies the diff as written
(strict); when that fails it retries leniently, tolerating what small models get wrong: line
numbers, blank context lines, trailing whitespace, forgotten '+' marks. Either way every hunk
of every file applies, or nothing is written.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

__all__ = ["Applied", "FilePatch", "Hunk", "PatchError", "apply_patch", "extract_diff",
           "parse_diff", "safe_path"]


class PatchError(Exception):
    """A diff that can't be found, parsed or applied; the message says what and where."""


@dataclass
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[str]  # with their ' ', '-', '+' or '\' prefix, or none where the model forgot it


@dataclass
class FilePatch:
    old_path: str | None  # as written, a/ and b/ included; None for /dev/null
    new_path: str | None
    hunks: list[Hunk] = field(default_factory=list)


@dataclass
class Applied:
    files: list[str]  # paths relative to the root, in the order the diff touches them
    mode: str  # "strict" | "lenient"
    notes: list[str] = field(default_factory=list)  # why strict failed, what leniency was used


_FENCE = re.compile(r"^```[ \t]*(?:diff|patch)\b[^\n]*\n(.*?)(?=^```[ \t\r]*$|\Z)", re.M | re.S)
_BARE = re.compile(r"^(?:diff --git |--- [^\n]*\n\+\+\+ )", re.M)
_HUNK = re.compile(r"@@\s*-(\d+)(?:,(\d+))?\s+\+(\d+)(?:,(\d+))?\s*@@")
_STAMP = re.compile(r"\s+\d{4}-\d\d-\d\d[ T][\d:.]+(?:\s*[+-]\d{4})?$")


def extract_diff(text: str) -> str:
    """The diff inside model output: the contents of ```diff / ```patch fences (all of them,
    concatenated), else the text from the first '--- ' line / 'diff --git' line."""
    fenced = "".join(m[1] if m[1].endswith("\n") else m[1] + "\n" for m in _FENCE.finditer(text))
    if fenced.strip():
        return fenced
    if m := _BARE.search(text):
        return text[m.start():]
    raise PatchError("no diff found in the output")


def _path(s: str) -> str | None:
    s = _STAMP.sub("", s.split("\t")[0]).strip()  # diff and git put a tab before timestamps
    if len(s) > 1 and s[0] == s[-1] == '"':
        s = s[1:-1]
    return None if s == "/dev/null" else s


def _file_header(lines: list[str], i: int) -> bool:
    return lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")


def _read_hunk(lines: list[str], i: int, m: re.Match) -> tuple[Hunk, int]:
    """The hunk whose header m is lines[i], and the index of the line after it."""
    h = Hunk(int(m[1]), 1 if m[2] is None else int(m[2]), int(m[3]),
             1 if m[4] is None else int(m[4]), [])
    old = new = 0
    j = i + 1
    while j < len(lines):
        line = lines[j]
        counted = old < h.old_len or new < h.new_len  # within what the header announced
        if line.startswith(("@@", "diff --git", "```")):
            break
        # Inside the counts '--- x' '+++ y' may be a removed and an added line, so a header
        # there needs a hunk after it and counts that were wrong anyway.
        if _file_header(lines, j) and (not counted or (
                lines[j + 2:j + 3] and lines[j + 2].startswith("@@")
                and (h.old_len - old, h.new_len - new) != (1, 1))):
            break
        # Past the counts only prefixed lines go on (prose after a bare diff stays out)
        # and a lone '---' or '+++' is a header.
        if not counted and (not line.startswith((" ", "-", "+", "\\"))
                            or line.startswith(("--- ", "+++ "))):
            break
        h.lines.append(line)
        if line.startswith("-"):
            old += 1
        elif line.startswith("+"):
            new += 1
        elif not line.startswith("\\"):
            old, new = old + 1, new + 1
        j += 1
    return h, j


def parse_diff(text: str) -> list[FilePatch]:
    """The file diffs in text. Tolerant of what tools and models vary (timestamps after paths,
    '@@ -3 +3 @@', junk between files, wrong counts); strict where guessing could patch the
    wrong file: no file headers, or an unparseable hunk header, raise PatchError."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines[-1] == "":
        lines.pop()
    files: list[FilePatch] = []
    cur = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if _file_header(lines, i):
            cur = FilePatch(_path(line[4:]), _path(lines[i + 1][4:]))
            files.append(cur)
            i += 2
        elif line.startswith("@@"):
            if not (m := _HUNK.match(line)):
                raise PatchError(f"diff line {i + 1}: unparseable hunk header {line!r}")
            if cur is None:
                raise PatchError(f"diff line {i + 1}: hunk without a '---'/'+++' file header")
            hunk, i = _read_hunk(lines, i, m)
            cur.hunks.append(hunk)
        else:
            # Between files ('index ...', prose) lines are skipped, but a lone '---' or '+++'
            # or a 'diff --git' ends the file, so that hunks can't land on the one before.
            if line.startswith(("--- ", "+++ ", "diff --git")):
                cur = None
            i += 1
    if not files:
        raise PatchError("no '---'/'+++' file headers in the diff")
    return files


def safe_path(root: Path, rel: str) -> Path:
    """root/rel, resolved, refusing anything that is or leads outside root."""
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or ".." in p.parts:
        raise PatchError(f"{rel!r}: refusing an empty, absolute or '..' path")
    root = Path(root).resolve()
    try:
        target = (root / p).resolve()  # follows symlinks
        too_long = any(len(os.fsencode(part)) > 255 for part in p.parts)
    except (OSError, RuntimeError, ValueError) as e:  # symlink loop, NUL byte, unencodable
        raise PatchError(f"{rel!r}: bad path ({e})") from None
    if too_long or target == root or not target.is_relative_to(root):
        raise PatchError(f"{rel!r}: refusing a path outside the repository")
    return target


@dataclass
class _Text:
    lines: list[str]
    eol: bool = True  # ends with a newline
    crlf: bool = False


def _read(path: Path, name: str) -> _Text | None:
    if not path.exists():
        return None
    if not path.is_file():
        raise PatchError(f"{name}: not a regular file")
    try:
        text = path.read_bytes().decode()
    except (OSError, UnicodeDecodeError) as e:
        raise PatchError(f"{name}: can't read it as UTF-8 text ({e})") from None
    lines = text.split("\n")
    eol = lines[-1] == ""
    if eol:
        lines.pop()
    crlf = "\r\n" in text
    return _Text([line.removesuffix("\r") for line in lines] if crlf else lines, eol, crlf)


def _strict(h: Hunk, lines: list[str], where: str) -> tuple[int, int, list[str]]:
    old, new = [], []
    for line in h.lines:
        tag, text = (line[:1], line[1:]) if line else (" ", "")  # "": a trimmed blank context
        if tag in " -":
            old.append(text)
        if tag in " +":
            new.append(text)
        if tag not in " -+\\":
            raise PatchError(f"{where}: line without a ' ', '-' or '+' mark: {line!r}")
    if (len(old), len(new)) != (h.old_len, h.new_len):
        raise PatchError(f"{where}: header counts {h.old_len},{h.new_len} but the hunk has "
                         f"{len(old)} old and {len(new)} new lines")
    start = h.old_start - 1 if old else h.old_start
    if start < 0 or lines[start:start + len(old)] != old:
        raise PatchError(f"{where}: its lines are not in the file at line {start + 1}")
    return start, start + len(old), new


def _fits(tag: str, text: str, line: str) -> bool:
    # a ' ' line may be an unprefixed line starting with a space: try it whole too
    return line.rstrip() == text.rstrip() or tag == " " and line.rstrip() == (" " + text).rstrip()


def _match(ops: list[tuple[str, str]], lines: list[str], p: int) -> tuple[int, list[str], dict]:
    """Lay the hunk over the file from line p: (end, new lines, what leniency it took)."""
    i, new = p, []
    took = {"fuzzy": False, "anchored": False, "context": 0, "added": 0}
    for tag, text in ops:
        if tag == "+":
            new.append(text)
        elif not text.strip() and tag in " -":  # a blank line the file may lack
            if i < len(lines) and not lines[i].strip():
                if tag == " ":
                    new.append(lines[i])
                i += 1
            else:
                took["fuzzy"] = True
        else:
            j = i  # past blank lines the diff left out (not before the hunk's first line)
            while i > p and j < len(lines) and not lines[j].strip():
                j += 1
            k = next((k for k in (i, j) if k < len(lines) and _fits(tag, text, lines[k])), None)
            if k is None:
                # An unprefixed line the file doesn't have: the model forgot its '+'. An
                # indented one reads as ' ' plus an odd indent ('    x' as ' ', '   x').
                if tag == "?" or tag == " " and (len(text) - len(text.lstrip(" "))) % 2:
                    new.append(text if tag == "?" else " " + text)
                    took["added"] += 1
                    continue
                seen = f"line {i + 1} is {lines[i]!r}" if i < len(lines) else "the file ends"
                raise PatchError(f"{seen} where the diff has {text!r}")
            unmarked = tag == "?" or lines[k].rstrip() != text.rstrip()
            took["context"] += unmarked
            took["fuzzy"] |= k > i or lines[k] != text and not unmarked
            took["anchored"] |= bool(text.strip())
            new += lines[i:k] + ([] if tag == "-" else [lines[k]])
            i = k + 1
    return i, new, took


def _lenient(h: Hunk, lines: list[str], where: str, notes: list[str]):
    ops = [(" ", "") if not line else (line[0], line[1:]) if line[0] in " -+" else ("?", line)
           for line in h.lines if not line.startswith("\\")]
    want = h.old_start - 1 if any(t != "+" for t, _ in ops) else h.old_start
    stated = min(max(want, 0), len(lines))
    fits, why = [], None
    for p in range(len(lines) + 1):
        try:
            fit = _match(ops, lines, p)
        except PatchError as e:
            why = e if p == stated else why
            continue
        if fit[2]["anchored"] or p == stated:  # only blank or added lines: no evidence elsewhere
            # Fewest unmarked lines taken as added (a line matching is better evidence than a
            # line assumed missing), then nearest to the stated line, then earliest.
            fits.append(((fit[2]["added"], abs(p - stated), p), fit))
    if not fits:
        raise PatchError(f"{where}: doesn't fit anywhere in the file (at line {stated + 1}: {why})")
    (_, _, p), (end, new, took) = min(fits)
    done = [f"applied at line {p + 1}, not {want + 1}"] if p != want else []
    done += ["ignored whitespace and blank-line differences"] if took["fuzzy"] else []
    done += [f"took {n} unmarked line(s) as {kind}" for kind in ("context", "added")
             if (n := took[kind])]
    if done:
        notes.append(f"{where}: " + "; ".join(done))
    return p, end, new


def _apply_hunks(hunks: list[Hunk], text: _Text, name: str, notes: list[str] | None) -> _Text:
    spans = []
    for k, h in enumerate(hunks, 1):
        where = f"{name} hunk {k}"
        span = _strict(h, text.lines, where) if notes is None else \
            _lenient(h, text.lines, where, notes)
        spans.append((span, k))
    out, pos = [], 0
    for (start, end, new), k in sorted(spans, key=lambda s: s[0][:2]):
        if start < pos:
            raise PatchError(f"{name} hunk {k}: overlaps another hunk")
        out += text.lines[pos:start] + new
        pos = end
    out += text.lines[pos:]
    # '\ No newline at end of file' after a line: its side(s) ended without a newline
    marks = [before[:1] for h in hunks for before, line in zip(h.lines, h.lines[1:])
             if line.startswith("\\")]
    eol = False if any(m != "-" for m in marks) else bool(marks) or text.eol
    return _Text(out, eol, text.crlf)


def _target(fp: FilePatch, root: Path, exists) -> Path:
    """The file fp patches. git writes a/ and b/ before paths, other tools don't, and a
    repository may have a folder named 'a': of the readings, the first whose file exists,
    git's first when every path carries its prefix."""
    old, new = fp.old_path, fp.new_path
    if old is None and new is None:
        raise PatchError("a file diff with /dev/null on both sides")
    git = (old is None or old.startswith("a/")) and (new is None or new.startswith("b/"))
    raw = [p for p in (old, new) if p is not None]
    stripped = [p[2:] for p in raw if p.startswith(("a/", "b/"))]
    paths = [safe_path(root, p) for p in dict.fromkeys(stripped + raw if git else raw + stripped)]
    if old is None:  # a new file: the first reading whose folder exists
        return next((p for p in paths if p.parent.is_dir()), paths[0])
    if found := next((p for p in paths if exists(p)), None):
        return found
    raise PatchError(f"{old}: no such file")


def _apply_all(patches: list[FilePatch], root: Path, notes: list[str] | None) -> dict:
    """{path: new text, or None to delete} for every file touched; writes nothing. Strict
    when notes is None, else lenient, noting there what leniency it took."""
    state: dict[Path, _Text | None] = {}
    touched: dict[Path, None] = {}

    def exists(p: Path) -> bool:
        return state[p] is not None if p in state else p.is_file()

    for fp in patches:
        path = _target(fp, root, exists)
        name = str(path.relative_to(root))
        if path not in state:
            state[path] = _read(path, name)
        text = state[path]
        if fp.old_path is None:
            if text is not None:
                raise PatchError(f"{name}: the diff creates it but it exists")
            text = _Text([])
        if not fp.hunks:
            raise PatchError(f"{name}: no hunks")
        new = _apply_hunks(fp.hunks, text, name, notes)
        if fp.new_path is None and new.lines:
            if notes is None:
                raise PatchError(f"{name}: the diff deletes it but leaves {len(new.lines)} lines")
            notes.append(f"{name}: deleted with {len(new.lines)} lines the diff didn't list")
        state[path] = None if fp.new_path is None else new
        touched[path] = None
    for p in touched:  # so that writing can't fail halfway: no file where a folder must be
        q = next((q for q in p.parents if q != root and exists(q)), None)
        if state[p] is not None and q is not None:
            raise PatchError(f"{p.relative_to(root)}: {q.relative_to(root)} is a file")
    return {p: state[p] for p in touched}


def apply_patch(diff_text: str, root: Path) -> Applied:
    """Apply to files under root. First strict (context must match exactly at the stated line
    numbers), else lenient (each hunk where its context and removed lines fit, nearest to the
    stated line, ignoring trailing whitespace and blank-line differences; an unmarked line is
    context where it matches the file, else added). All or nothing: files are written only
    after every hunk of every file has applied; a failure raises PatchError naming the file
    and hunk."""
    patches = parse_diff(diff_text)
    root = Path(root).resolve()
    try:
        files, mode, notes = _apply_all(patches, root, None), "strict", []
    except PatchError as e:
        notes = [f"strict: {e}"]
        files, mode = _apply_all(patches, root, notes), "lenient"
    for path, text in sorted(files.items(), key=lambda f: f[1] is not None):  # deletions first
        if text is None:
            path.unlink(missing_ok=True)
            continue
        body = "\n".join(text.lines) + ("\n" if text.eol and text.lines else "")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes((body.replace("\n", "\r\n") if text.crlf else body).encode())
    return Applied([str(p.relative_to(root)) for p in files], mode, notes)
