"""Every script (scripts/) and maintainer tool (tools/) answers --help: status 0, no traceback, the
first paragraph of its docstring whole, and a help line for every option and argument, as argparse
holds them (each parser's actions, read in the script's own process as it parses --help).
upstream_tests.py has its own parser, which prints its docstring: it is run, not read per option."""

import ast
import json
import os
import subprocess
import sys

import pytest

from fidev.core.manifest import ROOT

OWN_PARSER = {"upstream_tests.py"}  # prints its docstring; no argparse parser to read
# The script's process: argparse's parsers note their actions as each parses, then the script runs
# as `python SCRIPT --help` would run it.
DRIVER = """\
import argparse, json, runpy, sys
script, dump = sys.argv[1], sys.argv[2]
sys.argv = [script, "--help"]
parsers = []
parse_known_args = argparse.ArgumentParser.parse_known_args

def noted(self, args=None, namespace=None):
    actions = [a for a in self._actions if not isinstance(a, argparse._HelpAction)]
    parsers.append({"prog": self.prog, "actions": [{"name": "/".join(a.option_strings) or a.dest, "help": a.help} \
for a in actions]})
    with open(dump, "w") as f:
        json.dump(parsers, f)
    return parse_known_args(self, args, namespace)

argparse.ArgumentParser.parse_known_args = noted
runpy.run_path(script, run_name="__main__")
"""


def scripts() -> list:
    return sorted([*(ROOT / "scripts").glob("*.py"), *(ROOT / "tools").glob("*.py")])


def run_help(script, tmp_path):
    """(the finished process, the parsers it made as JSON: [] where none parsed)."""
    dump = tmp_path / "parsers.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "scripts"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(script), str(dump)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=script.parent,
        env=env,
    )
    return done, json.loads(dump.read_text()) if dump.is_file() else []


def without_help(parsers) -> list[str]:
    return [f"{p['prog']}: {a['name']}" for p in parsers for a in p["actions"] if not (a["help"] or "").strip()]


def first_paragraph(script) -> str:
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


@pytest.mark.parametrize("script", [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in scripts()])
def test_help_is_whole_and_names_every_option(script, tmp_path):
    done, parsers = run_help(script, tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in out, out
    assert first_paragraph(script) and first_paragraph(script) in " ".join(done.stdout.split()), (
        f"--help must show the docstring's first paragraph whole:\n{done.stdout}"
    )
    if script.name in OWN_PARSER:
        return
    assert parsers, f"{script.name} made no argparse parser"
    assert without_help(parsers) == [], "give every option a help line"


def test_an_option_without_help_is_found(tmp_path):
    """The check above on a small parser: an option without help is named; with help, none is."""
    script = tmp_path / "small.py"
    script.write_text(
        '"""A small tool."""\nimport argparse\n'
        'parser = argparse.ArgumentParser(description=__doc__)\n'
        'parser.add_argument("--said", help="has a help line")\n'
        'parser.add_argument("--unsaid")\n'
        'parser.add_argument("path", help="")\n'
        'parser.parse_args()\n'
    )
    done, parsers = run_help(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert without_help(parsers) == ["small.py: --unsaid", "small.py: path"]
