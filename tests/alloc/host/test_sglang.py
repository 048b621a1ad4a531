"""`impls: sglang` runs SGLang's real HostKVCache and agrees with the reference on FIFO."""

from __future__ import annotations

import random

import pytest

from cpkv.alloc.host.impls import HOST_IMPLS
from cpkv.alloc.host.layouts import free_slots

pytestmark = pytest.mark.sglang


def test_real_host_kv_cache_matches_reference_fifo() -> None:
    rng = random.Random(3)
    base = free_slots(2000, 8, 4, "random_fragmented", 0)
    real = HOST_IMPLS.get("sglang")(4, base.clone())
    ref = HOST_IMPLS.get("reference")(4, base.clone())
    held = []
    for _ in range(200):
        if held and rng.random() < 0.4:
            block = held.pop(rng.randrange(len(held)))
            real.free(block[0])
            ref.free(block[1])
        else:
            n = 4 * rng.randint(1, 64)
            a, b = real.alloc(n), ref.alloc(n)
            assert (a is None) == (b is None)
            if a is not None:
                assert a.tolist() == b.tolist()
                held.append((a, b))
        assert real.available_size() == ref.available_size()
        assert real.free_slot_list() == ref.free_slot_list()


def test_sglang_impl_skips_contiguous_with_a_note(cli) -> None:
    res = cli("alloc", "host", "alloc_host.host_sizes_gb=[]", "alloc_host.host_pages=[600]", "alloc_host.request_pages=[8]",
              "alloc_host.impls=[reference,sglang]", "alloc_host.repeat=2", "alloc_host.warmup=0")  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = cli.results(cli.run_dirs()[0])
    pairs = {(r["impl"], r["method"]) for r in doc["rows"]}
    assert ("sglang", "fifo") in pairs and ("sglang", "contiguous") not in pairs
    assert any("sglang has no contiguous" in n for n in doc["notes"])
