"""``actor_rollout_ref.rollout.*``: generation engine, sampling and weight sync (verl ``rollout.yaml``)."""

from __future__ import annotations

from typing import Literal

import attrs

from verl.config.schema._fields import BackendKwargs, fld, free_dict, section

RolloutMode = Literal["sync", "async"]
Placement = Literal["hybrid", "colocated", "standalone"]
Dtype = Literal["auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"]
LoadFormat = Literal["auto", "hf", "safetensors", "dummy"]


@attrs.frozen(kw_only=True)
class ValKwargs:
    """Sampling for validation; greedy by default (verl ``val_kwargs``)."""

    temperature: float = fld(0.0, doc="softmax temperature; 0 only with do_sample=false (greedy)")
    top_k: int = fld(-1, doc="keep the k most likely tokens; -1 (or 0) = off")
    top_p: float = fld(1.0, doc="nucleus sampling mass in (0, 1]; 1 = off")
    n: int = fld(1, doc="responses per validation prompt")
    do_sample: bool = fld(False, doc="sample (true) or greedy decode (false)")


@attrs.frozen(kw_only=True)
class CheckpointEngineConfig:
    """Weight sync from the training engine to the rollout engine (verl ``checkpoint_engine``).

    Deviation from verl: the in-process backend is named ``colocated`` (verl: ``naive``).
    """

    backend: str = fld("colocated", doc="checkpoint engine plugin name: colocated|broadcast|...")
    update_weights_bucket_megabytes: int = fld(2048, doc="size of one weight-transfer bucket in MiB")
    engine_kwargs: BackendKwargs = free_dict(doc="per-backend options, e.g. engine_kwargs.broadcast.<key>")


TruncateSide = Literal["left", "middle", "right"]
SanityCheckMode = Literal["strict", "ignore_strippable", "disable"]


@attrs.frozen(kw_only=True)
class MultiTurnConfig:
    """Multi-turn rollouts with tools and interactions (verl ``rollout.multi_turn``; needs ``rollout.mode=async``).

    Read by the ``tool_agent`` agent loop (:mod:`verl.agents.tool_agent`). ``max_assistant_turns`` /
    ``max_user_turns`` null means no limit besides ``response_length`` (verl: the same). Tool responses and
    interaction turns count as user turns, as in verl. Deviations: ``function_tool_path``,
    ``use_inference_chat_template=true`` and ``num_repeat_rollouts`` are not built and refused when set
    (:mod:`verl.config.validate_agents`); ``interaction_config_path`` is verl 0.5's key (its interactions were
    removed from verl at HEAD, kept here).
    """

    enable: bool = fld(False, doc="multi-turn tool rollouts (verl's switch); true needs rollout.mode=async")
    max_assistant_turns: int | None = fld(None, doc="model turns per sample at most; null = no limit")
    max_user_turns: int | None = fld(None, doc="tool / interaction turns per sample at most; null = no limit")
    tool_config_path: str | None = fld(
        None, doc="YAML listing the tools (tools: [{class_name, config, tool_schema}]); null = no tools"
    )
    function_tool_path: str | None = fld(None, doc="verl's @function_tool file; not built (refused when set)")
    interaction_config_path: str | None = fld(
        None, doc="YAML listing the interactions (interaction: [{name, class_name, config}]); null = none"
    )
    max_parallel_calls: int = fld(1, doc="tool calls executed per model turn; further calls in the turn are dropped")
    max_tool_response_length: int = fld(256, doc="characters of one tool response kept (truncated with a marker)")
    tool_response_truncate_side: TruncateSide = fld("middle", doc="where an over-long tool response is cut")
    use_inference_chat_template: bool = fld(
        False, doc="re-render the chat template per turn instead of the recorded token ids; only false is built"
    )
    tokenization_sanity_check_mode: SanityCheckMode = fld(
        "strict",
        doc="compare the turn-by-turn token ids with the whole conversation's chat template (strict), the same "
        "ignoring whitespace (ignore_strippable), or not at all (disable); mismatches are counted, not fatal",
    )
    format: str = fld("hermes", doc="tool-call parser name (verl.agents.tool_parser registry): hermes|...")
    num_repeat_rollouts: int | None = fld(None, doc="verl's per-sample repeats; not built (refused when set)")


@attrs.frozen(kw_only=True)
class CustomAsyncServerConfig:
    """verl's ``rollout.agent.custom_async_server``: a user-provided server class; not built (refused when set)."""

    path: str | None = fld(None, doc="file of a custom async server class; not built (refused when set)")
    name: str | None = fld(None, doc="class name in that file; not built (refused when set)")


