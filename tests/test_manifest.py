"""One test per design decision of the Pixi manifest, asserted on the parsed pyproject.toml."""

import re
import subprocess

import pytest

from fidev.manifest import FEATURE, MANIFEST, ROOT, load_manifest, pins

M = load_manifest()
PIXI = M["tool"]["pixi"]
FEAT = PIXI["feature"][FEATURE]
P = pins()
NVIDIA_PACKAGES = ("cuda-nvcc", "cuda-toolkit")


def test_flashinfer_dev_is_its_own_environment():
    env = PIXI["environments"][FEATURE]
    assert env["features"] == [FEATURE]
    assert env.get("no-default-feature") is True
    # No solve-group shared with the frozen environments: editing flashinfer-dev cannot move them.
    others = {PIXI["environments"][e].get("solve-group") for e in ("default", "codex-build")}
    assert "solve-group" not in env or env["solve-group"] not in others


def test_cuda_requirement_stays_inside_the_feature():
    # A rich CUDA entry on workspace.platforms would add a CUDA solve to every environment.
    assert all(isinstance(p, str) for p in PIXI["workspace"]["platforms"])
    assert "system-requirements" not in PIXI
    assert "nvidia" not in str(PIXI["workspace"]["channels"])
    for name, feat in PIXI["feature"].items():
        if name != FEATURE:
            assert "system-requirements" not in feat and "cuda-version" not in feat.get("dependencies", {})
    assert "cuda-version" not in PIXI["dependencies"]


def test_cuda_pin_is_12_9_everywhere_it_appears():
    assert P.cuda == "12.9"
    assert str(FEAT["system-requirements"]["cuda"]) == P.cuda
    for pkg in NVIDIA_PACKAGES:
        assert FEAT["dependencies"][pkg]["version"] == f"{P.cuda}.*"
    pypi = FEAT["pypi-dependencies"]
    assert pypi["torch"]["index"].rstrip("/").endswith("/" + P.cuda_tag)
    assert pypi["flashinfer-jit-cache"]["index"].rstrip("/").endswith("/" + P.cuda_tag)


def test_nvidia_channel_ahead_of_conda_forge():
    channels = FEAT["channels"]
    nvidia = [c for c in channels if isinstance(c, dict) and c["channel"] == "nvidia"]
    assert nvidia and nvidia[0]["priority"] > 0  # workspace channels have priority 0
    assert PIXI["workspace"].get("channel-priority", "strict") == "strict"
    for pkg in NVIDIA_PACKAGES:
        assert FEAT["dependencies"][pkg]["channel"] == "nvidia"


def test_flashinfer_is_the_vendored_source_installed_editable():
    spec = FEAT["pypi-dependencies"]["flashinfer-python"]
    assert spec == {"path": "extern/tracked/flashinfer", "editable": True}
    assert ROOT / spec["path"] == P.source_dir


