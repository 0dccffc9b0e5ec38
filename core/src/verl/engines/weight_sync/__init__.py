"""Weight sync between processes: the ``broadcast`` checkpoint engine and its process-group helpers."""

from verl.engines.weight_sync.broadcast import (
    BroadcastCheckpointEngine,
    BroadcastOptions,
    SyncGroupError,
    WeightSyncAbortedError,
    build_broadcast_checkpoint_engine,
)
from verl.engines.weight_sync.buckets import BucketHeaderError, BucketPlanner, bucket_capacity_bytes, plan_buckets
from verl.engines.weight_sync.group import UnsupportedBackendError, free_port

__all__ = [
    "BroadcastCheckpointEngine",
    "BroadcastOptions",
    "BucketHeaderError",
    "BucketPlanner",
    "SyncGroupError",
    "UnsupportedBackendError",
    "WeightSyncAbortedError",
    "bucket_capacity_bytes",
    "build_broadcast_checkpoint_engine",
    "free_port",
    "plan_buckets",
]
