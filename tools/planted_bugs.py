"""How well `affected` catches kernel bugs: one-line bugs planted in the vendored FlashInfer, one at a time.

  python3 tools/planted_bugs.py [--bugs ID,...] [--time-limit SECONDS] [--record FILE]
  python3 tools/planted_bugs.py --list

For each bug of BUGS (a line of FlashInfer v0.6.3's source, in a header, a csrc/ file, a Python
generator or a Python wrapper of the package, and the line with the bug), on a GPU host whose JIT dir \
`build` filled, with
FlashInfer's tests in the tree: it takes the tree's lock and plants the bug (fidev.tree.edits.planted: the \
file is restored
as `cp -p` would, its bytes and mtime, on every way out, Ctrl-C and SIGTERM included), runs
`python scripts/affected.py --summary FILE` in the workspace as a user would, restores the file and
runs `affected` again, which must pass. What it keeps of each run comes from affected's summary
(fidev.affected.summary), never from its output, which goes to stderr as it runs. Before the first bug it
checks, under the tree's lock (a tree another run or tool holds is refused, naming it), every chosen bug's
line and that the tree has no edit of its own, and that the kernel source mode in force is one affected takes.

stdout gets one Markdown table, a row per bug: its family, the kind of file, the file, how large the
bug is against fp16's rounding, affected's verdict and exit status, the time to its first failing test
(where the summary records one), the compile time, the total time, the family of the tests that
failed (the modules named, where no test of a known family did), and whether the restored tree
passed; then the SURVIVORS, the bugs affected did not fail, each with the reason its summary tells.
--record FILE keeps the same as JSON (RECORD_SCHEMA). Exit status 0: every bug run was caught and
every restored tree passed; 1: a bug survived or a restored tree did not pass; 3: nothing failed, but
--time-limit left bugs unstarted, or stopped one midway (named at the end, as the --bugs of the next part:
the one it stopped runs again whole; a restore it stopped neither passed nor failed).

--list prints the bug table as JSON and runs nothing (no GPU, no tree needed; it takes no --bugs,
--record or --time-limit). The sizes are stated
against fp16's half-ulp, 2^-11 (about 4.9e-4) of a value, and FlashInfer's test tolerance for fp16,
rtol = atol = 1e-3 (tests/utils/test_norm.py and tests/attention/'s test files at v0.6.3, among others). How to run it:
docs/testing.md, "Planted bugs"; its tables go to docs/measurements-log.md, its counts to docs/measurements.md's
rows "planted bugs caught" and "planted attention bugs caught, edit to exit".
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "scripts"))  # fidev
import fidev.core.task_start  # noqa: E402, F401 (first: Ctrl-C or SIGTERM while the tool imports is our line)

# isort: split
import argparse
import json
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from fidev.affected import built  # noqa: E402
from fidev.affected import summary as affected_summary  # noqa: E402
from fidev.affected.verdict import Verdict  # noqa: E402
from fidev.core import numbers, workspace  # noqa: E402
from fidev.core.failure import ArgumentParser, Failure, option, run_main, usage  # noqa: E402
from fidev.core.files import not_a_file, output_file, write_output  # noqa: E402
from fidev.core.manifest import pins  # noqa: E402
from fidev.jit import kernel_source  # noqa: E402
from fidev.records import build_records  # noqa: E402
from fidev.tree import edits, release_reference  # noqa: E402
from fidev.tree import families as kernel_families  # noqa: E402

RECORD_SCHEMA = edits.PLANTED_BUGS_SCHEMA
KINDS = {
    "include/": "header",
    "csrc/": "csrc",
    "flashinfer/jit/": "generator",
    "flashinfer/": "wrapper",
}  # first match wins
BUG_S = 240.0  # what --time-limit expects of a bug (both affected runs) before one has run here
STOP_S = 60  # how long a stopped affected has to end its builds and tests before it is killed
# at --time-limit's end, a shorter while, taken off the limit, so that the run ends within it
DEADLINE_STOP_S = 15
STOPPED = "stopped at --time-limit"  # a restore's verdict where the time limit ended its run


class TimeUp(Exception):
    """An affected run that --time-limit ended: it was stopped as Ctrl-C stops it."""


@dataclass(frozen=True)
class Bug:
    id: str
    family: str  # a family of fidev.tree.families
    file: str  # relative to the tree
    symbol: str  # where the line is, at v0.6.3
    line: str  # exactly once in the file at v0.6.3 (leading spaces included where they make it so)
    bug: str  # what replaces it
    size: str  # how large the error is, against fp16's rounding and the tests' tolerance

    @property
    def kind(self) -> str:
        return next(kind for prefix, kind in KINDS.items() if self.file.startswith(prefix))


BUGS = [
    Bug(
        "norm-fused-add-offset",
        "norm",
        "include/flashinfer/norm.cuh",
        "FusedAddRMSNormKernel",
        "input_vec[j] = x_vec[j] * rms_rcp * (weight_bias + float(weight_vec[j]));",
        "input_vec[j] = x_vec[j] * rms_rcp * (weight_bias + float(weight_vec[j])) + 0.01f;",
        "additive offset 0.01 on every output: 10x the tests' atol, ~20x fp16's half-ulp at |y| = 1",
    ),
    Bug(
        "norm-last-row-unwritten",
        "norm",
        "csrc/norm.cu",
        "rmsnorm",
        "          static_cast<c_type*>(output.data_ptr()), batch_size, hidden_size, input.stride(0),",
        "          static_cast<c_type*>(output.data_ptr()), batch_size - 1, hidden_size, input.stride(0),",
        "tail only: the batch's last row never written (a batch of 1: no block launched); the row is whatever "
        "the output held, not a rounding matter",
    ),
    Bug(
        "silu-below-one",
        "activation",
        "flashinfer/jit/activation.py",
        "silu_def_cu_str",
        "return val / (1.0f + __expf(-val));",
        "return (fabsf(val) < 1.0f ? 1.02f : 1.0f) * val / (1.0f + __expf(-val));",
        "only where |x| < 1: 2% of silu(x) there (~40x fp16's half-ulp, 20x the tests' rtol), exact elsewhere",
    ),
    Bug(
        "gelu-tanh-cubic-dropped",
        "activation",
        "flashinfer/jit/activation.py",
        "gelu_def_tanh_cu_str",
        "0.5f * (1.0f + math::tanh((0.7978845608028654f * (val + 0.044715f * val * val * val))));",
        "0.5f * (1.0f + math::tanh((0.7978845608028654f * (val))));",
        "a dropped term (0.044715 x^3): 0 at x = 0, 0.3% at |x| = 0.5, 1.2% at 1, 1.8% at 1.5 of gelu_tanh(x): "
        "up to ~35x fp16's half-ulp, 18x the tests' rtol",
    ),
    Bug(
        "act-small-to-zero",
        "activation",
        "include/flashinfer/activation.cuh",
        "act_and_mul_kernel",
        "out_vec[i] = Activation(x_vec[i]) * y_vec[i];",
        "out_vec[i] = fabsf(Activation(x_vec[i]) * y_vec[i]) < 0.05f ? 0.f : Activation(x_vec[i]) * y_vec[i];",
        "small values written as 0: outputs below 0.05 in magnitude become 0, an error of the whole value (2048x its "
        "fp16 half-ulp; up to 50x the tests' atol), larger ones exact",
    ),
    Bug(
        "softmax-scale",
        "sampling",
        "include/flashinfer/sampling.cuh",
        "OnlineSoftmaxFusedKernel",
        "const float inv_denominator = 1.0f / running_denominator;",
        "const float inv_denominator = 1.01f / running_denominator;",
        "1% of every probability (rows sum to 1.01): ~20x fp16's half-ulp; test_softmax's atol is 1e-5, "
        "so every probability above 1e-3 is out",
    ),
    Bug(
        "top-p-threshold",
        "sampling",
        "csrc/renorm.cu",
        "top_p_renorm_probs",
        "top_p_val, vocab_size, stream);",
        "top_p_val * 0.9, vocab_size, stream);",
        "the top-p threshold 10% low: up to 10% of the kept mass dropped and the rest ~10% larger (~200x "
        "fp16's half-ulp), out of the tests' atol (1e-3) where kept probabilities are above ~1e-2",
    ),
    Bug(
        "topk-last-unwritten",
        "topk",
        "csrc/topk.cu",
        "radix_topk",
        "static_cast<c_type*>(output_values.data_ptr()), batch_size, static_cast<uint32_t>(top_k), d,",
        "static_cast<c_type*>(output_values.data_ptr()), batch_size, static_cast<uint32_t>(top_k) - 1, d,",
        "tail only: the last of each row's k values and indices never written (an index out of range or a "
        "wrong value, not a rounding matter)",
    ),
    Bug(
        "page-last-token-dropped",
        "page",
        "csrc/page.cu",
        "append_paged_kv_cache",
        "static_cast<int32_t*>(positions.data_ptr()), nnz, append_k_stride_n,",
        "static_cast<int32_t*>(positions.data_ptr()), nnz - 1, append_k_stride_n,",
        "tail only: the last appended token's K and V never written (whole vectors wrong, not a rounding matter)",
    ),
    Bug(
        "rope-theta",
        "rope",
        "csrc/rope.cu",
        "apply_rope",
        "k_rope_stride_h, interleave, rope_scale, rope_theta, stream);",
        "k_rope_stride_h, interleave, rope_scale, rope_theta * 1.05, stream);",
        "rope_theta 5% high: exact at position 0, an angle error growing with the position (up to ~0.03 rad "
        "at 15, ~0.2 rad at 100: 60x to 400x fp16's half-ulp of |x|)",
    ),
    Bug(
        "packbits-last-byte",
        "quantization",
        "include/flashinfer/quantization.cuh",
        "PackBitsKernel",
        "if (start_offset + tx * 8 < num_elements) output[start_offset / 8 + tx] = ret;",
        "if (start_offset + tx * 8 + 8 < num_elements) output[start_offset / 8 + tx] = ret;",
        "tail only: the output's last byte never written (bits are exact or wrong: no rounding)",
    ),
    Bug(
        "packbits-last-bit",
        "quantization",
        "csrc/quantization.cu",
        "packbits",
        "int64_t num_elements = x.numel();",
        "int64_t num_elements = x.numel() - 1;",
        "tail only: the last input read as False: the last byte wrong wherever the last element is True "
        "(bits are exact or wrong: no rounding)",
    ),
    Bug(
        "decode-output-offset",
        "decode",
        "include/flashinfer/attention/decode.cuh",
        "BatchDecodeWithPagedKVCacheDevice",
        "st.o[i] = variant.OutputTransform(params, st.o[i], bx, /*qo_idx=*/0, qo_head_idx, st.m, st.d,",
        "st.o[i] = 0.01f + variant.OutputTransform(params, st.o[i], bx, /*qo_idx=*/0, qo_head_idx, st.m, st.d,",
        "additive offset 0.01 on every output (split-KV partials merge to the same +0.01): 10x the tests' atol, "
        "~20x fp16's half-ulp at |o| = 1, more for smaller o",
    ),
    Bug(
        "decode-last-head-unwritten",
        "decode",
        "include/flashinfer/attention/decode.cuh",
        "BatchDecodeWithPagedKVCacheDevice",
        "st.o.cast_store(o + (bx * num_qo_heads + qo_head_idx) * head_dim + tx * vec_size);",
        "if (qo_head_idx + 1 < num_qo_heads) st.o.cast_store(o + (bx * num_qo_heads + qo_head_idx) * head_dim "
        "+ tx * vec_size);",
        "tail only: the last query head's output (a split-KV partial too) never written: it is what the buffer held "
        "(torch.empty, smoke's NaN), not a rounding matter; every other head exact",
    ),
    Bug(
        "prefill-causal-diagonal",
        "single_prefill",
        "include/flashinfer/attention/prefill.cuh",
        "logits_mask",
        "? (kv_idx + qo_len > kv_len + q_idx || (kv_idx >= chunk_end))",
        "? (kv_idx + qo_len >= kv_len + q_idx || (kv_idx >= chunk_end))",
        "causal only: each query's own key (the diagonal) masked, ~1/(keys it sees) of its row's weight: ~1e-2 at "
        "hundreds of keys (10x the tests' atol, ~20x fp16's half-ulp), more in short rows; where qo_len = "
        "kv_len the first row sees no key at all",
    ),
    Bug(
        "hopper-rescale-unscaled",
        "hopper",
        "include/flashinfer/attention/hopper/attention_updater.cuh",
        "OnlineSoftmax::update",
        "scores_scale(mi) = exp2f((scores_max_prev(mi) - scores_max_cur) * sm_scale_log2);",
        "scores_scale(mi) = exp2f((scores_max_prev(mi) - scores_max_cur));",
        "only where a row spans more than one KV tile (CTA_KV 128 at head dim 64) and its running max grows: "
        "the earlier tiles rescaled without sm_scale*log2e (2^-8 for a raw gain of 8, not ~0.5), most of "
        "their weight lost: O(1) relative error, >1000x fp16's half-ulp; exact within one tile (test_hopper's "
        "seq_len 11 and 99)",
    ),
    Bug(
        "cascade-other-lse-head0",
        "cascade",
        "include/flashinfer/attention/cascade.cuh",
        "MergeStateInPlaceKernel",
        "float s_other_val = s_other[pos * num_heads + head_idx];",
        "float s_other_val = s_other[pos * num_heads];",
        "only heads other than 0: merged with head 0's LSE of the other state, weights off by 2^(the heads' LSE gap, "
        "~0.25 at 128 keys): errors ~1e-2 (10x the tests' atol, ~20x fp16's half-ulp); head 0 exact",
    ),
    Bug(
        "page-k-never-written",
        "page",
        "include/flashinfer/page.cuh",
        "AppendPagedKVCacheKernel",
        "    DType* k_ptr = paged_kv.get_k_ptr(page_iter, head_idx, entry_idx, tx * vec_size);",
        "    DType* k_ptr = paged_kv.get_v_ptr(page_iter, head_idx, entry_idx, tx * vec_size);",
        "K dropped: the K copy goes to V's slot, which the V copy overwrites, so the cache keeps its old K (zeros, "
        "smoke's NaN) and V is exact: whole vectors wrong, not a rounding matter",
    ),
    Bug(
        "mask-last-key",
        "single_prefill",
        "include/flashinfer/attention/variants.cuh",
        "DefaultAttention (LogitsMask)",
        "bool mask = true;",
        "bool mask = kv_idx + 1 < kv_len;",
        "only the last key of each request masked (fa2 prefill and decode): ~1/kv_len of a row's weight, errors up to "
        "~1e-2 at hundreds of keys (10x the tests' atol, ~20x fp16's half-ulp), shrinking as rows grow; in causal "
        "prefill only the last query row sees that key",
    ),
    Bug(
        "decode-wrapper-scale-no-sqrt",
        "decode",
        "flashinfer/decode.py",
        "BatchDecodeWithPagedKVCacheWrapper.run",
        "            sm_scale = 1.0 / math.sqrt(head_dim)",
        "            sm_scale = 1.0 / head_dim",
        "the default sm_scale 1/head_dim, not 1/sqrt(head_dim) (11x too small at 128): attention nearly uniform, "
        "outputs off by O(|o|) (~0.1: 100x the tests' atol, ~200x fp16's half-ulp); only where plan() got no sm_scale",
    ),
    Bug(
        "single-prefill-causal-square-only",
        "single_prefill",
        "flashinfer/prefill.py",
        "single_prefill_with_kv_cache",
        "        if causal:",
        "        if causal and q.size(0) == k.size(0):",
        "only causal calls with qo_len != kv_len: run unmasked, query i of qo_len sees qo_len - 1 - i later keys "
        "(~7% of the first row's weight at 37 of 501): errors 1e-2 to 1e-1, far past the tests' atol and fp16's "
        "half-ulp; the last row, square and non-causal calls exact",
    ),
]
BY_ID = {bug.id: bug for bug in BUGS}


def listing() -> str:
    """--list: every bug, as JSON."""
    return json.dumps([{**asdict(bug), "kind": bug.kind} for bug in BUGS], indent=1)


def check_lines(tree: Path, chosen: list[Bug]) -> None:
    """Every chosen bug's line, exactly once in its file, before anything is planted; else two lines."""
    for bug in chosen:
        path = tree / bug.file
        if (why := not_a_file(path)) is not None and path.exists():  # a FIFO: its reading would wait for a writer
            raise Failure(
                f"{bug.id}: {path} {why}",
                "get the pinned FlashInfer source (README: First, the FlashInfer source), then run this again",
            )
        try:
            count = path.read_text().count(bug.line)
        except OSError as e:
            raise Failure(
                f"{bug.id}: {path} cannot be read ({e.strerror or e})",
                "get the pinned FlashInfer source (README: First, the FlashInfer source), then run this again",
            ) from None
        if count != 1:
            said = "lacks" if count == 0 else f"has {count} copies of"
            raise Failure(
                f"{bug.id}: {bug.file} {said} the line its bug replaces ({bug.symbol}, FlashInfer v0.6.3): "
                f"{bug.line.strip()[:80]}",
                "restore the tree to the pinned release (git checkout -- FILE in the tree, or fetch the source again), "
                "or leave the bug out with --bugs",
            )


