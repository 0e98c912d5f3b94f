"""Stochastic Gradient Push (Assran, Loizou, Ballas, Rabbat, ICML 2019), and its overlapped form.

Push-sum gossip over the time-varying directed exponential graph: worker i keeps a numerator
x_i and a push-sum weight w_i (both start at x_i^0 and 1), and trains the de-biased model
z_i = x_i / w_i. Iteration k (the paper's Algorithm 1):

1. the harness computes the gradient at z_i^k;
2. x_i^{k+1/2} = x_i^k - lr * d_i^k, d the optimizer's direction (plain SGD: the gradient);
3. worker i pushes (p x_i^{k+1/2}, p w_i^k) to each out-peer i + 2^e of the iteration
   (topologies.exponential_offsets, `peers` of them) and keeps the same share, p = 1/(peers+1);
4. x_i^{k+1} and w_i^{k+1} are its share plus the shares received from its in-peers;
5. z_i^{k+1} = x_i^{k+1} / w_i^{k+1}.

The mixing matrix is column stochastic, so sum_i x_i (less the gradient steps) and sum_i w_i = n
are conserved, and the de-biased models converge to the average. `sgp` waits for iteration k's
messages in iteration k. `osgp` (the paper's Overlap SGP, section 3) does not: a message joins
whenever it has arrived, and a worker waits only for one more than `max_delay` iterations old
(the paper's bounded delay tau). A late message then lands in a later iteration's mix, which is
why the weights stop being 1 and push-sum's de-biasing matters.

Messages are the shared numerator with the shared weight as one trailing element. Every message
is mixed in, the last ones in finish(), so no mass is lost and sum_i w_i = n after the run.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from hetbench.algorithms import topologies
from hetbench.algorithms.dpsgd import Exchange
from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import flat_params, set_flat_params
from hetbench.errors import UserError
from hetbench.sim.synchronous import NeighbourExchange

#: Point-to-point tags of SGP's messages: the base plus the iteration modulo the cycle, so
#: that outstanding messages between the same two workers (up to max_delay + 1) never share one.
TAG_BASE, TAG_CYCLE = 1000, 1000
MAX_DELAY = 100


@dataclass(frozen=True, kw_only=True)
class SGPOptions:
    peers: int = opt(1, "out-peers per iteration on the time-varying directed exponential graph "
                        "(1: the paper's 1-peer graph; at most ceil(log2 n))")


@dataclass(frozen=True, kw_only=True)
class OSGPOptions(SGPOptions):
    max_delay: int = opt(1, "iterations a message may be late before its receiver waits for it "
                            "(the paper's bounded delay tau; 0 makes osgp sgp)")


@dataclass
class _Incoming:
    """A posted receive: the in-peer's share of its iteration `k`."""

    k: int
    src: int
    buffer: torch.Tensor
    work: object
    arrived: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class SGP(Algorithm):
    name = "sgp"
    description = ("SGP: push-sum over the time-varying directed exponential graph, one peer "
                   "per iteration, waiting for each iteration's messages (Assran et al. 2019)")
    Config = SGPOptions
    wait_rule = "from"  # one in-peer per iteration, named by its senders

    @classmethod
    def simulated_protocol(cls):
        return SGPSim

    @classmethod
    def validate(cls, config, workers):
        try:
            topologies.exponential_offsets(workers, 0, config.peers)
        except ValueError as exc:
            raise UserError(f"{cls.name}: {exc}") from None

    fact_units = {"ps_weight_min": "push-sum weight", "ps_weight_max": "push-sum weight"}

    @classmethod
    def summary_facts(cls, config, events, done):
        weights = [e["ps_weight"] for e in events if "ps_weight" in e]
        return {"ps_weight_min": min(weights, default=None),
                "ps_weight_max": max(weights, default=None)}

    def setup(self, ctx, model, optimizer):
        self.exchange = Exchange(None, ctx.workers, self.config.peers)
        # sgp waits for every message in its own iteration: a delay of 0.
        self.max_delay = getattr(self.config, "max_delay", 0)
        #: The push-sum numerator and weight; the model holds x / w.
        self.x = flat_params(model).double()
        self.w = 1.0
        self.k = 0
        self._incoming: deque[_Incoming] = deque()
        self._sending: deque[tuple[int, object, torch.Tensor]] = deque()
        # Overlap: a thread waits for the posted receives in order and marks their arrival, so
        # the training loop mixes in what has come without blocking on what has not.
        self._arrivals: queue.Queue | None = None
        if self.max_delay > 0:
            self._arrivals = queue.Queue()
            self._waiter = threading.Thread(target=self._wait_in_order, daemon=True,
                                            name="osgp-arrivals")
            self._waiter.start()

    def _wait_in_order(self) -> None:
        while (incoming := self._arrivals.get()) is not None:
            try:
                incoming.work.wait()
            except BaseException as exc:  # a dead peer: re-raised by the training thread
                incoming.error = exc
            incoming.arrived.set()

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        comm, k = ctx.comm, self.k
        before = flat_params(model)
        optimizer.step()
        self.x += (flat_params(model) - before).double()  # x^{k+1/2} = x^k - lr d^k
        send_to, receive_from, weights = self.exchange.at(ctx.rank, k)
        share = weights[ctx.rank]
        message = torch.empty(self.x.numel() + 1, device=ctx.device)
        message[:-1] = self.x * share
        message[-1] = self.w * share
        # Keep exactly what was not sent (the message is rounded to the model's float32), so
        # that the sums of numerators and weights over all workers are conserved to float64.
        self.x -= message[:-1].double() * len(send_to)
        self.w -= float(message[-1]) * len(send_to)
        tag = TAG_BASE + k % TAG_CYCLE
        # Receives first, everything non-blocking: no cycle of blocking sends can form.
        for j in receive_from:
            buffer = torch.empty_like(message)
            incoming = _Incoming(k, j, buffer, comm.irecv(buffer, src=j, tag=tag))
            self._incoming.append(incoming)
            if self._arrivals is not None:
                self._arrivals.put(incoming)
        for j in send_to:
            self._sending.append((k, comm.isend(message, dst=j, tag=tag), message))
        wait_start = time.perf_counter()
        mixed = self._mix_in(due=k - self.max_delay)
        wait_s = time.perf_counter() - wait_start
        set_flat_params(model, self.x / self.w)
        self.k += 1
        staleness = sum(k - m.k for m in mixed) / len(mixed) if mixed else None
        fields = {"ps_weight": self.w, "to": list(send_to), "from": [m.src for m in mixed]}
        if self.max_delay > 0:
            # What the wait was for: the messages of iteration k - max_delay, sent by that
            # iteration's in-peers at their own step k - max_delay (who waited for whom);
            # none before iteration max_delay.
            due = k - self.max_delay
            fields.update(awaited=list(self.exchange.at(ctx.rank, due)[1]) if due >= 0 else [],
                          awaited_iteration=due)
        return StepInfo(wait_s=wait_s, peers=len(mixed), staleness=staleness, fields=fields)

    def _mix_in(self, due: int) -> list[_Incoming]:
        """Wait for every message (and own send) of iterations <= `due`, then add every
        message that has arrived, in the order they were posted; returns those added."""
        while self._sending and self._sending[0][0] <= due:
            self._sending.popleft()[1].wait()
        mixed = []
        while self._incoming:
            incoming = self._incoming[0]
            if incoming.k <= due:
                if self._arrivals is None:
                    incoming.work.wait()
                else:
                    incoming.arrived.wait()
            elif not incoming.arrived.is_set():
                break
            if incoming.error is not None:
                raise incoming.error
            self._incoming.popleft()
            self.x += incoming.buffer[:-1].double()
            self.w += float(incoming.buffer[-1])
            mixed.append(incoming)
        return mixed

    def finish(self, ctx, model):
        # Every worker ran the same iterations (synchronous budget), so every message still
        # in flight was sent: mix them all in, so that no mass is lost.
        late = self._mix_in(due=self.k)
        if self._arrivals is not None:
            self._arrivals.put(None)
            self._waiter.join()
        set_flat_params(model, self.x / self.w)
        return {"averagings_after_training": len(late), "ps_weight": self.w}


