"""preflight.py against hosts built on purpose: a prefix laid out like a Pixi environment's (conda's
CUDA layout, tests/support/conda_prefix.py) with the manifest's activation applied, fake tools on PATH,
fake package metadata.

Each test runs the real script in a copy of the workspace, with `python -S` so that only the
fake prefix is visible, and asserts the status, the finding and the exit code.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import conda_prefix
from fidev.builds import smoke_modules
from fidev.core.manifest import ROOT, pins
from fidev.tree import source_tree

P = pins()


def write(path, text, mode=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    if mode:
        path.chmod(mode)
    return path


def tool(bindir, name, stdout):
    """A fake executable that prints stdout (shell builtins only: PATH holds just the fakes)."""
    quoted = stdout.replace("'", "'\\''")
    return write(bindir / name, f"#!/bin/sh\nprintf '%s\\n' '{quoted}'\n", mode=0o755)


class Host:
    """A healthy flashinfer-dev host; tests break one thing each."""

    def __init__(self, tmp):
        self.ws = tmp / "ws"
        shutil.copytree(ROOT / "scripts", self.ws / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "pyproject.toml", self.ws)
        self.src = self.ws / "extern/tracked/flashinfer"
        for sub in (
            "csrc/norm.cu",
            "include/flashinfer/norm.cuh",
            "3rdparty/cutlass/include/cutlass.h",
            "3rdparty/spdlog/include/spdlog.h",
        ):
            write(self.src / sub, "")
        write(self.src / source_tree.MARKER, source_tree.marker_text(P))
        self.link_editable_install()
        self.prefix = conda_prefix.build(tmp / "env")  # empty files where conda's CUDA 12 packages put them
        self.bin = self.prefix / "bin"
        self.site = tmp / "site"
        self.home = tmp / "home"
        self.home.mkdir()
        self.nvcc(P.cuda)
        tool(self.bin, "gcc", "x86_64-conda-linux-gnu-cc (conda-forge gcc 13.3.0-1) 13.3.0")
        tool(self.bin, "ninja", "1.12.1")
        self.ccache()
        self.nvml(driver="575.57.08", cuda=12090, gpus=[("NVIDIA H100 80GB HBM3", (9, 0))])
        self.dist("torch", f"2.8.0+{P.cuda_tag}", {"torch/version.py": f"cuda: Optional[str] = '{P.cuda}'\n"})
        self.dist(
            "flashinfer-python",
            P.flashinfer,
            {"direct_url.json": json.dumps({"url": self.src.as_uri(), "dir_info": {"editable": True}})},
        )
        self.dist("flashinfer-cubin", P.flashinfer)
        self.dist("flashinfer-jit-cache", P.jit_cache)
        self.dist("apache-tvm-ffi", "0.1.7")
        self.base = {"PATH": str(self.bin), "PYTHONPATH": str(self.site), "HOME": str(self.home)}
        self.env = conda_prefix.environment(self.prefix, self.base)  # CONDA_PREFIX and the manifest's activation

    def link_editable_install(self):
        """The flashinfer/data links FlashInfer's build backend makes for an editable install."""
        for name, target in source_tree.EDITABLE_LINKS.items():
            link = self.src / "flashinfer" / "data" / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(self.src / target, target_is_directory=True)

    def nvcc(self, release, bindir=None):
        return tool(bindir or self.bin, "nvcc", f"Cuda compilation tools, release {release}, V{release}.41")

    def ccache(self, version="4.14.2"):
        """ccache where conda's package puts it, answering what preflight asks (shell builtins only):
        its version, its config (CCACHE_DISABLE from the environment, as ccache reads it) and its counters."""
        write(
            self.bin / "ccache",
            f"""\
            #!/bin/sh
            case "$1" in
              --version) echo "ccache version {version}" ;;
              --show-config)
                echo "(default) cache_dir = $HOME/.cache/ccache"
                if [ -n "${{CCACHE_DISABLE+x}}" ]; then echo "(environment) disable = true"
                else echo "(default) disable = false"; fi
                echo "(default) remote_storage = " ;;
              --print-stats) printf 'cache_size_kibibyte\\t2097152\\nfiles_in_cache\\t1204\\n'
                printf 'max_cache_size_kibibyte\\t5242880\\n' ;;
              *) exit 1 ;;
            esac
            """,
            mode=0o755,
        )

    def without_route(self):
        """No FLASHINFER_NVCC, as outside the manifest's activation: FlashInfer runs $cuda_home/bin/nvcc,
        with cuda_home from CUDA_HOME, CUDA_PATH or the nvcc on PATH."""
        del self.env["FLASHINFER_NVCC"]

    def nvml(self, driver=None, cuda=None, gpus=(), error=None):
        body = f"""
            class NVMLError(Exception):
                pass
            def nvmlInit():
                if {error!r}:
                    raise NVMLError({error!r})
            def nvmlShutdown(): pass
            def nvmlSystemGetDriverVersion(): return {driver!r}
            def nvmlSystemGetCudaDriverVersion(): return {cuda!r}
            GPUS = {list(gpus)!r}
            def nvmlDeviceGetCount(): return len(GPUS)
            def nvmlDeviceGetHandleByIndex(i): return i
            def nvmlDeviceGetName(h): return GPUS[h][0]
            def nvmlDeviceGetCudaComputeCapability(h): return GPUS[h][1]
        """
        write(self.site / "pynvml.py", body)

    def dist(self, name, version, files=None):
        info = self.site / f"{name.replace('-', '_')}-{version}.dist-info"
        shutil.rmtree(info, ignore_errors=True)
        for old in self.site.glob(f"{name.replace('-', '_')}-*.dist-info"):
            shutil.rmtree(old)
        write(info / "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        for rel, text in (files or {}).items():
            write(info / rel if rel.endswith(".json") else self.site / rel, text)

    def run(self, *args):
        done = subprocess.run(
            [sys.executable, "-S", str(self.ws / "scripts/preflight.py"), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
        )
        return done

    def checks(self, *args):
        done = self.run("--json", *args)
        assert done.returncode in (0, 1), done.stderr
        report = json.loads(done.stdout)
        return done.returncode, {c["id"]: c for c in report["checks"]}


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path)


def test_healthy_host_passes(host):
    rc, checks = host.checks()
    assert rc == 0
    assert {i: c["status"] for i, c in checks.items() if c["status"] != "pass"} == {}
    assert "loads prebuilt where none of its inputs was edited" in checks["jit-cache"]["finding"]
    assert "every smoke kernel" in checks["gpu"]["finding"]


def test_the_prebuilt_mode_warns_that_edits_do_not_run(host):
    host.env["FLASHINFER_DEV_KERNEL_SOURCE"] = "prebuilt"
    rc, checks = host.checks()
    assert rc == 0 and checks["jit-cache"]["status"] == "warn"
    assert "extern/tracked/flashinfer, edited or not" in checks["jit-cache"]["finding"]
    assert "unset FLASHINFER_DEV_KERNEL_SOURCE" in checks["jit-cache"]["fix"]


def test_vendored_kernel_mode_hides_the_jit_cache(host):
    host.env["FLASHINFER_DEV_KERNEL_SOURCE"] = "vendored"
    rc, checks = host.checks()
    assert rc == 0 and checks["jit-cache"]["status"] == "pass"
    host.env["FLASHINFER_DEV_KERNEL_SOURCE"] = "jit"
    rc, checks = host.checks()
    assert rc == 1 and "not a kernel source mode" in checks["kernel-source"]["finding"]


def expect(host, check_id, status, *words, rc=1):
    code, checks = host.checks()
    c = checks[check_id]
    assert (code, c["status"]) == (rc, status), c
    for word in words:
        assert word in c["finding"] + " " + c["fix"], c
    return checks


def test_no_driver(host):
    host.nvml(error="Driver Not Loaded")  # and no nvidia-smi on PATH
    checks = expect(host, "driver", "fail", "no NVIDIA driver found", "Driver Not Loaded", "nvidia-smi", "575.51.03")
    assert checks["gpu"]["status"] == "fail"


def test_nvidia_smi_is_the_fallback_when_nvml_fails(host):
    host.nvml(error="Driver Not Loaded")
    write(
        host.bin / "nvidia-smi",
        """\
        #!/bin/sh
        case "$1" in
          --query-gpu=*) echo "580.159.04, NVIDIA H100 80GB HBM3, 9.0" ;;
          *) echo "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |" ;;
        esac
        """,
        mode=0o755,
    )
    checks = expect(host, "driver", "pass", "580.159.04", "CUDA 13.0", "nvidia-smi", rc=0)
    assert checks["gpu"]["status"] == "pass"


def test_driver_too_old_for_the_pin(host):
    host.nvml(driver="535.104.05", cuda=12020, gpus=[("NVIDIA A100", (8, 0))])
    expect(host, "driver", "fail", "535.104.05", "CUDA 12.2", P.cuda, "minor-version")


def test_gpu_without_sm90_warns_which_kernels_skip(host):
    host.nvml(driver="575.57.08", cuda=12090, gpus=[("NVIDIA A100", (8, 0))])
    sm90_only = [m.key for m in smoke_modules.MODULES if m.sm90]
    assert {"single_prefill_fa3", "gdn_prefill"} <= set(sm90_only)
    expect(host, "gpu", "warn", "sm_80", ", ".join(sm90_only), rc=0)


def test_gpu_too_old_for_flashinfer(host):
    host.nvml(driver="575.57.08", cuda=12090, gpus=[("Tesla V100", (7, 0))])
    expect(host, "gpu", "fail", "sm_70", "sm_75")


@pytest.mark.parametrize("release", ["12.8", "13.0"])
def test_nvcc_of_another_release(host, release):
    host.nvcc(release)
    expect(host, "nvcc", "fail", f"CUDA {release}", f"pins {P.cuda}", f"--cuda {release}")


def test_cuda_override_checks_another_target_without_weakening_the_default(host):
    host.nvcc("13.0")
    host.nvml(driver="580.159.04", cuda=13000, gpus=[("NVIDIA H100 80GB HBM3", (9, 0))])
    host.dist("torch", "2.11.0+cu130", {"torch/version.py": "cuda: Optional[str] = '13.0'\n"})
    host.dist("flashinfer-jit-cache", f"{P.flashinfer}+cu130")
    rc, checks = host.checks("--cuda", "13.0")
    assert rc == 0 and all(checks[i]["status"] == "pass" for i in ("driver", "nvcc", "torch", "host-compiler"))
    rc, checks = host.checks()
    assert rc == 1 and {i for i, c in checks.items() if c["status"] == "fail"} == {"nvcc", "torch", "jit-cache"}


def test_nvcc_from_outside_the_environment(host, tmp_path):
    outside = tmp_path / "usr-local-cuda" / "bin"
    host.nvcc(P.cuda, bindir=outside)
    (host.bin / "nvcc").unlink()
    host.without_route()
    del host.env["CUDA_HOME"]
    host.env["PATH"] = f"{outside}:{host.bin}"
    expect(host, "toolkit-origin", "fail", str(outside / "nvcc"), "outside the environment")


def test_cuda_home_disagreeing_with_path(host, tmp_path):
    other = tmp_path / "other-cuda"
    host.nvcc(P.cuda, bindir=other / "bin")
    host.without_route()
    host.env["CUDA_HOME"] = str(other)
    expect(host, "toolkit-origin", "fail", "CUDA_HOME compiles with", "PATH runs")


def test_missing_nvcc(host):
    (host.bin / "nvcc").unlink()
    expect(host, "nvcc", "fail", "nvcc not found", "pixi")


@pytest.mark.parametrize(
    "version_line, ok",
    [
        ("gcc (GCC) 15.1.0", False),
        ("clang version 20.1.0", False),
        ("clang version 18.1.8", True),
        ("gcc (Debian 12.2.0-14) 12.2.0", True),
    ],
)
def test_host_compiler_range(host, version_line, ok):
    tool(host.bin, "gcc", version_line)
    expect(host, "host-compiler", "pass" if ok else "fail", version_line.split()[0], rc=0 if ok else 1)


def test_host_compiler_named_by_nvcc_flags(host, tmp_path):
    tool(tmp_path / "cc", "g++-15", "g++-15 (GCC) 15.1.0")
    host.env["NVCC_PREPEND_FLAGS"] = f"-ccbin={tmp_path / 'cc' / 'g++-15'}"
    expect(host, "host-compiler", "fail", "g++-15", "accepts gcc 7 to 14")


def test_torch_built_for_another_cuda(host):
    host.dist("torch", "2.8.0+cu126", {"torch/version.py": "cuda: Optional[str] = '12.6'\n"})
    expect(host, "torch", "fail", "CUDA 12.6", f"not {P.cuda}")


def test_cpu_torch(host):
    host.dist("torch", "2.8.0+cpu", {"torch/version.py": "cuda: Optional[str] = None\n"})
    expect(host, "torch", "fail", "not a CUDA build")


def test_missing_source_folder(host):
    shutil.rmtree(host.src)
    expect(
        host,
        "flashinfer-source",
        "fail",
        "extern/tracked/flashinfer does not exist",
        "git submodule update --init --recursive",
    )


def test_empty_submodule(host):
    shutil.rmtree(host.src)
    host.src.mkdir()
    expect(host, "flashinfer-source", "fail", "is empty", "python3 scripts/fetch_flashinfer_source.py")


def test_partial_release_is_replaced_not_refetched_into_a_full_folder(host):
    shutil.rmtree(host.src / "3rdparty/cutlass/include")
    expect(
        host,
        "flashinfer-source",
        "fail",
        "partial release: no 3rdparty/cutlass/include",
        "fetch_flashinfer_source.py --replace",
    )


def test_tree_of_another_release(host):
    write(host.src / ".materialized-from-sdist", "flashinfer_python-0.6.2.tar.gz sha256=abc\n")
    expect(host, "flashinfer-source", "fail", "holds another release (flashinfer_python-0.6.2.tar.gz", "--replace")


def test_git_checkout_at_another_commit(host):
    if shutil.which("git") is None:
        pytest.skip("git is not installed on this host")
    (host.src / ".materialized-from-sdist").unlink()
    git = ["git", "-C", str(host.src), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "x"], check=True)
    host.env["PATH"] += ":" + os.path.dirname(shutil.which("git"))
    expect(host, "flashinfer-source", "fail", "the manifest pins d0886ce2b677", "git submodule update")


