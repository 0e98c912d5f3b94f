"""bench sim --learn (sim/learn.py): the simulated workers train real models, and the same events
give the same math as real runs."""

import json

import numpy as np
import pytest
import torch

from hetbench.core.config import RunConfig
from hetbench.errors import UserError
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.recorded import learn_along, recorded_order
from hetbench.sim.run import simulate
from tests.helpers import final_models, run_config

MODELS = SimModels(NetworkModel(alpha_s=20e-6, beta_bytes_per_s=1.25e9), ComputeModel())


@pytest.mark.parametrize("algorithm, options", [
    ("allreduce", {}), ("local-sgd", {"period": 3}), ("ps-sync", {}),
    ("prague-static", {"workers_per_node": 2}), ("dpsgd", {}),
    ("dpsgd", {"topology": "one-peer-exponential"}), ("sgp", {}),
    ("diloco", {"inner_steps": 4})])
def test_a_learned_simulation_ends_with_the_real_runs_models(tmp_path, algorithm, options):
    """The lockstep protocols' order of events is fixed by their iterations: the simulation
    applies the same steps to the same minibatches (momentum on) as 4 real ranks did."""
    fields = dict(algorithm=algorithm, workload="mlp-digits", workers=4, iterations=30,
                  warmup_iterations=2, pace_ms=5, seed=2, save_models=True,
                  algorithm_options=options, workload_options={"momentum": 0.9})
    real = run_config(tmp_path / "real", **fields)
    assert real["status"] == "ok", real["cause"]
    simulated = simulate(RunConfig(learn=True, **fields), MODELS, tmp_path / "sim")
    assert simulated.summary["learned"] is True
    for a, b in zip(final_models(tmp_path / "real", 4), final_models(simulated.run_dir, 4),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("algorithm, options", [("allreduce", {}), ("dpsgd", {})])
def test_the_clusters_workload_learned_ends_with_the_real_runs_models(tmp_path, algorithm,
                                                                     options):
    """mlp-clusters (issue 46's nonlinear workload), as the digits above: 4 real ranks and the
    learned simulation of the same lockstep run end with the same models."""
    fields = dict(algorithm=algorithm, workload="mlp-clusters", workers=4, iterations=25,
                  warmup_iterations=2, pace_ms=5, seed=3, save_models=True,
                  algorithm_options=options,
                  workload_options={"momentum": 0.9, "samples": 4096, "test_samples": 512,
                                    "batch_size": 16})
    real = run_config(tmp_path / "real", **fields)
    assert real["status"] == "ok", real["cause"]
    assert real["synthetic"] is True
    simulated = simulate(RunConfig(learn=True, **fields), MODELS, tmp_path / "sim")
    for a, b in zip(final_models(tmp_path / "real", 4), final_models(simulated.run_dir, 4),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert simulated.summary["final_test_accuracy"] == pytest.approx(
        real["final_test_accuracy"], abs=1e-3)


def test_learned_all_reduce_is_single_process_sgd_on_the_union_of_the_minibatches(tmp_path):
    config = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=8, iterations=25,
                       warmup_iterations=2, pace_ms=5, seed=4, save_models=True, learn=True)
    simulated = simulate(config, MODELS, tmp_path)
    workload = config.workload_class()(config.workload_config(), config.seed)
    torch.manual_seed(config.seed)
    model = workload.build_model()
    optimizer = workload.make_optimizer(model)
    streams = [workload.train_batches(w, 8) for w in range(8)]
    for _ in range(25):
        batches = [next(stream) for stream in streams]
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        optimizer.zero_grad()
        workload.loss(model, (x, y)).backward()
        optimizer.step()
    reference = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    for learned in final_models(simulated.run_dir, 8):
        np.testing.assert_allclose(learned, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_report_labels_learned_simulations(tmp_path, bench):
    out = tmp_path / "sim"
    ran = bench("sim", "--learn", "--algorithms", "allreduce,dpsgd", "--workloads", "mlp-digits",
                "--workers", "2,4,8", "--iterations", "40", "--pace-ms", "5", "--out", out)
    assert ran.returncode == 0, ran.stderr
    assert bench("report", out).returncode == 0
    md = (out / "report.md").read_text()
    assert "6 of them simulated (learned)" in md
    # Three world sizes: time to target against them, in both report files.
    assert "![scaling-mlp-digits](scaling-mlp-digits.png)" in md
    assert 'alt="scaling-mlp-digits"' in (out / "report.html").read_text()
    # It trained on the real digits, and the report says so (not "none (simulated)").
    assert "Data: mlp-digits: scikit-learn digits" in md and "(learned in the simulator)" in md
    assert "none (simulated)" not in md
    assert "## Time to target" in md and "not reached" not in md.split("## Time to target")[1][:50]


def test_learned_runs_are_evaluated_like_real_ones(tmp_path):
    config = RunConfig(algorithm="dpsgd", workload="svm", workers=16, iterations=60,
                       warmup_iterations=2, pace_ms=10, seed=1, learn=True,
                       eval_interval_s=0.1, target="accuracy:0.6")
    result = simulate(config, MODELS, tmp_path)
    summary = result.summary
    assert summary["final_test_accuracy"] > 0.6
    assert summary["final_consensus_distance"] > 0  # gossip leaves the models apart
    assert summary["mean_consensus_distance"] > 0
    # The target timed to the iteration: no later than the first evaluation that met it.
    records = [json.loads(line) for line in (result.run_dir / "eval.jsonl").open()]
    (target,) = [r for r in records if r["kind"] == "target"]
    assert target["exact"] and target["test_accuracy"] >= 0.6
    first_met = next(r for r in records if r["kind"] == "snapshot"
                     and r["test_accuracy"] >= 0.6)
    assert 0 < target["wall_s"] <= first_met["wall_s"]


@pytest.mark.parametrize("flags, message", [
    (["--algorithms", "allreduce", "--workloads", "transformer"],
     "trains mlp-digits, mlp-clusters, svm"),
    (["--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers", "100"],
     "shard has"),
])
def test_what_cannot_learn_is_refused_in_one_line(tmp_path, bench, flags, message):
    args = ["--workloads", "mlp-digits", *flags] if "--workloads" not in flags else flags
    result = bench("sim", "--learn", "--workers", "4", "--iterations", "10", "--pace-ms", "5",
                   *args, "--out", tmp_path / "out")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_against_without_learnable_real_runs_is_one_line(tmp_path, bench):
    (tmp_path / "real").mkdir()
    result = bench("sim", "--against", tmp_path / "real", "--learn", "--out", tmp_path / "out")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (f"error: --against {tmp_path / 'real'}: no finished real "
                                     "runs there that the learning simulator trains")


def test_bench_run_refuses_a_learning_matrix(tmp_path, bench):
    matrix = tmp_path / "m.toml"
    matrix.write_text('algorithms = ["allreduce"]\nworkloads = ["mlp-digits"]\nworkers = [2]\n'
                      "iterations = 10\nlearn = true\n")
    result = bench("run", matrix, "--out", tmp_path / "out")
    assert result.returncode == 2 and "learn = true" in result.stderr


def _flat(model) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def test_learned_ps_async_applies_each_gradient_of_the_model_its_worker_held(tmp_path):
    """3 workers of equal compute stay in phase: each round the server takes their gradients
    in rank order, each computed on the model its worker received at the end of its previous
    step (the server's, just after that worker's update), with the server's momentum."""
    config = RunConfig(algorithm="ps-async", workload="mlp-digits", workers=3, iterations=12,
                       pace_ms=5, seed=3, save_models=True, learn=True,
                       workload_options={"momentum": 0.9})
    simulated = simulate(config, MODELS, tmp_path)
    workload = config.workload_class()(config.workload_config(), config.seed)
    torch.manual_seed(config.seed)
    server = workload.build_model()
    optimizer = workload.make_optimizer(server)
    held = [_flat(server)] * 3
    streams = [workload.train_batches(w, 3) for w in range(3)]
    for _ in range(config.iterations):
        for w in range(3):
            worker = workload.build_model()
            torch.nn.utils.vector_to_parameters(torch.from_numpy(held[w]), worker.parameters())
            workload.loss(worker, next(streams[w])).backward()
            for p, q in zip(server.parameters(), worker.parameters(), strict=True):
                p.grad = q.grad
            optimizer.step()
            held[w] = _flat(server).copy()
    for w, learned in enumerate(final_models(simulated.run_dir, 3)):
        np.testing.assert_allclose(learned, held[w], rtol=1e-5, atol=1e-6)


def test_a_server_bound_ps_async_computes_its_queue_s_gradients_in_one_batch(tmp_path,
                                                                             monkeypatch):
    """The server takes a gradient 6 ms after another (its CPU time) while a worker computes
    for 1 ms: every worker waits in the server's queue. A gradient is taken when the server
    takes it, so by then the workers served since it was sent are computing too, and their
    gradients are one batch: about one batch per round of 16 requests. (Applied at its
    arrival, each gradient made a batch of the one or two workers that began since the
    previous: about one per request, 16 times as many batches; at 1,024 workers, 1,000.)"""
    from hetbench.sim.learn import Learner

    batches = []
    original = Learner._batch_gradients
    monkeypatch.setattr(Learner, "_batch_gradients",
                        lambda self, rows: batches.append(len(rows)) or original(self, rows))
    models = SimModels(NetworkModel(alpha_s=20e-6, beta_bytes_per_s=1.25e9, cpu_s=3e-3),
                       ComputeModel())
    config = RunConfig(algorithm="ps-async", workload="mlp-digits", workers=16, iterations=20,
                       pace_ms=1, seed=1, learn=True)
    simulate(config, models, tmp_path)
    requests = 16 * 20
    assert len(batches) < requests / 6, (len(batches), batches[:20])
    assert sum(batches) >= requests  # every gradient computed (padding aside)


def test_learned_allreduce_backup_without_backups_is_all_reduce(tmp_path):
    """b = 0: every update averages all n gradients of one model, as All-Reduce's does."""
    fields = dict(workload="mlp-digits", workers=4, iterations=15, pace_ms=5, seed=2,
                  save_models=True, learn=True, workload_options={"momentum": 0.9})
    backup = simulate(RunConfig(algorithm="allreduce-backup",
                                algorithm_options={"backup_workers": 0}, **fields),
                      MODELS, tmp_path / "b")
    allreduce = simulate(RunConfig(algorithm="allreduce", **fields), MODELS, tmp_path / "a")
    for a, b in zip(final_models(backup.run_dir, 4), final_models(allreduce.run_dir, 4),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ps-async", "allreduce-backup", "adpsgd"])
def test_asynchronous_learning_does_not_depend_on_how_gradients_are_batched(tmp_path,
                                                                           algorithm):
    """The same run with every gradient computed alone and with the workers in compute
    batched together gives the same bits (cnn-cifar10: convolutions, whose kernels for one
    or two models differ from a larger batch's, hence the padding), under prob:5, which
    shuffles the order of events."""
    from hetbench.sim import learn as learn_module
    from hetbench.sim.learn import Learner

    fields = dict(algorithm=algorithm, workload="cnn-cifar10", workers=6, iterations=8,
                  pace_ms=5, seed=5, save_models=True, learn=True, slowdown="prob:5",
                  workload_options={"dataset": "digits", "batch_size": 16})
    batched = simulate(RunConfig(**fields), MODELS, tmp_path / "batched")

    made = []

    class Alone(Learner):
        def __init__(self, *args):
            super().__init__(*args)
            self.batching = False
            made.append(self)

    learn_module.Learner = Alone  # simulate() imports it when a run learns
    try:
        alone = simulate(RunConfig(**fields), MODELS, tmp_path / "alone")
    finally:
        learn_module.Learner = Learner
    assert made, "the run without batching did not use it"
    for a, b in zip(final_models(batched.run_dir, 6), final_models(alone.run_dir, 6),
                    strict=True):
        assert np.array_equal(a, b)
    if algorithm != "allreduce-backup":  # its workers all end with the aggregator's model
        first = final_models(batched.run_dir, 6)[0]
        assert any(not np.array_equal(first, other)
                   for other in final_models(batched.run_dir, 6))


def test_ps_async_learns_from_stale_gradients_and_reaches_its_target(tmp_path):
    """8 workers: every gradient reaches the server up to 7 updates late (the summary's
    staleness), and the averaged model still meets the target, timed to a round of steps."""
    config = RunConfig(algorithm="ps-async", workload="mlp-digits", workers=8, iterations=120,
                       pace_ms=10, seed=1, learn=True, eval_interval_s=0.2,
                       target="accuracy:0.85")
    summary = simulate(config, MODELS, tmp_path).summary
    assert 5 < summary["mean_staleness"] <= 7
    assert summary["final_test_accuracy"] > 0.85
    records = [json.loads(line) for line in (tmp_path / config.run_id / "eval.jsonl").open()]
    (target,) = [r for r in records if r["kind"] == "target"]
    met = [r for r in records if r["kind"] == "snapshot" and r["test_accuracy"] >= 0.85]
    assert target["wall_s"] <= met[0]["wall_s"] + 0.2


def test_learned_osgp_without_delay_is_sgp_and_with_delay_mixes_late_messages(tmp_path):
    """OSGP mixes each message when it has arrived, event by event: with max_delay = 0 every
    message of iteration k arrives within step k, which is SGP's lockstep math (push-sum
    weights included); with max_delay = 1 under prob:5 some arrive a step late (staleness)
    and the models still learn, ending apart from SGP's."""
    fields = dict(workload="mlp-digits", workers=8, iterations=40, pace_ms=10, seed=2,
                  save_models=True, learn=True, slowdown="prob:5")
    sgp = simulate(RunConfig(algorithm="sgp", **fields), MODELS, tmp_path / "sgp")
    osgp0 = simulate(RunConfig(algorithm="osgp", algorithm_options={"max_delay": 0}, **fields),
                     MODELS, tmp_path / "osgp0")
    osgp1 = simulate(RunConfig(algorithm="osgp", **fields), MODELS, tmp_path / "osgp1")
    for a, b in zip(final_models(sgp.run_dir, 8), final_models(osgp0.run_dir, 8), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert osgp1.summary["mean_staleness"] > 0.1
    assert osgp1.summary["final_test_accuracy"] > sgp.summary["final_test_accuracy"] - 0.05
    late, lockstep = final_models(osgp1.run_dir, 8)[0], final_models(sgp.run_dir, 8)[0]
    assert np.abs(late - lockstep).max() > 1e-4


def test_learned_hop_without_its_options_is_dpsgd_and_with_them_learns(tmp_path):
    """Hop without backup workers, staleness or skipping mixes every neighbour's model of the
    same iteration: D-PSGD's math, played event by event against D-PSGD's lockstep. With its
    defaults under prob:5 (one backup worker, skipping), it mixes fewer and staler models and
    still learns."""
    fields = dict(workload="mlp-digits", workers=8, iterations=40, pace_ms=10, seed=2,
                  save_models=True, learn=True, slowdown="prob:5")
    plain = {"backup_workers": 0, "staleness": 0, "skip": False}
    dpsgd = simulate(RunConfig(algorithm="dpsgd", **fields), MODELS, tmp_path / "dpsgd")
    hop = simulate(RunConfig(algorithm="hop", algorithm_options=plain, **fields), MODELS,
                   tmp_path / "hop")
    for a, b in zip(final_models(dpsgd.run_dir, 8), final_models(hop.run_dir, 8), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    default = simulate(RunConfig(algorithm="hop", **fields), MODELS, tmp_path / "default")
    assert default.summary["sync_share"] > 0.5
    assert default.summary["final_test_accuracy"] > dpsgd.summary["final_test_accuracy"] - 0.1


def test_learned_prague_groups_of_every_worker_are_local_sgd_averaging_every_step(tmp_path):
    """Prague's generated groups, played event by event: each worker's optimizer step, then
    its group's mean. With groups of all 8 workers (and equal workers), every step averages
    everyone's model after their local steps: local SGD with period 1 (momentum kept by each
    worker in both)."""
    fields = dict(workload="mlp-digits", workers=8, iterations=20, pace_ms=10, seed=2,
                  save_models=True, learn=True, workload_options={"momentum": 0.9})
    local = simulate(RunConfig(algorithm="local-sgd", algorithm_options={"period": 1},
                               **fields), MODELS, tmp_path / "local")
    for algorithm in ("prague-smart", "prague-random"):
        groups = simulate(RunConfig(algorithm=algorithm, algorithm_options={"group_size": 8},
                                    **fields), MODELS, tmp_path / algorithm)
        assert groups.summary["mean_group_size"] == 8
        for a, b in zip(final_models(local.run_dir, 8), final_models(groups.run_dir, 8),
                        strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["dpsgd", "prague-static"])
def test_a_lockstep_protocol_learns_the_same_when_played_event_by_event(tmp_path, algorithm):
    """Shared cores make the engine play events one by one; a lockstep protocol's math is its
    iterations', so it is applied as each iteration completes: the same models, other times."""
    fields = dict(algorithm=algorithm, workload="mlp-digits", workers=8, iterations=20,
                  pace_ms=10, seed=2, save_models=True, learn=True, slowdown="prob:5",
                  target="accuracy:0.5", algorithm_options=(
                      {"workers_per_node": 4} if algorithm == "prague-static" else {}))
    shared = SimModels(NetworkModel(alpha_s=20e-6, beta_bytes_per_s=1.25e9, cpu_s=1e-4,
                                    cores=2), ComputeModel())
    lockstep = simulate(RunConfig(**fields), MODELS, tmp_path / "lockstep")
    events = simulate(RunConfig(**fields), shared, tmp_path / "events")
    for a, b in zip(final_models(lockstep.run_dir, 8), final_models(events.run_dir, 8),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    assert events.summary["train_wall_s"] != lockstep.summary["train_wall_s"]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm, options", [
    ("ps-async", {}), ("allreduce-backup", {"backup_workers": 1}),
    ("prague-smart", {"group_size": 2})])
def test_learning_along_a_real_runs_recorded_order_ends_with_its_models(tmp_path, bench,
                                                                       algorithm, options):
    """An asynchronous protocol whose record determines its order (sim/recorded.py) learns
    along it: the real run's final models (allreduce-backup's sums run in another order: to
    float rounding), where the simulation's own order of events ends elsewhere; `bench sim
    --against --learn` says so."""
    fields = dict(algorithm=algorithm, workload="mlp-digits", workers=4, iterations=30,
                  warmup_iterations=2, pace_ms=5, seed=2, save_models=True, slowdown="prob:5",
                  algorithm_options=options, workload_options={"momentum": 0.9})
    real = run_config(tmp_path / "real", **fields)
    assert real["status"] == "ok", real["cause"]
    followed = learn_along(tmp_path / "real", MODELS, tmp_path / "followed")
    own_order = simulate(RunConfig(learn=True, **fields), MODELS, tmp_path / "own")
    real_models = final_models(tmp_path / "real", 4)
    for a, b in zip(real_models, final_models(followed.run_dir, 4), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert any(np.abs(a - b).max() > 1e-3
               for a, b in zip(real_models, final_models(own_order.run_dir, 4), strict=True))
    if algorithm == "ps-async":  # the CLI's table, once
        said = bench("sim", "--against", tmp_path / "real", "--learn", "--out", tmp_path / "cli")
        assert said.returncode == 0, said.stderr
        row = next(line for line in said.stdout.splitlines() if line.startswith("| ps-async"))
        assert "| recorded |" in row and row.endswith("| 0.0e+00 |"), said.stdout


def test_a_protocol_whose_record_lacks_its_order_is_refused_in_one_line(tmp_path):
    config = RunConfig(algorithm="adpsgd", workload="mlp-digits", workers=4, iterations=8,
                       warmup_iterations=2, pace_ms=5, seed=2)
    with pytest.raises(UserError, match="does not determine its order of events"):
        recorded_order(tmp_path, config)


def test_one_meetings_average_is_the_general_paths_bits(tmp_path):
    """Event-by-event protocols average one group at a time on its members' rows only; the
    same bits as the path that averages every group of an iteration over all rows."""
    import random

    from hetbench.sim.learn import Learner

    config = RunConfig(algorithm="prague-smart", workload="mlp-digits", workers=16,
                       iterations=5, warmup_iterations=1, pace_ms=5, seed=3, learn=True)
    one, general = Learner(config, tmp_path / "a"), Learner(config, tmp_path / "b")
    for learner in (one, general):  # models apart, as after some local steps
        learner.sgd_step(learner.gradients())
    rng = random.Random(1)
    for _ in range(20):
        members = tuple(rng.sample(range(16), rng.randint(2, 5)))
        one.average_groups([members])
        general.average_groups([members, (members[0],)])  # a lone worker: nothing to average
        for name in one.params:
            assert torch.equal(one.params[name], general.params[name])
    assert not torch.equal(one.params[name][0], one.params[name][1])
