"""Run FlashInfer's own test suites (the source tree's tests/) against the editable install.

  upstream_tests.py FAMILY|PATH [FAMILY|PATH ...] [PYTEST_ARGS ...]
  upstream_tests.py --list

A FAMILY is a kernel family (--list names them and their files); a PATH is a file or node id
under the tree's tests/. From the first argument that starts with '-', the rest go to pytest
(e.g. `norm -k gemma -x`). The kernel source mode (FLASHINFER_DEV_KERNEL_SOURCE, fidev.jit.kernel_source)
is applied before anything imports flashinfer, and printed: in the default mode, `auto`, a module
flashinfer-jit-cache ships loads where none of its inputs differ from the pinned release, and
compiles from the tree where you edited one; `prebuilt` loads what the jit-cache ships, edited or
not (an edit to csrc/ or include/ is then not what the tests run); `vendored` compiles every module
from the tree.

Before running it plans: a dry run with FLASHINFER_DISABLE_JIT=1 (nothing is built or loaded, and
fidev.upstream.plugin records which modules each test asked for; spread over a pytest-xdist
process per core, up to 16, where xdist is installed) names the modules the selection needs, how
many objects of them must compile, and estimates the time. Past --budget minutes (default 10) it
stops, unless given --yes. The modules its tests asked to load that were never built then build
side by side while the run's processes start (behind affected's gate, once the whole rebuild is
done), and a test that loads one waits for that one. A dry
run that takes over 60 s is dropped, and the run shows each module's compile as it starts and ends
instead.

The run is FlashInfer CI's (fidev.upstream.runs): a pytest process per test file, the files over
the host's GPUs (`--gpus N`: the first N) one worker per GPU, longest first, each file limited to
--file-timeout seconds (default 7200); a crash or a timeout is its file's alone. `--per-gpu N`
runs each file in N parts a GPU, N processes on each GPU at once (`affected` asks for it: its
tests' processes all start at once, where pytest-xdist's start after its controller's imports); behind
affected's gate every process starts at once, up to 8 a GPU (fidev.upstream.runs.at_once). JUnit XML and
logs go to a run folder beside FlashInfer's JIT dirs; the state it keeps there (each file's time, the
baselines, which tests need each module) is checked before the plan: a file of it that is a folder, a FIFO
or a loop is refused, named, to be removed. Skips are counted by reason; out-of-memory
skips and missing-JIT-module skips (FlashInfer's conftest turns both failures into skips) fail the
run, as errors (collection, setup, teardown, a file that did not finish) do.

  upstream_tests.py FAMILY ... --sample      every value of every parameter, a few dozen cases a function
  upstream_tests.py FAMILY ... --baseline    record each test's outcome on this GPU at this tree
  upstream_tests.py FAMILY ...               then: only what changed since (exit 1 on new failures)

While it runs, a line tells the cases done of those to run, the failures so far, the time spent
and an estimate of the time left (fidev.upstream.progress): on a terminal one line rewritten in
place, in a log (the output not a terminal) a line every --progress seconds (default 30).
`--stop-after N` stops the run once its processes, over all files, parts and GPUs, have N failing
cases: no process starts, those running stop before their next case (or are interrupted); it then
names each failing case with the command that runs it alone again, says how many cases did not run,
and fails (exit 1), whatever the counts. Without it (or with 0) every case runs.

Every run that ran test files writes its result to summary.json in its run folder
(fidev.upstream.summary), and with --summary FILE to FILE as well: counts, failing and erroring
ids, each process's file, GPU and time, when the first failing case and the last case ended,
and whether it stopped early. Other tools read that file, not this output.

Options (the rest goes to pytest; one that takes a value takes it as `--budget 30` or `--budget=30`):
  --list             the families, their files and test cases
  --budget MINUTES   the compile time the plan may foresee before the run stops (default 10)
  --yes              run past the budget
  --no-plan          no dry run: each module's compile shows as the run reaches it
  --first-files F[,F...]  the plan builds ahead the modules of these test files' cases first, then what
                     their warmups ask for, then each file's first cases' (default: each file's first
                     cases' first); files of the selection, as its paths are given (tests/attention/x.py);
                     affected names those of the kernel family nearest its edit, the likeliest to catch it
  --gpus N           the host's first N GPUs (default: all it shows)
  --file-timeout S   seconds a test file's process may run (default 7200)
  --per-gpu N        each file in N parts a GPU, N processes on each GPU at once (default 1; at most 64)
  --baseline         record each test's outcome for the selection, instead of comparing with it
  --stop-after N     stop once the run has N failing cases, over all its processes (default 0: run everything;
                     refused with --baseline)
  --progress S       in a log, a progress line every S seconds (default 30; 0: none); a terminal's is rewritten in place
  --summary FILE     write the run's summary.json to FILE too (fidev.upstream.summary: schema,
                     counts, failing and erroring ids, each process's file, part, GPU and time);
                     checked before the run: a FILE that is a FIFO, a device or a folder is refused
  --sample           run a sample of each test function's cases in which every value of every
                     parameter appears, the fewest JIT modules by the record (fidev.upstream.sample);
                     it ends with what the sample covered ("rope: N of M cases, every value of
                     every parameter"), also in summary.json's `sample`. The plan is the sample's.
  --sample-seed N    the seed that breaks the sample's ties (default: fidev.upstream.sample.SEED)
  --sample-modules M[,M...]  modules the sample must exercise: a case the record names for each
                     (affected passes the modules an edit changed)
"""

