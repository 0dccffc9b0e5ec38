"""Engine protocols (training, rollout, weight sync) and the reference engines.

Backends (FSDP, vLLM, ...) implement these protocols in plugins; the reference engines in
:mod:`verl.engines.reference` run anywhere torch runs and are the numerical oracle.
"""

from verl.engines.base import CheckpointEngine, RolloutEngine, TrainingEngine

__all__ = ["CheckpointEngine", "RolloutEngine", "TrainingEngine"]
