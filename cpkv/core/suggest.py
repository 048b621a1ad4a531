"""``did you mean ...?`` for names a user may mistype: config keys, registry names, columns."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: object, allowed: Iterable[object]) -> str:
    """``"; did you mean 'page_size'?"`` when ``name`` is close to one of ``allowed``
    (difflib's ratio >= 0.6), else ``""``: a fragment to put after an error's first clause."""
    choices = [str(a) for a in allowed]
    close = difflib.get_close_matches(str(name), choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
