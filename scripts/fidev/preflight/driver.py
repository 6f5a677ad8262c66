"""The NVIDIA driver and its GPUs, read through NVML (nvidia-ml-py), else nvidia-smi.

pynvml is the one import outside the standard library in preflight's own modules: inside
driver_from_nvml, where any failure of it (not installed, no driver, a broken install) hands the
reading to nvidia-smi (tests/test_layout.py names it)."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass

from fidev.preflight.results import run


@dataclass
class Driver:
    version: str
    cuda: str  # the newest CUDA the driver supports
    gpus: list  # [(name, (major, minor))]
    via: str


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def driver_from_nvml() -> Driver:
    import pynvml  # nvidia-ml-py; a missing driver raises NVMLError at nvmlInit

    pynvml.nvmlInit()
    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(
                (_text(pynvml.nvmlDeviceGetName(handle)), tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle)))
            )
        return Driver(_text(pynvml.nvmlSystemGetDriverVersion()), f"{cuda // 1000}.{cuda % 1000 // 10}", gpus, "NVML")
    finally:
        pynvml.nvmlShutdown()


def driver_from_smi() -> Driver:
    smi = shutil.which("nvidia-smi")
    if not smi:
        raise RuntimeError("nvidia-smi is not on PATH")
    header = run([smi])
    query = run([smi, "--query-gpu=driver_version,name,compute_cap", "--format=csv,noheader"])
    for probe in (header, query):
        if probe is None:
            raise RuntimeError("nvidia-smi timed out")
        if probe.returncode != 0:
            raise RuntimeError("nvidia-smi failed: " + (probe.stdout + probe.stderr).strip()[:120])
    cuda = re.search(r"CUDA Version:\s*(\d+\.\d+)", header.stdout)
    rows = [[f.strip() for f in line.split(",")] for line in query.stdout.strip().splitlines()]
    if not cuda or not rows:
        raise RuntimeError("cannot read nvidia-smi's output")
    gpus = [(name, tuple(int(x) for x in cap.split("."))) for _, name, cap in rows]
    return Driver(rows[0][0], cuda.group(1), gpus, "nvidia-smi")


def read_driver():
    """(Driver, None) or (None, why)."""
    reasons = []
    for label, probe in (("NVML", driver_from_nvml), ("nvidia-smi", driver_from_smi)):
        try:
            return probe(), None
        except Exception as e:  # NVMLError, ImportError, RuntimeError: each says why
            reasons.append(f"{label}: {e}")
    return None, "; ".join(reasons)
