"""The ``npu`` probe: is an Ascend NPU usable here? Asked from cheap to expensive, never importing torch_npu.

Importing ``torch_npu`` in the driver would load CANN into it (and, without CANN, fail; with torch-npu
installed even plain ``import torch`` fails then, unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), so the probe
reads files and metadata and leaves the one import to a child process:

1. ``package``: torch-npu installed (``importlib.util.find_spec``, no import) and built for the installed torch
   (its ``Requires-Dist: torch==X.Y.Z.*``, from metadata);
2. ``cann``: the CANN toolkit (``ASCEND_HOME_PATH``, ``ASCEND_TOOLKIT_HOME``, or
   ``/usr/local/Ascend/ascend-toolkit/latest``) and its version (``ascend_toolkit_install.info``);
3. ``devices``: device nodes ``/dev/davinci<N>``, or else ``npu-smi info`` listing NPUs;
4. ``import``: a child Python (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, then ``import torch_npu``) prints
   ``torch.npu.device_count()``, within a timeout.

The first "no" ends the probe; its reason says what is missing and how to fix it. Every root the steps read
(``/dev``, the CANN home, npu-smi, the child's Python, the machine name) is a field of :class:`ProbeRoots`, so
tests point them at fixture trees.
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import importlib.util
import json
import os
import platform as _pyplatform
import re
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import attrs

from verl.platform import ProbeResult
from verl_npu.cann import find_ascend_home, read_cann, set_env_hint
from verl_npu.smi import find_npu_smi, parse_npu_smi_info, run_npu_smi
from verl_npu.versions import torch_pair

__all__ = [
    "AUTOLOAD_ENV",
    "ProbeReport",
    "ProbeRoots",
    "Step",
    "check_cann",
    "check_devices",
    "check_import",
    "check_package",
    "probe_npu",
    "probe_report",
    "run_probe",
]

AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"
_MARK = "VERL_NPU_PROBE "
_DEVICE_NODE = re.compile(r"davinci\d+")
_INSTALL = (
    "from the verl checkout: pip install './plugins/verl-npu[npu]' (torch-npu pinned to your torch; "
    "or pip install torch-npu==<torch version>)"
)

# Run by the child Python: the one place torch_npu is imported. One marked JSON line, whatever else it prints.
_CHILD = f"""
import json, sys
try:
    import torch
    import torch_npu
    out = {{"ok": True, "count": int(torch.npu.device_count()), "torch_npu": getattr(torch_npu, "__version__", None)}}
except BaseException as exc:
    out = {{"ok": False, "error": type(exc).__name__ + ": " + str(exc)}}
