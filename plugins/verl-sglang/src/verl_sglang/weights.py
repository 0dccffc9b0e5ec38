"""Weight-update payloads for ``sglang.Engine.update_weights_from_tensor(load_format="flattened_bucket")``.

SGLang's receiving side (``srt/model_executor/model_runner_components/weight_updater.py``,
``_update_weights_from_flattened_bucket``; the same in 0.5.8's ``model_runner.py``) takes, per TP rank, one
``MultiprocessingSerializer.serialize({"flattened_tensor": t, "metadata": bucket.get_metadata()})`` of a
``FlattenedTensorBucket`` (``srt/weight_sync/tensor_bucket.py``), rebuilds the named tensors and calls the
model's ``load_weights``, which casts each to its parameter's dtype and fuses q/k/v and gate/up itself.

Three things this module adds:

* the names and shapes are checked before anything is sent (core's
  :func:`verl.engines.weight_sync.names.update_buckets`): SGLang's ``load_weights`` skips a name its model does
  not have without failing (``if name not in params_dict: continue``, or a log warning "Parameter ... not
  found in params_dict" in ``srt/models/llama.py`` / ``qwen2.py``), so a misspelt update would change nothing;
* a bucket is packed per dtype: ``FlattenedTensorBucket`` concatenates the tensors' bytes and views each slice
  back as its dtype, which fails when a slice's offset is not a multiple of its element size (e.g. 3 float16
  values before a float32 one); one flattened tensor per dtype keeps every offset aligned;
* a tied LM head goes as ``model.embed_tokens.weight``: SGLang's models hold one tensor for both and skip
  ``lm_head.weight`` when the embeddings are tied (``srt/models/llama.py`` ``load_weights``).

On an accelerator the flattened tensor is moved to this rank's device before it is serialized and SGLang's
``monkey_patch_torch_reductions`` is applied, so the payload is a CUDA/NPU IPC handle (SGLang's own
``weight_sync/utils.py`` does the same; the patched reducer cannot take CPU tensors). On cpu (tests, SGLang's
Xeon backend) the payload carries a shared-memory CPU tensor.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import torch

from verl.engines.weight_sync.names import update_buckets

EMBEDDING, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"
LOAD_FORMAT = "flattened_bucket"


def tied_to_embedding(weights: Iterable[tuple[str, torch.Tensor]], tied: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream SGLang can load: with ``tied`` embeddings, ``lm_head.weight`` is sent as
    ``model.embed_tokens.weight`` unless that was already sent (then dropped: it is the same tensor in SGLang)."""
    sent_embedding = False
    for name, tensor in weights:
        if tied and name == LM_HEAD:
            if sent_embedding:
                continue
            name = EMBEDDING
        sent_embedding = sent_embedding or name == EMBEDDING
        yield name, tensor


def checked_buckets(
    weights: Iterable[tuple[str, torch.Tensor]],
    shapes: dict[str, tuple[int, ...]],
    *,
    bucket_bytes: int,
    tied: bool,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Buckets of at least ``bucket_bytes`` (a fused q/k/v or gate/up group never split), each checked against
    the checkpoint's names and shapes before it is yielded (core's ``update_buckets``; tensors copied on arrival).

    Raises:
        UnknownWeightError (KeyError): a name the checkpoint does not have (closest names suggested).
        ValueError: a shape mismatch, or part of a fused group.
    """
    # tied=False for core: SGLang takes the embedding alone (tied_to_embedding), an extra lm_head copy is waste.
    yield from update_buckets(
        tied_to_embedding(weights, tied), shapes, bucket_bytes=bucket_bytes, tied=False, engine="sglang"
    )


def dtype_groups(bucket: list[tuple[str, torch.Tensor]]) -> list[list[tuple[str, torch.Tensor]]]:
    """``bucket`` split by dtype (first-seen order; order kept inside each group), one flattened tensor each."""
    groups: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in bucket:
        groups.setdefault(tensor.dtype, []).append((name, tensor))
    return list(groups.values())


@attrs.frozen
class SGLangWeightAPI:
    """The SGLang classes a weight update uses (the real ones from :func:`load_weight_api`, or a test's).

    Attributes:
        bucket_cls: ``FlattenedTensorBucket``.
        serializer: ``MultiprocessingSerializer`` (``serialize(obj) -> bytes``).
        patch_reductions: SGLang's ``monkey_patch_torch_reductions`` (device-uuid IPC handles), or None.
        ipc: payloads carry device IPC handles on an accelerator (the flattened tensor moved to the rank's device
            first, reductions patched): True for the real API; a stand-in sets False to keep host tensors.
    """

    bucket_cls: Any
    serializer: Any
    patch_reductions: Any = None
    ipc: bool = True


def load_weight_api() -> SGLangWeightAPI:
    """The real classes from the installed sglang (imported here, lazily).

    Raises:
        ImportError: sglang (or its ``weight_sync`` / ``utils`` modules) cannot be imported.
    """
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    return SGLangWeightAPI(FlattenedTensorBucket, MultiprocessingSerializer, monkey_patch_torch_reductions)


class BucketPacker:
    """Packs named tensors into one ``flattened_bucket`` payload for this rank.

    Args:
        api: :class:`SGLangWeightAPI`.
        device: this rank's torch device; on ``cuda``/``npu`` the flattened tensor goes there (an IPC handle).

    Raises:
        ValueError: mixed dtypes in one :meth:`pack` call (split with :func:`dtype_groups` first), or nothing.
    """

    def __init__(self, api: SGLangWeightAPI, device: Any) -> None:
        self.api = api
        device = torch.device(device)
        # None: keep the tensors where they are (cpu, or a stand-in API).
        self.device = device if device.type != "cpu" and api.ipc else None
        if self.device is not None and api.patch_reductions is not None:
            api.patch_reductions()

    def pack(self, named: list[tuple[str, torch.Tensor]]) -> tuple[bytes, torch.Tensor]:
        """``(payload, flattened tensor)``: keep the tensor alive until SGLang has loaded the payload (the IPC
        handle points into it).

        Raises:
            ValueError: ``named`` is empty or holds several dtypes.
        """
        if not named:
            raise ValueError("BucketPacker.pack: no tensors to pack")
        dtypes = {t.dtype for _, t in named}
        if len(dtypes) > 1:
            raise ValueError(f"BucketPacker.pack: one dtype per flattened bucket, got {sorted(map(str, dtypes))}")
        bucket = self.api.bucket_cls(named_tensors=[(n, t.detach()) for n, t in named])
        flat = bucket.get_flattened_tensor()
        if self.device is not None and flat.device != self.device:
            flat = flat.to(self.device)
        payload = self.api.serializer.serialize({"flattened_tensor": flat, "metadata": bucket.get_metadata()})
        return payload, flat
