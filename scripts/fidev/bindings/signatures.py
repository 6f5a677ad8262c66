"""The TVM-FFI ABI of a FlashInfer source tree, read from its C++ with tree-sitter's C++ grammar.

What a binding needs to agree on: every function a module exports with
`TVM_FFI_DLL_EXPORT_TYPED_FUNC(name, fn)`, the C++ function it binds, that function's parameters
in order (name, type, optional or not, default) and its return type; for the attention modules,
the trailing parameters FlashInfer generates per backend (`ADDITIONAL_FUNC_PARAMS`, from
`additional_tensor_names`/`additional_scalar_names` in flashinfer/jit/attention/modules.py);
the differences between two trees; and the `TVMFFITypeIndex` values of apache-tvm-ffi's C API.

Why tree-sitter (PyPI `tree-sitter`, `tree-sitter-cpp`): it parses without CUDA, PyTorch or
tvm-ffi headers, and keeps each type as the source spells it (`Optional<ffi::TensorView>`),
which is what a binding reads. libclang would need those headers to know the types at all:
without them every unknown type degrades to `int`. tree-sitter does not preprocess, so this
module expands the object-like macros a file defines itself, and treats `ADDITIONAL_FUNC_PARAMS`,
which FlashInfer's JIT generates, as the backend-dependent tail it is.
"""

from __future__ import annotations

import ast
import gzip
import os
import re
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from fidev.core.failure import Failure
from fidev.core.files import not_a_file, read_input

EXPORT_MACRO = "TVM_FFI_DLL_EXPORT_TYPED_FUNC"
GENERATED_TAIL = "ADDITIONAL_FUNC_PARAMS"  # from the attention modules' generated *_config.inc
SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cuh", ".h", ".hpp", ".inc")
MODULES_PY = "flashinfer/jit/attention/modules.py"
MAX_MACRO_PASSES = 8
# What one source file (or header, or modules.py) may hold, and all of them together, so that a damaged or
# hostile tree or release (a 1 MB .tar.gz can hold a sparse 1 GiB csrc/big.cu) is refused instead of read into
# memory whole. Generous: FlashInfer 0.6.3's largest (csrc/xqa/gmma_impl.cuh) is 0.3 MB, and its csrc/ and
# include/ sources are 9 MB in 577 files.
MAX_SOURCE_BYTES = 16 << 20
MAX_SOURCES_BYTES = 256 << 20
TOO_BIG_FIX = (
    "source files are far smaller (FlashInfer 0.6.3's largest is 0.3 MB): pass an intact FlashInfer source tree or "
    "release (or apache-tvm-ffi wheel)"
)


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    optional: bool  # `Optional<...>`: the slot may be None
    default: str | None = None


@dataclass(frozen=True)
class Signature:
    returns: str
    params: tuple[Param, ...]
    file: str
    line: int
    tail: bool = False  # the parameter list ends in ADDITIONAL_FUNC_PARAMS
    member: bool = False  # declared inside a class: not what an export of a plain name binds


@dataclass(frozen=True)
class Export:
    name: str  # what the module exports, as `__tvm_ffi_<name>`
    file: str  # the binding source, relative to the tree
    line: int
    binds: str  # the C++ function named in the export
    condition: str | None  # the #if/#ifdef it sits under, if any
    signatures: tuple[Signature, ...]  # more than one: overloaded (TVM-FFI then needs a cast)
    tails: dict = field(default_factory=dict)  # backend -> the parameters ADDITIONAL_FUNC_PARAMS adds

    @property
    def symbol(self) -> str:
        return f"__tvm_ffi_{self.name}"

    @property
    def key(self) -> tuple[str, str]:
        return self.file, self.name


class CppParser:
    """tree-sitter's C++ grammar, and the one query this module runs in C rather than walking
    the syntax tree in Python (a generated 4 MB header has millions of nodes)."""

    def __init__(self):
        try:
            import tree_sitter_cpp
            from tree_sitter import Language, Parser, Query, QueryCursor
        except ModuleNotFoundError as e:  # before ImportError, of which it is a kind
            raise Failure(
                f"{e.name} is not installed in this interpreter",
                "run it in the environment: `pixi run -e flashinfer-dev abi` (tree-sitter and tree-sitter-cpp "
                "come with it)",
            ) from e
        except ImportError as e:  # a tree-sitter older than 0.25 has no QueryCursor
            raise Failure(
                f"this tree-sitter is too old: {e}",
                "install tree-sitter >= 0.25 (the flashinfer-dev environment pins it)",
            ) from e
        language = Language(tree_sitter_cpp.language())
        self.parser = Parser(language)
        self._functions = Query(language, "(function_declarator) @fd")
        self._cursor = QueryCursor

    def parse(self, src: bytes):
        return self.parser.parse(src)

    def function_declarators(self, root) -> list:
        return self._cursor(self._functions).captures(root).get("fd", [])


