"""Nothing in the repository points at files users do not have: the project's working notes
(the flows extraction, the seed-paper texts, a design memo) live outside it, so docs, code,
recipes and tests cite the papers by title and arXiv id instead."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATTERN = re.compile(r"FLOWS\.md|DESIGN\.md|\.\./shared\b|\bseeds/0\d\d|\bseed 00\d\b")


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.splitlines()
            if p.endswith((".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ".cfg", ".json"))
            or p in ("Justfile", "bin/setup", ".ci/run")]


def test_no_file_points_outside_the_repository():
    me = Path(__file__).resolve()
    hits = []
    for p in tracked_text_files():
        if p.resolve() == me or not p.is_file():
            continue
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if PATTERN.search(line):
                hits.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits[:20])
