"""abi: the TVM-FFI exports of FlashInfer-shaped fixture sources written here (overloads, default
arguments, Optional<>, macros, an export under #if, the generated attention tail), the diff of
two trees, and the TVMFFITypeIndex values of fixture tvm-ffi headers and wheels."""

import json
import os
import tarfile
import zipfile

import pytest

from script_runs import require, run, two_line_failure

require("tree_sitter", "tree_sitter_cpp", why="abi parses C++ with tree-sitter (a flashinfer-dev dependency)")
from fidev.bindings import signatures as abi  # noqa: E402

BINDING = """\
#include "tvm_ffi_utils.h"
#include "single_prefill_config.inc"

using tvm::ffi::Optional;

#define NORM_ARGS TensorView out, TensorView input
#define EPS_T double

// norm.cu defines these; the binding declares them
void rmsnorm(NORM_ARGS, TensorView weight, EPS_T eps, bool enable_pdl = false);
int64_t* workspace_size(Optional<TensorView> maybe_hint, int64_t n = 8);
void scale(TensorView x, double s);
void scale(TensorView x, float s, int64_t n);
void single_prefill(ffi::TensorView q, Optional<ffi::TensorView> maybe_lse,
                    int64_t window_left ADDITIONAL_FUNC_PARAMS);

TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm, rmsnorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(workspace_size, &workspace_size);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale, scale);
#ifdef FLASHINFER_ENABLE_FP8
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fp8_only, rmsnorm);
#endif
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, single_prefill);
// TVM_FFI_DLL_EXPORT_TYPED_FUNC(commented_out, rmsnorm);
"""
ELSEWHERE = "namespace flashinfer {\nvoid moved_away(TensorView a, int64_t b) {}\n}\n"
EXPORT_ELSEWHERE = "TVM_FFI_DLL_EXPORT_TYPED_FUNC(moved_away, flashinfer::moved_away);\n"
MODULES = """\
def gen_single_prefill_module(backend, dtype_q):
    fp8_enabled = dtype_q in (1, 2)
    if backend == "fa2":
        additional_tensor_names = ["maybe_custom_mask", "maybe_alibi_slopes"]
        additional_tensor_dtypes = ["uint8_t", "float"]
        additional_scalar_names = ["logits_soft_cap", "sm_scale"]
        additional_scalar_dtypes = ["double", "double"]
    else:
        if not fp8_enabled:
            additional_tensor_names = ["maybe_scale_v"]
            additional_tensor_dtypes = ["float"]
            additional_scalar_names = ["sm_scale", "scale_v_scalar"]
            additional_scalar_dtypes = ["double", "double"]
        else:
            additional_tensor_names = ["scale_q"]
            additional_tensor_dtypes = ["float"]
            additional_scalar_names = ["sm_scale"]
            additional_scalar_dtypes = ["double"]
    return gen_customize_single_prefill_module(backend)
"""