from __future__ import annotations

import fidev.core.task_start  # noqa: F401 (first: Ctrl-C or SIGTERM while the task imports is our line)

# isort: split
import signal
import sys
import tempfile
from pathlib import Path

from fidev.builds import module_builds
from fidev.core import numbers, workspace
from fidev.core.failure import USAGE, Failure, report, run_main, stop_as_ctrl_c
from fidev.core.files import output_file
from fidev.core.manifest import pins
from fidev.jit import kernel_source, module_choice
from fidev.smoke import pytest_usage
from fidev.upstream import plan as upstream_plan
from fidev.upstream import progress as upstream_progress
from fidev.upstream import runs as upstream_runs
from fidev.upstream import sample as upstream_sample
from fidev.upstream import selection as upstream_selection
from fidev.upstream import settings as upstream_settings
from fidev.upstream import suite

OURS = {
    "--list": 0,
    "--summary": 1,
    "--yes": 0,
    "--budget": 1,
    "--no-plan": 0,
    "--first-files": 1,
    "--baseline": 0,
    "--gpus": 1,
    "--file-timeout": 1,
    "--per-gpu": 1,
    "-h": 0,
    "--help": 0,
    "--sample": 0,
    "--sample-seed": 1,
    "--sample-modules": 1,
    "--stop-after": 1,
    "--progress": 1,
}


def split_argv(argv: list[str]) -> tuple[dict, list[str], list[str]]:
    """(our options, the selection, pytest's arguments). An option of ours that takes a value takes it as
    `--opt value` or `--opt=value`; a flag given `=value` is bad usage."""
    ours, selection, rest, i = {}, [], [], 0
    while i < len(argv):
        arg = argv[i]
        name, equals, value = arg.partition("=")
        if arg.startswith("--") and equals and name in OURS:
            if not OURS[name]:
                raise Failure(f"{name} takes no value (given {arg!r})", f"give it alone: {name}")
            ours[name] = value
            i += 1
        elif arg in OURS:
            if OURS[arg] and (i + 1 >= len(argv) or ours_option(argv[i + 1])):  # `--summary --yes`: no value
                raise Failure(f"{arg} needs a value", "see `upstream_tests.py --help`")
            ours[arg] = argv[i + 1] if OURS[arg] else True
            i += 1 + OURS[arg]
        elif arg.startswith("-") or rest:
            rest.append(arg)
            i += 1
        else:
            selection.append(arg)
            i += 1
    return ours, selection, rest


def ours_option(arg: str) -> bool:
    """Whether `arg` is one of our options, as `--opt` or `--opt=value`."""
    return arg in OURS or (arg.startswith("--") and arg.partition("=")[0] in OURS)


# each option's reader (fidev.core.numbers): the digits 0-9, within a bound
NUMBERS = {
    "--budget": numbers.decimal_number(zero=True, most=7 * 24 * 60, unit="minutes", example="--budget 30"),
    "--gpus": numbers.whole_number(example="--gpus 2"),
    "--per-gpu": numbers.whole_number(most=upstream_runs.MOST_PER_GPU, example="--per-gpu 2"),
    "--file-timeout": numbers.whole_number(most=int(numbers.MOST_SECONDS), example="--file-timeout 3600"),
    "--sample-seed": numbers.whole_number(least=0, example="--sample-seed 7"),
    "--stop-after": numbers.whole_number(least=0, example="--stop-after 5"),
    "--progress": numbers.decimal_number(zero=True, most=24 * 3600, example="--progress 60"),
}


