"""A hostile policy's environment, for tests/test_sandbox_escape.py: the coding task `clamp` in a `shell`
sandbox, played by two agents at once, each an attacker.

- `shell`: the built-in loop driven by a scripted policy (`red_team_policy`, served by the scripted engine):
  each of its tool calls is one attack of `attacks(targets)`, then it writes a solution that tries to forge
  the grader's report, and hands in.
- `seat`: a command seat whose script (tests/red_team_agent.py, standing in for Claude Code) runs the same
  attacks from its own jail and leaves what each did in `results.json`. Its interpreter is `SEAT_VENV`'s, a
  virtual environment where the test installed the `coding` wheel non-editable (as the image does), so the
  grader's answers are in that environment's site-packages.

An attack's command exits 0 only if it got through. The attacks that would harm the machine if the jail failed
(`HARMFUL`) are run only once the same agent has seen, from inside its jail, a PID namespace of its own and
rlimits in force (`in_force`); otherwise they are answered "skipped". The test writes what to attack (paths,
ports, pids of its stack) to `TARGETS` first. Each agent's metrics: `attack/NAME` (1 blocked, 0 through, -1
skipped), `in_force`, and for the shell agent `reset_cleared` (the claim's workspace held nothing of the last
episode's when it began), `file_limit_kib` (the RLIMIT_FSIZE its probe saw: the environment's own
`SHELL_FILE_LIMIT`) and the grade's `tests_passed`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from coding.environment import ShellCoding
from coding.tasks import task_named
from rollout.contracts import Message, ToolCall
from rollout.environment import AgentSeatSpec, Dataset, Environment, SandboxSpec
from rollout.harness import CommandOutcome, CommandSetup, End, Observation, RunContext, Task
from rollout.sandbox import SandboxClient
from rollout.security.isolation import JailLimits, MiB

TARGETS = Path(tempfile.gettempdir()) / "rollout-red-team.json"
KIND = "shell#red-team"
SEAT_FAILURE = Path(tempfile.gettempdir()) / "rollout-red-team-seat.log"
AGENT_SCRIPT = str(Path(__file__).with_name("red_team_agent.py"))
SEAT_VENV = Path(__file__).parents[1] / "build" / "red-team-venv"
HARMFUL = frozenset({"signal-a-host-process", "fork-bomb", "write-10-gb"})
SHELL_FILE_LIMIT = JailLimits(file_bytes=64 * MiB)
DONE = "ATTACK-DONE"  # appended to every attack's answer: how the scripted policy counts where it is
PROBE = "echo \"pid=$$ nproc=$(ulimit -u) fsize=$(ulimit -f) cwd=$PWD files=$(ls -A | tr '\\n' ,)\""

# A wrong `clamp` that tries to pass anyway: it patches unittest, writes a passing verdict to every descriptor
# it holds, and exits 0 when called (tests/test_coding_env.py grades it alone too). NAMES: the hidden tests'
# names.
FORGER = """import json, os, unittest
unittest.TestCase.assertEqual = lambda *args, **kwargs: None
unittest.TestCase.assertTrue = lambda *args, **kwargs: None
verdict = json.dumps({"value": 10, "passed": NAMES, "failed": {}, "error": ""}) + "\\n"
for fd in os.listdir("/proc/self/fd"):
    try:
        os.write(int(fd), verdict.encode())
    except OSError:
        pass
def clamp(value, low, high):
    raise SystemExit(0)
