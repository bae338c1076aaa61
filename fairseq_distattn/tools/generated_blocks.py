"""Results in the documentation are generated, never typed: each lives between
two markers that name the file it is copied from, and the command that writes
that file rewrites its block. A block may sit in ``README.md`` or in any page
under ``docs/``, and one file may be copied into several pages.
``tests/test_readme.py`` checks every block still equals its file.

The copy drops the file's own title (the page's section has one) and moves its
other headings down so that the highest of them sits one level under the
section the block is in (``####`` under a ``###`` section). A marker that says
``, up to its first section,`` after the file's name copies only what comes
before the file's first heading below its title (a page that wants a table without
the sections under it, such as the translation table without its ablations).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

REPO_ROOT = Path(__file__).resolve().parents[2]  # the repository of a checkout

BLOCK = re.compile(
    r"<!-- generated from (?P<source>\S+)(?P<first_part>, up to its first section,)? by `(?P<command>[^`]+)`; "
    r"edit that, not this -->\n"
    r"(?P<body>.*?)"
    r"<!-- end of generated (?P=source) -->\n",
    re.S,
)
HEADING = re.compile(r"(#{1,6}) ")


def documentation_pages(root: Path = REPO_ROOT) -> List[Path]:
    """README.md and every Markdown page under docs/: the pages that may hold blocks."""
    readme = [root / "README.md"] if (root / "README.md").is_file() else []
    return readme + sorted((root / "docs").rglob("*.md"))


def _headings(lines: List[str]) -> Iterator[Tuple[int, int]]:
    """``(index, level)`` of each Markdown heading outside code fences."""
    fence = False
    for index, line in enumerate(lines):
        if line.startswith("```"):
            fence = not fence
        elif not fence and HEADING.match(line):
            yield index, len(HEADING.match(line)[1])


def section_level(page_text: str, position: int) -> int:
    """Level of the heading that the text at ``position`` sits under (1 for none),
    not counting the headings inside generated blocks."""
    level = 1
    before = BLOCK.sub("", page_text[:position])
    for _, heading_level in _headings(before.splitlines()):
        level = heading_level
    return level


def readme_copy(markdown: str, section: int = 3, first_part: bool = False) -> str:
    """What a page shows of a results file, in a block under a heading of level
    ``section``; ``first_part``: only what precedes the file's first section."""
    lines = markdown.strip("\n").splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    headings = list(_headings(lines))
    if first_part and headings:
        lines, headings = lines[: headings[0][0]], []
    if headings:
        shift = section + 1 - min(level for _, level in headings)
        for index, level in headings:
            lines[index] = "#" * min(6, max(1, level + shift)) + lines[index][level:]
    return "\n".join(lines).strip("\n") + "\n"


def block_copy(match: re.Match, page_text: str, markdown: str) -> str:
    """What the block ``match`` of ``page_text`` shows of its file's ``markdown``."""
    return readme_copy(markdown, section_level(page_text, match.start()), bool(match["first_part"]))


def generated_blocks(readme_text: str) -> Dict[str, str]:
    """``{results file relative to the repository: the page's copy}``."""
    return {match["source"]: match["body"] for match in BLOCK.finditer(readme_text)}


def stale_blocks(page: Path) -> List[str]:
    """The files whose copy in ``page`` differs from what their file gives now."""
    text = page.read_text(encoding="utf-8")
    return [
        match["source"]
        for match in BLOCK.finditer(text)
        if match["body"] != block_copy(match, text, (REPO_ROOT / match["source"]).read_text(encoding="utf-8"))
    ]


def update_page(source: Path, page: Path) -> bool:
    """Rewrite the blocks of ``page`` copied from ``source`` (a file under the
    repository); False when the page has none."""
    relative = source.resolve().relative_to(REPO_ROOT).as_posix()
    text = page.read_text(encoding="utf-8")
    markdown = source.read_text(encoding="utf-8")
    found = False

    def replace(match):
        nonlocal found
        if match["source"] != relative:
            return match.group(0)
        found = True
        body = block_copy(match, text, markdown)
        start, end = match.start("body") - match.start(), match.end("body") - match.start()
        return match.group(0)[:start] + body + match.group(0)[end:]

    updated = BLOCK.sub(replace, text)
    if found and updated != text:
        page.write_text(updated, encoding="utf-8")
    return found


def update_pages(source: Path, pages: Optional[List[Path]] = None) -> List[Path]:
    """Rewrite the blocks copied from ``source`` in ``pages`` (default: README.md
    and docs/**/*.md); the pages that have one."""
    return [page for page in (documentation_pages() if pages is None else pages) if update_page(source, page)]
