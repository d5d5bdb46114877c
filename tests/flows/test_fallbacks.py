"""The silent `except Exception` fallbacks of issue 22 are gone or counted: an environment whose
tools cannot be loaded is a reject naming the error (ASTRA's S_tn is not judged against no tools,
Simia's seed is not left toolless); a policy that cannot be loaded is a counted fallback."""

import pytest

from toolkit.io import StageError, add_provenance, begin_record_notes
from toolkit.io.provenance import record_notes_scope
from toolkit.io.summary import _ACTIVE, Summary
from toolkit.schema import Record

BROKEN = {"id": "r1", "env": {"backend": "sqlite", "id": "no-such-domain-xyz"}}


def test_astra_tool_necessity_needs_loadable_tools():
    from toolkit.flows.astra.validate import record_tools

    with pytest.raises(StageError) as ei:
        record_tools(Record.model_validate(BROKEN))
    assert ei.value.field == "env" and "cannot be loaded" in str(ei.value) and "no-such-domain-xyz" in str(ei.value)


def test_simia_seed_tools_from_a_broken_env_are_a_reject():
    from toolkit.flows.simia.prefilter import env_tools

    with pytest.raises(StageError) as ei:
        env_tools(Record.model_validate(BROKEN))
    assert ei.value.field == "env" and "cannot be loaded" in str(ei.value)


def test_simia_policy_fallback_is_counted_and_marked():
    from toolkit.flows.simia.prefilter import env_policy

    s = Summary(command="validate-task")
    _ACTIVE.append(s)
    try:
        with record_notes_scope():  # this record's notes only: none left for later tests' records
            begin_record_notes()
            rec = Record.model_validate(BROKEN)
            assert env_policy(rec, []) == ""
            add_provenance(rec, "validate-task")
    finally:
        _ACTIVE.remove(s)
    (reason,) = s.fallback_reasons
    assert reason.startswith("policy not loadable (") and s.fallback_reasons[reason] == 1
    assert rec.provenance[-1].fallbacks == [reason]
