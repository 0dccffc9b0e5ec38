"""The disk cache of encoded prompts (:mod:`verl.data.prompt_cache`): a second dataset build reads the ids of the
first instead of encoding, any change to the prompts, the tokenizer, its chat template or the template kwargs
misses, template errors are never cached, a broken file is re-encoded, and ``VERL_PROMPT_CACHE=0`` turns it off."""

from __future__ import annotations

import pytest

import verl.data.prompt_cache as pc
from verl.data.prompt_tokens import encode_prompts
from verl.testing.tiny import make_tiny_tokenizer

MSGS = [[{"role": "user", "content": w * (1 + i % 3)}] for i, w in enumerate(["ab", "hello", "xyz", "a", "cd"])]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache root; ``calls`` counts real encodings."""
    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(pc.ENV_SWITCH, raising=False)
    calls = []
    real = pc.encode_prompts_parallel

    def counting(tok, msgs, kwargs, workers):
        calls.append(len(msgs))
        return real(tok, msgs, kwargs, workers)

    monkeypatch.setattr(pc, "encode_prompts_parallel", counting)
    return tmp_path / "cache" / "prompt_tokens", calls


def test_second_encoding_reads_the_first_from_disk(cache):
    folder, calls = cache
    tok = make_tiny_tokenizer()
    want = encode_prompts(tok, MSGS, {})
    assert pc.cached_encode(tok, MSGS, {}, 1) == want and calls == [5]
    assert len(list(folder.glob("*.npz"))) == 1
    assert pc.cached_encode(make_tiny_tokenizer(), MSGS, {}, 1) == want and calls == [5]  # an equal tokenizer hits


def test_any_input_that_changes_the_ids_misses(cache):
    folder, calls = cache
    tok = make_tiny_tokenizer()
    pc.cached_encode(tok, MSGS, {}, 1)
    pc.cached_encode(tok, MSGS[:4], {}, 1)  # other prompts
    pc.cached_encode(tok, MSGS, {"enable_thinking": False}, 1)  # other template kwargs
    other = make_tiny_tokenizer()
    other.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    got = pc.cached_encode(other, MSGS, {}, 1)  # another chat template
    assert got == encode_prompts(other, MSGS, {}) and got != encode_prompts(tok, MSGS, {})
    assert calls == [5, 4, 5, 5] and len(list(folder.glob("*.npz"))) == 4


def test_template_errors_are_not_cached_and_broken_files_are_re_encoded(cache):
    folder, calls = cache
    tok = make_tiny_tokenizer()
    tok.chat_template = "{{ raise_exception('no') if messages[0]['content'] == 'a' else messages[0]['content'] }}"
    out = pc.cached_encode(tok, MSGS, {}, 1)
    assert isinstance(out[3], str) and not list(folder.glob("*.npz"))  # the row 'a' failed: nothing stored
    good = make_tiny_tokenizer()
    pc.cached_encode(good, MSGS, {}, 1)
    (path,) = folder.glob("*.npz")
    path.write_bytes(b"not an npz")
    assert pc.cached_encode(good, MSGS, {}, 1) == encode_prompts(good, MSGS, {})
    assert calls == [5, 5, 5]
    assert pc.cached_encode(good, MSGS, {}, 1) == encode_prompts(good, MSGS, {}) and calls == [5, 5, 5]


def test_switched_off_and_bad_workers(cache, monkeypatch):
    folder, calls = cache
    monkeypatch.setenv(pc.ENV_SWITCH, "0")
    tok = make_tiny_tokenizer()
    pc.cached_encode(tok, MSGS, {}, 1)
    pc.cached_encode(tok, MSGS, {}, 1)
    assert calls == [5, 5] and not folder.exists()
    monkeypatch.delenv(pc.ENV_SWITCH)
    pc.cached_encode(tok, MSGS, {}, 1)
    with pytest.raises(ValueError, match="filter_overlong_prompts_workers must be a process count"):
        pc.cached_encode(tok, MSGS, {}, 0)  # checked on a cache hit too
