#!/usr/bin/env python3
"""Network faults and a full spool disk, on hosts built on this machine.

Builds a trainer host, two gacd replica hosts and a PostgreSQL host as
network namespaces joined by veth pairs to a bridge in a fifth ("switch")
namespace; nothing is added to the machine's own network namespace. The
trainer host runs fault_trainer (the agent's telemetry sender with its spool
and the remote controller, tests/faults/fault_trainer.cc) against both
replicas; the replicas share one PostgreSQL database. While the trainer
streams, each case injects one fault, heals it, and checks what the trainer
and the store say afterwards:

  - every step the trainer produced is stored exactly once, or, where the
    spool's bound or its disk was exceeded, exactly the steps Enqueue
    refused are missing, counted by the agent and exported with the run
    (agent_records_dropped);
  - the remote controller's misses: every failed Decide fell back to the
    local decision and was counted;
  - the sender moved to the replica it should have, where the case says so.

Reported, never checked (timings say more about the machine than about gac):
the training thread's Enqueue p99 and slowest call during the fault, beside
the p99 of a baseline call timed in the same run after the same pause (a
mutex lock and one append: what any call pays on this machine on waking up),
and their ratio; each Decide's time against its deadline; the time to
recover, from the heal until every step produced before it is acknowledged.

Faults are nftables DROP rules (packets vanish: no RST, connects hang), tc
netem, and a tmpfs under the spool. Namespace names carry this process' id,
so runs never collide, and they are removed on every exit path.

Usage: faults.py --gacd PATH --trainer PATH [--short] [--case NAME ...]
                 [--report FILE]
Exit status: 0 all cases passed, 1 a case failed, 77 cannot run here (not
root, or nft, tc or PostgreSQL missing: said on stderr).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

SKIP = 77
WRITER = "writer-token-0123456789"
READER = "reader-token-0123456789"
HOSTS = {"t": 10, "r0": 20, "r1": 21, "pg": 30}
PORT = 7070
DECIDE_DEADLINE_MS = 50
DECIDE_EVERY = 5  # fault_trainer's default
ENQUEUE_TARGET_US = 5.0  # the agent's per-step target: calls over it are classified in the report


def log(msg: str) -> None:
    print(msg, flush=True)


def run(args: List[str], check: bool = True, input: Optional[str] = None) -> subprocess.CompletedProcess:
    p = subprocess.run(args, input=input, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def pg_bindir() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return os.path.dirname(found[-1]) if found else ""


def why_not() -> str:
    if os.geteuid() != 0:
        return "needs root (network namespaces, nftables, tc, mount)"
    for tool in ("ip", "nft", "tc", "runuser", "mount"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (scripts/setup.sh installs nftables and iproute2)"
    if not pg_bindir():
        return "PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no 'postgres' user to run PostgreSQL as"
    return ""


class Lab:
    """The hosts and what runs on them; down() undoes everything."""

    def __init__(self, work: str) -> None:
        self.work = work
        tag = f"{os.getpid()}"
        self.ns = {h: f"gacf{tag}{h}" for h in list(HOSTS) + ["sw"]}
        self.ip = {h: f"10.77.0.{n}" for h, n in HOSTS.items()}
        self.procs: List[subprocess.Popen] = []
        self.mounts: List[str] = []
        self.made: List[str] = []

    # --- hosts ---------------------------------------------------------
    def up(self) -> None:
        for ns in self.ns.values():
            run(["ip", "netns", "add", ns])
            self.made.append(ns)
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
        sw = self.ns["sw"]
        run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", sw, "link", "set", "br0", "up"])
        for h in HOSTS:
            # Made inside the namespaces: the machine's own namespace never
            # sees these links.
            run(["ip", "-n", self.ns[h], "link", "add", "eth0", "type", "veth", "peer", "name", f"p{h}",
                 "netns", sw])
            run(["ip", "-n", sw, "link", "set", f"p{h}", "master", "br0", "up"])
            run(["ip", "-n", self.ns[h], "addr", "add", f"{self.ip[h]}/24", "dev", "eth0"])
            run(["ip", "-n", self.ns[h], "link", "set", "eth0", "up"])

    def cmd(self, host: str, args: List[str]) -> List[str]:
        return ["ip", "netns", "exec", self.ns[host], *args]

    def spawn(self, host: str, args: List[str], log_path: str, user: Optional[str] = None) -> subprocess.Popen:
        if user:
            args = ["runuser", "-u", user, "--", *args]
        with open(log_path, "ab") as out:
            p = subprocess.Popen(self.cmd(host, args), stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
                p.wait(timeout=timeout)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        if p in self.procs:
            self.procs.remove(p)

    # --- faults --------------------------------------------------------
    def drop(self, host: str, peers: List[str], inbound: bool = True, outbound: bool = True) -> None:
        """Silently drops packets between `host` and `peers` (no RST, no ICMP)."""
        addrs = ", ".join(self.ip[p] for p in peers)
        rules = ["table inet gacfault {"]
        if inbound:
            rules.append(f"  chain in {{ type filter hook input priority 0; ip saddr {{ {addrs} }} drop; }}")
        if outbound:
            rules.append(f"  chain out {{ type filter hook output priority 0; ip daddr {{ {addrs} }} drop; }}")
        rules.append("}")
        run(self.cmd(host, ["nft", "-f", "-"]), input="\n".join(rules) + "\n")

    def lose(self, host: str, peers: List[str], percent: int) -> None:
        """Drops `percent` % of the packets between `host` and `peers`, at random, both ways."""
        addrs = ", ".join(self.ip[p] for p in peers)
        run(self.cmd(host, ["nft", "-f", "-"]), input="\n".join([
            "table inet gacfault {",
            f"  chain in {{ type filter hook input priority 0; ip saddr {{ {addrs} }} numgen random mod 100 < {percent} drop; }}",
            f"  chain out {{ type filter hook output priority 0; ip daddr {{ {addrs} }} numgen random mod 100 < {percent} drop; }}",
            "}"]) + "\n")

    def qdisc(self, host: str, spec: List[str]) -> None:
        """A tc qdisc on both ends of `host`'s link (its eth0 and the switch's port)."""
        for args in (self.cmd(host, ["tc", "qdisc", "add", "dev", "eth0", "root", *spec]),
                     ["ip", "netns", "exec", self.ns["sw"], "tc", "qdisc", "add", "dev", f"p{host}", "root", *spec]):
            p = run(args, check=False)
            if p.returncode != 0 and "qdisc kind is unknown" in p.stderr:
                raise CannotTestHere(f"this kernel has no '{spec[0]}' qdisc (tc: {p.stderr.strip()})")
            if p.returncode != 0:
                raise RuntimeError(f"{' '.join(args)}: {p.stderr.strip()}")

    def heal(self) -> None:
        for h in HOSTS:
            run(self.cmd(h, ["nft", "delete", "table", "inet", "gacfault"]), check=False)
            run(self.cmd(h, ["tc", "qdisc", "del", "dev", "eth0", "root"]), check=False)
            run(["ip", "netns", "exec", self.ns["sw"], "tc", "qdisc", "del", "dev", f"p{h}", "root"], check=False)

    def tmpfs(self, path: str, size: str) -> None:
        os.makedirs(path, exist_ok=True)
        run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path])
        self.mounts.append(path)

    def unmount(self, path: str) -> None:
        run(["umount", "-l", path], check=False)
        if path in self.mounts:
            self.mounts.remove(path)

    def down(self) -> None:
        for p in list(self.procs):
            self.stop(p, signal.SIGKILL)
        # Whatever still runs in the namespaces (PostgreSQL's backends
        # outlive their postmaster for a moment) goes before the directories.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pids = [int(p) for ns in self.made for p in run(["ip", "netns", "pids", ns], check=False).stdout.split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        for m in list(self.mounts):
            self.unmount(m)
        for ns in reversed(self.made):
            run(["ip", "netns", "del", ns], check=False)
        self.made.clear()


def remove_leftovers() -> None:
    """Removes the namespaces (and what runs in them) of runs that died
    without cleaning up (SIGKILL, e.g. at a ctest timeout)."""
    listing = run(["ip", "netns", "list"], check=False).stdout
    for line in listing.splitlines():
        m = re.match(r"^gacf([0-9]+)(t|r0|r1|pg|sw)\b", line)
        if not m or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        name = line.split()[0]
        for pid in run(["ip", "netns", "pids", name], check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        run(["ip", "netns", "del", name], check=False)
        log(f"faults: removed namespace {name} left by an earlier run")
    for line in open("/proc/mounts").read().splitlines():
        target = line.split()[1]
        m = re.match(r"^(/.*/gac-faults-[^/]+)/", target)
        if m and line.split()[2] == "tmpfs":
            owner = os.path.join(m.group(1), "owner")
            pid = open(owner).read().strip() if os.path.exists(owner) else ""
            if not pid or not os.path.exists(f"/proc/{pid}"):
                run(["umount", "-l", target], check=False)
                shutil.rmtree(m.group(1), ignore_errors=True)


class Postgres:
    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.dir = os.path.join(lab.work, "pg")
        self.bindir = pg_bindir()
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> None:
        os.makedirs(self.dir)
        pw = pwd.getpwnam("postgres")
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        run(["runuser", "-u", "postgres", "--", f"{self.bindir}/initdb", "-D", f"{self.dir}/data", "-U", "gac",
             "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"])
        with open(f"{self.dir}/data/pg_hba.conf", "a") as f:
            f.write("host all all 10.77.0.0/24 trust\n")  # the hosts' subnet, inside the namespaces only
        self.proc = self.lab.spawn("pg", [f"{self.bindir}/postgres", "-D", f"{self.dir}/data", "-c",
                                          f"listen_addresses={self.lab.ip['pg']}", "-p", "5432", "-c",
                                          f"unix_socket_directories={self.dir}", "-c", "fsync=off"],
                                   os.path.join(self.lab.work, "postgres.log"), user="postgres")
        deadline = time.monotonic() + 30
        while self.sql("postgres", "SELECT 1", check=False).returncode != 0:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("PostgreSQL did not start: " +
                                   open(os.path.join(self.lab.work, "postgres.log")).read()[-2000:])
            time.sleep(0.1)

    def sql(self, db: str, statement: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(self.lab.cmd("pg", ["runuser", "-u", "postgres", "--", f"{self.bindir}/psql", "-h", self.lab.ip["pg"],
                                       "-U", "gac", "-d", db, "-qAtc", statement]), check=check)

    def uri(self, db: str) -> str:
        return f"postgresql://gac@{self.lab.ip['pg']}:5432/{db}"


class CannotTestHere(Exception):
    """The machine lacks what the fault needs (said in the report)."""


@dataclass
class Case:
    name: str
    title: str  # the fault, as the table says it
    inject: str  # see Runner.inject
    spool_max_bytes: int = 256 << 20
    queue_capacity: int = 1 << 16
    tmpfs: str = ""
    expect_refusals: bool = False
    expect_replica: str = ""  # the replica the sender must end up on during the fault
    fault_scale: float = 1.0  # of the fault's duration


CASES = [
    Case("partition", "trainer ↔ both gacd replicas partitioned (DROP both ways)", "partition"),
    Case("one_replica", "trainer ↔ the streamed-to replica partitioned (DROP)", "one_replica", expect_replica="r1"),
    Case("replica_pg", "streamed-to replica ↔ PostgreSQL partitioned (DROP)", "replica_pg", expect_replica="r1"),
    Case("asymmetric", "gacd → trainer dropped (requests arrive, acks lost)", "asymmetric"),
    Case("loss", "trainer's link loses 5 % of packets both ways (nftables numgen)", "loss"),
    Case("slow", "trainer's link slowed to 256 kbit/s both ways, 200 ms of queue (tc tbf)", "slow"),
    Case("netem", "trainer's link: 80 ± 20 ms delay, 1 % loss (tc netem)", "netem"),
    Case("spool_bound", "partition longer than the spool's bound (32 KiB spool, queue of 400)", "partition",
         spool_max_bytes=32 << 10, queue_capacity=400, expect_refusals=True),
    Case("tiny_fs", "partition with the spool on a 64 KiB tmpfs that fills (queue of 400)", "partition",
         tmpfs="64k", queue_capacity=400, expect_refusals=True),
]


@dataclass
class Result:
    case: Case
    fault_s: float
    produced: int = 0
    stored: int = 0
    lost: int = 0
    counted: int = 0
    duplicated: int = 0
    p99_us: float = 0.0
    p99_no_decide_us: float = 0.0  # steps that made no Decide call
    p99_quiet_us: float = 0.0  # calls during which the thread neither waited, was preempted nor took a page fault
    # The baseline call (a mutex lock and one append, after the same pause),
    # during the fault: its p99, and Enqueue's p99 over it.
    baseline_p99_us: float = 0.0
    ratio: float = 0.0
    # Calls over the 5 us target: preempted; else waited; else took a page fault; none of those.
    slow: Tuple[int, int, int, int] = (0, 0, 0, 0)
    cpu: Tuple[float, float, float] = (0.0, 0.0, 0.0)  # the machine during the fault: busy, interrupts, stolen
    max_us: float = 0.0
    decide_max_ms: float = 0.0
    fallbacks: int = 0
    decides: int = 0
    recovery_s: Optional[float] = None
    failures: List[str] = field(default_factory=list)
    skipped: str = ""
    errors: List[str] = field(default_factory=list)  # the agent's last_error as it changed during the fault


def cpu_times() -> List[int]:
    """The machine's CPU time so far by kind (/proc/stat's "cpu" line: user,
    nice, system, idle, iowait, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:9]]


