"""Two emulated "hosts" on one Linux machine, for paired captures (needs root).

A host is:

* a network namespace (``rtp0``, ``rtp1``); the two are joined by a veth pair
  (``rtpv0`` 10.89.0.1 <-> ``rtpv1`` 10.89.0.2) and each end's egress is shaped with
  ``tc qdisc add dev X root tbf rate R burst B latency L``: R is the inter-host bandwidth per
  direction, B two timer ticks of R (at least 64 KiB; tbf needs one tick's worth to reach R). This kernel has no ``netem`` (``CONFIG_NET_SCH_NETEM`` is not set), so **latency
  is not shaped**: the link's latency is the veth's own (microseconds); tbf's ``latency`` is
  only the longest a packet may queue in tbf before it is dropped, not a delay. Ranks on the
  same host reach each other over the namespace's loopback (not shaped).
* a UTS namespace of its own with the hostname ``host<i>`` (``unshare --uts``), so each
  trace's ``host_name`` tells the hosts apart (ranks sharing a host name are one node);
* a CPU: its processes are pinned (``sched_setaffinity``) to the host's core (host0 -> CPU 0,
  host1 -> CPU 1), so the hosts never take each other's core; a one-host layout can give its
  host both cores (``command(..., cpus="0,1")``).

Scheduling. The machine is shared (2 cores, other sessions' tests). Under the normal
scheduler a rank's core goes to another process whenever the rank waits on the socket and
comes back late (measured here: an MLP step at 400 Mbit/s took 130-160 ms at nice -10 in a
cgroup weighted like nice -10, 95 ms +- 1% under real-time scheduling). So every host
process runs under round-robin real-time scheduling (``SCHED_RR``, priority 1; its threads
inherit it) with 3 ms slices (``kernel.sched_rr_timeslice_ms``, a system-wide setting, set
while the hosts are up and restored by ``down``) so a rank's training and gloo threads, and
two ranks sharing a core, still take turns finely. Other processes then run only while the
ranks wait. The host processes are in one cgroup, ``/sys/fs/cgroup/cpu/retime-pairs``, whose
real-time bandwidth (``cpu.rt_runtime_us`` per ``cpu.rt_period_us`` = 10 ms, enforced per
CPU) is the hosts' CPU speed: 9.5 ms per 10 ms at full speed (the kernel keeps 5% of every
core for other work, spread in 0.5 ms pauses), 4.75 ms per 10 ms at half speed
(:meth:`Hosts.speed`) -- the compute-speed knob of the suite.

Usage as a module (what ``capture.py`` does)::

    with Hosts(rate_mbit=400) as h:
        h.shape(100)                  # change the link's rate (both directions)
        h.speed(50)                   # every host at half speed
        argv = h.command(0, ["python", "job.py", ...])   # run on host0
        subprocess.run(argv)

or from a shell (``up`` leaves the hosts in place until ``down``)::

    python examples/pairs/hosts.py up --rate-mbit 400
    python examples/pairs/hosts.py run 0 -- python -c "import socket; print(socket.gethostname())"
    python examples/pairs/hosts.py down
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

NETNS = ("rtp0", "rtp1")
VETH = ("rtpv0", "rtpv1")
ADDR = ("10.89.0.1", "10.89.0.2")
PREFIX = 24
CGROUP = Path("/sys/fs/cgroup/cpu/retime-pairs")
#: real-time bandwidth period of the hosts' cgroup (us): short, so a throttled host pauses
#: often and briefly (a 1 s period would stall a step for 50-500 ms at once)
RT_PERIOD_US = 10_000
#: runtime per period at full speed: the kernel's own limit for real-time tasks (95%)
RT_FULL_US = 9_500
#: round-robin slice (ms) while the hosts are up
RR_SLICE_MS = 3
RR_SLICE = Path("/proc/sys/kernel/sched_rr_timeslice_ms")
#: the slice in force before ``up`` (restored by ``down``, also from another process)
RR_SAVED = Path("/run/retime-pairs-rr-slice-ms")
#: the kernel's timer tick (CONFIG_HZ): tbf releases tokens per tick, so its bucket must hold
#: at least one tick of the shaped rate or the link cannot reach its rate (measured by the
#: lead with a TCP socket at "1600 Mbit/s": burst 64 KiB -> ~200 Mbit/s, 1 MB -> ~880)
HZ = 250
#: smallest tbf bucket (bytes); the bucket is max(MIN_BURST_BYTES, 2 ticks of the rate)
MIN_BURST_BYTES = 65536


def burst_bytes(rate_mbit: float, burst_x: float = 1.0) -> int:
    """tbf bucket for ``rate_mbit``: two timer ticks of tokens, at least 64 KiB (times
    ``burst_x``: a larger bucket, another link shaping)."""
    return int(burst_x * max(MIN_BURST_BYTES, int(2 * rate_mbit * 1e6 / 8 / HZ)))

#: tbf queue limit expressed as the longest wait in the queue (a drop threshold, not a delay)
TBF_LATENCY_MS = 200


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


@dataclass
class Hosts:
    """Two hosts joined by a shaped veth link; ``down()`` (or leaving the ``with`` block)
    removes everything ``up()`` created and restores the round-robin slice.

    Parameters
    ----------
    rate_mbit : float
        tbf rate of each veth end (Mbit/s, one direction).
    cpus : tuple of str
        Each host's CPUs (comma list): default host0 -> "0", host1 -> "1".
    """

    rate_mbit: float = 400.0
    cpus: tuple[str, ...] = ("0", "1")
    burst_x: float = 1.0

    def up(self) -> Hosts:
        if os.geteuid() != 0:
            raise SystemExit("hosts: needs root (network namespaces, tc, cgroups, SCHED_RR)")
        self.down(quiet=True)  # leftovers of an interrupted run
        for ns in NETNS:
            _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1])
        for ns, dev, addr in zip(NETNS, VETH, ADDR):
            _run("ip", "link", "set", dev, "netns", ns)
            _run("ip", "-n", ns, "addr", "add", f"{addr}/{PREFIX}", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        self.shape(self.rate_mbit, add=True)
        CGROUP.mkdir(exist_ok=True)
        (CGROUP / "cpu.rt_runtime_us").write_text(str(RT_FULL_US))  # runtime <= period first
        (CGROUP / "cpu.rt_period_us").write_text(str(RT_PERIOD_US))
        if not RR_SAVED.exists():
            RR_SAVED.write_text(RR_SLICE.read_text())
        RR_SLICE.write_text(str(RR_SLICE_MS))
        return self

    def shape(self, rate_mbit: float, add: bool = False, burst_x: float = 1.0) -> None:
        """Set both veth ends' tbf rate (Mbit/s) and bucket (``burst_x`` times the rule's)."""
        self.rate_mbit = float(rate_mbit)
        self.burst_x = float(burst_x)
        for ns, dev in zip(NETNS, VETH):
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add" if add else "replace", "dev",
                 dev, "root", "tbf", "rate", f"{rate_mbit:g}mbit", "burst",
                 str(burst_bytes(rate_mbit, burst_x)),
                 "latency", f"{TBF_LATENCY_MS}ms")

    def speed(self, percent: float) -> None:
        """Every host's CPU speed: ``percent`` of full speed (real-time runtime per period)."""
        (CGROUP / "cpu.rt_runtime_us").write_text(str(int(round(RT_FULL_US * percent / 100))))

    def command(self, host: int, argv: list[str], cpus: str | None = None) -> list[str]:
        """``argv`` run on host ``host``: its netns, hostname, cgroup, scheduling and CPUs."""
        return ["nsenter", f"--net=/run/netns/{NETNS[host]}", "unshare", "--uts", "--",
                sys.executable, str(Path(__file__).resolve()), "_enter", str(host),
                cpus or self.cpus[host], "--", *argv]

    def state(self) -> dict:
        """The link and CPU settings in force (for the capture record)."""
        return {"rate_mbit": self.rate_mbit,
                "rt_runtime_us": int((CGROUP / "cpu.rt_runtime_us").read_text()),
                "rt_period_us": int((CGROUP / "cpu.rt_period_us").read_text()),
                "rr_slice_ms": int(RR_SLICE.read_text()),
                "tbf_burst_bytes": burst_bytes(self.rate_mbit, self.burst_x)}

    def measure_mbit(self, nbytes: int = 64 << 20, skip: int = 8 << 20) -> dict:
        """The link's achieved TCP rate, host0 -> host1 and host1 -> host0 (Mbit/s): one
        socket sends ``nbytes``; the receiver times the bytes after the first ``skip``
        (TCP's slow start and tbf's full bucket left out). Both ends run as host processes
        (real-time, pinned), one direction at a time."""
        out = {}
        for src, dst in ((0, 1), (1, 0)):
            port = 29400 + src
            sink = subprocess.Popen(self.command(dst, [sys.executable, __file__, "_sink",
                                                       str(port), str(nbytes), str(skip)]),
                                    stdout=subprocess.PIPE, text=True)
            time.sleep(1.0)  # the sink listens
            subprocess.run(self.command(src, [sys.executable, __file__, "_source", ADDR[dst],
                                              str(port), str(nbytes)]), check=True, timeout=120)
            res, _ = sink.communicate(timeout=120)
            out[f"host{src}->host{dst}"] = round(float(res.split()[-1]), 1)
        return out

    def down(self, quiet: bool = False) -> None:
        for ns in NETNS:  # deleting a namespace deletes its veth end (and the peer)
            _run("ip", "netns", "del", ns, check=False)
        with contextlib.suppress(OSError):
            CGROUP.rmdir()  # fails while a process is still inside: left for the next run
        if RR_SAVED.exists():
            with contextlib.suppress(OSError, ValueError):
                RR_SLICE.write_text(str(int(RR_SAVED.read_text())))
                RR_SAVED.unlink()
        if not quiet:
            print("hosts: removed", file=sys.stderr)

    def __enter__(self) -> Hosts:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down(quiet=True)