# ---------------------------------------------------------------- reading a tree or a release


def read_capped(path: Path) -> bytes:
    """A regular file of a tree, whole, up to MAX_SOURCE_BYTES; two lines where it holds more, is no
    regular file (a FIFO, whose reading would wait forever) or cannot be read."""
    try:
        return read_input(path, MAX_SOURCE_BYTES)
    except ValueError as e:
        raise Failure(str(e), TOO_BIG_FIX) from None
    except OSError as e:
        raise Failure(f"cannot read {path}: {e.strerror or e}", "make it readable, or pass another tree") from None


def _add(found: dict[str, bytes], rel: str, data: bytes, where: Path) -> None:
    found[rel] = data
    if sum(map(len, found.values())) > MAX_SOURCES_BYTES:
        raise Failure(f"{where}'s sources hold more than {MAX_SOURCES_BYTES >> 20} MiB in all", TOO_BIG_FIX)


def read_release(location: Path, wanted: Callable[[str], bool], found: dict[str, bytes]) -> None:
    """The `wanted` members of a source release archive into `found`, read in memory. The archive is read to
    its end, past tar's end-of-archive blocks, so that gzip checks its trailer (the CRC and length of all it
    held): a copy cut short there, or damaged, is refused in two lines, not read as whole."""
    try:
        with tarfile.open(location) as tar:
            for member in tar:
                rel = PurePosixPath(*PurePosixPath(member.name).parts[1:]).as_posix()
                if not (member.isfile() and wanted(rel)):
                    continue
                if member.size > MAX_SOURCE_BYTES:  # refused before it is read
                    raise Failure(
                        f"{location.name}: its member {member.name} holds more than {MAX_SOURCE_BYTES >> 20} MiB",
                        TOO_BIG_FIX,
                    )
                _add(found, rel, tar.extractfile(member).read(MAX_SOURCE_BYTES + 1), location)
            while tar.fileobj.read(1 << 20):  # the rest, unpacked a MiB at a time: gzip checks its trailer at the end
                pass
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise Failure(
            f"cannot read {location.name}: it is cut short or damaged ({e})",
            "download it again: a whole source release ends with the gzip trailer that checks it",
        ) from e
    except (tarfile.TarError, OSError) as e:
        raise Failure(
            f"cannot read {location.name}: {e}",
            "pass a FlashInfer source release (flashinfer_python-X.tar.gz) or a source tree",
        ) from e


def read_sources(location: Path) -> dict[str, bytes]:
    """csrc/**/*, include/**/* and the attention modules' generator, from a source tree or a source release
    archive (read in memory, never unpacked or installed). Paths are relative to the tree. Each file is read
    up to MAX_SOURCE_BYTES, all of them up to MAX_SOURCES_BYTES: two lines where one holds more."""
    wanted = lambda rel: (  # noqa: E731
        (rel.startswith(("csrc/", "include/")) and rel.endswith(SOURCE_SUFFIXES)) or rel == MODULES_PY
    )
    found: dict[str, bytes] = {}
    if location.is_dir():
        paths = [p for top in ("csrc", "include") for p in sorted((location / top).rglob("*"))]
        for p in [*paths, location / MODULES_PY]:
            rel = p.relative_to(location).as_posix()
            if not wanted(rel):
                continue
            what = not_a_file(p)
            if what == "is a folder" or (what == "does not exist" and not os.path.lexists(p)):
                continue  # a folder named like a source; modules.py, where the tree has none
            if what:  # a FIFO (whose reading would wait forever), a device, a dangling link or a link loop
                dangling = what == "does not exist"
                raise Failure(
                    f"{p} is a symbolic link to {os.readlink(p)}, which does not exist" if dangling else f"{p} {what}",
                    "a source of the tree is a regular file: remove or replace what is there, or pass another tree",
                )
            _add(found, rel, read_capped(p), location)
    elif location.is_file() and location.name.endswith((".tar.gz", ".tgz")):
        read_release(location, wanted, found)
    else:  # missing, a FIFO or a device: said for what it is; a file of another name: not a release
        raise Failure(
            f"{location} {not_a_file(location) or 'is neither a folder nor a .tar.gz source release'}",
            "pass a FlashInfer source tree or a source release flashinfer_python-X.tar.gz",
        )
    if not any(rel.startswith("csrc/") for rel in found):
        raise Failure(
            f"{location} has no csrc/ sources", "pass the root of a FlashInfer source tree or its source release"
        )
    return found


