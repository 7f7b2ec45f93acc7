"""The package's former names, and the one warning they all give.

Every deprecated alias of gac's Python API is a row of :data:`ALIASES`: its
former name, the name that replaces it and the release that removes it
(docs/ARCHITECTURE.md's glossary lists the same rows). Using one calls
:func:`warn_deprecated`, which issues a ``DeprecationWarning`` at the
caller's line saying all three: "StepReport.groups is deprecated; use
StepReport.layers. It will be removed in gac 0.3.0."

Some aliases belong to classes of the native modules; the functions below
put them on those classes (``gac/__init__.py`` does it for the step report,
``gac/_native.py`` for the agent and the remote controller when they load):
the warning, its text and its removal version live here alone.
"""

from __future__ import annotations

import functools
import warnings
from typing import TYPE_CHECKING, Callable, Dict, NamedTuple, Set, Type

from gac._errors import InvalidArgumentError, StatusCode

if TYPE_CHECKING:
    from gac._agent import Agent
    from gac._controller import AlphaMode, StepReport
    from gac._transport import RemoteController

# The release that removes the aliases of release 0.1.
REMOVED_IN = "0.3.0"


class Alias(NamedTuple):
    """A former name: ``old`` is deprecated, ``new`` replaces it (``note``
    says how when it is not a plain rename), ``removed_in`` is the release
    without it."""

    old: str
    new: str
    removed_in: str = REMOVED_IN
    note: str = ""


ALIASES: Dict[str, Alias] = {a.old: a for a in (
    Alias("gac.GroupStats", "gac.LayerStats"),
    Alias("Agent(groups=...)", "Agent(layers=...)"),
    Alias("StepReport.groups", "StepReport.layers"),
    Alias("StepReport.seconds", "StepReport.agent_overhead_seconds"),
    Alias("RemoteController.set_run_thresholds", "set_thresholds",
          note=" (which keeps the run's mode unless mode= is given; the alias also set it to 'remote')"),
)}


def warn_deprecated(old: str, *, stacklevel: int = 1) -> None:
    """Warns (``DeprecationWarning``) that the alias ``old``, a key of
    :data:`ALIASES`, was used. ``stacklevel`` as ``warnings.warn``'s, counted from the caller:
    1 points at the function that calls this one, 2 at its caller."""
    alias = ALIASES[old]
    warnings.warn(f"{alias.old} is deprecated; use {alias.new}{alias.note}. It will be removed in gac "
                  f"{alias.removed_in}.", DeprecationWarning, stacklevel=stacklevel + 1)


def renamed_property(old: str, attribute: str) -> "property":
    """A read-only property for the alias ``old`` (``Class.name``) of
    ``attribute``: it warns, then returns ``self.attribute``."""
    alias = ALIASES[old]

    def get(self: object) -> object:
        warn_deprecated(old, stacklevel=2)
        return getattr(self, attribute)

    get.__name__ = old.rpartition(".")[2]
    return property(get, doc=f"Deprecated (removed in gac {alias.removed_in}): the former name of {attribute}.")


# The classes that carry their aliases already (each is extended once).
_extended: Set[type] = set()


def extend_step_report(cls: "Type[StepReport]") -> None:
    """``StepReport.groups`` (``layers``) and ``StepReport.seconds``
    (``agent_overhead_seconds``): warning properties on the native class."""
    if cls in _extended:
        return
    setattr(cls, "groups", renamed_property("StepReport.groups", "layers"))
    setattr(cls, "seconds", renamed_property("StepReport.seconds", "agent_overhead_seconds"))
    _extended.add(cls)


def extend_agent(cls: "Type[Agent]") -> None:
    """``Agent(groups=...)``: the constructor takes the former name of
    ``layers``, warns and passes it on as ``layers``."""
    if cls in _extended:
        return
    native_init: Callable[..., None] = getattr(cls, "__init__")

    @functools.wraps(native_init)
    def __init__(self: "Agent", *args: object, groups: object = None, **kwargs: object) -> None:
        if groups is not None:
            warn_deprecated("Agent(groups=...)", stacklevel=2)
            if kwargs.get("layers") is not None:
                raise InvalidArgumentError("give layers or its deprecated name groups, not both",
                                           StatusCode.INVALID_ARGUMENT)
            kwargs["layers"] = groups
        native_init(self, *args, **kwargs)

    setattr(cls, "__init__", __init__)
    _extended.add(cls)


def extend_remote_controller(cls: "Type[RemoteController]") -> None:
    """``RemoteController.set_run_thresholds``: ``set_thresholds`` with the
    run switched to remote mode, after the warning."""
    if cls in _extended:
        return
    native: Callable[..., None] = getattr(cls, "set_run_thresholds")

    @functools.wraps(native)
    def set_run_thresholds(self: "RemoteController", c_low: float, c_high: float, alpha_mode: "AlphaMode" = "paper",
                           reason: str = "") -> None:
        warn_deprecated("RemoteController.set_run_thresholds", stacklevel=2)
        self.set_thresholds(c_low, c_high, alpha_mode, reason, mode="remote")

    setattr(cls, "set_run_thresholds", set_run_thresholds)
    _extended.add(cls)

