"""What a FlashInfer module's ELF dynamic section says: the TVM-FFI functions it exports and the
libraries it needs. Read with pyelftools, so that no `nm`/`readelf` output format is parsed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

from fidev.core.failure import Failure

TVM_FFI_PREFIX = "__tvm_ffi_"


@dataclass(frozen=True)
class DynamicInfo:
    machine: str  # e.g. "EM_X86_64"
    exports: tuple[str, ...]  # defined, visible `__tvm_ffi_*` functions, sorted
    needed: tuple[str, ...]  # DT_NEEDED, in link order


def _elftools():
    try:
        from elftools.common.exceptions import ELFError
        from elftools.elf.dynamic import DynamicSection
        from elftools.elf.elffile import ELFFile
    except ModuleNotFoundError as e:
        raise Failure(
            "pyelftools is not installed in this interpreter",
            "run it in the environment: `pixi run -e flashinfer-dev artifacts` (pyelftools is a "
            "flashinfer-dev dependency)",
        ) from e
    return ELFFile, DynamicSection, ELFError


def read_dynamic(stream: BinaryIO, name: str) -> DynamicInfo:
    """`stream` must be seekable; `name` is only for messages."""
    ELFFile, DynamicSection, ELFError = _elftools()
    try:
        elf = ELFFile(stream)
        exports, needed = set(), []
        for section in elf.iter_sections():
            if not isinstance(section, DynamicSection):
                continue
            needed += [tag.needed for tag in section.iter_tags("DT_NEEDED")]
        dynsym = elf.get_section_by_name(".dynsym")
        for symbol in dynsym.iter_symbols() if dynsym is not None else ():
            if (
                symbol.name.startswith(TVM_FFI_PREFIX)
                and symbol["st_shndx"] != "SHN_UNDEF"  # an import, not an export
                and symbol["st_info"]["type"] == "STT_FUNC"
                and symbol["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK")
                and symbol["st_other"]["visibility"] in ("STV_DEFAULT", "STV_PROTECTED")
            ):
                exports.add(symbol.name)
        return DynamicInfo(elf["e_machine"], tuple(sorted(exports)), tuple(needed))
    except ELFError as e:
        raise Failure(
            f"{name} is not a readable ELF shared object: {e}",
            "point it at a FlashInfer module (`<uri>/<uri>.so`), a flashinfer-jit-cache wheel, or a folder of them",
        ) from e
