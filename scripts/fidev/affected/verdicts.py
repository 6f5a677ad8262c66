"""affected's kept verdicts: per module, the fingerprint of its inputs as last built (its content
and generator records) and the result of the tests that covered it then. A rerun over a module
whose inputs are unchanged since a verdict that is not a pass runs its tests again (no rebuild:
they are built), so a failure is never turned green by asking again; "nothing changed" is said
over passing verdicts only, with when and what passed.

An edit that reaches a kernel family whose FlashInfer tests did not run is kept too, per file
(`uncovered`), with the file's content before the edit: until the edit is reverted to that, or
covered by a run of those tests that passes, every run takes the file as changed and says it is
not covered again, whatever build records the tree meanwhile. So is an edit whose reached
families' tests ran in a run that failed (result "failed"): the modules they built record the
edited tree, so without it asking again would find nothing changed; it runs them again instead.

And the tree as affected last gave a verdict on it (`judged`: include/, csrc/ and the package's
Python files, fidev.records.build_records.judged_part, as the run that gave it started): a file that differs from
it is an edit affected has not judged, even where a build (build, smoke, upstream-tests) recorded the edited file
since and so no build record shows it (fidev.affected.changes.since_judged).

The file: fidev.core.workspace.VERDICTS in the version folder, {"schema": SCHEMA, "modules":
{name: {"inputs", "result", "when", "tests", "failed"}}, "uncovered": {file relative to the tree:
{"was", "families", "when", "result"}}, "judged": {file relative to the tree: its fact}}, written
whole (a temporary file renamed); a file without `uncovered` keeps none, one without `judged` has
judged nothing yet. A result is "passed", "failed", "not covered" (its tests passed in a run
whose edit went untested: status 3) or "unfinished" (recorded before the rebuild, for each module as it
is rebuilt, before a test can load it, once the rebuild is done, and where the build fails or is stopped: a
run that does not end leaves that). `was`
is fidev.core.files.file_fact's list, or null for a file the tree did not have; a file's `result`
is "not covered" (the default, where it is absent), "failed", or "unfinished" (kept as the
families' tests start, for a run that does not end)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from fidev.affected.coverage import Result
from fidev.core.failure import Failure
from fidev.core.files import differs, is_fact, read_record, write_whole
from fidev.core.workspace import GENERATORS, INPUTS

SCHEMA = "fidev-affected-verdicts/1"
RESULTS = tuple(Result)
GAP_RESULTS = (Result.NOT_COVERED, Result.FAILED, Result.UNFINISHED)


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


@dataclass
class Gap:
    """An edited file of the tree whose kernel families' FlashInfer tests did not run: its content
    before the edit (None: a file the tree did not have), those families, and when it was said."""

    was: list | None
    families: list[str]
    when: str
    # "not covered", or "failed" (the families' tests ran in a run that failed), or "unfinished" (in one that did
    # not end)
    result: str = Result.NOT_COVERED

    def reverted(self, path: Path) -> bool:
        """Whether the file holds what it held before the edit again (a new file: removed)."""
        return not path.exists() if self.was is None else not differs(path, self.was)


def gaps_well_formed(gaps) -> bool:
    return isinstance(gaps, dict) and all(
        isinstance(g, dict)
        and set(g) | {"result"} == set(Gap.__dataclass_fields__)
        and is_fact(g["was"])
        and isinstance(g["when"], str)
        and g.get("result", Result.NOT_COVERED) in GAP_RESULTS
        and isinstance(g["families"], list)
        and all(isinstance(f, str) for f in g["families"])
        for g in gaps.values()
    )


def well_formed(modules) -> bool:
    """Whether the file's modules have the shape `Kept.record` writes: {name: a Verdict's fields}."""
    return isinstance(modules, dict) and all(
        isinstance(v, dict)
        and set(v) == set(Verdict.__dataclass_fields__)
        and v["result"] in RESULTS
        and all(isinstance(v[k], str) for k in ("inputs", "when"))
        and all(isinstance(v[k], list) and all(isinstance(t, str) for t in v[k]) for k in ("tests", "failed"))
        for v in modules.values()
    )


class Kept:
    """The verdicts of one version folder; `problem` says why an existing file was not read (then
    any module may have had a verdict that is not a pass: affected tests them all again)."""

    def __init__(self, path: Path):
        self.path, self.problem, self.modules = path, None, {}
        self.gaps: dict[str, Gap] = {}
        self.judged: dict[str, list | None] | None = None
        if not path.exists():
            return
        try:
            data = read_record(path, SCHEMA, "affected's kept verdicts", "")
        except Failure as failure:
            self.problem = failure.problem
            return
        judged = data.get("judged", {})
        if (
            not well_formed(data.get("modules"))
            or not gaps_well_formed(data.get("uncovered", {}))
            or not (isinstance(judged, dict) and all(is_fact(fact) for fact in judged.values()))
        ):
            self.problem = (
                f"affected's kept verdicts {path} cannot be read (they are not of the shape {SCHEMA} gives them)"
            )
            return
        self.modules = {name: Verdict(**v) for name, v in data["modules"].items()}
        self.gaps = {rel: Gap(**g) for rel, g in data.get("uncovered", {}).items()}
        self.judged = data.get("judged")

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
        data = {
            "schema": SCHEMA,
            "modules": {n: vars(v) for n, v in sorted(self.modules.items())},
            "uncovered": {rel: vars(g) for rel, g in sorted(self.gaps.items())},
        }
        if self.judged is not None:
            data["judged"] = dict(sorted(self.judged.items()))
        write_whole(self.path, json.dumps(data, indent=1))

    def keep_gaps(
        self,
        gaps: dict[str, list[str]],
        before: dict[str, list | None],
        pending: set[str],
        ran: dict[str, list[str]] | None = None,
        ran_result: str = Result.FAILED,
    ) -> None:
        """The run's gaps ({file: families}), and the files whose reached families' tests ran in a
        run that did not pass (`ran`, kept as `ran_result`: "failed", or "unfinished" as the tests
        start), each with its content before the edit: a kept one's, else `before` (the tree's
        record as the run started, before its rebuild recorded it again); and the kept ones of
        `pending`, files reverted that a tree record still holds as edited (or every kept one)."""
        when = time.strftime("%Y-%m-%d %H:%M:%S")

        def kept(rel: str, families: list[str], result: str) -> Gap:
            return Gap(self.gaps[rel].was if rel in self.gaps else before.get(rel), sorted(families), when, result)

        self.gaps = {
            **{rel: self.gaps[rel] for rel in pending if rel in self.gaps},
            **{rel: kept(rel, families, ran_result) for rel, families in (ran or {}).items()},
            **{rel: kept(rel, families, Result.NOT_COVERED) for rel, families in gaps.items()},
        }
