"""What a command seat's jail reads of a Python environment (rollout.sandbox.programs): the distributions its
program runs on, never the environment whole. A virtual environment is laid out here as an installer leaves
it (dist-info folders with METADATA and RECORD), holding a console script, what it requires, an unrelated
`grader` package with an answer in its data, and a package only an extra would need; then the real jail runs
the script, and the policy's attempts to read or import the grader fail."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rollout.config import SandboxIsolation
from rollout.sandbox.programs import ProgramNotFound, program_install
from rollout.sandbox.seat_jail import seat_jail

ANSWER = "the grader's answer: 42"
BASE = Path(getattr(sys, "_base_executable", sys.executable))
VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"


def _distribution(
    site: Path, name: str, files: dict[str, str], requires: list[str], scripts: list[str]
) -> None:
    info = f"{name.replace('-', '_')}-1.0.dist-info"
    for relative, text in files.items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_text(text)
    (site / info).mkdir()
    metadata = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        "Version: 1.0",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    (site / info / "METADATA").write_text("\n".join(metadata) + "\n")
    record = [*files, f"{info}/METADATA", f"{info}/RECORD", *(f"../../../bin/{s}" for s in scripts)]
    (site / info / "RECORD").write_text("".join(f"{path},,\n" for path in record))


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    prefix = tmp_path / "venv"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "pyvenv.cfg").write_text(f"home = {BASE.parent}\ninclude-system-site-packages = false\n")
    (prefix / "bin" / "python").symlink_to(BASE)
    site = prefix / "lib" / VERSION / "site-packages"
    site.mkdir(parents=True)
    _distribution(
        site,
        "agent-tool",
        {"agent_tool/__init__.py": "import helper\nprint('agent ran on', helper.NAME)\n"},
        ["helper>=1", 'unwanted ; extra == "extras"', 'also-unwanted ; python_version < "3"'],
        ["agent-tool"],
    )
    _distribution(site, "helper", {"helper.py": "NAME = 'helper'\n"}, [], [])
    _distribution(site, "unwanted", {"unwanted/__init__.py": ""}, [], [])
    _distribution(site, "also-unwanted", {"also_unwanted/__init__.py": ""}, [], [])
    _distribution(
        site,
        "rollout-env-grader",
        {"grader/__init__.py": "", "grader/dataset/answer.txt": ANSWER},
        [],
        [],
    )
    script = prefix / "bin" / "agent-tool"
    script.write_text(f"#!{prefix}/bin/python\nimport agent_tool\n")
    script.chmod(0o755)
    return prefix


def _site(venv: Path) -> Path:
    return venv / "lib" / VERSION / "site-packages"


def test_a_console_script_reads_its_own_distribution_and_what_it_requires(venv: Path) -> None:
    install = program_install(str(venv / "bin" / "agent-tool"), "/usr/bin")
    site = _site(venv)
    read = {path.relative_to(site).parts[0] for path in install.readable if path.is_relative_to(site)}
    assert read == {"agent_tool", "agent_tool-1.0.dist-info", "helper.py", "helper-1.0.dist-info"}
    assert venv not in install.readable and site not in install.readable, "never the environment whole"
    assert venv / "pyvenv.cfg" in install.readable and venv / "bin" in install.readable


def test_named_packages_are_read_and_a_missing_one_is_named(venv: Path) -> None:
    python = str(venv / "bin" / "python")
    bare = program_install(python, "/usr/bin")
    assert not [path for path in bare.readable if path.is_relative_to(_site(venv))], "the interpreter alone"
    named = program_install(python, "/usr/bin", ("Rollout_Env.Grader",))
    assert _site(venv) / "grader" in named.readable, "a name is matched as pip matches it"
    with pytest.raises(ProgramNotFound, match="'nothing-such'"):
        program_install(python, "/usr/bin", ("nothing-such",))


async def test_the_jail_runs_the_script_and_hides_the_rest_of_the_environment(venv: Path) -> None:
    site = _site(venv)
    async with seat_jail(
        str(venv / "bin" / "agent-tool"),
        gateway_url="http://127.0.0.1:9",
        token="t",
        isolation=SandboxIsolation.bwrap,
    ) as seat:

        async def run(*argv: str) -> tuple[int | None, str]:
            done = await seat.run(list(argv), env={}, cwd="", timeout_s=60, max_output_bytes=64 * 1024)
            return done.exit_code, done.output

        assert await run("agent-tool") == (0, "agent ran on helper\n")
        code, output = await run(str(venv / "bin" / "python"), "-c", "import grader")
        assert code != 0 and "No module named 'grader'" in output
        code, output = await run("cat", str(site / "grader" / "dataset" / "answer.txt"))
        assert code != 0 and ANSWER not in output
        code, output = await run("ls", "-A", str(site))
        assert sorted(output.split()) == sorted(
            ["agent_tool", "agent_tool-1.0.dist-info", "helper.py", "helper-1.0.dist-info"]
        )
        await run("touch", str(site / "planted.py"))  # under /tmp: the jail's own tmpfs, if anywhere
        assert not (site / "planted.py").exists()
        if (base_site := BASE.parent.parent / "lib" / VERSION / "site-packages").is_dir():
            # The base interpreter's own packages are masked too (unless it lives in /usr, the system's).
            code, output = await run("ls", "-A", str(base_site))
            assert output.strip() == "" or BASE.is_relative_to("/usr"), output