class OSGP(SGP):
    name = "osgp"
    description = ("Overlap SGP: push-sum as sgp, mixing in messages as they arrive, waiting "
                   "only for those over max_delay iterations late (Assran et al. 2019)")
    Config = OSGPOptions

    @classmethod
    def validate(cls, config, workers):
        super().validate(config, workers)
        if not 0 <= config.max_delay <= MAX_DELAY:
            raise UserError(f"osgp: max_delay must be in 0..{MAX_DELAY}, got {config.max_delay}")

    @classmethod
    def intended_sync_share(cls, config, workers):
        # Every message is mixed in, but a step may take none (they have not arrived) and a
        # later one several: the protocol guarantees one mixing step in max_delay + 1.
        return 1.0 / (config.max_delay + 1)

    @classmethod
    def simulated_protocol(cls):
        return OSGPSim


# -- simulated protocols (bench sim): the same rules in simulated time -----------------------

class SGPSim(NeighbourExchange):
    """Iteration k ends one message after the iteration's in-peers' messages arrived and its
    out-peers posted their receives: D-PSGD's exchange on the exponential graph's shifts."""

    def make_exchange(self):
        return Exchange(None, self.n, self.config.peers)

    def learn(self, k, learner):
        """The real step's math (SGP.step, max_delay 0), every worker at once: the local
        optimizer step added to the push-sum numerator x, a share of (x, w) sent to each
        out-peer as float32 (the message), what was not sent kept, the in-peers' messages of
        iteration k added in the order they were posted, and the model set to x / w."""
        import torch

        state = self.__dict__.get("_push_sum")
        if state is None:
            state = self._push_sum = (learner.flat().double(),
                                      torch.ones(self.n, dtype=torch.float64))
        x, w = state
        before = learner.flat()
        learner.sgd_step(learner.gradients())
        x += (learner.flat() - before).double()
        send_count, receive_from, share = self._push_links(k)
        message_x = (x * share.unsqueeze(1)).float()
        message_w = (w * share).float()
        x -= message_x.double() * send_count.unsqueeze(1)
        w -= message_w.double() * send_count
        for m in range(receive_from.shape[1]):
            x += message_x[receive_from[:, m]].double()
            w += message_w[receive_from[:, m]].double()
        learner.set_flat(x / w.unsqueeze(1))

    def _push_links(self, k: int):
        """(how many each worker sends to, its in-peers [workers, m] in posting order, its
        share weights[rank]) at iteration k, from the real step's Exchange; kept per phase of
        the graph."""
        import torch

        cache = self.__dict__.setdefault("_push_link_cache", {})
        phase = k % self.exchange.rounds
        if phase not in cache:
            rows = [self.exchange.at(r, k) for r in range(self.n)]
            cache[phase] = (
                torch.tensor([len(send_to) for send_to, _, _ in rows], dtype=torch.float64),
                torch.tensor([list(receive_from) for _, receive_from, _ in rows]),
                torch.tensor([weights[r] for r, (_, _, weights) in enumerate(rows)],
                             dtype=torch.float64))
        return cache[phase]