print({_MARK!r} + json.dumps(out), flush=True)
"""


@attrs.frozen
class ProbeRoots:
    """Everything outside this process that the probe reads; defaults from :meth:`from_env`.

    Attributes:
        dev_dir: where device nodes live (``/dev``).
        ascend_home: CANN toolkit home; ``home_source`` says where it came from (a variable's name,
            ``"default"`` or ``"given"``).
        npu_smi: path of ``npu-smi``, ``None`` when not found.
        python: interpreter of the child that imports torch_npu (the workers' Python: ``sys.executable``).
        arch: machine name in CANN's layout (``x86_64``, ``aarch64``).
        timeout_s: limit of the child process, seconds.
    """

    dev_dir: str = "/dev"
    ascend_home: str = attrs.field(factory=lambda: find_ascend_home()[0])
    home_source: str = "given"
    npu_smi: str | None = None
    python: str = sys.executable
    arch: str = attrs.field(factory=_pyplatform.machine)
    timeout_s: float = 120.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **given: Any) -> ProbeRoots:
        """The real machine's roots (``environ`` defaults to ``os.environ``); ``given`` fields override."""
        home, source = find_ascend_home(environ)
        fields: dict[str, Any] = {"ascend_home": home, "home_source": source, "npu_smi": find_npu_smi(environ)}
        fields.update(given)
        if "ascend_home" in given and "home_source" not in given:
            fields["home_source"] = "given"
        return cls(**fields)


@attrs.frozen
class Step:
    """One probe step: ``name`` (``package``/``cann``/``devices``/``import``), ``ok``, ``reason``, ``facts``."""

    name: str
    ok: bool
    reason: str
    facts: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.frozen
class ProbeReport:
    """The steps that ran, in order (the last one is the first "no", if any)."""

    steps: tuple[Step, ...]

    @property
    def facts(self) -> dict[str, Any]:
        """Every step's facts merged (``torch_npu_version``, ``cann_version``, ``device_count``, ...)."""
        out: dict[str, Any] = {}
        for step in self.steps:
            out.update(step.facts)
        return out

    @property
    def result(self) -> ProbeResult:
        """The platform probe's answer: the failing step's reason, or a summary of what was found."""
        failed = next((s for s in self.steps if not s.ok), None)
        if failed is not None:
            return ProbeResult(False, failed.reason)
        f = self.facts
        return ProbeResult(
            True,
            f"{f['device_count']} device(s), torch-npu {f['torch_npu_version']}, CANN {f['cann_version']}",
        )


# Said with every "no CANN": torch's autoload imports torch_npu at `import torch`, which then fails. Not made
# conditional on the variable: a failed torch_npu import leaves TORCH_DEVICE_BACKEND_AUTOLOAD=0 behind in the
# process (torch_npu sets it while importing), so the current value does not tell what the user exported.
_AUTOLOAD_NOTE = (
    f". While torch-npu is installed without a working CANN, plain `import torch` fails in every process unless "
    f"{AUTOLOAD_ENV}=0 is exported (or torch-npu uninstalled)"
)


def check_package() -> Step:
    """Step 1: torch-npu installed and built for the installed torch, from metadata (nothing imported)."""
    if importlib.util.find_spec("torch_npu") is None:
        return Step("package", False, f"torch-npu is not installed: {_INSTALL}")
    try:
        dist = metadata.distribution("torch-npu")
    except metadata.PackageNotFoundError:
        return Step(
            "package", False, f"a torch_npu module is importable but no torch-npu distribution is installed: {_INSTALL}"
        )
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return Step("package", False, "torch is not installed: pip install torch==<the torch-npu release>")
    ok, why = torch_pair(torch_version, dist.version, dist.requires)
    facts = {"torch_npu_version": dist.version, "torch_version": torch_version}
    if not ok:
        torch_for_npu, npu_for_torch = dist.version.split(".post")[0], torch_version.split("+")[0]
        fix = f"install the matching pair: pip install torch=={torch_for_npu} or torch-npu=={npu_for_torch}"
        return Step("package", False, f"{why}; {fix}", facts)
    return Step("package", True, why, facts)


def check_cann(roots: ProbeRoots) -> Step:
    """Step 2: the CANN toolkit under ``roots.ascend_home`` and its version."""
    cann = read_cann(roots.ascend_home, roots.arch)
    facts = {"cann_home": cann.home, "cann_version": cann.version}
    if cann.version is None:
        where = f"{roots.home_source}={roots.ascend_home}" if roots.home_source != "default" else "the default path"
        reason = (
            f"CANN toolkit not found ({cann.problem}; looked at {where}): install the CANN toolkit for your "
            f"torch-npu release and `{set_env_hint(roots.ascend_home)}` (or set ASCEND_HOME_PATH)"
        )
        return Step("cann", False, reason + _AUTOLOAD_NOTE, facts)
    return Step("cann", True, f"CANN {cann.version} at {cann.home}", facts)


def check_devices(roots: ProbeRoots) -> Step:
    """Step 3: device nodes ``<dev_dir>/davinci<N>``; without any, ``npu-smi info`` listing NPUs."""
    try:
        nodes = sorted(n for n in os.listdir(roots.dev_dir) if _DEVICE_NODE.fullmatch(n))
    except OSError:
        nodes = []
    if nodes:
        return Step("devices", True, f"{len(nodes)} device node(s) in {roots.dev_dir}", {"device_nodes": nodes})
    no_nodes = f"no Ascend device nodes ({roots.dev_dir}/davinci<N>)"
    fix = (
        "install the Ascend driver, or in a container pass the devices "
        "(--device /dev/davinci0 --device /dev/davinci_manager --device /dev/devmm_svm --device /dev/hisi_hdc)"
    )
    if roots.npu_smi is None:
        return Step("devices", False, f"{no_nodes} and no npu-smi (it comes with the driver): {fix}")
    ok, out = run_npu_smi(roots.npu_smi, ["info"])
    if not ok:
        return Step("devices", False, f"{no_nodes} and {out}: {fix}")
    info = parse_npu_smi_info(out)
    facts = {"npu_smi_version": info.version, "npus": list(info.npus)}
    if not info.npus:
        return Step("devices", False, f"{no_nodes} and `npu-smi info` lists no NPU: {fix}", facts)
    return Step("devices", True, f"npu-smi {info.version} lists {len(info.npus)} NPU(s)", facts)


def check_import(roots: ProbeRoots, environ: Mapping[str, str] | None = None) -> Step:
    """Step 4: a child ``roots.python`` imports torch_npu (autoload off, the rest of the environment as the
    workers get it) and prints the device count."""
    env = dict(os.environ if environ is None else environ)
    env[AUTOLOAD_ENV] = "0"  # import torch_npu explicitly below, so its own error is what the child reports
    cmd = [roots.python, "-c", _CHILD]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=roots.timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return Step(
            "import",
            False,
            f"importing torch_npu in a child process took over {roots.timeout_s:g} s: "
            "check the driver with `npu-smi info`",
        )
    except OSError as exc:
        return Step("import", False, f"cannot start {roots.python}: {type(exc).__name__}: {exc.strerror or exc}")
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith(_MARK)), None)
    if line is None:
        tail = (proc.stderr.strip() or "no output").splitlines()[-1][:300]
        return Step("import", False, f"the torch_npu check in {roots.python} exited {proc.returncode}: {tail}")
    out = json.loads(line[len(_MARK) :])
    if not out["ok"]:
        error = out["error"][:300]
        hint = (
            f"; put CANN's libraries on the library path: `{set_env_hint(roots.ascend_home)}`" if ".so" in error else ""
        )
        return Step("import", False, f"import torch_npu failed in a child process: {error}{hint}")
    count, visible = out["count"], env.get("ASCEND_RT_VISIBLE_DEVICES")
    facts = {"device_count": count, "torch_npu_runtime": out["torch_npu"]}
    if count <= 0:
        return Step("import", False, f"torch_npu sees no NPU (ASCEND_RT_VISIBLE_DEVICES={visible!r})", facts)
    return Step("import", True, f"torch_npu sees {count} NPU(s)", facts)


