"""The Runs view: every run with its status and settings; one run's per-step curves and its controls.

Curves per step (from each checkpoint's metrics): reward, staleness, importance-weight diagnostics (effective
sample size, clipped fraction, mismatch KL) and step time. Pause, resume and max_lag go through the run's
workflow updates, as `rollout run pause|resume|set` do, so each change is recorded in the ledger by the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from rollout.ledger.queries import find_run, list_runs, run_progress
from rollout.ledger.views import episode_rate, run_steps

if TYPE_CHECKING:
    from rollout.ledger import Ledger
    from rollout.monitor.context import Monitor

CURVES = {
    "reward": "reward_mean",
    "staleness": "staleness_mean",
    "effective sample size": "effective_sample_size",
    "clipped fraction": "clipped_fraction",
    "mismatch KL (k3)": "kl_k3",
}


def render(monitor: Monitor) -> None:
    st.title("Runs")
    runs = monitor.read(list_runs)
    if not runs:
        st.info("No runs yet: `rollout train ENV` starts one.")
        return
    table = [
        {
            "run": r.run,
            "environment": r.environment,
            "created": r.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            "kind": "eval" if r.settings.get("eval") else "training",
            "paused": bool(r.settings.get("paused")),
            "max_lag": r.settings.get("max_lag"),
        }
        for r in runs
    ]
    st.dataframe(table, hide_index=True, width="stretch")
    names = [r.run for r in runs]
    wanted = st.query_params.get("run")
    if wanted is not None and wanted not in names:
        st.warning(f"The ledger has no run {wanted!r}: pick one of the runs above.")
    chosen = st.selectbox("run", names, index=names.index(wanted) if wanted in names else 0)
    if chosen is None:
        return
    st.query_params["run"] = chosen
    show_run(monitor, chosen)


def show_run(monitor: Monitor, run: str) -> None:
    async def read(ledger: Ledger) -> tuple[Any, ...]:
        return (
            await find_run(ledger, run),
            await run_progress(ledger, run),
            await episode_rate(ledger, run),
            await run_steps(ledger, run),
        )

    row, progress, rate, steps = monitor.read(read)
    if row is None:
        st.warning(f"The ledger has no run {run!r}.")
        return
    state = _workflow_state(monitor, run)
    columns = st.columns(5)
    columns[0].metric("state", state)
    columns[1].metric("episodes", progress.episodes_finished)
    columns[2].metric("failed", progress.episodes_failed)
    columns[3].metric("episodes/s", f"{rate.per_second:.2f}")
    columns[4].metric("steps", sum(p.checkpoints for p in progress.policies.values()))
    if url := monitor.workflow_url(f"run/{run}"):
        st.markdown(f"[The run's workflow in the Temporal web UI]({url})")
    with st.expander("settings"):
        st.json(row.settings)
    _controls(monitor, run, row.settings, state)
    if not steps:
        st.caption("No step trained yet.")
        return
    st.subheader("Per step")
    points: list[dict[str, Any]] = []
    for previous, step in zip([None, *steps], steps, strict=False):
        point: dict[str, Any] = {"step": step.version, "policy": step.policy}
        for label, key in CURVES.items():
            point[label] = step.metrics.get(key)
        point["step time (s)"] = (
            (step.recorded_at - previous.recorded_at).total_seconds() if previous is not None else None
        )
        points.append(point)
    long = [
        {"step": p["step"], "curve": label, "value": p[label]}
        for label in [*CURVES, "step time (s)"]
        for p in points
        if p[label] is not None
    ]
    # One faceted chart, one row per curve with its own scale: a chart per curve costs a chart's set-up each.
    st.vega_lite_chart(
        long,
        {
            "facet": {
                "row": {
                    "field": "curve",
                    "type": "nominal",
                    "title": None,
                    "sort": [*CURVES, "step time (s)"],
                }
            },
            "spec": {
                "mark": {"type": "line", "point": True},
                "width": 700,
                "height": 110,
                "encoding": {
                    "x": {"field": "step", "type": "quantitative"},
                    "y": {"field": "value", "type": "quantitative", "title": None},
                    "color": {"field": "curve", "type": "nominal", "legend": None},
                },
            },
            "resolve": {"scale": {"y": "independent"}},
        },
    )


def _workflow_state(monitor: Monitor, run: str) -> str:
    from temporalio.service import RPCError

    from rollout.workflows.client import run_handle

    async def describe(client: Any) -> str:
        try:
            description = await run_handle(client, run).describe()
        except RPCError:
            return "no workflow"
        return description.status.name.lower() if description.status is not None else "unknown"

    try:
        return monitor.temporal(describe)
    except RuntimeError:
        return "Temporal unreachable"


def _controls(monitor: Monitor, run: str, settings: dict[str, Any], state: str) -> None:
    if state != "running":
        return
    from rollout.workflows.client import RunNotPlaying, RunUpdateRefused

    left, middle, right = st.columns(3)
    try:
        if left.button("Resume" if settings.get("paused") else "Pause", key="pause"):
            monitor.update_run(run, "resume" if settings.get("paused") else "pause")
            st.rerun()
        lag = middle.number_input("max_lag", min_value=0, value=int(settings.get("max_lag") or 0), step=1)
        if right.button("Set max_lag", key="max_lag"):
            monitor.update_run(run, "set_max_lag", int(lag))
            st.rerun()
    except (RunNotPlaying, RunUpdateRefused) as error:
        st.error(str(error))
