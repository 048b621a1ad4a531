"""Config schema of ``cpkv admit`` (kind ``admit``).

The ``admit`` block holds the run's choices (``backend``, ``policy``, ``mode``, ``workload``)
followed by every budget of :class:`~cpkv.admission.budgets.AdmitBudgets`, flat, as in
DESIGN.md (``admit.available_tokens``, ``admit.cp.max_batch_requests``, ...). The defaults are
the seed benchmark's synthetic-grid example.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cpkv.admission.budgets import AdmitBudgets
from cpkv.admission.schedule_policy.config import SchedulePolicyConfig
from cpkv.core.memory import MemoryNeed
from cpkv.core.schema import FieldError, choices, positive
from cpkv.policies.blocks import KvBlocks
from cpkv.policies.deadline import DeadlineSpec
from cpkv.policies.iteration import IterationBudget
from cpkv.policies.profiled import ProfiledSpec
from cpkv.serving.cluster.schema import ClusterSpec
from cpkv.serving.cost.cp.layout import lane_pool
from cpkv.serving.cost.spec import CostSpec
from cpkv.serving.schema import (
    ENGINES,
    ArrivalsSpec,
    ServingSpec,
    SglangSpec,
    SloSpec,
    VllmSpec,
)
from cpkv.sglang.config import SCHEDULE_POLICIES as LOOP_POLICIES
from cpkv.sglang.config import policy_refused
from cpkv.workload.sources import WorkloadSpec

VLLM_UNREAD_BUDGETS = (
    "available_tokens", "evictable_tokens", "max_prefill_tokens", "chunked_prefill_size",
    "page_size", "new_token_ratio", "prefill_max_requests", "load_back_threshold",
    "load_back_quota_tokens", "running", "release_each_tick",
)  # fmt: skip
"""The PrefillAdder's budgets that the vLLM engine does not read (``max_running_requests``
and ``cp`` are refused with their own reason; ``max_new_tokens`` is read)."""
MODES = ("passes", "serving")
"""``passes``: the seed's tick model (repeated scheduling passes over the waiting queue);
``serving``: time, arrivals, decode and KV growth around the policy (:mod:`cpkv.serving.engine.engine`)."""
SCHEDULE_POLICY_MODES: tuple[str, ...] = ("serving",)
"""The modes whose loop applies the ``admit.schedule_policy`` keys (the waiting-queue order and
priority preemption of :mod:`cpkv.admission.schedule_policy`, and cpkv's ``deadline``);
elsewhere only their defaults (``fcfs``, no priority scheduling) are accepted, as nothing
would read another value."""


@dataclass(frozen=True)
class _RunChoices:
    backend: str = "model"
    policy: str = "prefill_adder"
    mode: str = "passes"
    workload: WorkloadSpec = WorkloadSpec()
    engine: str | None = None  # null: cpkv.serving.engine_choice.chosen_engine


@dataclass(frozen=True)
class AdmitBlock(AdmitBudgets, SchedulePolicyConfig, _RunChoices):
    """``admit:``: backend, policy, mode, workload, the waiting-queue policy keys (a
    SchedulePolicyConfig), then the budgets (an AdmitBudgets)."""

    kv: KvBlocks = KvBlocks()  # the conservative and optimistic block policies
    iteration: IterationBudget = IterationBudget()  # the iteration block policy
    arrivals: ArrivalsSpec = ArrivalsSpec()  # mode serving: when requests arrive
    cost: CostSpec = CostSpec()  # mode serving: iteration time
    slo: SloSpec = SloSpec()  # mode serving: goodput
    serving: ServingSpec = ServingSpec()  # mode serving: engine options
    cluster: ClusterSpec = ClusterSpec()  # mode serving: instances behind a router
    deadline: DeadlineSpec = DeadlineSpec()  # mode serving: schedule_policy deadline (cpkv's)
    profiled: ProfiledSpec = ProfiledSpec()  # mode serving: policy profiled (cpkv's)
    vllm: VllmSpec = VllmSpec()  # mode serving, engine vllm: vLLM's scheduler knobs
    sglang: SglangSpec = SglangSpec()  # mode serving, engine sglang: SGLang's server arguments

    def validate(self) -> None:
        from cpkv.admission.ticks import BACKENDS
        from cpkv.policies.registry import POLICIES

        choices("backend", (self.backend,), BACKENDS.allowed())
        choices("policy", (self.policy,), POLICIES.allowed())
        if self.policy != "prefill_adder" and self.backend != "model":
            raise FieldError(
                "backend",
                f"{self.backend!r} runs only policy prefill_adder; policy {self.policy!r} needs backend model",
            )
        choices("mode", (self.mode,), MODES)
        if self.engine is not None:
            choices("engine", (self.engine,), ENGINES)
        if self.engine == "vllm":
            self._validate_vllm()
        if self.engine == "sglang" and self.mode == "serving":
            self.validate_sglang_serving()
        if self.engine == "cpkv" and self.mode != "serving":
            raise FieldError(
                "engine",
                "cpkv's loop serves in admit.mode serving; mode passes runs SGLang's "
                "PrefillAdder pass (engine sglang) or vLLM's scheduler (engine vllm)",
            )
        self._validate_schedule_policy()
        if self.mode == "serving":
            self._validate_serving()
        if self.cluster.instances > 1 and self.mode != "serving":
            raise FieldError(
                "cluster.instances",
                f"{self.cluster.instances} instances need admit.mode serving; allowed here: 1",
            )
        if self.cluster.disaggregated:
            self._validate_disaggregated()
        AdmitBudgets.validate(self)
        from cpkv.admit.policy_space import check_policy_space

        check_policy_space(self)

    def _validate_schedule_policy(self) -> None:
        if self.schedule_policy != "deadline":  # cpkv's own order (cpkv.policies.deadline)
            self.validate_schedule(own="deadline")
        elif self.enable_priority_scheduling:
            raise FieldError(
                "enable_priority_scheduling",
                "SGLang's priority scheduling runs with schedule_policy fcfs or lof, not with "
                "cpkv's deadline order",
            )
        if self.mode in SCHEDULE_POLICY_MODES:
            return
        default = SchedulePolicyConfig()
        for key in ("schedule_policy", "enable_priority_scheduling"):
            if getattr(self, key) != getattr(default, key):
                raise FieldError(
                    key,
                    f"{getattr(self, key)!r} is not applied in mode {self.mode} (its queue runs "
                    f"in the order given: fcfs without priorities); only the default "
                    f"{getattr(default, key)!r} is accepted there",
                )

    def _validate_serving(self) -> None:
        if self.backend != "model":
            raise FieldError(
                "backend",
                f"{self.backend!r} has no serving engine; mode serving needs backend model",
            )
        if self.kv.scan == "all_or_error":
            raise FieldError(
                "kv.scan",
                "all_or_error is the passes mode's one-shot check; mode serving allows first_fit, fcfs_stop or null (first_fit)",
            )
        positive("kv.capacity_blocks", self.kv.capacity_blocks)
        if self.cost.cp.l1_pages_per_rank is not None:
            self._validate_lane_pool()
        if self.policy != "prefill_adder":
            positive("iteration.budget_tokens", self.iteration.budget_tokens)
            positive("iteration.chunk_tokens", self.iteration.chunk_tokens)
        self._validate_graph_buckets()

    def _validate_lane_pool(self) -> None:
        """``cost.cp.l1_pages_per_rank`` sizes cpkv's loop's pool in place of ``admit.kv``:
        an ``admit.kv`` pool beside it must be the default or the same pool."""
        cp, kv, default = self.cost.cp, self.kv, KvBlocks()
        block_tokens, blocks = lane_pool(cp.l1_pages_per_rank, cp.page_size, cp.size)
        given = (kv.block_size, kv.capacity_blocks)
        if given not in ((default.block_size, default.capacity_blocks), (block_tokens, blocks)):
            raise FieldError(
                "kv.capacity_blocks",
                f"{kv.capacity_blocks} blocks x {kv.block_size} tokens, but "
                f"cost.cp.l1_pages_per_rank sizes the pool as {blocks} blocks x {block_tokens} "
                f"tokens (stripes of cp.size x cp.page_size, one per page of an owner lane); "
                f"leave admit.kv's pool out, or set admit.kv.block_size={block_tokens} "
                f"admit.kv.capacity_blocks={blocks}",
            )

    def _refuse_lane_pool(self) -> None:
        """SGLang's and vLLM's pools page by their own page size, not by the CP owner lanes."""
        if self.cost.cp.l1_pages_per_rank is not None:
            raise FieldError(
                "cost.cp.l1_pages_per_rank",
                f"the CP owner lanes size cpkv's loop's pool (admit.engine cpkv, or leave "
                f"admit.engine out); engine {self.engine} pages by its own page size",
            )

    def _validate_vllm(self) -> None:
        """The vLLM engine runs its own scheduler: keys it would not read (SGLang's, the block
        policies', and in mode passes the serving blocks) are refused, not ignored."""
        if self.backend != "model":
            raise FieldError(
                "backend", f"{self.backend!r} runs SGLang's scheduler; with engine vllm: model"
            )
        self._refuse_lane_pool()
        default = type(self)()
        for key, why in (
            ("policy", "the vLLM engine's policy is admit.vllm.policy (fcfs or priority)"),
            ("schedule_policy", "vLLM orders its queue by admit.vllm.policy"),
            ("enable_priority_scheduling", "vLLM's priority scheduling is admit.vllm.policy"),
            ("max_running_requests", "vLLM's is admit.vllm.max_num_seqs"),
        ):
            if getattr(self, key) != getattr(default, key):
                raise FieldError(key, f"{getattr(self, key)!r} is SGLang's; {why}")
        if self.cp != default.cp and self.cp.active:
            raise FieldError(
                "cp",
                "the CP shared-KV limits are SGLang's PrefillAdder's and are not read with "
                "engine vllm; leave admit.cp out (or cp.enabled: false)",
            )
        if self.workload.cache != default.workload.cache:
            raise FieldError(
                "workload.cache",
                "SGLang's L1/L2 prefix cache, not read with engine vllm (vLLM's prefix cache "
                "lives in its pool: admit.vllm.num_gpu_blocks); leave it out",
            )
        for key in VLLM_UNREAD_BUDGETS:
            if getattr(self, key) != getattr(default, key):
                raise FieldError(
                    key,
                    f"{getattr(self, key)!r} is a budget of SGLang's PrefillAdder, not read "
                    "with engine vllm (its knobs are admit.vllm.*; of the budgets only "
                    "admit.max_new_tokens is read)",
                )
        for key in ("scan", "victim", "on_finish", "safety_margin_blocks"):
            if getattr(self.kv, key) != getattr(default.kv, key):
                raise FieldError(
                    f"kv.{key}",
                    "a block policy's option, not read with engine vllm (of admit.kv it reads "
                    "block_size and capacity_blocks: the pool when admit.vllm.num_gpu_blocks "
                    "is null)",
                )
        for key in ("iteration", "deadline", "profiled"):
            if getattr(self, key) != getattr(default, key):
                raise FieldError(key, "SGLang's engine's, not read with engine vllm")
        if self.mode == "passes":
            for key in ("arrivals", "cost", "slo", "serving", "cluster"):
                if getattr(self, key) != getattr(default, key):
                    raise FieldError(
                        key,
                        "mode passes runs the queue step by step without time; admit."
                        f"{key} is read in mode serving",
                    )
            return
        if self.serving != ServingSpec(timeline_points=self.serving.timeline_points):
            raise FieldError(
                "serving",
                "admit.serving's options are the SGLang engine's; with engine vllm only serving.timeline_points is read",
            )

    def validate_sglang_serving(self) -> None:
        """SGLang's own loop reads its server arguments from ``admit.sglang``: the keys of
        cpkv's loop that it would not read are refused, not ignored, each naming
        ``admit.engine: cpkv`` (cpkv's loop, which reads them)."""
        default = type(self)()
        self._refuse_lane_pool()
        if self.policy != default.policy:
            raise FieldError(
                "policy",
                f"{self.policy!r} is a seed 004 policy, run by cpkv's loop: admit.engine cpkv "
                "(or leave admit.engine out); SGLang's loop runs its PrefillAdder",
            )
        if self.schedule_policy not in LOOP_POLICIES:
            raise FieldError(
                "schedule_policy",
                f"{self.schedule_policy!r} is ordered by cpkv's loop only (admit.engine cpkv); "
                f"SGLang's loop here: {', '.join(LOOP_POLICIES)}",
            )
        problem = policy_refused(self.schedule_policy, self.sglang.disable_radix_cache)
        if problem is not None:
            raise FieldError("schedule_policy", problem)
        self._validate_sglang_cache()
        if self.cp != default.cp and self.cp.active and not self.sglang.cp_limits:
            raise FieldError(
                "cp",
                "SGLang's loop applies the CP shared-KV limits only with admit.sglang.cp_limits: "
                "true (cpkv's extension); cpkv's loop (admit.engine cpkv) always applies them",
            )
        for key in ("prefill_max_requests", "load_back_quota_tokens"):
            if getattr(self, key) != getattr(default, key):
                raise FieldError(
                    key,
                    f"{getattr(self, key)!r} is a budget of cpkv's loop (admit.engine cpkv); "
                    "SGLang has no such server argument",
                )
        for key in ("scan", "on_finish", "safety_margin_blocks"):
            if getattr(self.kv, key) != getattr(default.kv, key):
                raise FieldError(
                    f"kv.{key}",
                    "an option of cpkv's loop's block policies (admit.engine cpkv); SGLang's "
                    "loop reads admit.kv's block_size and capacity_blocks (its pool) only",
                )
        if self.kv.victim not in (default.kv.victim, "least_progress"):
            raise FieldError(
                "kv.victim",
                f"{self.kv.victim!r} is cpkv's loop's (admit.engine cpkv); SGLang's loop "
                "retracts by its own order (least_progress, or the default)",
            )
        if self.cluster.disaggregated:
            raise FieldError(
                "cluster.prefill",
                "a disaggregated deployment runs on cpkv's loop (admit.engine cpkv: a "
                "prefill-only mode and a decode entry for requests whose KV arrives built)",
            )
        if self.cluster.shared_l2:
            raise FieldError(
                "cluster.shared_l2",
                "one L2 shared by the instances is cpkv's loop's (admit.engine cpkv); SGLang's "
                "loop gives each instance its own host tier",
            )
        read = ("timeline_points", "ratio_min_factor", "ratio_decay_steps")
        if self.serving != ServingSpec(**{k: getattr(self.serving, k) for k in read}):
            raise FieldError(
                "serving",
                "admit.serving's options are cpkv's loop's (admit.engine cpkv); SGLang's loop "
                "reads serving.timeline_points, ratio_min_factor and ratio_decay_steps only",
            )
        chunk = self.chunk_tokens
        if chunk is not None and chunk < self.page_size:
            raise FieldError(
                "chunked_prefill_size", f"{chunk} is less than a page ({self.page_size} tokens)"
            )

    def _validate_sglang_cache(self) -> None:
        """``admit.workload.cache`` under SGLang's loop: its L1 joins the one KV pool and its
        L2 is the host tier, so both are finite, and the host tier is given once."""
        cache = self.workload.cache
        if cache == type(self)().workload.cache:
            return
        l1, l2 = cache.capacities()
        if l1 is None:
            raise FieldError(
                "workload.cache.l1_tokens",
                "null (unlimited) has no place in SGLang's one KV pool, which the L1 tokens "
                "join: give a number of tokens",
            )
        if l2 is None:
            raise FieldError(
                "workload.cache.l2_tokens",
                "an unlimited L2 is not a host tier SGLang can hold: give l2_tokens (0: no "
                "host tier) or hicache_ratio",
            )
        if l2 and self.sglang.enable_hierarchical_cache:
            raise FieldError(
                "sglang.enable_hierarchical_cache",
                "the host tier is given twice (admit.workload.cache's L2 and admit.sglang's "
                "HiCache): keep one",
            )
        if l2 and self.sglang.disable_radix_cache:
            raise FieldError(
                "workload.cache.l2_tokens",
                "the host tier keeps the radix cache's nodes: 0 with "
                "admit.sglang.disable_radix_cache",
            )

    def _validate_disaggregated(self) -> None:
        """Prefill and decode pools run cpkv's loop with SGLang's PrefillAdder, in mode
        serving, without the admission-policy options; each pool's cost is checked."""
        from cpkv.serving.cluster.disagg.schema import pool_cost

        why = None
        if self.mode != "serving":
            why = f"runs in admit.mode serving, not {self.mode}"
        elif self.engine not in (None, "cpkv"):
            why = (
                f"runs on cpkv's loop (admit.engine cpkv: a prefill-only mode and a decode "
                f"entry for requests whose KV arrives built), not engine {self.engine}"
            )
        elif self.policy != "prefill_adder":
            why = f"runs SGLang's PrefillAdder (policy prefill_adder), not policy {self.policy}"
        if why is not None:
            raise FieldError("cluster.prefill", f"a disaggregated deployment {why}")
        for pool in ("prefill", "decode"):
            pool_cost(self.cost, getattr(self.cluster, pool), f"cluster.{pool}")

    def _validate_graph_buckets(self) -> None:
        """No CUDA-graph bucket larger than the most requests that can run at once: SGLang
        captures none larger than its request pool (every decode would be padded to it)."""
        buckets = self.serving.cuda_graph_buckets
        if not buckets:
            return
        if self.max_running_requests is not None:
            most, cap = self.max_running_requests, "admit.max_running_requests"
        else:
            most, cap = self.kv.capacity_blocks, "admit.kv.capacity_blocks: each holds a block"
        if buckets[-1] > most:
            raise FieldError(
                "serving.cuda_graph_buckets",
                f"bucket {buckets[-1]} is larger than the {most} request{'s' * (most != 1)} that "
                f"can run at once ({cap}); SGLang captures no graph larger than its request "
                f"pool, and every decode would be padded to it; allowed: batch sizes up to {most}",
            )

    def budgets(self) -> AdmitBudgets:
        """The budgets alone (what the backends read)."""
        return self


@dataclass(frozen=True)
class AdmitConfig:
    """A ``kind: admit`` experiment."""

    kind: str = "admit"
    name: str = "seed-grid"
    seed: int = 0
    admit: AdmitBlock = field(default_factory=AdmitBlock)


BYTES_PER_REQUEST = 1024  # a request, its records and its result lines (an estimate)
BYTES_PER_INPUT_BYTE = 3  # a requests file read whole, then parsed into requests


def memory_need(cfg: AdmitConfig) -> MemoryNeed | None:
    """A lower bound of the memory the run takes: its requests' (:func:`requests_need`) and,
    in mode serving, its outputs' (:func:`cpkv.serving.record.memory.output_need`)."""
    from cpkv.serving.record.memory import output_need

    need = requests_need(cfg)
    size, what = output_need(cfg.admit)
    if not size:
        return need
    if need is not None:
        size, what = size + need.bytes, [need.what, *what]
    return MemoryNeed(size, " and ".join(what))


def requests_need(cfg: AdmitConfig) -> MemoryNeed | None:
    """A lower bound of the memory the run's requests take: from the grid's size, the synthetic
    count or the size of the requests / trace file."""
    from math import prod

    from cpkv.core.memory import file_bytes

    w = cfg.admit.workload
    if w.source == "grid":
        g = w.grid
        lists = [g.l1_cached_tokens, g.l2_cached_tokens, g.extend_tokens, g.max_new_tokens or (0,)]
        count = prod(len(v) for v in lists)
        return MemoryNeed(count * BYTES_PER_REQUEST, f"admit.workload.grid: {count:,} requests")
    if w.source == "synthetic":
        count = w.synthetic.count
        return MemoryNeed(
            count * BYTES_PER_REQUEST, f"admit.workload.synthetic.count: {count:,} requests"
        )
    if w.source in ("jsonl", "trace") and w.limit is None:
        size = file_bytes(w.path)
        return MemoryNeed(
            size * BYTES_PER_INPUT_BYTE, f"admit.workload.path: {w.path} ({size:,} bytes)"
        )
    return None