class OSGPSim(SGPSim):
    """Iteration k of worker x waits only for messages (and its own sends' receivers) of
    iterations <= k - max_delay, then mixes in, in posting order, every message that has
    arrived by the end of its step, as the real arrival thread marks them."""

    #: A step mixes in whatever has arrived by its end: that depends on other workers' later
    #: iterations, so OSGP is played event by event, and so is its learning.
    lockstep = False
    learn = None
    learns_events = True

    def __init__(self, engine):
        super().__init__(engine)
        # Its messages queue at the NICs once both ends are ready (ready() below), not when
        # the sender alone is (D-PSGD's queueing).
        self.sends_queue = False
        self.delay = self.config.max_delay
        #: Each worker's posted receives not yet mixed in: (iteration, in-peer), in order.
        self.incoming: list[deque[tuple[int, int]]] = [deque() for _ in range(self.n)]
        net = self.net
        self.flight = net.alpha_s + (self.model_bytes + 4) / net.beta_bytes_per_s
        #: On a run's Cluster, when each message (src, dst, iteration) arrives over its own
        #: links and NIC queues, fixed once both ends are ready (the sender's isend, the
        #: receiver's posted irecv): one copy to mix in (dropped when mixed), one for the two
        #: waits for it, the sender's and the receiver's (dropped after both). Without one:
        #: `flight` each.
        self.to_mix: dict[tuple[int, int, int], float] = {}
        self.to_wait: dict[tuple[int, int, int], list] = {}
        #: Under transport = "fair": per worker, its iterations' receives and sends not yet
        #: done (iteration -> count); whether it waits for them; the messages (src, dst,
        #: iteration) arrived and not yet mixed in.
        self._outstanding: list[dict[int, int]] = [{} for _ in range(self.n)]
        self._arrived: set[tuple[int, int, int]] = set()

    def ready(self, w):
        # w posts iteration k's receives, then D-PSGD's wake-ups: whoever waits for w's
        # message or for w's receive of iteration k is among its partners of k.
        k = len(self.ready_at[w])
        send_to, receive_from = self.exchange.links(w, k)
        if self.engine.learner is not None:
            self._learn_send(w, k, send_to)
        self.incoming[w].extend((k, j) for j in receive_from)
        if self.transport is not None:
            self.ready_at[w].append(self.engine.now)
            self._exchange_fair(w, k, send_to, receive_from)
            return
        if self.net.cluster is not None:
            # Messages of iteration k whose other end is ready already start now, in event
            # (time) order, so the NIC queues serve them first come, first served.
            now, ready_at = self.engine.now, self.ready_at
            for src, dst in [(w, j) for j in send_to] + [(j, w) for j in receive_from]:
                if len(ready_at[dst if src == w else src]) > k:
                    arrives = self.net.wire(src, dst, self.model_bytes + 4, now)
                    self.to_mix[(src, dst, k)] = arrives
                    self.to_wait[(src, dst, k)] = [arrives, 2]
        super().ready(w)

    def _exchange_fair(self, w: int, k: int, send_to, receive_from) -> None:
        """The real step under transport = "fair": iteration k's receives posted, an isend to
        each out-peer (moving once that peer posts its receive of k), then the wait for the
        receives and sends of iterations <= k - max_delay."""
        transport, now = self.transport, self.engine.now
        if send_to or receive_from:
            self._outstanding[w][k] = len(send_to) + len(receive_from)
        for j in receive_from:
            transport.post_receive(w, j, k)
        for j in send_to:
            transport.send(w, j, self.model_bytes + 4, now, (self._arrive, j, w, k),
                           sent=(self._one_done, w, k), key=k)
        self.waiting[w] = True
        self._try_fair(w)

    def _arrive(self, dst: int, src: int, k: int) -> None:
        self._arrived.add((src, dst, k))
        self._one_done(dst, k)

    def _one_done(self, x: int, k: int) -> None:
        outstanding = self._outstanding[x]
        outstanding[k] -= 1
        if not outstanding[k]:
            del outstanding[k]
            # Only an iteration done can let a waiting step go on (_try_fair's condition).
            if self.waiting[x]:
                self._try_fair(x)

    def _try_fair(self, x: int) -> None:
        """x's step goes on once its receives and sends of iterations <= k - max_delay are
        done; it ends after its sends' CPU time, mixing in what has arrived by then."""
        k = self.engine.iteration[x]
        due = k - self.delay
        for j in self._outstanding[x]:
            if j <= due:
                return
        self.waiting[x] = False
        net, now = self.net, self.engine.now
        end = now + self._partners(x, k)[2] * net.cpu_s * net.share(self.engine.active)
        self.engine.at(end, self._mix_fair, x, k, now - self.ready_at[x][k])

    def _mix_fair(self, x: int, k: int, wait: float) -> None:
        """x mixes in the messages arrived by now (SGP._mix_in) and its step ends."""
        arrived = self._arrived

        def take(src: int, k_in: int) -> bool:
            if (src, x, k_in) not in arrived:
                return False
            arrived.remove((src, x, k_in))
            return True

        self._end_mixing(x, k, self.engine.now, wait, take)

    def _end_mixing(self, x: int, k: int, end: float, wait: float, take) -> None:
        """x's step k ends at `end`, mixing in, in posting order, each message whose
        `take(src, k_in)` says it has arrived (the first that has not stops it), as the real
        step's _mix_in does; its model is then x / w."""
        incoming, mixed = self.incoming[x], []
        while incoming:
            k_in, src = incoming[0]
            if not take(src, k_in):
                break
            incoming.popleft()
            mixed.append(k - k_in)
            if self.engine.learner is not None:
                self._learn_mix(x, src, k_in)
        if self.engine.learner is not None:
            x_sum, w_sum = self._push_sum[x]
            self.engine.learner.set_row(x, x_sum / w_sum)
        self.engine.end_step(x, end, wait, peers=len(mixed),
                             staleness=sum(mixed) / len(mixed) if mixed else None)

    def _learn_send(self, w: int, k: int, send_to) -> None:
        """The real step's math up to its sends (SGP.step): the optimizer step on w's model,
        added to its push-sum numerator; a share of (x, w) as float32 to each out-peer, kept
        until the receiver mixes it in; what was not sent kept."""
        import torch

        learner = self.engine.learner
        state = self.__dict__.setdefault("_push_sum", {})
        if w not in state:
            state[w] = [learner.row(w).double(), 1.0]
        before = learner.row(w)
        learner.worker_step(w, learner.gradient(w))
        state[w][0] += (learner.row(w) - before).double()
        share = self.exchange.at(w, k)[2][w]
        message = (state[w][0] * share).float(), float(torch.tensor(state[w][1] * share,
                                                                     dtype=torch.float32))
        state[w][0] -= message[0].double() * len(send_to)
        state[w][1] -= message[1] * len(send_to)
        messages = self.__dict__.setdefault("_messages", {})
        for j in send_to:
            messages[(w, j, k)] = message

    def learn_finish(self, learner, iterations) -> None:
        """SGP.finish: every worker mixes in every message still in flight, then takes x / w."""
        for x in range(self.n):
            for k_in, src in self.incoming[x]:
                if (src, x, k_in) in self._messages:
                    self._learn_mix(x, src, k_in)
            x_sum, w_sum = self._push_sum[x]
            learner.set_row(x, x_sum / w_sum)

    def _learn_mix(self, x: int, src: int, k: int) -> None:
        """Worker x adds the message src sent it at iteration k (in posting order)."""
        message_x, message_w = self._messages.pop((src, x, k))
        self._push_sum[x][0] += message_x.double()
        self._push_sum[x][1] += message_w

    def _waited(self, key: tuple[int, int, int]) -> float:
        """When that message arrives, for one of its two waits."""
        entry = self.to_wait[key]
        entry[1] -= 1
        if not entry[1]:
            del self.to_wait[key]
        return entry[0]

    def _try(self, x):
        k = self.engine.iteration[x]
        due = k - self.delay
        ready_at, flight = self.ready_at, self.flight
        on_cluster = self.net.cluster is not None
        mine = ready_at[x][k]
        latest = mine
        if due >= 0:
            partners = self._partners(x, due)[1]
            for j in partners:
                if len(ready_at[j]) <= due:
                    return
            if on_cluster:  # its in-peers' messages of `due` and its own to its out-peers
                send_to, receive_from = self.exchange.links(x, due)
                waited = self._waited
                latest = max([mine, *(waited((j, x, due)) for j in receive_from),
                              *(waited((x, j, due)) for j in send_to)])
            else:
                latest = max(mine, max([ready_at[j][due] for j in partners]) + flight)
        self.waiting[x] = False
        net = self.net
        sends = self._partners(x, k)[2]
        end = latest + sends * net.cpu_s * net.share(self.engine.active)
        to_mix = self.to_mix

        def take(src: int, k_in: int) -> bool:
            if len(ready_at[src]) <= k_in:
                return False
            if not on_cluster:
                return ready_at[src][k_in] + flight <= end
            if to_mix[(src, x, k_in)] > end:
                return False
            del to_mix[(src, x, k_in)]
            return True

        self._end_mixing(x, k, end, latest - mine, take)
