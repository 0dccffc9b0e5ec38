"""Reward manager: decode responses, score them, place each score on the last valid response token.

Semantics of verl's ``naive`` reward manager (verl/workers/reward_manager/naive.py) plus isolation (scorers run in
worker processes, threads or inline), per-sample timeouts and an error policy. Anatomy §14 item 2: the score sits at response index ``valid_len - 1`` and zeros elsewhere, so
``token_level_scores.sum(-1)`` is the sequence score.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import torch

from verl.rewards._pool import Outcome, run_with_timeouts
from verl.rewards._procpool import ScorerProcessPool, ScorerSpec
from verl.rewards.default import check_data_source, check_reward_kwargs, default_compute_score
from verl.rewards.errors import (
    AllRewardsFailedError,
    RewardConfigError,
    RewardFunctionError,
    RewardInputError,
    ScorerProcessDied,
    ScorerRaised,
)

__all__ = ["RewardManager", "ON_ERROR_POLICIES", "ISOLATION_MODES", "ScorerSpec"]

logger = logging.getLogger(__name__)

ON_ERROR_POLICIES = ("zero", "fail")
ISOLATION_MODES = ("auto", "process", "thread", "none")
# Per-kind counters, all included in reward/errors.
_KIND_METRICS = {"timeout": "reward/timeouts", "invalid_result": "reward/invalid", "crash": "reward/crashes"}
_MAX_DETAIL_CHARS = 200


class _InvalidResult(ValueError):
    """The scorer returned something that is not a finite score."""


def _as_score(value: Any, what: str) -> float:
    if value is None:
        raise _InvalidResult(f"{what} is None")
    if isinstance(value, (str, bytes)) or not (isinstance(value, numbers.Real) or hasattr(type(value), "__float__")):
        raise _InvalidResult(f"{what} has type {type(value).__name__}; expected a float or a dict with a 'score' key")
    try:
        score = float(value)
    except (TypeError, ValueError) as exc:  # e.g. a tensor with several elements
        raise _InvalidResult(f"{what} ({type(value).__name__}) is not convertible to float: {exc}") from exc
    if not math.isfinite(score):
        raise _InvalidResult(f"{what} is {score} (not finite)")
    return score


def _parse_result(result: Any) -> tuple[float, dict[str, Any]]:
    """(score, extra info of this sample). A dict logs all its keys; a bare number is also logged as ``acc``."""
    if isinstance(result, Mapping):
        if "score" not in result:
            raise _InvalidResult(f"returned a dict without a 'score' key (keys: {sorted(map(str, result))})")
        score = _as_score(result["score"], "result['score']")
        return score, {**result, "score": score}
    score = _as_score(result, "result")
    return score, {"acc": score}


def _describe_scorer(compute_score: Any) -> str:
    """The reward function as named in messages: ``'name' in /path/file.py``, or the built-in scorers."""
    if isinstance(compute_score, ScorerSpec):
        if compute_score.path is None:
            return "default_compute_score (the built-in scorers, chosen by data_source)"
        return f"{compute_score.name!r} in {compute_score.path} (custom_reward_function)"
    if compute_score is None:
        return "default_compute_score (the built-in scorers, chosen by data_source)"
    inner = getattr(compute_score, "func", compute_score)  # functools.partial
    module = getattr(inner, "__module__", None)
    name = getattr(inner, "__qualname__", None) or type(inner).__name__
    return f"{module}.{name}" if module else name


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_DETAIL_CHARS else text[: _MAX_DETAIL_CHARS - 3] + "..."


class RewardManager:
    """Rule-based reward manager (verl ``naive`` semantics) with isolation, per-sample timeouts and an error policy.

    Args:
        tokenizer: anything with ``decode(ids: list[int], skip_special_tokens=True) -> str``.
        compute_score: ``fn(data_source, solution_str, ground_truth, extra_info, **reward_kwargs) -> float | dict``
            (dict needs ``"score"``; may be ``async def``); a :class:`ScorerSpec` (the function by file path, which
            process isolation needs); ``None`` uses :func:`default_compute_score`.
        reward_fn_key: non-tensor column holding each sample's data source.
        reward_kwargs: keywords passed to every ``compute_score`` call (e.g. ``{"method": "flexible"}``).
        timeout_s: per-sample limit in seconds (from when the sample starts running); ``None`` disables it. With
            process isolation the worker running a timed-out sample is killed and replaced; with thread isolation
            the thread is abandoned, not killed (it runs on in the background, see ``_pool``).
        on_error: ``"zero"`` scores failed samples 0.0, counts them and logs one warning per kind of failure per
            call, naming the first failing sample; ``"fail"`` raises :class:`RewardFunctionError` naming the
            sample index, data source and error.
        num_workers: scorer processes (kept for the manager's life) or threads (per call), >= 1.
        num_examine: decoded samples per data source logged at INFO level on each call (verl's ``num_examine``).
        isolation: ``"process"`` (a pool of spawn-context worker processes, :class:`ScorerProcessPool`: needs
            ``compute_score`` to be a ``ScorerSpec`` or ``None``), ``"thread"`` (daemon threads in this process),
            ``"none"`` (inline in the caller's thread; ``timeout_s`` is ignored), or ``"auto"``: process for a
            ``ScorerSpec`` with a path (user code), thread otherwise (built-in rule scorers are trusted and fast).
        memory_limit_mb: address-space limit (``RLIMIT_AS``) per worker process in MiB; ``None`` = none. Only
            used with process isolation.
        overlong_buffer: the ``dapo`` manager's soft overlong penalty
            (:class:`~verl.rewards.reward_managers.OverlongBuffer`, from ``reward_model.reward_kwargs``): added to
            every sample's score by its valid response length; ``None`` (``naive``) adds nothing.
        stop_on_all_failed: raise :class:`AllRewardsFailedError` when every sample of a call failed, whatever
            ``on_error`` says (``reward_model.stop_on_all_failed``); ``False`` scores them all 0.0 under ``zero``.

    A failure is an exception, a timeout, or a result that is ``None``, not a number/dict, a dict without
    ``"score"``, or a NaN/inf score. Configuration errors (:class:`RewardConfigError`: unknown data source,
    unknown reward keyword) are raised whatever the policy.

    Metrics of each call (sample counts): ``reward/errors`` (every failed sample), of which ``reward/timeouts``,
    ``reward/invalid`` (bad result), ``reward/crashes`` (worker process died); ``reward/empty_responses``.

    Raises:
        ValueError: invalid ``on_error``, ``timeout_s``, ``num_workers``, ``isolation`` or ``memory_limit_mb``, or
            process isolation asked for a plain callable (it cannot be loaded by path in a worker).
        RewardConfigError: ``reward_kwargs`` not accepted by the default scorer; with process isolation, a worker
            could not import the scorer (:class:`RewardFunctionLoadError`).
    """

    def __init__(
        self,
        tokenizer: Any,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
        reward_kwargs: Mapping[str, Any] | None = None,
        timeout_s: float | None = 10.0,
        on_error: str = "zero",
        num_workers: int = 8,
        num_examine: int = 0,
        isolation: str = "auto",
        memory_limit_mb: int | None = 2048,
        overlong_buffer: Any = None,
        stop_on_all_failed: bool = True,
    ) -> None:
        if on_error not in ON_ERROR_POLICIES:
            raise ValueError(f"on_error={on_error!r} is not supported; use one of {ON_ERROR_POLICIES}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r} must be > 0 seconds, or None to disable the timeout")
        if int(num_workers) < 1:
            raise ValueError(f"num_workers={num_workers!r} must be >= 1")
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation={isolation!r} is not supported; use one of {ISOLATION_MODES}")
        spec = compute_score if isinstance(compute_score, ScorerSpec) else None
        if isolation == "auto":
            isolation = "process" if spec is not None and spec.path is not None else "thread"
        if isolation == "process" and compute_score is not None and spec is None:
            raise ValueError(
                "isolation='process' loads the scorer by file path in each worker and cannot use a Python callable; "
                "pass ScorerSpec(path, name, reward_kwargs) (custom_reward_function.path) or use isolation='thread'"
            )
        self.isolation = isolation
        self.tokenizer = tokenizer
        self.stop_on_all_failed = bool(stop_on_all_failed)
        self.scorer_name = _describe_scorer(compute_score)
        self.uses_default_scorer = compute_score is None or (spec is not None and spec.path is None)
        self._pool: ScorerProcessPool | None = None
        if isolation == "process":
            self.compute_score = None
            self._pool = ScorerProcessPool(spec or ScorerSpec(), int(num_workers), memory_limit_mb)
            self._warn_unused(spec, self._pool.unused_optional_kwargs)
        elif spec is not None:
            self.compute_score = spec.load()
            self._warn_unused(spec, spec.unused_optional(self.compute_score))
        else:
            self.compute_score = default_compute_score if compute_score is None else compute_score
        self.reward_fn_key = reward_fn_key
        self.reward_kwargs = dict(reward_kwargs or {})
        self.overlong_buffer = overlong_buffer
        self.timeout_s = timeout_s
        self.on_error = on_error
        self.num_workers = int(num_workers)
        self.num_examine = int(num_examine)
        self.last_metrics: dict[str, int] = {}
        self._warned_kinds: set[str] = set()  # reset on every call: one warning per kind per step
        if self.uses_default_scorer:
            check_reward_kwargs(self.reward_kwargs)

    @staticmethod
    def _warn_unused(spec: ScorerSpec | None, unused: list[str]) -> None:
        """Say which ``reward_model.reward_kwargs`` a custom function does not take (they are not passed)."""
        if spec is None or not unused:
            return
        logger.warning(
            "reward_model.reward_kwargs %s are not passed to custom_reward_function %r in %s: it has no such "
            "parameters and no **kwargs. They are options of the built-in scorers (e.g. gsm8k's method and "
            "format_score, set by the built-in run config), which the custom function replaces. To receive them, "
            "add the parameters (or **kwargs); otherwise drop them from reward_model.reward_kwargs.",
            unused,
            spec.name,
            spec.path,
        )

    # ----------------------------------------------------------------------------------------------- input
    def _response_mask(self, batch: Any, responses: torch.Tensor) -> torch.Tensor:
        """(bs, resp_len) mask of real response tokens: response part of attention_mask, else response_mask."""
        bs, resp_len = responses.shape
        keys = set(batch.keys())
        if "attention_mask" in keys:
            attention = batch["attention_mask"]
            if attention.dim() != 2 or attention.shape[0] != bs or attention.shape[1] < resp_len:
                raise RewardInputError(
                    f"attention_mask has shape {tuple(attention.shape)}; expected (batch={bs}, "
                    f"prompt_len + response_len) with response_len={resp_len}"
                )
            if "prompts" in keys and batch["prompts"].shape[-1] + resp_len != attention.shape[1]:
                raise RewardInputError(
                    f"prompts width {batch['prompts'].shape[-1]} + responses width {resp_len} != attention_mask "
                    f"width {attention.shape[1]}; input_ids must be [prompt | response]"
                )
            return attention[:, attention.shape[1] - resp_len :]
        if "response_mask" in keys:
            mask = batch["response_mask"]
            if tuple(mask.shape) != (bs, resp_len):
                raise RewardInputError(
                    f"response_mask has shape {tuple(mask.shape)}; expected {(bs, resp_len)} like responses"
                )
            return mask
        raise RewardInputError(
            f"the batch has neither 'attention_mask' nor 'response_mask' (keys: {sorted(keys)}); one of them "
            "is needed to find the valid response tokens"
        )

    @staticmethod
    def _column(non_tensor: Mapping[str, Any], key: str, bs: int, hint: str) -> list[Any]:
        if key not in non_tensor:
            raise RewardInputError(f"non_tensor_batch has no {key!r} column (columns: {sorted(non_tensor)}); {hint}")
        column = list(non_tensor[key])
        if len(column) != bs:
            raise RewardInputError(f"non_tensor_batch[{key!r}] has {len(column)} rows, the batch has {bs}")
        return column

    # ----------------------------------------------------------------------------------------------- call
    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """Score every sample of ``data`` (a DataProto).

        Reads ``batch["responses"]`` (bs, resp_len) int64, and ``batch["attention_mask"]`` (bs, prompt_len +
        resp_len) or else ``batch["response_mask"]`` (bs, resp_len); non-tensor ``reward_fn_key`` column,
        ``reward_model`` (dicts with ``"ground_truth"``) and optional ``extra_info``. Each response is decoded up
        to its last valid token with ``skip_special_tokens=True``; a response without valid tokens is still
        scored (as ``""``) but its score is not placed, and it is counted in ``reward/empty_responses``.

        Returns:
            ``token_level_scores`` (bs, resp_len) float32 on the device of ``responses``, the score at the last
            valid token of each row; with ``return_dict=True`` a dict ``{"reward_tensor", "reward_extra_info"
            (key -> list of bs values, None where a sample did not report the key), "metrics" ({"reward/errors",
            "reward/timeouts", "reward/invalid", "reward/crashes", "reward/empty_responses"} sample counts;
            errors include the three kinds)}``.

        Raises:
            RewardInputError: missing column / inconsistent shapes.
            RewardConfigError: unknown data source for the default scorer, or raised by the scorer.
            RewardFunctionError: a sample failed and ``on_error="fail"``.
        AllRewardsFailedError: every sample failed and ``stop_on_all_failed`` (a :class:`RewardFunctionError`).
        """
        batch, non_tensor = data.batch, data.non_tensor_batch
        if batch is None or "responses" not in set(batch.keys()):
            raise RewardInputError("data.batch has no 'responses' tensor (bs, response_len); nothing to score")
        responses = batch["responses"]
        if responses.dim() != 2:
            raise RewardInputError(f"responses must be 2-D (bs, response_len), got shape {tuple(responses.shape)}")
        bs, resp_len = responses.shape
        valid = self._response_mask(batch, responses) != 0
        has_token = valid.any(dim=1)
        last_index = resp_len - 1 - valid.flip(1).to(torch.int8).argmax(dim=1)
        lengths = torch.where(has_token, last_index + 1, torch.zeros_like(last_index)).tolist()

        data_sources = [str(s) for s in self._column(non_tensor, self.reward_fn_key, bs, "set reward_fn_key")]
        reward_models = self._column(non_tensor, "reward_model", bs, "rows need reward_model={'ground_truth': ...}")
        ground_truths = []
        for index, reward_model in enumerate(reward_models):
            if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
                raise RewardInputError(
                    f"non_tensor_batch['reward_model'][{index}] is {_short(repr(reward_model))}; expected a dict "
                    "with a 'ground_truth' key"
                )
            ground_truths.append(reward_model["ground_truth"])
        extra_infos = list(non_tensor["extra_info"]) if "extra_info" in non_tensor else [{} for _ in range(bs)]
        if self.uses_default_scorer:
            for source in dict.fromkeys(data_sources):
                check_data_source(source)

        rows = responses.detach().cpu().tolist()
        solution_strs = [
            self.tokenizer.decode(row[:length], skip_special_tokens=True)
            for row, length in zip(rows, lengths, strict=True)
        ]

        turns = non_tensor.get("__num_turns__")

        def kwargs_of(index: int) -> dict[str, Any]:
            extra_info = extra_infos[index]
            if turns is not None and isinstance(extra_info, Mapping):
                # verl's naive manager: agent-loop rows tell the scorer their turns and in-rollout rewards.
                extra_info = {
                    **extra_info,
                    "num_turns": int(turns[index]),
                    "rollout_reward_scores": {
                        key: non_tensor[key][index]
                        for key in ("turn_scores", "tool_rewards", "tool_final_rewards")
                        if key in non_tensor
                    },
                }
            return {
                "data_source": data_sources[index],
                "solution_str": solution_strs[index],
                "ground_truth": ground_truths[index],
                "extra_info": dict(extra_info) if isinstance(extra_info, Mapping) else extra_info,
                **self.reward_kwargs,
            }

        def stop(outcome: Outcome) -> bool:
            return isinstance(outcome.error, RewardConfigError) or (self.on_error == "fail" and not outcome.ok)

        self._warned_kinds = set()
        if self.isolation == "process" and self._pool is None:
            raise RuntimeError("this RewardManager was closed; its reward worker processes are stopped")
        if self._pool is not None:
            items = [kwargs_of(index) for index in range(bs)]
            outcomes = self._pool.map(items, timeout_s=self.timeout_s, should_stop=stop)
        else:
            # isolation="none": one worker and no timeout make run_with_timeouts call inline in this thread.
            inline = self.isolation == "none"
            outcomes = run_with_timeouts(
                lambda i: self.compute_score(**kwargs_of(i)),
                bs,
                num_workers=1 if inline else self.num_workers,
                timeout_s=None if inline else self.timeout_s,
                should_stop=stop,
            )
        return self._assemble(outcomes, data_sources, solution_strs, ground_truths, lengths, responses, return_dict)

    def _failure(self, index: int, outcome: Outcome, data_source: str) -> tuple[str, str]:
        """(kind, detail) of a failed sample; raises for config errors and under on_error='fail'."""
        error = outcome.error
        if outcome.timed_out:
            kind = "timeout"
            how = "worker process killed" if self._pool is not None else "scorer thread abandoned, may still run"
            detail = f"no result after {self.timeout_s}s ({how})"
        elif isinstance(error, ScorerProcessDied):
            kind, detail = "crash", _short(str(error))
        else:
            kind = "invalid_result" if isinstance(error, _InvalidResult) else "exception"
            name = error.type_name if isinstance(error, ScorerRaised) else type(error).__name__
            detail = _short(f"{name}: {error}")
        if isinstance(error, RewardConfigError):
            raise error
        if self.on_error == "fail":
            failure = RewardFunctionError(index, data_source, kind, detail)
            remote = getattr(error, "remote_traceback", None)
            if remote:
                failure.add_note(f"traceback in the reward worker process:\n{remote.rstrip()}")
            raise failure from error
        if kind not in self._warned_kinds:  # once per kind per call (= per training step), not once per sample
            self._warned_kinds.add(kind)
            logger.warning(
                "reward sample %d (data_source=%r) scored 0.0 after %s: %s (further %s failures in this batch are "
                "only counted in the reward/ metrics)",
                index,
                data_source,
                kind,
                detail,
                kind,
            )
        return kind, detail

    def _assemble(self, outcomes, data_sources, solution_strs, ground_truths, lengths, responses, return_dict):
        bs, resp_len = responses.shape
        scores = [0.0] * bs
        extras: list[dict[str, Any] | None] = []  # None marks a failed sample
        errors = 0
        first: tuple[int, str, str, BaseException | None] | None = None  # (index, kind, detail, error)
        by_kind = dict.fromkeys(_KIND_METRICS.values(), 0)
        for index, outcome in enumerate(outcomes):
            if outcome is not None and outcome.ok:
                try:
                    scores[index], extra = _parse_result(outcome.value)
                    extras.append(extra)
                    continue
                except _InvalidResult as exc:
                    outcome = Outcome(error=exc, elapsed_s=outcome.elapsed_s)
            if outcome is None:  # not started: the run stopped on a failure, which _failure raises below
                extras.append(None)
                continue
            kind, detail = self._failure(index, outcome, data_sources[index])
            if first is None:
                first = (index, kind, detail, outcome.error)
            errors += 1
            if kind in _KIND_METRICS:
                by_kind[_KIND_METRICS[kind]] += 1
            extras.append(None)
        if self.stop_on_all_failed and first is not None and errors == bs:
            index, kind, detail, error = first
            failure = AllRewardsFailedError(bs, self.scorer_name, index, data_sources[index], kind, detail)
            remote = getattr(error, "remote_traceback", None)
            if remote:
                failure.add_note(f"traceback of sample {index} in the reward worker process:\n{remote.rstrip()}")
            raise failure from error
        penalties = None
        if self.overlong_buffer is not None:  # dapo: the length penalty adds to the score (a failed one is 0.0)
            penalties = [self.overlong_buffer.penalty(length) for length in lengths]
            scores = [score + penalty for score, penalty in zip(scores, penalties, strict=True)]
        reward_tensor = torch.zeros((bs, resp_len), dtype=torch.float32, device=responses.device)
        rows = [i for i in range(bs) if lengths[i] > 0]
        if rows:
            cols = [lengths[i] - 1 for i in rows]
            reward_tensor[rows, cols] = torch.tensor([scores[i] for i in rows], dtype=torch.float32).to(
                responses.device
            )
        keys = list(dict.fromkeys(key for extra in extras if extra is not None for key in extra)) or ["acc"]
        # A failed sample reports the substituted 0.0 as its score/acc and None for every other key.
        failed = {key: 0.0 if key in ("score", "acc") else None for key in keys}
        reward_extra_info = {key: [(failed if extra is None else extra).get(key) for extra in extras] for key in keys}
        if penalties is not None and self.overlong_buffer.log:
            reward_extra_info["overlong_reward"] = penalties
            reward_extra_info["overlong"] = [penalty < 0 for penalty in penalties]
        metrics = {
            "reward/errors": errors,
            **by_kind,
            "reward/empty_responses": sum(1 for length in lengths if length == 0),
        }
        self.last_metrics = metrics
        self._examine(data_sources, solution_strs, ground_truths, scores)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": reward_extra_info, "metrics": metrics}
        return reward_tensor

    def close(self) -> None:
        """Stop the worker processes (process isolation); a no-op otherwise. The manager is unusable after."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @property
    def worker_restarts(self) -> int:
        """Worker processes replaced (crash, timeout, MemoryError) over the manager's life; 0 without processes."""
        return 0 if self._pool is None else self._pool.restarts

    def _examine(self, data_sources, solution_strs, ground_truths, scores) -> None:
        if self.num_examine <= 0 or not logger.isEnabledFor(logging.INFO):
            return
        shown: dict[str, int] = {}
        for source, text, truth, score in zip(data_sources, solution_strs, ground_truths, scores, strict=True):
            if shown.get(source, 0) < self.num_examine:
                shown[source] = shown.get(source, 0) + 1
                logger.info("[%s] response=%r ground_truth=%r score=%s", source, _short(text), truth, score)