def run_probe(roots: ProbeRoots | None = None, environ: Mapping[str, str] | None = None) -> ProbeReport:
    """Run the four steps in order, stopping at the first "no". Never raises, never imports torch_npu."""
    roots = ProbeRoots.from_env(environ) if roots is None else roots
    steps: list[Step] = []
    for check in (
        check_package,
        lambda: check_cann(roots),
        lambda: check_devices(roots),
        lambda: check_import(roots, environ),
    ):
        try:
            step = check()
        except Exception as exc:  # a bug here must read as "not usable, because", never crash `verl plugins`
            step = Step("internal", False, f"the npu probe failed: {type(exc).__name__}: {exc}")
        steps.append(step)
        if not step.ok:
            break
    return ProbeReport(tuple(steps))


@functools.lru_cache(maxsize=8)
def _cached(roots: ProbeRoots, visible: str | None) -> ProbeReport:
    return run_probe(roots)


def probe_npu() -> ProbeResult:
    """The ``npu`` platform's probe on this machine, once per process (per roots and relevant variables):
    every worker resolves its platform, and step 4 costs a child Python."""
    roots = ProbeRoots.from_env()
    return _cached(roots, os.environ.get("ASCEND_RT_VISIBLE_DEVICES")).result


def probe_report() -> ProbeReport:
    """The cached report behind :func:`probe_npu` (all steps and facts: CANN version, device count)."""
    roots = ProbeRoots.from_env()
    return _cached(roots, os.environ.get("ASCEND_RT_VISIBLE_DEVICES"))