def test_flashinfer_installed_from_a_wheel(host):
    host.dist("flashinfer-python", P.flashinfer)
    expect(host, "flashinfer-install", "fail", "not an editable install")


EDITABLE = {"url": "file:///src", "dir_info": {"editable": True}}


@pytest.mark.parametrize(
    "text, said",
    [
        *[(json.dumps(v), f"it holds {json.dumps(v)}") for v in ([], [EDITABLE], "x", 7, 1.5, True, None)],
        (json.dumps({"dir_info": {"editable": True}}), "it holds {\"dir_info\""),  # no url
        (json.dumps({**EDITABLE, "url": 5}), '"url": 5'),
        (json.dumps({**EDITABLE, "url": None}), '"url": null'),
        (json.dumps({**EDITABLE, "dir_info": "editable"}), '"dir_info": "editable"'),
        (json.dumps({**EDITABLE, "dir_info": [True]}), '"dir_info": [true]'),
        (json.dumps({**EDITABLE, "dir_info": {"editable": "yes"}}), '"editable": "yes"'),
        (json.dumps({**EDITABLE, "dir_info": {"editable": 1}}), '"editable": 1'),
        ("{not json", "cannot be read as JSON"),
        ("", "cannot be read as JSON"),
    ],
)
def test_a_direct_url_json_of_another_shape_is_a_fail_naming_the_file(host, text, said):
    """pip's direct_url.json of another JSON type, or lacking its url, is the check's FAIL naming the file
    and what it holds, with the reinstall that writes it again: never "the check crashed"."""
    host.dist("flashinfer-python", P.flashinfer, {"direct_url.json": text})
    checks = expect(host, "flashinfer-install", "fail", said, "pixi reinstall -e flashinfer-dev flashinfer-python")
    finding = checks["flashinfer-install"]["finding"]
    assert finding.startswith(f"flashinfer-python's {host.site}/flashinfer_python-{P.flashinfer}.dist-info/"), finding
    assert "crashed" not in finding and ("not of the shape pip writes" in finding or "JSON" in said), finding


