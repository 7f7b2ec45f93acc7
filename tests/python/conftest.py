"""Fixtures of the Python tests: real gacd processes on OS-chosen loopback
ports, what gacd stored, read back through its gRPC QueryService (the
gacd_steps helper), groups of worker processes (run_ranks), and the count of
the agents an attach makes (agents_made). ctest sets GAC_GACD and GAC_GACD_STEPS to the built
binaries and PYTHONPATH to the staged package."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import pytest

GACD = os.environ.get("GAC_GACD", "")
GACD_STEPS = os.environ.get("GAC_GACD_STEPS", "")
SOURCE_DIR = Path(os.environ.get("GAC_SOURCE_DIR", Path(__file__).resolve().parents[2]))

HERE = Path(__file__).resolve().parent


def run_ranks(tmp_path: Path, world: int, worker: str, args: Sequence[str],
              env: Optional[Dict[str, str]] = None) -> List[Any]:
    """Runs tests/python/`worker` as ranks 0..world-1 (argv: RANK WORLD
    INIT_FILE OUT_FILE *args), each logging to tmp_path/rank<r>.log, and
    returns what each saved with torch.save to its OUT_FILE. A rank that
    fails fails the test with its log; one that hangs, after 300 s."""
    import torch

    procs = []
    penv = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]), **(env or {}))
    for rank in range(world):
        with open(tmp_path / f"rank{rank}.log", "wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, str(HERE / worker), str(rank), str(world), str(tmp_path / "init"),
                 str(tmp_path / f"rank{rank}.pt"), *args], stdout=log, stderr=subprocess.STDOUT, env=penv))
    for rank, p in enumerate(procs):
        try:
            rc = p.wait(timeout=300)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert rc == 0, (tmp_path / f"rank{rank}.log").read_text()
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture
def agents_made(monkeypatch: pytest.MonkeyPatch) -> List[Any]:
    """Every gac.Agent the package makes while the test runs (all are made in
    gac._attachment.build_attachment: test_attach_control.py checks that):
    an attach, an integration's included, makes one."""
    import gac
    import gac._attachment
    made: List[Any] = []

    class Counted(gac.Agent):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(gac._attachment, "agent_class", lambda: Counted)
    return made


needs_gacd = pytest.mark.skipif(not (GACD and GACD_STEPS), reason="built without gacd (GAC_WITH_SERVER=OFF)")


class Gacd:
    """A gacd process with an SQLite store in `data_dir`, listening on
    127.0.0.1 (port 0 on the first start: the OS chooses; the same port on
    restarts, so that clients reconnect)."""

    def __init__(self, data_dir: Path, extra_args: Optional[List[str]] = None) -> None:
        self.data_dir = data_dir
        self.extra_args = extra_args or []
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.port = 0
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        ready = self.data_dir / "ready"
        if ready.exists():
            ready.unlink()
        self.starts += 1
        log = open(self.data_dir / f"gacd-{self.starts}.log", "wb")
        self.proc = subprocess.Popen(
            [GACD, "--insecure", f"--listen=127.0.0.1:{self.port}", "--http-listen=",
             f"--store=sqlite:{self.data_dir}", f"--ready-file={ready}", *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"gacd exited with {self.proc.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"gacd not ready after {timeout} s: {self.log()}")
            time.sleep(0.01)
        for line in ready.read_text().splitlines():
            if line.startswith("grpc="):
                self.port = int(line.rsplit(":", 1)[1])

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP, returning once every thread of gacd is stopped."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        tasks = Path(f"/proc/{self.proc.pid}/task")
        deadline = time.monotonic() + 10
        while not all(_state(t) == "T" for t in tasks.iterdir()):
            assert time.monotonic() < deadline, "gacd did not stop"
            time.sleep(0.001)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.data_dir.glob("gacd-*.log")))

    def steps(self, run: str) -> List[Dict[str, object]]:
        """Every stored step record of `run`, as protobuf's JSON mapping."""
        out = subprocess.run([GACD_STEPS, self.address, run], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"gacd_steps failed: {out.stderr}")
        return [json.loads(line) for line in out.stdout.splitlines()]


def _state(task: Path) -> str:
    """A thread's state letter from /proc/PID/task/TID/stat ("T": stopped)."""
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "T"  # the thread ended


@pytest.fixture
def gacd(tmp_path: Path) -> Iterator[Gacd]:
    if not (GACD and GACD_STEPS):
        pytest.skip("built without gacd (GAC_WITH_SERVER=OFF)")
    server = Gacd(tmp_path / "gacd")
    server.data_dir.mkdir()
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.resume()
        server.stop()
