"""The ``hf`` engine's async server: continuous batching over a live :class:`HFRolloutEngine`.

:class:`HFRolloutServer` implements :class:`verl.engines.serving.AsyncRolloutServer` for
``actor_rollout_ref.rollout.mode=async``. One background thread owns the decode loop; ``generate`` puts a
request in the queue and awaits an ``asyncio`` future that the thread resolves (``call_soon_threadsafe`` on
the caller's loop), so the agent loops' tool calls and other coroutines run while tokens are generated.

Each turn of the loop (vLLM's scheduler, reduced to its core):

1. **admit**: queued requests join while the running batch has fewer than ``max_num_seqs`` rows; they are
   prefilled together, left-padded to the longest of them, within ``max_num_batched_tokens`` (rows x longest
   prompt, null = no limit), and their KV cache is merged into the running one
   (:mod:`~verl.engines.reference.server_batch`: right-aligned, zero-padded on the left, the attention mask
   padded with zeros alike);
2. **select** one token per row from its last logits, rows grouped by their sampling parameters
   (:func:`~verl.engines.reference.sampling.select_next_tokens`);
3. **finish** rows that emitted an EOS / stop token or reached their ``max_tokens`` (their futures resolve
   now, whatever the others still do) and drop them from the batch and the cache
   (:func:`~verl.engines.reference.server_batch.select`, which also cuts columns left as padding by all);
4. **decode** one step of the remaining rows.

A request waits at most for the step in flight, never for another's whole generation. The thread ends
when nothing is queued or running, so nothing runs between trainer steps.

Samples are those of the sync path (:meth:`HFRolloutEngine.generate`): a request with ``seed=s`` draws its
uniforms as a row with ``sample_seed=s`` does (``torch.rand(n, generator=Generator().manual_seed(s % 2**63))``
up front, step ``t`` using draw ``t``, ``n = max(max_tokens, rollout.response_length)``, which is the sync
path's own ``n`` whenever ``max_tokens <= response_length``; a CPU generator's first ``k`` draws do not depend
on ``n``), and each step applies the same sampler to the same logits, so tokens are equal and log-probs equal
up to float rounding (the padding around a row differs, ~1e-7 in float32). Without a seed a request draws from
the engine's generator, in admission order. ``temperature=0`` is greedy (log-probs at T = 1, K09).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
import weakref
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from verl.engines.reference import server_batch
from verl.engines.reference.decode_linears import skinny_linears
from verl.engines.reference.postprocess import compute_position_ids
from verl.engines.reference.rollout_options import DEFAULT_MAX_NUM_SEQS, ROLLOUT, context_limit
from verl.engines.reference.sampling import SamplingParams, select_next_tokens
from verl.engines.reference.server_batch import RunningBatch
from verl.engines.reference.server_requests import Request, RequestLimits, parse_request
from verl.engines.serving import TokenOutput

OWNER = "HFRolloutServer.generate"


def _cfg(config: Any, name: str, default: Any) -> Any:
    value = getattr(config, name, default)
    return default if value is None else value


_SERVERS: weakref.WeakSet[HFRolloutServer] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # A decode thread still inside torch while the interpreter finalises aborts the process (std::terminate).
    for server in list(_SERVERS):
        server.close(timeout=60.0)


def _settle(future: asyncio.Future, result: TokenOutput | None, error: BaseException | None) -> None:
    if future.done():  # the awaiting task was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class HFRolloutServer:
    """Continuous-batching token server over ``engine``'s live model (see the module docstring).

    Get it through :meth:`HFRolloutEngine.server` (one per engine). The engine's ``max_num_seqs`` (default
    1024) caps the running rows, ``max_num_batched_tokens`` each prefill, ``max_model_len`` /
    ``max_position_embeddings`` (:func:`~verl.engines.reference.rollout_options.context_limit`) a request's
    ``max_tokens``; ``ignore_eos`` makes EOS end nothing (``stop_token_ids`` still end a request). The
    server wakes a sleeping engine before its first step; its weights are the engine's, so
    ``update_weights`` between requests changes what it generates, and ``update_weights`` / ``sleep`` are
    refused while requests are in flight (:meth:`require_idle`).

    Raises:
        NotImplementedError: a model whose KV cache cannot be merged (sliding-window or linear-attention
            layers, transformers < 4.56).
        ValueError: ``tensor_model_parallel_size > 1``.
    """

    def __init__(self, engine: Any) -> None:
        reason = server_batch.unsupported_reason(engine.model.config)
        if reason is not None:
            raise NotImplementedError(
                f"HFRolloutServer: continuous batching merges full-attention KV caches, but {reason}; use "
                f"{ROLLOUT}.mode=sync (the hf engine's batch generate) or another rollout engine"
            )
        tp = int(_cfg(engine.config, "tensor_model_parallel_size", 1))
        if tp > 1:
            raise ValueError(
                f"HFRolloutServer: {ROLLOUT}.tensor_model_parallel_size={tp}: every rank of a tensor-parallel group "
                "would have to decode the same batch in lock-step; use tensor_model_parallel_size=1 or mode=sync"
            )
        self.engine = engine
        config = engine.config
        self.max_num_seqs = max(1, int(_cfg(config, "max_num_seqs", DEFAULT_MAX_NUM_SEQS)))
        budget = getattr(config, "max_num_batched_tokens", None)
        self.max_num_batched_tokens = int(budget) if budget else None
        limit, source = context_limit(engine.model.config, config)
        eos = [] if _cfg(config, "ignore_eos", False) else list(engine.eos_token_ids)
        self.limits = RequestLimits(
            context_limit=limit,
            context_source=source,
            max_num_batched_tokens=self.max_num_batched_tokens,
            vocab_size=getattr(engine.model.config, "vocab_size", None),
            response_length=int(_cfg(config, "response_length", 512)),
            eos_token_ids=frozenset(int(i) for i in eos),
        )
        self._lock = threading.Lock()
        self._pending: deque[Request] = deque()
        self._in_flight = 0
        self._thread: threading.Thread | None = None
        self._stats = {"requests": 0, "tokens": 0, "prefill_tokens": 0, "prefills": 0, "decode_steps": 0}
        self._stats["max_running"] = 0
        self._closing = False
        _SERVERS.add(self)

    # ------------------------------------------------------------------ public
    async def generate(
        self, request_id: str, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any]
    ) -> TokenOutput:
        """Generate a continuation of ``prompt_ids`` (:meth:`verl.engines.serving.AsyncRolloutServer.generate`).

        Args:
            request_id: names the request in error messages (no prefix cache here).
            prompt_ids: the prompt's token ids (no padding).
            sampling_params: the keys of :data:`verl.engines.serving.SAMPLING_KEYS`; ``max_tokens`` is capped
                to the context left after the prompt.

        Returns:
            :class:`~verl.engines.serving.TokenOutput`: the new token ids (an EOS / stop token that ended the
            request included, ``stop_reason="stop"``; else ``"length"``), their log-probs (float32 values)
            when ``logprobs`` is set.

        Raises:
            ValueError: an empty prompt, a token id outside the vocabulary, a prompt that leaves no room in
                the context or is longer than ``max_num_batched_tokens``, an unknown or invalid sampling key.
            StaleWeightsError: the engine slept at level 2 and was not synced since (from the decode thread).
        """
        request = parse_request(
            request_id, prompt_ids, sampling_params, self.limits, owner=f"{OWNER}(request {request_id!r})"
        )
        loop = asyncio.get_running_loop()
        request.loop, request.future = loop, loop.create_future()
        with self._lock:
            self._pending.append(request)
            self._in_flight += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="hf-rollout-server", daemon=True)
                self._thread.start()
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True  # the thread drops it at its next step
            raise

    @property
    def in_flight(self) -> int:
        """Requests queued or decoding (their ``generate`` has not returned)."""
        with self._lock:
            return self._in_flight

    def require_idle(self, what: str) -> None:
        """Raise RuntimeError naming ``what`` when requests are in flight (weights must not change under them)."""
        busy = self.in_flight
        if busy:
            raise RuntimeError(
                f"{what}: the async server has {busy} request(s) in flight; sync weights or sleep only between "
                "steps, once every generate call has returned (AgentLoopManager.generate_sequences returns only then)"
            )

    def close(self, timeout: float | None = None) -> None:
        """Abort what is in flight and wait (at most ``timeout`` seconds) for the decode thread to end.

        Running and queued requests return what they generated so far with ``stop_reason="aborted"``, at the
        next step; requests sent while closing are aborted too. The server serves new requests afterwards.
        Runs at interpreter exit for every live server.
        """
        with self._lock:
            thread, self._closing = self._thread, True
        try:
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout)
        finally:
            with self._lock:
                self._closing = False

    def stats(self) -> dict[str, int]:
        """A copy of the counters since the server was created (for metrics and benchmarks).

        Keys: ``requests`` (answered with a result), ``tokens`` (generated), ``prefill_tokens`` (prompt
        tokens prefilled, padding excluded), ``prefills`` (prefill forwards), ``decode_steps`` (one-token
        forwards of the running batch), ``max_running`` (most rows that chose a token in one step).
        """
        with self._lock:
            return dict(self._stats)

    # ------------------------------------------------------------------ requests
    def _resolve(self, request: Request, result: TokenOutput | None, error: BaseException | None = None) -> None:
        with self._lock:
            if request.resolved:  # an error after the request finished: it was answered already
                return
            request.resolved = True
            self._in_flight -= 1
            self._stats["requests"] += result is not None
        if request.cancelled or request.loop is None or request.future is None:
            return
        with contextlib.suppress(RuntimeError):  # the caller's event loop is closed: nobody waits any more
            request.loop.call_soon_threadsafe(_settle, request.future, result, error)

    # ------------------------------------------------------------------ the decode thread
    def _serve(self) -> None:
        while True:
            running = RunningBatch()
            try:
                with self._decode_mode():
                    self._run(running)
            except Exception as exc:  # noqa: BLE001 - the batch's callers get the error, the server stays usable
                # Queued requests are not failed: they may have been sent after the cause was fixed (a weight
                # sync after a StaleWeightsError), and each gets its own prefill and its own error if any.
                for request in running.rows:
                    self._resolve(request, None, exc)
            with self._lock:
                # Checked after the model's mode was restored, so a request that arrived meanwhile is served
                # by this thread again rather than by a second one racing this one's cleanup.
                if not self._pending:
                    self._thread = None
                    return

    @contextlib.contextmanager
    def _decode_mode(self) -> Iterator[None]:
        model = self.engine.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), skinny_linears(model):
                yield
        finally:
            model.train(was_training)

    def _run(self, running: RunningBatch) -> None:
        while True:
            if self._closing:
                self._abort(running)
                return
            admitted = self._admit(len(running.rows))
            if admitted:
                try:
                    self._prefill(running, admitted)
                except Exception as exc:  # noqa: BLE001 - not yet in the batch: answer them here, then fail it
                    for request in admitted:
                        self._resolve(request, None, exc)
                    raise
            elif not running.rows:
                with self._lock:
                    if not self._pending:
                        return
                continue
            self._step(running)

    def _abort(self, running: RunningBatch) -> None:
        with self._lock:
            requests = running.rows + list(self._pending)
            self._pending.clear()
        running.clear()
        for request in requests:
            logps = request.log_probs if request.want_logprobs else None
            self._resolve(request, TokenOutput(token_ids=request.tokens, log_probs=logps, stop_reason="aborted"))

    def _admit(self, running: int) -> list[Request]:
        taken: list[Request] = []
        widest = 0
        with self._lock:
            while self._pending and running + len(taken) < self.max_num_seqs:
                request = self._pending[0]
                if request.cancelled:
                    self._pending.popleft()
                    request.resolved = True
                    self._in_flight -= 1
                    continue
                grown = max(widest, len(request.prompt))
                budget = self.max_num_batched_tokens
                if taken and budget is not None and (len(taken) + 1) * grown > budget:
                    break
                taken.append(self._pending.popleft())
                widest = grown
        return taken

    def _prefill(self, running: RunningBatch, requests: list[Request]) -> None:
        engine, device = self.engine, self.engine.device
        # At every prefill, not once per thread: the engine may sleep as soon as nothing is in flight, while
        # this thread is still winding down, and a request arriving then is served by this same thread.
        if engine.weights.asleep:
            engine.wake_up()
        engine.weights.require_current()
        width = max(len(r.prompt) for r in requests)
        ids = torch.full((len(requests), width), engine.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for i, request in enumerate(requests):
            ids[i, width - len(request.prompt) :] = torch.tensor(request.prompt, dtype=torch.long)
            mask[i, width - len(request.prompt) :] = 1
            request.uniforms = self._draws(request)
        ids, mask = ids.to(device), mask.to(device)
        position_ids = compute_position_ids(mask)
        cache = server_batch.new_cache(engine.model.config, width + max(r.max_tokens for r in requests))
        out = engine.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{engine._cache_kwarg: cache},
        )
        running.add(requests, cache, mask, position_ids[:, -1] + 1, out.logits[:, -1, :])
        with self._lock:
            self._stats["prefills"] += 1
            self._stats["prefill_tokens"] += sum(len(r.prompt) for r in requests)

    def _draws(self, request: Request) -> torch.Tensor:
        """The request's sampler uniforms ``(max_draws,)`` float32 (empty when greedy), as the sync path draws."""
        engine = self.engine
        if request.max_draws == 0:
            return torch.zeros(0, device=engine.device)
        if request.seed is None:
            generator = engine.generator
        else:
            generator = engine._row_generators([request.seed])[0]
        return torch.rand(request.max_draws, generator=generator, device=engine.device)

    def _select(self, running: RunningBatch) -> tuple[torch.Tensor, torch.Tensor]:
        rows, logits = running.rows, running.logits
        device = logits.device
        draws = None
        if running.uniforms.shape[1]:  # some row samples; greedy rows' steps may pass the draws (padding)
            steps = torch.tensor([len(r.tokens) for r in rows], dtype=torch.long, device=device)
            draws = running.uniforms.gather(1, steps.clamp(max=running.uniforms.shape[1] - 1).unsqueeze(1)).squeeze(1)
        groups: dict[SamplingParams, list[int]] = {}
        for i, request in enumerate(rows):
            groups.setdefault(request.params, []).append(i)
        if len(groups) == 1:
            params = rows[0].params
            return select_next_tokens(logits, params, None if params.greedy else draws)
        tokens = torch.empty(len(rows), dtype=torch.long, device=device)
        log_probs = torch.empty(len(rows), dtype=torch.float32, device=device)
        for params, members in groups.items():
            index = torch.tensor(members, dtype=torch.long, device=device)
            group_draws = None if params.greedy else draws.index_select(0, index)
            tokens[index], log_probs[index] = select_next_tokens(logits.index_select(0, index), params, group_draws)
        return tokens, log_probs

    def _step(self, running: RunningBatch) -> None:
        """Select, finish and decode one step of the running batch (steps 2-4 of the module docstring)."""
        if not running.rows:
            return
        tokens, log_probs = self._select(running)
        token_list, logp_list = tokens.tolist(), log_probs.tolist()
        keep: list[int] = []
        finished: list[tuple[Request, TokenOutput | None]] = []
        for i, request in enumerate(running.rows):
            token = token_list[i]
            request.tokens.append(token)
            if request.want_logprobs:
                request.log_probs.append(logp_list[i])
            if request.cancelled:
                finished.append((request, None))
            elif token in request.stop_ids or len(request.tokens) >= request.max_tokens:
                reason = "stop" if token in request.stop_ids else "length"
                logps = request.log_probs if request.want_logprobs else None
                finished.append((request, TokenOutput(token_ids=request.tokens, log_probs=logps, stop_reason=reason)))
            else:
                keep.append(i)
        with self._lock:  # before any caller resumes, so the stats it reads include its own tokens
            self._stats["tokens"] += len(token_list)
            self._stats["max_running"] = max(self._stats["max_running"], len(token_list))
        for request, output in finished:
            self._resolve(request, output)
        if not keep:
            running.clear()
            return
        if len(keep) < len(running.rows):
            tokens = tokens.index_select(0, torch.tensor(keep, dtype=torch.long, device=tokens.device))
            running.keep(keep)
        engine = self.engine
        mask = torch.cat([running.mask, running.mask.new_ones((len(keep), 1))], dim=1)
        out = engine.model(
            input_ids=tokens.unsqueeze(1),
            attention_mask=mask,
            position_ids=running.next_pos.unsqueeze(1),
            use_cache=True,
            **{engine._cache_kwarg: running.cache},
        )
        running.mask, running.logits, running.next_pos = mask, out.logits[:, -1, :], running.next_pos + 1
        with self._lock:
            self._stats["decode_steps"] += 1


__all__ = ["HFRolloutServer"]
