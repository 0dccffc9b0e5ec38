"""Test-only fault injection: make a training run die (or a checkpoint write fail) at a chosen point.

Set ``VERL_FAULT_INJECT="<stage>:<step>[:<action>]"`` before ``verl train``:

* ``stage`` — where, at the start of that stage of training step ``step`` (1-based: the step that will be
  logged as ``step``): one of :data:`STAGES`, the trainer's ``timing_s/<stage>`` names, plus
  ``checkpoint_write`` = inside :meth:`verl.trainer.checkpoint.CheckpointManager.save` of checkpoint
  ``global_step_<step>``, after its first part is written into the temp folder and before the rename and
  the tracker file; ``testing`` = the validation after step ``step`` (after its row is logged); ``export`` =
  writing ``final_hf/`` after the last step ``step``.
* ``action`` — ``kill`` (default): ``SIGKILL`` this process, as an OOM killer or a lost node would (no
  ``finally``, no flush, no atexit); ``oserror``: raise ``OSError(ENOSPC, "No space left on device")`` as a
  full disk would; ``sigint`` / ``sigterm``: send this process ``SIGINT`` (Ctrl-C) / ``SIGTERM`` (a
  scheduler's stop) and go on, as a signal arriving at that moment would.

Example: ``VERL_FAULT_INJECT=update_actor:3 verl train ...`` dies at the start of step 3's actor update.
The variable is read once, by :func:`arm` (``PPOTrainer.init``); unset, every :func:`check` is one ``None``
comparison. Used by ``tests/reliability/test_kill_resume.py``; never set it in a real run.
"""

from __future__ import annotations

import errno
import os
import signal

ENV_VAR = "VERL_FAULT_INJECT"
STAGES = (
    "gen",
    "gen_max",
    "sleep",
    "onload",
    "rm",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "save_checkpoint",
    "checkpoint_write",
    "wake_up",
    "update_weights",
    "offload",
    "testing",
    "export",
)
ACTIONS = ("kill", "oserror", "sigint", "sigterm")

_plan: tuple[str, int, str] | None = None  # (stage, step, action) armed from ENV_VAR


def parse(spec: str) -> tuple[str, int, str]:
    """``"<stage>:<step>[:<action>]"`` -> ``(stage, step, action)``; ``action`` defaults to ``"kill"``.

    Raises:
        ValueError: unknown stage or action, or a step that is not an int >= 1 (the message names
            :data:`ENV_VAR`, the value and the valid choices).
    """
    fields = spec.strip().split(":")
    stage = fields[0]
    step = fields[1] if len(fields) > 1 else ""
    action = fields[2] if len(fields) > 2 else "kill"
    if len(fields) not in (2, 3) or stage not in STAGES or not step.isdigit() or int(step) < 1 or action not in ACTIONS:
        raise ValueError(
            f"{ENV_VAR}={spec!r} is not '<stage>:<step>[:<action>]' with stage in {list(STAGES)}, "
            f"step an int >= 1 and action in {list(ACTIONS)} (unset it for a normal run)"
        )
    return stage, int(step), action


def arm(environ: dict[str, str] | None = None) -> tuple[str, int, str] | None:
    """Read :data:`ENV_VAR` (from ``environ``, default ``os.environ``) and arm it; unset or empty disarms.

    Returns the armed ``(stage, step, action)`` or ``None``. Raises ValueError like :func:`parse`.
    """
    global _plan
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    _plan = parse(value) if value.strip() else None
    return _plan


def check(stage: str, step: int) -> None:
    """Fire the armed fault if it names ``stage`` at ``step``; otherwise do nothing.

    Raises:
        OSError: ``errno.ENOSPC``, when the armed action is ``oserror``. (``kill`` never returns; ``sigint`` /
            ``sigterm`` raise whatever the process's handler for that signal raises.)
    """
    if _plan is None or _plan[0] != stage or _plan[1] != step:
        return
    action = _plan[2]
    if action == "oserror":
        raise OSError(errno.ENOSPC, f"No space left on device (injected by {ENV_VAR}={stage}:{step}:oserror)")
    if action in ("sigint", "sigterm"):
        # Python runs the handler in this thread right after os.kill returns, i.e. at this point of the stage.
        os.kill(os.getpid(), signal.SIGINT if action == "sigint" else signal.SIGTERM)
        return
    os.kill(os.getpid(), signal.SIGKILL)
