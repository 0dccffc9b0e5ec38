"""Assertions of the rollout conformance suite, as plain functions over generated batches.

Each raises ``AssertionError`` with a message naming the key, the row and what was expected, so a
plugin author sees which part of the layout contract (:mod:`verl.engines.base`) is broken. They are
usable outside the suite, e.g. on the output of an engine under development.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

OUTPUT_KEYS: tuple[str, ...] = ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids")
LOG_PROB_KEY = "rollout_log_probs"


def eos_token_ids(tokenizer: Any, model_path: Any) -> list[int]:
    """EOS ids a row may stop at: ``tokenizer.eos_token_id`` then ``generation_config.eos_token_id``.

    The generation config is read from ``model_path`` when it has one (a missing file is not an error).
    """
    ids: list[int] = []
    sources: list[Any] = [getattr(tokenizer, "eos_token_id", None)]
    try:
        from transformers import GenerationConfig

        sources.append(GenerationConfig.from_pretrained(str(model_path)).eos_token_id)
    except (OSError, ValueError):
        pass  # no generation_config.json (or an unreadable one): the tokenizer's EOS is the only source
    for source in sources:
        for i in [source] if isinstance(source, int) else list(source or []):
            if int(i) not in ids:
                ids.append(int(i))
    return ids


def expected_position_ids(attention_mask: torch.Tensor) -> list[list[int]]:
    """``max(cumsum(mask) - 1, 0)`` per row, computed with plain Python (K07: pads 0, then 0, 1, 2...)."""
    rows = []
    for row in attention_mask.tolist():
        total, out = 0, []
        for m in row:
            total += int(m)
            out.append(max(total - 1, 0))
        rows.append(out)
    return rows


def check_output_layout(
    out: Any, prompts: Any, *, response_length: int, pad_token_id: int, with_log_probs: bool = True
) -> None:
    """Assert the output keys, shapes, dtypes, device and padding invariants of ``generate``.

    With ``bs, p = prompts.batch["input_ids"].shape`` and ``r = response_length``:

    * keys :data:`OUTPUT_KEYS` (+ ``rollout_log_probs`` when ``with_log_probs``); ``len(out) == bs``;
    * ``prompts`` ``(bs, p)``, ``responses`` / ``response_mask`` ``(bs, r)``, ``input_ids`` /
      ``attention_mask`` / ``position_ids`` ``(bs, p + r)``, all int64; ``rollout_log_probs`` ``(bs, r)``
      float32; every tensor on the input's device;
    * ``prompts`` is the input's ``input_ids`` unchanged (row order kept), ``input_ids = [prompts |
      responses]``, ``attention_mask = [input attention_mask | response_mask]``;
    * ``response_mask`` is 0/1 and right-padded (valid tokens form a prefix of each row), padding slots of
      ``responses`` hold ``pad_token_id``;
    * ``position_ids = clip(cumsum(attention_mask) - 1, 0)`` over the whole sequence (K07);
    * ``rollout_log_probs`` is finite and ``<= 0`` on valid tokens and exactly 0 on padding.
    """
    batch = out.batch
    assert batch is not None, "generate returned a DataProto without tensors"
    keys = set(batch.keys())
    required = set(OUTPUT_KEYS) | ({LOG_PROB_KEY} if with_log_probs else set())
    missing = sorted(required - keys)
    assert not missing, f"generate output lacks keys {missing} (has {sorted(keys)})"
    in_ids, in_mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    bs, p = in_ids.shape
    r = response_length
    assert len(out) == bs, f"generate returned {len(out)} rows for {bs} input rows (one response per row)"
    shapes = {"prompts": (bs, p), "responses": (bs, r), "response_mask": (bs, r)}
    shapes.update({k: (bs, p + r) for k in ("input_ids", "attention_mask", "position_ids")})
    if with_log_probs:
        shapes[LOG_PROB_KEY] = (bs, r)
    for key, shape in shapes.items():
        assert tuple(batch[key].shape) == shape, f"{key}: shape {tuple(batch[key].shape)}, expected {shape}"
        want = torch.float32 if key == LOG_PROB_KEY else torch.int64
        assert batch[key].dtype == want, f"{key}: dtype {batch[key].dtype}, expected {want}"
        assert batch[key].device == in_ids.device, (
            f"{key}: on {batch[key].device}, expected the input's device {in_ids.device}"
        )
    responses, mask = batch["responses"], batch["response_mask"]
    assert torch.equal(batch["prompts"], in_ids), "prompts: must be the input's input_ids, row for row"
    assert torch.equal(batch["input_ids"], torch.cat([in_ids, responses], dim=1)), "input_ids != [prompts | responses]"
    assert torch.equal(batch["attention_mask"], torch.cat([in_mask.long(), mask], dim=1)), (
        "attention_mask != [input attention_mask | response_mask]"
    )
    assert bool(((mask == 0) | (mask == 1)).all()), "response_mask: values other than 0/1"
    holes = torch.nonzero(mask[:, 1:] > mask[:, :-1]).flatten().tolist()
    assert not holes, f"response_mask rows {sorted(set(holes))[:5]} are not right-padded (a valid token after padding)"
    bad_pad = torch.nonzero(((responses != pad_token_id) & (mask == 0)).any(dim=1)).flatten().tolist()
    assert not bad_pad, f"responses rows {bad_pad[:5]}: padding slots must hold the pad id {pad_token_id}"
    want_pos = expected_position_ids(batch["attention_mask"])
    got_pos = batch["position_ids"].tolist()
    wrong = [i for i in range(bs) if got_pos[i] != want_pos[i]]
    assert not wrong, (
        f"position_ids row {wrong[0]} is {got_pos[wrong[0]]}, expected clip(cumsum(attention_mask) - 1, 0) = "
        f"{want_pos[wrong[0]]} (K07)"
    )
    if with_log_probs:
        lp = batch[LOG_PROB_KEY]
        valid = mask.bool()
        assert bool(torch.isfinite(lp[valid]).all()), "rollout_log_probs: non-finite values on valid tokens"
        assert bool((lp[valid] <= 1e-6).all()), "rollout_log_probs: positive log-probs on valid tokens"
        assert bool((lp[~valid] == 0).all()), "rollout_log_probs: must be exactly 0 on response padding"


def check_eos_stops(out: Any, eos_ids: list[int]) -> Counter:
    """Assert each row ends at its first EOS token (kept valid) or at the length limit (K06).

    For row ``i`` with ``L = response_mask[i].sum()``: if one of ``eos_ids`` occurs among the valid tokens,
    its first occurrence is at ``L - 1`` (the EOS is valid, nothing after it is); otherwise ``L`` equals the
    response length (a row stops early only at an EOS). Any id of ``eos_ids`` counts, not only the first.

    Returns:
        ``Counter`` of how rows ended: the EOS id they stopped at, or ``"length"``.
    """
    responses, mask = out.batch["responses"].cpu(), out.batch["response_mask"].cpu()
    r = responses.shape[1]
    ends: Counter = Counter()
    for i, (row, length) in enumerate(zip(responses.tolist(), mask.sum(dim=1).tolist(), strict=True)):
        first = next((t for t, tok in enumerate(row[:length]) if tok in eos_ids), None)
        if first is None:
            assert length == r, (
                f"row {i}: {length} valid tokens of {r} but no EOS id ({eos_ids}) among them: a row may stop "
                "early only at an EOS, which stays valid (K06)"
            )
            ends["length"] += 1
        else:
            assert first == length - 1, (
                f"row {i}: EOS id {row[first]} at position {first}, but response_mask marks {length} tokens "
                f"valid; the first EOS must be the last valid token (eos ids {eos_ids}, K06)"
            )
            ends[row[first]] += 1
    return ends


def check_log_probs_close(
    rollout: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor, *, atol: float, what: str
) -> None:
    """Assert ``|rollout - reference| <= atol`` on every valid token (``mask == 1``), naming the worst one."""
    rollout, reference, mask = rollout.detach().cpu().float(), reference.detach().cpu().float(), mask.cpu().bool()
    assert rollout.shape == reference.shape == mask.shape, (
        f"{what}: shapes {tuple(rollout.shape)}, {tuple(reference.shape)}, mask {tuple(mask.shape)} differ"
    )
    diff = torch.where(mask, (rollout - reference).abs(), torch.zeros_like(rollout))
    worst = float(diff.max()) if diff.numel() else 0.0
    if worst > atol:
        row, col = divmod(int(diff.argmax()), diff.shape[1])
        raise AssertionError(
            f"{what}: max |rollout - reference| = {worst:.3g} > logprob_atol {atol:g} at row {row}, token {col} "
            f"(rollout {float(rollout[row, col]):.6f}, reference {float(reference[row, col]):.6f}); "
            f"{int((diff > atol).sum())} of {int(mask.sum())} valid tokens are off"
        )