# ---------------------------------------------------------------- parsing


def _text(src: bytes, node) -> str:
    return " ".join(src[node.start_byte : node.end_byte].decode(errors="replace").split())


def _walk(node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def expand_macros(parser: CppParser, src: bytes) -> bytes:
    """Expand the object-like macros the file itself #defines where they are used (what the
    preprocessor would do, limited to this file). Uses are found in the bytes and confirmed by
    the parse: an identifier outside the #define."""
    for _ in range(MAX_MACRO_PASSES):
        if b"#define" not in src and b"# define" not in src:
            return src
        root = parser.parse(src).root_node
        defines = {}
        for match in re.finditer(rb"^[ \t]*#[ \t]*define[ \t]+\w+", src, re.M):  # where to look; the parse decides
            node = root.descendant_for_byte_range(match.start(), match.end() - 1)
            define = next((a for a in [node, *_ancestors(node)] if a.type == "preproc_def"), None)
            if define is not None:
                value = define.child_by_field_name("value")
                defines[_text(src, define.child_by_field_name("name"))] = (
                    _text(src, value).replace("\\", " ") if value is not None else ""
                )
        uses = []
        for name in defines:
            for match in re.finditer(rb"\b" + re.escape(name.encode()) + rb"\b", src):
                node = root.descendant_for_byte_range(match.start(), match.end())
                if node.type in (
                    "identifier",
                    "type_identifier",
                    "field_identifier",
                    "namespace_identifier",
                ) and not any(a.type in ("preproc_def", "preproc_function_def") for a in _ancestors(node)):
                    uses.append((match.start(), match.end(), name))
        if not uses:
            return src
        for start, end, name in sorted(uses, reverse=True):
            src = src[:start] + defines[name].encode() + src[end:]
    return src


def _ancestors(node):
    node = node.parent
    while node is not None:
        yield node
        node = node.parent


def _condition(src: bytes, node) -> str | None:
    """The #if/#ifdef/#ifndef (or the #else of one) an export sits under, innermost first."""
    conditions = []
    for parent in _ancestors(node):
        if parent.type in ("preproc_if", "preproc_elif"):
            conditions.append(
                f"#{parent.type[len('preproc_') :]} {_text(src, parent.child_by_field_name('condition'))}"
            )
        elif parent.type == "preproc_ifdef":
            keyword = src[parent.start_byte : parent.end_byte].decode(errors="replace").split()[0]
            conditions.append(f"{keyword} {_text(src, parent.child_by_field_name('name'))}")
        elif parent.type == "preproc_else":
            conditions.append("#else")
    return " / ".join(conditions) or None


def _param(src: bytes, node) -> Param:
    name_node, declarator = None, node.child_by_field_name("declarator")
    for n in _walk(declarator) if declarator is not None else ():
        if n.type == "identifier":
            name_node = n
            break
    default = node.child_by_field_name("default_value")
    end = default.start_byte if default is not None else node.end_byte
    whole = src[node.start_byte : end].decode(errors="replace").rstrip().rstrip("=").rstrip()
    if name_node is not None:
        before = src[node.start_byte : name_node.start_byte].decode(errors="replace")
        after = src[name_node.end_byte : end].decode(errors="replace").rstrip().rstrip("=")
        type_text, name = " ".join((before + after).split()), _text(src, name_node)
    else:  # an unnamed parameter
        type_text, name = " ".join(whole.split()), ""
    type_node = node.child_by_field_name("type")
    optional = (
        type_node is not None
        and type_node.type == "template_type"
        and _text(src, type_node.child_by_field_name("name")).split("::")[-1] == "Optional"
    )
    return Param(
        name,
        type_text.replace(" &", "&").replace(" *", "*"),
        optional,
        _text(src, default) if default is not None else None,
    )


def _signature(src: bytes, declarator, owner, rel: str) -> Signature:
    params = declarator.child_by_field_name("parameters")
    tail = any(c.type == "comment" and src[c.start_byte : c.end_byte] == TAIL_MARK for c in params.children)
    items = [
        _param(src, c)
        for c in params.named_children
        if c.type in ("parameter_declaration", "optional_parameter_declaration")
    ]
    if [c for c in params.named_children if c.type == "variadic_parameter_declaration"]:
        items.append(Param("...", "...", False))
    returns = _text(src, owner.child_by_field_name("type")) if owner.child_by_field_name("type") is not None else ""
    wrapper = declarator.parent  # pointer/reference declarators around the function declarator
    while wrapper is not None and wrapper.type in ("pointer_declarator", "reference_declarator"):
        returns += "*" if wrapper.type == "pointer_declarator" else "&"
        wrapper = wrapper.parent
    member = any(a.type == "field_declaration_list" for a in _ancestors(declarator))
    return Signature(returns, tuple(items), rel, declarator.start_point[0] + 1, tail, member)


TAIL_MARK = b"/*" + GENERATED_TAIL.encode() + b"*/"


def parse_file(parser: CppParser, rel: str, raw: bytes):
    """(exports as (name, bound function, line, condition), declarations as name -> [Signature],
    signatures of exported lambdas by (name, line))."""
    # ADDITIONAL_FUNC_PARAMS is defined in a generated header: turn it into a comment the parse
    # keeps inside the parameter list, so the declaration parses and the tail is still seen.
    src = expand_macros(parser, raw.replace(GENERATED_TAIL.encode(), TAIL_MARK))
    root = parser.parse(src).root_node
    exports, declarations, lambdas = [], {}, {}
    for match in re.finditer(EXPORT_MACRO.encode() + rb"\s*\(", src):  # where to look; the parse decides what it is
        node = root.descendant_for_byte_range(match.start(), match.start() + len(EXPORT_MACRO))
        call = next((a for a in [node, *_ancestors(node)] if a.type == "call_expression"), None)
        if call is None or _text(src, call.child_by_field_name("function")) != EXPORT_MACRO:
            continue  # the macro's own #define, or text in a comment
        args = call.child_by_field_name("arguments").named_children
        if len(args) != 2:
            continue
        target = args[1]
        while target.type in ("pointer_expression", "parenthesized_expression"):
            target = target.named_children[-1]
        name, line = _text(src, args[0]), call.start_point[0] + 1
        if target.type == "lambda_expression" and target.child_by_field_name("declarator") is not None:
            lambdas[(name, line)] = _signature(src, target.child_by_field_name("declarator"), target, rel)
            binds = "<lambda>"
        else:
            binds = _text(src, target).split("::")[-1]
        exports.append((name, binds, line, _condition(src, call)))
    for node in parser.function_declarators(root):
        owner = node.parent
        while owner is not None and owner.type in ("pointer_declarator", "reference_declarator", "init_declarator"):
            owner = owner.parent  # (init_declarator: a definition tree-sitter lost its way in after a macro)
        if owner is not None and owner.type in ("declaration", "function_definition", "field_declaration"):
            name = _text(src, node.child_by_field_name("declarator")).split("::")[-1]
            declarations.setdefault(name, []).append(_signature(src, node, owner, rel))
    return exports, declarations, lambdas


# ---------------------------------------------------------------- attention tails


def attention_tails(modules_py: bytes) -> dict[str, dict[str, tuple[Param, ...]]]:
    """family (single_prefill, batch_decode...) -> backend -> the parameters ADDITIONAL_FUNC_PARAMS
    expands to: the `additional_*` lists of each `gen_<family>_module` in modules.py, per branch of
    `if backend == ...` (and `if not fp8_enabled`), rendered as flashinfer/jit/attention/utils.py's
    generate_additional_params renders them (`maybe_*` tensors Optional, others required)."""
    tree = ast.parse(modules_py)
    families = {}
    for fn in tree.body:
        if (
            isinstance(fn, ast.FunctionDef)
            and re.fullmatch(r"gen_(\w+)_module", fn.name)
            and not fn.name.startswith("gen_customize")
        ):
            variants = {}
            _collect(fn.body, [], {}, variants)
            variants = {
                label: _render(values) for label, values in variants.items() if "additional_tensor_names" in values
            }
            if variants:
                families[fn.name[len("gen_") : -len("_module")]] = variants
    return families


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _collect(body, labels, values, out):
    values = dict(values)
    for stmt in body:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id.startswith("additional_")
            and isinstance(_literal(stmt.value), list)
        ):
            values[stmt.targets[0].id] = _literal(stmt.value)
        elif isinstance(stmt, ast.If):
            label = ast.unparse(stmt.test)
            _collect(stmt.body, [*labels, label], values, out)
            _collect(stmt.orelse, [*labels, f"not ({label})"], values, out)
            return
    if values:
        out[" and ".join(labels) or "all"] = values