def test_flashinfer_editable_from_another_tree(host, tmp_path):
    host.dist(
        "flashinfer-python",
        P.flashinfer,
        {"direct_url.json": json.dumps({"url": (tmp_path / "elsewhere").as_uri(), "dir_info": {"editable": True}})},
    )
    expect(host, "flashinfer-install", "fail", "elsewhere")


def test_cubin_version_mismatch(host):
    host.dist("flashinfer-cubin", "0.6.2")
    expect(host, "cubin", "fail", "0.6.2", "refuses to run", f"flashinfer-cubin=={P.flashinfer}")


def test_jit_cache_version_mismatch(host):
    host.dist("flashinfer-jit-cache", f"0.6.2+{P.cuda_tag}")
    expect(host, "jit-cache", "fail", f"0.6.2+{P.cuda_tag}", "refuses to run")


def test_jit_cache_for_another_cuda(host):
    host.dist("flashinfer-jit-cache", f"{P.flashinfer}+cu128")
    expect(host, "jit-cache", "fail", "cu128", f"the toolkit is {P.cuda_tag}")


@pytest.mark.parametrize("version", ["0.1.8", "0.1.8.post0", "0.2.0", "0.1.5"])
def test_tvm_ffi_out_of_range(host, version):
    host.dist("apache-tvm-ffi", version)
    expect(host, "tvm-ffi", "fail", version, "outside")


