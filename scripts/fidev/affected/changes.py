"""What changed since each built module was built: its sources and headers by content against the
hashes `build` recorded (fidev.records.ninja_inputs), and the tree's Python files, which generate
modules' sources (fidev.records.build_records); for a Python edit, the modules with generated
sources regenerated without compiling, so that their sources show what changed."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fidev.affected.built import Found, Resolver
from fidev.affected.coverage import Result
from fidev.affected.report import short
from fidev.affected.selection import GENERATOR_DIR, UNTOLD, under
from fidev.affected.theirs import STOP_AFTER, FlashInferTests, cases_by_file, sample_of
from fidev.affected.verdicts import Kept
from fidev.builds import smoke_modules
from fidev.core.failure import Failure
from fidev.core.files import differs
from fidev.core.manifest import pins
from fidev.core.workspace import GENERATORS
from fidev.jit import module_choice
from fidev.records import build_records, ninja_inputs
from fidev.tree import families, release_reference


@dataclass
class Changes:
    """The Python files edited since the builds (python_edits), each module's changed generators,
    smoke's modules' new JitSpecs by name (specs), the modules whose regeneration was not done here
    (unregenerated), FlashInfer's tests started before the regeneration (early), {module: {changed
    file: how}} (changed), {changed file as shown: its modules} (by_file), and the kept not-covered
    edits (fidev.affected.verdicts.Gap) as this run finds them."""

    python_edits: list[str]
    generators: dict[str, list[str]]
    specs: dict = field(default_factory=dict)
    unregenerated: set[str] = field(default_factory=set)
    early: FlashInferTests | None = None
    changed: dict[str, dict[str, str]] = field(default_factory=dict)
    by_file: dict[str, set[str]] = field(default_factory=dict)
    uncovered: set[str] = field(default_factory=set)  # kept not-covered edits no built module compiles
    reverted: set[str] = field(default_factory=set)  # kept not-covered edits reverted since
    pending: set[str] = field(default_factory=set)  # those of them a tree record still holds as edited
    before: dict[str, list | None] = field(default_factory=dict)  # the tree's record as the run started
    lost: list[str] = field(
        default_factory=list
    )  # modules a generator edit may change that nothing here can regenerate
    now: dict[str, list | None] = field(
        default_factory=dict
    )  # the tree as this run judges it (build_records.tree_snapshot)
    unjudged_generators: list[str] = field(
        default_factory=list
    )  # generators edited since affected's last verdict, built since
    owners: dict[str, list[str]] = field(
        default_factory=dict
    )  # {changed module: the families whose sources it compiles}


def regenerate(
    tier: list[str], calls: dict[str, dict], upstream_nodes: list[str], mode: str
) -> tuple[dict, bool, set[str]]:
    """Write the generated sources of the modules again, compiling nothing: smoke's by their
    generators, FlashInfer's tests' by the call that made each one's JitSpec where its build recorded
    one (fidev.jit.module_choice.call_again), both after one import of flashinfer, in a thread; the rest
    meanwhile by a dry run of their tests (a process of its own: fidev.upstream.plan). Returns smoke's
    modules' new JitSpecs by name (a build of them rewrites build.ninja too), whether the dry run
    finished (a dropped or failed one regenerated nothing for sure), and the modules whose call did
    not make them."""
    specs, dry_run_done, raised, missed = {}, True, [], set()

    def ours() -> None:
        try:
            from fidev.jit.flashinfer_import import import_flashinfer

            import_flashinfer(mode)
            for key in tier:
                spec = smoke_modules.BY_KEY[key].make()  # the generator writes its sources (write_if_different)
                specs[spec.name] = spec
            missed.update(name for name, call in calls.items() if not module_choice.call_again(name, call))
        except BaseException as error:  # noqa: BLE001 (raised again in the main thread)
            raised.append(error)

    thread = threading.Thread(target=ours, daemon=True)
    if tier or calls:
        thread.start()
    dry_run_failure = None
    if upstream_nodes:
        from fidev.upstream import plan as upstream_plan
        from fidev.upstream import suite as upstream_suite

        try:
            tests = upstream_suite.tests_dir()
            dry_run_done = upstream_plan.plan(upstream_suite.resolve(upstream_nodes, tests), [], tests) is not None
        except Failure as failure:  # said after the import's own failure, which comes first
            dry_run_failure = failure
    if tier or calls:
        thread.join()
    for failure in [*raised, dry_run_failure]:
        if failure is not None:
            raise failure
    return specs, dry_run_done, missed


UNREADABLE = "its build record {} cannot be read"  # a changed "file" of a module whose record is unreadable


def edited(modules) -> dict[str, dict[str, str]]:
    """{module name: {changed file: how}} by content, sources and headers. A module whose content
    or generators record cannot be read (truncated, or of another shape) is said, and taken as
    edited: it is rebuilt and its tests run."""
    found, stats = {}, {}
    for m in modules:
        bad = [
            name
            for name, unreadable in (
                (ninja_inputs.STAMP, ninja_inputs.unreadable(m.build_dir)),
                (GENERATORS, build_records.unreadable_generators(m.build_dir)),
            )
            if unreadable
        ]
        if bad:
            print(
                f"affected: {m.name}: {UNREADABLE.format(bad[0])} (truncated?): it is taken as edited, "
                "rebuilt, and its tests run"
            )
            found[m.name] = {f"({UNREADABLE.format(bad[0])})": "edited"}
            continue
        edits = ninja_inputs.edited(m.build_dir, stats)
        if edits is None:  # built without a content record: ninja's mtimes decide
            pending = ninja_inputs.dry_run(m.build_dir, m.ninja_path)
            edits = (
                {f"{m.name} (no record: ninja finds newer inputs)": "edited"} if pending is None or pending[0] else {}
            )
        if edits:
            found[m.name] = edits
    return found


def regenerated_line(seconds: float, by_smoke: int, calls: int, dry: int, plain: int) -> str:
    return (
        f"affected: regenerated in {seconds:.1f} s ("
        + ", ".join(
            f"{n} {how}"
            for n, how in (
                (by_smoke, "by smoke's generators"),
                (calls, "by recorded call"),
                (dry, "by a dry run of a recorded test"),
                (plain, "of csrc/ files alone, as built"),
            )
            if n
        )
        + ")"
    )


def regenerate_edits(
    found: Found, ch: Changes, listing: bool, sampled: bool = True, stop_after: int = STOP_AFTER
) -> None:
    """After a Python edit: regenerate, compiling nothing, so that generated sources show what
    changed; FlashInfer's tests of every module it may change start first (unless listing), to
    stop at `stop_after` failing cases (0: none)."""
    tier, recorded = found.tier, found.recorded
    stale = [m for m in found.modules if ch.generators[m.name]]
    # a module of csrc/ files alone is as built (smoke's are made again all the same: cheaply, and build needs
    # their JitSpecs)
    plain = [m.name for m in stale if m.name not in tier and not m.generated]
    stale = [m for m in stale if m.name not in plain]
    lost = ch.lost = [m.name for m in stale if m.name not in tier and not recorded.get(m.name)]
    print(
        f"affected: {short(Path(f).name for f in ch.python_edits)} changed: regenerating the sources of "
        f"{len(stale) - len(lost)} module(s), compiling nothing"
        + (f"; no test is recorded for {short(lost)}, so it cannot be regenerated here" if lost else "")
    )
    theirs_stale = [m for m in stale if m.name not in tier and recorded.get(m.name)]
    calls = {m.name: call for m in theirs_stale if (call := build_records.recorded_call(m.build_dir))}
    # the rest, by one recorded test per module: any test that asks for a module makes all of its JitSpec
    dry = [m.name for m in theirs_stale if m.name not in calls]
    may_change = [m.name for m in stale if m.generated]  # what the regeneration may show changed
    if not listing and (early_tests := sorted({t.split("[")[0] for n in may_change for t in recorded.get(n, [])})):
        ch.early = FlashInferTests(
            early_tests,
            cases_by_file(recorded, may_change),
            found.ws.file_times,
            deferred=True,
            sample=sample_of(may_change, recorded, sampled),
            stop_after=stop_after,
        )
    regenerating = time.perf_counter()
    ch.specs, dry_run_done, missed = regenerate(
        [tier[m.name] for m in stale if m.name in tier], calls, sorted({min(recorded[n]) for n in dry}), found.mode
    )
    print(
        regenerated_line(
            time.perf_counter() - regenerating, sum(m.name in tier for m in stale), len(calls), len(dry), len(plain)
        ),
        flush=True,
    )
    # their tests regenerate them when they run: run those, and keep the edit unrecorded
    ch.unregenerated = missed | (set(dry) if not dry_run_done else set())
    if ch.unregenerated:
        why = "; ".join(
            w
            for w, applies in (
                ("the dry run did not finish", not dry_run_done),
                ("its recorded call made no such module", missed),
            )
            if applies
        )
        print(
            f"affected: {short(ch.unregenerated)} could not be regenerated here ({why}), so it may hold the "
            "edit: its tests run, and regenerate it"
        )


def changed_modules(found: Found, ch: Changes, listing: bool = False) -> None:
    """The modules whose inputs changed; a deleted input is refused. A module regenerated to the
    same sources, or with none to regenerate, is current as built, for the next run too; not under
    `listing`, which keeps nothing: an edit listed, then reverted, is no change."""
    ch.changed = edited(found.modules)
    for name in ch.unregenerated:
        ch.changed.setdefault(name, {})["(not regenerated)"] = "edited"
    for name, edits in ch.changed.items():
        gone = [f for f, how in edits.items() if how == "deleted"]
        if gone:
            raise Failure(
                f"{gone[0]}, an input of {name}, is gone (deleted since the build)",
                "restore it (git checkout -- FILE in the tree), or regenerate it: pixi run -e flashinfer-dev build "
                "(smoke's modules), upstream-tests FAMILY (FlashInfer's tests' modules)",
            )
    for m in found.modules:
        if (
            not listing
            and ch.generators[m.name]
            and m.name not in ch.changed
            and (
                m.name in found.tier or not m.generated or found.recorded.get(m.name) and m.name not in ch.unregenerated
            )
        ):
            build_records.record_generators(m.build_dir, found.tree)


def files_changed(found: Found, ch: Changes) -> None:
    """{changed file, as the user knows it: modules}: a generated source as the Python edit that
    changed it; include/ and csrc/ files no built module compiles, with no module."""
    real = found.tree.resolve()

    def in_tree(f: str) -> str:
        """A changed input relative to the tree (ninja's deps may name it through the editable
        install's flashinfer/data links), else as given."""
        resolved = Path(f).resolve()
        return str(resolved.relative_to(real)) if resolved.is_relative_to(real) else f

    by_file: dict[str, set[str]] = {}
    for name, edits in ch.changed.items():
        for f in edits:
            via_generator = ch.python_edits and ("/generated/" in f or f == "(not regenerated)")
            shown = f"{short(Path(g).name for g in ch.python_edits)} -> {Path(f).name}" if via_generator else in_tree(f)
            by_file.setdefault(shown, set()).add(name)
    # regenerated, and no module's sources changed; the package's Python outside its generators (a wrapper
    # such as flashinfer/norm.py) is named whatever the regeneration showed: its family's tests run it
    wrappers = [f for f in ch.python_edits if not in_tree(f).startswith(GENERATOR_DIR)]
    for f in ch.python_edits if not any(" -> " in k for k in by_file) else wrappers:
        by_file.setdefault(in_tree(f), set())
    # include/ and csrc/ files no built module compiles: named with the families that would; a reverted
    # not-covered edit is no change, though a build after the edit recorded it
    in_records = {f for d in found.dirs for f in build_records.changed_tree_files(d, found.tree) or []}
    ch.pending = ch.reverted & in_records
    unreached = sorted((in_records | ch.uncovered) - ch.reverted - set(by_file))
    # a module whose record cannot be read may compile any of them: never "reaches no built module" then
    blind = {
        name for name, edits in ch.changed.items() if any(f.startswith("(" + UNREADABLE.split("{")[0]) for f in edits)
    }
    for f in unreached:
        by_file[f] = set(blind)
    for record in filter(None, map(build_records.unreadable_tree, found.dirs)):
        print(
            f"affected: {record} cannot be read (truncated, or of another shape): an edit of include/ or csrc/ "
            "that no built module compiles cannot be told, so it counts as reaching every kernel family; the "
            "next build writes it again"
        )
        by_file[UNTOLD] = set()
    ch.by_file = by_file


def compilers(found: Found) -> dict[str, list[str]]:
    """{input of a built module, resolved as built.Resolver does: the modules that compile it}."""
    resolved, by_input = Resolver(), {}
    for m in found.modules:
        for p in ninja_inputs.inputs(m.build_dir, m.ninja_path):
            names = by_input.setdefault(resolved(p), [])
            if m.name not in names:
                names.append(m.name)
    return by_input


def unjudged(
    found: Found, ch: Changes, judged: dict[str, list | None] | None
) -> tuple[list[str], dict[str, list | None]]:
    """The files of affected's snapshot (build_records.tree_snapshot) that differ from its last
    verdict's (`judged`), with their facts there; where it has given none here, those that differ
    from the pinned release (fidev.tree.release_reference), with their released facts where the
    release's record has them, or none where the tree has no release to tell them by (said)."""
    if judged is not None:
        return sorted(
            rel
            for rel in set(ch.now) | set(judged)
            if rel not in judged
            or rel not in ch.now
            or (judged[rel] or [None] * 3)[2:] != (ch.now[rel] or [None] * 3)[2:]
        ), judged
    try:
        edits = [rel for rel in release_reference.edited_files(found.tree, pins()) if build_records.judged_part(rel)]
    except Failure as failure:
        print(
            f"affected: no verdict of its own is kept here yet, and {failure.problem}: an edit a build "
            "recorded before this run is not seen (every later one is)"
        )
        return [], {}
    return edits, release_reference.released_facts(found.tree)


def since_judged(found: Found, ch: Changes, kept: Kept, by_input: Callable[[], dict[str, list[str]]]) -> None:
    """The files edited since affected's last verdict that no build record shows, because a build
    (build, smoke, upstream-tests) recorded them since: each with the modules that compile it (an
    include/ or csrc/ file, by their recorded inputs) or that were generated after it (a generator,
    by their generators record), whose tests run (rebuilding them is a no-op); the kernel families
    it reaches run theirs (fidev.affected.selection.selection). A kept gap's file reverted to its
    content before the edit is none. Its content as judged (or released) is its content before the
    edit (`ch.before`), so that a gap kept on it ends once it is reverted."""
    shown = set(ch.by_file) | ch.reverted | {under(found.tree, f) for f in ch.python_edits}
    found_edits, baseline = unjudged(found, ch, kept.judged)
    edits = [rel for rel in found_edits if rel not in shown and (found.tree / rel).exists()]
    if not edits:
        return
    for rel in edits:
        path = found.tree / rel
        if baseline.get(rel) is not None:
            ch.before[rel] = baseline[rel]
        if rel.startswith("flashinfer/"):
            modules = [
                m.name
                for m in found.modules
                if (m.generated or m.name in found.tier)
                and (fact := build_records.generators_before(m.build_dir, found.tree).get(rel))
                and not differs(path, fact)
            ]
            ch.unjudged_generators.append(str(path))
        else:
            modules = by_input().get(str(path.resolve()), [])
        for name in modules:
            ch.changed.setdefault(name, {})[str(path)] = "built since"
        ch.by_file[rel] = set(modules)
    since = (
        "since its last verdict"
        if kept.judged is not None
        else "from the pinned release (it has given no verdict here yet)"
    )
    print(
        f"affected: {short(edits)} changed {since}, and a build recorded the edit since: its modules' tests "
        "and its kernel families' run"
    )


def uncovered_edits(found: Found, ch: Changes, kept: Kept, by_input: Callable[[], dict[str, list[str]]]) -> None:
    """The edits kept as not covered: reverted since (content as before the edit), or still there,
    and then changed again, with the modules that compile them (their tests run), whatever a
    later build recorded of the tree."""
    for rel, gap in sorted(kept.gaps.items()):
        path = found.tree / rel
        if gap.reverted(path):
            ch.reverted.add(rel)
            continue
        if gap.result != Result.NOT_COVERED:
            print(
                f"affected: {rel}: the tests of {', '.join(gap.families)} it reaches "
                f"{'failed' if gap.result == Result.FAILED else 'did not finish'} at {gap.when} (kept): "
                "they run again until they pass, or it is reverted"
            )
        else:
            print(
                f"affected: {rel} reached {', '.join(gap.families)} untested at {gap.when} (kept): "
                "not covered until those tests run and pass, or it is reverted"
            )
        modules = by_input().get(str(path.resolve()), [])  # the built modules that compile it
        for name in modules:
            ch.changed.setdefault(name, {})[str(path)] = Result.NOT_COVERED
        if not modules:
            ch.uncovered.add(rel)


UNKEPT = "(affected's kept verdicts cannot be read: its tests run again)"  # a changed "file" of every module then


def standing_failures(found: Found, ch: Changes, kept: Kept) -> None:
    """The modules unchanged since a verdict that is not a pass (failed, or tests that did not
    finish): their tests run again, so asking again never turns a failure green. Where the kept
    verdicts cannot be read, that is every module."""
    for m in found.modules:
        if kept.problem and m.name not in ch.changed:
            ch.changed[m.name] = {UNKEPT: "unknown"}
        verdict = None if m.name in ch.changed else kept.standing(m.name, m.build_dir)
        if verdict is not None and verdict.result != Result.PASSED:
            ch.changed[m.name] = {
                f"(the last run {verdict.result} at {verdict.when}: its tests run again)": verdict.result
            }


def before_edits(found: Found) -> dict[str, list | None]:
    """{file of the tree: its fact before the edit} as the run starts, before its rebuild records
    it again: the generators (flashinfer/jit/) as the modules' records hold them, include/ and csrc/
    as the JIT dirs' tree records do. Of several records, one that differs from the file now: a
    record a later build made of the edited file is no content before the edit (a gap kept with it
    would read as reverted at once)."""
    facts: dict[str, list] = {}
    for m in found.modules:
        for rel, fact in build_records.generators_before(m.build_dir, found.tree).items():
            facts.setdefault(rel, []).append(fact)
    for d in found.dirs:
        for rel, fact in build_records.tree_record(d).items():
            facts.setdefault(rel, []).append(fact)
    before = {}
    for rel, candidates in facts.items():
        differing = [fact for fact in candidates if differs(found.tree / rel, fact)]
        if differing:
            before[rel] = differing[0]
    return before


def find(found: Found, listing: bool, kept: Kept, sampled: bool = True, stop_after: int = STOP_AFTER) -> Changes:
    """What changed since the builds, each changed file with its modules, and the modules whose
    last verdict stands as not a pass; FlashInfer's tests a Python edit starts early stop at
    `stop_after` failing cases (0: every case runs)."""
    generators = {m.name: build_records.changed_generators(m.build_dir, found.tree) or [] for m in found.modules}
    ch = Changes(sorted({f for files in generators.values() for f in files}), generators)
    ch.now = build_records.tree_snapshot(found.tree, kept.judged)
    ch.before = before_edits(found)
    if ch.python_edits:  # regenerate, compiling nothing, so that generated sources show what changed
        regenerate_edits(found, ch, listing, sampled, stop_after)
    changed_modules(found, ch, listing)
    by_input = functools.cache(lambda: compilers(found))  # read once, where a change needs it
    uncovered_edits(found, ch, kept, by_input)
    standing_failures(found, ch, kept)
    files_changed(found, ch)
    since_judged(found, ch, kept, by_input)
    if ch.changed:
        inputs: dict[str, set[str]] = {}
        for path, names in by_input().items():
            for name in names:
                if name in ch.changed:
                    inputs.setdefault(name, set()).add(path)
        ch.owners = families.owners(found.tree, inputs)
    return ch
