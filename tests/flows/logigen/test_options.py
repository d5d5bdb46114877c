"""gen-task --strategy logigen's typed options: bad values are usage errors naming the key, the
`auto` values resolve once from the command's options, the explorer's write cap."""

from __future__ import annotations

import pytest

from toolkit.flows.logigen.gentask import settings
from toolkit.flows.logigen.options import GenTaskOptions
from toolkit.io import UsageError
from toolkit.stages import strategies
from toolkit.stages.registry import StageContext


def _resolved(**keys):
    opts = strategies.typed("gen-task", dict({"strategy": "logigen"}, **keys))
    return settings(GenTaskOptions.of(opts), StageContext(command="gen-task", opts=opts))


@pytest.mark.parametrize("key, value", [("llm_boundary", "sometimes"), ("user_view", "pictures"),
                                        ("explorer", "random"), ("llm_boundary_share", 2.0), ("n", 0)])
def test_a_bad_value_is_a_usage_error_naming_the_key(key, value):
    with pytest.raises(UsageError, match=key):
        strategies.build("gen-task", {"strategy": "logigen", key: value}, None)


def test_auto_values_resolve_from_the_command_options():
    s = _resolved()
    assert (s.explorer, s.user_view, s.llm_boundary) == ("symbolic", "template", False)
    s = _resolved(explorer="llm", user_view_model="m")  # a role model alone makes the view an LLM's
    assert (s.explorer, s.user_view, s.llm_boundary) == ("llm", "llm", True)
    s = _resolved(explorer="llm", llm_boundary="false", user_view="template", model="m")
    assert (s.user_view, s.llm_boundary) == ("template", False)
    assert _resolved(llm_boundary="yes").llm_boundary is True


def test_the_write_cap_follows_the_explorer_unless_set():
    o = GenTaskOptions()
    assert o.writes_cap("symbolic") == 8 and o.writes_cap("llm") == 3
    assert GenTaskOptions(max_writes=5).writes_cap("llm") == 5
    assert GenTaskOptions(llm_boundary_rules="a, b,a").llm_boundary_rules == ["a", "b"]