def _render(values) -> tuple[Param, ...]:
    tensors = [
        Param(n, "Optional<ffi::Tensor>" if n.startswith("maybe") else "ffi::Tensor", n.startswith("maybe"))
        for n in values.get("additional_tensor_names", [])
    ]
    scalars = [
        Param(n, t, False)
        for n, t in zip(
            values.get("additional_scalar_names", []), values.get("additional_scalar_dtypes", []), strict=False
        )
    ]
    return tuple(tensors + scalars)


def _family(rel: str) -> str | None:
    match = re.fullmatch(r"csrc/(\w+?)(_sm90)?_jit_binding\.cu", rel)
    return match.group(1) if match else None


def _backend_label(label: str) -> str:
    """'backend == 'fa2'' -> fa2; its else branch -> fa3 (the _sm90 binding)."""
    label = label.replace("not (backend == 'fa2')", "fa3").replace("backend == 'fa2'", "fa2")
    label = label.replace("not (not fp8_enabled)", "fp8").replace("not fp8_enabled", "no fp8")
    return label


# ---------------------------------------------------------------- the report


def report(location: Path) -> list[Export]:
    files = read_sources(location)
    parser = CppParser()
    parsed = {
        rel: parse_file(parser, rel, raw)
        for rel, raw in files.items()
        if rel.startswith("csrc/") and EXPORT_MACRO.encode() in raw
    }
    tails = attention_tails(files[MODULES_PY]) if MODULES_PY in files else {}
    elsewhere: dict[str, list[Signature]] = {}  # declarations from files without exports, read on demand

    def declared(binds: str) -> list[Signature]:
        """A function the binding file does not declare: any other file under csrc/ or include/
        that names it (looked up in the bytes first, so that only those are parsed)."""
        found = [s for _, declarations, _ in parsed.values() for s in declarations.get(binds, [])]
        if found:
            return found
        if binds not in elsewhere:
            elsewhere[binds] = [
                s
                for rel, raw in files.items()
                if rel not in parsed and rel != MODULES_PY and binds.encode() in raw
                for s in parse_file(parser, rel, raw)[1].get(binds, [])
            ]
        return elsewhere[binds]

    exports = []
    for rel, (found, declarations, lambdas) in sorted(parsed.items()):
        for name, binds, line, condition in found:
            sigs = [lambdas[(name, line)]] if (name, line) in lambdas else declarations.get(binds) or declared(binds)
            free = [s for s in sigs if not s.member] or sigs
            unique = tuple(
                sorted({(s.returns, s.params, s.tail): s for s in free}.values(), key=lambda s: (s.file, s.line))
            )
            family, sm90 = _family(rel), rel.endswith("_sm90_jit_binding.cu")
            tail = {}
            if any(s.tail for s in unique) and family in tails:
                wanted = "fa3" if sm90 else "fa2"
                tail = {
                    label: params
                    for label, params in ((_backend_label(k), v) for k, v in tails[family].items())
                    if label.startswith(wanted) or label == "all" or not label.startswith(("fa2", "fa3"))
                }
            exports.append(Export(name, rel, line, binds, condition, unique, tail))
    return exports


