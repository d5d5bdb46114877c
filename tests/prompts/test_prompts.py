"""Prompt templates render with jinja2 (toolkit.prompts) and tool lists with one renderer
(toolkit.formats.tools.tools_text, also the templates' `tools_text` filter)."""

import json
import re
from pathlib import Path

import pytest

from toolkit import prompts
from toolkit.formats.tools import tools_text

SHIPPED = sorted(Path(prompts.SHIPPED).rglob("*.v*.txt"))
VAR = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def test_every_shipped_prompt_renders_as_plain_substitution():
    """jinja2 must give exactly what substituting each {{name}} gives, for every shipped file,
    with values that look like template syntax (they must come out verbatim, not rendered)."""
    assert len(SHIPPED) >= 40
    for path in SHIPPED:
        text = path.read_text(encoding="utf-8")
        names = VAR.findall(text)
        assert names or "{{" not in text, path
        values = {k: f"<{k} {{{{x}}}} {{% if %}} {{# c #}} 'q' \"d\" & <b>>" for k in names}
        # template comments (attribution notes kept out of the prompt): `{#- ... -#}` and the
        # whitespace on both sides are dropped, as jinja2's whitespace control says
        bare = re.sub(r"\s*\{#-.*?-#\}\s*", "", text, flags=re.S)
        assert "{#" not in bare, path
        expected = VAR.sub(lambda m: values[m.group(1)], bare)
        assert prompts.Prompt(path.stem, 1, text).render(**values) == expected, path


def test_missing_value_is_a_keyerror_naming_it():
    p = prompts.Prompt("t", 3, "Hello {{ who }}, see {{what}}.\n")
    with pytest.raises(KeyError, match=r"prompt t.v3: missing value for \{\{what\}\}"):
        p.render(who="you")
    assert p.render(who="you", what=[1, None], extra="unused") == "Hello you, see [1, None].\n"


def test_templates_can_loop_and_use_the_tools_filter():
    p = prompts.Prompt("t", 1, "{% for t in tools %}{{ loop.index }}. {{ t.get('function', t).name }}\n{% endfor %}"
                       "{{ tools | tools_text('params') }}\n{% if not hint %}(no hint){% endif %}")
    assert p.render(tools=TOOLS, hint="") == "1. get_order\n2. ping\n- get_order: order_id*, verbose\n- ping: \n(no hint)"


TOOLS = [
    {"type": "function", "function": {
        "name": "get_order", "description": "Get an order.  Needs   the id. More text",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "verbose": {"type": "boolean"}},
                       "required": ["order_id"]}}},
    {"name": "ping", "description": "Ping.", "parameters": {"type": "object", "properties": {}}},
]


def test_tools_text_styles_by_hand():
    assert tools_text(TOOLS, "signatures") == ("- get_order(order_id: string, verbose?: boolean): Get an order\n"
                                               "- ping(): Ping.")
    assert tools_text(TOOLS, "params") == "- get_order: order_id*, verbose\n- ping: "
    fns = [TOOLS[0]["function"], TOOLS[1]]
    assert tools_text(TOOLS) == json.dumps(fns, ensure_ascii=False)
    assert tools_text(TOOLS, indent=1) == json.dumps(fns, ensure_ascii=False, indent=1)
    assert tools_text(TOOLS, unwrap=False, indent=1) == json.dumps(TOOLS, ensure_ascii=False, indent=1)
    assert tools_text([], indent=1, empty="(not given)") == "(not given)"
    assert tools_text(TOOLS, "signatures", limit=10) == "- get_orde\n...(truncated)"
    compact = json.loads(tools_text(TOOLS, compact=True))
    assert compact[0] == {"name": "get_order", "description": "Get an order.",
                          "parameters": {"type": "object", "properties": {"order_id": {"type": "string"},
                                                                          "verbose": {"type": "boolean"}},
                                         "required": ["order_id"]}}
    # "auto": compact only past 12,000 characters
    assert tools_text(TOOLS, compact="auto") == tools_text(TOOLS)
    big = [dict(TOOLS[1], name=f"t{i}", description="x" * 200) for i in range(60)]
    assert json.loads(tools_text(big, compact="auto"))[0]["description"] == "x" * 157 + "..."
    with pytest.raises(ValueError, match="style"):
        tools_text(TOOLS, "yaml")