def test_tvm_ffi_post_release_in_range(host):
    host.dist("apache-tvm-ffi", "0.1.9.post1")
    expect(host, "tvm-ffi", "pass", rc=0)


def test_missing_ninja(host):
    (host.bin / "ninja").unlink()
    expect(host, "ninja", "fail", "not on PATH")


LAYOUT_CHECKS = ("nvcc-profile", "cuda-headers", "cuda-libs", "host-cuda")
TARGET = "targets/x86_64-linux"


def test_conda_layout_with_the_manifests_activation_passes(host):
    rc, checks = host.checks()
    assert rc == 0 and all(checks[i]["status"] == "pass" for i in LAYOUT_CHECKS)
    assert f"{TARGET}/include" in checks["cuda-headers"]["finding"]
    assert f"{TARGET}/lib/libcudart.so" in checks["cuda-libs"]["finding"]
    assert f"{TARGET}/lib/stubs/libcuda.so" in checks["cuda-libs"]["finding"]


def test_cuda_home_alone_cannot_compile_or_link_in_the_conda_layout(host):
    host.env = conda_prefix.environment(host.prefix, host.base, cuda_home_only=True)
    rc, checks = host.checks()
    assert rc == 1
    headers, libs = checks["cuda-headers"], checks["cuda-libs"]
    assert headers["status"] == "fail" and "cuda_runtime.h (by g++)" in headers["finding"]
    assert "(by nvcc)" not in headers["finding"]  # nvcc finds them through its nvcc.profile
    assert "FLASHINFER_EXTRA_CFLAGS='-I$CONDA_PREFIX/targets/x86_64-linux/include'" in headers["fix"]
    assert (
        libs["status"] == "fail"
        and "libcudart.so (-lcudart)" in libs["finding"]
        and "libcuda.so (-lcuda)" in libs["finding"]
    )
    assert "FLASHINFER_EXTRA_LDFLAGS=" in libs["fix"]
    assert checks["nvcc-profile"]["status"] == "pass"


