"""Bad input through the real CLI: one line naming the problem, exit code 2, no traceback."""

import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "fixtures" / "results"
BASE = ["run", "--workloads", "mlp-digits", "--workers", "2", "--iterations", "20"]


def cases(tmp_path):
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("algorithms = [allreduce\n")
    unknown_key = tmp_path / "unknown.toml"
    unknown_key.write_text('algorithms = ["allreduce"]\nworkloads = ["svm"]\nworkers = [2]\n'
                           "itterations = 5\n")
    wrong_type = tmp_path / "type.toml"
    wrong_type.write_text('algorithms = ["allreduce"]\nworkloads = ["svm"]\nworkers = ["two"]\n')
    bad_option = tmp_path / "option.toml"
    bad_option.write_text('algorithms = ["allreduce"]\nworkloads = ["svm"]\nworkers = [2]\n'
                          "[algorithm.allreduce]\nbucket_mb = -1\n")
    unknown_option = tmp_path / "unknown_option.toml"
    unknown_option.write_text('algorithms = ["allreduce"]\nworkloads = ["svm"]\nworkers = [2]\n'
                              "[workload.svm]\nbatchsize = 3\n")
    trace = tmp_path / "trace.csv"
    trace.write_text("0,0,not-a-number,2\n")
    # A path under a regular file can't be created, even by root (CI runs as root).
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    def matrix(name, body, algorithm="allreduce", workload="mlp-digits", workers=4):
        path = tmp_path / f"{name}.toml"
        path.write_text(f'algorithms = ["{algorithm}"]\nworkloads = ["{workload}"]\n'
                        f"workers = [{workers}]\niterations = 20\n{body}\n")
        return ["run", str(path)]

    return {
        "group size above workers": (matrix("g", "[algorithm.prague-smart]\ngroup_size = 8",
                                            "prague-smart"), "group_size"),
        "workers per node not dividing": (matrix(
            "n", "[algorithm.prague-static]\nworkers_per_node = 3", "prague-static"),
            "workers_per_node"),
        "backup workers >= in-degree": (matrix("b", "[algorithm.hop]\nbackup_workers = 2",
                                               "hop"), "backup_workers"),
        "negative staleness": (matrix("s", "[algorithm.hop]\nstaleness = -1", "hop"),
                               "staleness"),
        "unknown topology": (matrix("t", '[algorithm.dpsgd]\ntopology = "star"', "dpsgd"),
                             "topology must be one of"),
        "time-varying graph for hop": (matrix(
            "h", '[algorithm.hop]\ntopology = "one-peer-exponential"', "hop"), "time-varying"),
        "osgp negative delay": (matrix("m", "[algorithm.osgp]\nmax_delay = -1", "osgp"),
                                "max_delay must be in 0..100"),
        "sgp peers above log2 n": (matrix("q", "[algorithm.sgp]\npeers = 3", "sgp"),
                                   "peers must be in 1..2"),
        "powersgd without ddp": (matrix(
            "c", '[algorithm.allreduce]\ncompression = "powersgd"'), 'set impl = "ddp"'),
        "powersgd under emulated compute": (matrix(
            "e", '[algorithm.allreduce]\ncompression = "powersgd"\nimpl = "ddp"\n'
                 '[workload.mlp-digits]\ncompute = "emulated"'), "no backward pass"),
        "diloco inner_steps 0": (matrix("i", "[algorithm.diloco]\ninner_steps = 0", "diloco"),
                                 "inner_steps must be >= 1"),
        "backup workers = workers": (matrix(
            "k", "[algorithm.allreduce-backup]\nbackup_workers = 4", "allreduce-backup"),
            "backup_workers must be in 0..3"),
        "string for a boolean": (matrix("y", '[algorithm.hop]\nskip = "yes"', "hop"),
                                 "skip must be true or false"),
        "local-sgd period 0": (matrix("p", "[algorithm.local-sgd]\nperiod = 0", "local-sgd"),
                               "period must be >= 1"),
        "missing libsvm file": (matrix("l", '[workload.svm]\ndata_file = "/nope/train.svm"',
                                       workload="svm"), "does not exist"),
        "unknown fault": (matrix("f", 'fault = "explode"'), "expected crash@R:I"),
        "unknown device": (matrix("d", 'device = "tpu"'), "device must be"),
        "unknown launcher": (matrix("r", 'launcher = "pbs"'), "launcher must be one of"),
        "slurm nodes below one": (matrix("sl", 'launcher = "slurm"\n[slurm]\nnodes = 0'),
                                  "nodes must be >= 1"),
        "hosts with the local launcher": ([*BASE, "--algorithms", "allreduce", "--hosts",
                                           "h1:2,h2:2"], "add --launcher torchrun or mpi"),
        "unknown network preset": ([*BASE, "--algorithms", "allreduce", "--network", "moon"],
                                   "unknown preset 'moon'"),
        "dilation without a network": ([*BASE, "--algorithms", "allreduce", "--dilation", "4"],
                                       "give --network PRESET"),
        "network option of the wrong type": (matrix("nw", '[network]\nnic_gbps = "fast"'),
                                             "nic_gbps must be a number"),
        "slow NICs without a network": ([*BASE, "--algorithms", "allreduce", "--slowdown",
                                         "net:4@1"], "needs a network model"),
        "network model on DDP": (matrix("nd", '[algorithm.allreduce]\nimpl = "ddp"\n'
                                              '[network]\npreset = "hop"'), "cannot shape it"),
        "options for an algorithm not in the matrix": (
            matrix("o", "[algorithm.hop]\nstaleness = 1"), "names an algorithm not in"),
        "seeds not integers": ([*BASE, "--algorithms", "allreduce", "--seeds", "a,b"],
                               "--seeds"),
        "no algorithms": (["run", "--workloads", "svm", "--workers", "2"], "no algorithms"),
        "unknown algorithm": ([*BASE, "--algorithms", "nope"], "unknown algorithm 'nope'"),
        "negative seed": ([*BASE, "--algorithms", "allreduce", "--seeds=-1"],
                          "seed must be >= 0, got -1"),
        "unknown workload": (["run", "--algorithms", "allreduce", "--workloads", "mnist",
                              "--workers", "2"], "unknown workload 'mnist'"),
        "one worker": ([*BASE, "--algorithms", "allreduce", "--workers", "1"], "workers must"),
        "workers not a number": ([*BASE, "--algorithms", "allreduce", "--workers", "four"],
                                 "--workers"),
        "malformed toml": (["run", str(bad_toml)], "not valid TOML"),
        "missing matrix file": (["run", str(tmp_path / "none.toml")], "does not exist"),
        "unknown matrix key": (["run", str(unknown_key)], "unknown key(s) itterations"),
        "wrong type in matrix": (["run", str(wrong_type)], "workers must be int"),
        "bad option value": (["run", str(bad_option)], "bucket_mb must be > 0"),
        "unknown option": (["run", str(unknown_option)], "unknown option(s) batchsize"),
        "missing data dir": (["run", "--algorithms", "allreduce", "--workloads", "resnet18",
                              "--workers", "2"], "no CIFAR-10 at"),
        "unknown slowdown": ([*BASE, "--algorithms", "allreduce", "--slowdown", "slow:5"],
                             "unknown slowdown 'slow:5'"),
        "slowdown factor below 1": ([*BASE, "--algorithms", "allreduce", "--slowdown",
                                     "prob:0.5"], "factor must be >= 1"),
        "slowdown worker out of range": ([*BASE, "--algorithms", "allreduce", "--slowdown",
                                          "det:5@7"], "do not exist with 2 workers"),
        "slowdown probability out of range": ([*BASE, "--algorithms", "allreduce",
                                               "--slowdown", "prob:5@2"], "probability"),
        "missing trace file": ([*BASE, "--algorithms", "allreduce", "--slowdown",
                                f"trace:{tmp_path}/missing.csv"], "does not exist"),
        "malformed trace": ([*BASE, "--algorithms", "allreduce", "--slowdown",
                             f"trace:{trace}"], "expected worker,t_from,t_to,factor"),
        "iterations within warm-up": ([*BASE, "--algorithms", "allreduce", "--iterations",
                                       "3"], "must exceed warmup_iterations"),
        "negative pacing": ([*BASE, "--algorithms", "allreduce", "--pace-ms", "-1"],
                            "pace_ms must be >= 0"),
        "negative seconds": ([*BASE, "--algorithms", "allreduce", "--seconds", "-2"],
                             "seconds must be > 0"),
        "unwritable output": ([*BASE, "--algorithms", "allreduce", "--out",
                               str(a_file / "sub")], "not writable"),
        "report of missing dir": (["report", str(tmp_path / "nothing")], "does not exist"),
        "export of missing dir": (["export", "trace", str(tmp_path / "nothing")],
                                  "does not exist"),
        "export of unknown run": (["export", "tensorboard", str(RESULTS), "--out",
                                   str(tmp_path / "tb"), "--run", "nope"], "matches 0 runs"),
        "unknown flag": (["run", "--algorithm", "allreduce"], "No such option"),
        "empty sweep": (matrix("w", "[algorithm.hop]\nbackup_workers = []", "hop"),
                        "backup_workers is an empty list"),
        "a swept value that cannot run": (matrix("v", "[algorithm.hop]\nbackup_workers = [0, 2]",
                                                 "hop"), "backup_workers"),
        "tune without [tune]": (["tune", matrix("u", "")[1]], "needs a [tune] table"),
        "tune without a target": (["tune", matrix("x", "[tune]\ntrials = 2")[1]],
                                  "set target"),
        "tune with a bad dimension": (["tune", matrix(
            "z", 'target = "accuracy:0.5"\n[tune]\ntrials = 2\n[tune.workload]\n'
                 'lr = {min = 0, max = 1, scale = "log"}')[1]], "a log scale needs min > 0"),
        "tune drawing an impossible value": (["tune", matrix(
            "j", 'target = "accuracy:0.5"\n[tune]\ntrials = 3\n[tune.algorithm.hop]\n'
                 "backup_workers = [2]", "hop")[1]], "trial 0 of hop"),
    }