def _enter(host: int, cpus: str, argv: list[str]) -> None:
    """Inside the host's net + UTS namespaces: name it, join the cgroup, real-time
    round-robin, pin to the host's CPUs, exec ``argv``."""
    socket.sethostname(f"host{host}")
    (CGROUP / "cgroup.procs").write_text(str(os.getpid()))
    os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    cores: set[int] = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    os.sched_setaffinity(0, cores)
    os.execv(shutil.which(argv[0]) or argv[0], argv)


def _sink(port: int, nbytes: int, skip: int) -> None:
    """Receive ``nbytes`` on ``port``; print the Mbit/s of the bytes after ``skip``."""
    with socket.create_server(("0.0.0.0", port)) as srv:
        conn, _ = srv.accept()
        got, t0 = 0, None
        with conn:
            while got < nbytes:
                b = conn.recv(1 << 20)
                if not b:
                    break
                got += len(b)
                if t0 is None and got >= skip:
                    t0, mark = time.perf_counter(), got
        dt = time.perf_counter() - t0
    print(f"{(got - mark) * 8 / dt / 1e6:.1f}")


def _source(addr: str, port: int, nbytes: int) -> None:
    buf = b"x" * (1 << 20)
    with socket.create_connection((addr, port)) as s:
        for _ in range(nbytes // len(buf)):
            s.sendall(buf)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_enter"]:
        _enter(int(argv[1]), argv[2], argv[argv.index("--") + 1:])
    if argv[:1] == ["_sink"]:
        _sink(*(int(x) for x in argv[1:4]))
        return 0
    if argv[:1] == ["_source"]:
        _source(argv[1], int(argv[2]), int(argv[3]))
        return 0
    cmd: list[str] = []
    if "--" in argv:
        argv, cmd = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    u = sub.add_parser("up", help="create the two hosts (left in place until `down`)")
    u.add_argument("--rate-mbit", type=float, default=400.0)
    sub.add_parser("down", help="remove the hosts, restore the round-robin slice")
    sub.add_parser("measure", help="print the link's achieved TCP rate (Mbit/s)")
    s = sub.add_parser("shape", help="change the link rate (Mbit/s)")
    s.add_argument("rate_mbit", type=float)
    q = sub.add_parser("speed", help="every host's CPU speed, percent of full speed")
    q.add_argument("percent", type=float)
    r = sub.add_parser("run", help="run a command on a host: run HOST [--cpus C] -- CMD ...")
    r.add_argument("host", type=int, choices=range(len(NETNS)))
    r.add_argument("--cpus", default=None)
    a = p.parse_args(argv)
    h = Hosts()
    if a.action == "up":
        h.rate_mbit = a.rate_mbit
        h.up()
    elif a.action == "down":
        h.down()
    elif a.action == "shape":
        h.shape(a.rate_mbit)
    elif a.action == "measure":
        print(h.measure_mbit())
    elif a.action == "speed":
        h.speed(a.percent)
    else:
        if not cmd:
            p.error("run: give the command after --")
        return subprocess.call(h.command(a.host, cmd, a.cpus))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