def test_nvcc_through_the_targets_symlink_finds_no_profile(host):
    host.env["CUDA_HOME"] = str(host.prefix / TARGET)
    expect(host, "nvcc-profile", "pass", str(host.bin / "nvcc.profile"), rc=0)  # the route names bin/nvcc itself
    host.without_route()
    checks = expect(
        host, "nvcc-profile", "fail", f"{TARGET}/bin/nvcc.profile is missing", "not at targets/x86_64-linux"
    )
    assert checks["cuda-libs"]["status"] == "pass"  # lib64 -> lib inside targets: only the profile is missing


def test_missing_header_in_an_activated_environment_says_to_install(host):
    (host.prefix / TARGET / "include/cublasLt.h").unlink()
    expect(
        host,
        "cuda-headers",
        "fail",
        "cublasLt.h (by g++)",
        "cublasLt.h (by nvcc)",
        "pixi install -e flashinfer-dev",
        "libcublas-dev",
    )


def test_host_toolkit_library_leaking_in_through_library_path(host, tmp_path):
    (host.prefix / TARGET / "lib/stubs/libcuda.so").unlink()
    host_stubs = write(tmp_path / "usr-local-cuda/lib64/stubs/libcuda.so", "").parent
    host.env["LIBRARY_PATH"] = str(host_stubs)  # what the GPU host's image exports
    checks = expect(
        host, "host-cuda", "fail", f"-lcuda links {host_stubs}/libcuda.so (LIBRARY_PATH)", "unset", "LIBRARY_PATH"
    )
    assert checks["cuda-libs"]["status"] == "pass"