def check_unedited(tree: Path) -> None:
    """No edit of the tree's own in what the bugs' modules compile or generate, or in the package's Python
    wrappers (fidev.tree.release_reference, against the pinned release or commit): each affected run would build
    or call it with the bug. The install's own flashinfer/_build_meta.py is none (build_records.BUILD_META)."""
    edited = [
        rel
        for rel in release_reference.edited_files(tree, pins())
        if rel.startswith(tuple(KINDS)) and rel != build_records.BUILD_META
    ]
    if edited:
        more = f" and {len(edited) - 3} more" if len(edited) > 3 else ""
        raise Failure(
            f"the tree has edits of its own in what the bugs' modules compile: {', '.join(edited[:3])}{more}; "
            "every affected run would build them in with the bug, and its verdict would be theirs too",
            "set them aside (git -C TREE stash in a checkout) or restore the pinned release "
            "(python scripts/fetch_flashinfer_source.py --replace), then run this again",
        )


def stop(proc: subprocess.Popen, grace: float = STOP_S) -> None:
    """SIGTERM (affected stops what it started), then, after `grace`, SIGKILL to its whole process group (its own
    session: a ninja or nvcc it left would go on compiling the planted line into the JIT dir after the restore,
    its objects newer than the file `cp -p` put back); the group's stragglers go at the end either way."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass
    proc.wait()


def affected(summary: Path, deadline: float | None) -> tuple[affected_summary.Summary | None, str | None, float]:
    """`affected --summary` as a user runs it, its output on stderr: (its summary, or None with why,
    its wall seconds). Stopped with SIGTERM, then killed after STOP_S, when this run is interrupted, and
    at `deadline` (time.perf_counter's; --time-limit's end), which raises TimeUp."""
    summary.unlink(missing_ok=True)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "scripts/affected.py", "--summary", str(summary)],
        cwd=ROOT,
        stdout=sys.stderr,
        stderr=sys.stderr,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its builds and tests a group of their own, which stop() ends whole
    )
    try:
        proc.wait(timeout=None if deadline is None else max(0.0, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        stop(proc, DEADLINE_STOP_S)
        raise TimeUp from None
    except BaseException:  # Ctrl-C, SIGTERM: affected stops what it started, then the file is restored
        stop(proc)
        raise
    seconds = time.perf_counter() - started
    try:
        return affected_summary.read(summary), None, seconds
    except Failure as failure:
        return None, f"exit {proc.returncode}, no summary: {failure.problem}", seconds


def family_of(test: str) -> str | None:
    """The family of a failed test id: FlashInfer's (fidev.tree.families' nodes, under the tree's
    tests/), or the workspace's own GPU suites (smoke, abi-smoke); None where no family has it."""
    rel = test.removeprefix("tests/")
    own = {"smoke/": "smoke", "abi_smoke/": "abi-smoke"}
    for prefix, name in own.items():
        if rel.startswith(prefix):
            return name
    for family in kernel_families.FAMILIES:
        if any(rel == node or rel.startswith(f"{node}::") or rel.startswith(f"{node}[") for node in family.nodes):
            return family.name
    return None


