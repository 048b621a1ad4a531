"""Pipeline parallelism: ``pp`` stages of ``tp`` GPUs each, the layers split evenly over them.

An iteration's sequences (those that sample a token: ``head`` of them) are split into
``m = min(pp, head)`` micro-batches, each of ``⌈T/m⌉`` tokens, that follow one another through
the stages (vLLM's and SGLang's pipeline schedules keep ``pp`` batches in flight). A token's
round trip, from one iteration of its sequence to the next, is one micro-batch through every
stage plus the ``pp − 1`` activation transfers between them; while it travels the other
micro-batches fill the other stages. With the stages holding ``⌈layers/pp⌉`` layers at most,
the slowest stage paces a full pipeline, so the iteration takes::

    factor · (layers' time on ⌈T/m⌉ tokens + attention / m) + LM head on ⌈head/m⌉
    + (pp − 1) · transfer(⌈T/m⌉ · hidden · 2 bytes)

with ``factor = max(1, m·⌈layers/pp⌉ / layers)`` (1 when the layers divide evenly or the
pipeline is not full). One sequence (a batch-1 decode step) crosses every stage alone: the
time of the whole model on one GPU's share of it plus the transfers, the other stages idle
(the bubble); a pipeline gains throughput, not latency. A transfer is a send between two
GPUs: priced as a two-GPU all-reduce of the same bytes (each GPU of the ring sends the
message once), measured on the GPU's NVLink (Vidur's two-worker table).
"""

from __future__ import annotations


def micro_batches(pp: int, sequences: int) -> int:
    """How many micro-batches an iteration of ``sequences`` sampled sequences is split into."""
    return max(1, min(pp, sequences))


def stage_factor(layers: int, pp: int, micro: int) -> float:
    """How much slower than the average stage the slowest paces ``micro`` micro-batches."""
    return max(1.0, micro * -(-layers // pp) / layers)
