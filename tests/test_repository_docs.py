"""The repository documents itself: no text cites a document a user who clones it cannot read.

Every convention the numbers depend on is in ``docs/conventions.md``, under stable section
anchors (``<a id="s-2"></a>`` ...). These tests scan every text file of the repository (the
files git tracks plus untracked files it does not ignore; without git, a walk of the tree) for
citations of the team's private specification and papers, and check that every
``docs/conventions.md#<anchor>`` cited anywhere names an anchor the document has.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from uqmetrics import CONVENTIONS

ROOT = Path(__file__).resolve().parents[1]
CONVENTIONS_MD = ROOT / "docs" / "conventions.md"

#: The section anchors the document must keep (citations in docstrings, CLI help texts and the
#: attrs of result files written by earlier versions use them), besides each vision protocol's
#: (:func:`required_anchors`).
REQUIRED_ANCHORS = (
    "r-1", "r-2", "r-3", "r-3b", "r-4", "r-5",
    "s-1", "s-2", "s-3", "s-4", "s-5", "s-6",
    "v-0",
)


def required_anchors() -> list[str]:
    """:data:`REQUIRED_ANCHORS` and the section of every registered vision protocol
    (:attr:`uqvision.protocols.Protocol.section`: ``v-1`` ...), read from the registry, so that
    a protocol added there must bring its section."""
    from uqvision.protocols import VISION_PROTOCOLS

    sections = [p.section for p in VISION_PROTOCOLS.values()]
    assert all(sections), f"protocols without a section: {VISION_PROTOCOLS.names()}"
    return [*REQUIRED_ANCHORS, *sections]

# The forbidden words are assembled from pieces so that this file does not match itself.
_SPEC = "PROTO" + "COLS"
#: Citations of documents outside the repository: (pattern, what it is).
FORBIDDEN = (
    # the bare upper-case word: "<SPEC>.md", "<SPEC> V.3", "<SPEC> conventions" ... (identifiers
    # such as CALIBRATION_<SPEC> are not matched: "_" is a word character)
    (re.compile(r"\b" + _SPEC + r"\b"),
     "the private specification (cite docs/conventions.md#<id>)"),
    (re.compile(r"\bseed[ _-]+papers?\b", re.IGNORECASE),
     "a paper by its private seed number (cite authors, year and title)"),
    (re.compile(r"\bhand" + r"book\b", re.IGNORECASE),
     "the team's private guide (cite docs/conventions.md#<id>)"),
    (re.compile("/work" + r"/shared\b"), "a path of the private workspace"),
)
#: A citation of a section of the conventions document.
CITATION = re.compile(r"conventions\.md#([A-Za-z0-9_-]+)")
#: An explicit HTML anchor.
ANCHOR = re.compile(r"""<a\s+(?:id|name)\s*=\s*["']([^"']+)["']""")

#: Folders a walk of the tree never enters (what .gitignore keeps out of git).
_SKIP_DIRS = {".git", ".tox", ".venv", "venv", "__pycache__", ".hypothesis", ".pytest_cache",
              ".ruff_cache", ".mypy_cache", "build", "dist", "results", ".whl", "node_modules"}
_SKIP_ROOT_DIRS = {"out"}


def _git_files(root: Path) -> list[Path] | None:
    """Tracked files plus untracked files git does not ignore; None without git or a checkout."""
    try:
        proc = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    names = [n for n in proc.stdout.decode("utf-8", "surrogateescape").split("\0") if n]
    return sorted({root / n for n in names if (root / n).is_file()})


def _walked_files(root: Path) -> list[Path]:
    """Every file under ``root``, outside the folders of :data:`_SKIP_DIRS`."""
    out = []
    for here, dirs, files in os.walk(root):
        top = Path(here) == root
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")
                         and not (top and d in _SKIP_ROOT_DIRS))
        out += [Path(here) / f for f in files]
    return sorted(p for p in out if p.is_file())


def repository_files(root: Path = ROOT) -> list[Path]:
    """The repository's files: from git when it is available, else by walking the tree."""
    files = _git_files(root)
    return _walked_files(root) if files is None else files


