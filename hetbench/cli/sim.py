"""`bench sim`: the matrix of `bench run`, played by the simulator instead of real workers.

Each click command here is in COMMANDS; hetbench.cli.main adds them to the `bench` group.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from hetbench.cli.flags import lock_results, matrix_flags, plugin_flag, wait_flag
from hetbench.core.rundir import RunDir
from hetbench.errors import UserError


@click.command("sim")
@matrix_flags
@click.option("--out", type=click.Path(path_type=Path),
              help="Results directory (default results/sim/<matrix name>).")
@click.option("--alpha-us", type=float,
              help="Network latency per message (microseconds); default 20, or fitted from "
                   "the allreduce runs under --fit-from.")
@click.option("--beta-gbps", type=float, default=10.0, show_default=True,
              help="Network bandwidth per link (Gbit/s).")
@click.option("--group-setup-ms", type=float,
              help="Cost of building a P-Reduce member communicator on a cache miss (ms); "
                   "default 0, or fitted from the prague-smart/random runs under --fit-from. "
                   "A run with a [network] uses its group_setup_ms instead.")
@click.option("--cpu-us", type=float,
              help="CPU time a process spends per message (microseconds); default 0, or "
                   "fitted with alpha from the allreduce runs under --fit-from.")
@click.option("--cores", type=int,
              help="Cores that all simulated processes share (CPU sharing); default: a core "
                   "per process, or the cpu_count of the real runs under --fit-from/--against.")
@click.option("--gg-request-us", type=float,
              help="Time Prague's Group Generator spends per request (microseconds; it serves "
                   "one at a time); default 0, or fitted from the prague-smart/random runs "
                   "under --fit-from.")
@click.option("--compute-ms", type=float,
              help="Compute time per iteration (ms); default: pace_ms, or compute_ms of an "
                   "emulated-compute workload.")
@click.option("--learn", is_flag=True,
              help="The simulated workers train real models on the workload's real data "
                   "(sim/learn.py): evaluations, time to target and consensus as real runs "
                   "have them (as `learn = true` in a matrix file).")
@click.option("--fit-from", type=click.Path(path_type=Path),
              help="Fit compute time per workload (and pace) from the real runs in this "
                   "results directory, and alpha from its allreduce runs.")
@click.option("--against", type=click.Path(path_type=Path),
              help="Simulate every finished real run in this results directory (their own "
                   "configs; the matrix is not used) and print simulated vs measured.")
@click.option("--events", "events", type=click.Choice(["auto", "full", "workers"]),
              default="auto", show_default=True,
              help="What each run records: full (an event line per worker-iteration, as a "
                   "real run; timelines and wait attribution need them), workers (one record "
                   "per worker in workers.json), or auto (full up to 64 workers).")
@click.option("--force", is_flag=True, help="Simulate again runs already simulated with the same "
              "config, costs and code (those are skipped otherwise).")
@click.option("--dry-run", is_flag=True, help="List the runs the matrix expands to, run nothing.")
@wait_flag
@plugin_flag
def sim_cmd(matrix_file, algorithms, workloads, workers, slowdown, iterations, seconds, seeds,
            pace_ms, target, network, dilation, out, compute_ms, learn, fit_from, against,
            events, force, dry_run, wait, **model_flags) -> None:
    """Simulate a matrix (discrete events) and write results that `bench report` reads."""
    # model_flags: alpha_us, beta_gbps, group_setup_ms, cpu_us, cores, gg_request_us
    # (see _models).
    from hetbench.harness.matrix import check_writable, from_file_and_flags

    if compute_ms is not None and fit_from is not None:
        raise UserError("give either --compute-ms or --fit-from, not both")

    if against is not None:
        if matrix_file is not None or network is not None or dilation is not None:
            raise UserError("--against replays the real runs' own configs (their networks "
                            "too); drop the matrix file, --network and --dilation")
        models = _models(compute_ms=compute_ms, fit_from=fit_from, **model_flags)
        _against(against, models, out or Path("results") / "sim" / "against",
                 own_cores=model_flags["cores"] is None, wait=wait, learn=learn)
        return
    spec, configs = from_file_and_flags(
        matrix_file, algorithms=algorithms, workloads=workloads, workers=workers,
        slowdown=slowdown, iterations=iterations, seconds=seconds, seeds=seeds, pace_ms=pace_ms,
        network=network, dilation=dilation, target=target, learn=learn)
    out_dir = out or Path("results") / "sim" / str(spec["name"])
    if dry_run:
        from hetbench.cli.running import variant_names_of

        names = variant_names_of(configs)
        for config in configs:
            click.echo(f"{config.run_id}  {config.label(names[config.run_id])}")
        return
    models = _models(compute_ms=compute_ms, fit_from=fit_from, **model_flags)
    from hetbench.sim.engine import simulated_protocol

    shards_checked = set()
    for config in configs:  # what cannot be simulated fails before anything runs
        models.compute.seconds(config.timing_config)
        protocol = simulated_protocol(config)
        if config.learn:
            from hetbench.sim.learn import check_learnable, check_shards

            check_learnable(config, protocol)
            key = (config.workload, repr(sorted(config.workload_options.items())),
                   config.workers, config.seed)
            if key not in shards_checked:
                shards_checked.add(key)
                check_shards(config)
    check_writable(out_dir)
    with lock_results(out_dir, "bench sim", wait):
        if (fit_from is None and any(not config.network for config in configs)
                and all(v is None for k, v in model_flags.items() if k != "beta_gbps")):
            # Before anything else it prints: a prediction from costs fitted to no machine.
            click.echo("note: default costs, fitted to no machine (alpha 20 us, "
                       f"{model_flags['beta_gbps']:g} Gbit/s, no CPU per message, a core per "
                       "process; a run's [network] table replaces them): `--fit-from RESULTS` fits "
                       "them to real runs of yours, `--against RESULTS` shows each cell's error",
                       err=True)
        from hetbench.core.store import write_json_atomic

        # The matrix as simulated (file + flags), so `bench report` finds its `target` later,
        # as it does for bench run's.
        write_json_atomic(out_dir / "matrix.json", spec)
        _simulate_all(configs, models, out_dir, events, force)


def _models(*, alpha_us, beta_gbps, group_setup_ms, cpu_us, cores, gg_request_us, compute_ms,
            fit_from):
    """The cost models the flags ask for (fitting from real runs where asked)."""
    from hetbench.sim.fit import fit_compute, fit_latency
    from hetbench.sim.model import ComputeModel, NetworkModel, SimModels

    if alpha_us is not None and alpha_us < 0:
        raise UserError(f"--alpha-us must be >= 0, got {alpha_us:g}")
    if beta_gbps <= 0:
        raise UserError(f"--beta-gbps must be > 0, got {beta_gbps:g}")
    if compute_ms is not None and compute_ms < 0:
        raise UserError(f"--compute-ms must be >= 0, got {compute_ms:g}")
    if group_setup_ms is not None and group_setup_ms < 0:
        raise UserError(f"--group-setup-ms must be >= 0, got {group_setup_ms:g}")
    if cpu_us is not None and cpu_us < 0:
        raise UserError(f"--cpu-us must be >= 0, got {cpu_us:g}")
    if cores is not None and cores < 1:
        raise UserError(f"--cores must be >= 1, got {cores}")
    if gg_request_us is not None and gg_request_us < 0:
        raise UserError(f"--gg-request-us must be >= 0, got {gg_request_us:g}")
    beta = beta_gbps * 1e9 / 8
    if fit_from is not None:
        compute = fit_compute(fit_from)
        fit = fit_latency(fit_from, beta)
        if fit is not None:
            if cores is None:
                cores = fit.cores
            if alpha_us is None and cpu_us is None:
                alpha_us, cpu_us = fit.alpha_s * 1e6, fit.cpu_s * 1e6
                click.echo(f"fitted from the {fit.runs} allreduce run(s) without slowdown in "
                           f"{fit_from}: alpha {alpha_us:.1f} us, CPU per message "
                           f"{cpu_us:.1f} us on {fit.cores or 'their own'} cores")
            elif alpha_us is None:
                from hetbench.sim.fit import fit_alpha

                alpha_us = fit_alpha(fit_from, beta) * 1e6
        from hetbench.sim.fit import fit_gg_request, fit_group_setup

        prague_runs = f"the prague-smart/random runs in {fit_from}"
        group_setup_ms = _unless_given(
            group_setup_ms, lambda: fit_group_setup(fit_from), 1e3,
            lambda ms: f"P-Reduce communicator set-up fitted from {prague_runs}: {ms:.2f} ms "
                       "per cache miss")
        gg_request_us = _unless_given(
            gg_request_us, lambda: fit_gg_request(fit_from), 1e6,
            lambda us: f"Group Generator time per request fitted from {prague_runs}: {us:.0f} us")
    else:
        compute = ComputeModel(constant_s=None if compute_ms is None else compute_ms / 1000)
    network = NetworkModel(alpha_s=(20.0 if alpha_us is None else alpha_us) * 1e-6,
                           beta_bytes_per_s=beta, group_setup_s=(group_setup_ms or 0.0) / 1000,
                           cpu_s=(cpu_us or 0.0) * 1e-6, cores=cores,
                           gg_request_s=(gg_request_us or 0.0) * 1e-6)
    return SimModels(network, compute)


def _unless_given(given, fit, scale: float, describe):
    """The flag's value if given; else fit() * scale, said with describe(value) (None if the
    runs had nothing to fit it from)."""
    if given is not None:
        return given
    fitted = fit()
    if fitted is None:
        return None
    click.echo(describe(fitted * scale))
    return fitted * scale


def _against(real_dir: Path, models, out_dir: Path, own_cores: bool = True,
             wait: bool = False, learn: bool = False) -> None:
    from hetbench.harness.matrix import check_writable
    from hetbench.sim import validate

    if not Path(real_dir).is_dir():
        raise UserError(f"--against {real_dir}: no such directory")
    check_writable(out_dir)
    with lock_results(out_dir, "bench sim --against", wait):
        if learn:  # the learning: each real run's math along its own order of events
            rows = validate.compare_learning_with_real(real_dir, models, out_dir)
        else:
            rows = validate.compare_with_real(real_dir, models, out_dir, own_cores=own_cores)
    if not rows:
        raise UserError(f"--against {real_dir}: no finished real runs there"
                        + (" that the learning simulator trains" if learn else ""))
    click.echo(validate.learning_markdown(rows) if learn else validate.markdown(rows))


def _simulate_all(configs, models, out_dir: Path, events: str = "auto",
                  force: bool = False) -> None:
    from hetbench.cli.running import variant_names_of
    from hetbench.core.identity import code_identity
    from hetbench.sim.run import SimResult, simulate

    click.echo(f"{len(configs)} simulated run(s) -> {out_dir}")
    names = variant_names_of(configs)  # a swept option in the label: `dpsgd[topology=ring]`
    results, failed, started = [], 0, time.time()
    for i, config in enumerate(configs):
        label = config.label(names[config.run_id])
        run_dir = out_dir / config.run_id
        code = code_identity(config)
        done, why = _finished_simulation(run_dir, config, models, events, code, force)
        if done is not None:
            click.echo(f"skip {label}: already simulated (same config, costs and code)")
            results.append(SimResult(config, run_dir, done, done.get("sim_s", 0.0)))
            continue
        if why is not None and why != "--force":
            click.echo(f"resimulate {label}: {why}")
        try:
            result = simulate(config, models, out_dir, events)
        except OSError as exc:
            _results_unwritable(config, run_dir, exc, len(configs) - i - 1)
        s = result.summary
        results.append(result)
        if s["status"] == "ok":
            click.echo(f"sim  {label}: {s['throughput']:.1f} samples/s "
                       f"({s['train_wall_s']:.2f} simulated s in {result.sim_s:.1f} s)")
        else:
            failed += 1
            click.echo(f"FAIL {label}: {s['cause']}")
    _echo_speedups(results, names)
    click.echo(f"results in {out_dir} ({time.time() - started:.1f} s); `bench report {out_dir}` "
               "writes the report")
    if failed:
        raise click.exceptions.Exit(1)


def _finished_simulation(run_dir: Path, config, models, events: str, code: dict[str, str],
                         force: bool) -> tuple[dict | None, str | None]:
    """(the summary of a finished simulation to skip, None), or (None, why it is simulated
    again: None when there is none to skip). A simulation stands for its config (the run id),
    its costs (summary's `sim`, not in the id: --alpha-us and the like), what it records
    (--events) and its code; the earlier one is replaced, not kept aside as a real run's is: it
    is the same simulation again from the same config, costs and code."""
    import json

    from hetbench.core.identity import code_change, recorded_identity
    from hetbench.harness.runner import finished_summary
    from hetbench.sim.sink import full_events

    summary = finished_summary(run_dir)
    if summary is None or summary.get("simulated") is not True:
        return None, None  # nothing finished, or a real run's directory (simulate refuses it)
    if force:
        return None, "--force"
    if why := code_change(recorded_identity(summary, None), code):
        return None, why
    costs = json.loads(json.dumps(models.to_dict(config)))
    recorded = summary.get("sim") or {}
    differ = sorted(key for key, value in costs.items() if recorded.get(key) != value)
    if differ:
        return None, f"its costs differ from the earlier simulation's ({', '.join(differ)})"
    mode = "full" if full_events(events, config.workers) else "workers"
    if summary.get("events", mode) != mode:
        return None, f"--events {mode}, where the earlier simulation recorded {summary['events']}"
    return summary, None


def _results_unwritable(config, run_dir: Path, error: OSError, left: int) -> None:
    """A simulation that could not write its results (a full disk): its event logs cut back to
    whole lines, a failed summary if one can still be written, and one ResultsWriteError line
    (the matrix stops: the next run would fail alike)."""
    from hetbench.core.record import summary_head
    from hetbench.core.store import ResultsWriteError, cut_to_whole_lines, write_json_atomic

    for _, log in RunDir(run_dir).event_logs():
        cut_to_whole_lines(log)
    cause = f"simulator: {type(error).__name__}: {error}"
    try:
        write_json_atomic(RunDir(run_dir).summary, {
            **summary_head(config, "failed", cause, time.time()), "simulated": True})
        recorded = f"on record in {RunDir(run_dir).summary}"
    except OSError as exc:
        recorded = f"its summary.json could not be written either ({exc})"
    raise ResultsWriteError.because(
        f"{config.label()} failed writing its results: {cause} ({recorded}); the matrix "
        f"stops here ({left} run(s) not started)", run_dir) from error


def _echo_speedups(results, names: dict[str, str]) -> None:
    """Throughput of each run over allreduce's in the same workload/workers/slowdown/seed,
    each labelled as its progress line was (`names`: run id -> variant name)."""
    def key(r):
        c = r.config
        return (c.workload, c.workers, c.slowdown, c.seed)

    baseline = {key(r): r.summary["throughput"] for r in results
                if r.config.algorithm == "allreduce" and r.summary["status"] == "ok"}
    lines = [f"  {r.config.label(names[r.config.run_id])}: "
             f"{r.summary['throughput'] / baseline[key(r)]:.2f}x"
             for r in results if r.config.algorithm != "allreduce" and baseline.get(key(r))
             and r.summary["status"] == "ok"]
    if lines:
        click.echo("predicted throughput vs allreduce:")
        for line in lines:
            click.echo(line)


COMMANDS: list[click.Command] = [sim_cmd]
