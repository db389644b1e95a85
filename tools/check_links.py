#!/usr/bin/env python3
"""Check the relative links of README.md and docs/**/*.md.

Every link or image whose target is not a URL must name a file or folder that exists, and a link
with an anchor (`page.md#section`, or `#section` in the same page) must match a heading of the
target page as GitHub spells its anchors: the heading's text lowercased, every character other
than a letter, a digit, '-', '_' or a space removed, each space turned into '-', and a repeated
anchor suffixed -1, -2, ... Links inside code (fenced blocks and `inline code`) are not links.

    python3 tools/check_links.py        # from anywhere; exit 0 and "N links ok", or exit 1
                                        # and one line per broken link: file:line: target: why
"""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the text may hold one level of [brackets]
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"  # [text] or ![alt]
    r"\(\s*<?([^()\s<>]*(?:\([^()\s]*\)[^()\s<>]*)*)>?"  # (target, which may hold (parentheses)
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)"  # an optional "title")
)
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ID = re.compile(r"<a\s[^>]*?(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)
PLAIN_NOT = re.compile(r"^\s*(?:[-*+]\s|\d+[.)]\s|\||#)")  # a list item, table row or heading
URL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")


def pages() -> list[Path]:
    found = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("**/*.md"))
    return [p for p in found if p.is_file()]


def rendered(text: str) -> str:
    """A heading's text as GitHub renders it, near enough for its anchor."""
    text = INLINE_CODE.sub(lambda m: m.group(2).strip(), text)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # HTML tags
    return text.strip()


def slug(text: str) -> str:
    kept = []
    for ch in rendered(text).lower():
        if ch in "-_ " or unicodedata.category(ch)[0] in "LNM" or unicodedata.category(ch) == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def scan(path: Path) -> tuple[set[str], list[tuple[int, str]]]:
    """The page's anchors, and its link targets with their line numbers."""
    anchors: set[str] = set()
    counts: dict[str, int] = {}
    links: list[tuple[int, str]] = []

    def add_heading(text: str) -> None:
        base = slug(text)
        n = counts.get(base, 0)
        counts[base] = n + 1
        anchors.add(base if n == 0 else f"{base}-{n}")

    fence: str | None = None
    previous = ""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        opened = FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            previous = ""
            continue
        if opened:
            fence = opened.group(1)
            previous = ""
            continue
        anchors.update(HTML_ID.findall(line))
        heading = ATX.match(line)
        if heading:
            add_heading(heading.group(2) or "")
        elif SETEXT.match(line) and previous.strip() and not PLAIN_NOT.match(previous):
            add_heading(previous)  # a paragraph line underlined with === or ---
        definition = REF_DEF.match(line)
        if definition:
            links.append((number, definition.group(1)))
        else:
            code_free = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)
            links.extend((number, m.group(1)) for m in INLINE_LINK.finditer(code_free))
        previous = line
    return anchors, links


def main() -> int:
    scanned: dict[Path, tuple[set[str], list[tuple[int, str]]]] = {}

    def anchors_of(page: Path) -> set[str]:
        if page not in scanned:
            scanned[page] = scan(page)
        return scanned[page][0]

    broken: list[str] = []
    checked = 0
    for page in pages():
        _, links = scanned.setdefault(page, scan(page))
        for number, target in links:
            if not target or URL.match(target):
                continue
            checked += 1
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / unquote(file_part)).resolve() if file_part else page
            shown = dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest
            if not dest.exists():
                broken.append(f"{where}: no such file {shown}")
            elif anchor and dest.suffix.lower() == ".md" and unquote(anchor) not in anchors_of(dest):
                broken.append(f"{where}: no heading with anchor #{anchor} in {shown}")
    for line in broken:
        print(line)
    if broken:
        print(f"{len(broken)} of {checked} links broken")
        return 1
    print(f"{checked} links ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