def test_host_runtime_preloaded_by_flashinfer(host, tmp_path):
    host_lib = write(tmp_path / "usr-local-cuda/targets/x86_64-linux/lib/libcudart.so.12", "").parent
    host.env["CUDA_LIB_PATH"] = str(host_lib)
    expect(
        host,
        "host-cuda",
        "fail",
        f"FlashInfer preloads {host_lib}/libcudart.so.12",
        "CUDA_LIB_PATH='$CONDA_PREFIX/targets/x86_64-linux/lib'",
    )


def test_read_only_jit_cache_dir(host, read_only_dir):
    host.env["FLASHINFER_WORKSPACE_BASE"] = str(read_only_dir)
    expect(host, "jit-dir", "fail", "not writable", "FLASHINFER_WORKSPACE_BASE")


def test_a_workspace_base_that_does_not_exist_is_a_warning_and_is_not_created(host, tmp_path):
    host.env["FLASHINFER_WORKSPACE_BASE"] = str(tmp_path / "typo" / "base")
    expect(
        host,
        "jit-dir",
        "warn",
        "does not exist yet: FlashInfer creates it",
        "check its spelling; nothing was created",
        rc=0,
    )
    assert not (tmp_path / "typo").exists()


def test_human_output_has_a_line_per_check_and_a_summary(host):
    host.nvcc("13.0")
    done = host.run()
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"preflight: FlashInfer {P.flashinfer}, CUDA {P.cuda}")
    assert any(line.split()[:2] == ["FAIL", "nvcc"] for line in lines)
    assert any("fix:" in line and "--cuda 13.0" in line for line in lines)
    said = [line.split()[0] for line in lines[1:-1] if line.split()[:1] in (["PASS"], ["WARN"], ["FAIL"])]
    assert said.count("FAIL") == 1 and said.count("WARN") == 0  # the one fault planted: nvcc
    assert lines[-1].startswith(f"preflight: {said.count('PASS')} passed, 0 warnings, 1 failed")