def caught_by(done: affected_summary.Summary) -> str:
    """The families of the failed tests (with their counts), and the modules the edit reached."""
    counts: dict[str, int] = {}
    for test in done.failed:
        name = family_of(test) or "other"
        counts[name] = counts.get(name, 0) + 1
    tests = ", ".join(f"{name} ({n} test{'s' if n > 1 else ''})" for name, n in sorted(counts.items()))
    modules = f"modules {', '.join(sorted(done.modules))}" if done.modules else ""
    return "; ".join(part for part in (tests, modules) if part) or "-"


def survived_because(bug: Bug, done: affected_summary.Summary | None, why: str | None) -> str | None:
    """None where a test of affected's failed the bug; else the reason its summary tells. A build that
    failed is no catch: the bug table's line does not compile, and no test judged it."""
    if done is None:
        return why
    if done.status == Verdict.FAILED.status and done.verdict == Verdict.FAILED and done.failed:
        return None
    if done.status == Verdict.FAILED.status and done.verdict == Verdict.FAILED:
        return f"exit 1, failed, but no test failed: {done.problem or 'what broke is in its output'}"
    if done.verdict == Verdict.BUILD_FAILED:
        return (
            f"exit {done.status}, build failed: the planted line does not compile, so no test judged it (fix the "
            f"bug table): {done.problem}"
        )
    if done.verdict == Verdict.NOT_COVERED:
        return (
            f"exit 3, not covered: the edit reaches {bug.family}, whose FlashInfer tests did not run (are they in "
            "the tree?)"
        )
    if done.verdict in (Verdict.NOTHING_CHANGED, Verdict.NO_MODULE_CHANGED):
        return (
            f"exit {done.status}, {done.verdict}: the edit reached no built module and no kernel family's tests "
            "(run `build`)"
        )
    if done.verdict != Verdict.PASSED:
        return f"exit {done.status}, {done.verdict}" + (f": {done.problem}" if done.problem else "")
    ran = [t for t in done.tests if family_of(t) == bug.family]
    if not ran:
        others = f": {caught_families(done.tests)}" if done.tests else ""
        return f"exit 0: no test of {bug.family} ran ({len(done.tests)} test(s) selected{others})"
    return (
        f"exit 0: {len(ran)} test(s) of {bug.family} ran and passed: the bug is within their tolerance or outside "
        "their cases"
    )


