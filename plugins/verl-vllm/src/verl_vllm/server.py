"""``VLLMRolloutServer``: the ``vllm`` engine's :class:`~verl.engines.serving.AsyncRolloutServer` (``rollout.mode=async``).

Design. The engine runs vLLM in-process on a ``vllm.LLM`` (hybrid mode): weight sync reloads that engine's model
in place and ``sleep`` / ``wake_up`` act on it. The server therefore serves through *the same* engine's scheduler:
one background thread owns ``llm.llm_engine`` and runs its step loop (``add_request`` for every request that
arrived, then ``step()`` while anything is unfinished), so a request that arrives while others decode joins them
at the next scheduler step (vLLM's continuous batching), and each ``generate`` awaits an asyncio future that the
thread resolves on the caller's own event loop (``loop.call_soon_threadsafe``; the agent-loop manager runs several
event loops in threads). With nothing pending the thread sleeps on a condition variable.

Why not vLLM's ``AsyncLLM``: in vLLM 0.32 it always builds its engine core through
``EngineCoreClient.make_async_mp_client`` (``vllm/v1/engine/async_llm.py``), an ``AsyncMPClient`` whose engine core
runs in a child process, whatever ``VLLM_ENABLE_V1_MULTIPROCESSING`` says (only ``LLMEngine`` reads that
variable). The model would then live in another process beside the ``LLM``'s copy: the in-process weight reload,
sleep and wake-up of :class:`~verl_vllm.engine.VLLMRolloutEngine` would no longer reach the weights that serve.
(verl's own vLLM server runs ``AsyncLLM`` in a separate server process and ships weights to it over IPC.)

Exclusivity. The sync ``generate``, ``update_weights``, ``sleep`` and ``wake_up`` of the engine take
:meth:`VLLMRolloutServer.exclusive`: refused (``RuntimeError``) while a request is in flight, and while one of
them runs the thread does not step (requests that arrive meanwhile wait for it). The agent-loop manager returns
only when every sample finished, so between training steps nothing is in flight.

Sampling translation (:func:`request_sampling_kwargs`, on :func:`verl_vllm.translate.sampling_kwargs`, the sync
path's): the keys of :mod:`verl.engines.serving`, ``max_tokens`` capped to ``max_model_len - len(prompt)``, the
model's EOS ids plus the request's ``stop_token_ids`` as stop tokens (EOS left out under ``rollout.ignore_eos``),
``logprobs=0`` (the sampled token's log-prob; the engine is built with ``logprobs_mode="processed_logprobs"``),
``detokenize=False``, the request's ``seed`` (so a request with a row's ``sample_seed`` samples what the sync path
samples for that row).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from verl.engines.reference.sampling import SamplingParams as VerlSampling
from verl.engines.serving import StopReason, TokenOutput, ValidRequest, validate_request
from verl_vllm.translate import sampling_kwargs

if TYPE_CHECKING:
    from verl_vllm.engine import VLLMRolloutEngine

__all__ = ["VLLMRolloutServer", "request_sampling_kwargs", "token_output"]

#: vLLM's ``CompletionOutput.finish_reason`` -> the contract's stop reason; any other value is an engine error.
_STOP_REASONS: dict[str, StopReason] = {"stop": "stop", "length": "length", "abort": "aborted"}


def request_sampling_kwargs(
    request: ValidRequest,
    *,
    max_model_len: int,
    eos_token_ids: Sequence[int],
    ignore_eos: bool = False,
    owner: str = "VLLMRolloutServer.generate",
) -> dict[str, Any]:
    """Keyword arguments of one ``vllm.SamplingParams`` for one server request.

    Args:
        request: the request as :func:`verl.engines.serving.validate_request` returns it (every field checked:
            finite temperature >= 0, top_p in (0, 1], integer top_k / seed / stop ids, max_tokens >= 1).
        max_model_len: the engine's context limit.
        eos_token_ids: the model's EOS ids (tokenizer and ``generation_config``), stop tokens unless ``ignore_eos``.
        ignore_eos: ``rollout.ignore_eos``: EOS does not end the request; the request's own stop tokens still do.

    Returns:
        :func:`verl_vllm.translate.sampling_kwargs` of the request: ``max_tokens = min(max_tokens, max_model_len -
        prompt_len)``; greedy drops the seed (no randomness, as the sync path's ``row_seeds``); ``stop_token_ids``
        = EOS ids then the request's (duplicates dropped).

    Raises:
        ValueError: a prompt that leaves no room for one new token.
    """
    prompt_len = len(request.prompt_ids)
    room = int(max_model_len) - prompt_len
    if room < 1:
        raise ValueError(
            f"{owner}: the prompt has {prompt_len} tokens, which leaves no room in the vLLM engine's max_model_len "
            f"({max_model_len}); end the conversation earlier (rollout.multi_turn limits, data.max_prompt_length) "
            "or raise actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len"
        )
    sampling = VerlSampling(
        do_sample=not request.greedy, temperature=request.temperature, top_p=request.top_p, top_k=request.top_k
    )
    kwargs = sampling_kwargs(
        sampling,
        max_tokens=min(request.max_tokens, room),
        stop_token_ids=eos_token_ids,
        logprobs=request.logprobs,
        seed=None if sampling.greedy else request.seed,
        ignore_eos=ignore_eos,
    )
    kwargs["stop_token_ids"] = list(dict.fromkeys([*kwargs["stop_token_ids"], *request.stop_token_ids]))
    return kwargs


def token_output(output: Any, want_log_probs: bool) -> TokenOutput:
    """A finished vLLM ``RequestOutput`` -> :class:`~verl.engines.serving.TokenOutput`.

    ``finish_reason`` ``stop`` (EOS or a stop token, which vLLM keeps in ``token_ids``) / ``length`` / ``abort``
    -> ``stop`` / ``length`` / ``aborted``; log-probs from ``logprobs[t][token]`` (``logprobs=0`` returns the
    sampled token's entry).

    Raises:
        RuntimeError: no completion, another finish reason (vLLM's ``error``), or log-probs missing.
    """
    if not output.outputs:
        raise RuntimeError(f"vLLM returned no completion for request {output.request_id!r}")
    completion = output.outputs[0]
    reason = _STOP_REASONS.get(str(completion.finish_reason))
    if reason is None:
        raise RuntimeError(
            f"vLLM finished request {output.request_id!r} with finish_reason={completion.finish_reason!r}"
        )
    tokens = [int(t) for t in completion.token_ids]
    log_probs = None
    if want_log_probs:
        if completion.logprobs is None and tokens:
            raise RuntimeError(f"vLLM returned no log-probs for request {output.request_id!r} (asked logprobs=0)")
        log_probs = [float(completion.logprobs[t][tok].logprob) for t, tok in enumerate(tokens)]
    return TokenOutput(token_ids=tokens, log_probs=log_probs, stop_reason=reason)


class _Request:
    """One submitted request: what the step thread adds, and where its result goes."""

    __slots__ = ("future", "key", "loop", "params", "prompt", "want_log_probs")

    def __init__(self, key: str, prompt: list[int], params: Any, want_log_probs: bool, loop: Any, future: Any):
        self.key, self.prompt, self.params = key, prompt, params
        self.want_log_probs, self.loop, self.future = want_log_probs, loop, future

    def settle(self, result: TokenOutput | None = None, error: BaseException | None = None) -> None:
        """Resolve the future on its own loop (from any thread); a closed loop means the caller is gone."""

        def deliver() -> None:
            if self.future.done():  # cancelled by the caller
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(deliver)


class VLLMRolloutServer:
    """Concurrent token-in/token-out requests on a :class:`~verl_vllm.engine.VLLMRolloutEngine`'s own vLLM engine.

    Build it with ``engine.server()`` (one per engine). See the module docstring for the design.

    Args:
        engine: the engine whose ``llm.llm_engine`` this server steps.

    Raises:
        ValueError: the engine runs tensor parallelism (``tensor_model_parallel_size > 1``): its TP ranks each run
            a scheduler in their own process, and requests that arrive at different moments on each rank would
            give the ranks different batches (their collectives would hang).
    """

    def __init__(self, engine: VLLMRolloutEngine) -> None:
        if engine.tp_size > 1:
            raise ValueError(
                f"rollout.mode=async with rollout engine 'vllm' needs tensor_model_parallel_size=1 (got "
                f"{engine.tp_size}): every TP rank schedules its own copy of the requests, which only stays in step "
                "when all ranks get the same batch at once (mode=sync)"
            )
        self._engine = engine
        self._vllm = engine._vllm
        self._cond = threading.Condition()
        self._incoming: dict[str, _Request] = {}
        self._running: dict[str, _Request] = {}
        self._aborts: list[str] = []
        self._holder: str | None = None
        self._stepping = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()
        # OpenMP's team size and CUDA's current device are per-thread settings: the step thread takes the ones
        # of the thread that built the server, which the sync path runs with.
        self._threads = torch.get_num_threads()
        self._cuda_device = torch.cuda.current_device() if engine.device_type == "cuda" else None

    # ------------------------------------------------------------------ the contract
    async def generate(
        self, request_id: str, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any]
    ) -> TokenOutput:
        """Generate a continuation of ``prompt_ids`` (:meth:`verl.engines.serving.AsyncRolloutServer.generate`).

        Args:
            request_id: the sample's id (the same across its turns; concurrent requests may share it).
            prompt_ids: the conversation's token ids so far (ints in the vocabulary).
            sampling_params: the keys of :mod:`verl.engines.serving` (:func:`request_sampling_kwargs`).

        Returns:
            :class:`~verl.engines.serving.TokenOutput`: the new token ids (a final EOS / stop token included),
            their log-probs when ``logprobs`` (vLLM's processed log-probs: ``log_softmax(logits / T)``, T = 1 when
            greedy, after top-k/top-p filtering when those are on), and the stop reason.

        Raises:
            ValueError: (:class:`verl.engines.serving.RequestError`) a non-string ``request_id``, an empty prompt,
                non-integer ids or ids outside the model's vocabulary, a bad sampling value (NaN / inf, wrong type,
                out of range, unknown key); a prompt with no room left.
            RuntimeError: the server was closed, the weights were discarded by ``sleep(level=2)`` and not updated,
                or the vLLM engine failed while stepping.
        """
        owner = "VLLMRolloutServer.generate"
        engine = self._engine
        request = validate_request(
            request_id,
            prompt_ids,
            sampling_params,
            owner=owner,
            vocab_size=getattr(engine.hf_config, "vocab_size", None),
        )
        prompt = request.prompt_ids
        kwargs = request_sampling_kwargs(
            request,
            max_model_len=engine.max_model_len,
            eos_token_ids=engine.eos_token_ids,
            ignore_eos=engine.ignore_eos,
            owner=owner,
        )
        from vllm.sampling_params import RequestOutputKind

        params = self._vllm.SamplingParams(**kwargs, output_kind=RequestOutputKind.FINAL_ONLY)
        loop = asyncio.get_running_loop()
        # vLLM keys its results by the id given to add_request: a counter keeps concurrent turns of one id apart.
        key = f"{request_id}#{next(self._ids)}"
        request = _Request(key, prompt, params, kwargs["logprobs"] is not None, loop, loop.create_future())
        self._submit(request)
        try:
            return await request.future
        except asyncio.CancelledError:
            self._cancel(request.key)
            raise

    # ------------------------------------------------------------------ engine coordination
    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet resolved (queued or in vLLM's scheduler)."""
        with self._cond:
            return len(self._incoming) + len(self._running)

    @contextlib.contextmanager
    def exclusive(self, what: str) -> Iterator[None]:
        """Hold the engine for ``what`` (an engine method's name): the step thread pauses until the block ends.

        Raises:
            RuntimeError: requests are in flight (await them first), or another engine call holds the engine.
        """
        with self._cond:
            while True:
                pending = len(self._incoming) + len(self._running)
                if pending:
                    raise RuntimeError(
                        f"VLLMRolloutEngine.{what}: {pending} server request(s) in flight on this engine; await "
                        "them first (AgentLoopManager.generate_sequences returns once every sample finished)"
                    )
                if self._holder is not None:
                    raise RuntimeError(f"VLLMRolloutEngine.{what}: called while {self._holder} holds the engine")
                if not self._stepping:
                    break
                # The thread is finishing the step that resolved the last requests (or handling an abort).
                self._cond.wait()
            self._holder = what
        try:
            yield
        finally:
            with self._cond:
                self._holder = None
                self._cond.notify_all()

    def close(self) -> None:
        """Stop the step thread; requests still pending fail with ``RuntimeError`` (idempotent)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            pending = [*self._incoming.values(), *self._running.values()]
            self._incoming.clear()
            self._running.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        for request in pending:
            request.settle(error=RuntimeError("VLLMRolloutServer was closed with this request in flight"))

    # ------------------------------------------------------------------ internals
    def _submit(self, request: _Request) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("VLLMRolloutServer.generate: the server is closed (its engine was closed)")
            self._incoming[request.key] = request
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="vllm-rollout-server", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _cancel(self, key: str) -> None:
        """The caller stopped waiting: drop the request, or abort it in vLLM at the thread's next turn."""
        with self._cond:
            if self._incoming.pop(key, None) is None and self._running.pop(key, None) is not None:
                self._aborts.append(key)
                self._cond.notify_all()

    def _run(self) -> None:
        torch.set_num_threads(self._threads)
        if self._cuda_device is not None:
            torch.cuda.set_device(self._cuda_device)
        core = self._engine.llm.llm_engine
        while True:
            with self._cond:
                while not self._closed and (
                    self._holder is not None or not (self._incoming or self._running or self._aborts)
                ):
                    self._cond.wait()
                if self._closed:
                    return
                new = list(self._incoming.values())
                self._incoming.clear()
                self._running.update((r.key, r) for r in new)
                aborts, self._aborts = self._aborts, []
                self._stepping = True
            try:
                if aborts:
                    core.abort_request(aborts)
                self._admit(core, new)
                self._step(core)
            finally:
                with self._cond:
                    self._stepping = False
                    self._cond.notify_all()

    def _admit(self, core: Any, new: list[_Request]) -> None:
        if not new:
            return
        try:
            self._engine._ready_for_generation("VLLMRolloutServer.generate")
        except Exception as exc:
            for request in new:
                self._fail(request.key, exc)
            return
        # LLM.generate's own rendering of a token prompt (vLLM 0.32); older releases take the raw prompt.
        render = getattr(self._engine.llm, "_preprocess_cmpl_one", None)
        lora = self._engine.lora_request  # the served LoRA adapter (None without one), as LLM.generate's requests
        for request in new:
            try:
                prompt = self._vllm.inputs.TokensPrompt(prompt_token_ids=request.prompt)
                rendered = render(prompt) if render is not None else prompt
                core.add_request(request.key, rendered, request.params, lora_request=lora)
            except Exception as exc:
                self._fail(request.key, exc)

    def _step(self, core: Any) -> None:
        with self._cond:
            if not self._running:
                return
        if not core.has_unfinished_requests():
            # Only a bug could get here; failing the requests beats spinning on them forever.
            with self._cond:
                keys = list(self._running)
            for key in keys:
                self._fail(key, RuntimeError(f"vLLM has no unfinished request for server request {key!r}"))
            return
        try:
            outputs = core.step()
        except Exception as exc:
            with self._cond:
                keys = list(self._running)
            with contextlib.suppress(Exception):
                core.abort_request(keys)
            for key in keys:
                self._fail(key, RuntimeError(f"the vLLM engine failed while stepping: {exc!r}"), cause=exc)
            return
        for output in outputs:
            if not output.finished:
                continue
            with self._cond:
                request = self._running.pop(output.request_id, None)
            if request is None:  # cancelled meanwhile
                continue
            try:
                request.settle(token_output(output, request.want_log_probs))
            except Exception as exc:
                request.settle(error=exc)

    def _fail(self, key: str, error: Exception, cause: Exception | None = None) -> None:
        with self._cond:
            request = self._running.pop(key, None)
        if request is not None:
            if cause is not None:
                error.__cause__ = cause
            request.settle(error=error)
