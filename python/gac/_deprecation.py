"""The package's former names, and the one warning they all give.

Every deprecated alias of gac's Python API is a row of :data:`ALIASES`: its
former name, the name that replaces it and the release that removes it
(docs/ARCHITECTURE.md's glossary lists the same rows). Using one calls
:func:`warn_deprecated`, which issues a ``DeprecationWarning`` at the
caller's line saying all three: "StepReport.groups is deprecated; use
StepReport.layers. It will be removed in gac 0.3.0."

Where each alias is kept: ``gac.GroupStats`` by the package's
``__getattr__``; ``StepReport.groups`` and ``StepReport.seconds`` by
warning properties that :func:`extend_step_report` puts on the native
class (``gac/__init__.py`` calls it); ``Agent(groups=...)`` and
``RemoteController.set_run_thresholds`` by the native modules themselves
(python/src/agent_module.cc, transport_module.cc), which call
:func:`warn_deprecated` with the alias's key (``WarnDeprecated`` in
python/src/support.h). The warning, its text and its removal version live
here alone.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Dict, NamedTuple, Set, Type

if TYPE_CHECKING:
    from gac._controller import StepReport

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
    1 points at the function that calls this one, 2 at its caller; called
    from a native module, 1 points at the Python line that called into it."""
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