def tree(root, binding=BINDING, extra=None):
    for rel, text in {
        "csrc/single_prefill_jit_binding.cu": binding,
        "csrc/launcher.cu": EXPORT_ELSEWHERE,
        "include/flashinfer/moved.cuh": ELSEWHERE,
        "flashinfer/jit/attention/modules.py": MODULES,
        "version.txt": "9.9.9\n",
        **(extra or {}),
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def exports(tmp_path):
    return {e.name: e for e in abi.report(tree(tmp_path / "fi"))}


def params(export, overload=0):
    return [(p.type, p.name, p.optional, p.default) for p in export.signatures[overload].params]


def test_every_export_is_found_and_only_real_ones(exports):
    assert set(exports) == {
        "rmsnorm",
        "workspace_size",
        "scale",
        "fp8_only",
        "run",
        "moved_away",
    }  # not the commented one
    assert exports["rmsnorm"].symbol == "__tvm_ffi_rmsnorm"
    line = BINDING.splitlines().index("TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm, rmsnorm);") + 1
    assert (exports["rmsnorm"].file, exports["rmsnorm"].line) == ("csrc/single_prefill_jit_binding.cu", line)


def test_macros_the_file_defines_are_expanded_and_defaults_kept(exports):
    assert params(exports["rmsnorm"]) == [
        ("TensorView", "out", False, None),
        ("TensorView", "input", False, None),
        ("TensorView", "weight", False, None),
        ("double", "eps", False, None),
        ("bool", "enable_pdl", False, "false"),
    ]
    assert exports["rmsnorm"].signatures[0].returns == "void"


def test_optional_slots_pointer_returns_and_address_of(exports):
    sig = exports["workspace_size"].signatures[0]
    assert sig.returns == "int64_t*" and exports["workspace_size"].binds == "workspace_size"
    assert params(exports["workspace_size"]) == [
        ("Optional<TensorView>", "maybe_hint", True, None),
        ("int64_t", "n", False, "8"),
    ]


def test_overloads_are_all_reported(exports):
    assert len(exports["scale"].signatures) == 2
    assert {len(s.params) for s in exports["scale"].signatures} == {2, 3}


def test_an_export_under_if_names_its_condition(exports):
    assert exports["fp8_only"].condition == "#ifdef FLASHINFER_ENABLE_FP8"
    assert exports["rmsnorm"].condition is None


def test_a_function_declared_elsewhere_is_found(exports):
    e = exports["moved_away"]
    assert e.file == "csrc/launcher.cu" and e.signatures[0].file == "include/flashinfer/moved.cuh"
    assert params(e) == [("TensorView", "a", False, None), ("int64_t", "b", False, None)]


def test_the_generated_attention_tail_per_backend(exports):
    run_ = exports["run"]
    assert run_.signatures[0].tail and [p[1] for p in params(run_)] == ["q", "maybe_lse", "window_left"]
    assert [(p.type, p.name, p.optional) for p in run_.tails["fa2"]] == [
        ("Optional<ffi::Tensor>", "maybe_custom_mask", True),
        ("Optional<ffi::Tensor>", "maybe_alibi_slopes", True),
        ("double", "logits_soft_cap", False),
        ("double", "sm_scale", False),
    ]


def test_the_sm90_binding_gets_the_fa3_tails(tmp_path):
    root = tree(
        tmp_path / "fi",
        extra={
            "csrc/single_prefill_sm90_jit_binding.cu": BINDING.replace(
                "single_prefill(", "single_prefill_sm90("
            ).replace("run, single_prefill)", "run, single_prefill_sm90)")
        },
    )
    sm90 = next(e for e in abi.report(root) if e.file == "csrc/single_prefill_sm90_jit_binding.cu" and e.name == "run")
    assert set(sm90.tails) == {"fa3 and no fp8", "fa3 and fp8"}
    assert [p.name for p in sm90.tails["fa3 and fp8"]] == ["scale_q", "sm_scale"] and not sm90.tails["fa3 and fp8"][
        0
    ].optional


def test_a_source_release_is_read_without_unpacking(tmp_path):
    root = tree(tmp_path / "fi")
    archive = tmp_path / "flashinfer_python-9.9.9.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname="flashinfer_python-9.9.9")
    assert {e.name for e in abi.report(archive)} == {e.name for e in abi.report(root)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fi", archive.name]


def test_cli_human_and_json(tmp_path):
    root = tree(tmp_path / "fi")
    done = run("abi.py", root, "--match", "rmsnorm")
    assert done.returncode == 0, done.stderr
    assert (
        "__tvm_ffi_rmsnorm  -> rmsnorm" in done.stdout
        and "bool enable_pdl = false" in done.stdout
        and "(FlashInfer 9.9.9)" in done.stdout
    )
    data = json.loads(run("abi.py", root, "--json").stdout)
    assert {e["symbol"] for e in data["exports"]} >= {"__tvm_ffi_run", "__tvm_ffi_fp8_only"}


# ---------------------------------------------------------------- --diff


def changed_tree(tmp_path):
    binding = (
        BINDING.replace(
            "TensorView weight, EPS_T eps, bool enable_pdl = false",
            "TensorView gamma, float eps, bool enable_pdl = true",
        )
        .replace(
            "Optional<TensorView> maybe_hint, int64_t n = 8", "int64_t n, Optional<TensorView> maybe_hint, int64_t m"
        )
        .replace("TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale, scale);\n", "TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale2, scale);\n")
    )
    modules = MODULES.replace(
        'additional_scalar_names = ["logits_soft_cap", "sm_scale"]',
        'additional_scalar_names = ["sm_scale", "logits_soft_cap"]',
    )
    return tree(tmp_path / "new", binding, {"flashinfer/jit/attention/modules.py": modules})


def test_diff_says_exactly_what_changed(tmp_path):
    old, new = abi.report(tree(tmp_path / "old")), abi.report(changed_tree(tmp_path))
    added, removed, changes = abi.diff(old, new)
    assert [e.name for e in added] == ["scale2"] and [e.name for e in removed] == ["scale"]
    said = {(c.key[1], c.what) for c in changes}
    assert ("rmsnorm", "parameter #2 renamed: weight -> gamma") in said
    assert ("rmsnorm", "parameter eps retyped: double -> float") in said
    assert ("rmsnorm", "parameter enable_pdl default: false -> true") in said
    assert ("workspace_size", "parameter maybe_hint moved: position 0 -> 1") in said
    assert ("workspace_size", "parameter n moved: position 1 -> 0") in said
    assert ("workspace_size", "parameter m (int64_t) inserted at position 2") in said
    assert ("workspace_size", "parameter n default: 8 -> None") in said
    assert ("run", "fa2 tail: parameter logits_soft_cap moved: position 2 -> 3") in said
    rms = next(c for c in changes if c.key[1] == "rmsnorm")
    declared = (
        BINDING.splitlines().index("void rmsnorm(NORM_ARGS, TensorView weight, EPS_T eps, bool enable_pdl = false);")
        + 1
    )
    assert rms.old_at == rms.new_at == f"csrc/single_prefill_jit_binding.cu:{declared}"
    assert not any(c.key[1] == "scale" for c in changes)  # the same overloads, whatever order they are found in


def test_cli_diff_exits_1_on_a_change_and_0_when_only_added(tmp_path):
    old, new = tree(tmp_path / "old"), changed_tree(tmp_path)
    done = run("abi.py", "--diff", old, new)
    assert (
        done.returncode == 1
        and "removed (1):" in done.stdout
        and "parameter eps retyped: double -> float" in done.stdout
    )
    grown = tree(
        tmp_path / "grown", BINDING + "void extra(TensorView t);\nTVM_FFI_DLL_EXPORT_TYPED_FUNC(extra, extra);\n"
    )
    done = run("abi.py", "--diff", old, grown, "--json")
    assert done.returncode == 0, done.stdout
    assert [e["name"] for e in json.loads(done.stdout)["functions"]["added"]] == ["extra"]


# ---------------------------------------------------------------- TVMFFITypeIndex

HEADER = """\
#ifdef __cplusplus
enum TVMFFITypeIndex : int32_t {
#else
typedef enum {
#endif
  kTVMFFIAny = -1,
  kTVMFFINone = 0,
  kTVMFFIInt = 1,
  kTVMFFIBool,
  kTVMFFIStaticObjectBegin = 64,
  kTVMFFIObject = kTVMFFIStaticObjectBegin,
  kTVMFFIStr = kTVMFFIStaticObjectBegin + 1,
#ifdef __cplusplus
};
#else
} TVMFFITypeIndex;
#endif
"""


def wheel(path, header):
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("tvm_ffi/include/tvm/ffi/c_api.h", header)
    return path


def test_type_indices_are_numbered_as_the_compiler_numbers_them(tmp_path):
    assert abi.type_indices(wheel(tmp_path / "a.whl", HEADER)) == {
        "kTVMFFIAny": -1,
        "kTVMFFINone": 0,
        "kTVMFFIInt": 1,
        "kTVMFFIBool": 2,
        "kTVMFFIStaticObjectBegin": 64,
        "kTVMFFIObject": 64,
        "kTVMFFIStr": 65,
    }


def test_type_index_diff_from_a_wheel_and_an_installed_folder(tmp_path):
    installed = tmp_path / "site" / "tvm_ffi" / "include" / "tvm" / "ffi"
    installed.mkdir(parents=True)
    (installed / "c_api.h").write_text(
        HEADER.replace("kTVMFFIBool,", "kTVMFFIBool,\n  kTVMFFIFloat,").replace("+ 1", "+ 2")
    )
    old = wheel(tmp_path / "apache_tvm_ffi-0.1.7-cp312-abi3-manylinux_2_28_x86_64.whl", HEADER)
    done = run("abi.py", "--tvm-ffi", old, tmp_path / "site" / "tvm_ffi")
    assert done.returncode == 1, done.stdout
    assert "kTVMFFIStr: 65 -> 66" in done.stdout and "kTVMFFIFloat = 3 added" in done.stdout
    same = run("abi.py", "--tvm-ffi", old, old)
    assert same.returncode == 0 and "(no change)" in same.stdout


SHIFTED = "typedef enum TVMFFITypeIndex {{\n  kTVMFFINone = 0,\n  kTVMFFIA = {},\n}} TVMFFITypeIndex;\n"


@pytest.mark.parametrize(
    "value, expected",
    [("1 << 4", 16), ("0x10 * 2", 32), ("(64 | 3) & ~1", 66), ("-7 / 2", -3), ("-7 % 2", -1), ("010 + 1U", 9)],
)
def test_an_enumerator_is_evaluated_as_c_does_it(tmp_path, value, expected):
    (tmp_path / "c_api.h").write_text(SHIFTED.format(value))
    assert abi.type_indices(tmp_path / "c_api.h") == {"kTVMFFINone": 0, "kTVMFFIA": expected}


@pytest.mark.parametrize(
    "value, problem",
    [
        ("(" * 300 + "1" + ")" * 300, "nests more than"),
        ("1 / 0", "divides by zero"),
        ("1 << 99", "shifts by 99"),
        ("sizeof(int)", "sizeof is no earlier enumerator"),
        ("__import__('os')", "is no earlier enumerator"),
    ],
    ids=["300 parentheses", "by zero", "a wide shift", "sizeof", "python"],
)
def test_an_enumerator_it_cannot_evaluate_is_refused_naming_the_header_and_the_enumerator(tmp_path, value, problem):
    header = tmp_path / "c_api.h"
    header.write_text(SHIFTED.format(value))
    done = run("abi.py", "--tvm-ffi", header, header)
    two_line_failure(done, problem)
    assert f"{header}'s TVMFFITypeIndex kTVMFFIA" in done.stderr, done.stderr


@pytest.mark.parametrize("kind", ["FIFO", "device"])
def test_a_fifo_or_a_device_given_for_a_header_is_said_for_what_it_is(tmp_path, kind):
    """Said for what it is, never read (a FIFO would wait for a writer)."""
    named = tmp_path / "fifo" if kind == "FIFO" else "/dev/zero"
    if kind == "FIFO":
        os.mkfifo(named)
    said = "a named pipe (FIFO)" if kind == "FIFO" else "a character device"
    two_line_failure(run("abi.py", "--tvm-ffi", named, named), f"{named} is {said}, not a regular file")


def test_a_fifo_where_an_installed_folder_keeps_its_header_is_said_not_read(tmp_path):
    header = tmp_path / "tvm_ffi" / "include" / "tvm" / "ffi"
    header.mkdir(parents=True)
    os.mkfifo(header / "c_api.h")
    two_line_failure(run("abi.py", "--tvm-ffi", tmp_path / "tvm_ffi", tmp_path / "tvm_ffi"), "is a named pipe (FIFO)")


@pytest.mark.parametrize(
    "args, problem",
    [
        (["/nonexistent/tree"], "does not exist"),
        (["--tvm-ffi", "/nonexistent.whl", "/nonexistent.whl"], "no c_api.h in /nonexistent.whl"),
    ],
)
def test_bad_sources_fail_in_two_lines(args, problem):
    two_line_failure(run("abi.py", *args), problem)


def test_a_folder_that_is_not_a_flashinfer_tree(tmp_path):
    two_line_failure(run("abi.py", tmp_path), "has no csrc/ sources")


BIG = abi.MAX_SOURCE_BYTES + 1  # one byte past what a source file may hold


def test_a_source_release_member_too_large_is_refused_before_it_is_read(tmp_path):
    """A small .tar.gz can unpack to a huge csrc/ file: refused from its header, never read into memory."""
    root = tree(tmp_path / "fi")
    with open(root / "csrc" / "big.cu", "wb") as f:
        f.truncate(BIG)
    archive = tmp_path / "flashinfer_python-9.9.9.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname="flashinfer_python-9.9.9")
    two_line_failure(
        run("abi.py", archive), f"its member flashinfer_python-9.9.9/csrc/big.cu holds more than {BIG >> 20} MiB"
    )


def test_a_tree_file_too_large_is_refused_in_two_lines(tmp_path):
    root = tree(tmp_path / "fi")
    with open(root / "include" / "flashinfer" / "big.cuh", "wb") as f:
        f.truncate(BIG)  # sparse: no disk taken
    two_line_failure(run("abi.py", root), f"{root / 'include/flashinfer/big.cuh'} holds more than {BIG >> 20} MiB")


def test_a_version_file_too_large_is_refused_in_two_lines(tmp_path):
    root = tree(tmp_path / "fi")
    with open(root / "version.txt", "wb") as f:
        f.truncate(BIG)
    two_line_failure(run("abi.py", root), f"{root / 'version.txt'} holds more than {BIG >> 20} MiB")


def test_sources_too_large_in_all_are_refused(tmp_path, monkeypatch):
    root = tree(tmp_path / "fi")
    monkeypatch.setattr(abi, "MAX_SOURCES_BYTES", 100)
    with pytest.raises(abi.Failure, match="sources hold more than"):
        abi.read_sources(root)


def test_a_tvm_ffi_header_too_large_is_refused_in_two_lines(tmp_path):
    with zipfile.ZipFile(tmp_path / "a.whl", "w", zipfile.ZIP_DEFLATED) as whl:
        whl.writestr("tvm_ffi/include/tvm/ffi/c_api.h", HEADER + " " * BIG)
    (tmp_path / "c_api.h").write_text(HEADER)
    with open(tmp_path / "c_api.h", "ab") as f:
        f.truncate(BIG)
    for big in (tmp_path / "a.whl", tmp_path / "c_api.h"):
        two_line_failure(run("abi.py", "--tvm-ffi", big, big), f"holds more than {BIG >> 20} MiB")


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda path: os.mkfifo(path), "is a named pipe (FIFO), not a regular file"),  # reading it would wait forever
        (lambda path: os.symlink(path.name, path), "cannot be reached (Too many levels of symbolic links)"),
        (lambda path: os.symlink("gone.cu", path), "is a symbolic link to gone.cu, which does not exist"),
    ],
    ids=["fifo", "symlink-loop", "dangling-link"],
)
def test_a_source_in_a_tree_that_is_no_regular_file_fails_in_two_lines_naming_it(tmp_path, make, what):
    root = tree(tmp_path / "fi")
    make(root / "csrc" / "odd.cu")
    two_line_failure(run("abi.py", root, timeout=30), f"{root / 'csrc' / 'odd.cu'} {what}")
    (root / "csrc" / "folder.cu").mkdir()  # a folder named like a source is only a folder
    (root / "csrc" / "odd.cu").unlink()
    assert run("abi.py", root).returncode == 0
