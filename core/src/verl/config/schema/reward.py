"""``reward_model.*`` and ``custom_reward_function.*``: how responses are scored."""

from __future__ import annotations

from typing import Literal

import attrs

from verl.config.schema._fields import FreeDict, fld, free_dict, section

OnError = Literal["zero", "fail"]
RewardCombine = Literal["replace", "sum"]
Isolation = Literal["auto", "process", "thread", "none"]


@attrs.frozen(kw_only=True)
class RewardModelModelConfig:
    """A learned reward model (only used when ``reward_model.enable``)."""

    path: str | None = fld(None, doc="HF id/folder of the reward model")
    tokenizer_path: str | None = fld(None, doc="tokenizer of the reward model; null = path")
    trust_remote_code: bool = fld(False, doc="allow model/tokenizer code from the model repository")


@attrs.frozen(kw_only=True)
class RewardModelConfig:
    """Reward computation: rule scorers through a reward manager, optionally a reward model.

    ``timeout_s``/``on_error``/``num_workers`` drive the reward manager that runs scorers in
    parallel: a scorer that raises, returns a bad value or exceeds ``timeout_s`` gives reward 0
    (``zero``) or stops training (``fail``); a call in which every sample failed stops training unless
    ``stop_on_all_failed`` is false (not a verl key). ``isolation``/``memory_limit_mb`` decide where scorers
    run: ``auto`` runs ``custom_reward_function.path`` code in worker processes (killed on timeout,
    replaced on crash, address space limited) and the built-in rule scorers on threads (docs/reliability.md).

    ``reward_kwargs`` (verl: the reward manager's constructor kwargs): the keys the chosen manager takes
    (``dapo``: ``max_resp_len``, ``overlong_buffer_cfg``) go to it; the rest is our extension, keywords for
    every scorer call, also a ``custom_reward_function`` (whose own ``reward_kwargs`` win on a shared key).
    """

    enable: bool = fld(False, doc="score with a learned reward model in addition to rule scorers")
    model: RewardModelModelConfig = section(RewardModelModelConfig, doc="the reward model")
    combine: RewardCombine = fld(
        "replace",
        doc="with enable: replace = the model score is the reward and rule scorers do not run (verl's reward "
        "manager returns rm_scores when present); sum = rule score + model score",
    )
    micro_batch_size_per_gpu: int | None = fld(None, doc="reward-model forward batch per GPU (sequences)")
    reward_manager: str = fld(
        "naive",
        doc="reward manager: naive|dapo (dapo adds verl's soft overlong penalty); verl's batch and prime are "
        "refused with the alternative",
    )
    reward_kwargs: FreeDict = free_dict(
        doc="the manager's kwargs as in verl (dapo: max_resp_len, overlong_buffer_cfg {enable, len, "
        "penalty_factor, log}); other keys go to the scorer, built-in ({method: flexible}) or custom"
    )
    timeout_s: float | None = fld(30.0, doc="per-sample scorer time limit in seconds; null = none")
    on_error: OnError = fld("zero", doc="scorer exception or timeout: zero = reward 0 and log; fail = raise")
    stop_on_all_failed: bool = fld(
        True,
        doc="stop the run when every sample of a training step (or of a validation batch) failed to score, naming "
        "the reward function and the first error; false = score them 0.0 (on_error=zero) and go on",
    )
    num_workers: int = fld(8, doc="parallel scorer workers (processes or threads, see isolation)")
    isolation: Isolation = fld(
        "auto",
        doc="where scorers run: process = worker processes (custom code), thread = threads in the trainer, "
        "none = inline (no timeout); auto = process for custom_reward_function.path, thread for built-ins",
    )
    memory_limit_mb: int | None = fld(
        2048, doc="address-space limit (RLIMIT_AS) per reward worker process in MiB; null = none; process only"
    )


@attrs.frozen(kw_only=True)
class CustomRewardFunctionConfig:
    """A user scorer loaded from a file (verl ``custom_reward_function``)."""

    path: str | None = fld(None, doc="python file defining the scorer; null = built-in scorers by data_source")
    name: str = fld("compute_score", doc="function name in that file")
    reward_kwargs: FreeDict = free_dict(doc="extra kwargs bound to the function (functools.partial)")