def as_json(exports: list[Export]) -> list[dict]:
    return [{**asdict(e), "symbol": e.symbol} for e in exports]


# ---------------------------------------------------------------- the diff


@dataclass(frozen=True)
class Change:
    key: tuple[str, str]
    what: str  # a sentence: "parameter eps retyped: float -> double"
    old_at: str  # file:line on the old side
    new_at: str


def _params(export: Export) -> tuple[Param, ...]:
    return export.signatures[0].params if export.signatures else ()


def _declared_at(export: Export) -> str:
    """file:line of the declaration an export binds, else of the export itself."""
    where = export.signatures[0] if export.signatures else export
    return f"{where.file}:{where.line}"


def param_changes(old: tuple[Param, ...], new: tuple[Param, ...]) -> list[str]:
    """What changed between two parameter lists: inserted, removed, renamed, retyped, moved,
    made optional or required, default changed."""
    changes = []
    old_names, new_names = [p.name for p in old], [p.name for p in new]
    gone = [p for p in old if p.name not in new_names]
    came = [p for p in new if p.name not in old_names]
    renamed = {}
    for p in gone:  # a parameter removed where one of the same type appears at the same place: renamed
        twin = next(
            (q for q in came if new.index(q) == old.index(p) and q.type == p.type and q not in renamed.values()), None
        )
        if twin is not None:
            renamed[p.name] = twin
            changes.append(f"parameter #{old.index(p)} renamed: {p.name} -> {twin.name}")
    for p in gone:
        if p.name not in renamed:
            changes.append(f"parameter {p.name} ({p.type}) removed from position {old.index(p)}")
    for q in came:
        if q not in renamed.values():
            changes.append(f"parameter {q.name} ({q.type}) inserted at position {new.index(q)}")
    common_old = [p.name for p in old if p.name in new_names]
    common_new = [p.name for p in new if p.name in old_names]
    for name in common_old:
        p, q = old[old_names.index(name)], new[new_names.index(name)]
        if p.type != q.type:
            changes.append(f"parameter {name} retyped: {p.type} -> {q.type}")
        if p.optional != q.optional:
            changes.append(f"parameter {name} made {'optional' if q.optional else 'required'}")
        if p.default != q.default:
            changes.append(f"parameter {name} default: {p.default} -> {q.default}")
        if common_old.index(name) != common_new.index(name):
            changes.append(f"parameter {name} moved: position {old.index(p)} -> {new.index(q)}")
    return changes


