"""The static Group Generator's schedule: pure integer code, computed alike by every worker.

The paper's schedule for 16 workers, 4 per node, repeats every 4 steps:
  step % 4 == 0: an inter-node group of local rank 0 of every node ({0, 4, 8, 12}); on each node
                 local ranks 2 and 3 pair up and local rank 1 stays alone;
  step % 4 == 1: each node's workers together;
  step % 4 == 2: an inter-node group of local rank 1 ({1, 5, 9, 13}); local ranks 3 and 0 pair
                 up, local rank 2 stays alone;
  step % 4 == 3: each node's workers together.
Generalised to p workers per node: the inter-node local rank a is 0, then 1 (mod p); the other
local ranks, taken cyclically from a + 1, pair up, and when their number is odd the first of
them (a + 1) stays alone. For p = 4 this is exactly the paper's table. Two intra-node steps
follow two inter-node steps, so after 4 steps every worker has information from every other.
"""

from __future__ import annotations

Group = tuple[int, ...]


def check_layout(workers: int, workers_per_node: int) -> None:
    """Raise ValueError unless `workers_per_node` divides `workers`."""
    if workers_per_node < 1 or workers % workers_per_node:
        raise ValueError(
            f"workers_per_node ({workers_per_node}) must divide the number of workers ({workers})"
        )


def static_groups(step: int, workers: int, workers_per_node: int) -> list[Group]:
    """The disjoint groups of `step`, covering every worker (singletons included)."""
    check_layout(workers, workers_per_node)
    p = workers_per_node
    nodes = workers // p
    if step % 2 == 1:
        return [tuple(range(n * p, (n + 1) * p)) for n in range(nodes)]
    a = (step // 2 % 2) % p  # inter-node local rank: 0 at step%4 == 0, 1 at step%4 == 2
    groups: list[Group] = [tuple(n * p + a for n in range(nodes))]
    rest = [(a + k) % p for k in range(1, p)]
    if len(rest) % 2:
        alone, rest = rest[0], rest[1:]
        groups += [(n * p + alone,) for n in range(nodes)]
    for i in range(0, len(rest), 2):
        x, y = sorted(rest[i:i + 2])
        groups += [(n * p + x, n * p + y) for n in range(nodes)]
    return sorted(groups)


def static_group(worker: int, step: int, workers: int, workers_per_node: int) -> Group:
    """The group `worker` belongs to at `step`."""
    for group in static_groups(step, workers, workers_per_node):
        if worker in group:
            return group
    raise ValueError(f"worker {worker} is not in 0..{workers - 1}")