@pytest.mark.parametrize("args", [["--cuda", "13"], ["--bogus"]])
def test_bad_usage_exits_2(host, args):
    assert host.run(*args).returncode == 2


def test_a_checkout_with_commits_on_top_of_the_pin_is_a_warning(host):
    """A contributor's own commits on the pinned one: preflight warns (the kernel source mode auto
    compiles what they reach) where a checkout at an unrelated commit fails."""
    git_path = shutil.which("git")
    if git_path is None:
        pytest.skip("git is not installed on this host")
    (host.bin / "git").symlink_to(git_path)  # PATH holds just the fakes, and the checkout's git
    tree = host.src
    (tree / source_tree.MARKER).unlink()  # a git checkout, not the source release
    git = ["git", "-C", str(tree), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "the pinned release"], check=True)
    pinned = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "a contributor's commit"], check=True)
    manifest = host.ws / "pyproject.toml"
    pinned_manifest = manifest.read_text().replace(P.source_commit, pinned)
    manifest.write_text(pinned_manifest)
    source = host.checks()[1]["flashinfer-source"]
    assert source["status"] == "warn" and "your commits on top of the pinned" in source["finding"], source
    manifest.write_text(pinned_manifest.replace(pinned, "1" * 40))
    assert host.checks()[1]["flashinfer-source"]["status"] == "fail"


def test_the_compile_cache_line_says_where_how_large_and_whether_on(host):
    cache = expect(host, "compile-cache", "pass", "on, a hit only for the same source", rc=0)["compile-cache"]
    assert f"ccache 4.14.2, {host.home}/.cache/ccache: 2.0 GiB in 1204 files of 5.0 GiB" in cache["finding"]
    host.env["CCACHE_DISABLE"] = "1"  # the off switch, ccache's own
    expect(host, "compile-cache", "pass", "off (CCACHE_DISABLE is set): every compile runs nvcc", "2.0 GiB", rc=0)


def test_a_route_without_ccache_warns_and_nvcc_is_still_found(host):
    host.env["FLASHINFER_NVCC"] = str(host.bin / "nvcc")
    checks = expect(host, "compile-cache", "warn", "not in use", "depend_mode=true sloppiness=", rc=0)
    assert checks["nvcc"]["status"] == "pass"


def test_a_route_that_could_hide_an_edit_fails(host):
    host.env["FLASHINFER_NVCC"] = f"{host.bin}/ccache {host.bin}/nvcc"  # ccache's preprocessor mode over nvcc -E
    expect(host, "compile-cache", "fail", "without depend_mode=true sloppiness=", "a hit could hide an edit")


def test_a_ccache_too_old_or_missing_fails(host):
    host.ccache(version="4.12.2")
    expect(host, "compile-cache", "fail", "ccache 4.12.2", "outside the manifest's >=4.12.3", "pixi install")
    (host.bin / "ccache").unlink()
    expect(host, "compile-cache", "fail", "did not run", "pixi install -e flashinfer-dev")


PREFLIGHT_TASK = 'preflight = { cmd = "python scripts/preflight.py",'
BUILD_TASK = 'build = { cmd = "python scripts/build.py", depends-on = ["preflight"],'


