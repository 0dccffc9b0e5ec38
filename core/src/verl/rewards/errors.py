"""Exceptions raised by :mod:`verl.rewards`.

All of them derive from :class:`ValueError` (team contract); the configuration errors are raised no matter which
``on_error`` policy the reward manager uses, because a wrong data source or a wrong keyword is never a per-sample
accident and must not be silently scored zero.
"""

from __future__ import annotations


class RewardConfigError(ValueError):
    """The reward configuration is wrong (unknown data source, unknown keyword, bad custom function)."""


class UnknownDataSourceError(RewardConfigError):
    """``default_compute_score`` has no built-in scorer for this ``data_source``."""


class UnknownRewardKwargError(RewardConfigError, TypeError):
    """A keyword in ``reward_kwargs`` is accepted by no built-in scorer (usually a typo)."""


class RewardFunctionLoadError(RewardConfigError):
    """``custom_reward_function.path`` / ``.name`` could not be turned into a usable scoring function."""


class RewardInputError(ValueError):
    """The batch handed to the reward manager lacks a field it needs or has inconsistent shapes."""


class RewardFunctionError(ValueError):
    """A scoring function failed on one sample and the manager runs with ``on_error="fail"``.

    Attributes:
        index: row of the sample in the batch.
        data_source: the sample's ``data_source`` (value of ``reward_fn_key``).
        kind: ``"exception"``, ``"timeout"`` or ``"invalid_result"``.
        detail: short description of what went wrong.
    The original exception, if any, is chained as ``__cause__``.
    """

    def __init__(self, index: int, data_source: object, kind: str, detail: str) -> None:
        self.index = index
        self.data_source = data_source
        self.kind = kind
        self.detail = detail
        super().__init__(
            f"reward function failed on sample {index} (data_source={data_source!r}): {kind}: {detail}. "
            "Fix the scoring function, or construct the reward manager with on_error='zero' to score such "
            "samples 0.0 and count them in the reward/errors metric."
        )

    def __reduce__(self):  # keep the exception picklable (worker processes, Ray)
        return (type(self), (self.index, self.data_source, self.kind, self.detail))


class AllRewardsFailedError(RewardFunctionError):
    """Every sample of one reward call (a training step's batch, a validation batch) failed to score.

    Raised under either ``on_error`` policy unless ``reward_model.stop_on_all_failed`` is false: a step whose
    rewards are all substitutes measures nothing and trains on nothing but noise.

    Attributes:
        samples: number of samples in the call (all failed).
        scorer: the reward function, as a phrase (``'compute_score' in /path/reward.py``, or the built-in scorers).
        index, data_source, kind, detail: the first failing sample (lowest index) and its error, as in
            :class:`RewardFunctionError`.
        context: where the call came from (``"training step 3"``, ``"validation at step 4"``), or ``""``; set by
            the trainer and included in the message.
    The first sample's original exception, if any, is chained as ``__cause__``.
    """

    def __init__(
        self, samples: int, scorer: str, index: int, data_source: object, kind: str, detail: str, context: str = ""
    ) -> None:
        self.samples = samples
        self.scorer = scorer
        self.context = context
        ValueError.__init__(self, samples, scorer, index, data_source, kind, detail, context)
        self.index = index
        self.data_source = data_source
        self.kind = kind
        self.detail = detail

    def __str__(self) -> str:
        where = f" of {self.context}" if self.context else ""
        return (
            f"every reward failed: all {self.samples} samples{where} failed in the reward function "
            f"{self.scorer}; the first, sample {self.index} (data_source={self.data_source!r}): {self.kind}: "
            f"{self.detail}. Nothing was scored, so the run stopped rather than train on all-zero rewards. Fix "
            "the reward function (the reward/errors metric counts failures), or set "
            "reward_model.stop_on_all_failed=false to score such steps 0.0 and go on."
        )

    def __reduce__(self):
        args = (self.samples, self.scorer, self.index, self.data_source, self.kind, self.detail, self.context)
        return (type(self), args)


class ScorerRaised(Exception):
    """Stand-in for an exception a scorer raised in a worker process whose class the trainer cannot unpickle.

    Attributes:
        type_name: class name of the original exception (e.g. ``"MyScorerError"``).
        message: ``str()`` of the original exception.
    The worker's formatted traceback is attached as ``remote_traceback`` by the pool.
    """

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        self.message = message
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.type_name, self.message))


class ScorerProcessDied(Exception):
    """The reward worker process died while scoring a sample (segfault, ``os._exit``, killed for memory)."""
