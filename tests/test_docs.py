"""The documents a reader opens: every link in the README, DESIGN.md, the notes and the results
pages resolves (a file of the checkout, and a heading of it where the link names one), and the
README stays a manual of at most 26 KB."""
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "DESIGN.md", "NOTES.md"] + sorted(
    os.path.relpath(p, ROOT) for pattern in ("notes/*.md", "figures/results.md",
                                             "figures/results/*.md")
    for p in glob.glob(os.path.join(ROOT, pattern)))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as '-'."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: str) -> set:
    out, fenced = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith("#"):
                out.add(slug(line))
    return out


def links(path: str):
    fenced = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
                continue
            if not fenced:  # (code spans hold no links: `kernel[grid](*args)`)
                for m in LINK.finditer(re.sub(r"`[^`]*`", "``", line)):
                    yield m.group(1) or m.group(2)


@pytest.mark.parametrize("doc", DOCS)
def test_every_link_resolves(doc):
    here = os.path.dirname(os.path.join(ROOT, doc))
    bad = []
    for target in links(os.path.join(ROOT, doc)):
        if re.match(r"^[a-z]+:", target):  # (http:, https:, mailto:: outside the checkout)
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(here, path)) if path else os.path.join(ROOT, doc)
        if not os.path.exists(full):
            bad.append(f"{target}: no such file")
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            bad.append(f"{target}: no such heading")
    assert not bad, bad


def test_the_notes_are_split_by_topic_with_an_index():
    """NOTES.md is the index: each notes/ file listed with what was learned in it, and every
    section of every file listed once, dated."""
    index = open(os.path.join(ROOT, "NOTES.md"), encoding="utf-8").read()
    files = sorted(glob.glob(os.path.join(ROOT, "notes", "*.md")))
    assert len(files) >= 8
    sections = 0
    for path in files:
        name = os.path.basename(path)
        assert f"](notes/{name})" in index, name
        text = open(path, encoding="utf-8").read()
        for heading in re.findall(r"^## .*$", text, flags=re.M):
            sections += 1
            assert f"(notes/{name}#{slug(heading)})" in index, heading
        assert text.count("\n## ") + text.startswith("## ") == text.count("*Written 20")
    assert len(re.findall(r"\]\(notes/\w+\.md", index)) == sections + len(files)


def test_the_readme_is_a_manual_of_at_most_26_kb():
    assert os.path.getsize(os.path.join(ROOT, "README.md")) <= 26 * 1024