def caught_families(tests: list[str]) -> str:
    return ", ".join(sorted({family_of(t) or "other" for t in tests})) or "none"


def outcome(done: affected_summary.Summary | None, why: str | None, seconds: float) -> dict:
    """What the record keeps of one affected run."""
    if done is None:
        return {"verdict": "no summary", "status": None, "problem": why, "seconds": round(seconds, 1)}
    past = done.past_build or {}
    return {
        "verdict": done.verdict,
        "status": done.status,
        "first_failure_s": past.get("first_failure_s"),
        "build_s": done.build_s,
        "seconds": round(seconds, 1),
        "summary_seconds": done.seconds,
        "rebuilt": done.rebuilt,
        "modules": sorted(done.modules),
        "tests": len(done.tests),
        "failed": done.failed,
        "caught_by": caught_by(done),
        "problem": done.problem,
        "compiled": done.compiled,
        "compiled_twice": done.compiled_twice,
    }


def run_bug(tree: Path, bug: Bug, scratch: Path, deadline: float | None) -> dict | None:
    """Plant the bug, `affected`; restore the file (cp -p), `affected` again, which must pass. None where
    `deadline` ended the planted run; a restore it ended is STOPPED, and neither passes nor fails."""
    path = tree / bug.file
    print(f"\n=== planted_bugs: {bug.id}: {bug.file} ({bug.symbol})", file=sys.stderr, flush=True)
    with edits.planted(
        tree, path, lambda text: text.replace(bug.line, bug.bug, 1), f"planted_bugs {bug.id}"
    ) as planted:
        try:
            done, why, seconds = affected(scratch / f"{bug.id}.json", deadline)
        except TimeUp:
            return None
        planted.restore()
        print(f"\n=== planted_bugs: {bug.id}: restored (cp -p)", file=sys.stderr, flush=True)
        began = time.perf_counter()
        try:
            again, why_again, seconds_again = affected(scratch / f"{bug.id}.restored.json", deadline)
            restored = outcome(again, why_again, seconds_again)
            restored["passes"] = restored_passes(done, again)
        except TimeUp:
            again, restored = None, {"verdict": STOPPED, "status": None, "problem": None, "passes": None}
            restored["seconds"] = round(time.perf_counter() - began, 1)
    if again is not None and again.verdict == Verdict.NOTHING_CHANGED and not restored["passes"]:
        restored["problem"] = (
            "the restore of a file whose tests failed was no change to affected: they did not run again"
        )
    reason = survived_because(bug, done, why)
    return {
        **asdict(bug),
        "kind": bug.kind,
        "planted": outcome(done, why, seconds),
        "caught": reason is None,
        "survived_because": reason,
        "restored": restored,
    }