"""


def attacks(targets: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, shell command that exits 0 only if the attack got through), in the order they are sent."""
    port = targets["ports"]
    listed: list[tuple[str, str]] = [
        ("read-operator-key", f"cat {targets['operator_key']}"),
        ("read-gateway-secret", f"cat {targets['gateway_secret']}"),
        ("read-sandbox-key", f"cat {targets['sandbox_key']}"),
        ("list-the-data-directory", f"ls {targets['data_dir']}/logs"),
        ("read-another-claims-workdir", f"cat {targets['other_workdir']}/secret.txt"),
        ("read-the-hidden-tests", f"cat {targets['hidden_tests']}"),
        ("import-the-grader", "python3 -c 'import coding.grader'"),
        ("read-the-installed-grader", f"cat {targets['installed_hidden_tests']}"),
        ("import-the-installed-grader", f"{SEAT_VENV}/bin/python -c 'import coding.grader'"),
        ("read-a-stack-process-environ", f"grep -qa PATH /proc/{targets['pids']['gateway']}/environ"),
        ("read-a-stack-process-cmdline", f"grep -qa rollout /proc/{targets['pids']['runner']}/cmdline"),
        ("see-the-stack-processes", "ls /proc | grep -q '^[0-9]\\{3,\\}$'"),
        ("connect-postgres", f"exec 3<>/dev/tcp/127.0.0.1/{port['postgres']}"),
        ("connect-temporal", f"exec 3<>/dev/tcp/127.0.0.1/{port['temporal']}"),
        ("connect-the-engine", f"exec 3<>/dev/tcp/127.0.0.1/{port['engine']}"),
        # A command seat's loopback has its own seat's gateway port: there, only the proxy's 403 is a refusal.
        (
            "reach-the-gateway-operator-routes",
            _http_reached(f"http://127.0.0.1:{port['gateway']}/operator/seats"),
        ),
        (
            "reach-another-seats-routes",
            _http_reached(f"http://127.0.0.1:{port['gateway']}/s/rs-{'0' * 40}/v1/models"),
        ),
        # Its `bin`: what a command seat's jail binds of it, read-only (the folder around it may be the jail's
        # own tmpfs, where a checkout under /tmp puts it).
        ("write-the-virtual-environment", f"touch {targets['venv']}/bin/red-team-was-here"),
        ("write-the-installed-packages", f"touch {targets['packages']}/red-team-was-here"),
        ("signal-a-host-process", f"kill -TERM {targets['pids']['victim']}"),
        # Once it runs, only the shell's builtins are used: a fork would wait on bash's retries for seconds.
        (
            "fork-bomb",
            "bomb() { bomb | bomb & }; bomb; SECONDS=0; while [ $SECONDS -lt 2 ]; do :; done; "
            "set -- /proc/[0-9]*; [ $# -gt 1000 ]",
        ),
        ("write-10-gb", "head -c 10G /dev/zero > big; status=$?; rm -f big; exit $status"),
        (
            "outlive-the-claim",
            f"setsid sleep {targets['sleep']} >/dev/null 2>&1 < /dev/null & sleep 0.2; false",
        ),
        (
            "lock-a-folder-from-reset",
            "mkdir -p locked/deep && echo x > locked/deep/f && chmod 000 locked; false",
        ),
    ]
    return listed


def _http_reached(url: str) -> str:
    """A command that exits 0 if a POST to `url` got an answer other than the seat proxy's refusal."""
    script = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        f"    urllib.request.urlopen(urllib.request.Request({url!r}, data=b'{{}}'), timeout=5)\n"
        "except urllib.error.HTTPError as error:\n"
        "    sys.exit(1 if b'only its own seat' in error.read() else 0)\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    return f"python3 -c {shlex.quote(script)}"


def attack_command(name: str, command: str) -> str:
    return f": attack={name}; ( {command} ) >/dev/null 2>&1; echo verdict=$?"


def _targets() -> dict[str, Any]:
    return json.loads(TARGETS.read_text())


def _shell_call(number: int, command: str) -> Message:
    call = ToolCall(
        id=f"call_{number}", name="shell", arguments=json.dumps({"command": command, "timeout_s": 20})
    )
    return Message.assistant("", tool_calls=(call,))


def red_team_policy(prompt: str) -> Message:
    """The scripted policy: the probe, each attack in turn, the forged solution, then hand in."""
    done = prompt.count(DONE)
    listed = attacks(_targets())
    if done == 0:
        return _shell_call(0, f": attack=in-force; {PROBE}")
    if done <= len(listed):
        return _shell_call(done, attack_command(*listed[done - 1]))
    if done == len(listed) + 1:
        forger = FORGER.replace("NAMES", json.dumps(list(task_named("clamp").hidden_test_names())))
        return _shell_call(done, f": attack=forge-the-grade; cat > bounds.py <<'EOF'\n{forger}EOF\ntrue")
    return Message.assistant("Handing in.")


def in_force(probe_output: str) -> bool:
    """What the probe printed shows a PID namespace of its own (a low pid) and rlimits that are not
    unlimited."""
    found = dict(re.findall(r"(\w+)=(\S*)", probe_output))
    return (
        found.get("pid", "").isdigit()
        and int(found["pid"]) < 10
        and found.get("nproc") not in (None, "", "unlimited")
        and found.get("fsize") not in (None, "", "unlimited")
    )


