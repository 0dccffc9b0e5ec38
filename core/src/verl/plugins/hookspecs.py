"""The verl plugin API: every hook a plugin can implement, in one place.

For plugin authors
------------------
A plugin is a module registered in the entry-point group ``verl.plugins``; verl imports it
lazily (on the first plugin lookup in a process, never at ``import verl``) and calls its
``@hookimpl`` functions. Each hook takes no arguments and returns a ``list`` of spec records
(:mod:`verl.plugins.specs`); verl collects the lists of all plugins. Rules:

* Mark every hook function with ``@verl.plugins.hookimpl``. A function named like a hook but
  not marked, or a marked function matching no hook below (a typo), makes verl refuse the
  plugin with a message, instead of silently ignoring it.
* The entry module imports only ``verl`` and the standard library. Import heavy backends
  (vllm, torch_npu, megatron, ...) inside factories and probes, so listing plugins and
  selecting another backend never pays for, or breaks on, yours.
* Declare the plugin API you were built against: ``VERL_PLUGIN_API = (2, 0)``. A plugin
  whose major version differs from core's, or whose minor version is newer than core's, is
  refused and reported (``verl plugins``, and in the error of any lookup).
* Names must be unique per kind across all installed plugins: two distributions providing
  rollout engine ``"vllm"`` is an error naming both, raised when that kind is used.
* Exceptions raised by your hook are recorded against your distribution and shown to the
  user; they never break other plugins.

``pyproject.toml`` of a plugin distribution::

    [project.entry-points."verl.plugins"]
    vllm = "verl_vllm.plugin"

``verl_vllm/plugin.py``::

    from verl.plugins import hookimpl
    from verl.plugins.specs import RolloutEngineSpec

    VERL_PLUGIN_API = (2, 0)


    def _make_engine(config, *, model, tokenizer, options, device):
        # verl.plugins.factories.RolloutEngineFactory; options: the validated engine_kwargs.vllm (a VllmOptions)
        from verl_vllm.engine import VllmRolloutEngine  # imports vllm: only when selected

        return VllmRolloutEngine(model, tokenizer, config.actor_rollout_ref.rollout, options=options, device=device)


    @hookimpl
    def verl_rollout_engines():
        from verl_vllm.options import VllmOptions  # a light attrs class

        return [RolloutEngineSpec(name="vllm", factory=_make_engine, options_cls=VllmOptions, devices=("cuda",))]

Users can restrict which plugins load with ``VERL_PLUGINS`` (see :mod:`verl.plugins.manager`).
Core's own cpu/cuda platforms and algorithms are provided through these same hooks by
:mod:`verl.plugins.builtin`.
"""

from __future__ import annotations

import pluggy

from verl.plugins.specs import (
    AdvantageEstimatorSpec,
    AgentLoopSpec,
    CheckpointEngineSpec,
    PlatformSpec,
    PolicyLossSpec,
    RolloutEngineSpec,
    TrainingEngineSpec,
)

PROJECT_NAME = "verl"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Decorator marking a plugin's hook implementations: ``@hookimpl``.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# ---------------------------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------------------------


@hookspec
def verl_platforms() -> list[PlatformSpec]:
    """Return the device platforms this plugin provides.

    Called once per process when a platform is resolved or listed. Every result is collected.
    ``probe`` must be cheap and must not initialise the device in a way that breaks ``fork``;
    it is called during automatic selection, where exactly one positive accelerator probe wins
    (two or more without ``trainer.device`` is an error listing every answer).

    For plugin authors (an Ascend plugin)::

        @hookimpl
        def verl_platforms():
            from verl_npu.probe import probe_npu  # checks torch_npu + device count, no init

            def make():
                from verl_npu.platform import NPUPlatform

                return NPUPlatform()

            return [PlatformSpec(name="npu", probe=probe_npu, factory=make)]
    """


# ---------------------------------------------------------------------------------------------
# Engines
# ---------------------------------------------------------------------------------------------


