"""gacd's side of a trainer integration, written once for all of them.

The options that point a trainer's ranks at gacd (:data:`GACD_OPTIONS`:
``address``, ``run``, ``token``, ``tls``, ``spool_dir``, ``deadline``,
``all_ranks``) are checked together by :class:`GacdLink`, which then makes
what they ask for:

- in remote mode, a :class:`gac.RemoteController` on every rank, the
  agent's decision source (before the agent, which needs it);
- a :class:`gac.Telemetry` on rank 0, or on every rank with ``all_ranks``
  (after the agent, so that an option the agent refuses leaves no sender
  and no spool behind).

The rank and world size are torch.distributed's once it is initialised,
else the launcher's ``RANK`` and ``WORLD_SIZE`` (torchrun, accelerate and
DeepSpeed set them), else 0 and 1.

Each integration names the options its own way (``GacCallback(address=...)``,
verl's ``gac_address`` key): its :class:`Spelling` puts the user's names into
the errors.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple, Optional, Tuple, Union

from gac._attachment import Attachment, Scalars, build_attachment
from gac._native import remote_controller_class, telemetry_class

if TYPE_CHECKING:
    from gac._plan import AttachPlan
    from gac._transport import Telemetry

# The options of GacdLink, as an integration's users give them.
GACD_OPTIONS = ("address", "run", "token", "tls", "spool_dir", "deadline", "all_ranks")

Tls = Union[str, bytes, "os.PathLike[str]", None]
Path = Union[str, "os.PathLike[str]", None]


class Spelling(NamedTuple):
    """How an integration's users write an option ``name``:
    ``prefix + name`` as a subject ("address must be a str"),
    ``prefix + name + suffix`` as an object ("needs address="). ``source``
    says how else remote mode gets a decision source, if it can."""

    prefix: str = ""
    suffix: str = "="
    source: str = " or decision_source="

    def name(self, option: str) -> str:
        return self.prefix + option

    def given(self, option: str) -> str:
        return self.prefix + option + self.suffix


# Keyword arguments (GacCallback, gac.integrations.megatron).
KEYWORDS = Spelling()
# Configuration keys gac_<name> (verl's override_optimizer_config), where no decision source can be given.
CONFIG_KEYS = Spelling("gac_", "", "")


class GacdLink:
    """Where an integration's ranks send their reports and, in remote mode,
    ask for decisions: gacd at ``address`` (``host:port`` or a list),
    under the run id ``run``, with ``token`` and ``tls`` (PEM roots), the
    Telemetry's ``spool_dir``, the Decide ``deadline`` in seconds, and
    Telemetry on every rank with ``all_ranks``. Or no gacd (``address``
    None), with the caller's own ``telemetry`` or none.

    Raises TypeError / ValueError for options that do not go together,
    before anything is made.
    """

    def __init__(self, address: Optional[str] = None, run: Optional[str] = None, *, token: Optional[str] = None,
                 tls: Tls = None, spool_dir: Path = None, deadline: float = 0.05, all_ranks: bool = False,
                 telemetry: Optional[Telemetry] = None, spelling: Spelling = KEYWORDS) -> None:
        s = spelling
        if address is not None and not isinstance(address, str):
            raise TypeError(f"{s.name('address')} must be a str (host:port), got {type(address).__name__}")
        if address is not None and not isinstance(run, str):
            raise ValueError(f"{s.given('address')} needs {s.given('run')} (the run id the steps are stored under)")
        if address is None and run is not None:
            raise ValueError(f"{s.given('run')} needs {s.given('address')} (gacd's host:port, where the run is)")
        if address is not None and telemetry is not None:
            raise ValueError(f"pass {s.given('address')} (a Telemetry is made) or telemetry=, not both")
        if not isinstance(all_ranks, bool):
            raise TypeError(f"{s.name('all_ranks')} must be a bool, got {type(all_ranks).__name__}")
        self.address = address
        self.run = run or ""
        self.token = token
        self.tls = tls
        self.spool_dir = spool_dir
        self.deadline = deadline
        self.all_ranks = all_ranks
        self.spelling = spelling
        self._telemetry = telemetry
        self.made_telemetry = False  # True once telemetry() made one: the integration closes it

    def decided_by_gacd(self, plan: AttachPlan) -> AttachPlan:
        """``plan`` with a RemoteController to gacd as the new agent's
        decision source when the plan decides remotely and has none; the
        plan as it is otherwise. Raises ValueError when it needs one and
        there is no address."""
        given = plan.agent is not None or plan.agent_options.get("decision_source") is not None
        if plan.first_mode != "remote" or given:
            return plan
        if self.address is None:
            s = self.spelling
            raise ValueError(f"{s.name('mode')}='remote' needs {s.given('address')} (gacd decides){s.source}")
        rank, _ = rank_and_world_size()
        source = remote_controller_class()(self.address, self.run, rank=rank, token=self.token, tls=self.tls,
                                           deadline=self.deadline)
        return plan.with_options({"decision_source": source})

    def telemetry(self) -> Optional[Telemetry]:
        """This rank's Telemetry: the caller's; else, with an address, one
        made on rank 0 (on every rank with ``all_ranks``) and kept; else None."""
        if self._telemetry is not None or self.address is None:
            return self._telemetry
        rank, world_size = rank_and_world_size()
        if rank != 0 and not self.all_ranks:
            return None
        self._telemetry = telemetry_class()(self.address, self.run, rank=rank, world_size=world_size,
                                            spool_dir=self.spool_dir, token=self.token, tls=self.tls)
        self.made_telemetry = True
        return self._telemetry

    def attachment(self, plan: AttachPlan, *, scalars: Optional[Scalars] = None) -> Attachment:
        """The Attachment of ``plan``, wired to gacd: its decision source
        (:meth:`decided_by_gacd`), its agent, then its reports sent to this
        rank's :meth:`telemetry` with ``scalars()``."""
        attachment = build_attachment(self.decided_by_gacd(plan), scalars=scalars)
        attachment.telemetry = self.telemetry()
        return attachment


def rank_and_world_size() -> Tuple[int, int]:
    """This process's rank and the world size (the module's text says whence)."""
    import torch.distributed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
