"""Reference rollout engine: a HF ``transformers`` causal LM with its own KV-cache decode loop.

Implements :class:`verl.engines.base.RolloutEngine`. The decode loop (rather than HF ``generate``)
gives exact per-token log-probs from the very logits used for sampling, drops finished rows from the
batch (and the KV cache) as soon as they emit EOS, and stops when every row has finished.

One response per input row: the trainer repeats each prompt ``rollout.n`` times (``repeat(n,
interleave=True)``) before calling :meth:`HFRolloutEngine.generate`, as verl does, so ``config.n`` is
not used here.
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from verl.engines import attention
from verl.engines.dtypes import resolve_dtype
from verl.engines.prompts import check_prompt_batch
from verl.engines.reference.decode_linears import skinny_linears
from verl.engines.reference.postprocess import build_rollout_batch, compute_position_ids
from verl.engines.reference.rollout_options import context_limit, generation_chunks, load_kwargs
from verl.engines.reference.rollout_weights import RolloutWeights, StaleWeightsError, UnknownWeightError, check_tags
from verl.engines.reference.sampling import SamplingParams, resolve_sampling_params, select_next_tokens

if TYPE_CHECKING:
    from verl.protocol import DataProto


_SERVER_LOCK = threading.Lock()  # module-wide, so an engine holds no lock (it stays picklable / copyable)


#: Prefill each distinct prompt of a batch once (:func:`shared_prompt_rows`); tests turn it off to compare.
SHARE_PROMPT_PREFILL = True


def shared_prompt_rows(input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows that repeat another row's prompt: ``(owner, firsts)`` or None when every prompt is distinct.

    Args:
        input_ids, mask: ``(batch, prompt_len)`` left-padded prompts and their attention mask.

    Returns:
        ``firsts`` ``(distinct,)``: the first row of each distinct prompt (tokens and mask equal); ``owner``
        ``(batch,)``: for each row, the index into ``firsts`` of its prompt.
    """
    key = torch.cat([input_ids * mask, mask], dim=1)
    _, owner = torch.unique(key, dim=0, return_inverse=True)
    distinct = int(owner.max()) + 1 if owner.numel() else 0
    if distinct == key.shape[0]:
        return None
    rows = torch.arange(key.shape[0], device=owner.device)
    firsts = torch.full((distinct,), key.shape[0], dtype=torch.long, device=owner.device)
    firsts = firsts.scatter_reduce(0, owner, rows, reduce="amin")
    return owner, firsts


def _cfg(config: Any, name: str, default: Any) -> Any:
    value = getattr(config, name, default)
    return default if value is None else value


def _eos_ids(tokenizer: Any, model: Any) -> list[int]:
    ids: list[int] = []
    for source in (getattr(tokenizer, "eos_token_id", None), getattr(model.generation_config, "eos_token_id", None)):
        for i in [source] if isinstance(source, int) else list(source or []):
            if i not in ids:
                ids.append(int(i))
    return ids


