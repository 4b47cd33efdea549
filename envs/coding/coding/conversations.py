"""Which of a CLI agent's conversations are side requests, for an environment's `trains`.

Claude Code and Codex hold several conversations on one seat (each a segment, see docs/agents.md). Besides the
task itself, the ones seen from the pinned versions (Claude Code 2.1, Codex 0.171):
- `sub-agent`: Claude Code's Agent tool runs a loop of its own, marked `cc_is_subagent=true` in its system
  prompt;
- `compaction`: the client asks the model to summarise the conversation so far (Claude Code's `/compact` and
  auto-compaction, Codex's auto-compaction). The conversation that goes on from the summary is the task again;
- `title`: a request with no tools whose system prompt asks for a title.
`side_request(conversation)` names which one a conversation is, or None for the task's own conversation (a
rewrite included). `task_only` trains the task alone: `Environment(..., trains=task_only)`. The markers are
the clients' own wording; a client that changes it makes its side requests train, never the task drop out.
"""

from __future__ import annotations

from rollout.environment import Conversation

SUB_AGENT_MARK = "cc_is_subagent=true"
COMPACTION_MARKS = (
    "create a detailed summary of the conversation so far",  # Claude Code
    "CONTEXT CHECKPOINT COMPACTION",  # Codex
)


def side_request(conversation: Conversation) -> str | None:
    if SUB_AGENT_MARK in conversation.system:
        return "sub-agent"
    if any(mark in conversation.last_user for mark in COMPACTION_MARKS):
        return "compaction"
    if not conversation.tools and "title" in conversation.system.lower():
        return "title"
    return None


def task_only(conversation: Conversation) -> bool:
    return side_request(conversation) is None
