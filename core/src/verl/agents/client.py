"""The agent loops' view of the rollout replicas: one client, load-balanced, sticky per sample.

verl's ``GlobalRequestLoadBalancer`` (``verl/workers/rollout/llm_server.py``): a new request id goes to the
server with the fewest requests in flight; later requests of the same id (the sample's next turns) go to the
same server, whose prefix cache (where it has one) holds the conversation so far. The map is an LRU bounded by
``max_sticky`` ids. Thread-safe: the manager's agent-loop workers run their event loops in threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from verl.engines.serving import TokenOutput


class ServerClient:
    """``await generate(request_id, prompt_ids, sampling_params)`` on one of ``servers``.

    Args:
        servers: objects with ``async generate(request_id, prompt_ids, sampling_params) -> TokenOutput``
            (:class:`verl.engines.serving.AsyncRolloutServer`).
        max_sticky: request ids remembered (least recently used forgotten first).

    Raises:
        ValueError: no servers.
    """

    def __init__(self, servers: Sequence[Any], *, max_sticky: int = 100_000) -> None:
        if not servers:
            raise ValueError("ServerClient needs at least one rollout server")
        self.servers = list(servers)
        self.max_sticky = int(max_sticky)
        self._in_flight = [0] * len(self.servers)
        self._sent = [0] * len(self.servers)
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def _acquire(self, request_id: str) -> int:
        with self._lock:
            index = self._sticky.get(request_id)
            if index is None:
                index = min(range(len(self.servers)), key=lambda i: (self._in_flight[i], i))
            self._sticky[request_id] = index
            self._sticky.move_to_end(request_id)
            while len(self._sticky) > self.max_sticky:
                self._sticky.popitem(last=False)
            self._in_flight[index] += 1
            self._sent[index] += 1
            return index

    def _release(self, index: int) -> None:
        with self._lock:
            self._in_flight[index] -= 1

    async def generate(
        self, request_id: str, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any]
    ) -> TokenOutput:
        """Send one request to the sample's server (see the module docstring) and await its result."""
        index = self._acquire(str(request_id))
        try:
            return await self.servers[index].generate(str(request_id), list(prompt_ids), dict(sampling_params))
        finally:
            self._release(index)

    def requests_per_server(self) -> list[int]:
        """Requests sent to each server so far (for tests and metrics)."""
        with self._lock:
            return list(self._sent)


__all__ = ["ServerClient"]
