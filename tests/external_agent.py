"""An external agent loop for tests: a script on the OpenAI SDK, pointed at its seat by the environment
variables the runner sets. It asks the question twice (two turns), checks it runs in its working directory,
and prints the model's last answer."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import openai
from openai.types.chat import ChatCompletionMessageParam


def main() -> int:
    assert Path.cwd() == Path(sys.argv[1]).resolve(), "the command runs in its own working directory"
    client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY name the seat
    question = os.environ["ROLLOUT_PROMPT"]
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": question}]
    answer = ""
    for _ in range(2):
        reply = client.chat.completions.create(model="default", messages=messages)
        answer = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": f"Are you sure? {question}"})
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