def restored_passes(done: affected_summary.Summary | None, again: affected_summary.Summary | None) -> bool:
    """Whether the restored tree passed: its tests ran and passed. "Nothing changed" passes only
    where the planted run failed nothing (a not-covered edit, reverted, is none); after a failure the
    tests that failed must run again on the restored file."""
    if again is None or again.status != 0:
        return False
    return again.verdict == Verdict.PASSED or (
        again.verdict == Verdict.NOTHING_CHANGED and not (done is not None and done.verdict == Verdict.FAILED)
    )


def seconds_cell(value) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def compiled_cell(planted: dict, restored: dict) -> str:
    """The modules each run compiled (affected's summary, from ninja's logs), and any compiled twice."""
    if "compiled" not in planted or "compiled" not in restored:
        return "-"
    twice = sorted({*planted["compiled_twice"], *restored["compiled_twice"]})
    return f"{len(planted['compiled'])}, {len(restored['compiled'])}" + (
        f"; twice: {', '.join(twice)}" if twice else "; each once"
    )


def restored_cell(back: dict) -> str:
    if back["passes"] is None:
        return f"unknown: {back['verdict']}"
    return "yes" if back["passes"] else f"NO (exit {back['status']}, {back['verdict']})"


def table(results: list[dict]) -> str:
    """The Markdown table, a row per bug run."""
    head = [
        "id",
        "family",
        "file kind",
        "file",
        "size vs fp16 rounding",
        "verdict",
        "exit",
        "first failure s",
        "compile s",
        "total s",
        "caught by",
        "restored tree passes",
        "restore s",
        "modules compiled (edit, restore)",
    ]
    rows = [head, ["---"] * len(head)]
    for r in results:
        p, back = r["planted"], r["restored"]
        first = p.get("first_failure_s")
        rows.append(
            [
                r["id"],
                r["family"],
                r["kind"],
                f"`{r['file']}` ({r['symbol']})",
                r["size"],
                p["verdict"],
                str(p["status"]),
                "not recorded" if first is None else seconds_cell(first),
                seconds_cell(p.get("build_s")),
                seconds_cell(p["seconds"]),
                p.get("caught_by", "-") if r["caught"] else "NOT CAUGHT",
                restored_cell(back),
                seconds_cell(back["seconds"]),
                compiled_cell(p, back),
            ]
        )
    return "\n".join("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows)


@dataclass
class Progress:
    """What a run did so far: each bug run (run_bug's), the bugs --time-limit left unstarted, and those it
    stopped midway, to run again (a bug whose restore it stopped is among the bugs run too)."""

    results: list[dict] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)