@hookspec
def verl_training_engines() -> list[TrainingEngineSpec]:
    """Return the training engines this plugin provides.

    Every result is collected. ``factory`` is called only for the engine chosen in config, with the
    signature of :class:`verl.plugins.factories.TrainingEngineFactory`; ``options_cls`` is validated at config
    load, so option typos fail before a model loads, and the factory receives the role's validated instance
    as ``options`` (:func:`verl.config.role_options`: the critic its own, the reference policy the actor's
    overridden by its own).

    For plugin authors::

        @hookimpl
        def verl_training_engines():
            from verl_fsdp.options import FSDPOptions

            def make(config, *, role, model, options, device, world_size, total_training_steps=1):
                from verl_fsdp.engine import FSDPEngine

                return FSDPEngine(config, role=role, model=model, options=options, device=device,
                                  world_size=world_size, total_training_steps=total_training_steps)

            return [TrainingEngineSpec(name="fsdp", factory=make, options_cls=FSDPOptions,
                                       devices=("cpu", "cuda", "npu"), capabilities={"offload"})]
    """


@hookspec
def verl_rollout_engines() -> list[RolloutEngineSpec]:
    """Return the rollout (generation) engines this plugin provides.

    Every result is collected. ``factory`` (:class:`verl.plugins.factories.RolloutEngineFactory`) is called
    only for ``actor_rollout_ref.rollout.name``; the module docstring has the complete vLLM plugin.

    For plugin authors::

        @hookimpl
        def verl_rollout_engines():
            return [RolloutEngineSpec(name="vllm", factory=_make_engine, devices=("cuda",))]
    """


@hookspec
def verl_checkpoint_engines() -> list[CheckpointEngineSpec]:
    """Return the weight-sync (trainer -> rollout) engines this plugin provides.

    Every result is collected. ``factory`` is a :class:`verl.plugins.factories.CheckpointEngineFactory`:
    ``factory(config, *, options, platform)``.

    For plugin authors::

        @hookimpl
        def verl_checkpoint_engines():
            def make(config, *, options, platform):
                from verl_vllm.weight_receiver import NcclWeightSync

                return NcclWeightSync(config.actor_rollout_ref.rollout.checkpoint_engine, platform, options=options)

            return [CheckpointEngineSpec(name="vllm_nccl", factory=make, devices=("cuda",))]
    """


# ---------------------------------------------------------------------------------------------
# Algorithms
# ---------------------------------------------------------------------------------------------


@hookspec
def verl_advantage_estimators() -> list[AdvantageEstimatorSpec]:
    """Return the advantage estimators this plugin provides (``algorithm.adv_estimator``).

    Every result is collected. ``fn`` follows the keyword signature of verl's estimators
    (``verl/trainer/ppo/core_algos.py``; see :mod:`verl.algorithms`).

    For plugin authors::

        @hookimpl
        def verl_advantage_estimators():
            from my_pkg.adv import compute_my_advantage

            return [AdvantageEstimatorSpec(name="my_adv", fn=compute_my_advantage)]
    """


@hookspec
def verl_policy_losses() -> list[PolicyLossSpec]:
    """Return the policy losses this plugin provides (``actor.policy_loss.loss_mode``).

    Every result is collected. ``fn`` follows the keyword signature of verl's policy losses
    (``verl/trainer/ppo/core_algos.py``; see :mod:`verl.algorithms`).

    For plugin authors::

        @hookimpl
        def verl_policy_losses():
            from my_pkg.loss import compute_my_policy_loss

            return [PolicyLossSpec(name="my_loss", fn=compute_my_policy_loss)]
    """


@hookspec
def verl_agent_loops() -> list[AgentLoopSpec]:
    """Return the agent loops this plugin provides (a dataset row's ``agent_name``, ``rollout.mode=async``).

    Every result is collected (plugin API 2.4). ``factory(context)`` builds the loop; see :mod:`verl.agents`.

    For plugin authors::

        @hookimpl
        def verl_agent_loops():
            from my_pkg.agent import SearchAgentLoop  # a verl.agents.AgentLoopBase subclass

            return [AgentLoopSpec(name="search_agent", factory=SearchAgentLoop)]
    """


#: kind -> name of the hook returning that kind's specs.
HOOK_FOR_KIND: dict[str, str] = {
    "platform": "verl_platforms",
    "training_engine": "verl_training_engines",
    "rollout_engine": "verl_rollout_engines",
    "checkpoint_engine": "verl_checkpoint_engines",
    "advantage_estimator": "verl_advantage_estimators",
    "policy_loss": "verl_policy_losses",
    "agent_loop": "verl_agent_loops",
}