def diff(old: list[Export], new: list[Export]) -> tuple[list[Export], list[Export], list[Change]]:
    """(added, removed, changed) between two reports, exports keyed by (binding file, name)."""
    before, after = {e.key: e for e in old}, {e.key: e for e in new}
    gone, came = before.keys() - after.keys(), after.keys() - before.keys()
    # An export that left one binding file and appears in exactly one other, binding the same
    # function, moved: it is compared, not listed as removed and added.
    moved = {}
    for key in sorted(gone):
        candidates = [k for k in came if k[1] == key[1] and after[k].binds == before[key].binds]
        if len(candidates) == 1 and candidates[0] not in moved.values():
            moved[key] = candidates[0]
    added = [after[k] for k in sorted(came - set(moved.values()))]
    removed = [before[k] for k in sorted(gone - moved.keys())]
    changes = []
    pairs = [(k, k) for k in sorted(before.keys() & after.keys())] + sorted(moved.items())
    for key, new_key in pairs:
        o, n = before[key], after[new_key]
        said = []
        if o.binds != n.binds:
            said.append(f"binds {n.binds} instead of {o.binds}")
        if o.signatures and n.signatures and o.signatures[0].returns != n.signatures[0].returns:
            said.append(f"returns {n.signatures[0].returns} instead of {o.signatures[0].returns}")
        if len(o.signatures) > 1 or len(n.signatures) > 1:  # overloads: compare them as a set
            shown = lambda sig: f"{sig.returns}({', '.join(f'{p.type} {p.name}' for p in sig.params)})"  # noqa: E731
            before_set, after_set = {shown(x) for x in o.signatures}, {shown(x) for x in n.signatures}
            said += [f"overload {x} removed" for x in sorted(before_set - after_set)]
            said += [f"overload {x} added" for x in sorted(after_set - before_set)]
        else:
            said += param_changes(_params(o), _params(n))
        for backend in sorted(set(o.tails) | set(n.tails)):
            said += [f"{backend} tail: {c}" for c in param_changes(o.tails.get(backend, ()), n.tails.get(backend, ()))]
        if o.condition != n.condition:
            said.append(f"condition: {o.condition} -> {n.condition}")
        if key != new_key:
            said.insert(0, f"moved to {new_key[0]}")
        changes += [Change(key, s, _declared_at(o), _declared_at(n)) for s in said]
    return added, removed, changes


# ---------------------------------------------------------------- what TVM-FFI calls the types

# apache-tvm-ffi 0.1.7: TypeTraits<T>::TypeStr() (include/tvm/ffi/type_traits.h, container/tensor.h)
# and the StaticTypeKey strings of include/tvm/ffi/object.h. A function's signature at run time,
# as TVM-FFI prints it, spells each parameter this way.
_TVM_FFI_NAMES = {
    "bool": "bool",
    "float": "float",
    "double": "float",
    "TensorView": "DLTensor*",
    "Tensor": "ffi.Tensor",
    "DLDataType": "DataType",
    "DLDevice": "Device",
    "String": "str",
    "void": "void",
}
_INTEGERS = {
    "int",
    "int8_t",
    "int16_t",
    "int32_t",
    "int64_t",
    "uint8_t",
    "uint16_t",
    "uint32_t",
    "uint64_t",
    "size_t",
    "long",
    "unsigned",
    "unsigned int",
    "long long",
}


