"""A batch on a Ray cluster: one actor per node owns that node's sandboxes (a NodeRunner,
scale/node.py); the driver hands each job to a node that offers the job's tier, in calls
of up to CHUNK_MAX jobs (one as the queue runs short), with a next call queued for each of
a node's `concurrency` slots; the node runs at most `concurrency` calls at once.
docs/scale.md.

Tiers. A node offers the tiers it advertises as Ray resources, `corral_namespace`,
`corral_gvisor`, `corral_process`, `corral_wasm`, `corral_microvm` (`ray start --resources
'{"corral_namespace": 1000}'`; only the name counts, not the number). When no node of the
cluster advertises any, each node's actor finds out what its host offers (every tier whose
default policy would run there). A job whose tier no live node offers gets an error line
at once, and so do the jobs left when the last node of their tier is lost: nothing waits
for a node that may never come. "auto" goes to any node.

Policy. The batch's policy (the dict of the keys that were set) and the job's overrides
travel with the job; the node checks both again, the job's within the batch's, and
whether its own corral can enforce the result: one that cannot refuses the job with the
usual error (its line has `error`, the node's id in `node`), never runs it weaker.

Nodes lost. A job whose node dies (its actor unreachable) goes back to the queue and runs
on another node, up to MAX_ATTEMPTS times; its line says which `attempt` ran it. A job
whose line reached the driver is never sent again, and the driver writes at most one line
per job id (scale/driver.py), so no finished job runs twice.
"""

from __future__ import annotations

import time
from collections import deque

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..errors import BackendUnavailable, CorralError, PolicyError
from .driver import QUEUED_PER_SLOT
from .jobs import job_policy
from .node import error_line

PREFIX = "corral_"
#: times a job is sent to a node before it is reported lost
MAX_ATTEMPTS = 3
#: how often the driver looks at the cluster's nodes (new ones, lost ones), seconds
REFRESH_S = 2.0
#: how long the driver waits for a node's actor to say which tiers its host offers
DETECT_TIMEOUT_S = 120.0
#: jobs one call to a node's actor carries at most (one Ray call a job costs the driver
#: ~2 ms of CPU); fewer as the queue runs short, so the last jobs still spread out
CHUNK_MAX = 8


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class NodeActor:
    """The sandboxes of one node (its jobs run in the actor's threads)."""

    def __init__(self, node_id: str, slots: int) -> None:
        import threading

        from . import slotcg
        from .node import NodeRunner

        slotcg.sweep()
        # its sandboxes weigh as `slots` processes with the scheduler (slotcg.py)
        self.moved = slotcg.enter(slots)
        self.runner = NodeRunner(node_id, slots)
        # the driver keeps a next job queued for each slot (QUEUED_PER_SLOT): at most
        # `slots` of them run at once, the others wait here, in the actor, not on the driver
        self.slots = threading.BoundedSemaphore(slots)

    def tiers(self) -> list[str]:
        from .node import host_tiers

        return host_tiers()

    def run(self, wire: dict, base: dict, attempt: int) -> dict:
        with self.slots:
            return self.runner.run(wire, base, attempt)

    def run_many(self, tasks: list, base: dict) -> list[dict]:
        """[(wire, attempt), ...] one after another in one slot: their lines, together."""
        with self.slots:
            return [self.runner.run(wire, base, attempt) for wire, attempt in tasks]

    def close(self) -> None:
        from ..backends.host.cgroups import POOL
        from . import slotcg

        self.runner.close()
        POOL.drain()
        slotcg.leave(self.moved)
        self.moved = None


class _Node:
    def __init__(self, node_id: str, actor, tiers: set[str] | None, slots: int) -> None:
        self.id, self.actor, self.tiers, self.slots = node_id, actor, tiers, slots
        self.busy = 0
        self.alive = True


def run_on_ray(jobs, base: dict, address: str, concurrency: int | None):
    """Yield each job's output line as it finishes (see the module's docstring)."""
    mine = not ray.is_initialized()
    if mine:
        _check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except Exception as e:  # noqa: BLE001 - ray raises several kinds here
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise BackendUnavailable(f"cannot join the Ray cluster at {address!r}: {first}; "
                                     f"start one with ray start --head (docs/scale.md)",
                                     field="--ray") from None
    d = _Dispatch(jobs, base, concurrency)
    try:
        yield from d.run()
    finally:
        d.close()
        if mine:
            ray.shutdown()


