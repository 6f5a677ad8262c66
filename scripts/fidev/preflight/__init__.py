"""preflight's checks of every GPU, driver, toolchain and package precondition, before any compile.

Standard library only, at import and at run time alike (it diagnoses a half-installed environment):
no torch or flashinfer import, no network, no CUDA context, a timeout on every subprocess. The one
import of this part outside it is the NVML probe's pynvml, whose every failure hands the reading to
nvidia-smi (tests/test_layout.py holds both rules). Modules, in import order:

  results   what a check answers (PASS, WARN, FAIL), the subprocess and package-metadata probes
  driver    the driver and its GPUs, through NVML, else nvidia-smi
  context   what the checks share, each read once
  gpu, toolkit, packages, host   the checks, by what they look at
  checks    the checks in their order, each behind one crash guard, and their count
"""
