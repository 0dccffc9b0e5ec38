"""Weights out of a Megatron model, HF-named: full tensors (TP all-gather, PP broadcast) or a rollout's slices.

A mixin of :class:`verl_megatron.megatron_model.MegatronModel` (it reads ``base``, ``layout``, ``place``,
``shape``, ``hf_config``, ``layer_offset``, ``padded_vocab``, ``value_model``, ``dtype``, ``device``,
``comm_device``, ``compat``). The mapping itself is :mod:`verl_megatron.weights`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from verl_megatron import weights as wmap


class HFWeightsOut:
    """``hf_manifest()`` and ``hf_weights(layout)`` (see ``MegatronTrainingEngine.iter_weights``)."""

    def _hf_meta(self) -> list[tuple[str, tuple[int, ...]]]:
        if not hasattr(self, "_manifest"):
            import copy

            from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

            config = copy.deepcopy(self.hf_config)
            if self.value_model:
                config.num_labels = 1
            with torch.device("meta"):
                cls = AutoModelForTokenClassification if self.value_model else AutoModelForCausalLM
                meta = cls.from_config(config)
            self._manifest = [(k, tuple(v.shape)) for k, v in meta.state_dict().items()]
        return self._manifest

    def hf_manifest(self) -> list[tuple[str, tuple[int, ...]]]:
        """``(hf_name, full shape)`` of every weight, in the HF model's ``state_dict`` order."""
        return list(self._hf_meta())

    def _gather_tp(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        if self.layout.tp == 1:
            return [tensor]
        from megatron.core import parallel_state as ps

        src = tensor.detach().to(self.comm_device).contiguous()
        parts = [torch.empty_like(src) for _ in range(self.layout.tp)]
        dist.all_gather(parts, src, group=ps.get_tensor_model_parallel_group())
        return [p.to(self.device) for p in parts]

    def _stage_of(self, hf_name: str) -> int:
        per_stage = self.shape.num_layers // self.layout.pp
        if hf_name.startswith("model.embed_tokens."):
            return 0
        if hf_name.startswith("model.layers."):
            return int(hf_name.split(".")[2]) // per_stage
        return self.layout.pp - 1

    def _local_full(self, names: set[str]) -> dict[str, torch.Tensor]:
        """Full HF tensors of ``names`` from this stage's TP shards (collective over the TP group)."""
        state = {k: v for k, v in self.base.state_dict().items() if "_extra_state" not in k}
        out: dict[str, torch.Tensor] = {}
        for mname, tensor in state.items():
            if self.value_model and mname.startswith("output_layer."):  # replicated value head: HF's score.*
                hf_name = "score." + mname.split(".")[-1]
                if hf_name in names:
                    out[hf_name] = tensor.detach()
                continue
            produced = wmap.hf_names_for(mname, self.shape, self.layer_offset)
            if not set(produced) & names:
                continue
            shards = self._gather_tp(tensor)
            for hf_name, full in wmap.hf_from_gathered(
                mname, shards, self.shape, layer_offset=self.layer_offset, padded_vocab=self.padded_vocab
            ):
                if hf_name in names:
                    out[hf_name] = full
        return out

    def _groups(self) -> list[list[tuple[str, tuple[int, ...]]]]:
        groups: list[list[tuple[str, tuple[int, ...]]]] = []
        key = None
        for name, shape in self._hf_meta():
            k = ("layer", name.split(".")[2]) if name.startswith("model.layers.") else ("other", name)
            if k != key:
                groups.append([])
                key = k
            groups[-1].append((name, shape))
        return groups

    def _direct_pieces(self, layout: Any) -> dict[str, torch.Tensor] | None:
        """With one pipeline stage: the HF-named pieces of this rank's TP shards that are exactly what ``layout``
        asks of this rank, for every weight, or None when some rank's ask differs for some weight (then everything
        is cut from gathered tensors). One all-reduce decides, so every rank takes the same path."""
        if self.layout.pp != 1 or self.value_model:
            return None
        rank = dist.get_rank()
        full_shapes = dict(self._hf_meta())
        pieces: dict[str, torch.Tensor] = {}
        ok = True
        for mname, tensor in self.base.state_dict().items():
            if "_extra_state" in mname:
                continue
            for hf_name, local, dim, start, stop in wmap.hf_pieces_from_shard(
                mname,
                tensor,
                self.shape,
                tp_size=self.layout.tp,
                tp_rank=self.place.tp_rank,
                layer_offset=self.layer_offset,
                padded_vocab=self.padded_vocab,
            ):
                names = [hf_name]
                if self.shape.tie_word_embeddings and hf_name == "model.embed_tokens.weight":
                    names.append("lm_head.weight")
                for name in names:
                    if name not in full_shapes:
                        continue
                    want = layout.slice_for(name, full_shapes[name], rank)
                    if want is None:
                        ok &= dim is None
                    else:
                        ok &= (dim, start, stop) == (want.dim, want.start, want.stop)
                    pieces[name] = local
        ok &= set(pieces) == set(full_shapes)
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.comm_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return pieces if int(flag) == 1 else None

    @torch.no_grad()
    def hf_weights(self, layout: Any = None, *, stats: Any = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Full HF-named weights (or this rank's rollout slice of each); see ``MegatronTrainingEngine.iter_weights``."""
        from megatron.core import parallel_state as ps

        rank = dist.get_rank()
        pp_rank = self.place.pp_rank
        tied = self.shape.tie_word_embeddings
        direct = self._direct_pieces(layout) if layout is not None else None
        if direct is not None:  # the rollout's TP layout is this engine's: each rank sends what it holds
            for name, _ in self._hf_meta():
                tensor = direct[name].detach()
                if stats is not None:
                    stats.tensors += 1
                    stats.bytes += tensor.numel() * tensor.element_size()
                yield name, tensor
            return
        with self.compat():
            for group in self._groups():
                names = {n for n, _ in group}
                # Tied head: HF's state_dict lists lm_head.weight; it is the embedding.
                source = {n: ("model.embed_tokens.weight" if tied and n == "lm_head.weight" else n) for n in names}
                stage = self._stage_of(next(iter(source.values())))
                full = self._local_full(set(source.values())) if stage == pp_rank else {}
                for name, shape in group:
                    tensor = full.get(source[name])
                    if self.layout.pp > 1:
                        if tensor is None:
                            tensor = torch.empty(shape, dtype=self.dtype, device=self.comm_device)
                        else:
                            tensor = tensor.to(self.comm_device).contiguous()
                        src = dist.get_global_rank(ps.get_pipeline_model_parallel_group(), stage)
                        dist.broadcast(tensor, src=src, group=ps.get_pipeline_model_parallel_group())
                        tensor = tensor.to(self.device)
                    if layout is not None:
                        piece = layout.slice_for(name, shape, rank)
                        if piece is not None:
                            tensor = tensor.narrow(piece.dim, piece.start, piece.length).clone()
                        if stats is not None:
                            stats.full_gathers += 1
                    if stats is not None:
                        stats.tensors += 1
                        stats.bytes += tensor.numel() * tensor.element_size()
                    yield name, tensor