@attrs.frozen(kw_only=True)
class AgentLoopConfig:
    """Agent-loop manager of ``rollout.mode=async`` (verl ``rollout.agent``).

    Each rollout replica's share of the batch is split into ``num_workers`` chunks, each run by one agent-loop
    worker (a thread with its own event loop; verl: a Ray actor) that runs every sample of its chunk as one
    coroutine; all workers share the replica's server. A sample's loop is its ``agent_name`` column, else
    ``default_agent_loop``; loops come from plugins (``verl_agent_loops``) and ``agent_loop_config_path``.
    """

    num_workers: int = fld(8, doc="agent-loop workers per rollout replica (threads, each running many samples)")
    default_agent_loop: str = fld("single_turn_agent", doc="agent loop of samples without an agent_name column")
    agent_loop_config_path: str | None = fld(
        None, doc="YAML list of extra agent loops [{name, _target_: pkg.module.Class}]; null = plugins only"
    )
    custom_async_server: CustomAsyncServerConfig = section(CustomAsyncServerConfig, doc="not built")


@attrs.frozen(kw_only=True)
class RolloutConfig:
    """Response generation for training (and, with ``val_kwargs``, validation).

    Temperature: log-probs recomputed by actor/ref divide logits by this temperature
    (known failure K09), so ``temperature`` must be > 0 when ``do_sample`` is true;
    ``temperature: 0`` is accepted only with ``do_sample: false`` (greedy), where
    log-probs are untempered.

    Placement (verl's ``RolloutMode``): ``hybrid`` (the rollout engine inside the trainer's workers, on the
    same devices; the trainer drives sleep / wake-up and syncs weights in place), ``colocated`` (the rollout
    in its own processes on the trainer's devices, weights broadcast through host memory), ``standalone``
    (its own devices, ``rollout.nnodes x rollout.n_gpus_per_node``, weights broadcast). Null picks
    ``standalone`` when ``rollout.nnodes > 0``, else ``hybrid``.

    Deviations from verl: ``name`` defaults to ``hf`` (core's transformers engine, verl:
    required), ``mode`` to ``sync`` (verl: ``async``: here ``sync`` generates the batch in one engine call,
    ``async`` runs the agent-loop manager against the engine's server, :mod:`verl.agents`), ``dtype`` to ``auto`` (float32 on CPU, where bf16 runs ~6x slower without
    AVX-512/AMX, bfloat16 on accelerators as verl), ``tensor_model_parallel_size`` to 1 (verl: 2), and
    ``placement`` is our key for verl's ``RolloutMode`` (verl picks it from the trainer class).
    Backend-specific knobs live in ``engine_kwargs.<name>``, checked by the backend plugin's options class.

    Engine keys (verl's ``rollout.yaml`` names, ``gpu_memory_utilization`` ... ``ignore_eos``): each backend
    maps them to its engine's own option and checks them when the config is loaded (the spec's
    ``check_config``); a value a backend cannot honour is an error naming the backend (e.g. the ``hf``
    engine has no GPU memory pool, so ``gpu_memory_utilization`` is refused there). Null means the
    backend's own default. ``vllm``: ``gpu_memory_utilization`` 0.5, prefix caching on and
    ``max_num_seqs`` 256 (verl's values), chunked prefill vLLM's own default on cuda and off on cpu, and
    ``max_num_batched_tokens`` not passed, so vLLM picks its own budget (verl's ``rollout.yaml`` passes
    8192; set it to match). ``hf``: ``max_num_seqs`` 1024 and no prefill token budget. ``load_format``
    defaults to ``auto`` (verl: ``dummy``) because this trainer does not sync weights before the first
    generation. The parallel sizes other than tensor parallel
    and the MoE / LoRA switches (``data_parallel_size``, ``expert_parallel_size``,
    ``pipeline_model_parallel_size``, ``layered_summon``, ``enable_rollout_routing_replay``) are accepted at
    verl's default only; any other value is refused with the reason (:mod:`verl.config.validate_rollout`).
    ``multi_stage_wake_up`` takes either value: verl reads it nowhere (its workers always resume the weights,
    sync, then resume the KV cache), and the hybrid switch here always wakes in those two stages
    (:mod:`verl.trainer.switching`), for every engine.
    """

    name: str = fld("hf", doc="rollout engine plugin name: hf|vllm|sglang|trtllm|...")
    mode: RolloutMode = fld(
        "sync", doc="sync: one batched generate call; async: agent loops (multi-turn, tools) against the server"
    )
    placement: Placement | None = fld(
        None,
        doc="hybrid|colocated|standalone (verl's RolloutMode); null = standalone if rollout.nnodes > 0, else hybrid",
    )
    tensor_model_parallel_size: int = fld(
        1, doc="ranks per rollout replica (tensor parallel); the rollout world = replicas x this size"
    )
    free_cache_engine: bool = fld(
        True, doc="sleep the rollout after generation (free KV cache / weights) and wake it for the next sync"
    )
    gpu_memory_utilization: float | None = fld(
        None, doc="share of accelerator memory for the engine (weights + KV cache), (0, 1]; null = backend default"
    )
    enforce_eager: bool | None = fld(None, doc="no CUDA graphs / compilation in the engine; null = backend default")
    enable_chunked_prefill: bool | None = fld(
        None, doc="split long prefills over scheduler steps; null = backend default"
    )
    enable_prefix_caching: bool | None = fld(
        None, doc="reuse KV blocks of shared prompt prefixes; null = backend default"
    )
    max_num_batched_tokens: int | None = fld(
        None,
        doc="tokens one engine step may process (prefill budget); null = backend default (vllm: vLLM's own, "
        "not verl's 8192; hf: no limit)",
    )
    max_model_len: int | None = fld(
        None, doc="context limit of the engine (prompt + response); null = prompt_length + response_length"
    )
    max_num_seqs: int | None = fld(None, doc="sequences generated together; null = backend default")
    load_format: LoadFormat = fld(
        "auto", doc="how the engine loads weights: auto|hf|safetensors; dummy (random init) is refused"
    )
    ignore_eos: bool = fld(False, doc="keep generating after EOS up to response_length")
    disable_log_stats: bool = fld(True, doc="no engine statistics logging (vLLM's disable_log_stats)")
    cudagraph_capture_sizes: tuple[int, ...] | None = fld(
        None, doc="batch sizes captured as CUDA graphs (vLLM's compilation_config); null = backend default"
    )
    data_parallel_size: int = fld(1, doc="data-parallel size inside one rollout server; only 1 is built")
    expert_parallel_size: int = fld(1, doc="expert-parallel size for MoE rollout; only 1 is built")
    pipeline_model_parallel_size: int = fld(1, doc="pipeline-parallel size of the rollout; only 1 is built")
    layered_summon: bool = fld(False, doc="LoRA: gather adapter layers one by one for the sync; not built")
    multi_stage_wake_up: bool = fld(
        False, doc="verl's SGLang switch, read by no verl code: waking is always staged (weights, sync, KV cache)"
    )
    enable_rollout_routing_replay: bool = fld(False, doc="MoE: record the rollout's expert routing; not built")
    temperature: float = fld(1.0, doc="sampling temperature; also divides logits when log-probs are recomputed")
    top_k: int = fld(-1, doc="keep the k most likely tokens; -1 (or 0) = off")
    top_p: float = fld(1.0, doc="nucleus sampling mass in (0, 1]; 1 = off")
    n: int = fld(1, doc="responses sampled per prompt (the GRPO group size)")
    do_sample: bool = fld(True, doc="sample (true) or greedy decode (false)")
    prompt_length: int | None = fld(None, doc="max prompt tokens; null = data.max_prompt_length")
    response_length: int | None = fld(None, doc="max new tokens; null = data.max_response_length")
    dtype: Dtype = fld(
        "auto", doc="weights/activations dtype of the rollout; auto = float32 on cpu, bfloat16 elsewhere"
    )
    calculate_log_probs: bool = fld(True, doc="return the sampler's log-probs (rollout_log_probs)")
    log_prob_micro_batch_size_per_gpu: int | None = fld(
        None, doc="sequences per old-log-prob forward per GPU; null = actor ppo_micro_batch_size_per_gpu"
    )
    log_prob_use_dynamic_bsz: bool | None = fld(None, doc="token-budget micro-batches; null = actor use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int | None = fld(
        None, doc="tokens per micro-batch per GPU; null = actor ppo_max_token_len_per_gpu"
    )
    seed: int = fld(42, doc="sampling seed of the rollout engine")
    nnodes: int = fld(
        0, doc="standalone rollout pool nodes (own workers, weights broadcast); 0 = hybrid with the actor"
    )
    n_gpus_per_node: int = fld(1, doc="rollout workers per node of the standalone pool (rollout.nnodes > 0)")
    val_kwargs: ValKwargs = section(ValKwargs, doc="sampling used for validation")
    checkpoint_engine: CheckpointEngineConfig = section(CheckpointEngineConfig, doc="trainer -> rollout weight sync")
    multi_turn: MultiTurnConfig = section(MultiTurnConfig, doc="multi-turn tool / interaction rollouts (mode=async)")
    agent: AgentLoopConfig = section(AgentLoopConfig, doc="agent-loop manager of mode=async")
    engine_kwargs: BackendKwargs = free_dict(
        doc="per-backend engine options, e.g. engine_kwargs.vllm.gpu_memory_utilization; checked by the plugin"
    )
