"""The Python packages, read from their metadata only (no import), and the FlashInfer source they must match."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from fidev.core.failure import Failure
from fidev.core.files import MayLack, fits, parse_json
from fidev.core.manifest import cuda_tag
from fidev.core.versions import in_range, major_minor
from fidev.jit import kernel_source, module_choice
from fidev.preflight.context import Context
from fidev.preflight.results import ENV_FIX, Result, distribution, fail, ok, warn
from fidev.tree import source_tree


def check_torch(ctx: Context) -> Result:
    target = ctx.target
    dist = distribution("torch")
    if dist is None:
        return fail("PyTorch is not installed", ENV_FIX)
    version_py = Path(dist.locate_file("torch/version.py"))
    text = version_py.read_text() if version_py.is_file() else ""
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([\d.]+)['\"]", text, flags=re.M)
    if not cuda:
        return fail(f"torch {dist.version} is not a CUDA build", f"install torch built for CUDA {target}: {ENV_FIX}")
    if major_minor(cuda.group(1)) != target:
        return fail(
            f"torch {dist.version} is built for CUDA {cuda.group(1)}, not {target}",
            f"install torch built for CUDA {target}: {ENV_FIX}",
        )
    return ok(f"torch {dist.version} (CUDA {cuda.group(1)})")


def check_source(ctx: Context) -> Result:
    p = ctx.pins
    tree = source_tree.inspect(p.source_dir, p)
    where = source_tree.shown(tree.path)
    get = source_tree.GET
    replace = f"python3 scripts/fetch_flashinfer_source.py --replace (it keeps the old tree as {where}.replaced-<time>)"
    if tree.kind == "missing":
        return fail(f"{where} does not exist", get)
    if tree.kind == "not a folder":
        return fail(f"{where} is a file, not a folder", f"move it away, then {get}")
    if tree.kind == "empty":
        return fail(f"{where} is empty: the submodule is not initialized", get)
    if tree.kind == "submodule":
        if not tree.found:
            return warn(f"cannot read the commit of {where}", f"check `git -C {where} status`")
        if not tree.pinned and not source_tree.descends_from(tree.path, p.source_commit):
            return fail(
                f"{where} is at {tree.found[:12]}, the manifest pins {p.source_commit[:12]} (v{p.flashinfer})",
                "git submodule update --init --recursive",
            )
        if not tree.pinned:  # edits committed on top of the pin: the kernel source mode auto compiles what they reach
            return warn(
                f"{where} is at {tree.found[:12]}: "
                f"your commits on top of the pinned {p.source_commit[:12]} (v{p.flashinfer})",
                "fine for kernel work (the modules they reach compile from the tree); "
                "to move the pin itself, see "
                "docs/bindings.md, \"Bumping the FlashInfer pin\"",
            )
        if tree.lacking:
            return fail(
                f"{where} lacks {', '.join(tree.lacking)}: its own submodules are not initialized",
                "git submodule update --init --recursive",
            )
        return ok(f"{where} at v{p.flashinfer} ({tree.found[:12]})")
    if tree.kind == "release":
        if not tree.pinned:
            return fail(f"{where} holds another release ({tree.found})", replace)
        if tree.lacking:
            return fail(f"{where} is a partial release: no {', '.join(tree.lacking)}", replace)
        # The marker records the archive whose SHA-256 matched the pin before it was unpacked.
        return ok(
            f"{where} holds the v{p.flashinfer} source release "
            f"(sha256 {p.sdist_sha256[:12]}... matched before unpacking)"
        )
    return fail(
        f"{where} is neither a git checkout nor a materialized release", f"{replace}; or move it away, then {get}"
    )


# pip's record of where a package was installed from (PEP 610's direct_url.json), as far as the check reads it
DIRECT_URL = {"url": str, "dir_info": MayLack({"editable": MayLack(bool)})}


def direct_url(dist) -> dict | str:
    """The distribution's direct_url.json: {} where it has none (installed from an index), else the object,
    or a str saying what is wrong with the file, named (not JSON, or not of the shape pip writes)."""
    where = f"{dist.metadata['Name']}'s {getattr(dist, '_path', '.dist-info folder')}/direct_url.json"
    try:
        raw = dist.read_text("direct_url.json")
        info = {} if raw is None else parse_json(raw)
    except (OSError, ValueError) as e:  # unreadable; not UTF-8; not JSON
        return f"{where} cannot be read as JSON: {e}"
    if raw is not None and not fits(info, DIRECT_URL):
        found = json.dumps(info)
        return (
            f"{where} is not of the shape pip writes (an object with a url string, a dir_info object, its editable "
            f"true or false): it holds {found if len(found) <= 80 else found[:77] + '...'}"
        )
    return info


def check_flashinfer_install(ctx: Context) -> Result:
    p = ctx.pins
    where = source_tree.shown(p.source_dir)
    dist = distribution("flashinfer-python")
    fix = f"pixi install -e flashinfer-dev (the manifest installs it editable from {where})"
    if dist is None:
        return fail("flashinfer-python is not installed", fix)
    info = direct_url(dist)
    if isinstance(info, str):
        return fail(info, f"pixi reinstall -e flashinfer-dev flashinfer-python, and pip writes it again; or {fix}")
    url = info.get("url", "")
    editable_from = Path(unquote(urlparse(url).path)) if url.startswith("file://") else None
    if not info.get("dir_info", {}).get("editable") or editable_from is None:
        return fail(f"flashinfer-python {dist.version} is not an editable install ({url or 'from a wheel'})", fix)
    if editable_from.resolve() != p.source_dir.resolve():
        return fail(f"flashinfer-python is editable from {editable_from}, not {where}", fix)
    if dist.version != p.flashinfer:
        return fail(f"flashinfer-python {dist.version} installed, the pin is {p.flashinfer}", fix)
    broken = source_tree.broken_editable_links(p.source_dir)
    if broken:
        return fail(
            f"the editable install's links {where}/flashinfer/data/{{{','.join(broken)}}} are gone: "
            "the tree was re-created after the install, and the JIT would fail on them",
            source_tree.REINSTALL,
        )
    return ok(f"flashinfer-python {dist.version} editable from {where}")


def check_cubin(ctx: Context) -> Result:
    p = ctx.pins
    dist = distribution("flashinfer-cubin")
    if dist is None:
        return fail("flashinfer-cubin is not installed", "pixi install -e flashinfer-dev")
    if dist.version != p.flashinfer:
        return fail(
            f"flashinfer-cubin {dist.version} != FlashInfer {p.flashinfer}: FlashInfer refuses to run",
            f"install flashinfer-cubin=={p.flashinfer} (pixi install -e flashinfer-dev)",
        )
    return ok(f"flashinfer-cubin {dist.version}")


def check_kernel_source(ctx: Context) -> Result:
    mode = ctx.mode
    if isinstance(mode, Failure):  # a bogus mode: this check says so, the others run on
        return fail(mode.problem, mode.fix)
    try:
        if mode == kernel_source.AUTO:
            module_choice.check(mode)  # reads the tree's edits where prebuilt modules could load instead
    except Failure as e:
        return fail(e.problem, e.fix)
    edits = f"; edited vs the release: {module_choice.edited_summary()}" if mode == kernel_source.AUTO else ""
    return ok(
        f"{mode} ({kernel_source.ENV}{'' if os.environ.get(kernel_source.ENV) else ' unset: the default'}): "
        f"{kernel_source.SAID[mode]}{edits}"
    )


def check_jit_cache(ctx: Context) -> Result:
    p, tag = ctx.pins, cuda_tag(ctx.target)
    dist = distribution("flashinfer-jit-cache")
    if dist is None:
        return fail("flashinfer-jit-cache is not installed", "pixi install -e flashinfer-dev")
    base, _, local = dist.version.partition("+")
    if base != p.flashinfer:
        return fail(
            f"flashinfer-jit-cache {dist.version} != FlashInfer {p.flashinfer}: FlashInfer refuses to run",
            f"install flashinfer-jit-cache=={p.flashinfer}+{tag}",
        )
    if local != tag:
        return fail(
            f"flashinfer-jit-cache {dist.version} is built for {local or 'no CUDA tag'}, the toolkit is {tag}",
            f"install flashinfer-jit-cache=={p.flashinfer}+{tag}",
        )
    mode = ctx.mode  # a bogus one is the kernel-source check's FAIL; here it counts as neither vendored nor prebuilt
    if mode == kernel_source.VENDORED:
        return ok(f"flashinfer-jit-cache {dist.version}, hidden: kernels compile from the vendored source")
    if mode == kernel_source.PREBUILT:
        return warn(
            f"flashinfer-jit-cache {dist.version}: "
            f"modules it ships load instead of compiling {source_tree.shown(p.source_dir)}, "
            f"edited or not ({kernel_source.ENV}={kernel_source.PREBUILT})",
            f"to build and test your kernel edits, unset {kernel_source.ENV} "
            "(auto: an edited module compiles from the tree)",
        )
    return ok(
        f"flashinfer-jit-cache {dist.version}: a module it ships loads prebuilt where none of its inputs was edited"
    )


def check_tvm_ffi(ctx: Context) -> Result:
    p = ctx.pins
    dist = distribution("apache-tvm-ffi")
    fix = f"install apache-tvm-ffi{p.tvm_ffi_range} (pixi install -e flashinfer-dev)"
    if dist is None:
        return fail("apache-tvm-ffi is not installed", fix)
    if not in_range(dist.version, p.tvm_ffi_range):
        return fail(
            f"apache-tvm-ffi {dist.version} is outside FlashInfer {p.flashinfer}'s range {p.tvm_ffi_range}", fix
        )
    return ok(f"apache-tvm-ffi {dist.version}")