class RedTeamShell(ShellCoding):
    def __init__(self) -> None:
        super().__init__(task_named("clamp"), max_turns=60)
        self.results: dict[str, float] = {}
        self.seen_in_force = False
        self.reset_cleared = 0.0
        self.file_limit_kib = 0.0

    async def _tool_result(self, box: SandboxClient, call: ToolCall) -> str:
        command = str(json.loads(call.arguments or "{}").get("command", ""))
        name = re.match(r": attack=([\w-]+);", command)
        attack = name.group(1) if name else ""
        if attack in HARMFUL and not self.seen_in_force:
            self.results[f"attack/{attack}"] = -1.0
            return f"skipped: the jail was not seen in force\n{DONE}"
        answer = await super()._tool_result(box, call)
        if attack == "in-force":
            self.seen_in_force = in_force(answer)
            fsize = re.search(r"fsize=(\d+)", answer)
            self.file_limit_kib = float(fsize.group(1)) if fsize else 0.0
            files = re.search(r"files=(\S*)", answer)
            self.reset_cleared = float(
                files is not None and set(files.group(1).strip(",").split(",")) <= {"bounds.py", "tests.py"}
            )
        elif attack and attack != "forge-the-grade":
            self.results[f"attack/{attack}"] = 0.0 if "verdict=0" in answer else 1.0
        return f"{answer}\n{DONE}"

    async def respond(self, run: RunContext, reply: Message) -> Observation:
        answered = await super().respond(run, reply)
        if isinstance(answered, End):
            metrics = {
                **answered.metrics,
                **self.results,
                "in_force": float(self.seen_in_force),
                "reset_cleared": self.reset_cleared,
                "file_limit_kib": self.file_limit_kib,
            }
            return replace(answered, metrics=metrics)
        return answered


class RedTeamSeat(Task):
    """The command seat: its script runs the attacks in its jail; `finish` reads what it left behind."""

    async def start(self, run: RunContext) -> Observation:
        return Observation("Attack.")

    async def prepare(self, run: RunContext, setup: CommandSetup) -> None:
        listed = [(name, attack_command(name, command)) for name, command in attacks(_targets())]
        plan = {"probe": PROBE, "attacks": listed, "harmful": sorted(HARMFUL)}
        (setup.workdir / "attacks.json").write_text(json.dumps(plan))

    async def finish(self, run: RunContext, outcome: CommandOutcome) -> End:
        results = Path(outcome.workdir) / "results.json"
        # The folder is the agent's: read only a plain file of it, and not much of one.
        if results.is_symlink() or not results.is_file() or results.stat().st_size > 100_000:
            SEAT_FAILURE.write_text(
                outcome.output[-4000:]
            )  # for the test's message: the End's text is not kept
            return End("no results", reward=0.0, metrics={"in_force": 0.0})
        found = json.loads(results.read_text())
        metrics = {"in_force": float(in_force(str(found.get("probe", ""))))}
        for name in (name for name, _ in attacks(_targets())):
            verdict = found.get("attacks", {}).get(name)
            metrics[f"attack/{name}"] = -1.0 if verdict == "skipped" else float(verdict != "verdict=0")
        return End("attacked", reward=0.0, metrics=metrics)


def _make_task(parameters: dict[str, str], agent: str) -> Task:
    return RedTeamShell() if agent == "shell" else RedTeamSeat()


environment = Environment(
    name="red-team",
    make_task=_make_task,
    source=Dataset([{"task": "clamp"}]),
    agents=(
        AgentSeatSpec("shell"),
        AgentSeatSpec(
            "seat",
            command=(str(SEAT_VENV / "bin" / "python"), AGENT_SCRIPT, "{workdir}"),
            readable=(AGENT_SCRIPT,),
            timeout_s=300,
        ),
    ),
    group_size=2,
    max_turns=60,
    # Limits of its own: the shell agent's probe shows they reached its jail through the runner's claim.
    sandbox=SandboxSpec(KIND, seats=2, wait_s=300, limits=SHELL_FILE_LIMIT),
    replayable=False,
)

assert os.path.isfile(AGENT_SCRIPT)
