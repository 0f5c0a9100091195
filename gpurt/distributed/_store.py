"""Key-value stores that gpurt.distributed stands on (stdlib only: no CUDA, no NCCL), with
torch.distributed's names and meanings; the rendezvous over them is
gpurt/distributed/_rendezvous.py.

The processes of a world (one per GPU, on one or several hosts) meet through a :class:`Store`:
:class:`TCPStore` (a server thread in rank 0's process, a client in each), :class:`FileStore`
(a private directory on a filesystem they all see) or :class:`HashStore` (threads of one
process). Values are bytes; :meth:`Store.add` keeps a counter as a decimal string under its
key; :meth:`Store.get` and :meth:`Store.wait` wait for keys and raise
:class:`DistributedTimeoutError` naming them rather than hang. A TCPStore client whose server
died gets a :class:`DistributedError` at once (from a hung one: a timeout). A FileStore
deletes its keys when its ``world_size`` users have closed it (torch deletes its file).

A TCPStore server bounds what a peer can make it hold (docs/distributed.md, "What the store
exposes"): ``GPURT_STORE_MAX_VALUE`` bytes per value, ``GPURT_STORE_MAX_CONNECTIONS``
connections, a half-sent request dropped after 30 s and an idle connection after
``GPURT_STORE_IDLE_TIMEOUT`` s (clients reconnect); with ``GPURT_STORE_SECRET`` set on every
rank, only peers that prove they know it (HMAC-SHA256 challenge-response) get in.

The stores live in their own modules, gathered here: the Store base class, its errors and
HashStore in _storebase.py, TCPStore (protocol, server, client) in _tcpstore.py, FileStore in
_filestore.py.
"""

from ._filestore import FileStore
from ._storebase import (
    DEFAULT_TIMEOUT,
    DistributedError,
    DistributedTimeoutError,
    HashStore,
    Store,
)
from ._tcpstore import TCPStore

__all__ = [
    "DEFAULT_TIMEOUT",
    "DistributedError",
    "DistributedTimeoutError",
    "FileStore",
    "HashStore",
    "Store",
    "TCPStore",
]
