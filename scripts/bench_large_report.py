"""The large-scope scenario's targets and its table (``bench_large``), beside ``bench_report``'s."""

from __future__ import annotations

from typing import Any

from bench_core import Result

LARGE_OPERATIONS = (
    ("large_cold_load", "cold load"),
    ("large_inject", "memory_context(query), embeddings off"),
    ("large_inject_local", "memory_context(query), local embeddings"),
    ("large_inject_local_uncached", "memory_context(query), local embeddings, vector cache empty"),
    ("large_save_add1", "save adding a fact"),
    ("large_save_evict", "save adding a fact at the cap (evicts one)"),
)
LARGE_SMALL, LARGE_BIG = 1000, 10_000
LINEAR = LARGE_BIG / LARGE_SMALL
GROWTH_LIMIT = 1.5 * LINEAR
"""Linear growth is 10×, quadratic 100×: 15× leaves room for what a ten times larger working set
costs per fact (caches, the collector's passes) and still flags anything worse than linear."""


def target_fields() -> list[dict[str, Any]]:
    """``bench_report.Target``'s fields for each large-scope target: growth from 1,000 to 10,000
    facts in one scope, linear for every operation that must read or rank every fact, and a
    bounded update prompt."""
    targets: list[dict[str, Any]] = []
    for backend, name in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")):
        for scenario, text in LARGE_OPERATIONS:
            targets.append(
                {
                    "key": f"{scenario}_{backend}",
                    "text": f"{name}: {text}, 10,000 facts ≤ {GROWTH_LIMIT:g}× 1,000 (linear: {LINEAR:g}×)",
                    "subject": (scenario, f"{backend}_{LARGE_BIG}"),
                    "ref": (scenario, f"{backend}_{LARGE_SMALL}"),
                    "limit": GROWTH_LIMIT,
                }
            )
    computed = (("large_update_prompt", "update prompt build"), ("large_update_apply", "update apply"))
    for scenario, text in computed:
        targets.append(
            {
                "key": scenario,
                "text": f"{text}, 10,000 facts ≤ {GROWTH_LIMIT:g}× 1,000 (linear: {LINEAR:g}×)",
                "subject": (scenario, f"facts_{LARGE_BIG}"),
                "ref": (scenario, f"facts_{LARGE_SMALL}"),
                "limit": GROWTH_LIMIT,
            }
        )
    targets.append(
        {
            "key": "large_update_prompt_size",
            "text": "update prompt size, 10,000 facts ≤ 1.2× 1,000 (update_prompt_max_facts bounds it)",
            "subject": ("large_update_prompt", f"facts_{LARGE_BIG}"),
            "ref": ("large_update_prompt", f"facts_{LARGE_SMALL}"),
            "limit": 1.2,
            "metric": "prompt_chars",
        }
    )
    return targets


def large_table(results: list[Result]) -> str:
    """The large-scope scenarios: one row per operation and backend, the sizes side by side."""
    sizes = sorted({int(r.variant.rsplit("_", 1)[1]) for r in results if r.scenario.startswith("large_")})
    if not sizes:
        return ""
    index = {(r.scenario, r.variant): r for r in results}
    head = " | ".join(f"{size:,} facts ms (p95)" for size in sizes)
    lines = [
        f"| operation | variant | {head} | {sizes[-1]:,} / {sizes[0]:,} |",
        "|---|---|" + "---:|" * (len(sizes) + 1),
    ]
    groups = dict.fromkeys((r.scenario, r.variant.rsplit("_", 1)[0]) for r in results)
    for scenario, backend in groups:
        row = [index.get((scenario, f"{backend}_{size}")) for size in sizes]
        cells = " | ".join(f"{r.median:.1f} ({r.p95:.1f})" if r else "—" for r in row)
        growth = f"{row[-1].median / row[0].median:.1f}×" if row[0] and row[-1] else "—"
        lines.append(f"| {scenario} | {backend} | {cells} | {growth} |")
        if scenario == "large_update_prompt":
            chars = " | ".join(
                f"{r.extra['prompt_chars']:,.0f} chars (all facts: {r.extra['whole_memory_chars']:,.0f})"
                if r
                else "—"
                for r in row
            )
            lines.append(f"| update prompt size | {backend} | {chars} | |")
    return "\n".join(lines)