def number(name: str, text: str) -> float:
    try:
        return NUMBERS[name](text)
    except Failure as failure:
        raise Failure(f"{name} {failure.problem}", failure.fix) from None


def parse(argv: list[str]) -> tuple[dict, list[str], list[str], float]:
    """(our options, the selection, pytest's arguments, the budget in seconds): usage errors, checked
    before anything runs."""
    ours, selection, pytest_args = split_argv(argv)
    suite.refuse_blank(selection)  # before the tree is looked for: a usage error wherever it is
    pytest_usage.refuse_odd_paths("upstream-tests", pytest_args)  # a FIFO as --junitxml would hang each process
    budget_s = number("--budget", ours.get("--budget", "10")) * 60
    for name in ("--gpus", "--file-timeout", "--per-gpu", "--sample-seed", "--stop-after", "--progress"):
        if name in ours:
            ours[name] = number(name, ours[name])
    if "--summary" in ours:  # written at the run's end: a path it cannot write is refused before the run
        try:
            ours["--summary"] = str(output_file(ours["--summary"]))
        except Failure as failure:
            raise Failure(f"--summary {failure.problem}", failure.fix) from None
    if ours.get("--stop-after") and "--baseline" in ours:
        raise Failure(
            "--stop-after with --baseline: a baseline keeps every case's outcome, and a run stopped early "
            "leaves some unrun",
            "leave --stop-after out when recording a baseline",
        )
    return ours, selection, pytest_args, budget_s


def options(ours: dict, seed: int | None, base: upstream_settings.Settings) -> upstream_selection.Options:
    return upstream_selection.Options(
        gpus=ours.get("--gpus"),
        file_timeout=ours.get("--file-timeout", upstream_runs.FILE_LIMIT_S),
        per_gpu=ours.get("--per-gpu", 1),
        baseline="--baseline" in ours,
        summary=ours.get("--summary"),
        sample=seed,
        stop_after=ours.get("--stop-after", 0),
        progress_s=ours.get("--progress", upstream_progress.EVERY_S),
        base=base,
    )


def sample_spec(
    ours: dict, nodes: list[str], tests, folder: Path, ws: workspace.Workspace
) -> tuple[int | None, Path | None]:
    """With --sample (or its seed or modules): (the seed, the spec every process reads: fidev.upstream.sample,
    the seed, the modules the record names for the selection's files' cases, the modules it must
    exercise). (None, None): every case runs."""
    if not {"--sample", "--sample-seed", "--sample-modules"} & set(ours):
        return None, None
    seed = ours.get("--sample-seed", upstream_sample.SEED)
    required = [m for m in ours.get("--sample-modules", "").split(",") if m]
    return seed, upstream_selection.sample_spec(folder, seed, required, nodes, tests, ws)


def named(selection: list[str], tests) -> list[str]:
    """The selection's node ids; refused where nothing was named."""
    if not selection:
        raise Failure(
            "no family or path was named (the whole suite takes hours to compile)",
            "name one: `upstream-tests norm`, or a path under tests/; `upstream-tests --list` names the families",
        )
    return suite.resolve(selection, tests)


def first_files(ours: dict, nodes: list[str], tests: Path) -> frozenset[str]:
    """--first-files' test files as the plan's records name them (tests/..., from the tree), each given as a
    path relative to the current folder, tests/ or the tree (as the selection's paths are) and one the
    selection runs; else two lines, and with --no-plan (only the plan builds ahead)."""
    given = [f.strip() for f in ours.get("--first-files", "").split(",") if f.strip()]
    if given and "--no-plan" in ours:
        raise Failure(
            "--first-files with --no-plan: only the plan builds modules ahead of the tests",
            "leave out one of them",
            exit_status=USAGE,
        )
    root = tests.parent.resolve()
    selected = [str(Path(node.split("::")[0]).resolve().relative_to(root)) for node in nodes]
    found = set()
    for item in given:
        file = str(Path(suite.path_node(item, tests)).resolve().relative_to(root))
        if "::" in item or not any(file == s or file.startswith(s.rstrip("/") + "/") for s in selected):
            raise Failure(
                f"--first-files {item}: not a test file this run selects",
                "name test files of the selection, comma-separated (tests/attention/test_cascade.py)",
                exit_status=USAGE,
            )
        found.add(file)
    return frozenset(found)