@pytest.mark.parametrize(
    "task, depends_on, words",
    [
        (
            PREFLIGHT_TASK,
            '["smoke"]',
            ["go round in a cycle (preflight -> smoke -> build -> preflight)", "make the chain"],
        ),
        (PREFLIGHT_TASK, "5", ["preflight is not a command, or a table of a cmd and its depends-on", "restore it"]),
        # a cycle through a second entry, and through pixi's table form of an entry
        (BUILD_TASK, '["preflight", "smoke"]', ["go round in a cycle (build -> smoke -> build)", "make the chain end"]),
        (PREFLIGHT_TASK, '[{ task = "smoke" }]', ["go round in a cycle (preflight -> smoke -> build -> preflight)"]),
        (PREFLIGHT_TASK, '{ task = "build" }', ["go round in a cycle (preflight -> build -> preflight)"]),
        (PREFLIGHT_TASK, '[""]', ["preflight depends on '', which names no task", "remove the entry"]),
        (BUILD_TASK, '["preflight", "a b"]', ["build depends on 'a b', which names no task", "remove the entry"]),
    ],
)
def test_a_manifest_whose_tasks_chain_goes_round_fails_and_the_rest_still_run(host, task, depends_on, words):
    """pixi refuses a depends-on cycle, as bench_chain and the acceptance run do (manifest.task_chain), through
    any entry of a depends-on, each a task's name or pixi's table naming one, and a name pixi takes for none:
    preflight says it as the manifest-tasks check's FAIL, naming the cycle, and runs every other check."""
    manifest = host.ws / "pyproject.toml"
    text = manifest.read_text()
    assert task in text
    edited = task.replace('depends-on = ["preflight"],', "") if task == BUILD_TASK else task
    manifest.write_text(text.replace(task, f"{edited} depends-on = {depends_on},"))
    checks = expect(host, "manifest-tasks", "fail", *words)
    assert {i: c["status"] for i, c in checks.items() if c["status"] != "pass"} == {"manifest-tasks": "fail"}


@pytest.mark.parametrize(
    "name, said",
    [
        ("a\\nb\\u0000", "a\\nb\\x00 depends on 'a\\nb\\x00', which names no task"),  # a line break: no name of pixi's
        ("a\\u0000b\\u001b", "cycle (a\\x00b\\x1b -> a\\x00b\\x1b)"),
    ],
)
def test_a_task_named_with_control_characters_is_shown_escaped_on_preflights_one_line(host, name, said):
    """A task whose name holds a line break, NUL or an escape, depending on itself: the FAIL line names it
    escaped (`\\n`, `\\x00`), and its finding and fix stay one line each, with no raw control character."""
    manifest = host.ws / "pyproject.toml"
    text = manifest.read_text()
    task = 'preflight = { cmd = "python scripts/preflight.py",'
    assert task in text
    manifest.write_text(text.replace(task, f'"{name}" = {{ cmd = "x", depends-on = ["{name}"] }}\n{task}'))
    done = host.run()
    out = done.stdout.splitlines()
    assert done.returncode == 1 and not any(c in done.stdout for c in "\0\x1b"), done.stdout
    at = next(i for i, line in enumerate(out) if "manifest-tasks" in line)
    assert "FAIL" in out[at] and said in out[at], done.stdout
    assert out[at + 1].lstrip().startswith("fix: "), done.stdout
    assert out[at + 2].startswith(("preflight: ", "  PASS", "  WARN", "  FAIL")), done.stdout  # the fix's one line


def test_a_manifest_without_a_task_of_the_first_chain_fails_and_the_rest_still_run(host):
    """The smoke task deleted from the manifest: `pixi run -e flashinfer-dev smoke` has nothing to run, so
    preflight's manifest-tasks check fails naming it and the chain, and every other check still runs."""
    manifest = host.ws / "pyproject.toml"
    lines = manifest.read_text().splitlines(keepends=True)
    manifest.write_text("".join(line for line in lines if not line.startswith("smoke = { cmd")))
    checks = expect(
        host, "manifest-tasks", "fail", "no task smoke, of the chain preflight -> build -> import-check -> smoke"
    )
    assert {i: c["status"] for i, c in checks.items() if c["status"] != "pass"} == {"manifest-tasks": "fail"}


def test_a_max_jobs_that_flashinfer_takes_for_digits_and_cannot_read_fails(host):
    """MAX_JOBS='²': FlashInfer's `_get_num_workers` takes it (str.isdigit) and int() raises in every JIT build,
    so the ninja check fails naming it; one FlashInfer ignores (no digits) passes."""
    host.env["MAX_JOBS"] = "²"
    expect(host, "ninja", "fail", "MAX_JOBS='²' passes FlashInfer's digit test but is no number")
    host.env["MAX_JOBS"] = "abc"
    expect(host, "ninja", "pass", rc=0)
