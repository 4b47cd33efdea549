"""The Evals view: scores per environment across checkpoints, per suite version, as a plot and a table; a
score that dropped by more than `REGRESSION` from the previous checkpoint of the same policy is
highlighted."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from rollout.evals.records import every_result
from rollout.monitor.plain import plain
from rollout.records.evals import EvalResult

if TYPE_CHECKING:
    from rollout.monitor.context import Monitor

REGRESSION = 0.02


def render(monitor: Monitor) -> None:
    st.title("Evals")
    results = monitor.read(every_result)
    if not results:
        st.info("No eval results yet: `rollout eval run SUITE --checkpoint CHECKPOINT` records some.")
        return
    suites = sorted({f"{r.suite}@{r.version}" for r in results})
    suite = st.selectbox("suite", suites, index=len(suites) - 1)
    chosen = [r for r in results if f"{r.suite}@{r.version}" == suite]
    environments = sorted({r.environment for r in chosen})
    points = [
        {
            "step": r.checkpoint_version,
            "environment": r.environment,
            "score": r.score,
            "policy": r.policy,
        }
        for r in chosen
    ]
    st.line_chart(points, x="step", y="score", color="environment", height=260)
    rows, regressed = _table(chosen, environments)
    st.dataframe(
        _styled(rows, regressed, environments),
        hide_index=True,
        width="stretch",
    )
    if regressed:
        st.warning(
            "Regressions (a drop of more than "
            f"{REGRESSION} from the policy's previous scored checkpoint): "
            + ", ".join(
                plain(f"{checkpoint} · {environment}") for checkpoint, environment in sorted(regressed)
            )
        )


def _table(
    results: list[EvalResult], environments: list[str]
) -> tuple[list[dict[str, Any]], set[tuple[str, str]]]:
    by_checkpoint: dict[str, dict[str, Any]] = {}
    for r in sorted(results, key=lambda r: (r.policy or "", r.checkpoint_version)):
        row = by_checkpoint.setdefault(
            r.checkpoint, {"checkpoint": r.checkpoint, "step": r.checkpoint_version, "policy": r.policy}
        )
        row[r.environment] = r.score
    regressed: set[tuple[str, str]] = set()
    previous: dict[tuple[str | None, str], float] = {}
    for row in by_checkpoint.values():
        for environment in environments:
            if (score := row.get(environment)) is None:
                continue
            key = (row["policy"], environment)
            if key in previous and score < previous[key] - REGRESSION:
                regressed.add((row["checkpoint"], environment))
            previous[key] = score
    return list(by_checkpoint.values()), regressed


def _styled(rows: list[dict[str, Any]], regressed: set[tuple[str, str]], environments: list[str]) -> Any:
    import pandas as pd

    frame = pd.DataFrame(rows, columns=["checkpoint", "step", "policy", *environments])

    def colour(row: Any) -> list[str]:
        return [
            "background-color: #fecaca" if (row["checkpoint"], column) in regressed else ""
            for column in frame.columns
        ]

    return frame.style.apply(colour, axis=1).format(dict.fromkeys(environments, "{:.3f}"), na_rep="")