def tvm_ffi_type(cpp: str) -> str:
    """`const Optional<ffi::TensorView>&` -> `Optional<DLTensor*>`, as TVM-FFI names it at run time."""
    text = re.sub(r"\bconst\b|&", "", cpp).strip()
    text = re.sub(r"\b(?:tvm::)?ffi::|\bstd::", "", text).strip()
    outer = re.fullmatch(r"(\w+)\s*<(.*)>", text)
    if outer and outer.group(1) in ("Optional", "Array"):
        return f"{outer.group(1)}<{tvm_ffi_type(outer.group(2))}>"
    if text in _INTEGERS:
        return "int"
    return _TVM_FFI_NAMES.get(text, text)


# ---------------------------------------------------------------- TVM-FFI type indices


def _tvm_ffi_header(location: Path) -> bytes:
    """c_api.h of apache-tvm-ffi, from a wheel, an installed package folder or the header itself."""
    member = "tvm_ffi/include/tvm/ffi/c_api.h"
    reason = None if location.is_dir() else not_a_file(location)
    if reason and reason != "does not exist":  # a FIFO, a device, a socket: said, never read
        raise Failure(f"{location} {reason}", "pass an apache-tvm-ffi wheel, its installed tvm_ffi folder, or c_api.h")
    if location.is_file() and location.suffix == ".whl":
        try:
            with zipfile.ZipFile(location) as whl:
                if whl.getinfo(member).file_size > MAX_SOURCE_BYTES:  # refused before it is unpacked
                    raise Failure(
                        f"{location.name}: its {member} holds more than {MAX_SOURCE_BYTES >> 20} MiB", TOO_BIG_FIX
                    )
                return whl.read(member)
        except (zipfile.BadZipFile, KeyError, OSError) as e:
            raise Failure(
                f"{location.name} has no readable {member}: {e}",
                "pass an apache-tvm-ffi wheel or its installed tvm_ffi folder",
            ) from e
    for candidate in (location, location / "include/tvm/ffi/c_api.h", location / member):
        reason = not_a_file(candidate)
        if reason is None:  # a regular file: nothing else is read
            return read_capped(candidate)
        if candidate != location and reason not in ("does not exist", "is a folder"):
            raise Failure(f"{candidate} {reason}", "put the header's regular file there, or pass the wheel")
    raise Failure(f"no c_api.h in {location}", "pass an apache-tvm-ffi wheel, its installed tvm_ffi folder, or c_api.h")


def type_indices(location: Path) -> dict[str, int]:
    """TVMFFITypeIndex: enumerator -> value, as the C++ compiler numbers them. The header opens
    and closes the enum differently for C and C++ (`#ifdef __cplusplus`), which no parse of the
    raw text can join: the body between the two is taken, its preprocessor lines dropped, and the
    enum parsed whole."""
    src = _tvm_ffi_header(location)
    start = src.find(b"enum TVMFFITypeIndex")
    brace = src.find(b"{", start) if start >= 0 else -1
    end = src.find(b"TVMFFITypeIndex;", brace) if brace >= 0 else -1
    close = src.rfind(b"}", brace, end) if end >= 0 else -1
    if close < 0:
        raise Failure(
            f"no TVMFFITypeIndex enum in {location}", "pass an apache-tvm-ffi wheel or its installed tvm_ffi folder"
        )
    body = b"\n".join(line for line in src[brace + 1 : close].splitlines() if not line.lstrip().startswith(b"#"))
    enum = b"enum TVMFFITypeIndex {" + body + b"};"
    values: dict[str, int] = {}
    following = -1
    for node in _walk(CppParser().parse(enum).root_node):
        if node.type == "enumerator":
            name = _text(enum, node.child_by_field_name("name"))
            value = node.child_by_field_name("value")
            where = f"{location}'s TVMFFITypeIndex {name}"
            following = _evaluate(_text(enum, value), values, where) if value is not None else following + 1
            values[name] = following
    return values


class _Unreadable(Exception):
    """An enumerator's value this reader does not evaluate, and why."""


