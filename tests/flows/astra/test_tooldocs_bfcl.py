"""Every function doc file shipped in bfcl-eval's data folder imports through `toolkit tools import`
(≥ 99.5% of the functions, one reason line per drop, exit 0), with BFCL's own type map.
Skipped when bfcl-eval (the `bfcl` extra; install with --no-deps) is absent."""

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import run_cmd
from toolkit.flows.astra import tooldocs as T

_spec = importlib.util.find_spec("bfcl_eval")
pytestmark = pytest.mark.skipif(_spec is None, reason="bfcl-eval not installed (extra `bfcl`)")


def _data() -> Path:
    return Path(next(iter(_spec.submodule_search_locations))) / "data"


def _function_doc_files() -> list[Path]:
    d = _data()
    files = [p for p in sorted(d.glob("BFCL_v4_*.json")) if "format_sensitivity" not in p.name]
    return files + sorted((d / "multi_turn_func_doc").glob("*.json"))


def _functions(p: Path) -> list[dict]:
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            out += d.get("function") or [] if "question" in d else [d]
    return out


def test_type_map_is_bfcls_own():
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    from toolkit.flows.astra.tooldocs.bfcl import GORILLA_TO_OPENAPI as ours
    assert ours == GORILLA_TO_OPENAPI


def test_every_bfcl_function_doc_file_imports(tmp_path):
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI as G

    files = _function_doc_files()
    fns = [f for p in files for f in _functions(p)]
    assert len(files) >= 20 and len(fns) > 8000
    rep = tmp_path / "rep.json"
    r = run_cmd(["toolkit", "tools", "import", "--no-notes", "--report", str(rep), *map(str, files)], timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(rep.read_text())
    kept = [t for line in r.stdout.splitlines() for t in json.loads(line)["extra"]["astra"]["tools"]]
    tool_drops = [d for d in report["drops"] if d["tool"]]
    assert len(kept) + len(tool_drops) == len(fns)
    assert len(kept) >= 0.995 * len(fns), (len(kept), len(fns))
    # one reason line on stderr per drop
    assert r.stderr.count("\ndropped ") + r.stderr.startswith("dropped ") == len(report["drops"])
    print(f"BFCL function docs: {len(kept)}/{len(fns)} imported from {len(files)} files; "
          f"{len(report['drops'])} drop(s); notes {report['note_counts']}")
    for t in kept:
        assert T.validate_openai_tool(t) == [], t
    # names: BFCL's own rewrite for OpenAI models ('.' → '_') gives the same names here
    want_names = sorted({f["name"].replace(".", "_") for f in fns})
    assert sorted({t["function"]["name"] for t in kept}) == want_names
    # top-level property types: what BFCL's _cast_to_openai_type gives (missing / unknown → string)
    by_entry: dict[str, dict] = {}
    for line in r.stdout.splitlines():
        s = json.loads(line)["extra"]["astra"]
        for t in s["tools"]:
            by_entry[(s["server"], s.get("names", {}).get(t["function"]["name"], t["function"]["name"]))] = t
    checked = 0
    for p in files:
        for line in p.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            d = json.loads(line)
            server = d["id"] if "question" in d else p.stem
            for f in (d.get("function") or [] if "question" in d else [d]):
                got = by_entry[(server, f["name"])]["function"]["parameters"]["properties"]
                for k, v in f["parameters"]["properties"].items():
                    want = G.get(v["type"], "string") if "type" in v else "string"
                    assert got[k]["type"] == want, (server, f["name"], k, v.get("type"), got[k])
                    checked += 1
    assert checked > 20000
