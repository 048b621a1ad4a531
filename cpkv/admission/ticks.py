"""The tick loop: repeated scheduling passes over what is still waiting, on either backend.

Tick conventions (the seed benchmark's model; both backends follow them):

* Tick ``k`` is one fresh ``PrefillAdder`` pass over the waiting queue, in queue order (FCFS
  as given), with the same running decodes every tick; the scheduler's sticky
  ``batch_is_full`` flag is cleared before every tick.
* Admitted requests leave the queue and keep their locks; a request cut by chunked prefill
  continues at the start of the next tick (``add_chunked_req``).
* Nothing is released between ticks by default: only L2 load-back takes allocator slots, and
  computed tokens are never charged to the allocator. With ``release_each_tick`` the
  requests whose prompt finished unlock their L1 tokens at the end of the tick.
* The run stops when no request waits and no chunk is pending, or after a tick that admits
  nothing (the tick is recorded: it shows the blocking budget).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence

from cpkv.admission.adder import PrefillAdderModel
from cpkv.admission.budgets import AdmitBudgets
from cpkv.admission.records import AdmitResult, TickRecord, summarize
from cpkv.core.registry import Registry
from cpkv.workload.request import Request

AdmitBackend = Callable[[Sequence[Request], AdmitBudgets], AdmitResult]

BACKENDS: Registry[AdmitBackend] = Registry("admission backend")


@BACKENDS.register("model", help="cpkv's PrefillAdder model (fast, CP shared-KV limits)")
def run_model(requests: Sequence[Request], budgets: AdmitBudgets) -> AdmitResult:
    """Run the tick loop on :class:`PrefillAdderModel`.

    The records hold no reference cycles, so the cyclic garbage collector is paused while
    they pile up (it would rescan them all, again and again). Before it is switched back on,
    ``gc.freeze()`` + ``gc.unfreeze()`` moves every live object straight into the oldest
    generation, which is where the run's records would end up anyway; only the repeated
    young-generation scans of them are skipped, nothing is leaked.
    """
    model = PrefillAdderModel(requests, budgets)
    ticks: list[TickRecord] = []
    has_work, run_pass, release = model.has_work, model.run_pass, model.release_finished
    release_each_tick = budgets.release_each_tick
    paused = gc.isenabled()
    gc.disable()
    try:
        while has_work():
            record = run_pass(len(ticks))
            ticks.append(record)
            if not record.accepted:
                break
            if release_each_tick:
                release()
    finally:
        if paused:
            gc.freeze()
            gc.unfreeze()
            gc.enable()
    done = tuple(ticks)
    return AdmitResult(done, summarize("model", len(requests), done, model.counts()))


BACKENDS.register(
    "sglang",
    "cpkv.admission.sglang.backend:run_sglang",
    help="the real sglang 0.5.23 PrefillAdder (needs sglang installed; no CP limits)",
)


def run_admission(
    requests: Sequence[Request], budgets: AdmitBudgets, backend: str = "model"
) -> AdmitResult:
    """Run ``requests`` through the named backend (``model`` or ``sglang``)."""
    return BACKENDS.get(backend)(requests, budgets)
