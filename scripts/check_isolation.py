"""Checks run by ``nox -s "isolation(<plugin>)"``: an environment with only verl-core and one plugin.

    python scripts/check_isolation.py fsdp plugins/verl-fsdp

1. ``import verl`` imports neither torch, ray nor the plugin (cheap import, plugins load lazily);
2. ``verl plugins --json`` lists exactly core's built-ins and this plugin, with no load failure;
3. selecting the plugin's backend loads a valid config (``verl config show ...`` exits 0), or, where the
   backend library is not installed, is refused with exit code 2 naming how to install it; for a platform
   plugin (``platform:<name>``), ``verl plugins --json`` lists that platform from the plugin with a reason;
4. selecting a backend of a plugin that is not installed fails with exit code 2 and names the
   distribution: how to install it from the checkout, or that it is not available yet.

Exits 1 with one line per failed check.
"""

from __future__ import annotations

import json
import subprocess
import sys

# plugin -> (its distribution, its import package, override selecting it, (override of another plugin, its dist))
PLUGINS: dict[str, tuple[str, str, str, tuple[str, str]]] = {
    "fsdp": (
        "verl-fsdp",
        "verl_fsdp",
        "actor_rollout_ref.actor.strategy=fsdp",
        ("actor_rollout_ref.actor.strategy=megatron", "verl-megatron"),
    ),
    "vllm": (
        "verl-vllm",
        "verl_vllm",
        "actor_rollout_ref.rollout.name=vllm",
        ("actor_rollout_ref.rollout.name=sglang", "verl-sglang"),
    ),
    # megatron-core comes with the plugin here (isolation installs verl-megatron[cpu]), so selecting it loads.
    "megatron": (
        "verl-megatron",
        "verl_megatron",
        "actor_rollout_ref.actor.strategy=megatron",
        ("actor_rollout_ref.rollout.name=sglang", "verl-sglang"),
    ),
    # CUDA-only rollout engines, never installable with their library here: selecting them is refused with the
    # reason and the install line.
    "sglang": (
        "verl-sglang",
        "verl_sglang",
        "actor_rollout_ref.rollout.name=sglang",
        ("actor_rollout_ref.rollout.name=trtllm", "verl-trtllm"),
    ),
    "trtllm": (
        "verl-trtllm",
        "verl_trtllm",
        "actor_rollout_ref.rollout.name=trtllm",
        ("actor_rollout_ref.rollout.name=sglang", "verl-sglang"),
    ),
    # A platform plugin: check 3 is "verl plugins lists the platform with its probe's answer" (a config with
    # trainer.device=npu also needs an engine that runs on npu, which core alone does not provide).
    "npu": (
        "verl-npu",
        "verl_npu",
        "platform:npu",
        ("actor_rollout_ref.actor.strategy=megatron", "verl-megatron"),
    ),
}


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300)


def _check_selected(select: str, dist: str, listing: subprocess.CompletedProcess) -> str | None:
    """Check 3: ``None`` (and an ``ok:`` line) when selecting the plugin's backend works, else the failure."""
    if select.startswith("platform:"):
        name = select.split(":", 1)[1]
        specs = json.loads(listing.stdout)["specs"]["platform"] if listing.returncode == 0 else []
        found = [s for s in specs if s["name"] == name and s["distribution"] == dist and s["reason"].strip()]
        if not found:
            return f"verl plugins does not list platform {name!r} from {dist} with a probe reason"
        print(f"ok: verl plugins lists platform {name} from {dist}: {found[0]['reason']}")
        return None
    chosen = _run("-m", "verl.cli.main", "config", "show", select)
    # Without its backend library (vLLM for verl-vllm) the plugin's backend is refused at config load, naming
    # the library and how to install it: that is the right answer in an environment of core + plugin alone.
    refused = chosen.stderr[chosen.stderr.find("error:") :]
    if chosen.returncode == 2 and "is installed but cannot run here" in refused and "pip install" in refused:
        print(f"ok: {select} is refused with how to install its backend: {refused.strip().splitlines()[0]}")
        return None
    if chosen.returncode != 0:
        return f"verl config show {select} exited {chosen.returncode}: {chosen.stderr.strip()}"
    print(f"ok: {select} loads")
    return None


def main(argv: list[str]) -> int:
    """Run the checks of the module docstring for ``argv[0]`` (a key of :data:`PLUGINS`); 1 when one fails."""
    if len(argv) < 1 or argv[0] not in PLUGINS:
        print(f"usage: check_isolation.py <{'|'.join(PLUGINS)}> [folder]", file=sys.stderr)
        return 2
    dist, package, select, (other, other_dist) = PLUGINS[argv[0]]
    failures: list[str] = []

    modules = ("torch", "ray", package)
    probe = _run("-c", f"import sys, verl; print(','.join(m for m in {modules!r} if m in sys.modules))")
    if probe.returncode != 0 or probe.stdout.strip():
        failures.append(f"import verl pulled in: {probe.stdout.strip() or probe.stderr.strip()}")
    else:
        print(f"ok: import verl imports none of torch, ray, {package}")

    listing = _run("-m", "verl.cli.main", "plugins", "--json")
    if listing.returncode != 0:
        failures.append(f"verl plugins --json failed: {listing.stderr.strip()}")
    else:
        report = json.loads(listing.stdout)
        dists = sorted(p["distribution"] for p in report["plugins"])
        if dists != sorted(["verl-core", dist]):
            failures.append(f"verl plugins lists {dists}, expected exactly verl-core and {dist}")
        elif report.get("failures"):
            failures.append(f"plugin load failures: {report['failures']}")
        else:
            print(f"ok: verl plugins lists exactly verl-core and {dist}")

    failure = _check_selected(select, dist, listing)
    if failure:
        failures.append(failure)

    missing = _run("-m", "verl.cli.main", "config", "show", other)
    named = f"{other_dist} plugin" in missing.stderr and (
        "pip install" in missing.stderr or "not available yet" in missing.stderr
    )
    if missing.returncode != 2 or not named:
        failures.append(
            f"verl config show {other}: expected exit 2 naming the {other_dist} plugin and how to get it, got "
            f"{missing.returncode}: {missing.stderr.strip()}"
        )
    else:
        print(f"ok: {other} names the missing distribution ({other_dist})")

    for line in failures:
        print(f"FAIL: {line}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