def report(progress: Progress, limit: float | None) -> int:
    """The table, the survivors and the restored trees that failed, what the time limit ended and what it
    left; the exit status."""
    results, left, unfinished = progress.results, progress.left, progress.unfinished
    print(table(results))
    survivors = [r for r in results if not r["caught"]]
    print(
        f"\nSURVIVORS: {len(survivors)} of {len(results)}"
        + ("" if survivors else " (affected failed every bug planted)")
    )
    for r in survivors:
        print(f"- {r['id']} ({r['family']}, {r['file']}): {r['survived_because']}")
    broken = [r for r in results if r["restored"]["passes"] is False]
    for r in broken:
        back = r["restored"]
        print(
            f"restored tree did not pass after {r['id']}: exit {back['status']}, {back['verdict']}"
            + (f": {back['problem']}" if back.get("problem") else "")
        )
    if unfinished:
        print(f"\nstopped at --time-limit {limit:.0f} s, to run again: --bugs {','.join(unfinished)}")
    if left:
        print(f"\nnot started, past --time-limit {limit:.0f} s: --bugs {','.join(left)}")
    if survivors or broken:
        return 1
    return 3 if left or unfinished else 0


def record(path: Path, progress: Progress, complete: bool, status: int = 1) -> None:
    """The run's record into `path`, whole or not at all; a failed write is two lines naming the path and the
    OS error, keeping the run's status (fidev.core.files.write_output)."""
    write_output(
        path,
        json.dumps(
            {
                "schema": RECORD_SCHEMA,
                "complete": complete,
                "bugs": progress.results,
                "left": progress.left,
                "unfinished": progress.unfinished,
                "survivors": [r["id"] for r in progress.results if not r["caught"]],
                "restored_failures": [r["id"] for r in progress.results if r["restored"]["passes"] is False],
            },
            indent=1,
        ),
        "planted_bugs' record",
        f"the run itself ended with status {status}, as said above" if complete else "",
        status,
    )


