"""10,000 steps without memory growth: after a warm-up, neither the
process's resident memory nor the number of objects Python tracks grows
over 10,000 agent steps (with their reports, per-layer statistics and
dicts), nor over 10,000 steps streamed to a real gacd."""

from __future__ import annotations

import ctypes
import gc
import os
from typing import Callable, List, Tuple

import torch

import gac
from conftest import Gacd

STEPS = 10_000
# A leak of 50 bytes per step would be 500 KB over the steps.
MAX_RSS_GROWTH = 512 * 1024
MAX_OBJECT_GROWTH = 100


def rss_bytes() -> int:
    """Resident memory after returning free heap pages to the system
    (malloc_trim): without it, glibc's per-thread arenas (the telemetry's
    sender thread, gRPC's) make RSS swing by about a megabyte either way."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def model() -> Tuple[List[torch.nn.Parameter], List[torch.Tensor], List[torch.Tensor]]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(64)) for _ in range(50)]
    a = [torch.randn(64) for _ in params]
    b = [0.3 * x + torch.randn(64) for x in a]  # cosine with a about 0.29: project
    return params, a, b


def measure(step_fn: Callable[[int], None], first: int) -> Tuple[int, int]:
    """(RSS growth, tracked-object growth) over STEPS steps after a warm-up
    of 2,000 steps."""
    for k in range(first, first + 2000):
        step_fn(k)
    rss0, objects0 = rss_bytes(), len(gc.get_objects())
    for k in range(first + 2000, first + 2000 + STEPS):
        step_fn(k)
    return rss_bytes() - rss0, len(gc.get_objects()) - objects0


def test_agent_steps_do_not_grow_memory() -> None:
    params, a, b = model()
    agent = gac.Agent(0.05, 0.99, layers={"first": params[:10], "rest": params[10:]}, num_threads=2)
    regimes = set()

    def step(k: int) -> None:
        for p, g in zip(params, a if k % 2 else b):
            p.grad = g.clone()
        r = agent.step(k, params)
        regimes.add(r.regime)
        r.to_dict()
        r.layers["first"].cosine  # noqa: B018 - builds the layer objects

    rss, objects = measure(step, 1)
    assert "project" in regimes
    assert rss <= MAX_RSS_GROWTH, f"RSS grew by {rss} bytes over {STEPS} steps"
    assert objects <= MAX_OBJECT_GROWTH, f"{objects} more tracked objects after {STEPS} steps"


def test_streamed_steps_do_not_grow_memory(gacd: Gacd) -> None:
    params, a, b = model()
    agent = gac.Agent(0.05, 0.99)
    with gac.Telemetry(gacd.address, "memory-run", flush_interval=0.01) as telemetry:
        def step(k: int) -> None:
            for p, g in zip(params, a if k % 2 else b):
                p.grad = g.clone()
            assert telemetry.send(agent.step(k, params), scalars={"reward": k * 1e-3}, staleness=k % 4)
            if k % 1000 == 0:
                assert telemetry.flush(60)

        rss, objects = measure(step, 1)
        assert telemetry.flush(60)
        c = telemetry.counters
        assert c.records_acknowledged == c.enqueued == STEPS + 2000 and c.dropped_queue_full == 0
    assert rss <= MAX_RSS_GROWTH, f"RSS grew by {rss} bytes over {STEPS} streamed steps"
    assert objects <= MAX_OBJECT_GROWTH
