"""affected's kept verdicts: per module, the fingerprint of its inputs as last built (its content
and generator records) and the result of the tests that covered it then. A rerun over a module
whose inputs are unchanged since a verdict that is not a pass runs its tests again (no rebuild:
they are built), so a failure is never turned green by asking again; "nothing changed" is said
over passing verdicts only, with when and what passed.

The file: fidev.core.workspace.VERDICTS in the version folder, {"schema": SCHEMA, "modules":
{name: {"inputs", "result", "when", "tests", "failed"}}}, written whole (a temporary file renamed).
A result is "passed", "failed" or "unfinished" (recorded once the rebuild is done, before the
tests start, and where the build fails or is stopped: a run that does not end leaves that)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from fidev.core.failure import Failure
from fidev.core.files import read_record, write_whole
from fidev.core.workspace import GENERATORS, INPUTS

SCHEMA = "fidev-affected-verdicts/1"
RESULTS = ("passed", "failed", "unfinished")


def fingerprint(build_dir: Path) -> str | None:
    """The module's inputs as last built: its content record and its generators' record; None
    without a content record (nothing to tell a change by)."""
    try:
        digest = hashlib.sha256((build_dir / INPUTS).read_bytes())
    except OSError:
        return None
    try:
        digest.update((build_dir / GENERATORS).read_bytes())
    except OSError:
        pass
    return digest.hexdigest()


@dataclass
class Verdict:
    inputs: str
    result: str
    when: str
    tests: list[str]
    failed: list[str]


def well_formed(modules) -> bool:
    """Whether the file's modules have the shape `Kept.record` writes: {name: a Verdict's fields}."""
    return isinstance(modules, dict) and all(
        isinstance(v, dict) and set(v) == set(Verdict.__dataclass_fields__) and v["result"] in RESULTS
        and all(isinstance(v[k], str) for k in ("inputs", "when"))
        and all(isinstance(v[k], list) and all(isinstance(t, str) for t in v[k]) for k in ("tests", "failed"))
        for v in modules.values())


class Kept:
    """The verdicts of one version folder; `problem` says why an existing file was not read (then
    any module may have had a verdict that is not a pass: affected tests them all again)."""

    def __init__(self, path: Path):
        self.path, self.problem, self.modules = path, None, {}
        if not path.exists():
            return
        try:
            data = read_record(path, SCHEMA, "affected's kept verdicts", "")
        except Failure as failure:
            self.problem = failure.problem
            return
        if not well_formed(data.get("modules")):
            self.problem = f"affected's kept verdicts {path} cannot be read (its modules are not of the shape {SCHEMA} gives them)"
            return
        self.modules = {name: Verdict(**v) for name, v in data["modules"].items()}

    def standing(self, name: str, build_dir: Path) -> Verdict | None:
        """The module's verdict, where its inputs are still those it was given on."""
        verdict = self.modules.get(name)
        return verdict if verdict is not None and verdict.inputs == fingerprint(build_dir) else None

    def record(self, results: dict[str, tuple[Path, str, list[str], list[str]]]) -> None:
        """{module: (build dir, result, its tests, those that failed)}, kept whole."""
        when = time.strftime("%Y-%m-%d %H:%M:%S")
        for name, (build_dir, result, tests, failed) in results.items():
            inputs = fingerprint(build_dir)
            if inputs is None:
                self.modules.pop(name, None)
            else:
                self.modules[name] = Verdict(inputs, result, when, sorted(tests), sorted(failed))
        write_whole(self.path, json.dumps({"schema": SCHEMA, "modules": {n: vars(v) for n, v in sorted(self.modules.items())}}, indent=1))
