"""Per module, prebuilt kernels or the vendored tree: what the kernel source modes `auto` and
`vendored` change in FlashInfer (fidev.jit.kernel_source names the modes; `apply` here applies one).

FlashInfer 0.6.3 loads `<AOT dir>/<name>/<name>.so` instead of compiling whenever that file exists:
`JitSpec.is_aot` is `aot_path.exists()`, and `JitSpec.build_and_load` loads `aot_path` when it is
true (flashinfer/jit/core.py at v0.6.3). The AOT dir is the jit-cache package's, else the tree's
`flashinfer/data/aot` (flashinfer/jit/env.py, `_get_aot_dir`). `install` replaces `is_aot` as soon as
flashinfer.jit.core is imported:

- auto: prebuilt where FlashInfer has the module and none of its inputs differ from the pinned
  release (fidev.tree.release_reference); else compiled from the tree, as FlashInfer does for a module
  it does not ship. A module's inputs: its sources, the tree's files they include (#include,
  followed under include/ and csrc/), the tree's Python files on the call stack when its JitSpec
  was made (the generator that wrote its sources: flashinfer/jit/activation.py for silu_and_mul),
  and for a module with generated sources, csrc/'s jinja templates. An edit under 3rdparty/
  reaches every module.
- vendored: never prebuilt, from the jit-cache package and flashinfer/data/aot alike.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from pathlib import Path

from fidev.core.failure import Failure
from fidev.core.manifest import pins
from fidev.jit import kernel_source, uris
from fidev.records import build_records
from fidev.tree import families as upstream_suites
from fidev.tree import release_reference, source_tree

CORE = "flashinfer.jit.core"
_STATE: dict = {"mode": None, "edited": None, "hooked": False, "applied": None}
INPUTS: dict[str, list[str]] = {}  # module name -> its edited inputs ([]: none), for each module asked about
PREBUILT: dict[str, bool] = {}  # module name -> whether it loaded prebuilt
GENERATORS: dict[str, set[str]] = {}  # module name -> the tree's Python files on the stack when its JitSpec was made
CALLS: dict[
    str, dict
] = {}  # module name -> the call that made its JitSpec, where it can be made again (generator_call)


def tree() -> Path:
    return pins().source_dir.resolve()


def prebuilt_available() -> bool:
    """Whether FlashInfer has prebuilt modules to load: the jit-cache package, or a non-empty
    flashinfer/data/aot in the tree (`_get_aot_dir`'s two places), found without importing flashinfer."""
    if importlib.util.find_spec(uris.JIT_CACHE_PACKAGE) is not None:
        return True
    aot = tree() / "flashinfer" / "data" / "aot"
    return aot.is_dir() and any(aot.iterdir())


def edited() -> list[str]:
    """The tree's files that differ from the pinned release (relative to the tree), once per process.
    A file of the release deleted from include/ or csrc/ is two lines: a module that includes it
    cannot be told apart from one that does not."""
    if _STATE["edited"] is None:
        found = release_reference.edited_files(tree(), pins())
        gone = [rel for rel in found if rel.split("/")[0] in build_records.TREE_PARTS and not (tree() / rel).exists()]
        if gone:
            raise Failure(
                f"{gone[0]} of the FlashInfer release is deleted from {source_tree.shown(pins().source_dir)}"
                + (f" (and {len(gone) - 1} more)" if len(gone) > 1 else ""),
                f"restore it (git -C {source_tree.shown(pins().source_dir)} checkout -- {gone[0]}; a source release: "
                "python scripts/fetch_flashinfer_source.py --replace), or "
                "FLASHINFER_DEV_KERNEL_SOURCE=vendored to compile every module",
            )
        _STATE["edited"] = found
    return _STATE["edited"]


def check(mode: str) -> None:
    """Before anything imports flashinfer: in `auto` with prebuilt modules to choose from, the
    release reference must be there (two lines where it is not), and is read now, once."""
    if mode == kernel_source.AUTO and prebuilt_available():
        edited()


def apply(mode: str) -> str:
    """Call before importing flashinfer, with the mode the task read at its start
    (kernel_source.mode()). Returns it; in `auto`, reads the tree's edits now (two lines where there
    is no release to tell them by)."""
    current = _STATE["applied"] = mode
    if current == kernel_source.VENDORED:
        # importlib.util.find_spec() answers None for a name mapped to None in sys.modules,
        # which is how FlashInfer asks whether the jit-cache is there; imports of it fail.
        sys.modules[uris.JIT_CACHE_PACKAGE] = None
    if current != kernel_source.PREBUILT:
        check(current)
        install(current)
    return current


def in_force() -> str | None:
    """The mode applied in this process, if one was: a suite run within a task uses the task's."""
    return _STATE["applied"]


def install(mode: str) -> None:
    """Make FlashInfer choose per `mode` (kernel_source.AUTO or VENDORED), now or when flashinfer.jit.core is
    imported."""
    _STATE["mode"] = mode
    if _STATE["hooked"]:
        return
    _STATE["hooked"] = True
    if CORE in sys.modules:
        patch(sys.modules[CORE])
    else:
        sys.meta_path.insert(0, _CoreFinder())


class Unpatchable(ImportError):
    """A flashinfer.jit.core without what `patch` replaces: another FlashInfer than the pinned one."""


class _CoreFinder(importlib.abc.MetaPathFinder):
    """Finds flashinfer.jit.core as the path finder does, and patches it once it has run."""

    def find_spec(self, name, path, target=None):
        if name != CORE or path is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def patch(core) -> None:
    """JitSpec.is_aot per the mode; the registry's `register` (`gen_jit_spec` calls
    `jit_spec_registry.register` on every spec it makes, flashinfer/jit/core.py at v0.6.3) notes the
    generator's files on the stack."""
    spec_class = getattr(core, "JitSpec", None)
    if spec_class is None or getattr(spec_class, "_fidev_choice", False):
        return  # a stand-in without modules (tests/test_faults.py), or patched already
    if not hasattr(core, "jit_spec_registry") or not isinstance(getattr(spec_class, "is_aot", None), property):
        raise Unpatchable(
            "flashinfer.jit.core has no jit_spec_registry or JitSpec.is_aot property as FlashInfer 0.6.3 has: "
            "the kernel source modes auto and vendored cannot choose per module"
        )
    shipped = core.JitSpec.is_aot.fget

    def is_aot(spec) -> bool:
        if _STATE["mode"] != kernel_source.AUTO:
            return False  # vendored: every module from the tree
        shipped_here = shipped(spec)
        # a module FlashInfer does not ship compiles from the tree anyway: its edited inputs are
        # still noted (for the report) once the edits were read
        inputs = edited_inputs(spec) if (shipped_here or _STATE["edited"] is not None) and edited() else []
        if shipped_here:
            PREBUILT[spec.name] = not inputs
        return shipped_here and not inputs

    core.JitSpec.is_aot = property(is_aot)
    core.JitSpec._fidev_choice = True
    combined = (
        core.build_jit_specs
    )  # skips by aot_path.exists() itself (core.py, build_jit_specs): by the mode's choice instead

    def build_jit_specs(specs, verbose=False, skip_prebuilt=True):
        return combined([s for s in specs if not (skip_prebuilt and s.is_aot)], verbose=verbose, skip_prebuilt=False)

    core.build_jit_specs = build_jit_specs
    registry = core.jit_spec_registry
    register = registry.register

    def noted(spec) -> None:
        GENERATORS.setdefault(spec.name, set()).update(_stack_files())
        call = generator_call(sys._getframe(2))  # gen_jit_spec's caller
        if call:
            CALLS[spec.name] = call
        register(spec)

    registry.register = noted


def _stack_files() -> set[str]:
    """The generator's Python files (relative to the tree) on the stack of gen_jit_spec: its caller
    (flashinfer/fp4_quantization.py calls it directly at v0.6.3) and every frame under
    flashinfer/jit/. Not the API wrappers above them (flashinfer/norm.py): whether build or a test
    made the spec must not change what counts."""
    root = str(tree())
    package, generators = (
        root + os.sep + "flashinfer" + os.sep,
        root + os.sep + os.path.join("flashinfer", "jit") + os.sep,
    )
    found, frame, depth = (
        set(),
        sys._getframe(2),
        0,
    )  # past _stack_files and noted: gen_jit_spec (core.py), then its caller
    while frame is not None:
        path = _real(frame.f_code.co_filename)
        if path.startswith(generators) or (depth == 1 and path.startswith(package)):
            found.add(os.path.relpath(path, root))
        frame, depth = frame.f_back, depth + 1
    return found


def _plain(value):
    """An argument as JSON: str, numbers, bool, None, lists and tuples of them, a torch dtype; else TypeError."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return {"tuple": items} if isinstance(value, tuple) else items
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return {"dtype": str(value).removeprefix("torch.")}
    raise TypeError(type(value).__name__)


def _value(plain):
    if isinstance(plain, list):
        return [_value(v) for v in plain]
    if isinstance(plain, dict):
        if "tuple" in plain:
            return tuple(_value(v) for v in plain["tuple"])
        import torch

        return getattr(torch, plain["dtype"])
    return plain


def generator_call(frame) -> dict | None:
    """The generator's call that `frame` (gen_jit_spec's caller) is in, as one that can be made again:
    the outermost of its callers still in flashinfer.jit, since an outer generator works out what the
    inner one is given (gen_single_decode_module writes the variant that gen_customize_single_decode_module
    renders, flashinfer/jit/attention/modules.py at v0.6.3): a module-level function of
    flashinfer with its arguments as plain values (flashinfer/jit/activation.py's
    gen_act_and_mul_module("silu")). None when that call is anything else (a test file's own
    gen_jit_spec call, a nested function, an argument of another kind): its module then
    regenerates by a dry run of a test instead (`affected`)."""
    while frame.f_back is not None and frame.f_back.f_globals.get("__name__", "").startswith("flashinfer.jit."):
        frame = frame.f_back
    code, module = frame.f_code, frame.f_globals.get("__name__", "")
    if (
        not module.startswith("flashinfer.")
        or code.co_posonlyargcount
        or code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    ):
        return None
    function = getattr(sys.modules.get(module), code.co_name, None)
    try:
        if function is None or getattr(inspect.unwrap(function), "__code__", None) is not code:
            return None
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        kwargs = {name: _plain(frame.f_locals[name]) for name in names}
    except (KeyError, TypeError, ValueError, RecursionError):  # ValueError: a __wrapped__ cycle
        return None
    return {"module": module, "function": code.co_name, "kwargs": kwargs}


def call_again(name: str, call: dict) -> bool:
    """Make module `name`'s JitSpec again by its recorded call (its generator writes the sources,
    compiling nothing); whether that made `name` (an argument changed inside the generator before
    gen_jit_spec makes another module, or none)."""
    try:
        function = getattr(importlib.import_module(call["module"]), call["function"])
        spec = function(**{key: _value(v) for key, v in call["kwargs"].items()})
    except Exception:  # noqa: BLE001 (a generator that no longer takes these: its tests run, and regenerate it)
        return False
    return getattr(spec, "name", None) == name


_REAL: dict[str, str] = {}


def _real(path: str) -> str:
    if path not in _REAL:
        _REAL[path] = os.path.realpath(path)
    return _REAL[path]


def edited_inputs(spec) -> list[str]:
    """The module's inputs (relative to the tree) that differ from the release, once per module."""
    if spec.name not in INPUTS:
        changed, root = set(edited()), tree()
        found = {rel for rel in changed if rel.startswith("3rdparty/")}
        sources = [Path(_real(str(s))) for s in spec.sources]
        generated = [s for s in sources if not s.is_relative_to(root)]
        # a generated source is rendered from csrc/'s templates, or copied from the csrc/ file of its
        # name (batch_decode.cu: flashinfer/jit/attention/modules.py, gen_customize_batch_decode_module at v0.6.3)
        copied = [root / "csrc" / s.name for s in generated if (root / "csrc" / s.name).is_file()]
        dirs = [Path(_real(str(d))) for d in spec.extra_include_dirs or []]
        for path in upstream_suites.closure(sources + copied, root, dirs):
            if path.is_relative_to(root) and str(path.relative_to(root)) in changed:
                found.add(str(path.relative_to(root)))
        if generated:
            found |= {rel for rel in changed if rel.startswith("csrc/") and rel.endswith(".jinja")}
        found |= GENERATORS.get(spec.name, set()) & changed
        INPUTS[spec.name] = sorted(found)
    return INPUTS[spec.name]