def cpu_shares(before: List[int], after: List[int]) -> Tuple[float, float, float]:
    """Of the machine's CPU time between two cpu_times(): the share busy in
    processes (user, nice, system), in interrupts (irq, softirq), and stolen
    by the hypervisor (steal)."""
    d = [b - a for a, b in zip(before, after)]
    total = max(sum(d), 1)
    return (sum(d[0:3]) / total, (d[5] + d[6]) / total, d[7] / total)


def quantile(values: List[int], q: float) -> int:
    if not values:
        return 0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Runner:
    def __init__(self, lab: Lab, pg: Postgres, gacd: str, trainer: str, pre: float, fault: float, post: float,
                 rate: float, ack_timeout_ms: Optional[int]) -> None:
        self.lab, self.pg, self.gacd, self.trainer = lab, pg, gacd, trainer
        self.ack_timeout_ms = ack_timeout_ms
        self.pre, self.fault, self.post, self.rate = pre, fault, post, rate
        self.tokens = os.path.join(lab.work, "tokens")
        with open(self.tokens, "w") as f:
            f.write(f"writer {WRITER} write exp-*\nreader {READER} read *\n")
        os.chmod(self.tokens, 0o600)

    def start_replica(self, host: str, db: str, case_dir: str) -> subprocess.Popen:
        ready = os.path.join(case_dir, f"{host}.ready")
        p = self.lab.spawn(host, [self.gacd, f"--listen={self.lab.ip[host]}:{PORT}", "--http-listen=",
                                  f"--store={self.pg.uri(db)}", f"--token-file={self.tokens}",
                                  f"--ready-file={ready}", "--drain-timeout=1s"],
                           os.path.join(case_dir, f"gacd-{host}.log"))
        deadline = time.monotonic() + 30
        while not os.path.exists(ready):
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gacd on {host} did not start: " +
                                   open(os.path.join(case_dir, f"gacd-{host}.log")).read())
            time.sleep(0.02)
        return p

    def inject(self, kind: str) -> None:
        lab = self.lab
        if kind == "partition":
            lab.drop("t", ["r0", "r1"])
        elif kind == "one_replica":
            lab.drop("t", ["r0"])
        elif kind == "replica_pg":
            lab.drop("r0", ["pg"])
        elif kind == "asymmetric":
            lab.drop("t", ["r0", "r1"], inbound=True, outbound=False)
        elif kind == "loss":
            lab.lose("t", ["r0", "r1"], 5)
        elif kind == "slow":
            lab.qdisc("t", ["tbf", "rate", "256kbit", "burst", "16kb", "latency", "200ms"])
        elif kind == "netem":
            lab.qdisc("t", ["netem", "delay", "80ms", "20ms", "loss", "1%"])
        else:
            raise ValueError(kind)

    def run_case(self, case: Case) -> Result:
        case_dir = os.path.join(self.lab.work, case.name)
        os.makedirs(case_dir)
        db = f"case_{case.name}"
        self.pg.sql("postgres", f"CREATE DATABASE {db}")
        replicas = [self.start_replica(h, db, case_dir) for h in ("r0", "r1")]
        spool = os.path.join(case_dir, "spool")
        if case.tmpfs:
            self.lab.tmpfs(spool, case.tmpfs)
        fault_s = self.fault * case.fault_scale
        seconds = self.pre + fault_s + self.post
        ready, out = os.path.join(case_dir, "trainer.ready"), os.path.join(case_dir, "trainer.json")
        addresses = f"{self.lab.ip['r0']}:{PORT},{self.lab.ip['r1']}:{PORT}"
        trainer = self.lab.spawn("t", [self.trainer, f"--address={addresses}", f"--token={WRITER}",
                                       f"--reader-token={READER}", f"--run=exp-{case.name}", f"--spool-dir={spool}",
                                       f"--spool-max-bytes={case.spool_max_bytes}",
                                       f"--queue-capacity={case.queue_capacity}", f"--seconds={seconds}",
                                       f"--rate={self.rate}", f"--decide-deadline-ms={DECIDE_DEADLINE_MS}",
                                       f"--ready={ready}", f"--out={out}", "--flush-seconds=120",
                                       *([f"--ack-timeout-ms={self.ack_timeout_ms}"] if self.ack_timeout_ms else [])],
                                 os.path.join(case_dir, "trainer.log"))
        result = Result(case, fault_s)
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(ready):
                if trainer.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("fault_trainer did not start: " + open(os.path.join(case_dir, "trainer.log")).read())
                time.sleep(0.02)
            time.sleep(self.pre)
            fault_ns = time.monotonic_ns()
            cpu_at_fault = cpu_times()
            try:
                self.inject(case.inject)
            except CannotTestHere as e:
                result.skipped = str(e)
                return result
            time.sleep(fault_s)
            self.lab.heal()
            heal_ns = time.monotonic_ns()
            result.cpu = cpu_shares(cpu_at_fault, cpu_times())
            trainer.wait(timeout=seconds + 180)
        finally:
            self.lab.heal()
            self.lab.stop(trainer, signal.SIGKILL)
            for p in replicas:
                self.lab.stop(p)
            if case.tmpfs:
                self.lab.unmount(spool)
        if trainer.returncode != 0:
            result.failures.append(f"fault_trainer exited with {trainer.returncode}: " +
                                   open(os.path.join(case_dir, "trainer.log")).read()[-2000:])
            return result
        with open(out) as f:
            data = json.load(f)
        self.check(case, data, fault_ns, heal_ns, result)
        return result

    def check(self, case: Case, d: dict, fault_ns: int, heal_ns: int, r: Result) -> None:
        c = d["counters"]
        refused = set(d["refused"])
        stored = d["stored"]
        r.produced = d["steps"]
        r.stored = len(set(stored))
        r.duplicated = len(stored) - len(set(stored))
        r.lost = r.produced - r.stored
        r.counted = c["dropped_queue_full"] + c["dropped_at_close"]
        expected = set(range(r.produced)) - refused
        fail = r.failures.append
        if d["read_error"]:
            fail(f"cannot read the store back: {d['read_error']}")
        if not d["flushed"]:
            fail(f"not everything was acknowledged within 120 s of the heal: {d['last_error']}")
        if set(stored) != expected:
            missing, extra = len(expected - set(stored)), len(set(stored) - expected)
            fail(f"stored steps differ from the produced minus the refused: {missing} missing, {extra} unexpected")
        if r.duplicated:
            fail(f"{r.duplicated} steps stored twice")
        if c["dropped_at_close"]:
            fail(f"{c['dropped_at_close']} records discarded at close")
        if r.lost != r.counted:
            fail(f"{r.lost} steps lost but {r.counted} counted")
        if case.expect_refusals:
            if not refused:
                fail("the fault was expected to exceed the spool's bound, but nothing was refused")
            if d["exported_dropped"] != len(refused):
                fail(f"agent_records_dropped exported as {d['exported_dropped']}, {len(refused)} refused")
            if "Enqueue refused" not in d["last_error"]:
                fail(f"last_error does not report the refusals: {d['last_error']}")
        elif refused:
            fail(f"{len(refused)} records refused")
        # The training thread during the fault.
        during = [ns for t, ns in zip(d["enqueue_t"], d["enqueue_ns"]) if fault_ns <= t <= heal_ns]
        r.p99_us = quantile(during, 0.99) / 1e3
        # The steps that made no Decide call first (the trainer decides on
        # every DECIDE_EVERY-th step, before its Enqueue).
        r.p99_no_decide_us = quantile([ns for i, (t, ns) in enumerate(zip(d["enqueue_t"], d["enqueue_ns"]))
                                       if fault_ns <= t <= heal_ns and i % DECIDE_EVERY], 0.99) / 1e3
        r.max_us = max(during, default=0) / 1e3
        # Whether the thread was preempted, waited or took a page fault
        # during each call (fault_trainer's bits 2, 1, 4): on a 2-core host
        # running every process of the lab, preemptions show in the wall time
        # of any call, and a first touch of memory costs a fault.
        switched = [(ns, sw) for t, ns, sw in zip(d["enqueue_t"], d["enqueue_ns"], d["enqueue_switched"])
                    if fault_ns <= t <= heal_ns]
        r.p99_quiet_us = quantile([ns for ns, sw in switched if sw == 0], 0.99) / 1e3
        over = [sw for ns, sw in switched if ns > ENQUEUE_TARGET_US * 1e3]
        r.slow = (sum(1 for sw in over if sw & 2), sum(1 for sw in over if (sw & 3) == 1),
                  sum(1 for sw in over if sw == 4), sum(1 for sw in over if sw == 0))
        r.baseline_p99_us = quantile([ns for t, ns in zip(d["baseline_t"], d["baseline_ns"])
                                      if fault_ns <= t <= heal_ns], 0.99) / 1e3
        r.ratio = r.p99_us / r.baseline_p99_us if r.baseline_p99_us > 0 else float("nan")
        decides = [(ns, ok) for t, ns, ok in zip(d["decide_t"], d["decide_ns"], d["decide_ok"])
                   if fault_ns <= t <= heal_ns]
        r.decides = len(decides)
        r.fallbacks = sum(1 for _, ok in decides if not ok)
        r.decide_max_ms = max((ns for ns, _ in decides), default=0) / 1e6
        if d["fallbacks"] != sum(1 for ok in d["decide_ok"] if not ok):
            fail("fallbacks miscounted")
        r.errors = [p[5] for p in d["progress"] if fault_ns <= p[0] <= heal_ns + 1e9 and p[5]]
        # Which replica the sender streamed to during the fault.
        if case.expect_replica:
            want = f"{self.lab.ip[case.expect_replica]}:{PORT}"
            seen = {p[4] for p in d["progress"] if fault_ns <= p[0] <= heal_ns}
            if want not in seen:
                fail(f"the sender never moved to {case.expect_replica} during the fault (saw {sorted(seen)})")
        # Time to recover: from the heal until everything produced before it
        # is acknowledged.
        before = [p for p in d["progress"] if p[0] <= heal_ns]
        if before:
            target = before[-1][1]
            after = [p for p in d["progress"] if p[0] >= heal_ns and p[2] >= target]
            if after:
                r.recovery_s = (after[0][0] - heal_ns) / 1e9


