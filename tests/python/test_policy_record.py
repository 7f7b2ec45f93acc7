"""The policy-health signals as first-class fields of the step: given to
``Agent.step(policy=...)`` or ``Attachment.record_policy``, carried by the
report (its properties and ``to_dict()``) and stored by a real gacd as the
record's own fields; bad values refused before the step runs."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

import gac
import gac.rl
from conftest import Gacd

# The real-valued signals, as PolicySignals, the report and the record name them.
REALS = ["ess_token", "ess_sequence", "clip_fraction_low", "clip_fraction_high", "truncation_fraction",
         "log_ratio_max", "log_ratio_p99", "log_ratio_p1", "kl_k3", "log_ratio_abs_mean", "entropy_mean",
         "staleness_min", "staleness_mean", "staleness_max"]


def batch_signals(seed: int, **kwargs: Any) -> gac.rl.PolicySignals:
    """gac.rl's signals of a random masked batch, every input given."""
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 40
    old = -torch.rand(b, t, generator=g) * 3
    new = old + 0.3 * torch.randn(b, t, generator=g)
    mask = torch.rand(b, t, generator=g) < 0.8
    return gac.rl.signals(new, old, mask, advantages=torch.randn(b, generator=g), truncation=1.5,
                          entropies=torch.rand(b, t, generator=g), versions=[3, 4, 5, 5, 6, 6],
                          current_version=7, **kwargs)


PARAM = torch.zeros(64, requires_grad=True)


def one_param(value: float = 1.0) -> List[torch.Tensor]:
    """The one parameter every agent here steps over, with a gradient made from `value`."""
    PARAM.grad = torch.full((64,), value) + torch.arange(64.0) * 0.01 * value ** 2
    return [PARAM]


def test_the_signals_reach_the_report_and_its_dict() -> None:
    sig = batch_signals(1)
    assert all(getattr(sig, name) is not None for name in REALS)
    agent = gac.Agent(mode="monitor")
    report = agent.step(1, one_param(), policy=sig)
    assert report.policy_tokens == sig.tokens and report.policy_invalid is False
    for name in REALS:
        assert getattr(report, name) == getattr(sig, name), name
    logged = report.to_dict()
    assert logged["gac/policy_tokens"] == sig.tokens and logged["gac/policy_invalid"] == 0
    for name in REALS:
        assert logged[f"gac/{name}"] == getattr(sig, name), name
    # The next step without signals carries none.
    bare = agent.step(2, one_param(2.0))
    assert bare.policy_tokens is None and bare.policy_invalid is None
    assert all(getattr(bare, name) is None for name in REALS)
    assert not any(f"gac/{name}" in bare.to_dict() for name in REALS + ["policy_tokens", "policy_invalid"])


def test_an_invalid_batch_is_recorded_as_invalid_without_values() -> None:
    empty = gac.rl.signals(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    assert empty.invalid == "no token"
    report = gac.Agent(mode="monitor").step(1, one_param(), policy=empty)
    assert report.policy_invalid is True and report.policy_tokens == 0
    assert all(getattr(report, name) is None for name in REALS)
    assert report.to_dict()["gac/policy_invalid"] == 1


@pytest.mark.parametrize("change, error, match", [
    ({"tokens": -1}, ValueError, "tokens must be an integer >= 0"),
    ({"tokens": 2.5}, ValueError, "tokens must be an integer >= 0"),
    ({"ess_token": float("nan")}, ValueError, "policy.ess_token is not finite"),
    ({"kl_k3": float("inf")}, ValueError, "policy.kl_k3 is not finite"),
    ({"entropy_mean": "high"}, TypeError, "policy.entropy_mean must be a number or None"),
])
def test_bad_values_are_refused_before_the_step(change: Dict[str, Any], error: type, match: str) -> None:
    bad = dataclasses.replace(batch_signals(2), **change)
    agent = gac.Agent(mode="monitor")
    with pytest.raises(error, match=match):
        agent.step(1, one_param(), policy=bad)
    # Nothing happened: step 1 is still the first step (no reference yet).
    assert agent.step(1, one_param()).cosine is None


def test_an_object_that_is_not_signals_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="policy must be a gac.rl.PolicySignals .no attribute 'tokens' on a dict"):
        gac.Agent(mode="monitor").step(1, one_param(), policy={"ess_token": 0.5})


def test_the_attachment_hands_the_signals_to_the_next_step_only() -> None:
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    attachment = gac.attach(optimizer)
    sig = batch_signals(3)

    def update() -> gac.StepReport:
        optimizer.zero_grad()
        model(torch.randn(16, 8)).pow(2).mean().backward()
        optimizer.step()
        assert attachment.last_report is not None
        return attachment.last_report

    attachment.record_policy(batch_signals(4))
    attachment.record_policy(sig)  # replaces the first
    first = update()
    assert first.ess_token == sig.ess_token and first.policy_tokens == sig.tokens
    assert update().ess_token is None
    attachment.record_policy(sig)
    attachment.record_policy(None)
    assert update().policy_tokens is None
    with pytest.raises(TypeError, match="signals must be a gac.rl.PolicySignals or None, got dict"):
        attachment.record_policy({"ess_token": 1.0})  # type: ignore[arg-type]
    attachment.detach()


def test_gacd_stores_the_signals_as_the_records_fields(gacd: Gacd, tmp_path: Path) -> None:
    agent = gac.Agent(mode="monitor")
    sent: Dict[int, gac.rl.PolicySignals] = {}
    with gac.Telemetry(gacd.address, "py-policy", spool_dir=tmp_path / "spool") as t:
        for step in range(1, 31):
            if step == 7:
                sig = gac.rl.signals(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2))  # no token
            else:
                sig = batch_signals(step, clip_low=None if step % 3 == 0 else 0.2)
            sent[step] = sig
            report = agent.step(step, one_param(1.0 + step), policy=sig if step != 11 else None)
            assert t.send(report)
        assert t.flush(60), t.last_error
    stored = {int(r["step"]): r for r in gacd.steps("py-policy")}  # type: ignore[call-overload]
    assert sorted(stored) == list(range(1, 31))
    for step, r in stored.items():
        sig = sent[step]
        if step == 11:  # no signals given: none stored
            assert not any(name in r for name in REALS + ["policy_tokens", "policy_invalid"]), r
            continue
        assert int(r["policy_tokens"]) == sig.tokens  # type: ignore[arg-type]
        assert r["policy_invalid"] is (sig.invalid is not None)
        for name in REALS:
            want = getattr(sig, name)
            if want is None:
                assert name not in r, (step, name)
            else:
                assert math.isclose(float(r[name]), want, rel_tol=0, abs_tol=0), (step, name)  # type: ignore[arg-type]
    assert "clip_fraction_low" not in stored[3] and "clip_fraction_low" in stored[4]
