"""Streaming JSONL in/out used by every command.

- reads stdin or --input (plain or .gz), writes stdout or --output (plain or .gz)
- validates each line against the record schema; a bad line (not JSON, wrong schema, duplicate id,
  NaN/Infinity, too deep, invalid UTF-8, a key named twice in one object ...: no exception while
  decoding one line escapes) gives one stderr message naming line number, id and field, goes whole
  to --rejects (escaped: always valid UTF-8), and never stops the good lines; the run exits 1 when
  anything was rejected
- --resume skips ids already present in --output (a killed run, rerun, gives each id exactly once;
  a torn last line left by a kill is trimmed first; a torn .gz is rewritten with its whole lines)
- --shard i/n keeps a stable hash partition of ids (blake2b of the id, so every machine agrees)
- --limit N, order-preserving output by default (--unordered emits as completed)
- bounded memory: a window of in-flight records; seen-id sets spill to a temp SQLite file
- progress on stderr when it is a TTY (else a heartbeat line every --heartbeat seconds), and a
  one-line summary at the end (fallbacks and warnings counted)
"""

from toolkit.io.base import StageError, UsageError, log  # noqa: F401
from toolkit.io.lines import (  # noqa: F401
    DEFAULT_MAX_LINE_BYTES, InputCut, OversizedLine, check_input, describe_validation_error, dump_line, first_field,
    open_lines, parse_jsonl, read_records, resolve_env_path, write_records)
from toolkit.io.options import IOOptions, parse_shard, shard_of  # noqa: F401
from toolkit.io.provenance import add_provenance, begin_record_notes, note_for_provenance, now_iso  # noqa: F401
from toolkit.io.resume import IdSet, _trim_torn_tail, existing_ids  # noqa: F401
from toolkit.io.strict import find_bad, has_duplicate_keys, read_json_lines, strict_loads  # noqa: F401
from toolkit.io.stream import RecordStream, Stage, StageFn, StageResult, stage_fn  # noqa: F401
from toolkit.io.summary import (  # noqa: F401
    STAGE_GROUP_ENV, STAGE_LABEL_ENV, STAGE_LOG_ENV, Progress, Summary, llm_wait_begin, llm_wait_end, llm_waiting,
    note_drop, note_fallback, note_warning)