def table(results: List[Result], header: str) -> str:
    lines = [header, "",
             "| fault | how long | steps produced | stored | lost (counted) | duplicated | "
             "Enqueue during the fault: p99 (steps without a Decide; calls without a context switch or page fault) / max | "
             "baseline call p99 (Enqueue p99 ÷ it) | "
             "Enqueue calls over 5 µs: preempted, waited, page fault, none of these | "
             "CPU during the fault: busy, interrupts, stolen | "
             "Decide during the fault: calls, fallbacks, slowest | recovery after the heal | result |",
             "|---|---:|---:|---:|---:|---:|---|---|---|---|---|---:|---|"]
    for r in results:
        rec = "—" if r.recovery_s is None else f"{r.recovery_s:.2f} s"
        if r.skipped:
            lines.append(f"| {r.case.title} | — | — | — | — | — | — | — | — | — | — | — | not run: {r.skipped} |")
            continue
        lines.append(
            f"| {r.case.title} | {r.fault_s:.0f} s | {r.produced:,} | {r.stored:,} | {r.lost:,} ({r.counted:,}) | "
            f"{r.duplicated} | {r.p99_us:.1f} µs ({r.p99_no_decide_us:.1f} µs; {r.p99_quiet_us:.1f} µs) / {r.max_us:.0f} µs | "
            f"{r.baseline_p99_us:.1f} µs ({r.ratio:.2f}×) | "
            f"{r.slow[0]:,}, {r.slow[1]:,}, {r.slow[2]:,}, {r.slow[3]:,} | "
            f"{r.cpu[0]:.0%}, {r.cpu[1]:.1%}, {r.cpu[2]:.1%} | "
            f"{r.decides}, {r.fallbacks}, "
            f"{r.decide_max_ms:.0f} ms | {rec} | {'pass' if not r.failures else 'FAIL'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gacd", required=True)
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--short", action="store_true", help="each fault a few seconds (ctest)")
    ap.add_argument("--case", action="append", help="run only these cases (names: " +
                    ", ".join(c.name for c in CASES) + ")")
    ap.add_argument("--fault-seconds", type=float, help="how long each fault lasts")
    ap.add_argument("--ack-timeout-ms", type=int, help="the agent's ack_timeout (short form: 1000; else its default)")
    ap.add_argument("--report", help="write the table here (Markdown)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, trainer output)")
    args = ap.parse_args()
    reason = why_not()
    if reason:
        print(f"faults: skipped: {reason}", file=sys.stderr)
        return SKIP
    cases = [c for c in CASES if not args.case or c.name in args.case]
    if args.case and len(cases) != len(args.case):
        print(f"faults: unknown case among {args.case}", file=sys.stderr)
        return 2
    fault = args.fault_seconds or (3.0 if args.short else 60.0)
    pre, post = (1.5, 2.0) if args.short else (5.0, 10.0)
    rate = 400.0
    # Short faults need a short acknowledgement timeout to show the move to
    # the other replica; the full form keeps the agent's default.
    ack_timeout_ms = args.ack_timeout_ms or (1000 if args.short else None)

    remove_leftovers()
    work = tempfile.mkdtemp(prefix="gac-faults-")
    os.chmod(work, 0o755)  # PostgreSQL runs as its own user below it
    with open(os.path.join(work, "owner"), "w") as f:
        f.write(f"{os.getpid()}\n")
    lab = Lab(work)

    def on_signal(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    results: List[Result] = []
    try:
        lab.up()
        pg = Postgres(lab)
        pg.start()
        runner = Runner(lab, pg, args.gacd, args.trainer, pre, fault, post, rate, ack_timeout_ms)
        for case in cases:
            log(f"faults: {case.name}: {case.title}, {fault:.0f} s")
            try:
                r = runner.run_case(case)
            except Exception as e:  # a broken case is a failed case; the others still run
                r = Result(case, fault, failures=[f"{type(e).__name__}: {e}"])
            results.append(r)
            if r.skipped:
                log(f"faults: {case.name}: not run: {r.skipped}")
                continue
            seen = set()
            for e in r.errors:  # each kind of message once (counts vary)
                shape = re.sub(r"[0-9]+", "N", e)
                if shape not in seen:
                    seen.add(shape)
                    log(f"faults: {case.name}: agent: {e}")
            for f in r.failures:
                log(f"faults: {case.name}: FAIL: {f}")
            log(f"faults: {case.name}: {'pass' if not r.failures else 'FAIL'}: produced {r.produced}, "
                f"stored {r.stored}, lost {r.lost} (counted {r.counted}), duplicated {r.duplicated}, "
                f"Enqueue p99 {r.p99_us:.1f} us ({r.p99_no_decide_us:.1f} us without a Decide, "
                f"{r.p99_quiet_us:.1f} us without a context switch or page fault) max {r.max_us:.0f} us, "
                f"baseline p99 {r.baseline_p99_us:.1f} us (Enqueue {r.ratio:.2f}x), "
                f"over 5 us: {r.slow[0]} preempted {r.slow[1]} waited {r.slow[2]} page fault {r.slow[3]} none, "
                f"CPU busy {r.cpu[0]:.0%} interrupts {r.cpu[1]:.1%} stolen {r.cpu[2]:.1%}, "
                f"Decide {r.decides} calls "
                f"{r.fallbacks} fallbacks slowest {r.decide_max_ms:.0f} ms, recovery "
                f"{'-' if r.recovery_s is None else f'{r.recovery_s:.2f} s'}")
    finally:
        lab.down()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"faults: work directory kept: {work}")
    text = table(results, f"Faults ({'short' if args.short else 'full'} form, rate {rate:.0f} steps/s, "
                          f"Decide every 5th step with a {DECIDE_DEADLINE_MS} ms deadline, ack_timeout "
                          f"{f'{ack_timeout_ms} ms' if ack_timeout_ms else 'default'})")
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    return 0 if results and all(not r.failures for r in results) and any(not r.skipped for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