def test_vendored_source_is_a_submodule_gitlink_at_the_pinned_commit():
    gitmodules = (ROOT / ".gitmodules").read_text()
    assert "path = extern/tracked/flashinfer" in gitmodules
    assert "url = https://github.com/flashinfer-ai/flashinfer.git" in gitmodules
    staged = subprocess.run(["git", "ls-files", "-s", "extern/tracked/flashinfer"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    assert staged[:2] == ["160000", P.source_commit]  # a gitlink: FlashInfer's files are never committed


def test_artifacts_are_locked_to_the_source_release():
    pypi = FEAT["pypi-dependencies"]
    assert P.flashinfer == "0.6.3"
    assert pypi["flashinfer-cubin"] == f"=={P.flashinfer}"
    assert P.jit_cache == f"{P.flashinfer}+{P.cuda_tag}"
    assert re.fullmatch(r"[0-9a-f]{64}", P.sdist_sha256)


def test_tvm_ffi_range_is_flashinfers():
    assert set(P.tvm_ffi_range.replace(" ", "").split(",")) == {
        ">=0.1.6", "<0.2", "!=0.1.8", "!=0.1.8.post0"}


def test_flashinfer_dev_has_pytest():
    assert "pytest" in FEAT["pypi-dependencies"] or "pytest" in FEAT["dependencies"]


# What default and codex-build resolve from. Changing any of this changes them: a
# flashinfer-dev change must leave it as it is.
FROZEN = {
    "workspace": {"channels": ["conda-forge"], "platforms": ["linux-64"]},
    "default": {"python": "3.12.*", "pip": "*", "pytest": ">=8", "ruff": "*"},
    "codex-build": {"c-compiler": "*", "cxx-compiler": "*", "cmake": ">=3.28", "ninja": "*",
                    "pkg-config": "*", "rust": ">=1.80"},
    "environments": {"default": {"solve-group": "default"},
                     "codex-build": {"features": ["codex-build"], "solve-group": "default"}},
}


def test_default_and_codex_build_are_frozen():
    assert PIXI["workspace"] == FROZEN["workspace"]
    assert PIXI["dependencies"] == FROZEN["default"]
    for table in ("pypi-dependencies", "system-requirements", "activation", "constraints"):
        assert table not in PIXI
    assert PIXI["feature"]["codex-build"] == {"dependencies": FROZEN["codex-build"]}
    for env in ("default", "codex-build"):
        assert PIXI["environments"][env] == FROZEN["environments"][env]
    assert "dependencies" not in M["project"]  # [project] deps would join the default feature


def _all_tasks():
    yield from PIXI.get("tasks", {}).items()
    for feat in PIXI["feature"].values():
        yield from feat.get("tasks", {}).items()


def _commands(task):
    if isinstance(task, str):
        return [task]
    cmd = task.get("cmd", [])
    return [cmd] if isinstance(cmd, str) else cmd


PIP_INSTALL = re.compile(r"\bpip3?\s+install\b|\bpip\.main\(|\bensurepip\b")


def _doc_code_blocks(text):
    return re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)


def test_no_direct_pip_install_in_the_workflow():
    offenders = [f"task {n}" for n, t in _all_tasks() for c in _commands(t) if PIP_INSTALL.search(c)]
    for path in sorted((ROOT / "scripts").rglob("*.py")):
        if PIP_INSTALL.search(path.read_text()):
            offenders.append(str(path.relative_to(ROOT)))
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if any(PIP_INSTALL.search(block) for block in _doc_code_blocks(path.read_text())):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"pip install bypasses the manifest and pixi.lock: {offenders}"


def test_pip_install_scanner_catches_what_it_should():
    assert PIP_INSTALL.search("python -m pip install -e .")
    assert _doc_code_blocks("x\n```bash\npip install torch\n```\n") == ["pip install torch\n"]
    assert not PIP_INSTALL.search("python -m pip download --no-deps x")


@pytest.mark.parametrize("bad", ["==0.6.*", ">=0.6.3", "0.6.3"])
def test_pins_must_be_exact(tmp_path, bad):
    text = MANIFEST.read_text().replace('flashinfer-cubin = "==0.6.3"', f'flashinfer-cubin = "{bad}"')
    (tmp_path / "pyproject.toml").write_text(text)
    with pytest.raises(ValueError, match="pinned exactly"):
        pins.__wrapped__(tmp_path / "pyproject.toml")


def chain(tasks, last):
    steps, name = [], last
    while name:
        steps.append(name)
        deps = tasks[name].get("depends-on", [])
        assert len(deps) <= 1
        name = deps[0] if deps else None
    return steps[::-1]


def test_smoke_and_abi_smoke_run_their_chains():
    tasks = FEAT["tasks"]
    assert chain(tasks, "smoke") == ["preflight", "build", "import-check", "smoke"]
    assert chain(tasks, "abi-smoke") == ["preflight", "build-abi", "abi-smoke"]
    assert tasks["build-abi"]["cmd"] == tasks["build"]["cmd"] + " --abi"


def test_every_flashinfer_dev_task_is_a_plain_script():
    for name, task in FEAT["tasks"].items():
        cmd = task["cmd"]
        assert re.fullmatch(r"python scripts/\w+\.py( --[a-z-]+)*", cmd), f"{name}: {cmd}"  # runs without pixi too
        assert (ROOT / cmd.split()[1]).is_file(), name


def test_artifacts_tooling_is_in_flashinfer_dev():
    assert "pyelftools" in FEAT["dependencies"]
    assert {"artifacts", "module-uri", "prefetch", "abi-smoke"} <= set(FEAT["tasks"])