def read_text(path: Path) -> str | None:
    """The file's text, or None for a binary (NUL bytes or not UTF-8) file."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _texts(root: Path = ROOT) -> dict[str, str]:
    texts = {}
    for path in repository_files(root):
        text = read_text(path)
        if text is not None:
            texts[path.relative_to(root).as_posix()] = text
    return texts


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return _texts()


def anchors() -> list[str]:
    return ANCHOR.findall(CONVENTIONS_MD.read_text(encoding="utf-8"))


def _line(text: str, pos: int) -> tuple[int, str]:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text.count("\n", 0, pos) + 1, text[start:end if end >= 0 else None].strip()


def test_the_scan_sees_the_repository(texts):
    for name in ("README.md", "docs/conventions.md", "tests/test_repository_docs.py",
                 "shared/src/uqmetrics/metrics/conventions.py"):
        assert name in texts, f"{name} was not scanned"


def test_no_text_cites_a_document_outside_the_repository(texts):
    found = []
    for name, text in texts.items():
        for pattern, what in FORBIDDEN:
            for m in pattern.finditer(text):
                line, content = _line(text, m.start())
                found.append(f"{name}:{line}: {what}: {content[:120]}")
    assert not found, "citations of documents a user cannot read:\n" + "\n".join(found)


def test_the_conventions_document_keeps_every_section_anchor():
    ids = anchors()
    duplicates = sorted({a for a in ids if ids.count(a) > 1})
    assert not duplicates, f"docs/conventions.md repeats the anchors {duplicates}"
    missing = [a for a in required_anchors() if a not in ids]
    assert not missing, f"docs/conventions.md lacks the section anchors {missing}"


def test_every_cited_section_anchor_exists(texts):
    ids = set(anchors())
    bad = []
    n_citations = 0
    for name, text in texts.items():
        for m in CITATION.finditer(text):
            n_citations += 1
            if m.group(1) not in ids:
                line, content = _line(text, m.start())
                bad.append(f"{name}:{line}: #{m.group(1)}: {content[:120]}")
    assert n_citations > 0, "no citation of docs/conventions.md found: is the scan working?"
    assert not bad, (f"citations of anchors docs/conventions.md does not have (it has "
                     f"{sorted(ids)}):\n" + "\n".join(bad))


def test_every_section_named_by_uqmetrics_conventions_exists():
    """The prefix of each ``uqmetrics.CONVENTIONS`` entry (``S.1:``, ``S.6/R.4:``) names sections
    of docs/conventions.md."""
    ids = set(anchors())
    bad = {}
    for metric, text in CONVENTIONS.items():
        prefix = text.split(":", 1)[0]
        sections = [s.strip() for s in prefix.split("/")]
        for s in sections:
            m = re.fullmatch(r"([RSV])\.(\d+b?)", s)
            if m is None or f"{m[1].lower()}-{m[2]}" not in ids:
                bad[metric] = text
    assert not bad, f"CONVENTIONS entries naming no section of docs/conventions.md: {bad}"


def test_the_scan_works_without_git(monkeypatch):
    """Without git (or outside a checkout) the tree is walked; it finds every file git lists."""
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert _git_files(ROOT) is None
    walked = set(repository_files(ROOT))
    monkeypatch.undo()
    listed = _git_files(ROOT)
    if listed is None:
        pytest.skip("git is not available here: nothing to compare the walk with")
    missing = sorted(p.relative_to(ROOT).as_posix() for p in set(listed) - walked)
    assert not missing, f"the walk misses files git lists: {missing[:20]}"


def test_the_patterns_catch_what_they_are_for():
    spec = _SPEC
    cases = [f"see {spec}.md", f"({spec} V.3)", f"{spec} conventions", "seed " + "paper 002",
             "the Hand" + "book's page", "/work" + "/shared/x"]
    for case in cases:
        assert any(p.search(case) for p, _ in FORBIDDEN), case
    for fine in (f"CALIBRATION_{spec}", f"SCORE_{spec}.names()", "docs/conventions.md#v-3",
                 "protocols", "seeded paper"):
        assert not any(p.search(fine) for p, _ in FORBIDDEN), fine
    assert CITATION.findall("see docs/conventions.md#r-3b, and (docs/conventions.md#s-2).") \
        == ["r-3b", "s-2"]
