"""A plugin's own facts in simulated runs (issue 55): summary_facts reads the events a simulated
run wrote, its protocol's fields included, whether event lines were written or not, on the
lockstep and the event path; and a line holds each key once when a protocol's fields set
`samples`, as a real run's step_event writes it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hetbench.api import Algorithm, Protocol, StepInfo, Steps, UserError
from hetbench.core.config import RunConfig
from hetbench.core.record import step_event, summarize
from hetbench.core.registry import ALGORITHMS
from hetbench.core.store import read_jsonl
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.run import facts_read_events, simulate

MODELS = SimModels(NetworkModel(alpha_s=1e-3, beta_bytes_per_s=1e8), ComputeModel())
WORKERS, ITERATIONS, BATCH = 4, 12, 32
#: Micro-batches of a batch: a step that drops d of them used BATCH - d * MICRO samples.
MICRO = BATCH // 4


def dropped(w: int, k: int) -> int:
    """Micro-batches worker w drops at iteration k (DropCompute's rule, made deterministic)."""
    return (w + k) % 3


class DropMicro(Algorithm):
    """A DropCompute-like plugin: each step drops some of its micro-batches, logs how many in
    its fields and the samples it used, then averages with every worker."""

    name = "test-drop-micro"
    description = "drops micro-batches; its facts count them from the event fields"
    #: Every events list summary_facts was given (the simulated run's call), for the tests.
    seen: list = []

    @classmethod
    def simulated_protocol(cls):
        return DropMicroSim

    @classmethod
    def summary_facts(cls, config, events, done):
        cls.seen.append(events)
        return {"micro_batches_dropped": sum(e.get("dropped_micro", 0) for e in events),
                "steps_logged": sum(1 for _ in events)}

    def step(self, ctx, model, optimizer):
        return StepInfo(peers=ctx.workers - 1, staleness=0.0)


class DropMicroSim(Protocol):
    """Every step waits for the last gradient, then one ring all-reduce; the fields say what
    the worker dropped and the samples it used."""

    lockstep = True

    def __init__(self, engine):
        super().__init__(engine)
        self.arrived = []

    def fields(self, w, k):
        d = dropped(w, k)
        return {"dropped_micro": d, "samples": BATCH - d * MICRO}

    def ready(self, w):
        self.arrived.append(w)
        if len(self.arrived) < self.n:
            return
        start = self.engine.now
        end = self.net.ring(range(self.n), self.model_bytes, start, self.engine.active)
        for x in self.arrived:
            k = self.engine.iteration[x]
            self.engine.end_step(x, end, start - self.engine.t_sync[x],
                                 self.fields(x, k) if self.engine.full_events else None,
                                 peers=self.n - 1, staleness=0.0)
        self.arrived = []

    def step_all(self, k, t_sync, full):
        start = float(t_sync.max())
        end = self.net.ring(range(self.n), self.model_bytes, start, self.n)
        fields = [self.fields(w, k) for w in range(self.n)] if full else None
        return Steps(np.full(self.n, end), start - t_sync, self.n - 1, fields=fields)


class Overwrites(DropMicro):
    """A plugin whose protocol's fields name a key the harness writes (t_end)."""

    name = "test-overwrites"

    @classmethod
    def simulated_protocol(cls):
        return OverwritesSim


class OverwritesSim(DropMicroSim):
    def fields(self, w, k):
        return {"t_end": 0}


ALGORITHMS.add(DropMicro.name, DropMicro)
ALGORITHMS.add(Overwrites.name, Overwrites)


def config(algorithm=DropMicro.name, workers=WORKERS, **kw):
    return RunConfig(algorithm=algorithm, workload="mlp-digits", workers=workers,
                     iterations=ITERATIONS, pace_ms=20,
                     workload_options={"batch_size": BATCH}, **kw)


def lines(run_dir, workers=WORKERS):
    """Every event line, parsed with its keys in order, duplicates kept: (rank, pairs)."""
    for rank in range(workers):
        with (run_dir / f"events.rank{rank}.jsonl").open() as f:
            for line in f:
                yield rank, json.loads(line, object_pairs_hook=list)


EXPECTED_DROPPED = sum(dropped(w, k) for w in range(WORKERS) for k in range(ITERATIONS))
EXPECTED_SAMPLES = WORKERS * ITERATIONS * BATCH - EXPECTED_DROPPED * MICRO


@pytest.mark.parametrize("events", ["full", "workers"])
@pytest.mark.parametrize("lockstep", [True, False], ids=["lockstep", "event-path"])
def test_a_plugins_facts_from_its_fields_are_in_the_simulated_summary(tmp_path, events,
                                                                      lockstep):
    assert EXPECTED_DROPPED > 0
    summary = simulate(config(), MODELS, tmp_path, events=events, lockstep=lockstep).summary
    assert summary["micro_batches_dropped"] == EXPECTED_DROPPED
    assert summary["steps_logged"] == WORKERS * ITERATIONS
    # The samples the fields set are what the summary counts, lines written or not.
    assert summary["samples"] == EXPECTED_SAMPLES


def test_the_facts_read_the_events_a_real_summarize_reads_from_the_lines(tmp_path):
    DropMicro.seen.clear()
    c = config()
    result = simulate(c, MODELS, tmp_path, events="full")
    given = [dict(e) for e in DropMicro.seen[-1]]
    from_files = [e for r in range(WORKERS)
                  for e in read_jsonl(result.run_dir / f"events.rank{r}.jsonl")[0]]
    for event in given + from_files:  # NaN is never equal to itself
        assert math.isnan(event.pop("loss"))
    assert given == from_files
    assert {e["rank"] for e in given} == set(range(WORKERS))
    # Every fact, and the samples and throughput, as the harness's summarize of the files.
    real = summarize(c, result.run_dir)
    for key in ("micro_batches_dropped", "steps_logged", "samples", "throughput"):
        assert result.summary[key] == real[key], key


def test_no_event_line_holds_a_key_twice_when_fields_set_samples(tmp_path):
    run_dir = simulate(config(), MODELS, tmp_path, events="full").run_dir
    seen = 0
    for rank, pairs in lines(run_dir):
        keys = [key for key, _ in pairs]
        assert len(keys) == len(set(keys)), keys
        event = dict(pairs)
        assert event["samples"] == BATCH - dropped(rank, event["iteration"]) * MICRO
        seen += 1
    assert seen == WORKERS * ITERATIONS


def test_a_real_runs_line_and_a_simulated_ones_agree_on_a_samples_field(tmp_path):
    run_dir = simulate(config(), MODELS, tmp_path, events="full").run_dir
    _, pairs = next(lines(run_dir))
    sim = dict(pairs)
    real = step_event(sim["run_id"], 0, 0, sim["t_start"], sim["t_end"], sim["compute_s"],
                      sim["slowdown_s"], sim["comm_s"], sim["wait_s"], BATCH,
                      peers=sim["peers"], staleness=sim["staleness"],
                      fields={"dropped_micro": dropped(0, 0), "samples": sim["samples"]})
    # The same keys in the same order; the harness's samples replaced, not repeated.
    assert list(real) == [key for key, _ in pairs]
    assert real["samples"] == sim["samples"] == BATCH - dropped(0, 0) * MICRO


def test_a_dropped_gradients_samples_field_is_what_was_discarded():
    event = step_event("r", 0, 0, 0, 1, 0.0, 0.0, 0.0, 0.0, BATCH, discarded=True,
                       fields={"samples": 24})
    assert event["samples"] == 0 and event["samples_discarded"] == 24


@pytest.mark.parametrize("fields", [{"t_end": 0}, {"rank": 3, "x": 1}, {"samples": -1},
                                    {"samples": 2.5}, {"samples": True}])
def test_a_real_steps_fields_may_not_overwrite_what_the_harness_wrote(fields):
    with pytest.raises(ValueError, match="event field"):
        step_event("r", 0, 0, 0, 1, 0.0, 0.0, 0.0, 0.0, BATCH, fields=fields)


@pytest.mark.parametrize("events", ["full", "workers"])
def test_a_protocols_field_naming_a_harness_key_is_refused_naming_the_protocol(tmp_path,
                                                                                events):
    with pytest.raises(UserError) as refused:
        simulate(config(Overwrites.name), MODELS, tmp_path, events=events)
    message = str(refused.value)
    assert "OverwritesSim" in message and "t_end" in message and "\n" not in message


def test_an_encoded_tail_naming_samples_is_written_once(tmp_path):
    """Protocols may pass fields already encoded (prague-smart does): a tail that sets samples
    is decoded and written through step_event, once."""

    class Encoded(DropMicroSim):
        def fields(self, w, k):
            return f',"dropped_micro":{dropped(w, k)},"samples":{BATCH - dropped(w, k) * MICRO}'

    class EncodedPlugin(DropMicro):
        name = "test-drop-micro-encoded"

        @classmethod
        def simulated_protocol(cls):
            return Encoded

    ALGORITHMS.add(EncodedPlugin.name, EncodedPlugin)
    result = simulate(config(EncodedPlugin.name), MODELS, tmp_path, events="full")
    for _, pairs in lines(result.run_dir):
        keys = [key for key, _ in pairs]
        assert len(keys) == len(set(keys)), keys
    assert result.summary["micro_batches_dropped"] == EXPECTED_DROPPED
    assert result.summary["samples"] == EXPECTED_SAMPLES


def test_only_algorithms_whose_facts_read_events_keep_them():
    assert facts_read_events(config())
    assert facts_read_events(config("diloco", algorithm_options={"inner_steps": 4}))
    assert facts_read_events(config("sgp"))
    # allreduce's facts read its done records only (and none without compression);
    # allreduce-backup's its aggregator's; ps-sync has none of its own.
    assert not facts_read_events(config("allreduce"))
    assert not facts_read_events(config("allreduce-backup"))
    assert not facts_read_events(config("ps-sync"))


def test_diloco_and_sgp_facts_are_the_same_with_lines_written_or_not(tmp_path):
    for name, options in (("diloco", {"inner_steps": 4}), ("sgp", {})):
        c = config(name, algorithm_options=options, slowdown="prob:5")
        full = simulate(c, MODELS, tmp_path / name / "full", events="full")
        lean = simulate(c, MODELS, tmp_path / name / "lean", events="workers")
        facts = c.algorithm_class().summary_facts(c.algorithm_config(), [], [None])
        assert facts
        for key in facts:
            assert full.summary[key] == lean.summary[key], (name, key)
        if name == "diloco":  # its protocol's count (stats): its steps log no outer_step
            assert full.summary["outer_steps"] == ITERATIONS // 4


def test_logged_peer_ranks_leaves_out_a_list_of_every_other_worker():
    from hetbench.core.record import logged_peer_ranks

    assert logged_peer_ranks(None, 0, 4) is None
    assert logged_peer_ranks([0], 0, 4) is None  # met only itself
    assert logged_peer_ranks([1, 2, 3], 0, 4) is None  # every other worker
    assert logged_peer_ranks([3, 1, 1, 0, 2], 0, 4) is None
    assert logged_peer_ranks([3, 1], 0, 4) == [1, 3]
    # A server rank (past the workers) is named; it does not stand in for a worker.
    assert logged_peer_ranks([1, 2, 4], 0, 4) == [1, 2, 4]
    assert logged_peer_ranks([0, 1, 2, 3], 4, 4) is None  # the server met every worker
    assert logged_peer_ranks([0, 1, 2], 4, 4) == [0, 1, 2]