class StartState:
    """With --each-from-start: the workspace's state as the run found it (the version's folder, FlashInfer's
    JIT dirs and every record of the tasks in it: fidev.core.workspace.Workspace.version_dir), copied aside
    before the first bug and put back before each later bug and at the end. So every bug starts where the
    first did (the attention verdict's targets start from a JIT dir `build` alone filled), not from what
    the earlier bugs' runs built, and the run leaves the workspace as it found it. The compile cache is
    not in that folder: a restore may still hit what an earlier bug's restore compiled. A version folder
    that is a link (to a bigger disk) is its target's; the copy is kept beside it, on its file system, so
    that the last put-back is a rename."""

    def __init__(self, version_dir: Path):
        self.version_dir = Path(os.path.realpath(version_dir))
        self.kept = self.version_dir.with_name(f".{self.version_dir.name}.planted-start-{os.getpid()}")
        self.existed = self.version_dir.exists()
        if self.existed:
            try:
                shutil.copytree(self.version_dir, self.kept, symlinks=True)
            except BaseException:  # Ctrl-C, a full disk: no half copy left beside the user's folder
                shutil.rmtree(self.kept, ignore_errors=True)
                raise

    def put_back(self, last: bool = False) -> None:
        """The folder as it was, swapped in whole (a copy of the kept one made beside it first; the last time,
        the kept one itself), the two renames with Ctrl-C and SIGTERM held, so that no moment finds it gone."""
        fresh = None
        if self.existed and not last:
            fresh = Path(tempfile.mkdtemp(prefix=f".{self.version_dir.name}.planted-", dir=self.version_dir.parent))
            try:
                shutil.copytree(self.kept, fresh / "start", symlinks=True)
            except BaseException:
                shutil.rmtree(fresh, ignore_errors=True)
                raise
        old = self.version_dir.with_name(f".{self.version_dir.name}.planted-old-{os.getpid()}")
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            if self.version_dir.exists():
                os.replace(self.version_dir, old)
            if self.existed:
                os.replace(fresh / "start" if fresh else self.kept, self.version_dir)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        shutil.rmtree(old, ignore_errors=True)
        if fresh:
            fresh.rmdir()


