"""The template GGUF's metadata kept between processes (toolkit.llm.gguf_export.template_metadata):
a hit equals a fresh parse, a damaged file is ignored and parsed again, the off switch writes
nothing, and another file (or an edited one) is another key."""

from __future__ import annotations

import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package comes with the embedded/models extras")

from toolkit.llm import gguf_export as E  # noqa: E402


def template(path, vocab=("<s>", "a", "b"), name="tiny"):
    """A small llama GGUF: sizes, a string array (the vocabulary), an int array, a float, one tensor."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_rope_freq_base(10000.0)
    w.add_token_list(list(vocab))
    w.add_token_types([1] * len(vocab))
    w.add_tensor("token_embd.weight", np.zeros((len(vocab), 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLKIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(E.DISK_CACHE_ENV, raising=False)
    monkeypatch.setattr(E, "_TEMPLATES", {})
    E.DISK_STATS.clear()

    def new_process():  # what a new process sees: nothing kept in memory
        E._TEMPLATES.clear()

    return new_process


def files(tmp_path):
    d = tmp_path / "home" / E.DISK_SUBDIR
    return sorted(d.glob("*.pkl")) if d.exists() else []


def test_a_new_process_reads_what_the_first_parsed(tmp_path, fresh):
    t = template(tmp_path / "t.gguf")
    first = E.template_metadata(t)
    assert first[0] == "llama" and first[1] == ["token_embd.weight"]
    fields = {f[0]: f for f in first[2]}
    assert fields["tokenizer.ggml.tokens"][1] == ["<s>", "a", "b"]
    assert fields["tokenizer.ggml.tokens"][2:] == (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
    assert fields["llama.rope.freq_base"][1] == pytest.approx(10000.0)
    assert dict(E.DISK_STATS) == {"miss": 1, "stored": 1} and len(files(tmp_path)) == 1
    fresh()
    again = E.template_metadata(t)
    assert E.DISK_STATS["hit"] == 1 and again == first
    # the hit is what a parse of the file gives (the off switch parses)
    fresh()
    os.environ[E.DISK_CACHE_ENV] = "0"
    try:
        assert E.template_metadata(t) == again
    finally:
        del os.environ[E.DISK_CACHE_ENV]


def test_a_damaged_file_is_ignored_and_parsed_again(tmp_path, fresh, capsys):
    t = template(tmp_path / "t.gguf")
    first = E.template_metadata(t)
    (f,) = files(tmp_path)
    raw = bytearray(f.read_bytes())
    raw[-5] ^= 0xFF  # one flipped byte in the pickle
    f.write_bytes(bytes(raw))
    fresh()
    assert E.template_metadata(t) == first
    assert E.DISK_STATS["corrupt"] == 1 and E.DISK_STATS["stored"] == 2
    assert "gguf template cache" in capsys.readouterr().err
    f.write_bytes(b"not a cache file")
    fresh()
    assert E.template_metadata(t) == first and E.DISK_STATS["corrupt"] == 2


def test_off_writes_nothing_and_another_file_is_another_key(tmp_path, fresh, monkeypatch):
    monkeypatch.setenv(E.DISK_CACHE_ENV, "off")
    t = template(tmp_path / "t.gguf")
    E.template_metadata(t)
    assert files(tmp_path) == [] and E.DISK_STATS["stored"] == 0
    monkeypatch.delenv(E.DISK_CACHE_ENV)
    fresh()
    E.template_metadata(t)
    u = template(tmp_path / "u.gguf", vocab=("<s>", "x", "y", "z"), name="other")
    other = E.template_metadata(u)
    assert len(files(tmp_path)) == 2
    assert {f[0]: f[1] for f in other[2]}["tokenizer.ggml.tokens"] == ["<s>", "x", "y", "z"]
    # the same path rewritten (new size and mtime): a new key, not the old vocabulary
    template(tmp_path / "t.gguf", vocab=("<s>", "q"), name="edited")
    fresh()
    assert {f[0]: f[1] for f in E.template_metadata(t)[2]}["tokenizer.ggml.tokens"] == ["<s>", "q"]
