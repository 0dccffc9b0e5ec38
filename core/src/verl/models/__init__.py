"""Model resolution: turn ``actor_rollout_ref.model.path`` into a local HF folder (DESIGN §8).

``import verl.models`` imports neither torch nor transformers; they are loaded inside the functions.
"""

from verl.models.gguf import ModelNotFoundError, ModelResolutionError, WheelGGUFSource, convert_gguf_to_hf
from verl.models.resolve import (
    BUILTIN_MODELS,
    DEFAULT_MODEL_NAME,
    cache_root,
    check_causal_lm_folder,
    ensure_converted,
    resolve_model_path,
)
from verl.models.tokenizer import MissingChatTemplateError, check_chat_template, load_tokenizer

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL_NAME",
    "MissingChatTemplateError",
    "ModelNotFoundError",
    "ModelResolutionError",
    "WheelGGUFSource",
    "cache_root",
    "check_causal_lm_folder",
    "check_chat_template",
    "convert_gguf_to_hf",
    "ensure_converted",
    "load_tokenizer",
    "resolve_model_path",
]
