"""The Transcripts view: find episodes (by run, episode, agent, reward range), then read every seat's turns as
the agent saw them.

Each turn shows the prompt the engine saw since the previous turn of its segment (observations, tool results),
the reply with its tool calls, and the sampled tokens coloured by their logprob (or, on a toggle, by the
checkpoint version that sampled the turn). A turn that starts a new segment, and an aborted turn (never
trained), are marked; so is a seat pinned to a checkpoint (for a self-play pin, the checkpoint it played this
episode and the fallback it took while its policy's lineage was short). Token text comes from the model's
tokenizer; without one, token ids are shown. A failed episode shows its failure (kind, reason, place in the
environment's code, traceback) and the turns of the seat that failed, as far as it got. Each episode names
its trace id: where the run exports traces (`tracking.otlp_endpoint`), its spans are under that id."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import streamlit as st

from rollout.control.reads import (
    EpisodeRow,
    SampledTurn,
    SeatOpened,
    find_episodes,
    list_runs,
    records_of,
    seat_events,
    turn_recorded,
)
from rollout.monitor.plain import plain
from rollout.tracking.spans import episode_trace_id

if TYPE_CHECKING:
    from rollout.monitor.context import Monitor

PAGE = 50
VERSION_COLOURS = ("#dbeafe", "#dcfce7", "#fef9c3", "#fee2e2", "#f3e8ff", "#cffafe", "#ffedd5", "#e5e7eb")


def render(monitor: Monitor) -> None:
    st.title("Transcripts")
    runs = [r.run for r in monitor.read(list_runs)]
    params = st.query_params
    left, middle, right = st.columns(3)
    if (wanted := params.get("run")) is not None and wanted not in runs:
        st.warning(f"The ledger has no run {plain(repr(wanted))}.")
    run = left.selectbox("run", ["(any)", *runs], index=_index(["(any)", *runs], params.get("run")))
    episode = middle.text_input("episode (id or prefix)", value=params.get("episode", ""))
    agent = right.text_input("agent", value="")
    low, high, page_column = st.columns(3)
    min_reward = low.number_input("reward at least", value=None, placeholder="any")
    max_reward = high.number_input("reward at most", value=None, placeholder="any")
    page = int(page_column.number_input("page", min_value=1, value=1, step=1))
    chosen_run = None if run == "(any)" else run
    episodes = monitor.read(
        lambda ledger: find_episodes(
            ledger,
            run=chosen_run,
            episode=episode or None,
            agent=agent or None,
            min_reward=min_reward,
            max_reward=max_reward,
            limit=PAGE,
            offset=(page - 1) * PAGE,
        )
    )
    if not episodes:
        st.info("No episode matches." if (chosen_run or episode or agent) else "No episode recorded yet.")
        return
    st.dataframe(
        [
            {
                "run": e.run,
                "episode": e.episode,
                "finished": e.finished,
                "rewards": ", ".join(f"{a} {r:.3f}" for a, r in e.rewards.items()),
                "turns": sum(e.turns.values()),
                "recorded": e.recorded_at.strftime("%H:%M:%S"),
            }
            for e in episodes
        ],
        hide_index=True,
        width="stretch",
    )
    labels = [f"{e.run} / {e.episode}" for e in episodes]
    picked = st.selectbox("episode", labels)
    if picked is not None:
        show_episode(monitor, episodes[labels.index(picked)])


def _index(options: list[str], wanted: str | None) -> int:
    return options.index(wanted) if wanted in options else 0


def show_episode(monitor: Monitor, episode: EpisodeRow) -> None:
    st.subheader(plain(f"{episode.run} / {episode.episode}"))
    # Derived from the names, as the run's feed derives it: the same id in any OTLP collector's view.
    st.caption(f"trace id {episode_trace_id(episode.run, episode.episode)} (where the run exports traces)")
    seats = dict(episode.seats)
    failure = episode.failure
    if failure is not None:
        st.error(plain(f"{failure.kind}: {failure.summary}"))
        if failure.detail:
            with st.expander("traceback"):
                st.code(failure.detail, language="text")
        if failure.seat and failure.seat not in seats.values():
            seats[failure.seat.rsplit("/", 1)[-1]] = failure.seat  # the failed seat: how far it got
    elif episode.error:
        st.error(plain(episode.error))
    by_version = st.toggle("colour tokens by the checkpoint version that sampled them", value=False)
    tokenizer = _tokenizer(monitor)
    for agent, seat in seats.items():
        reward = episode.rewards.get(agent)
        shown = reward if reward is not None else "—"
        events = monitor.read(lambda ledger, seat=seat: seat_events(ledger, seat))
        opened = next((o.checkpoint for o in records_of(events, SeatOpened)), None)
        pinned = episode.pinned.get(agent) or opened
        against = f" · pinned to {plain(pinned)}" if pinned else ""
        st.markdown(f"**{plain(agent)}** · seat {plain(seat)} · reward {plain(shown)}{against}")
        segment = None
        for event in events:
            if event.kind != "TurnRecorded":
                continue
            turn = turn_recorded(event.payload)
            _show_turn(turn, tokenizer, by_version, new_segment=getattr(turn, "segment_id", None) != segment)
            segment = getattr(turn, "segment_id", None)


def _show_turn(turn: Any, tokenizer: Any, by_version: bool, *, new_segment: bool) -> None:
    marks = []
    if new_segment and isinstance(turn, SampledTurn):
        marks.append(f"new segment {plain(turn.segment_id[:8])}")
    if turn.aborted:
        marks.append(f":red[aborted ({plain(turn.aborted)}): never trained]")
    title = f"turn {turn.turn_index}" + (f" · {' · '.join(marks)}" if marks else "")
    with st.container(border=True):
        st.caption(title)
        if isinstance(turn, SampledTurn):
            if tokenizer is not None and turn.prompt_ids_delta:
                st.code(tokenizer.decode(list(turn.prompt_ids_delta)), language=None, wrap_lines=True)
            st.caption(
                f"sampled by {plain(turn.checkpoint)} (version {turn.checkpoint_version}) on {plain(turn.engine)} "
                f"· {len(turn.completion_ids)} tokens · {plain(turn.finish_reason)}"
            )
            st.html(_coloured(turn, tokenizer, by_version))
        reply = turn.reply
        for call in reply.get("tool_calls") or []:
            st.markdown(f"tool call **{plain(call.get('name'))}** {plain(call.get('arguments'))}")


def _coloured(turn: SampledTurn, tokenizer: Any, by_version: bool) -> str:
    spans = []
    for token, logprob in zip(turn.completion_ids, turn.completion_logprobs, strict=True):
        text = tokenizer.decode([token]) if tokenizer is not None else f"[{token}]"
        if by_version:
            colour = VERSION_COLOURS[turn.checkpoint_version % len(VERSION_COLOURS)]
        else:
            # Likely tokens pale, unlikely ones deep red: p = exp(logprob).
            probability = math.exp(max(logprob, -30.0))
            colour = f"rgba(220, 38, 38, {0.85 * (1.0 - probability):.2f})"
        spans.append(
            f'<span title="logprob {logprob:.3f} · version {turn.checkpoint_version}" '
            f'style="background:{colour};white-space:pre-wrap">{html.escape(text)}</span>'
        )
    return f'<div style="font-family:monospace;line-height:1.6">{"".join(spans)}</div>'


class _FastDecoder:
    """A model's `tokenizer.json` read by the `tokenizers` library alone: what decoding needs, without
    importing transformers (seconds, on the first transcript a dashboard opens)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)


@st.cache_resource(show_spinner=False)
def _tokenizer_for(path: str) -> Any:
    if (Path(path) / "tokenizer.json").is_file():
        return _FastDecoder(Path(path) / "tokenizer.json")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _tokenizer(monitor: Monitor) -> Any:
    from rollout.engines.models import resolve

    try:
        path = resolve(
            monitor.settings.services.gateway.model, Path(monitor.settings.models_dir).expanduser()
        )
        return _tokenizer_for(path)
    except Exception:  # no model here (a monitor on another machine): show token ids instead
        return None
