"""Sync edges moved by their transport (`m2flow.transfer`): the source's state packed into byte buckets
on its device, a small manifest through Ray, the bytes device to device.

A sync source's port returns what the worker likes (a versioned state dict, say). Its entries that are
dicts of tensors are packed, every tensor at an aligned offset of a flat uint8 bucket (several buckets
when the state is large); everything else travels in the manifest as is. The destination unpacks views
of the buckets it received under the same keys and names, so its port gets a value of the same shape,
with its own device's tensors, and checks versions and checksums as it always did.

By `cuda_ipc` the source keeps its buckets from sync to sync while the state's layout (names, dtypes, shapes)
holds and refills them in place (a sync is published only after the sync phase awaited every destination's
copy of the one before), and each destination keeps them mapped; offloading drops them (`forget`).
"""

from __future__ import annotations

import datetime
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from m2flow.errors import WorkerError
from m2flow.runtime.distributed import meet
from m2flow.transfer import Transport

ALIGN = 64  # byte alignment of every tensor in a bucket (any dtype can view it)
BUCKET_BYTES = 512 * 2**20  # a bucket is cut past this size: the copy in flight stays bounded


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives: `value[key][name]` is `bucket[offset : offset + nbytes]` as dtype and shape."""

    key: str
    name: str
    bucket: int
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class StateManifest:
    """What a destination needs to rebuild the source's value: its plain entries, where each tensor
    sits, the bucket sizes (and, for `cuda_ipc`, the handles that map the source's buckets)."""

    fields: dict[str, Any]
    slots: tuple[Slot, ...]
    bucket_bytes: tuple[int, ...]
    handles: tuple[tuple[Any, ...], ...] = ()  # `cuda_ipc`: per destination replica, a handle per bucket

    @property
    def nbytes(self) -> int:
        return sum(self.bucket_bytes)


@dataclass(frozen=True)
class Route:
    """One replica's part in a sync edge: the transport, and for a collective its group (rank 0 is the
    source's first replica, ranks 1.. the destination replicas) and rendezvous."""

    transport: Transport
    rank: int = 0
    world: int = 1
    address: str = ""
    port: int = 0
    timeout_s: float = 60.0  # a transfer
    meet_s: float = 60.0  # the group meeting at start-up
    edge: str = ""
    keep_mapping: bool = False  # `cuda_ipc`: a destination keeps the source's buckets mapped (`mapping_kept`)


def _tensor_trees(value: Any) -> dict[str, dict[str, Any]]:
    import torch

    if not isinstance(value, dict):
        return {}
    return {
        key: tree
        for key, tree in value.items()
        if isinstance(tree, dict) and tree and all(isinstance(t, torch.Tensor) for t in tree.values())
    }


def layout(value: dict[str, Any], bucket_bytes: int = BUCKET_BYTES) -> tuple[dict, tuple[Slot, ...], list, list]:
    """(plain fields, slots, bucket sizes, tensors in slot order): where every tensor of `value`'s tensor
    dicts goes in flat buckets."""
    trees = _tensor_trees(value)
    fields = {k: v for k, v in value.items() if k not in trees}
    tensors = [(key, name, t.detach()) for key, tree in trees.items() for name, t in tree.items()]
    slots, sizes, used = [], [], 0
    for key, name, t in tensors:
        nbytes = t.numel() * t.element_size()
        if not sizes or (used and used + nbytes > bucket_bytes):
            sizes.append(0)
            used = 0
        offset = used
        used = offset + -(-nbytes // ALIGN) * ALIGN
        sizes[-1] = used
        slots.append(
            Slot(key, name, len(sizes) - 1, offset, nbytes, str(t.dtype).removeprefix("torch."), tuple(t.shape))
        )
    return fields, tuple(slots), sizes, [t for _, _, t in tensors]


def fill(buckets: list, slots: tuple[Slot, ...], tensors: list) -> None:
    """Copy each tensor into its slot of `buckets`."""
    import torch

    for slot, t in zip(slots, tensors, strict=True):
        buckets[slot.bucket][slot.offset : slot.offset + slot.nbytes].copy_(
            t.contiguous().reshape(-1).view(torch.uint8)
        )


def new_buckets(sizes: list[int], device: str) -> list:
    """Empty uint8 buckets of these sizes on `device`."""
    import torch

    return [torch.empty(size, dtype=torch.uint8, device=device) for size in sizes]


def pack(value: dict[str, Any], device: str = "cpu", bucket_bytes: int = BUCKET_BYTES) -> tuple[dict, tuple, list]:
    """(plain fields, slots, uint8 buckets on `device`): every tensor of `value`'s tensor dicts copied
    into new flat buckets, in order."""
    fields, slots, sizes, tensors = layout(value, bucket_bytes)
    buckets = new_buckets(sizes, device)
    fill(buckets, slots, tensors)
    return fields, slots, buckets


def unpack(manifest: StateManifest, buckets: list) -> dict[str, Any]:
    """The source's value rebuilt: its plain fields, and views of `buckets` for its tensors."""
    import torch

    value: dict[str, Any] = dict(manifest.fields)
    for s in manifest.slots:
        raw = buckets[s.bucket][s.offset : s.offset + s.nbytes]
        value.setdefault(s.key, {})[s.name] = raw.view(getattr(torch, s.dtype)).view(s.shape)
    return value


class KeptBuckets:
    """A source's packed state kept from sync to sync: refilled in place while the state's layout (names,
    dtypes, shapes) holds, made anew when it changes."""

    def __init__(self, device: str):
        self.device = device
        self.buckets: list = []
        self.slots: tuple[Slot, ...] = ()

    def pack(self, value: dict[str, Any]) -> tuple[dict, tuple[Slot, ...], bool]:
        """(plain fields, slots, whether the buckets are new), `value`'s tensors copied into the buckets."""
        fields, slots, sizes, tensors = layout(value)
        fresh = slots != self.slots
        if fresh:
            self.buckets = []  # the old ones go before the new ones are made
            self.buckets = new_buckets(sizes, self.device)
            self.slots = slots
        fill(self.buckets, slots, tensors)
        return fields, slots, fresh

    def clear(self) -> None:
        self.buckets, self.slots = [], ()


class SyncTransport(ABC):
    """One replica's end of one sync edge: `publish` on the source's first replica, `send` there too when
    the transport needs the source's part (`source_sends`), `receive` on each destination replica."""

    name: ClassVar[Transport]
    source_sends: ClassVar[bool] = False
    meets: ClassVar[bool] = False  # a group that meets at a rendezvous on the source's node
    # every destination replica takes each publish (a group's broadcast; shares handed back only when taken)
    all_receive: ClassVar[bool] = False

    def __init__(self, route: Route, device: str):
        self.route, self.device = route, device

    def connect(self) -> None:
        """Meet the edge's other replicas (every member calls it at once, at start-up)."""
        return None

    @abstractmethod
    def publish(self, value: Any) -> Any:
        """What the source's port output becomes on its way to the destinations."""

    def send(self) -> int:
        """The source's part of the transfer after `publish` (bytes sent)."""
        return 0

    @abstractmethod
    def receive(self, message: Any) -> Any:
        """The value the destination's port is called with."""

    def forget(self) -> None:
        """The worker is about to be offloaded: what the transport keeps on its device between syncs goes."""
        return None


class ObjectStoreTransport(SyncTransport):
    """The value itself through Ray's object store, its tensors on the host (any destination reads them)."""

    name = "object_store"

    def publish(self, value: Any) -> Any:
        trees = _tensor_trees(value)
        if not trees:
            return value
        return {
            **value,
            **{k: {n: t.detach().to("cpu", copy=True) for n, t in tree.items()} for k, tree in trees.items()},
        }

    def receive(self, message: Any) -> Any:
        return message


class CollectiveTransport(SyncTransport):
    """A broadcast from rank 0 in a process group of the edge's own (NCCL on CUDA, gloo on CPU), met at
    start-up (NCCL forms its communicator at the first broadcast); every wait bounded by the route's
    timeouts."""

    name = "collective"
    source_sends = True
    meets = True
    all_receive = True

    def __init__(self, route: Route, device: str):
        super().__init__(route, device)
        self._group = None
        self._outbox: list = []  # the buckets of the last publish, until sent

    def connect(self) -> None:
        import torch
        import torch.distributed as dist

        r = self.route
        timeout = datetime.timedelta(seconds=r.timeout_s)
        store = meet(f"sync {r.edge}", r.address, r.port, r.rank, r.world, r.meet_s)
        if torch.device(self.device).type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self._group = dist.ProcessGroupNCCL(store, r.rank, r.world, options)
        else:
            self._group = dist.ProcessGroupGloo(store, r.rank, r.world, timeout)

    def publish(self, value: Any) -> StateManifest | Any:
        self._outbox = []
        if not _tensor_trees(value):
            return value
        fields, slots, self._outbox = pack(value, self.device)
        return StateManifest(fields, slots, tuple(b.numel() for b in self._outbox))

    def send(self) -> int:
        sent = sum(b.numel() for b in self._outbox)
        for bucket in self._outbox:
            self._broadcast(bucket)
        self._outbox = []  # sent: the destinations hold their own copies
        return sent

    def receive(self, message: Any) -> Any:
        if not isinstance(message, StateManifest):
            return message
        import torch

        buckets = [torch.empty(n, dtype=torch.uint8, device=self.device) for n in message.bucket_bytes]
        for bucket in buckets:
            self._broadcast(bucket)
        return unpack(message, buckets)

    def _broadcast(self, bucket) -> None:
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0
        if not self._group.broadcast([bucket], options).wait(datetime.timedelta(seconds=self.route.timeout_s)):
            raise WorkerError(f"sync {self.route.edge}: the broadcast was aborted (a member of the group failed?)")


class CudaIpcTransport(SyncTransport):
    """The source's buckets mapped into each destination on the same GPU (CUDA IPC) and copied there. The
    source keeps and refills its buckets (`KeptBuckets`); a destination keeps its mapping of them where the
    route says so (opening one costs milliseconds, copying through one a device copy).

    Each publish shares the buckets anew for every destination replica: torch counts a shared block's
    users per share (a destination that maps a block it already holds hands its share back at once), so a
    block is freed once every share is handed back, and every destination takes each publish
    (`all_receive`). A destination whose process dies holding a share or a mapping never hands it back:
    that block stays allocated until the source's process ends."""

    name = "cuda_ipc"
    all_receive = True  # a share no destination takes would keep the source's freed buckets in torch's limbo

    def __init__(self, route: Route, device: str):
        super().__init__(route, device)
        self._kept = KeptBuckets(device)  # source
        self._mapped: list = []  # destination: the source's buckets as mapped at the last receive

    def publish(self, value: Any) -> StateManifest | Any:
        if not _tensor_trees(value):
            return value
        import torch
        from torch.multiprocessing.reductions import reduce_tensor

        fields, slots, _ = self._kept.pack(value)
        torch.cuda.current_stream().synchronize()  # the buckets are full before anyone reads them
        buckets = self._kept.buckets
        handles = tuple(tuple(reduce_tensor(b) for b in buckets) for _ in range(self.route.world - 1))
        return StateManifest(fields, slots, tuple(b.numel() for b in buckets), handles)

    def receive(self, message: Any) -> Any:
        if not isinstance(message, StateManifest):
            return message
        import torch

        # buckets mapped at the last receive are still held: torch hands back that mapping, not a new one
        mapped = [rebuild(*args) for rebuild, args in message.handles[self.route.rank - 1]]
        buckets = [m.clone() for m in mapped]  # ours: the source refills its buckets at the next sync
        torch.cuda.current_stream().synchronize()
        self._mapped = mapped if self.route.keep_mapping else []
        return unpack(message, buckets)

    def forget(self) -> None:
        self._kept.clear()
        self._mapped = []


TRANSPORTS: dict[Transport, type[SyncTransport]] = {
    t.name: t for t in (ObjectStoreTransport, CollectiveTransport, CudaIpcTransport)
}


def transport_for(route: Route, device: str) -> SyncTransport:
    return TRANSPORTS[route.transport](route, device)