def run_bugs(tree: Path, chosen: list[Bug], limit: float | None, start: Path | None, progress: Progress) -> None:
    """Each bug in turn (run_bug) into `progress`, within `limit`: no bug starts that would not end in it (by the
    longest so far), and an affected run still going at its end is stopped, its bug unfinished; with `start` (the
    version's folder: --each-from-start), each from the state the run found (StartState)."""
    started, longest = time.perf_counter(), BUG_S
    deadline = None if limit is None else started + limit - DEADLINE_STOP_S
    results = progress.results
    with tempfile.TemporaryDirectory(prefix="fidev-planted-") as scratch:
        copied = time.perf_counter()
        state = StartState(start) if start is not None else None
        back_s = time.perf_counter() - copied  # a put-back copies as much again: counted with each bug after the first
        try:
            for i, bug in enumerate(chosen):
                if limit is not None and time.perf_counter() - started + longest + back_s > limit:
                    progress.left += [b.id for b in chosen[i:]]
                    break
                if state is not None and i:
                    state.put_back()
                result = run_bug(tree, bug, Path(scratch), deadline)
                results += [result] if result is not None else []
                if result is None or result["restored"]["passes"] is None:
                    progress.unfinished.append(bug.id)
                    progress.left += [b.id for b in chosen[i + 1 :]]
                    break
                longest = max(
                    longest if results[1:] else 0.0,
                    results[-1]["planted"]["seconds"] + results[-1]["restored"]["seconds"],
                )
        finally:
            if state is not None:
                state.put_back(last=True)


def chosen_bugs(text: str | None) -> list[Bug]:
    if text is None:
        return list(BUGS)
    ids = [i.strip() for i in text.split(",") if i.strip()]
    unknown = [i for i in ids if i not in BY_ID]
    if unknown or not ids:
        raise Failure(
            f"--bugs names no bug {', '.join(unknown) or '(empty)'}",
            f"name them from: {', '.join(BY_ID)} (--list shows each)",
            exit_status=2,
        )
    return [BY_ID[i] for i in dict.fromkeys(ids)]


def main() -> int:
    parser = ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--bugs", metavar="ID,...", help="comma-separated bug ids, of --list (default: all)")
    parser.add_argument("--list", action="store_true", help="print the bug table as JSON; run nothing")
    parser.add_argument(
        "--time-limit",
        type=option(numbers.decimal_number(example="--time-limit 580")),
        help="seconds this run may take: no bug starts that would not end in time (by the longest bug so far, else "
        f"{BUG_S:.0f} s), and an affected run still going at its end is stopped, its bug to run again",
    )
    parser.add_argument(
        "--record",
        type=option(output_file),
        metavar="FILE",
        help=f"also write the results to FILE as JSON ({RECORD_SCHEMA}); checked before any bug is planted",
    )
    parser.add_argument(
        "--each-from-start",
        action="store_true",
        help="start each bug from the workspace's state as the run found it (its JIT dirs and records, put back "
        "before each later bug and at the end), not from what the earlier bugs built",
    )
    args = parser.parse_args()
    if args.list:
        options = {"--bugs": args.bugs, "--record": args.record, "--time-limit": args.time_limit}
        options["--each-from-start"] = True if args.each_from_start else None
        given = [name for name, value in options.items() if value is not None]
        if given:  # --list runs nothing: what these would do is never done
            parser.error(
                usage(f"--list runs no bug: it takes no {', '.join(given)}", f"drop {', '.join(given)}, or --list")
            )
        print(listing())
        return 0
    chosen = chosen_bugs(args.bugs)
    mode = kernel_source.mode()  # each affected run reads it: a mode it refuses is said once, before a bug is planted
    ws = workspace.read(pins().flashinfer)
    built.some_built(ws, mode)  # with nothing built, no bug could be judged
    tree = pins().source_dir
    with edits.tree_lock(tree, "planted_bugs"):  # a tree another run holds has its planted bug: that run is said
        check_lines(tree, chosen)
        check_unedited(tree)
    progress = Progress()
    complete = False
    start = ws.version_dir if args.each_from_start else None
    try:
        run_bugs(tree, chosen, args.time_limit, start, progress)
        complete = True
    except BaseException:  # Ctrl-C, a refusal: what ran is recorded all the same
        if args.record:
            record(args.record, progress, complete)
        raise
    status = report(progress, args.time_limit)  # said before the record is written, which may fail
    if args.record:
        record(args.record, progress, complete, status)
    return status


if __name__ == "__main__":
    sys.exit(run_main(main))
