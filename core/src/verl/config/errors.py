"""Errors raised while loading or validating a config.

Every problem is reported as a :class:`ConfigIssue` naming the full dotted key
(e.g. ``actor_rollout_ref.actor.ppo_epochs``) and saying what is wrong and how to
fix it. One :class:`ConfigError` carries all issues found in one pass, so a user
fixes a config in one round instead of one error per run.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs


@attrs.frozen
class ConfigIssue:
    """One problem in a config.

    Attributes:
        key: full dotted key the problem is about, e.g. ``algorithm.kl_ctrl.kl_coef``
            (list items as ``trainer.logger[1]``).
        message: human-readable text; starts with the key.
    """

    key: str
    message: str


class ConfigError(ValueError):
    """A config is invalid: unknown key, wrong type or inconsistent values.

    ``str(error)`` lists every issue; ``error.key`` is the dotted key of the first one
    and ``error.issues`` holds all of them. Subclasses ``ValueError`` so callers that
    catch ``ValueError`` keep working.
    """

    def __init__(self, issues: ConfigIssue | Iterable[ConfigIssue] | str, key: str | None = None) -> None:
        if isinstance(issues, str):
            issues = [ConfigIssue(key or "", issues)]
        elif isinstance(issues, ConfigIssue):
            issues = [issues]
        self.issues: tuple[ConfigIssue, ...] = tuple(issues)
        if not self.issues:
            raise ValueError("ConfigError needs at least one issue")
        self.key: str = key if key is not None else self.issues[0].key
        super().__init__(self._render())

    def _render(self) -> str:
        if len(self.issues) == 1:
            return self.issues[0].message
        lines = [f"{len(self.issues)} config errors:"]
        # Continuation lines (e.g. a plugin manager's list of failed plugins) stay under their bullet.
        lines += ["  - " + issue.message.replace("\n", "\n    ") for issue in self.issues]
        return "\n".join(lines)

    def __reduce__(self):  # keep pickling (e.g. across Ray) lossless
        return (type(self), (self.issues, self.key))


class IssueCollector:
    """Collects errors and warnings from validation rules, then raises once with all errors."""

    def __init__(self) -> None:
        self.errors: list[ConfigIssue] = []
        self.warnings: list[str] = []

    def error(self, key: str, message: str) -> None:
        """Record an error about ``key``; the message is prefixed with the key.

        A message starting with ``=`` quotes the value (``"='dapoo': no such ..."``) and is joined to the key
        without a separator, so it reads ``reward_model.reward_manager='dapoo': no such ...``.
        """
        self.errors.append(ConfigIssue(key, _keyed(key, message)))

    def warn(self, key: str, message: str) -> None:
        """Record a warning about ``key``, prefixed as in :meth:`error`."""
        self.warnings.append(_keyed(key, message))

    def raise_if_errors(self) -> None:
        if self.errors:
            raise ConfigError(self.errors)


def _keyed(key: str, message: str) -> str:
    return f"{key}{message}" if message.startswith("=") else f"{key}: {message}"
