"""``requestState`` across replicas: one key every replica shares, each round run once.

A multi-round call (2026-07-28) hands the client a sealed ``requestState``
that it sends back, to whichever replica the balancer picks. Two things make
that safe behind a balancer, each in its own module:

- :mod:`.keyring`: :class:`StoreKeyRing`, the sealing key every replica finds
  in the store (derived from an operator's secret when one is given);
- :mod:`.rounds`: :class:`SingleUseBoundary`, each token's round run once on
  whichever replica it reaches, a repeat answered again.
"""

from __future__ import annotations

from .keyring import DEFAULT_REFRESH, SECRET_VARIABLE, Secret, StoreKeyRing
from .rounds import KEPT_ANSWER, REPEATED, REQUEST_STATE_USED, SingleUseBoundary

__all__ = [
    "DEFAULT_REFRESH",
    "KEPT_ANSWER",
    "REPEATED",
    "REQUEST_STATE_USED",
    "SECRET_VARIABLE",
    "Secret",
    "SingleUseBoundary",
    "StoreKeyRing",
]
