"""How many live event sockets one user may hold on this replica.

Each conversation watched on a replica blocks on the events reader pool (XREAD BLOCK holds a
connection for the whole read, store/pool.py; sockets on one conversation share that read,
events/fanout.py), which every user's sockets share: without a cap, one user opening a few
hundred sockets on as many conversations (a script, a runaway tab) takes every reader
connection, and everyone else's sockets stop receiving events while theirs wait for the pool.
Past the cap a new socket is refused before the upgrade with 429 `too_many_sockets` (the
project's JSON error format, Retry-After): the user closes one and opens it again, nothing of
theirs is lost (a socket resumes from its last event id).

The count is this replica's own, like the pool it protects: a socket's conversation holds a
connection of the replica that serves it, so counting across replicas would refuse sockets
that starve no one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from controlplane.errors import QuotaExceeded


class TooManySockets(QuotaExceeded):
    code = "too_many_sockets"


class SocketCap:
    """Open event sockets per user on this replica, at most `limit` each (`0`: no limit)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: Counter[str] = Counter()

    def open_for(self, user_id: str) -> int:
        return self._open[user_id]

    @contextmanager
    def hold(self, user_id: str) -> Iterator[None]:
        """One socket of `user_id` for the block's length. Raises TooManySockets past the cap
        (the check and the count are one step: no await between them)."""
        if self.limit and self._open[user_id] >= self.limit:
            raise TooManySockets(
                f"{self.limit} event sockets are open for this user on this server; close one "
                "(a socket resumes from its last event id with `after`)",
                retry_after=1,
            )
        self._open[user_id] += 1
        try:
            yield
        finally:
            self._open[user_id] -= 1
            if self._open[user_id] <= 0:
                del self._open[user_id]
