"""The SQLite response cache (toolkit.llm.cache): canonical keys, a round trip through a real file."""

from __future__ import annotations

from toolkit.llm.cache import ResponseCache, cache_key, open_cache


def test_key_ignores_dict_order_but_not_content():
    a = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.0}
    b = {"temperature": 0.0, "messages": [{"content": "hi", "role": "user"}], "model": "m"}
    assert cache_key(a) == cache_key(b)
    assert cache_key(a) != cache_key({**a, "temperature": 0.5})
    assert cache_key(a) != cache_key({**a, "sample_index": 1})
    assert len(cache_key(a)) == 64 and int(cache_key(a), 16) >= 0


def test_put_get_survives_reopen_and_counts(tmp_path):
    path = str(tmp_path / "sub" / "cache.sqlite")  # parent folder created on demand
    c = ResponseCache(path)
    key = cache_key({"model": "m"})
    assert c.get(key) is None
    c.put(key, {"content": "héllo", "tool_calls": []}, model="m")
    c.put(key, {"content": "second"}, model="m")  # same key replaces
    assert len(c) == 1
    assert (c.hits, c.misses) == (0, 1)
    c.close()
    d = ResponseCache(path)
    assert d.get(key) == {"content": "second"}
    assert (d.hits, d.misses) == (1, 0)
    d.close()


def test_open_cache_shares_one_per_file(tmp_path):
    p = tmp_path / "c.sqlite"
    assert open_cache(str(p)) is open_cache(str(tmp_path / "." / "c.sqlite"))
    assert open_cache(str(p)) is not open_cache(str(tmp_path / "other.sqlite"))
