"""What each of the agent's four roles is told. Every call starts a fresh chat."""

from __future__ import annotations

# Semantic blocks of the agent's outputs, passed to the drafter (structure isolation).
STRUCTURE = [["```diff", "```"], ["```python", "```"]]

LOCALIZE = """You are the localize role of a coding agent.
Read the issue and the list of files of the repository.
Answer with the paths of the files that must change to fix the issue, one per line, and nothing else."""

CODE = """You are the code role of a coding agent.
Fix the issue by editing the files shown. Answer with one unified diff inside a ```diff fence:
--- a/pkg/module.py
+++ b/pkg/module.py
@@ -12,3 +12,3 @@ def name():
 unchanged line
-removed line
+added line
Use the real path and line numbers, keep a few unchanged lines around each change, and write
nothing after the fence."""

RUN = """You are the run role of a coding agent.
You get a patch and the output of applying it and running the tests.
Report whether the patch applied, which tests failed, and the exact error lines, quoting them."""

REVIEW = """You are the review role of a coding agent.
Judge whether the patch fixes the issue, given the test report.
Answer with "VERDICT: accept" or "VERDICT: reject" on the first line, then a short paragraph of
feedback for the next attempt."""


def fenced(text: str, lang: str = "") -> str:
    return f"```{lang}\n{text.rstrip()}\n```"


def localize(issue: str, listing: str) -> list[dict]:
    return [{"role": "system", "content": LOCALIZE},
            {"role": "user", "content": f"Issue:\n{issue.strip()}\n\nFiles:\n{listing}"}]


def code(issue: str, files: dict[str, str], previous: str | None = None, report: str = "",
         feedback: str = "") -> list[dict]:
    """The first attempt, or (with `previous`, the last patch) a retry with its results."""
    shown = "\n\n".join(f"File {path}:\n{fenced(text, 'python')}" for path, text in files.items())
    user = f"Issue:\n{issue.strip()}\n\n{shown}"
    if previous is not None:
        user += (f"\n\nYour previous patch:\n{fenced(previous, 'diff')}\n\n"
                 f"Test report:\n{report.strip()}\n\n"
                 f"Reviewer feedback:\n{feedback.strip()}\n\n"
                 "Write a corrected patch.")
    return [{"role": "system", "content": CODE}, {"role": "user", "content": user}]


def run(diff: str, tool_output: str) -> list[dict]:
    return [{"role": "system", "content": RUN},
            {"role": "user", "content": f"Patch:\n{fenced(diff, 'diff')}"},
            {"role": "tool", "content": tool_output}]


def review(issue: str, diff: str, passed: bool, report: str) -> list[dict]:
    status = "all tests passed" if passed else "tests failed"
    return [{"role": "system", "content": REVIEW},
            {"role": "user", "content": f"Issue:\n{issue.strip()}\n\n"
                                        f"Patch:\n{fenced(diff, 'diff')}\n\n"
                                        f"Result: {status}.\nTest report:\n{report.strip()}"}]
