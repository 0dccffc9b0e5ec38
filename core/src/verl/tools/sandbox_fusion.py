"""``code_interpreter`` on a sandbox-fusion server (verl's removed ``verl/tools/sandbox_fusion_tools.py`` and
``verl/utils/reward_score/sandbox_fusion/utils.py:call_sandbox_api``, last version ``5a506cc58^``).

Each call POSTs verl's request to ``sandbox_fusion_url`` (the server's ``/run_code`` endpoint)::

    {"compile_timeout": t, "run_timeout": t, "code": ..., "stdin": null, "memory_limit_MB": m,
     "language": "python", "files": {}, "fetch_files": []}

and reads ``run_result`` (``status``, ``stdout``, ``stderr``) of the JSON answer. A 504 (gateway timeout) is
retried up to 3 attempts with 1 s, 2 s between them (verl). Unlike :mod:`verl.tools.code_interpreter`, the code
runs wherever the server runs it (sandbox-fusion isolates each run in its own container), so this is the tool for
code that must not touch the training machine.

Replies: ``stdout + stderr`` when the run finished (verl). Where verl replies ``"no stdout here"`` to any other
status, this tool keeps the output and adds ``"TimeoutError: killed after {t} s (the sandbox's time limit)"`` for
``TimeLimitExceeded`` or ``"[sandbox run status: {status}]"`` otherwise, so the model sees what went wrong. A
server that cannot be reached, answers an HTTP error, ``SandboxError`` or no ``run_result`` makes ``execute``
raise, which the agent loop turns into an error reply counted in ``tool_errors``.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any, ClassVar

from verl.tools import default_schemas
from verl.tools.base import BaseTool, _positive
from verl.tools.sandbox import ThreadSafeSemaphore
from verl.tools.schemas import ToolResponse

__all__ = ["SandboxFusionError", "SandboxFusionTool", "call_sandbox_api"]

MAX_RETRIES = 3  # verl
INITIAL_RETRY_DELAY_S = 1.0  # verl: attempt k (0-based) waits (k + 1) * this before the next
API_TIMEOUT_S = 10.0  # verl: added to compile + run timeouts for the HTTP request
_sleep = time.sleep  # the delay between retries (a test replaces it)

CONFIG_DEFAULTS: dict[str, Any] = {
    "type": "native",
    "sandbox_fusion_url": None,
    "num_workers": 10,
    "rate_limit": 10,
    "enable_global_rate_limit": True,
    "default_timeout": 30,
    "default_language": "python",
    "memory_limit_mb": 1024,
    "tool_timeout": None,
}


class SandboxFusionError(RuntimeError):
    """The sandbox-fusion server could not run the request (unreachable, HTTP error, ``SandboxError``)."""


def call_sandbox_api(
    url: str, code: str, *, run_timeout: float, memory_limit_mb: int, language: str = "python"
) -> dict[str, Any]:
    """POST one run to the server (blocking); returns the server's JSON answer.

    Args:
        url: the ``/run_code`` endpoint.
        code: the program.
        run_timeout: seconds for compiling and for running (verl passes the same to both).
        memory_limit_mb: the run's memory limit, MiB.
        language: the server's language name (``python``, ``cpp``, ...).

    Raises:
        SandboxFusionError: connection failure, an HTTP error, 504 on every attempt, or an answer that is not
            a JSON object.
    """
    payload = {
        "compile_timeout": run_timeout,
        "run_timeout": run_timeout,
        "code": code,
        "stdin": None,
        "memory_limit_MB": memory_limit_mb,
        "language": language,
        "files": {},
        "fetch_files": [],
    }
    data = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    request_timeout = 2 * run_timeout + API_TIMEOUT_S
    last = ""
    for attempt in range(MAX_RETRIES):
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=request_timeout) as response:  # noqa: S310 (configured URL)
                answer = json.loads(response.read().decode("utf-8", "replace"))
        except urllib.error.HTTPError as exc:
            if exc.code != 504:
                raise SandboxFusionError(f"sandbox-fusion at {url} answered HTTP {exc.code} {exc.reason}") from exc
            last = f"HTTP 504 (gateway timeout) on attempt {attempt + 1}/{MAX_RETRIES}"
            if attempt < MAX_RETRIES - 1:
                _sleep(INITIAL_RETRY_DELAY_S * (attempt + 1))
            continue
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SandboxFusionError(f"sandbox-fusion at {url} is unreachable: {reason}") from exc
        except json.JSONDecodeError as exc:
            raise SandboxFusionError(f"sandbox-fusion at {url} answered something that is not JSON: {exc}") from exc
        if not isinstance(answer, dict):
            raise SandboxFusionError(f"sandbox-fusion at {url} answered {type(answer).__name__}, not a JSON object")
        return answer
    raise SandboxFusionError(f"sandbox-fusion at {url}: {last}")


def format_answer(answer: dict[str, Any], run_timeout: float) -> str:
    """The model's reply from a server answer (module docstring).

    Raises:
        SandboxFusionError: ``status`` is ``SandboxError`` or there is no ``run_result`` (e.g. a compile error
            of a compiled language reports ``compile_result`` only: its stderr is raised as the message).
    """
    if answer.get("status") == "SandboxError":
        raise SandboxFusionError(f"sandbox-fusion SandboxError: {answer.get('message') or answer}")
    run = answer.get("run_result")
    if not isinstance(run, dict):
        compile_result = answer.get("compile_result") or {}
        detail = compile_result.get("stderr") or answer.get("message") or "no run_result in the answer"
        raise SandboxFusionError(f"sandbox-fusion did not run the code: {detail}")
    text = (run.get("stdout") or "") + (run.get("stderr") or "")
    status = run.get("status")
    if status == "Finished":
        return text
    if text and not text.endswith("\n"):
        text += "\n"
    if status == "TimeLimitExceeded":
        return text + f"TimeoutError: killed after {run_timeout:g} s (the sandbox's time limit)\n"
    return text + f"[sandbox run status: {status}]\n"


class SandboxFusionTool(BaseTool):
    """Runs the model's ``code`` on a sandbox-fusion server (module docstring); verl's config keys.

    Config: ``sandbox_fusion_url`` (required), ``default_timeout`` (30 s per run), ``default_language``
    (``python``), ``memory_limit_mb`` (1024), ``num_workers`` (10) and ``rate_limit`` (10): at most
    ``min(num_workers, rate_limit)`` requests at once from this process (``num_workers`` alone when
    ``enable_global_rate_limit`` is false; verl's limit is global across a Ray cluster, this one per process),
    ``tool_timeout`` (the agent loop's limit on one call; null = every retry's HTTP timeout and delays), and
    verl's ``type: native``. A call's ``timeout`` and ``language`` parameters override the defaults (verl),
    where the schema declares them. The HTTP request runs in a worker thread: a call the agent loop cancels
    frees its slot at once while its request finishes in the background.

    Raises:
        ValueError: no ``sandbox_fusion_url``, an unknown config key, or a value that is not positive.
    """

    default_tool_schema: ClassVar[dict[str, Any]] = default_schemas.CODE_INTERPRETER

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: Any = None) -> None:
        config = dict(config or {})
        unknown = sorted(set(config) - set(CONFIG_DEFAULTS))
        if unknown:
            raise ValueError(f"SandboxFusionTool config: unknown key(s) {unknown}; known: {sorted(CONFIG_DEFAULTS)}")
        settings = {**CONFIG_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
        url = settings["sandbox_fusion_url"]
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(
                f"SandboxFusionTool config.sandbox_fusion_url={url!r} must be the server's http(s) URL, e.g. "
                "http://localhost:8080/run_code"
            )
        super().__init__(config, tool_schema)
        self.url = url
        self.run_timeout_s = _positive(settings["default_timeout"], "SandboxFusionTool config.default_timeout")
        self.language = str(settings["default_language"])
        self.memory_limit_mb = int(_positive(settings["memory_limit_mb"], "SandboxFusionTool config.memory_limit_mb"))
        workers = int(_positive(settings["num_workers"], "SandboxFusionTool config.num_workers"))
        if settings["enable_global_rate_limit"]:
            workers = min(workers, int(_positive(settings["rate_limit"], "SandboxFusionTool config.rate_limit")))
        self.max_concurrency = workers
        self._slots = ThreadSafeSemaphore(workers)
        per_attempt = 2 * self.run_timeout_s + API_TIMEOUT_S
        retries_s = MAX_RETRIES * per_attempt + INITIAL_RETRY_DELAY_S * sum(range(1, MAX_RETRIES))
        tool_timeout = settings["tool_timeout"]
        self.timeout_s = (
            retries_s if tool_timeout is None else _positive(tool_timeout, "SandboxFusionTool config.tool_timeout")
        )

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run ``parameters["code"]`` on the server; returns ``(reply, 0.0, metrics)``.

        ``metrics``: ``run_status`` (the server's), ``timed_out``, ``duration_s`` (``execution_time``).

        Raises:
            TypeError: ``code`` is not a string.
            SandboxFusionError: see :func:`call_sandbox_api` and :func:`format_answer`.
        """
        code = parameters.get("code")
        if not isinstance(code, str):
            raise TypeError(f"{self.name}: 'code' must be a string, got {type(code).__name__}")
        run_timeout = _positive(parameters.get("timeout", self.run_timeout_s), f"{self.name} timeout")
        language = str(parameters.get("language", self.language))
        async with self._slots:
            answer = await asyncio.to_thread(
                call_sandbox_api,
                self.url,
                code,
                run_timeout=run_timeout,
                memory_limit_mb=self.memory_limit_mb,
                language=language,
            )
        text = format_answer(answer, run_timeout)
        run = answer.get("run_result") or {}
        metrics = {
            "run_status": run.get("status"),
            "timed_out": run.get("status") == "TimeLimitExceeded",
            "duration_s": run.get("execution_time"),
        }
        return ToolResponse(text=text), 0.0, metrics