def apply_kernel_source() -> str:
    """The kernel source mode, applied before anything imports flashinfer, and said."""
    mode = module_choice.apply(
        kernel_source.mode()
    )  # in `auto`, the tree's edits read now: two lines where nothing tells them
    edits = f"; edited vs the release: {module_choice.edited_summary()}" if mode == kernel_source.AUTO else ""
    print(f"upstream-tests: kernel source {mode}: {kernel_source.SAID[mode]}{edits}")
    return mode


def planned(
    nodes: list[str],
    pytest_args: list[str],
    tests,
    budget_s: float,
    yes: bool,
    sample: Path | None,
    gate: Path | None = None,
    first: frozenset[str] = frozenset(),
) -> module_builds.Ahead | None:
    """The plan's dry run (of the sample `sample` specifies, where one does), what it says, and the
    budget held; then the builds of what its tests will load (the cases' of the test files `first` first),
    started, or behind affected's `gate` to start as it opens (upstream_plan.build_ahead)."""
    found = upstream_plan.plan(nodes, pytest_args, tests, sample, first)  # Ctrl-C: its processes are stopped
    if found is None:
        return None
    upstream_plan.hold_budget(found, budget_s, yes)
    return upstream_plan.build_ahead(found, gate)


def main() -> int:
    try:  # usage errors: checked before anything runs, and status 2, as argparse's are
        ours, selection, pytest_args, budget_s = parse(sys.argv[1:])
    except Failure as failure:
        report(failure)
        return USAGE
    if "-h" in ours or "--help" in ours:
        print(__doc__)
        return 0
    ws = workspace.read(pins().flashinfer)  # read once, here, and passed down
    if "--list" in ours:
        return suite.list_families(ws, kernel_source.mode())
    # a path outside the tree's tests/ is bad usage, refused before the tree is looked for (where it has no suite)
    suite.refuse_outside(selection, pins().source_dir / "tests")
    tests = suite.tests_dir()
    nodes = named(selection, tests)
    first = first_files(ours, nodes, tests)
    # before the plan: the files' times, the records and the baselines' folder, kept at the run's end
    upstream_selection.refuse_odd_state(ws, recording="--baseline" in ours)
    mode = apply_kernel_source()
    stop_as_ctrl_c(signal.SIGHUP)  # as Ctrl-C and SIGTERM: the dry run's and the files' processes are killed
    inherited = inherited_gate()  # affected's, where it started this run: read once, here, and passed down
    ahead = None
    with tempfile.TemporaryDirectory(prefix="fidev-sample-") as folder:  # its processes are done when it goes
        try:
            seed, spec = sample_spec(ours, nodes, tests, Path(folder), ws)
            if "--no-plan" not in ours:
                ahead = planned(nodes, pytest_args, tests, budget_s, "--yes" in ours, spec, inherited.gate, first)
                # the record now names the modules of the cases the dry run sampled: the run's sample takes them
                if spec is not None:
                    seed, spec = sample_spec(ours, nodes, tests, Path(folder), ws)
            base = inherited.but(sample=spec)
            return upstream_selection.run(selection, nodes, pytest_args, tests, options(ours, seed, base), mode, ws)
        finally:
            if ahead is not None:  # what no test loaded by the end (a run stopped early, or interrupted)
                ahead.stop()
                # what it built that no case then loaded and no record names: as if never built, not an
                # untested module for each later edit to end `not covered` on (the run's records are in by now)
                module_builds.drop_unrecorded_ahead(ahead.marked, lambda line: print(f"upstream-tests: {line}"))


def inherited_gate() -> upstream_settings.Settings:
    """The gate this run's processes wait at, where affected started the run behind one
    (fidev.upstream.settings: the settings its environment gives, the gate's alone)."""
    given = upstream_settings.Settings.read()
    return upstream_settings.Settings(gate=given.gate, gate_owner=given.gate_owner)


if __name__ == "__main__":
    sys.exit(run_main(main))