def edited_summary() -> str:
    """The tree's edits in a line, where they were read (in `auto`, with prebuilt modules here)."""
    if _STATE["edited"] is None:
        return "not read: no prebuilt module here, every module compiles from the tree"
    found = _STATE["edited"]
    return f"{len(found)} file(s)" + (f": {', '.join(found[:3])}{' ...' if len(found) > 3 else ''}" if found else "")


def from_edits() -> dict[str, list[str]]:
    """{module: its edited inputs} for the modules this process loaded that compile from edited source."""
    return {name: inputs for name, inputs in sorted(INPUTS.items()) if inputs}


def unused_edits() -> list[str]:
    """Edited files of include/ and csrc/ that no module this process asked about compiles."""
    if not _STATE["edited"] or not INPUTS:
        return []
    used = {rel for inputs in INPUTS.values() for rel in inputs}
    return [rel for rel in _STATE["edited"] if rel.split("/")[0] in build_records.TREE_PARTS and rel not in used]


def report(task: str) -> list[str]:
    """What a task prints after its modules loaded: the modules from edited source, and the two
    lines for edits that none of them compiles (the families whose tests would)."""
    lines = []
    if _STATE["mode"] == kernel_source.AUTO and PREBUILT:
        prebuilt = sorted(name for name, chosen in PREBUILT.items() if chosen)
        lines.append(
            f"{task}: kernel source auto: {len(prebuilt)} module(s) prebuilt, {len(PREBUILT) - len(prebuilt)} "
            "compiled from the tree"
        )
    for name, inputs in from_edits().items():
        lines.append(f"{task}: from edited source: {name} ({', '.join(inputs[:3])}{' ...' if len(inputs) > 3 else ''})")
    unused = unused_edits()
    if unused:
        families = sorted({f for names in upstream_suites.families_compiling(tree(), unused).values() for f in names})
        lines.append(
            f"{task}: edited, and compiled by no module of this run: "
            f"{', '.join(unused[:3])}{' ...' if len(unused) > 3 else ''}"
        )
        lines.append(
            f"{task}: fix: its kernels run in FlashInfer's tests: upstream-tests {' '.join(families) or 'FAMILY'} "
            "(`affected` names what an edit reaches)"
        )
    return lines