_TOKEN = re.compile(r"\s*(?:(0[xX][0-9a-fA-F]+|\d+)[uUlL]*(?![\w.])|([A-Za-z_]\w*)|(<<|>>|[-+*/%|&^~()]))")
_LEVELS = (("|",), ("^",), ("&",), ("<<", ">>"), ("+", "-"), ("*", "/", "%"))  # C's, loosest first
MAX_NESTING = 32  # parentheses and unary operators, one inside another
MAX_MAGNITUDE = 2**64


def _c_integer(digits: str) -> int:
    """A C integer literal: 0x hexadecimal, a leading 0 octal, else decimal."""
    if len(digits) > 1 and digits[0] == "0" and digits[1] not in "xX":
        if not set(digits) <= set("01234567"):
            raise _Unreadable(f"{digits} is no octal number")
        return int(digits, 8)
    return int(digits, 0)


def _tokens(expression: str, known: dict[str, int]) -> list:
    """Numbers (ints, earlier enumerators resolved) and operators (strs)."""
    tokens, at = [], 0
    while expression[at:].strip():
        found = _TOKEN.match(expression, at)
        if not found:
            raise _Unreadable(f"{expression[at:].strip()[:20]!r} is no integer, enumerator or operator it knows")
        number, name, operator = found.groups()
        if name is not None and name not in known:
            raise _Unreadable(f"{name} is no earlier enumerator")
        tokens.append(_c_integer(number) if number else known[name] if name else operator)
        at = found.end()
    return tokens


def _apply(operator: str, left: int, right: int) -> int:
    if operator in ("/", "%") and right == 0:
        raise _Unreadable("it divides by zero")
    if operator in ("<<", ">>") and not 0 <= right < 64:
        raise _Unreadable(f"it shifts by {right}")
    quotient = abs(left) // abs(right) * (1 if (left < 0) == (right < 0) else -1) if operator in ("/", "%") else 0
    value = {
        "|": lambda: left | right,
        "^": lambda: left ^ right,
        "&": lambda: left & right,
        "<<": lambda: left << right,
        ">>": lambda: left >> right,
        "+": lambda: left + right,
        "-": lambda: left - right,
        "*": lambda: left * right,
        "/": lambda: quotient,  # C truncates toward zero
        "%": lambda: left - quotient * right,
    }[operator]()
    if abs(value) >= MAX_MAGNITUDE:
        raise _Unreadable("its value is past 64 bits")
    return value


class _Reader:
    """Recursive descent over C's integer operators, nesting bounded by MAX_NESTING."""

    def __init__(self, tokens: list):
        self.tokens, self.at, self.depth = tokens, 0, 0

    def peek(self):
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self):
        token = self.peek()
        if token is None:
            raise _Unreadable("it ends early")
        self.at += 1
        return token

    def binary(self, level: int = 0) -> int:
        if level == len(_LEVELS):
            return self.unary()
        value = self.binary(level + 1)
        while isinstance(self.peek(), str) and self.peek() in _LEVELS[level]:
            operator = self.take()
            value = _apply(operator, value, self.binary(level + 1))
        return value

    def unary(self) -> int:
        token = self.take()
        if isinstance(token, int):
            return token
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _Unreadable(f"it nests more than {MAX_NESTING} deep")
        if token == "(":
            value = self.binary()
            if self.take() != ")":
                raise _Unreadable("a parenthesis is not closed")
        elif token in ("-", "+", "~"):
            operand = self.unary()
            value = -operand if token == "-" else ~operand if token == "~" else operand
        else:
            raise _Unreadable(f"{token!r} stands where a number should")
        self.depth -= 1
        return value


def _evaluate(expression: str, known: dict[str, int], where: str = "the header") -> int:
    """An enumerator's value, as C computes it: integer literals (decimal, 0x, octal, u/l suffixes),
    earlier enumerators, parentheses and + - * / % << >> | & ^ ~; never eval."""
    try:
        reader = _Reader(_tokens(expression, known))
        value = reader.binary()
        if reader.peek() is not None:
            raise _Unreadable(f"{reader.peek()!r} follows a whole expression")
    except _Unreadable as e:
        raise Failure(
            f"cannot evaluate {where} = {expression[:80]!r}: {e}",
            "report it: the header uses an expression this reader does not know",
        ) from None
    return value


def index_diff(old: dict[str, int], new: dict[str, int]) -> list[str]:
    lines = [f"{name}: {old[name]} -> {new[name]}" for name in old if name in new and old[name] != new[name]]
    lines += [f"{name} ({old[name]}) removed" for name in old if name not in new]
    lines += [f"{name} = {new[name]} added" for name in new if name not in old]
    return lines
