"""The Runs view: every run with its state, settings, how its agents' commands were confined (in words),
episodes/s and steps (a page of 100, newest first); one run's per-step curves, its controls, and why its
episodes failed (each way with its count, what to change and a link to a failing episode's transcript).

Curves per step (from each checkpoint's metrics): reward, staleness, importance-weight diagnostics (effective
sample size, clipped fraction, mismatch KL), prefix-cache hits, entropy, reply length and step time, each
trained policy's side by side. Pause, resume
and max_lag go through the run's workflow updates, as `rollout run pause|resume|set` do, so each change is
recorded in the ledger by the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import streamlit as st

from rollout.control.reads import (
    EpisodeRate,
    FailureCount,
    RunRow,
    StepRow,
    count_runs,
    episode_rate,
    failure_counts,
    find_run,
    list_runs,
    run_activity,
    run_progress,
    run_steps,
)
from rollout.monitor.plain import plain
from rollout.run.failures import advice
from rollout.run.settings import RunSettings
from rollout.security.isolation import SandboxIsolation, said

if TYPE_CHECKING:
    from rollout.control.reads import LedgerReader
    from rollout.monitor.context import Monitor

CURVES = {
    "reward": "reward_mean",
    "staleness": "staleness_mean",
    "effective sample size": "effective_sample_size",
    "clipped fraction": "clipped_fraction",
    "mismatch KL (k3)": "kl_k3",
    "prefix cache hits": "prefix_cache_hit_rate",
    "entropy (nats)": "entropy",
    "reply tokens (mean)": "response_tokens_mean",
}


PAGE = 100


def render(monitor: Monitor) -> None:
    st.title("Runs")
    total = monitor.read(count_runs)
    if not total:
        st.info("No runs yet: `rollout train ENV` starts one.")
        return
    page = 1
    if total > PAGE:
        pages = -(-total // PAGE)
        page = int(st.number_input(f"page (of {pages}, newest first)", min_value=1, max_value=pages, value=1))

    async def read(ledger: LedgerReader) -> tuple[list[RunRow], dict[str, tuple[EpisodeRate, int]]]:
        rows = await list_runs(ledger, limit=PAGE, offset=(page - 1) * PAGE)
        return rows, await run_activity(ledger, [r.run for r in rows])

    runs, activity = monitor.read(read)
    states = _workflow_states(monitor)
    table = [
        {
            "run": r.run,
            "environment": r.environment,
            "kind": "eval" if r.settings.is_eval else "training",
            "state": states.get(r.run, "no workflow") + (", paused" if r.settings.paused else ""),
            "episodes": activity[r.run][0].finished,
            "failed": activity[r.run][0].failed,
            "episodes/s": round(activity[r.run][0].per_second, 2),
            "steps": activity[r.run][1],
            "max_lag": r.settings.max_lag,
            "agents' commands": _isolation(r.settings),
            "created": r.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        }
        for r in runs
    ]
    st.dataframe(table, hide_index=True, width="stretch")
    names = [r.run for r in runs]
    wanted = st.query_params.get("run")
    if wanted is not None and wanted not in names:
        if monitor.read(lambda ledger: find_run(ledger, wanted)) is None:
            st.warning(f"The ledger has no run {plain(repr(wanted))}: pick one of the runs above.")
        else:
            names.insert(0, wanted)  # a run on another page, asked for by its link
    chosen = st.selectbox("run", names, index=names.index(wanted) if wanted in names else 0)
    if chosen is None:
        return
    st.query_params["run"] = chosen
    show_run(monitor, chosen)


def _isolation(settings: RunSettings) -> str:
    """How a run's agents' commands were confined, in words (runs created before it was recorded say so)."""
    try:
        return said(SandboxIsolation(settings.sandbox_isolation or ""))
    except ValueError:
        return "isolation not recorded"


def show_run(monitor: Monitor, run: str) -> None:
    async def read(ledger: LedgerReader) -> tuple[Any, ...]:
        return (
            await find_run(ledger, run),
            await run_progress(ledger, run),
            await episode_rate(ledger, run),
            await run_steps(ledger, run),
            await failure_counts(ledger, run),
        )

    row, progress, rate, steps, failures = monitor.read(read)
    if row is None:
        st.warning(f"The ledger has no run {plain(repr(run))}.")
        return
    state = _workflow_state(monitor, run)
    columns = st.columns(5)
    columns[0].metric("state", state)
    columns[1].metric("episodes", progress.episodes_finished)
    columns[2].metric("failed", progress.episodes_failed)
    columns[3].metric("episodes/s", f"{rate.per_second:.2f}")
    columns[4].metric("steps", sum(p.checkpoints for p in progress.policies.values()))
    st.caption(_isolation(row.settings).capitalize() + ", as its runner recorded.")
    if url := monitor.workflow_url(f"run/{run}"):
        st.markdown(f"[The run's workflow in the Temporal web UI]({url})")
    with st.expander("settings"):
        st.json(row.settings.recorded())
    _controls(monitor, run, row.settings, state)
    _failures(failures, run)
    if not steps:
        st.caption("No step trained yet.")
        return
    st.subheader("Per step")
    st.vega_lite_chart(*step_curves(run, steps))


def _failures(failures: list[FailureCount], run: str) -> None:
    """Why episodes failed: each way, how often, what to change, and a link to a failing transcript."""
    if not failures:
        return
    st.subheader("Why episodes failed")
    for failed in failures:
        link = f"./transcripts?run={quote(run)}&episode={quote(failed.episode)}"
        st.markdown(
            f"**{failed.count}** × {plain(failed.kind or 'failed')}: {plain(failed.summary)} ([episode "
            f"{plain(failed.episode)}]({link})). {advice(failed.kind)}"
        )


def _workflow_state(monitor: Monitor, run: str) -> str:
    from rollout.control.workflow_reads import run_state

    try:
        return monitor.temporal(lambda client: run_state(client, run))
    except RuntimeError:
        return "Temporal unreachable"


def _workflow_states(monitor: Monitor) -> dict[str, str]:
    """Each run's state by run, from one visibility listing (rollout.control.workflow_reads)."""
    from temporalio.service import RPCError

    from rollout.control.workflow_reads import run_states

    try:
        return monitor.temporal(lambda client: run_states(client, PAGE * 10))
    except (RuntimeError, RPCError):
        return {}


