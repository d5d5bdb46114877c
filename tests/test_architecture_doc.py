"""docs/architecture.md stays true to the code: its module map names every package and top-level
module of toolkit/ and only paths that exist, its layer diagram names every layer of the enforced
contract (tests/layering.py), and its list of files over 800 lines is exactly the files that are,
each with a reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import layering

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
LIMIT = 800  # lines
SLACK = 25  # a stated size may be this many lines off (small edits need no doc change)

_PATH = re.compile(r"`(toolkit/[^`\s]*)`")
_BIG = re.compile(r"^- `(toolkit/[^`]+\.py)` \((\d+) lines\): (.+)$", re.M)


def _table(text: str) -> str:
    """The module map: the first table of the document."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| piece |"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return "\n".join(lines[start:end])


def _units(root: Path) -> set[str]:
    """toolkit's packages (`toolkit/x/`) and top-level modules (`toolkit/x.py`)."""
    out = {f"toolkit/{p.name}/" for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    out |= {f"toolkit/{p.name}" for p in root.glob("*.py") if p.name != "__init__.py"}
    return out


def _exists(path: str, repo: Path) -> bool:
    """A documented path exists; a placeholder (`<flow>`, `*.vN.txt`) checks the part before it."""
    m = re.search(r"[<*]", path)
    if m:
        path = path[: m.start()].rsplit("/", 1)[0]
    return (repo / path).exists()


def map_problems(text: str, repo: Path = REPO) -> list[str]:
    table = _table(text)
    named = set(_PATH.findall(table))
    out = []
    for unit in sorted(_units(repo / "toolkit")):
        if not any(p == unit or p.startswith(unit) or p == unit.rstrip("/") for p in named):
            out.append(f"{unit} is not in the module map")
    for path in sorted(set(_PATH.findall(text))):
        if not _exists(path, repo):
            out.append(f"{path} is named but does not exist")
    diagram = text[text.index("## Layers"):]
    diagram = diagram[diagram.index("```") + 3:]
    diagram = diagram[: diagram.index("```")]
    words = set(re.findall(r"[a-z_0-9]+", diagram))
    for layer in layering.LAYERS:
        for name in layer:
            if name and name not in words:
                out.append(f"layer diagram lacks {name!r} (tests/layering.py LAYERS)")
    return out


def size_problems(text: str, repo: Path = REPO) -> list[str]:
    listed = {m.group(1): (int(m.group(2)), m.group(3).strip()) for m in _BIG.finditer(text)}
    actual = {}
    for p in sorted((repo / "toolkit").rglob("*.py")):
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > LIMIT:
            actual[p.relative_to(repo).as_posix()] = n
    out = [f"{p} has {n} lines (> {LIMIT}) but is not listed with a reason" for p, n in actual.items()
           if p not in listed]
    for p, (n, reason) in listed.items():
        if p not in actual:
            out.append(f"{p} is listed as over {LIMIT} lines but is not (any more)")
        elif abs(actual[p] - n) > SLACK:
            out.append(f"{p} is listed with {n} lines, has {actual[p]}")
        if len(reason) < 20:
            out.append(f"{p}: no real reason given ({reason!r})")
    return out


def test_module_map_matches_the_code():
    assert map_problems(DOC.read_text(encoding="utf-8")) == []


def test_size_claims_match_the_code():
    assert size_problems(DOC.read_text(encoding="utf-8")) == []


@pytest.fixture
def fake_repo(tmp_path):
    """A repository with two packages, one top-level module and one big file."""
    (tmp_path / "toolkit" / "envs").mkdir(parents=True)
    (tmp_path / "toolkit" / "envs" / "__init__.py").write_text("")
    (tmp_path / "toolkit" / "io").mkdir()
    (tmp_path / "toolkit" / "io" / "__init__.py").write_text("")
    (tmp_path / "toolkit" / "io" / "big.py").write_text("x = 1\n" * 900)
    (tmp_path / "toolkit" / "schema.py").write_text("")
    return tmp_path


def _doc(rows: str, big: str) -> str:
    layers = " ".join(n for layer in layering.LAYERS for n in layer if n)
    return (f"# A\n\n| piece | file | job |\n|---|---|---|\n{rows}\n\n## Layers\n\n```\n{layers}\n```\n\n{big}\n")


def test_map_check_catches_a_missing_package_and_a_dead_path(fake_repo):
    good = "| io | `toolkit/io/` | x |\n| envs | `toolkit/envs/` | x |\n| schema | `toolkit/schema.py` | x |"
    assert map_problems(_doc(good, ""), fake_repo) == []
    missing = "| io | `toolkit/io/` | x |\n| schema | `toolkit/schema.py` | x |"
    assert map_problems(_doc(missing, ""), fake_repo) == ["toolkit/envs/ is not in the module map"]
    dead = good + "\n| gone | `toolkit/gone.py`, `toolkit/flows/<flow>/` | x |"
    assert map_problems(_doc(dead, ""), fake_repo) == ["toolkit/flows/<flow>/ is named but does not exist",
                                                       "toolkit/gone.py is named but does not exist"]
    text = _doc(good, "").replace(" toolresult", "")
    assert map_problems(text, fake_repo) == ["layer diagram lacks 'toolresult' (tests/layering.py LAYERS)"]


def test_size_check_catches_unlisted_stale_and_wrong_claims(fake_repo):
    ok = "- `toolkit/io/big.py` (900 lines): one parser per format, split pending issue 99."
    assert size_problems(_doc("", ok), fake_repo) == []
    assert size_problems(_doc("", ""), fake_repo) == ["toolkit/io/big.py has 900 lines (> 800) but is not listed with a reason"]
    wrong = "- `toolkit/io/big.py` (990 lines): one parser per format, split pending issue 99."
    assert size_problems(_doc("", wrong), fake_repo) == ["toolkit/io/big.py is listed with 990 lines, has 900"]
    (fake_repo / "toolkit" / "io" / "big.py").write_text("x = 1\n" * 700)
    assert size_problems(_doc("", ok), fake_repo) == ["toolkit/io/big.py is listed as over 800 lines but is not (any more)"]
    assert size_problems(_doc("", "- `toolkit/io/big.py` (700 lines): because"), fake_repo) == [
        "toolkit/io/big.py is listed as over 800 lines but is not (any more)", "toolkit/io/big.py: no real reason given ('because')"]
