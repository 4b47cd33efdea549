"""The Checkpoint tree view: the lineage of every policy drawn as a graph (parents, warm starts, branches,
resumed runs), and per checkpoint its step, metrics, bridges, the engines serving it and its eval scores.

The graph shows one run's checkpoints (with the warm starts and checkpoints of other runs they grew from), or
the newest `MAX_NODES` of all; the table lists the same nodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from rollout.control.reads import CheckpointNode, checkpoint_tree, engines, list_runs
from rollout.evals.records import every_result

if TYPE_CHECKING:
    from rollout.control.reads import LedgerReader
    from rollout.monitor.context import Monitor

MAX_NODES = 200


def render(monitor: Monitor) -> None:
    st.title("Checkpoint tree")
    runs = [r.run for r in monitor.read(list_runs) if not r.settings.is_eval]
    options = ["(all)", *runs]
    wanted = st.query_params.get("run")
    run = st.selectbox("run", options, index=options.index(wanted) if wanted in options else 0)

    async def read(ledger: LedgerReader) -> tuple[Any, ...]:
        return await checkpoint_tree(ledger), await engines(ledger), await every_result(ledger)

    nodes, engine_rows, results = monitor.read(read)
    if not nodes:
        st.info("No checkpoint yet: a training run makes one per step.")
        return
    shown = _chosen(nodes, None if run == "(all)" else run)
    serving: dict[str, list[str]] = {}
    for engine in engine_rows:
        for name in engine.serving:
            serving.setdefault(name, []).append(engine.engine)
    scores: dict[str, list[str]] = {}
    for result in results:
        scores.setdefault(result.checkpoint, []).append(
            f"{result.suite}@{result.version} {result.environment} {result.score:.3f}"
        )
    st.graphviz_chart(_dot(shown, serving, scores), width="stretch")
    st.caption(
        f"{len(shown)} of {len(nodes)} checkpoints · green: served by an engine now · a double border: scored by an "
        "eval"
    )
    st.dataframe(
        [
            {
                "checkpoint": n.name,
                "step": n.version,
                "parent": n.parent or "(base model)",
                "run": n.run,
                "reward": n.metrics.get("reward_mean"),
                "loss": n.metrics.get("loss"),
                "bridges": ", ".join(n.formats),
                "served by": ", ".join(serving.get(n.name, [])),
                "evals": "; ".join(scores.get(n.name, [])),
            }
            for n in reversed(shown)
        ],
        hide_index=True,
        width="stretch",
    )


def _chosen(nodes: list[CheckpointNode], run: str | None) -> list[CheckpointNode]:
    if run is None:
        return nodes[-MAX_NODES:]
    by_name = {n.name: n for n in nodes}
    chosen = {n.name for n in nodes if n.run == run}
    # The ancestors a run grew from (a warm start, another run's checkpoint) belong in its tree.
    for name in list(chosen):
        parent = by_name[name].parent
        while parent is not None and parent in by_name and parent not in chosen:
            chosen.add(parent)
            parent = by_name[parent].parent
    return [n for n in nodes if n.name in chosen][-MAX_NODES:]


def _dot(nodes: list[CheckpointNode], serving: dict[str, list[str]], scores: dict[str, list[str]]) -> str:
    def quoted(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

    names = {n.name for n in nodes}
    lines = [
        "digraph checkpoints {",
        "rankdir=LR;",
        'node [shape=box, style="rounded,filled", fillcolor=white];',
    ]
    lines.append(f'{quoted("base model")} [fillcolor="#e5e7eb"];')
    for node in nodes:
        reward = node.metrics.get("reward_mean")
        label = f"{node.policy}\nstep {node.version}" + (
            f"\nreward {reward:.3f}" if reward is not None else ""
        )
        attributes = [f"label={quoted(label)}", f"tooltip={quoted(node.name)}"]
        if node.name in serving:
            attributes.append('fillcolor="#bbf7d0"')
        if node.name in scores:
            attributes.append("peripheries=2")
        lines.append(f"{quoted(node.name)} [{', '.join(attributes)}];")
        parent = node.parent if node.parent in names else ("base model" if node.parent is None else None)
        if parent is not None:
            lines.append(f"{quoted(parent)} -> {quoted(node.name)};")
        elif node.parent is not None:  # an ancestor not drawn (beyond MAX_NODES)
            lines.append(f"{quoted(node.parent)} [style=dashed, label={quoted(node.parent)}];")
            lines.append(f"{quoted(node.parent)} -> {quoted(node.name)};")
    lines.append("}")
    return "\n".join(lines)
