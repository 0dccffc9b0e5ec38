"""``broadcast`` weight sync: bucketed torch.distributed broadcast from the trainer to a rollout pool.

Standalone (disaggregated) rollout mode, as verl's ``nccl``/``hccl`` checkpoint engines
(``verl/checkpoint_engine``, anatomy §7.1): trainer and rollout workers are different processes, so
they meet in a separate process group (:mod:`verl.engines.weight_sync.group`) of ``1 + rollout workers``
ranks. Rank 0 (the trainer's rank 0) streams ``trainer.iter_weights()`` into flat byte buckets of at
most ``checkpoint_engine.update_weights_bucket_megabytes`` MiB and broadcasts, per bucket::

    meta   int64 (2,)            [header_nbytes, bucket_nbytes]   (header_nbytes 0: end, -1: sender failed)
    header uint8 (header_nbytes) JSON [{name, dtype, shape, offset}, ...]   (verl.engines.weight_sync.buckets)
    bucket uint8 (bucket_nbytes) raw tensor bytes at 64-byte aligned offsets

preceded, when the trainer can list them (``weight_manifest``), by the update's names and shapes (meta
``[-2, nbytes]`` + JSON ``[[name, shape], ...]``): a receiver whose rollout refuses them
(``rollout.check_weights``) loads nothing, drains the buckets (the others are mid-collective) and raises.
Every receiver hands each bucket's tensors (views into the bucket, no copy) to
``rollout.update_weights`` as soon as it arrives, so its extra memory is about one bucket.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import attrs
import torch
import torch.distributed as dist

from verl.engines.weight_sync.buckets import (
    ALIGN,
    BucketPlanner,
    as_bytes,
    bucket_capacity_bytes,
    decode_header,
    encode_header,
    entry_nbytes,
    header_entry,
    tensor_nbytes,
    unpack_bucket,
)
from verl.engines.weight_sync.group import check_backend, make_backend, make_store

_END, _ABORT, _MANIFEST = 0, -1, -2


class SyncGroupError(ValueError):
    """``sync``/``init_group`` called in a state or role that does not fit the sync group."""


class WeightSyncAbortedError(RuntimeError):
    """The sender failed while producing weights; the receivers got its abort marker."""


@attrs.frozen(kw_only=True)
class BroadcastOptions:
    """Options of the ``broadcast`` checkpoint engine (``checkpoint_engine.engine_kwargs.broadcast``).

    Attributes:
        timeout_s: seconds a rank waits for the store, the rendezvous and each collective.
        bucket_bytes: exact bucket capacity in bytes; overrides ``update_weights_bucket_megabytes``
            (whole MiB) when set, for small models and tests. At least 64.
    """

    timeout_s: float = attrs.field(default=600.0, validator=attrs.validators.gt(0))
    bucket_bytes: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(ALIGN))
    )


class BroadcastCheckpointEngine:
    """Weight sync trainer -> separate rollout processes over a standalone process group.

    Usage, in every process of the sync group (and on the trainer's other data-parallel ranks)::

        engine = BroadcastCheckpointEngine(cfg.actor_rollout_ref.rollout.checkpoint_engine, platform)
        engine.init_group(master_addr=addr, master_port=port, rank=r, world_size=1 + n_rollout_workers)
        metrics = engine.sync(trainer, None)     # trainer rank 0 (rank=0) and other trainer ranks (rank=None)
        metrics = engine.sync(None, rollout)     # rollout worker i (rank=1 + i)
        engine.close()

    Roles of :meth:`sync`:

    * sender (``trainer`` given, group rank 0): consumes ``trainer.iter_weights()`` and broadcasts it;
    * receiver (``rollout`` given, group rank >= 1): loads every bucket into ``rollout``;
    * non-member trainer rank (``init_group(rank=None)``): only drains ``trainer.iter_weights()``, which
      is collective for sharded trainers (FSDP gathers each full tensor on all ranks);
    * both given in one process: no group is used, the tensors are handed over directly exactly like
      :class:`verl.engines.weight_sync.colocated.ColocatedCheckpointEngine` (``shared`` in the metrics).

    Tensors yielded by ``iter_weights`` are held (not copied) until their bucket is packed and sent, so a
    trainer must not overwrite a yielded tensor in place while it yields the rest of that bucket. Sender
    peak extra memory: one bucket buffer plus those held tensors; receiver: one bucket. Tied weights
    (``lm_head.weight`` and ``model.embed_tokens.weight``) are sent as ``iter_weights`` yields them.

    Args:
        config: the ``checkpoint_engine`` section (``update_weights_bucket_megabytes``; its ``engine_kwargs``
            are never read here).
        platform: :class:`verl.platform.Platform` whose ``dist_backend`` names the group's backend and whose
            ``new_sync_group`` builds it (also for the ``backend`` override); default
            :class:`~verl.platform.cpu.CpuPlatform` (gloo) when not given.
        backend: another collective backend for the group, e.g. ``gloo`` (host memory) when sender and
            receivers share one accelerator (colocated placement: NCCL refuses two ranks on one GPU).

        options: :class:`BroadcastOptions`, validated at config load (``engine_kwargs.broadcast``); None for
            defaults.

    Raises:
        TypeError: ``options`` is not a :class:`BroadcastOptions`.
        ValueError: a non-positive bucket size.
    """

    def __init__(
        self, config: Any, platform: Any = None, *, backend: str | None = None, options: BroadcastOptions | None = None
    ) -> None:
        if options is not None and not isinstance(options, BroadcastOptions):
            raise TypeError(
                f"broadcast checkpoint engine: options must be a BroadcastOptions (verl.config.role_options) or "
                f"None, got {type(options).__name__}"
            )
        if platform is None:
            # Engines are handed their platform (the worker resolved it); they never resolve one themselves.
            from verl.platform.cpu import CpuPlatform

            platform = CpuPlatform()
        self.config = config
        self.platform = platform
        # Overridable because colocated processes share a GPU, where only gloo (host memory) can connect them.
        self.backend = backend or platform.dist_backend
        self.options = options if options is not None else BroadcastOptions()
        if self.options.bucket_bytes is not None:
            self.bucket_bytes = int(self.options.bucket_bytes)
        else:
            self.bucket_bytes = bucket_capacity_bytes(config.update_weights_bucket_megabytes)
        self.rank: int | None = None
        self.world_size = 0
        self.device = torch.device("cpu")
        self._joined = False
        self._store: Any = None
        self._backend: Any = None
        self._broken = False

    # ------------------------------------------------------------------ group

    def init_group(
        self,
        *,
        master_addr: str,
        master_port: int,
        rank: int | None,
        world_size: int,
        device: Any = None,
        timeout_s: float | None = None,
    ) -> None:
        """Join the sync group (rank 0 hosts its ``TCPStore`` at ``master_addr:master_port``).

        Never touches torch.distributed's default process group. Members block until all
        ``world_size`` ranks have joined (Gloo) or until the first collective (NCCL/HCCL).

        Args:
            master_addr: host of rank 0 (reachable from every rollout worker).
            master_port: free port there (e.g. :func:`verl.engines.weight_sync.free_port` on rank 0's host).
            rank: 0 for the trainer's sender, ``1..world_size-1`` for rollout workers, ``None`` for a
                trainer rank that only drains ``iter_weights`` (no connection is made).
            world_size: ``1 + number of rollout workers``, at least 2.
            device: device of the buckets; default ``cpu`` for gloo, else ``platform.torch_device()``.
            timeout_s: store/rendezvous/collective timeout; default ``engine_kwargs.broadcast.timeout_s``.

        Raises:
            SyncGroupError: already initialised, ``world_size < 2``, or ``rank`` outside ``[0, world_size)``.
            UnsupportedBackendError: the platform's ``dist_backend`` cannot build a group here.
        """
        if self._joined:
            raise SyncGroupError("broadcast checkpoint engine: init_group called twice; call close() first")
        if world_size < 2:
            raise SyncGroupError(
                f"broadcast sync group: world_size must be >= 2 (1 sender + receivers), got {world_size}"
            )
        if rank is not None and not 0 <= rank < world_size:
            raise SyncGroupError(
                f"broadcast sync group: rank {rank} outside [0, {world_size}) (world_size={world_size})"
            )
        backend = self.backend
        check_backend(backend, platform=self.platform)
        timeout = self.options.timeout_s if timeout_s is None else float(timeout_s)
        if device is not None:
            self.device = torch.device(device)
        else:
            self.device = torch.device("cpu") if backend == "gloo" else self.platform.torch_device()
        if rank is not None:
            self._store = make_store(master_addr, master_port, rank, world_size, timeout)
            self._backend = make_backend(
                backend, self._store, rank, world_size, timeout, platform=self.platform, master_addr=master_addr
            )
        self.rank, self.world_size, self._joined, self._broken = rank, world_size, True, False

    def close(self) -> None:
        """Destroy the sync group (shut the backend down, drop the store); safe to call twice."""
        if self._backend is not None:
            shutdown = getattr(self._backend, "shutdown", None)
            if callable(shutdown):
                shutdown()
        self._backend = self._store = None
        self.rank, self.world_size, self._joined = None, 0, False

    # ------------------------------------------------------------------ sync

    def sync(self, trainer: Any, rollout: Any) -> dict[str, Any]:
        """Move the trainer's weights to every rollout worker of the group (see the class doc for roles).

        Returns:
            ``{"tensors": int, "bytes": int, "buckets": int, "seconds": float}``: tensors and payload bytes
            (``numel * element_size``) sent, received or drained by this process, buckets broadcast
            (0 when draining or colocated); the colocated fallback adds ``"shared": bool``.

        Raises:
            TypeError: neither ``trainer`` nor ``rollout`` given.
            SyncGroupError: :meth:`init_group` not called, a trainer on a rank other than 0/None, a rollout
                on rank 0 or a non-member, or a group left broken by a failed collective.
            WeightSyncAbortedError: (receiver) the sender failed while producing weights.
            whatever ``rollout.update_weights`` raises (after the remaining buckets were drained, so the
            sender and the other receivers still finish).
        """
        start = time.perf_counter()
        if trainer is not None and rollout is not None:
            from verl.engines.weight_sync.colocated import ColocatedCheckpointEngine

            metrics = ColocatedCheckpointEngine(self.config).sync(trainer, rollout)
            return {**metrics, "buckets": 0, "seconds": time.perf_counter() - start}
        if trainer is None and rollout is None:
            raise TypeError("broadcast checkpoint engine: sync needs a trainer (sender) or a rollout (receiver)")
        if not self._joined:
            raise SyncGroupError("broadcast checkpoint engine: call init_group(...) before sync")
        if self._broken:
            raise SyncGroupError("broadcast sync group is broken by an earlier failure; close() and init_group again")
        if trainer is not None:
            if self.rank is None:
                counts = self._drain(trainer.iter_weights())
            elif self.rank == 0:
                manifest_fn = getattr(trainer, "weight_manifest", None)
                counts = self._send(trainer.iter_weights(), manifest_fn() if callable(manifest_fn) else None)
            else:
                raise SyncGroupError(f"broadcast sync group: only rank 0 sends weights; this is rank {self.rank}")
        else:
            if not self.rank:
                raise SyncGroupError(
                    f"broadcast sync group: a rollout receives on ranks 1..{self.world_size - 1}, this is rank {self.rank}"
                )
            counts = self._receive(rollout)
        return {**counts, "seconds": time.perf_counter() - start}

    # ------------------------------------------------------------------ internals

    def _broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        try:
            self._backend.broadcast([tensor], opts).wait()
            if self.device.type != "cpu":
                # wait() only orders the current stream; block so buffers are not freed mid-transfer.
                self.platform.synchronize()
        except Exception:
            self._broken = True
            raise

    def _send_meta(self, header_nbytes: int, bucket_nbytes: int) -> None:
        self._broadcast(torch.tensor([header_nbytes, bucket_nbytes], dtype=torch.int64, device=self.device))

    def _send_bucket(self, pending: list[tuple[str, torch.Tensor, int]], nbytes: int) -> None:
        header = encode_header(header_entry(name, tensor, offset) for name, tensor, offset in pending)
        if len(pending) == 1:
            buffer = as_bytes(pending[0][1]).to(self.device)  # alone (e.g. larger than a bucket): no packing copy
        else:
            buffer = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
            for _, tensor, offset in pending:
                buffer[offset : offset + tensor_nbytes(tensor)].copy_(as_bytes(tensor))
        header_tensor = torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.device)
        # Everything local is done before the first collective, so a local failure can still send the abort marker.
        self._send_meta(len(header), nbytes)
        self._broadcast(header_tensor)
        if nbytes:
            self._broadcast(buffer)

    def _send_manifest(self, manifest: list[tuple[str, tuple[int, ...]]]) -> None:
        import json

        raw = json.dumps([[name, list(shape)] for name, shape in manifest]).encode("utf-8")
        self._send_meta(_MANIFEST, len(raw))
        self._broadcast(torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(self.device))

    def _send(
        self, weights: Iterator[tuple[str, torch.Tensor]], manifest: list[tuple[str, tuple[int, ...]]] | None = None
    ) -> dict[str, int]:
        counts = {"tensors": 0, "bytes": 0, "buckets": 0}
        planner = BucketPlanner(self.bucket_bytes)
        pending: list[tuple[str, torch.Tensor, int]] = []
        if manifest is not None:
            self._send_manifest(manifest)
        try:
            for name, tensor in weights:
                nbytes = tensor_nbytes(tensor)
                new_bucket, offset = planner.place(nbytes)
                if new_bucket and pending:
                    self._send_bucket(pending, planner.closed_nbytes)
                    counts["buckets"] += 1
                    pending = []
                pending.append((name, tensor, offset))
                counts["tensors"] += 1
                counts["bytes"] += nbytes
            if pending:
                self._send_bucket(pending, planner.open_nbytes)
                counts["buckets"] += 1
            self._send_meta(_END, 0)
        except Exception:
            if not self._broken:
                # The failure is local (iter_weights, packing): tell the receivers instead of leaving them hanging.
                self._send_meta(_ABORT, 0)
            raise
        return counts

    def _receive(self, rollout: Any) -> dict[str, int]:
        counts = {"tensors": 0, "bytes": 0, "buckets": 0}
        error: BaseException | None = None
        while True:
            meta = torch.empty(2, dtype=torch.int64, device=self.device)
            self._broadcast(meta)
            header_nbytes, bucket_nbytes = (int(v) for v in meta.tolist())
            if header_nbytes == _END:
                break
            if header_nbytes == _MANIFEST:
                import json

                raw = torch.empty(bucket_nbytes, dtype=torch.uint8, device=self.device)
                self._broadcast(raw)
                check = getattr(rollout, "check_weights", None)
                if callable(check) and error is None:
                    try:
                        check([(n, tuple(shape)) for n, shape in json.loads(raw.cpu().numpy().tobytes())])
                    except (KeyError, ValueError) as exc:
                        from verl.engines.weight_sync.colocated import WeightCheckError

                        error = WeightCheckError(
                            f"weight sync refused before writing anything (the rollout keeps its weights): {exc}"
                        )
                continue
            if header_nbytes == _ABORT:
                raise WeightSyncAbortedError(
                    "broadcast sync: the sender (trainer rank 0) failed while producing weights; see its log. "
                    f"{counts['buckets']} buckets had been loaded, so the rollout holds a mix of old and new weights"
                )
            header = torch.empty(header_nbytes, dtype=torch.uint8, device=self.device)
            self._broadcast(header)
            entries = decode_header(header.cpu().numpy().tobytes(), bucket_nbytes)
            bucket = torch.empty(bucket_nbytes, dtype=torch.uint8, device=self.device)
            if bucket_nbytes:
                self._broadcast(bucket)
            counts["buckets"] += 1
            counts["tensors"] += len(entries)
            counts["bytes"] += sum(entry_nbytes(dtype, shape) for _, dtype, shape, _ in entries)
            if error is None:
                try:
                    rollout.update_weights(unpack_bucket(bucket, entries))
                except Exception as exc:
                    # Keep receiving: the sender and the other receivers are mid-collective.
                    error = exc
            del bucket
        if error is not None:
            raise error
        return counts

    @staticmethod
    def _drain(weights: Iterator[tuple[str, torch.Tensor]]) -> dict[str, int]:
        counts = {"tensors": 0, "bytes": 0, "buckets": 0}
        for _, tensor in weights:
            counts["tensors"] += 1
            counts["bytes"] += tensor_nbytes(tensor)
        return counts


def build_broadcast_checkpoint_engine(
    config: Any, *, options: BroadcastOptions | None, platform: Any = None
) -> BroadcastCheckpointEngine:
    """Build the ``broadcast`` weight-sync engine from the root config on ``platform``, the worker's resolved
    :class:`~verl.platform.Platform` (``None``: cpu/gloo; the factory never resolves a platform itself), with the
    validated ``options`` (:func:`verl.config.role_options`; None = the defaults).

    With ``rollout.placement=colocated`` the group runs on gloo through host memory: trainer and rollout
    processes share each device, and NCCL/HCCL refuse two ranks on one device. (A null placement, in a config
    not resolved by ``load_config``, becomes ``hybrid`` or ``standalone``, never ``colocated``, so reading the
    key here is the same rule.)
    """
    rollout = config.actor_rollout_ref.rollout
    backend = "gloo" if getattr(rollout, "placement", None) == "colocated" else None
    return BroadcastCheckpointEngine(rollout.checkpoint_engine, platform, backend=backend, options=options)
