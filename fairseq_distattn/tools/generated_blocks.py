"""Results in the README are generated, never typed: each lives between two
markers that name the results file it is copied from, and a harness's
``--report`` rewrites its block. ``tests/test_readme.py`` checks every block
still equals its file.

The copy drops the file's own title (the README section has one) and moves
its headings two levels down, under the README's ``###`` section.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict

REPO_ROOT = Path(__file__).resolve().parents[2]  # the repository of a checkout

README = REPO_ROOT / "README.md"
BLOCK = re.compile(
    r"<!-- generated from (?P<source>\S+) by `(?P<command>[^`]+)`; edit that, not this -->\n"
    r"(?P<body>.*?)"
    r"<!-- end of generated (?P=source) -->\n",
    re.S,
)


def readme_copy(markdown: str) -> str:
    """What the README shows of a results file."""
    lines = markdown.strip("\n").splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    demoted = ["##" + line if re.match(r"#{1,4} ", line) else line for line in lines]
    return "\n".join(demoted).strip("\n") + "\n"


def generated_blocks(readme_text: str) -> Dict[str, str]:
    """``{results file relative to the repository: the README's copy}``."""
    return {match["source"]: match["body"] for match in BLOCK.finditer(readme_text)}


def update_readme(source: Path, readme: Path = README) -> bool:
    """Rewrite the README block copied from ``source`` (a file under the
    repository); False when the README has no block for it."""
    relative = source.resolve().relative_to(REPO_ROOT).as_posix()
    text = readme.read_text(encoding="utf-8")
    body = readme_copy(source.read_text(encoding="utf-8"))
    found = False

    def replace(match):
        nonlocal found
        if match["source"] != relative:
            return match.group(0)
        found = True
        start, end = match.start("body") - match.start(), match.end("body") - match.start()
        return match.group(0)[:start] + body + match.group(0)[end:]

    updated = BLOCK.sub(replace, text)
    if found and updated != text:
        readme.write_text(updated, encoding="utf-8")
    return found