#: Cases `make test` runs; the rest (each a real CLI start, seconds apiece) run under CI.
QUICK = {"unknown algorithm", "one worker", "malformed toml", "missing data dir",
         "group size above workers", "unknown slowdown", "export of unknown run"}


#: The other cases, one after another in one fresh process through the CLI's own entry point
#: (hetbench.cli.main.main, what the `bench` script calls): each case's exit code and what it
#: wrote, as JSON. A process start (torch's import) per case cost CI about a minute.
BATCH_DRIVER = """
import contextlib, io, json, sys, traceback
from hetbench.cli.main import main
results = []
for args in json.loads(sys.argv[1]):
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
    results.append({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory, bench_cmd, cli_env):
    """Each selected case's `bench` result. The quick cases are real `bench` processes, two at
    a time (the machine has two cores); the others run in one process (BATCH_DRIVER). Each
    case is still its own test."""
    names = [item.callspec.params["name"] for item in request.session.items
             if getattr(item, "originalname", None) == "test_bad_input_gives_one_line_and_exit_2"]
    all_cases = cases(tmp_path_factory.mktemp("bad-input"))

    def run(name):
        args, _ = all_cases[name]
        return subprocess.run([*bench_cmd, *map(str, args)], capture_output=True, text=True,
                              env=cli_env, timeout=120, stdin=subprocess.DEVNULL)

    alone = [name for name in names if name in QUICK]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(alone, pool.map(run, alone), strict=True))
    batch = [name for name in names if name not in QUICK]
    if batch:
        argv = json.dumps([[str(a) for a in all_cases[name][0]] for name in batch])
        driver = subprocess.run([sys.executable, "-c", BATCH_DRIVER, argv], capture_output=True,
                                text=True, env=cli_env, timeout=600, stdin=subprocess.DEVNULL)
        assert driver.returncode == 0, driver.stderr
        for name, result in zip(batch, json.loads(driver.stdout.splitlines()[-1]), strict=True):
            results[name] = SimpleNamespace(**result)
    return results


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=() if name in QUICK else pytest.mark.slow)
    for name in sorted(cases(Path(tempfile.mkdtemp(prefix="hetbench-cases-"))))])
def test_bad_input_gives_one_line_and_exit_2(tmp_path, outcomes, name):
    _, expected = cases(tmp_path)[name]
    result = outcomes[name]
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_the_slurm_launcher_without_sbatch_is_one_line(tmp_path, bench_cmd, cli_env):
    """Where SLURM's clients are not on PATH (this machine may have them: the bed's cluster)."""
    matrix = tmp_path / "sl.toml"
    matrix.write_text('algorithms = ["allreduce"]\nworkloads = ["mlp-digits"]\nworkers = [2]\n'
                      'launcher = "slurm"\n')
    result = subprocess.run([*bench_cmd, "run", str(matrix), "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                            env={**cli_env, "PATH": str(Path(sys.executable).parent)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: launcher slurm: no sbatch here (not a SLURM login node); set [slurm] cluster = "
        "\"local\" to run the same jobs on this machine"]


def test_debug_shows_traceback(tmp_path, bench):
    result = bench("--debug", *BASE, "--algorithms", "nope", timeout=120)
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "UserError" in result.stderr
