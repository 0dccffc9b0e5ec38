"""``PlatformTests``: the conformance kit every device platform (core's or a vendor plugin's) subclasses.

The platform is the one the plugin manager returns for ``platform_name``; the kit never builds it any other
way. Probe checks run everywhere; the rest skip with the probe's reason on a machine without the device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from verl.testing.conformance.build import build_training_engine, plugin_spec

_WORKER = Path(__file__).with_name("platform_worker.py")
# Run by path without putting this folder first on sys.path (its platform.py would shadow the stdlib's), and
# without importing this package (pytest, engines): the fresh process holds only what the probe pulls in.
_LAUNCH = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
MEMORY_KEYS = ("allocated_bytes", "reserved_bytes", "max_allocated_bytes", "max_reserved_bytes")


def _run_worker(args: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _LAUNCH, str(_WORKER), *args], env=env, capture_output=True, text=True, timeout=timeout_s
    )


class PlatformTests:
    """Conformance tests for a :class:`verl.platform.Platform`; subclass it in a ``Test*`` class.

    Usage (a vendor plugin's ``tests/test_platform_conformance.py``)::

        import pytest
        from verl.testing.conformance import PlatformTests


        class TestNpuPlatform(PlatformTests):
            platform_name = "npu"
            forbidden_imports = ("torch_npu",)  # the probe must not import it in the driver

    Class attributes (set them in the subclass):

    ``platform_name`` (required)
        The ``PlatformSpec.name`` registered by the plugin (what users put in ``trainer.device``). The spec
        comes from ``get_plugin_manager().get("platform", platform_name)``, so the plugin must be installed
        (entry point ``verl.plugins``) and loadable in a fresh process too: two tests start one.
    ``forbidden_imports``
        Modules the probe must not import (backend libraries that initialise a device or take seconds:
        ``("torch_npu",)``), checked in a fresh process. Default ``()``.

    Fixtures (override under the same name, ``@pytest.fixture(scope="class")`` then ``@classmethod``):

    ``probe_env``
        Extra environment variables for the fresh processes (``{}``).
    ``device_logprob_atol``
        Absolute tolerance between the reference training engine's log-probs / entropies on the device and
        on the CPU, per valid token. Default ``1e-4`` (float32 matmuls on an accelerator reorder sums;
        observed differences on CUDA are about ``1e-6``; on the ``cpu`` platform they are exactly 0).
    ``collective_world_size``
        Ranks of the collective check (``2``). An accelerator platform with fewer devices than that skips
        it, with the device count as the reason.

    Tests:

    * the probe never raises, answers ``bool`` or :class:`~verl.platform.ProbeResult`, the same twice; a "no"
      is a ``ProbeResult`` with a non-empty reason (users see it in ``verl plugins`` and in errors);
    * in a fresh process, the probe leaves every ``torch.<device>`` module uninitialised
      (``is_initialized()`` false: ``torch.cuda``, ``torch.npu``, ``torch.xpu``, ... and
      ``torch.<device_type>``) and imports none of ``forbidden_imports``;

    the rest skip with the probe's reason when it says no:

    * device facts: the factory returns a ``Platform`` whose class attributes are set (non-empty strings;
      ``visible_devices_env`` a string or ``None``), ``device_type`` is a torch device type (and equals the
      spec's ``device_type`` where the spec declares one), ``device_count() >= 1``, ``device_name()`` a
      non-empty string, ``torch_device().type == device_type``, ``current_device()`` in range, a negative
      index refused with ``ValueError``;
    * seeding: ``manual_seed(s)`` twice gives the same ``torch.rand`` on the device (and the same Python and
      numpy draws), another seed different ones;
    * memory: ``memory_stats()`` has ``allocated_bytes``, ``reserved_bytes``, ``max_allocated_bytes``,
      ``max_reserved_bytes`` as non-negative ints, peaks >= current values, reserved >= allocated; on a
      device other than ``cpu`` a 64 MiB tensor raises ``allocated_bytes`` by at least that much;
      ``reset_peak_memory_stats()`` returns a bool and ``empty_cache()``/``synchronize()`` run;
    * a collective on ``dist_backend``: ``collective_world_size`` spawned processes (each shown one device
      through ``visible_devices_env``) ``all_reduce`` and ``broadcast`` known tensors on the device;
    * the reference training engine (core's ``reference`` spec, built from a config) gives the same
      log-probs and entropies on the device as on the CPU within ``device_logprob_atol``.

    On CPU the whole kit takes a few seconds (the collective starts two Python processes).
    """

    platform_name: str = ""
    forbidden_imports: tuple[str, ...] = ()

    # ------------------------------------------------------------------ fixtures

    @pytest.fixture(scope="class")
    @classmethod
    def platform_spec(cls) -> Any:
        if not cls.platform_name:
            pytest.fail(f"{cls.__name__} must set the class attribute platform_name (e.g. 'npu')", pytrace=False)
        return plugin_spec("platform", cls.platform_name)

    @pytest.fixture(scope="class")
    @classmethod
    def probe_env(cls) -> dict[str, str]:
        return {}

    @pytest.fixture(scope="class")
    @classmethod
    def device_logprob_atol(cls) -> float:
        return 1e-4

    @pytest.fixture(scope="class")
    @classmethod
    def collective_world_size(cls) -> int:
        return 2

    @pytest.fixture(scope="class")
    @classmethod
    def probe_answer(cls, platform_spec: Any) -> Any:
        return platform_spec.probe()

    @pytest.fixture(scope="class")
    @classmethod
    def platform(cls, platform_spec: Any, probe_answer: Any) -> Any:
        if not probe_answer:
            reason = getattr(probe_answer, "reason", "") or "the probe answered no"
            pytest.skip(f"platform {cls.platform_name!r} is not available here: {reason}")
        return platform_spec.factory()

    def _env(self, probe_env: dict[str, str]) -> dict[str, str]:
        return {**os.environ, **probe_env}

    # ------------------------------------------------------------------ probe

    def test_probe_never_raises_and_explains_a_no(self, platform_spec: Any) -> None:
        from verl.platform import ProbeResult

        try:
            first, second = platform_spec.probe(), platform_spec.probe()
        except Exception as exc:
            pytest.fail(
                f"probe of {self.platform_name!r} raised {type(exc).__name__}: {exc}; a probe reports a missing "
                "driver or library as ProbeResult(False, reason)"
            )
        for answer in (first, second):
            assert isinstance(answer, bool | ProbeResult), (
                f"probe of {self.platform_name!r} returned {type(answer).__name__} ({answer!r}); return bool or "
                "verl.platform.ProbeResult"
            )
        assert bool(first) == bool(second), f"the probe changed its answer between two calls: {first!r}, {second!r}"
        if not first:
            assert isinstance(first, ProbeResult) and isinstance(first.reason, str) and first.reason.strip(), (
                f"probe of {self.platform_name!r} said no without a reason ({first!r}): return ProbeResult(False, "
                "'what is missing and how to fix it')"
            )
        if isinstance(first, ProbeResult):
            assert isinstance(first.reason, str), f"ProbeResult.reason must be a str, got {first.reason!r}"

    def test_probe_in_a_fresh_process_initialises_no_device(self, probe_env: dict[str, str]) -> None:
        args = ["probe", self.platform_name, json.dumps(list(self.forbidden_imports))]
        proc = _run_worker(args, self._env(probe_env), timeout_s=120)
        assert proc.returncode == 0, f"probing {self.platform_name!r} in a fresh process failed:\n{proc.stderr[-4000:]}"
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        assert report["error"] is None, f"probe of {self.platform_name!r} raised in a fresh process: {report['error']}"
        assert not report["initialised"], (
            f"probing {self.platform_name!r} initialised {report['initialised']} in the driver; a probe must not "
            "create a device context (it runs before workers fork): count devices without initialising them"
        )
        assert not report["imported"], (
            f"probing {self.platform_name!r} imported {report['imported']} (forbidden_imports); check for the "
            "package with importlib.util.find_spec and import it only in the platform's factory or a subprocess"
        )

    # ------------------------------------------------------------------ device facts

    def test_device_facts(self, platform: Any, platform_spec: Any) -> None:
        from verl.platform import Platform

        assert isinstance(platform, Platform), f"factory returned {type(platform).__name__}, not a verl Platform"
        for attr in ("name", "device_type", "vendor", "dist_backend", "ray_resource_name"):
            value = getattr(platform, attr)
            assert isinstance(value, str) and value, f"{type(platform).__name__}.{attr} must be a non-empty str"
        env = platform.visible_devices_env
        assert env is None or (isinstance(env, str) and env), "visible_devices_env must be a non-empty str or None"
        torch.device(platform.device_type)  # raises for a device type torch does not know
        declared = getattr(platform_spec, "device_type", None)
        if declared:
            assert platform.device_type == declared, (
                f"spec {platform_spec.name!r} declares device_type {declared!r}, its platform has {platform.device_type!r}"
            )
        count = platform.device_count()
        assert isinstance(count, int) and count >= 1, f"device_count() = {count!r} on a platform whose probe said yes"
        name = platform.device_name()
        assert isinstance(name, str) and name.strip(), f"device_name() = {name!r}"
        assert platform.torch_device().type == platform.device_type
        current = platform.current_device()
        assert isinstance(current, int) and 0 <= current < count, f"current_device() = {current!r} of {count}"
        platform.set_device(current)
        with pytest.raises(ValueError):
            platform.set_device(-1)

    def test_manual_seed_is_reproducible(self, platform: Any) -> None:
        import random

        import numpy as np

        device = platform.torch_device()

        def draw(seed: int) -> tuple:
            platform.manual_seed(seed)
            return torch.rand(16, device=device).cpu(), random.random(), float(np.random.rand())

        a, b, c = draw(1234), draw(1234), draw(4321)
        assert torch.equal(a[0], b[0]) and a[1:] == b[1:], "manual_seed(s) twice gave different draws"
        assert not torch.equal(a[0], c[0]), "manual_seed with another seed gave the same torch.rand on the device"

    def test_memory_stats(self, platform: Any) -> None:
        stats = platform.memory_stats()
        missing = [k for k in MEMORY_KEYS if k not in stats]
        assert not missing, f"memory_stats() lacks {missing} (has {sorted(stats)})"
        for key in MEMORY_KEYS:
            value = stats[key]
            assert isinstance(value, int) and not isinstance(value, bool) and value >= 0, f"{key} = {value!r}"
        assert stats["max_allocated_bytes"] >= stats["allocated_bytes"]
        assert stats["max_reserved_bytes"] >= stats["reserved_bytes"]
        assert stats["reserved_bytes"] >= stats["allocated_bytes"]
        assert isinstance(platform.reset_peak_memory_stats(), bool)
        if platform.device_type != "cpu":
            before = platform.memory_stats()["allocated_bytes"]
            block = torch.ones(16 << 20, dtype=torch.float32, device=platform.torch_device())  # 64 MiB
            platform.synchronize()
            after = platform.memory_stats()
            assert after["allocated_bytes"] - before >= block.numel() * 4, (
                f"allocated_bytes grew by {after['allocated_bytes'] - before} for a 64 MiB tensor"
            )
            assert after["max_allocated_bytes"] >= after["allocated_bytes"]
            del block
        platform.empty_cache()
        platform.synchronize()

    # ------------------------------------------------------------------ collectives

    def test_collective_on_dist_backend(
        self, platform: Any, probe_env: dict[str, str], collective_world_size: int, tmp_path: Path
    ) -> None:
        from verl.engines.weight_sync import free_port

        world = int(collective_world_size)
        count = platform.device_count()
        if platform.device_type != "cpu" and count < world:
            pytest.skip(f"the collective check needs {world} {platform.name} devices, {count} visible")
        env_name = platform.visible_devices_env
        visible = os.environ.get(env_name, "") if env_name else ""
        ids = [v for v in visible.split(",") if v.strip()] or [str(i) for i in range(count)]
        port = free_port()
        procs = []
        for rank in range(world):
            env = {
                **self._env(probe_env),
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
            }
            if env_name and platform.device_type != "cpu":
                env[env_name] = ids[rank]  # one device per rank, as Ray gives each worker
            cmd = [sys.executable, "-c", _LAUNCH, str(_WORKER), "collective", self.platform_name, str(tmp_path)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = []
        try:
            for proc in procs:
                logs.append(proc.communicate(timeout=180)[0])
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        failed = [r for r, p in enumerate(procs) if p.returncode != 0]
        assert not failed, f"collective on {platform.dist_backend!r}: ranks {failed} failed:\n" + "\n".join(
            f"--- rank {r} ---\n{(logs[r] if r < len(logs) else '')[-3000:]}" for r in failed
        )
        total = world * (world + 1) / 2
        for rank in range(world):
            result = json.loads((tmp_path / f"rank{rank}.json").read_text())
            assert result["backend"] == platform.dist_backend
            assert result["device_type"] == platform.device_type
            assert result["all_reduce"] == [total, 10 * total], f"rank {rank}: all_reduce gave {result['all_reduce']}"
            assert result["broadcast"] == [7.0, 8.0, 9.0], f"rank {rank}: broadcast gave {result['broadcast']}"

    # ------------------------------------------------------------------ numerics

    def test_reference_engine_log_probs_on_device_match_cpu(
        self, platform: Any, tmp_path_factory: pytest.TempPathFactory, device_logprob_atol: float
    ) -> None:
        from verl.testing.conformance.checks import check_log_probs_close
        from verl.testing.conformance.inputs import make_training_batch, save_conformance_model
        from verl.testing.conformance.training import reference_config

        model = save_conformance_model(tmp_path_factory.mktemp("platform_conformance") / "model")
        spec = plugin_spec("training_engine", "reference")
        cfg = reference_config(model)
        data = make_training_batch()
        outs = {}
        for where in ("cpu", "device"):
            device = torch.device("cpu") if where == "cpu" else platform.torch_device()
            engine = build_training_engine(spec, cfg, model=model, device=device)
            moved = data.to(device) if device.type != "cpu" else data
            out = engine.compute_log_prob(moved, calculate_entropy=True)
            outs[where] = {k: out.batch[k].cpu() for k in ("old_log_probs", "entropys")}
            del engine
        mask = data.batch["response_mask"]
        for key in ("old_log_probs", "entropys"):
            check_log_probs_close(
                outs["device"][key],
                outs["cpu"][key],
                mask,
                atol=device_logprob_atol,
                what=f"reference engine {key} on {platform.torch_device()} vs cpu",
            )