class HFRolloutEngine:
    """Batched generation with a HF causal LM (the CPU default and the oracle for rollout plugins).

    Args:
        model_path_or_model: a model path/name (resolved by :func:`verl.models.resolve_model_path` and loaded
            in ``config.dtype``) or a live ``PreTrainedModel``. A live model is used as is, never copied,
            cast or moved: pass the trainer's module to share weights (then weight sync is a no-op, see
            :class:`verl.engines.weight_sync.colocated.ColocatedCheckpointEngine`).
        tokenizer: HF tokenizer (its ``eos_token_id`` and ``pad_token_id`` are used); None loads it from the path.
        config: rollout config section (verl names, read with ``getattr`` and defaults): ``temperature`` (1.0),
            ``top_p`` (1.0), ``top_k`` (-1), ``do_sample`` (True), ``response_length`` (512),
            ``calculate_log_probs`` (False), ``val_kwargs`` (greedy), ``dtype`` ("auto": float32 on CPU,
            bfloat16 on accelerators), ``seed`` (0), ``tensor_model_parallel_size`` (1), the engine keys
            ``max_num_seqs`` (rows decoded together, 1024), ``max_num_batched_tokens`` (prefill budget),
            ``max_model_len``, ``load_format``, ``ignore_eos`` (see :mod:`~verl.engines.reference.rollout_options`).
            Its ``engine_kwargs`` are not read: the options come validated through ``options``.
        device: torch device for a model loaded from a path; default the live model's device, else the
            ``cpu`` (callers pass their platform's ``torch_device()``; the engine never resolves a platform).
        options: :class:`~verl.engines.reference.builders.HFRolloutOptions` (validated at config load,
            :func:`verl.config.role_options`); None = the defaults.
        model_config: the ``actor_rollout_ref.model`` section, for a model loaded from a path: its
            ``trust_remote_code`` and ``override_config`` are applied as for the actor
            (:func:`verl.models.hf_config.load_hf_config`), so both generate with one architecture. None (or
            a live module, which already carries its config) = neither.

    Tensor parallelism (``tensor_model_parallel_size = T > 1``, a model path, a torch.distributed world of
    ``W`` ranks, ``T`` dividing ``W``): the loaded model is split over this rank's group of ``T`` consecutive
    ranks (:mod:`verl.engines.reference.tensor_parallel`); every rank of a group must call :meth:`generate`
    with the same prompts, and all return the same responses.

    Raises:
        ValueError: a TP size that does not divide the world, the heads, key/value heads, vocabulary or MLP
            width (the message lists valid sizes), or TP with a live module or without a world; an
            ``override_config`` key the model config lacks.
        TypeError: a live module without a tokenizer.

    Sampling is seeded: one ``torch.Generator`` seeded with ``config.seed`` lives as long as the engine,
    so an identical sequence of calls reproduces identical samples.

    Serving (``rollout.mode=async``): :meth:`server` gives the engine's one
    :class:`~verl.engines.reference.server.HFRolloutServer` (created on first use), which decodes concurrent
    token-in/token-out requests with continuous batching on this engine's model in a background thread; a
    request with ``seed=s`` samples what a row with ``sample_seed=s`` samples here. While it has requests in
    flight, :meth:`update_weights` and :meth:`sleep` raise RuntimeError; :meth:`generate` must not run then
    either (both would drive the one model and its generator from two threads).
    """

    def __init__(
        self,
        model_path_or_model: Any,
        tokenizer: Any = None,
        config: Any = None,
        *,
        device: Any = None,
        options: Any = None,
        model_config: Any = None,
    ) -> None:
        self.config = config
        if options is None:
            from verl.engines.reference.builders import HFRolloutOptions

            options = HFRolloutOptions()
        self.options = options
        tp_size = int(_cfg(config, "tensor_model_parallel_size", 1))
        if isinstance(model_path_or_model, torch.nn.Module):
            if tp_size > 1:
                raise ValueError(
                    "HFRolloutEngine: a live (shared) module cannot be split for tensor parallelism; pass a model path "
                    f"with actor_rollout_ref.rollout.tensor_model_parallel_size={tp_size}"
                )
            self.model = model_path_or_model
            self.owns_model = False
            self.device = torch.device(device) if device is not None else next(self.model.parameters()).device
            if tokenizer is None:
                raise TypeError("HFRolloutEngine: pass `tokenizer` when giving a live model instead of a path")
        else:
            from transformers import AutoModelForCausalLM

            from verl.models import load_tokenizer, resolve_model_path
            from verl.models.hf_config import load_hf_config

            path = resolve_model_path(os.fspath(model_path_or_model))
            if device is None:
                # The caller (the worker, through the factory) passes its platform's device; never resolve here.
                device = "cpu"
            self.device = torch.device(device)
            dtype = resolve_dtype(_cfg(config, "dtype", None), self.device, field="rollout.dtype")
            trust = bool(getattr(model_config, "trust_remote_code", False))
            hf_config = load_hf_config(
                path, trust_remote_code=trust, override_config=getattr(model_config, "override_config", None)
            )
            self.model = (
                AutoModelForCausalLM.from_pretrained(
                    path, config=hf_config, dtype=dtype, trust_remote_code=trust, **load_kwargs(config)
                )
                .to(self.device)
                .eval()
            )
            self.owns_model = True
            if tokenizer is None:
                tokenizer = load_tokenizer(path, trust_remote_code=trust)
        self.tokenizer = tokenizer
        self.layout, self.rank = self._tensor_parallel(tp_size)
        self.weights = RolloutWeights(
            self.model,
            owned=self.owns_model,
            device=self.device,
            sleep_level=self.options.sleep_level,
            layout=self.layout,
            rank=self.rank,
        )
        # A superset of sdpa (same results) whose decode step reads the KV cache without copying it.
        attention.install(self.model)
        self.eos_token_ids = _eos_ids(tokenizer, self.model)
        if not self.eos_token_ids:
            raise ValueError("HFRolloutEngine: neither the tokenizer nor generation_config defines an eos_token_id")
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        self.generator = torch.Generator(device=self.device).manual_seed(int(_cfg(config, "seed", 0)))
        # transformers >= 5.2x renamed forward's `past_key_values` to `cache` (the old name warns).
        forward_params = inspect.signature(self.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_params else "past_key_values"
        self.last_stats: dict[str, float] = {}
        self._server: Any = None

    def _tensor_parallel(self, tp_size: int) -> tuple[Any, int]:
        """Split the owned model over its TP group when ``tp_size > 1``; returns ``(layout or None, rank)``.

        An owned model on a world of several ranks gets a layout even at ``tp_size == 1`` (every rank holds
        the whole model): the weight sync then hands each rank whole tensors, reshared from the trainer's shards.
        """
        import torch.distributed as dist

        initialised = dist.is_available() and dist.is_initialized()
        world, rank = (dist.get_world_size(), dist.get_rank()) if initialised else (1, 0)
        if tp_size > 1 and world % tp_size:
            from verl.engines.weight_sync.layout import TP_KEY, divisors

            raise ValueError(
                f"{TP_KEY}={tp_size} must divide the rollout world size {world} (data-parallel replicas x "
                f"tensor-parallel size); valid: {divisors(world)}"
            )
        if not self.owns_model or world == 1:
            if tp_size > 1:
                raise ValueError(
                    f"HFRolloutEngine: tensor_model_parallel_size={tp_size} needs a torch.distributed world of at "
                    "least that many ranks (trainer.controller=ray with trainer.n_gpus_per_node x nnodes workers)"
                )
            return None, rank
        from verl.engines.weight_sync.layout import TensorParallelLayout, tensor_parallel_problems

        problems = tensor_parallel_problems(self.model.config, tp_size, world)
        if problems:
            raise ValueError("; ".join(problems))
        layout = TensorParallelLayout.for_model(self.model.config, world, tp_size)
        if tp_size > 1:
            from verl.engines.reference.tensor_parallel import parallelize_causal_lm, tensor_parallel_mesh

            self.tp_mesh = tensor_parallel_mesh(layout, self.device.type)
            parallelize_causal_lm(self.model, layout, self.tp_mesh)
        return layout, rank

    def weight_layout(self) -> Any:
        """The :class:`~verl.engines.weight_sync.layout.WeightLayout` this engine's weights follow across the
        world (None: one process holds everything, or the weights are the trainer's own module)."""
        return self.layout

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: DataProto) -> DataProto:
        """Generate one response per row of ``prompts``.

        Input: ``prompts.batch["input_ids"]`` and ``["attention_mask"]`` ``(bs, prompt_len)``, left-padded
        (``position_ids`` are recomputed from the mask, K07); optional ``sample_seed`` ``(bs,)`` int64 gives
        each row its own sampler seed, so a row samples the same tokens whatever other rows share its
        batch (any data-parallel split, any chunking). ``meta_info`` may hold ``seed`` (reseeds the sampler
        for this call when rows carry no ``sample_seed``), ``validate``,
        ``do_sample``, ``temperature``, ``top_p``, ``top_k``, ``response_length`` (see
        :func:`~verl.engines.reference.sampling.resolve_sampling_params`).

        Output (same device as the input): ``prompts, input_ids, attention_mask, position_ids``
        ``(bs, prompt_len + resp_len)`` resp. ``(bs, prompt_len)``, ``responses`` and ``response_mask``
        ``(bs, resp_len)`` int64 with ``resp_len = config.response_length`` (right-padded with the pad id,
        the EOS token kept valid, K06), and ``rollout_log_probs`` ``(bs, resp_len)`` float32 when
        ``config.calculate_log_probs``: ``log_softmax(logits / T)`` at the chosen token (T = 1 when greedy,
        K09), 0 on padding. ``meta_info["timing"]["generate_sequences"]`` holds the wall time in seconds.
        The input's ``non_tensor_batch`` and other ``meta_info`` are not copied: the trainer unions the
        output with its own batch, as in verl.

        Raises:
            KeyError: ``input_ids`` / ``attention_mask`` missing.
            ValueError: prompts not left-padded, an empty prompt row, prompt + response longer than the
                model's ``max_position_embeddings`` (or ``max_model_len``), or one prompt longer than
                ``max_num_batched_tokens``.
        """
        from verl.protocol import DataProto

        start = time.perf_counter()
        batch = prompts.batch
        present = set(batch.keys()) if batch is not None else set()
        for key in ("input_ids", "attention_mask"):
            if key not in present:
                raise KeyError(f"HFRolloutEngine.generate: prompts.batch needs {key!r} (bs, prompt_len)")
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        out_device = input_ids.device
        meta = prompts.meta_info or {}
        params = resolve_sampling_params(self.config, meta)
        if meta.get("seed") is not None:
            # A per-call seed makes a call's samples depend only on (seed, weights, prompts): the trainer
            # passes one derived from the step, so a resumed run samples what the uninterrupted run did.
            self.generator.manual_seed(int(meta["seed"]))
        resp_len = int(meta.get("response_length") or _cfg(self.config, "response_length", 512))
        self._check_prompts(input_ids, attention_mask, resp_len)
        if self.weights.asleep:
            self.wake_up()
        self.weights.require_current()

        row_seeds = batch["sample_seed"].tolist() if "sample_seed" in present and not params.greedy else None
        chunks = generation_chunks(
            attention_mask,
            getattr(self.config, "max_num_seqs", None),
            getattr(self.config, "max_num_batched_tokens", None),
        )
        was_training = self.model.training
        self.model.eval()
        try:
            with skinny_linears(self.model):
                parts = [
                    self._decode(
                        input_ids[i:j].to(self.device),
                        attention_mask[i:j].to(self.device),
                        params,
                        resp_len,
                        None if row_seeds is None else self._row_generators(row_seeds[i:j]),
                    )
                    for i, j in chunks
                ]
        finally:
            self.model.train(was_training)
        responses = torch.cat([p[0] for p in parts]).to(out_device)
        lengths = torch.cat([p[1] for p in parts]).to(out_device)
        log_probs = torch.cat([p[2] for p in parts]).to(out_device)
        tensors = build_rollout_batch(
            input_ids,
            attention_mask,
            responses,
            lengths,
            self.pad_token_id,
            log_probs if _cfg(self.config, "calculate_log_probs", False) else None,
        )
        seconds = time.perf_counter() - start
        n_tokens = int(lengths.sum())
        self.last_stats = {"seconds": seconds, "tokens": n_tokens, "tokens_per_s": n_tokens / max(seconds, 1e-9)}
        return DataProto.from_dict(tensors=tensors, meta_info={"timing": {"generate_sequences": seconds}})

    def _check_prompts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, resp_len: int) -> None:
        limit, source = context_limit(self.model.config, self.config)
        check_prompt_batch(input_ids, attention_mask, resp_len, limit, source)

    def _row_generators(self, seeds: list[int]) -> list[torch.Generator]:
        return [torch.Generator(device=self.device).manual_seed(int(seed) % (1 << 63)) for seed in seeds]

    @torch.no_grad()
    def _decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        resp_len: int,
        row_generators: list[torch.Generator] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """KV-cache decode of one chunk; returns ``(responses, lengths, log_probs)`` on ``self.device``.

        The prompt columns that are padding in every row are dropped before the prefill (exact: positions
        come from the mask, and a column masked for every row changes no logit), so a batch left-padded to
        ``max_prompt_length`` costs only its longest prompt. Keys and values go into a preallocated cache
        (:mod:`~verl.engines.reference.kv_cache`) where the model allows it. Rows that emit EOS are removed
        from the running batch and the cache (``batch_select_indices``), so finished rows cost nothing;
        ``lengths`` stays ``resp_len`` for rows that never emit EOS. Sampling uses one uniform draw per
        row and step, drawn up front from the row's own generator (or the engine's): a row's tokens
        depend only on its seed, its prompt and the weights.
        """
        from transformers import DynamicCache

        from verl.engines.reference.kv_cache import preallocated_cache

        bs = input_ids.shape[0]
        responses = torch.full((bs, resp_len), self.pad_token_id, dtype=torch.long, device=self.device)
        log_probs = torch.zeros((bs, resp_len), dtype=torch.float32, device=self.device)
        lengths = torch.full((bs,), resp_len, dtype=torch.long, device=self.device)
        if bs == 0:
            return responses, lengths, log_probs
        # ignore_eos: no token ends a row, so every row decodes resp_len tokens (vLLM's SamplingParams.ignore_eos).
        stop_ids = [] if _cfg(self.config, "ignore_eos", False) else self.eos_token_ids
        eos = torch.tensor(stop_ids, dtype=torch.long, device=self.device)
        mask = attention_mask.long()
        position_ids = compute_position_ids(mask)
        used = mask.bool().any(dim=0)
        first = int(used.long().argmax()) if bool(used.any()) else mask.shape[1] - 1
        input_ids, mask, position_ids = input_ids[:, first:], mask[:, first:], position_ids[:, first:]
        uniforms = None
        if not params.greedy:
            if row_generators is not None:
                uniforms = torch.stack([torch.rand(resp_len, generator=g, device=self.device) for g in row_generators])
            else:
                uniforms = torch.rand(bs, resp_len, generator=self.generator, device=self.device)
        cache = preallocated_cache(self.model.config, mask.shape[1] + resp_len) or DynamicCache(
            config=self.model.config
        )
        # GRPO's n samples of a prompt are n equal rows: prefill each distinct prompt once, then copy its keys,
        # values and last logits to every row holding it (what vLLM's prefix cache saves).
        owner = shared_prompt_rows(input_ids, mask) if SHARE_PROMPT_PREFILL else None
        prefill = slice(None) if owner is None else owner[1]
        out = self.model(
            input_ids=input_ids[prefill],
            attention_mask=mask[prefill],
            position_ids=position_ids[prefill],
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        logits = out.logits[:, -1, :]
        if owner is not None:
            logits = logits[owner[0]]
            cache.batch_select_indices(owner[0])
        rows = torch.arange(bs, device=self.device)  # original row of each running row
        next_pos = position_ids[:, -1] + 1
        for step in range(resp_len):
            draws = None if uniforms is None else uniforms[rows, step]
            tokens, logp = select_next_tokens(logits, params, draws)
            responses[rows, step] = tokens
            log_probs[rows, step] = logp
            done = torch.isin(tokens, eos)
            if bool(done.any()):
                lengths[rows[done]] = step + 1
                keep = torch.nonzero(~done).flatten()
                if keep.numel() == 0:
                    break
                rows, tokens, mask, next_pos = rows[keep], tokens[keep], mask[keep], next_pos[keep]
                cache.batch_select_indices(keep)
            if step == resp_len - 1:
                break
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            out = self.model(
                input_ids=tokens.unsqueeze(1),
                attention_mask=mask,
                position_ids=next_pos.unsqueeze(1),
                use_cache=True,
                **{self._cache_kwarg: cache},
            )
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1
        return responses, lengths, log_probs

    def server(self) -> Any:
        """This engine's :class:`~verl.engines.reference.server.HFRolloutServer` (one per engine, built once).

        Raises:
            NotImplementedError / ValueError: see :class:`~verl.engines.reference.server.HFRolloutServer`.
        """
        with _SERVER_LOCK:
            if self._server is None:
                from verl.engines.reference.server import HFRolloutServer

                self._server = HFRolloutServer(self)
            return self._server

    def _require_idle(self, what: str) -> None:
        if self._server is not None:
            self._server.require_idle(f"HFRolloutEngine.{what}")

    # ------------------------------------------------------------------ weights and memory
    def check_weights(self, specs: Any) -> None:
        """Refuse an update before anything is written (names known; shapes this rank's shard or the full one).

        Args:
            specs: ``(hf_name, shape)`` pairs of the tensors the update will carry.

        Raises:
            UnknownWeightError (KeyError): a name the model does not have (closest names suggested).
            ValueError: a shape mismatch (both shapes named).
        """
        self.weights.check(specs)

    def update_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Copy ``(hf_name, tensor)`` pairs into the live model (in place, converting dtype/device).

        Names are the model's ``state_dict`` keys; with tied embeddings both ``model.embed_tokens.weight`` and
        ``lm_head.weight`` address the same tensor, so either (or both) may be sent. Each tensor is either the
        full weight or, for a tensor-parallel engine, exactly this rank's shard. A tensor that already *is* the
        live parameter (shared module) is skipped. Names not sent keep their values.

        Raises:
            UnknownWeightError (KeyError): a name the model does not have (closest names suggested).
            ValueError: a shape mismatch (both shapes named).
            RuntimeError: the engine's server has requests in flight.
        """
        self._require_idle("update_weights")
        self.weights.update(weights)

    def sleep(self) -> None:
        """Free the memory of the weights this engine owns (``engine_kwargs.hf.sleep_level``).

        Level 1 moves them to host memory on an accelerator (a no-op on CPU); level 2 discards them on any
        device (the next sync refills them). A live module passed in by the caller (the trainer's) is never
        touched. The KV cache only lives inside :meth:`generate`, so there is nothing else to free.

        Raises:
            RuntimeError: the engine's server has requests in flight.
        """
        self._require_idle("sleep")
        self.weights.sleep()

    def wake_up(self, tags: Any = None) -> None:
        """Undo :meth:`sleep` for ``tags`` (``weights`` and/or ``kv_cache``; None = both).

        ``kv_cache`` is a no-op (the cache is allocated per :meth:`generate` call); ``weights`` re-allocates
        (level 2: uninitialised, to be filled by :meth:`update_weights`). :meth:`generate` wakes up itself.

        Raises:
            ValueError: an unknown tag.
        """
        if "weights" in check_tags(tags):
            self.weights.wake_up()


def build_hf_rollout(
    config: Any,
    model_path: Any,
    tokenizer: Any = None,
    *,
    device: Any = None,
    model_config: Any = None,
    options: Any = None,
) -> HFRolloutEngine:
    """Factory for the ``hf`` rollout engine plugin: ``HFRolloutEngine(model_path, tokenizer, config)``.

    ``model_path`` may also be a live model (shared with the trainer); ``model_config`` is the
    ``actor_rollout_ref.model`` section (``trust_remote_code``, ``override_config``); ``options`` the validated
    :class:`~verl.engines.reference.builders.HFRolloutOptions` (None: defaults); see :class:`HFRolloutEngine`.
    """
    return HFRolloutEngine(model_path, tokenizer, config, device=device, options=options, model_config=model_config)


__all__ = ["HFRolloutEngine", "StaleWeightsError", "UnknownWeightError", "build_hf_rollout"]
