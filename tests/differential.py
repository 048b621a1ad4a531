"""What a differential test against a real engine reports: the scenarios whose model run
differs from the real one, and the rules the scenarios exercised too rarely to prove much."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def side_by_side(
    scenarios: list[dict], run_model: Callable[[dict], dict], run_real: Callable[[list], list]
) -> list[tuple[dict, dict, dict]]:
    """(scenario, model run, real run) for every scenario: the real engine runs them all in
    one process (its import is the slow part), the model one by one."""
    real = run_real(scenarios)
    assert len(real) == len(scenarios)
    return [(s, run_model(s), r) for s, r in zip(scenarios, real, strict=True)]


def differing(
    runs: Sequence[tuple[dict, dict, dict]], compare: Callable[[dict, dict], list]
) -> str:
    """'' when every (scenario, model, real) run agrees; else how many differ and the first
    differences of the first 20."""
    failures = []
    for scenario, model, real in runs:
        diff = compare(model, real)
        if diff:
            failures.append(
                f"{scenario['name']}: {len(diff)} differences, first: " + "; ".join(diff[:3])
            )
    if not failures:
        return ""
    return f"{len(failures)}/{len(runs)} scenarios differ:\n" + "\n".join(failures[:20])


def below_floors(coverage: dict[str, int], floors: dict[str, int]) -> str:
    """'' when every rule was exercised at least its floor's times; else which were not."""
    short = {k: (coverage[k], floor) for k, floor in floors.items() if coverage[k] < floor}
    if not short:
        return ""
    return f"rules too rarely exercised (count, floor): {short}; all: {coverage}"
