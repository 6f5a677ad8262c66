"""Integration: the real source release from the package index installs editable and imports.

Needs the network (the package index) and, in the running interpreter, what the editable
install builds and imports with: setuptools>=77, packaging, apache-tvm-ffi and a (CPU) torch.
.ci/run's flashinfer-dev venv provides them; elsewhere the test skips and says what is missing, but never there.
The check of what the workspace cites of FlashInfer needs the release alone, no install, so it runs wherever the
tests do, both of .ci/run's venvs included; like the install's tests, it fails where the release cannot be fetched.
The citations of files the source release leaves out (FlashInfer's tests/) are read in a checkout of the pinned
commit (skipped without one, CI included, and the skip names them), and tests/support/upstream_standin.py's copies
of cited text in the stand-in itself.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
import venv
from dataclasses import asdict
from pathlib import Path

import pytest

from fidev.builds import smoke_modules
from fidev.core.manifest import ROOT, pins
from fidev.jit.uris import KINDS, AttentionConfig, module_uri
from fidev.tree import source_tree
from script_runs import require

pytestmark = pytest.mark.integration
NEEDS = ("setuptools", "packaging", "tvm_ffi", "torch", "numpy")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The pinned source release, fetched once a module (scripts/fetch_flashinfer_source.py: from the
    package index, hash-checked) into a scratch folder: (tree, what the fetch printed). It needs no
    package, only the network; where the release cannot be fetched, the test that asked for it fails."""
    tree = tmp_path_factory.mktemp("release") / "flashinfer"
    fetch = subprocess.run(
        [sys.executable, str(ROOT / "scripts/fetch_flashinfer_source.py"), "--dest", str(tree)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert fetch.returncode == 0, fetch.stderr
    return tree, fetch.stdout


@pytest.fixture(scope="module")
def installed(request, tmp_path_factory):
    require(*NEEDS, why="the editable install builds and imports with them; .ci/run's flashinfer-dev venv has them")
    tree, fetched = request.getfixturevalue("release")  # after require: no download where the install skips
    tmp = tree.parent
    # A throwaway venv that sees the test interpreter's packages (torch, build requirements)
    # through a .pth file, so that only FlashInfer itself is installed into it. It gets no pip
    # of its own: ensurepip's bundled setuptools would shadow the runner's setuptools>=77.
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    runner_paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    with open(os.path.join(site, "runner-site.pth"), "w") as pth:
        pth.write("\n".join(sorted(runner_paths)) + "\n")
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-e",
            str(tree),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return tree, python, fetched


def workspace_on(tree, tmp_path):
    """A copy of the workspace's scripts whose manifest's vendored tree is `tree`."""
    import shutil

    ws = tmp_path / "ws"
    shutil.copytree(ROOT / "scripts", ws / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    text = (
        (ROOT / "pyproject.toml")
        .read_text()
        .replace('source-dir = "extern/tracked/flashinfer"', f'source-dir = "{tree}"')
    )
    (ws / "pyproject.toml").write_text(text)
    return ws


def test_materialized_release_is_the_pinned_one(installed):
    tree, _, out = installed
    assert "materialized" in out
    assert f"\nVersion: {pins().flashinfer}\n" in (tree / "PKG-INFO").read_text()
    for sub in ("csrc", "include", "3rdparty/cutlass/include", "3rdparty/spdlog/include"):
        assert any((tree / sub).iterdir()), f"{sub} is empty"


def test_editable_install_links_the_vendored_tree(installed):
    tree, _, _ = installed
    data = tree / "flashinfer" / "data"
    expected = {"csrc": "csrc", "include": "include", "cutlass": "3rdparty/cutlass", "spdlog": "3rdparty/spdlog"}
    for link, target in expected.items():
        assert (data / link).is_symlink() and (data / link).resolve() == (tree / target).resolve()


def test_import_flashinfer_resolves_to_the_vendored_tree(installed, tmp_path):
    tree, python, _ = installed
    probe = (
        "import json, flashinfer, importlib.metadata as md;"
        "d = md.distribution('flashinfer-python');"
        "print(json.dumps({'version': flashinfer.__version__, 'file': flashinfer.__file__,"
        " 'direct_url': json.loads(d.read_text('direct_url.json'))}))"
    )
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info["version"] == pins().flashinfer
    assert os.path.realpath(info["file"]).startswith(os.path.realpath(tree) + os.sep)
    assert info["direct_url"]["dir_info"] == {"editable": True}


def test_module_uris_match_flashinfers_own(installed, tmp_path):
    """fidev.jit.uris restates FlashInfer's module naming; here the pinned release names a grid of
    configurations itself, so a change of naming shows when the pin moves."""
    _, python, _ = installed
    configs = [
        AttentionConfig(
            kind, backend, dtype, "e4m3" if fp8_kv else dtype, dtype, "i32", qk, vo, posenc, swa, cap, f16qk
        )
        for kind in KINDS
        for backend in (("fa2", "fa3") if kind.endswith("prefill") else ("fa2",))
        for dtype in ("f16", "bf16")
        for fp8_kv in (False, True)
        for qk, vo in ((128, 128), (192, 128))
        for posenc in (0, 1)
        for swa in (False, True)
        for cap in (False, True)
        for f16qk in ((False, True) if kind.endswith("prefill") else (False,))
    ]
    probe = """
import json, sys, torch
from flashinfer.jit.attention import modules
dt = {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn, "i32": torch.int32}
out = []
for c in json.load(sys.stdin):
    common = (dt[c["dtype_q"]], dt[c["dtype_kv"]], dt[c["dtype_o"]])
    tail = (c["head_dim_qk"], c["head_dim_vo"], c["posenc"], c["use_swa"], c["use_logits_cap"])
    idx = (dt[c["dtype_idx"]],) if c["kind"].startswith("batch") else ()
    if c["kind"].endswith("prefill"):
        out.append(getattr(modules, f"get_{c['kind']}_uri")(c["backend"], *common, *idx, *tail, c["f16qk"]))
    else:
        out.append(getattr(modules, f"get_{c['kind']}_uri")(*common, *idx, *tail))
print(json.dumps(out))
"""
    done = subprocess.run(
        [python, "-c", probe],
        input=json.dumps([asdict(c) for c in configs]),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    mismatched = [(ours, t) for ours, t in zip(map(module_uri, configs), theirs, strict=True) if ours != t]
    assert not mismatched, (
        f"{len(mismatched)} of {len(configs)} differ, e.g. ours {mismatched[0][0]} vs FlashInfer {mismatched[0][1]}"
    )


def test_smokes_module_names_are_the_names_the_release_gives_them(installed, tmp_path):
    """fidev.builds.smoke_modules names each module without importing flashinfer (affected tells smoke's
    modules by these names, whoever built them); here the pinned release makes each JitSpec and names it."""
    tree, python, _ = installed
    probe = f"""
import json, sys
sys.path.insert(0, {str(ROOT / "scripts")!r})
from fidev.builds import smoke_modules
print(json.dumps({{m.key: m.make().name for m in smoke_modules.MODULES}}))
"""
    env = {**os.environ, "FLASHINFER_CUDA_ARCH_LIST": "9.0a", "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "base")}
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs == {m.key: m.name for m in smoke_modules.MODULES}


def test_abi_reads_every_export_of_the_release(installed):
    """abi on the real source release: every `TVM_FFI_DLL_EXPORT_TYPED_FUNC(` line of code is an
    export it found, each with the declaration it binds, and the functions abi-smoke calls have
    the argument order the bindings use (docs/bindings.md, step 5)."""
    require("tree_sitter", "tree_sitter_cpp", why="abi parses C++ with tree-sitter")
    from fidev.bindings import signatures as abi

    tree, _, _ = installed
    exports = abi.report(tree)
    lines = [
        line
        for path in (tree / "csrc").rglob("*")
        if path.suffix in (".cu", ".cpp", ".cc")
        for line in path.read_text(errors="replace").splitlines()
        if line.lstrip().startswith("TVM_FFI_DLL_EXPORT_TYPED_FUNC(")
    ]
    assert len(exports) == len(lines) > 100
    assert all(e.signatures for e in exports), [e.key for e in exports if not e.signatures]
    by_key = {e.key: e for e in exports}
    names = lambda key, tail=None: (  # noqa: E731
        [p.name for p in by_key[key].signatures[0].params] + [p.name for p in by_key[key].tails.get(tail, ())]
    )
    assert names(("csrc/flashinfer_norm_binding.cu", "gemma_rmsnorm")) == [
        "out",
        "input",
        "weight",
        "eps",
        "enable_pdl",
    ]
    assert names(("csrc/single_prefill_jit_binding.cu", "run"), "fa2") == [
        "q",
        "k",
        "v",
        "tmp",
        "o",
        "maybe_lse",
        "mask_mode_code",
        "layout",
        "window_left",
        "maybe_custom_mask",
        "maybe_alibi_slopes",
        "logits_soft_cap",
        "sm_scale",
        "rope_rcp_scale",
        "rope_rcp_theta",
    ]
    assert names(("csrc/single_prefill_sm90_jit_binding.cu", "run"), "fa3 and no fp8") == [
        "q",
        "k",
        "v",
        "tmp",
        "o",
        "maybe_lse",
        "mask_mode_code",
        "layout",
        "window_left",
        "maybe_scale_v",
        "logits_soft_cap",
        "sm_scale",
        "scale_v_scalar",
    ]
    assert names(("csrc/gdn_prefill_launcher.cu", "gdn_prefill")) == [
        "output",
        "output_state",
        "q",
        "k",
        "v",
        "cu_seqlens",
        "input_state",
        "alpha",
        "beta",
        "scale",
        "workspace_buffer",
    ]


def test_the_guides_abi_samples_are_what_abi_prints(installed):
    """Each sample output of `abi` in docs/bindings.md (a block that opens with the command,
    `$ pixi run -e flashinfer-dev abi ...`) is what that command prints on the pinned release."""
    require("tree_sitter", "tree_sitter_cpp", why="abi parses C++ with tree-sitter")
    tree, _, _ = installed
    samples = re.findall(
        r"```\n\$ pixi run -e flashinfer-dev abi ([^\n]*)\n(.*?)```", (ROOT / "docs/bindings.md").read_text(), re.S
    )
    assert samples, "docs/bindings.md shows no abi sample any more: drop this test with them"
    for args, shown in samples:
        done = subprocess.run(
            [sys.executable, str(ROOT / "scripts/abi.py"), str(tree), *args.split()],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        # the vendored tree as the guide's command names it, for the release's folder here
        printed = done.stdout.replace(
            f"abi: {source_tree.shown(tree)} ", f"abi: {source_tree.shown(pins().source_dir)} ", 1
        )
        assert printed == shown, f"`abi {args}` prints:\n{printed}"


def test_the_release_installed_and_imported_reads_as_unedited_and_an_edit_reads_as_one(installed):
    """fidev.tree.release_reference against the record written at unpacking, after the editable install
    and an import (its links, build metadata, bytecode are not edits)."""
    import dataclasses

    from fidev.tree import release_reference

    tree, _, _ = installed
    p = dataclasses.replace(pins(), source_dir=tree)
    assert release_reference.edited_files(tree, p) == []
    header = tree / "include/flashinfer/norm.cuh"
    saved = header.read_bytes()
    try:
        header.write_bytes(saved + b"// an edit\n")
        assert release_reference.edited_files(tree, p) == ["include/flashinfer/norm.cuh"]
    finally:
        header.write_bytes(saved)


def test_auto_compiles_only_the_modules_whose_release_inputs_were_edited(installed, tmp_path):
    """The kernel source mode auto on the real release (fidev.jit.module_choice patches FlashInfer's own
    JitSpec.is_aot and registry): with norm and silu_and_mul "prebuilt" in the tree's data/aot (the
    AOT dir without a jit-cache package, flashinfer/jit/env.py `_get_aot_dir`), both load prebuilt;
    an edit of include/flashinfer/norm.cuh compiles norm alone; one of the silu generator,
    flashinfer/jit/activation.py, silu_and_mul alone."""
    import shutil

    tree, python, _ = installed
    ws = workspace_on(tree, tmp_path)
    probe = f"""
import json, sys
sys.path.insert(0, {str(ws / "scripts")!r})
from fidev.jit import kernel_source, module_choice
module_choice.apply(kernel_source.mode())
from flashinfer.jit.activation import gen_act_and_mul_module
from flashinfer.jit.norm import gen_norm_module
norm, silu = gen_norm_module(), gen_act_and_mul_module("silu")
print(json.dumps({{"names": [norm.name, silu.name], "prebuilt": [norm.is_aot, silu.is_aot], \
"report": module_choice.report("t")}}))
"""
    env = {**os.environ, "FLASHINFER_CUDA_ARCH_LIST": "9.0a", "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "base")}
    env.pop("FLASHINFER_DEV_KERNEL_SOURCE", None)
    aot = tree / "flashinfer/data/aot"
    header, generator = tree / "include/flashinfer/norm.cuh", tree / "flashinfer/jit/activation.py"
    saved = {p: p.read_bytes() for p in (header, generator)}

    def run():
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    try:
        for name in ("norm", "silu_and_mul"):
            (aot / name).mkdir(parents=True)
            (aot / name / f"{name}.so").write_bytes(b"")
        out = run()
        assert out["names"] == ["norm", "silu_and_mul"] and out["prebuilt"] == [True, True], out
        header.write_bytes(
            saved[header].replace(
                b"weight_bias + float(weight_vec[j]))", b"weight_bias + float(weight_vec[j])) * 1.005f", 1
            )
        )
        out = run()
        assert (
            out["prebuilt"] == [False, True]
            and "t: from edited source: norm (include/flashinfer/norm.cuh)" in out["report"]
        ), out
        header.write_bytes(saved[header])
        generator.write_bytes(
            saved[generator].replace(
                b"return val / (1.0f + __expf(-val));", b"return 1.01f * val / (1.0f + __expf(-val));", 1
            )
        )
        out = run()
        assert (
            out["prebuilt"] == [True, False]
            and "t: from edited source: silu_and_mul (flashinfer/jit/activation.py)" in out["report"]
        ), out
    finally:
        for path, data in saved.items():
            path.write_bytes(data)
        shutil.rmtree(aot, ignore_errors=True)


def test_a_modules_recorded_generator_call_makes_its_sources_again(installed, tmp_path):
    """`affected` regenerates a module of FlashInfer's tests by the call that made its JitSpec
    (fidev.jit.module_choice.generator_call, noted at gen_jit_spec's registration,
    `jit_spec_registry.register` in flashinfer/jit/core.py at v0.6.3), instead of a dry run of a test. On the real
    release: the calls of four generators (one with torch dtypes) are recorded as plain values, the outermost
    generator's for single decode;
    made again in a fresh process with the generated files removed, they write the same files; an
    edit of gelu's source string changes gelu's files alone, and one of the string that
    gen_single_decode_module hands the inner generator (its `variant_decl` in flashinfer/jit/attention/modules.py)
    the decode module's."""
    tree, python, _ = installed
    ws = workspace_on(tree, tmp_path)
    head = f"""
import json, sys
sys.path.insert(0, {str(ws / "scripts")!r})
from fidev.jit import kernel_source, module_choice
module_choice.apply(kernel_source.mode())
import torch
"""
    record = (
        head
        + """
from flashinfer.jit import gen_single_decode_module
from flashinfer.jit.activation import gen_act_and_mul_module
from flashinfer.jit.norm import gen_norm_module
from flashinfer.jit.quantization import gen_quantization_module
specs = [gen_act_and_mul_module("gelu"), gen_norm_module(), gen_quantization_module(),
         gen_single_decode_module(torch.float16, torch.float16, torch.float16, 128, 128, 0, False, False)]
print(json.dumps(module_choice.CALLS))
"""
    )
    again = (
        head
        + """
import shutil
from flashinfer.jit import env as jit_env
calls = json.loads(sys.stdin.read())
shutil.rmtree(jit_env.FLASHINFER_GEN_SRC_DIR, ignore_errors=True)
print(json.dumps({name: module_choice.call_again(name, call) for name, call in calls.items()}))
"""
    )
    env = {**os.environ, "FLASHINFER_CUDA_ARCH_LIST": "9.0a", "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "base")}
    generated = tmp_path / "base/.cache/flashinfer" / pins().flashinfer / "90a/generated"

    def run(code, stdin=""):
        done = subprocess.run(
            [python, "-c", code], input=stdin, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    def files():  # every generated file, the config.inc headers its sources include too
        return {
            str(f.relative_to(generated)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in generated.rglob("*")
            if f.is_file()
        }

    calls = run(record)
    assert calls["gelu_and_mul"] == {
        "module": "flashinfer.jit.activation",
        "function": "gen_act_and_mul_module",
        "kwargs": {"act_func_name": "gelu"},
    }
    decode = next(name for name in calls if name.startswith("single_decode"))
    assert calls[decode]["function"] == "gen_single_decode_module" and calls[decode]["kwargs"]["dtype_q"] == {
        "dtype": "float16"
    }, calls[decode]
    assert set(calls) == {"gelu_and_mul", "norm", "quantization", decode}
    before = files()
    assert run(again, json.dumps(calls)) == {name: True for name in calls}
    assert files() == before
    for rel, old, new, module in (
        (
            "flashinfer/jit/activation.py",
            b"return val * 0.5f * (1.0f + ::erf(val * kAlpha));",  # activation.py's gelu_def_cu_str
            b"return val * 0.51f * (1.0f + ::erf(val * kAlpha));",
            "gelu_and_mul",
        ),
        (
            "flashinfer/jit/attention/modules.py",
            b'"#include<flashinfer/attention/variants.cuh>",  # variant_decl',
            b'"#include<flashinfer/attention/variants.cuh>\\n// edited",  # variant_decl',
            decode,
        ),
    ):
        path = tree / rel
        saved = path.read_bytes()
        try:
            path.write_bytes(saved.replace(old, new, 1))
            assert path.read_bytes() != saved, f"{rel} no longer has the line this test edits"
            assert run(again, json.dumps(calls)) == {name: True for name in calls}
            changed = {f for f, h in files().items() if h != before.get(f)}
            # a module's generated files: generated/<uri>/... for attention, generated/<name>.cu for activation
            assert changed and all(f.split("/")[0].removesuffix(".cu") == module for f in changed), (rel, changed)
        finally:
            path.write_bytes(saved)


# What the workspace cites of FlashInfer v0.6.3 by file and symbol, instead of line numbers: (file,
# symbol, text the symbol's source holds). A symbol is a module-level name, or Class.method; for a
# file that is not Python, the symbol is text the file holds.
CITED = [
    ("flashinfer/jit/core.py", "JitSpec.is_aot", "self.aot_path.exists()"),  # fidev.jit.module_choice
    ("flashinfer/jit/core.py", "JitSpec.aot_path", "FLASHINFER_AOT_DIR"),
    ("flashinfer/jit/core.py", "JitSpec.build_and_load", "self.load(self.aot_path)"),
    ("flashinfer/jit/core.py", "JitSpec.lock_path", ".lock"),  # tests/support/upstream_standin.py
    # the stand-in's copies (STANDIN_COPIES): build_and_load builds and loads under the module's lock, with
    # need_lock=False; the lock need_lock=True takes; a failed build's error
    (
        "flashinfer/jit/core.py",
        "JitSpec.build_and_load",
        "with FileLock(self.lock_path, thread_local=False):\n"
        "            so_path = self.jit_library_path\n"
        '            verbose = os.environ.get("FLASHINFER_JIT_VERBOSE", "0") == "1"\n'
        "            self.build(verbose, need_lock=False)\n"
        "            result = self.load(so_path)\n",
    ),
    (
        "flashinfer/jit/core.py",
        "JitSpec.build",
        "FileLock(self.lock_path, thread_local=False) if need_lock else nullcontext()",
    ),
    ("flashinfer/jit/cpp_ext.py", "run_ninja", '"Ninja build failed."'),
    ("flashinfer/jit/cpp_ext.py", "run_ninja", '" Ninja output:\\n"'),
    ("flashinfer/jit/core.py", "JitSpec", "extra_include_dirs"),
    ("flashinfer/jit/core.py", "JitSpecRegistry.register", "self._specs[spec.name] = spec"),
    ("flashinfer/jit/core.py", "gen_jit_spec", "jit_spec_registry.register(spec)"),
    ("flashinfer/jit/core.py", "build_jit_specs", "spec.aot_path.exists()"),
    ("flashinfer/jit/env.py", "_get_aot_dir", "flashinfer-jit-cache version ("),  # fidev.jit.flashinfer_import
    ("flashinfer/jit/env.py", "FLASHINFER_BASE_DIR", "FLASHINFER_WORKSPACE_BASE"),  # tests/conftest.py
    ("flashinfer/jit/env.py", "FLASHINFER_JIT_DIR", "cached_ops"),
    ("flashinfer/jit/cpp_ext.py", "generate_ninja_build_for_op", "-c $in -o $out"),  # fidev.records.ninja_inputs
    # docs/faults.md: what an empty variable is to FlashInfer (FLASHINFER_WORKSPACE_BASE's is above)
    ("flashinfer/jit/cpp_ext.py", "generate_ninja_build_for_op", 'os.environ.get("FLASHINFER_NVCC", "$cuda_home'),
    ("flashinfer/compilation_context.py", "CompilationContext.__init__", '"FLASHINFER_CUDA_ARCH_LIST" in os.environ'),
    ("flashinfer/jit/activation.py", "activation_templ", "#include <flashinfer/activation.cuh>"),  # fidev.tree.families
    ("flashinfer/jit/activation.py", "silu_def_cu_str", "__expf(-val)"),
    ("flashinfer/jit/activation.py", "gelu_def_cu_str", "::erf(val * kAlpha)"),
    ("flashinfer/jit/attention/modules.py", "gen_single_decode_module", "gen_customize_single_decode_module("),
    ("flashinfer/jit/attention/modules.py", "gen_customize_batch_decode_module", '"batch_decode.cu"'),
    ("flashinfer/jit/norm.py", "gen_norm_module", "norm.cu"),
    # fidev.jit.uris: the fp8 rules module-uri holds its configurations to
    ("flashinfer/jit/utils.py", "filename_safe_dtype_map", 'torch.float8_e4m3fn: "e4m3"'),
    *[
        (
            "flashinfer/jit/attention/modules.py",
            f"gen_{kind}_module",
            '"fp8 tensor core is not supported in fa2 backend"',
        )
        for kind in ("single_prefill", "batch_prefill")
    ],
    ("flashinfer/jit/attention/modules.py", "gen_batch_prefill_module", "FP8 output is not supported in fa2/fa3"),
    ("flashinfer/aot.py", "gen_fa2", "return  # fp8 tensor cores not supported in fa2"),
    ("flashinfer/aot.py", "gen_attention", "f16_dtype_ + f8_dtype_,\n            f16_dtype_,"),  # fa3: a 16-bit o
    (
        "include/flashinfer/attention/hopper/quantization/kernel_traits.cuh",
        "static_assert(cutlass::sizeof_bits_v<TransElement> == 8);",
        "TranposeTraits_64x64<TileShape_QKD, DTypeKV, NUM_STAGES>",
    ),
    *[
        (f"flashinfer/jit/{name}.py", f"gen_{name}_module", "gen_jit_spec(")
        for name in ("sampling", "topk", "page", "rope", "cascade", "quantization")
    ],
    ("flashinfer/aot.py", "compile_and_package_modules", "# Update workdir"),  # tools/prebuilt_set.py
    ("flashinfer/aot.py", "copy_built_kernels", ".so"),
    ("include/flashinfer/norm.cuh", "FusedAddRMSNormKernel", "FusedAddRMSNormKernel"),  # tests/smoke/test_kernels.py
]


# FlashInfer's tests, cited as CITED is: the source release has no tests/ (test_artifacts.py alone), so these are
# checked on a checkout of the pinned commit, the tag v0.6.3. CITED names the files the release holds, CITED_TESTS
# those it lacks: test_the_cited_symbols_are_in_the_release holds the two lists to that, so that no citation of a
# file the release holds waits for a checkout CI does not have.
CITED_TESTS = [
    # tests/support/upstream_standin.py's tests/utils/test_activation.py (STANDIN_COPIES)
    ("tests/utils/test_activation.py", "warmup_jit", "autouse=not has_flashinfer_jit_cache()"),
    ("tests/utils/test_activation.py", "warmup_jit", 'scope="module"'),
]
# Where tests/support/upstream_standin.py copies a cited symbol: {(file, symbol): (the stand-in's text, as a name
# of that module, and its symbol there)}. The text each CITED or CITED_TESTS entry of (file, symbol) cites must be in
# the stand-in's symbol too, so that the stand-in cannot drift from what is checked to be FlashInfer's.
STANDIN_COPIES = {
    ("flashinfer/jit/core.py", "JitSpec.build_and_load"): ("FAKE_JIT_CORE", "JitSpec.build_and_load"),
    ("flashinfer/jit/core.py", "JitSpec.build"): ("FAKE_JIT_CORE", "JitSpec.build"),
    ("flashinfer/jit/cpp_ext.py", "run_ninja"): ("FAKE_JIT_CORE", "JitSpec.build"),
    ("tests/utils/test_activation.py", "warmup_jit"): ("TEST_ACTIVATION", "warmup_jit"),
}


def symbol_source(text: str, symbol: str) -> str | None:
    """The source of `symbol` in the Python source `text` (a function with its decorators, a class,
    Class.method or an assigned name); None where it is not there."""
    import ast

    nodes = ast.parse(text).body
    for part in symbol.split("."):
        found = [
            n
            for n in nodes
            if getattr(n, "name", None) == part
            or any(getattr(t, "id", None) == part for t in getattr(n, "targets", [getattr(n, "target", None)]))
        ]
        if not found:
            return None
        nodes = getattr(found[0], "body", [found[0]])
    decorators = "".join(f"@{ast.get_source_segment(text, d)}\n" for d in getattr(found[0], "decorator_list", []))
    return decorators + ast.get_source_segment(text, found[0])


def cited_source(root, rel: str, symbol: str) -> str | None:
    """The source of `symbol` in the file `rel` under `root` (symbol_source's, for a Python file),
    the whole file where it is not Python; None where it is not there."""
    text = (root / rel).read_text()
    if not rel.endswith(".py"):
        return text if symbol in text else None
    return symbol_source(text, symbol)


def test_the_cited_symbols_are_in_the_release(release):
    """Each symbol the workspace cites of a file the source release holds (CITED) is in the pinned release,
    where it says, holding what it says; and the files of CITED_TESTS, checked on a checkout instead, are
    the cited files the release lacks. It reads the fetched release, not an install, so both of CI's runs
    check it."""
    tree = release[0]
    lacking = {rel for rel, _, _ in CITED + CITED_TESTS if not (tree / rel).is_file()}
    on_checkout = {rel for rel, _, _ in CITED_TESTS}
    assert lacking == on_checkout, (
        f"cited in CITED, but not in the {pins().sdist_name} (move them to CITED_TESTS): "
        f"{sorted(lacking - on_checkout)}; in CITED_TESTS, but in the release, so checkable here "
        f"(move them to CITED): {sorted(on_checkout - lacking)}"
    )
    missing = [
        f"{rel} {symbol}" for rel, symbol, holds in CITED if holds not in (cited_source(tree, rel, symbol) or "")
    ]
    assert missing == [], f"cited, but not in FlashInfer {pins().flashinfer} as cited: {missing}"


def pinned_checkout(needed):
    """A git checkout of FlashInfer at the pinned commit, which has the tests/ the source release leaves
    out: the vendored submodule, or the checkout FIDEV_FLASHINFER_CHECKOUT names; where there is none, a
    skip that names the citations `needed`, (file, symbol, text), that go unchecked."""
    p = pins()
    for candidate in (p.source_dir, os.environ.get("FIDEV_FLASHINFER_CHECKOUT")):
        found = source_tree.inspect(Path(candidate), p) if candidate else None
        if found and found.kind == "submodule" and found.pinned:
            return found.path
    unchecked = "; ".join(f"{rel} {symbol}: {holds!r}" for rel, symbol, holds in needed)
    pytest.skip(
        f"{len(needed)} citation(s) of FlashInfer's tests/, which the source release lacks, need a checkout of "
        f"the pinned commit {p.source_commit[:12]}, and there is none here (CI has none; every other citation is "
        f"checked on the fetched release): {unchecked}. To check them: git submodule update --init, or set "
        "FIDEV_FLASHINFER_CHECKOUT to such a checkout"
    )


def test_the_cited_tests_are_at_the_pinned_commit():
    """Each symbol the workspace cites of a file the source release lacks (CITED_TESTS: FlashInfer's tests) is
    at the pinned commit, holding what it says."""
    tree = pinned_checkout(CITED_TESTS)
    missing = [
        f"{rel} {symbol}" for rel, symbol, holds in CITED_TESTS if holds not in (cited_source(tree, rel, symbol) or "")
    ]
    assert missing == [], f"cited, but not at FlashInfer's {pins().source_commit[:12]} as cited: {missing}"


def test_the_standin_holds_what_it_copies_as_cited():
    """tests/support/upstream_standin.py holds, in the symbol of its own that copies a cited one, the text
    cited of FlashInfer's (which the two tests above check is FlashInfer's): a stand-in that drifts fails here."""
    import upstream_standin

    cited = [(rel, symbol, holds) for rel, symbol, holds in CITED + CITED_TESTS if (rel, symbol) in STANDIN_COPIES]
    assert {(rel, symbol) for rel, symbol, _ in cited} == set(STANDIN_COPIES), "a copy whose symbol is not cited"
    drifted = [
        f"{name} {where} lacks {holds!r} ({rel} {symbol})"
        for rel, symbol, holds in cited
        for name, where in [STANDIN_COPIES[(rel, symbol)]]
        if holds not in (symbol_source(getattr(upstream_standin, name), where) or "")
    ]
    assert drifted == [], f"the stand-in no longer copies FlashInfer {pins().flashinfer} as cited: {drifted}"


def literal_constants(path) -> dict:
    """The module-level constants of a tool's source that are built from literals and earlier such
    constants (no test imports a tool): {name: value}."""
    import ast

    found: dict = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = eval(  # noqa: S307
                    compile(ast.Expression(node.value), str(path), "eval"), {"__builtins__": {}}, dict(found)
                )
            except Exception:  # noqa: BLE001, S112 (a constant built by a call: not a planted line)
                continue
    return found


def test_every_planted_line_is_in_the_release(installed):
    """The lines the planted-bugs tool and the acceptance run's rounds replace are in the release this
    module fetched, and each bug changes its file: checked in CI's flashinfer-dev venv, not only on a
    host that has a pinned tree (tests/test_planted_bugs.py). A planted bug's line is there exactly once
    (the tool refuses any other count); a round's line at least once (its plant replaces the first:
    NORM_LINE is in RMSNormKernel and again in a later kernel of norm.cuh)."""
    tree = installed[0]
    listed = subprocess.run(
        [sys.executable, str(ROOT / "tools/planted_bugs.py"), "--list"], capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    bugs = [(b["id"], b["file"], b["line"], b["bug"]) for b in json.loads(listed.stdout)]
    rounds = literal_constants(ROOT / "tools/gpu_acceptance.py")
    planted = [(name, rel, line, bug) for name, (rel, line, bug, _) in rounds["AFFECTED_EDITS"].items()]
    planted.append(("edit-loop", rounds["NORM_HEADER"], rounds["NORM_LINE"], rounds["NORM_BUG"]))
    wrong = []
    for name, rel, line, bug in [*bugs, *planted]:
        text = (tree / rel).read_text()
        once = (name, rel, line, bug) in bugs
        if (text.count(line) != 1 if once else not text.count(line)) or text.replace(line, bug, 1) == text:
            wrong.append(f"{name}: {rel} has its line {text.count(line)} time(s)")
    assert len(bugs) >= 21 and len(planted) >= 6 and wrong == [], wrong