def _check_reachable(address: str) -> None:
    """A HOST:PORT address whose port does not answer is refused at once: ray.init would
    retry for minutes."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return       # "auto", ray://...: ray.init says itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except (OSError, ValueError) as e:
        raise BackendUnavailable(f"cannot reach the Ray cluster at {address!r}: "
                                 f"{getattr(e, 'strerror', None) or e}; start one with "
                                 f"ray start --head (docs/scale.md)", field="--ray") from None


class _Dispatch:
    def __init__(self, jobs, base: dict, concurrency: int | None) -> None:
        from ..policy import policy_from_dict

        self.base = base
        self.concurrency = concurrency
        default_tier = policy_from_dict(base).isolation
        self.queue: deque = deque()
        for job in jobs:
            try:
                tier = job_policy(base, job).isolation
            except PolicyError:
                tier = default_tier    # the node refuses it, and says why
            self.queue.append((job, tier, 1))
        self.nodes: dict[str, _Node] = {}
        self.inflight: dict = {}       # ObjectRef -> ([(job, tier, attempt)], node)
        self.advertised = False
        self.last_refresh = 0.0

    # -- nodes --
    def refresh(self) -> None:
        self.last_refresh = time.monotonic()
        alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
        for nid, node in list(self.nodes.items()):
            if nid not in alive:
                self.lost(node)
        offered = {nid: {k[len(PREFIX):] for k, v in n.get("Resources", {}).items()
                         if k.startswith(PREFIX) and v > 0} for nid, n in alive.items()}
        self.advertised = any(offered.values())
        new = []
        for nid, n in alive.items():
            if nid in self.nodes or (self.advertised and not offered[nid]):
                continue
            slots = self.concurrency or max(1, int(n.get("Resources", {}).get("CPU", 1)))
            actor = NodeActor.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False),
                max_concurrency=slots * QUEUED_PER_SLOT + 1, name=None).remote(nid, slots)
            tiers = offered[nid] if self.advertised else None
            self.nodes[nid] = _Node(nid, actor, tiers, slots)
            new.append(self.nodes[nid])
        if not self.advertised:
            self.detect([n for n in new if n.tiers is None])

    def detect(self, nodes) -> None:
        refs = {n.actor.tiers.remote(): n for n in nodes}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=DETECT_TIMEOUT_S)
        for ref, n in refs.items():
            try:
                n.tiers = set(ray.get(ref)) if ref in ready else set()
            except ray.exceptions.RayError:
                n.tiers = set()
                n.alive = False

    def lost(self, node: _Node) -> None:
        if node.alive:
            node.alive = False
            try:
                ray.kill(node.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone with its node
                pass

    def eligible(self, tier: str) -> list[_Node]:
        return [n for n in self.nodes.values() if n.alive and n.tiers
                and (tier == "auto" or tier in n.tiers)]

    # -- the loop --
    def run(self):
        self.refresh()
        while self.queue or self.inflight:
            yield from self.dispatch()
            if not self.inflight:
                continue
            ready, rest = ray.wait(list(self.inflight), num_returns=1, timeout=1.0)
            if ready and rest:   # every line that is in, then one dispatch for them all
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
            for ref in ready:
                chunk, node = self.inflight.pop(ref)
                node.busy -= 1
                try:
                    lines = ray.get(ref)
                except ray.exceptions.RayActorError:
                    self.lost(node)       # its node died, or its actor with it
                    for job, tier, attempt in reversed(chunk):
                        if attempt >= MAX_ATTEMPTS:
                            yield error_line(job.id, node.id, attempt, CorralError(
                                f"the job's node was lost {attempt} times; not run",
                                field="node"))
                        else:
                            self.queue.appendleft((job, tier, attempt + 1))
                    continue
                except ray.exceptions.RayError as e:
                    for job, _, attempt in chunk:
                        yield error_line(job.id, node.id, attempt, CorralError(
                            f"the node failed to run the job: {type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''}", field="node"))
                    continue
                yield from lines if isinstance(lines, list) else [lines]
            if time.monotonic() - self.last_refresh > REFRESH_S:
                self.refresh()

    def dispatch(self):
        """Send queued jobs to free nodes of their tier; report those no node offers.
        Jobs passed over (their nodes are full) go back to the front in their order: the
        cost of a call is bounded by the jobs it looks at, not the queue's length."""
        waiting: list = []
        most = 4 * sum(n.slots for n in self.nodes.values())
        while self.queue:
            job, tier, attempt = self.queue.popleft()
            nodes = self.eligible(tier)
            if not nodes:
                yield error_line(job.id, None, attempt, BackendUnavailable(
                    f"no live node of the Ray cluster offers the {tier} tier (none "
                    f"advertises the resource {PREFIX}{tier}, nor has it); start one with "
                    f"ray start --resources '{{\"{PREFIX}{tier}\": 1000}}' (docs/scale.md)",
                    field="isolation"))
                continue
            free = [n for n in nodes if n.busy < n.slots * QUEUED_PER_SLOT]
            if not free:
                waiting.append((job, tier, attempt))
                if len(waiting) > most:
                    break     # the rest waits in order
                continue
            node = min(free, key=lambda n: n.busy / n.slots)
            chunk = [(job, tier, attempt)]
            size = self.chunk_size()
            while len(chunk) < size and self.queue and self.queue[0][1] == tier:
                chunk.append(self.queue.popleft())
            if len(chunk) == 1:
                ref = node.actor.run.remote(job.to_wire(), self.base, attempt)
            else:
                ref = node.actor.run_many.remote(
                    [(j.to_wire(), a) for j, _, a in chunk], self.base)
            node.busy += 1
            self.inflight[ref] = (chunk, node)
        self.queue.extendleft(reversed(waiting))

    def chunk_size(self) -> int:
        """Jobs for the next call: CHUNK_MAX while the queue is long, down to one as it
        runs short (every call the live nodes could take at once gets its share)."""
        calls = sum(n.slots for n in self.nodes.values() if n.alive) * QUEUED_PER_SLOT
        return max(1, min(CHUNK_MAX, len(self.queue) // max(1, calls)))

    def close(self) -> None:
        for n in self.nodes.values():
            if n.alive:
                try:
                    ray.get(n.actor.close.remote(), timeout=30)
                except Exception:  # noqa: BLE001 - a node gone: its sandboxes went with it
                    pass
                try:
                    ray.kill(n.actor, no_restart=True)
                except Exception:  # noqa: BLE001
                    pass


__all__ = ["MAX_ATTEMPTS", "NodeActor", "PREFIX", "run_on_ray"]