def _controls(monitor: Monitor, run: str, settings: RunSettings, state: str) -> None:
    if state != "running":
        return
    from rollout.control.errors import ControlError
    from rollout.run.settings import MaxLagChange, PauseRun, ResumeRun

    left, middle, right = st.columns(3)
    try:
        if left.button("Resume" if settings.paused else "Pause", key="pause"):
            monitor.update_run(run, ResumeRun() if settings.paused else PauseRun())
            st.rerun()
        lag = middle.number_input("max_lag", min_value=0, value=settings.max_lag, step=1)
        if right.button("Set max_lag", key="max_lag"):
            monitor.update_run(run, MaxLagChange(int(lag)))
            st.rerun()
    except ControlError as error:  # refused, not playing, or Temporal away: nothing a retry would repeat
        st.error(plain(error))


def step_curves(run: str, steps: list[StepRow]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The per-step curves' data and chart: a row per curve, and with several trained policies a column per
    policy, side by side (each chart its own scale)."""
    points: list[dict[str, Any]] = []
    previous: dict[str, StepRow] = {}  # each policy's step before, for its step time
    for step in steps:
        point: dict[str, Any] = {"step": step.version, "policy": step.policy.removeprefix(f"{run}/")}
        for label, key in CURVES.items():
            point[label] = step.metrics.get(key)
        before = previous.get(step.policy)
        point["step time (s)"] = (
            (step.recorded_at - before.recorded_at).total_seconds() if before is not None else None
        )
        previous[step.policy] = step
        points.append(point)
    long = [
        {"step": p["step"], "curve": label, "value": p[label], "policy": p["policy"]}
        for label in [*CURVES, "step time (s)"]
        for p in points
        if p[label] is not None
    ]
    policies = sorted({p["policy"] for p in points})
    facet: dict[str, Any] = {
        "row": {"field": "curve", "type": "nominal", "title": None, "sort": [*CURVES, "step time (s)"]}
    }
    if len(policies) > 1:
        facet["column"] = {"field": "policy", "type": "nominal", "title": None, "sort": policies}
    # One faceted chart: a chart per curve costs a chart's set-up each.
    chart = {
        "facet": facet,
        "spec": {
            "mark": {"type": "line", "point": True},
            "width": 700 // max(1, len(policies)),
            "height": 110,
            "encoding": {
                "x": {"field": "step", "type": "quantitative"},
                "y": {"field": "value", "type": "quantitative", "title": None},
                "color": {"field": "curve", "type": "nominal", "legend": None},
            },
        },
        "resolve": {"scale": {"y": "independent"}},
    }
    return long, chart
