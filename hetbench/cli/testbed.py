"""`bench testbed up|down|exec|status`: a cluster of namespace hosts on this machine
(hetbench/testbed/), to rehearse multi-host runs; needs root."""

from __future__ import annotations

import os
import sys

import click

from hetbench.errors import UserError
from hetbench.testbed import DEFAULT_QUEUE, QUEUES


def _pairs(values: tuple[str, ...], what: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        host, sep, setting = value.partition("=")
        if not sep or not host or not setting:
            raise UserError(f"testbed: {what} {value!r}: expected HOST=VALUE, e.g. h2=100mbit")
        pairs[host] = setting
    return pairs


@click.group("testbed")
def testbed_cmd() -> None:
    """Hosts in network namespaces on this machine (root): names, addresses, shaped links,
    shifted clocks."""


def _seconds(value: str, what: str, host: str) -> float:
    """`10ms` or `0.010` (seconds)."""
    try:
        return float(value[:-2]) / 1e3 if value.endswith("ms") else float(value)
    except ValueError:
        raise UserError(f"testbed: {what} {host}={value}: not a duration (e.g. 10ms or "
                        "0.010)") from None


@testbed_cmd.command("up")
@click.option("--name", default="hbtb", show_default=True, help="The bed's name (1-6 chars).")
@click.option("--hosts", default=3, show_default=True, help="Hosts h1..hN.")
@click.option("--subnet", default="10.77.0", show_default=True, help="Their /24 (10.X.Y).")
@click.option("--rate", multiple=True, metavar="HOST=RATE",
              help="Shape a host's link both ways, e.g. h2=100mbit.")
@click.option("--queue", type=click.Choice(QUEUES), default=DEFAULT_QUEUE, show_default=True,
              help="How shaped links queue: host-fair, a queue per peer out of a host and one "
              "FIFO into it (a cluster host's per-flow queueing behind a switch port); fair, "
              "a queue per peer both ways; fifo, one FIFO; tbf, one token bucket and FIFO.")
@click.option("--clock-offset", multiple=True, metavar="HOST=SECONDS",
              help="Shift a host's clock (libfaketime), e.g. h2=+0.050.")
@click.option("--delay", multiple=True, metavar="HOST=DELAY",
              help="Add a one-way delay to each direction of a host's link (a user-space "
              "delay line; needs ethtool), e.g. h2=10ms or h2=0.010.")
@click.option("--slurm", is_flag=True, help="Run a SLURM cluster in the bed: slurmctld and "
              "slurmdbd on h1, a slurmd per host (apt-get install munge slurmctld slurmd "
              "slurm-client slurmdbd mariadb-server).")
def up_cmd(name: str, hosts: int, subnet: str, rate: tuple[str, ...], queue: str,
           clock_offset: tuple[str, ...], delay: tuple[str, ...], slurm: bool) -> None:
    """Make the bed; `bench testbed down` removes it."""
    from hetbench import testbed

    offsets = {}
    for host, value in _pairs(clock_offset, "--clock-offset").items():
        try:
            offsets[host] = float(value)
        except ValueError:
            raise UserError(f"testbed: --clock-offset {host}={value}: not a number of "
                            "seconds") from None
    delays = {host: _seconds(value, "--delay", host)
              for host, value in _pairs(delay, "--delay").items()}
    bed = testbed.up(name, hosts, subnet, _pairs(rate, "--rate"), offsets, slurm=slurm,
                     delays=delays, queue=queue)
    for host, address in bed.hosts.items():
        extra = [f"rate {bed.rates[host]} ({bed.queue})"] if host in bed.rates else []
        if host in bed.delays:
            extra.append(f"delay {bed.delays[host] * 1e3:g} ms each way")
        if host in bed.clock_offsets:
            extra.append(f"clock {bed.clock_offsets[host]:+g} s")
        click.echo(f"{host} {address}" + (f" ({', '.join(extra)})" if extra else ""))
    if bed.slurm:
        click.echo(f"SLURM cluster {name}: slurmctld and slurmdbd on h1, partition bed "
                   f"(SLURM_CONF={bed.slurm['conf']} on every host)")
    click.echo(f"testbed {name} is up; run on a host with `bench testbed exec HOST -- CMD`")


@testbed_cmd.command("down")
@click.option("--name", default="hbtb", show_default=True)
def down_cmd(name: str) -> None:
    """Remove the bed (whatever of it exists)."""
    from hetbench import testbed

    removed = testbed.down(name)
    click.echo(f"testbed {name}: removed {', '.join(removed)}" if removed
               else f"testbed {name}: nothing to remove")


@testbed_cmd.command("exec", context_settings={"ignore_unknown_options": True})
@click.option("--name", default="hbtb", show_default=True)
@click.argument("host")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_cmd(name: str, host: str, argv: tuple[str, ...]) -> None:
    """Run a command on HOST (its namespace, hostname and clock); its exit code is ours."""
    from hetbench import testbed

    sys.exit(testbed.load(name).run(host, list(argv)).returncode)


@testbed_cmd.command("rsh", context_settings={"ignore_unknown_options": True,
                                              "allow_interspersed_args": False})
@click.option("--name", default="hbtb", show_default=True)
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def rsh_cmd(name: str, argv: tuple[str, ...]) -> None:
    """An rsh agent into the bed, called as ssh is: `rsh [OPTIONS] HOST COMMAND...`; options
    are ignored, COMMAND's words are joined and run by a shell on HOST (bench run --rsh-agent,
    Open MPI's plm_rsh_agent)."""
    from hetbench import testbed

    words = list(argv)
    while words and words[0].startswith("-"):  # ssh options an MPI launcher may add
        words.pop(0)
    if len(words) < 2:
        raise UserError("testbed rsh: expected HOST COMMAND...")
    host, command = words[0], " ".join(words[1:])
    argv_on_host = testbed.load(name).command(host, ["sh", "-c", command])
    sys.stdout.flush()
    os.execvp(argv_on_host[0], argv_on_host)  # stdin, stdout and signals reach the command


@testbed_cmd.command("status")
@click.option("--name", default="hbtb", show_default=True)
def status_cmd(name: str) -> None:
    """The bed's hosts, addresses, rates, delays and clock offsets."""
    from hetbench import testbed

    bed = testbed.load(name)
    for host, address in bed.hosts.items():
        click.echo(f"{host} {address} namespace {bed.namespace(host)}"
                   + (f" rate {bed.rates[host]} ({bed.queue})" if host in bed.rates else "")
                   + (f" clock {bed.clock_offsets[host]:+g} s" if host in bed.clock_offsets
                      else "")
                   + (f" delay {bed.delays[host] * 1e3:g} ms" if host in bed.delays else ""))


COMMANDS: list[click.Command] = [testbed_cmd]
