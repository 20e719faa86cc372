"""What this CPU does natively, in one place: every capability-dependent choice (the "auto" dtype, bf16 weight
repacking for oneDNN, the int8 draft rule, the AVX2 kernels for native ggml weights, tests that need a feature)
asks ``cpu_capability()``.

Features (after the limits below):

- ``avx2``; ``avx512``: AVX-512 F+BW+VL+DQ (oneDNN's ``avx512_core``); ``avx512_bf16``; ``avx512_vnni``;
  ``amx``: AMX tiles with bf16; ``avx_ne_convert``: AVX2 bf16 conversions (AVX-NE-CONVERT).
- ``onednn_bf16``: oneDNN runs bf16 (torch's bf16 matmul on CPU and ``mkldnn::_reorder_linear_weight``, which
  refuses otherwise with "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"):
  ``avx512`` or ``avx_ne_convert``, and oneDNN itself agrees (``ONEDNN_MAX_CPU_ISA`` can lower it).
- ``native_bf16``: bf16 dot products in hardware (``avx512_bf16`` or ``amx``) on oneDNN's bf16 path; without it
  bf16 matmuls are emulated by converting to fp32, so dtype "auto" picks fp32 there.
- ``native_kernels``: not a CPU feature but this install's: the extension was built with the native GGUF block
  kernels and ggml's CPU library (``libggml-python``) is installed (``native_kernels_available()``). Without it a
  GGUF model loads dequantized, so the line says so.

The hardware is read from torch's cpuinfo (``torch._C._cpu._get_cpu_capability()``), or ``/proc/cpuinfo`` flags
where torch lacks it. Three limits can only take features away, never add one:

- ``SPECSWAP_CPU_CAPS``: a comma-separated list, either all removals (``-avx512,-bf16``: drop these) or all
  names to keep at most (``avx2``: nothing above AVX2; ``none``: no vector feature at all). Names:
  ``avx2 avx512 avx512_bf16 avx512_vnni amx avx_ne_convert`` and ``bf16`` (``avx512_bf16 amx avx_ne_convert``).
  Removing a feature removes what builds on it (``-avx512`` also drops ``avx512_bf16 avx512_vnni amx``);
  keeping one keeps what it builds on (``avx512_bf16`` keeps ``avx512`` and ``avx2``).
- ``ATEN_CPU_CAPABILITY`` (torch's kernel level, ``torch.backends.cpu.get_cpu_capability()``): ``avx2`` drops
  AVX-512 features, ``default`` every vector feature.
- ``ONEDNN_MAX_CPU_ISA`` (through oneDNN's own bf16 answer): can turn ``onednn_bf16`` and ``native_bf16`` off.

CI runs the capability-dependent tests a second time with all three set to "AVX2, no native bf16", so the
libraries really refuse what a missing guard would ask of them (tools/test.sh).
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["CpuCapability", "cpu_capability", "capability_from", "parse_override", "hardware_features",
           "native_kernels_available", "native_kernels_problem", "FEATURES", "OVERRIDE_NAMES", "OVERRIDE_ENV"]

OVERRIDE_ENV = "SPECSWAP_CPU_CAPS"
FEATURES = ("avx2", "avx512", "avx512_bf16", "avx512_vnni", "amx", "avx_ne_convert")
# feature -> the feature it builds on (removing the latter removes the former)
REQUIRES = {"avx512": "avx2", "avx_ne_convert": "avx2", "avx512_bf16": "avx512", "avx512_vnni": "avx512",
            "amx": "avx512"}
GROUPS = {"bf16": ("avx512_bf16", "amx", "avx_ne_convert")}
OVERRIDE_NAMES = (*FEATURES, *GROUPS)


@dataclass(frozen=True)
class CpuCapability:
    """What the CPU does natively, after the limits (module docstring)."""

    model: str
    avx2: bool
    avx512: bool           # F + BW + VL + DQ
    avx512_bf16: bool
    avx512_vnni: bool
    amx: bool              # tiles + bf16
    avx_ne_convert: bool
    onednn_bf16: bool      # oneDNN runs bf16: bf16 matmul, bf16 weight repacking
    native_bf16: bool      # bf16 dot products in hardware: "auto" picks bf16 on CPU
    torch_kernels: str     # torch's kernel level (ATEN_CPU_CAPABILITY lowers it)
    override: str          # SPECSWAP_CPU_CAPS as given, "" when unset
    removed: tuple[str, ...]  # features the hardware has that the limits took away
    native_kernels: bool = True  # this install runs GGUF blocks natively (native_kernels_available())

    def describe(self) -> str:
        """One line: ``cpu: AMD EPYC; avx2 avx512 avx512_bf16 vnni; amx no; native bf16 yes; onednn bf16 yes;
        torch kernels AVX512; native kernels yes``, plus ``; override: -avx512 (removed avx512 avx512_bf16 vnni)``
        under SPECSWAP_CPU_CAPS, or ``; limited (removed ...)`` when only torch's limits took something."""
        short = {"avx512_vnni": "vnni"}
        present = [short.get(name, name) for name in FEATURES if name != "amx" and getattr(self, name)]
        line = (f"cpu: {self.model}; {' '.join(present) or 'no avx2'}; amx {_yes(self.amx)}; "
                f"native bf16 {_yes(self.native_bf16)}; onednn bf16 {_yes(self.onednn_bf16)}; "
                f"torch kernels {self.torch_kernels}; native kernels {_yes(self.native_kernels)}")
        taken = ' '.join(short.get(name, name) for name in self.removed) or "nothing"
        if self.override:
            line += f"; override: {self.override} (removed {taken})"
        elif self.removed:
            line += f"; limited (removed {taken})"
        return line

    def as_dict(self) -> dict:
        """Every field plus ``describe()`` (what benchmark JSON records)."""
        record = asdict(self)
        record["removed"] = list(self.removed)
        record["line"] = self.describe()
        return record


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def parse_override(text: str | None) -> tuple[str, frozenset[str]]:
    """``SPECSWAP_CPU_CAPS`` -> ("remove" | "keep" | "none", feature names); ValueError names a bad term and
    lists what is valid."""
    terms = [term.strip() for term in (text or "").split(",") if term.strip()]
    if not terms:
        return "none", frozenset()
    if terms == ["none"]:
        return "keep", frozenset()
    valid = f"valid names: {', '.join(OVERRIDE_NAMES)} (each as NAME to keep at most, -NAME to remove), or none"
    removals = [term.startswith("-") for term in terms]
    if any(removals) and not all(removals):
        raise ValueError(f"{OVERRIDE_ENV}={text!r} mixes removals (-NAME) and names to keep; use one kind. {valid}")
    names = set()
    for term in terms:
        name = term[1:].strip() if term.startswith("-") else term
        if name not in OVERRIDE_NAMES:
            raise ValueError(f"{OVERRIDE_ENV}={text!r}: unknown capability {name!r}; {valid}")
        names.update(GROUPS.get(name, (name,)))
    return ("remove" if all(removals) else "keep"), frozenset(names)


def _dependents(name: str) -> set[str]:
    found = {name}
    for feature, base in REQUIRES.items():
        if base == name:
            found |= _dependents(feature)
    return found


def _prerequisites(name: str) -> set[str]:
    found = {name}
    while name in REQUIRES:
        name = REQUIRES[name]
        found.add(name)
    return found


def capability_from(hardware: dict[str, bool], override: str | None = None, *, model: str = "unknown",
                    torch_kernels: str = "AVX512", onednn_agrees: bool = True,
                    native_kernels: bool = True) -> CpuCapability:
    """The capability of a CPU with ``hardware`` features (FEATURES -> bool) under the limits: ``override``
    (``SPECSWAP_CPU_CAPS`` syntax), torch's kernel level and oneDNN's own bf16 answer; ``native_kernels`` as this
    install has them. Pure: tests use it."""
    unknown = set(hardware) - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown hardware features {sorted(unknown)}; valid: {', '.join(FEATURES)}")
    kind, names = parse_override(override)
    allowed = set(FEATURES)
    if kind == "remove":
        for name in names:
            allowed -= _dependents(name)
    elif kind == "keep":
        allowed = set().union(*(_prerequisites(name) for name in names)) if names else set()
    level = torch_kernels.upper()
    if level == "AVX2":
        allowed -= _dependents("avx512")
    elif level == "DEFAULT":
        allowed -= _dependents("avx2")
    features = {name: bool(hardware.get(name)) and name in allowed for name in FEATURES}
    for name in FEATURES:  # a feature counts only on what it builds on (REQUIRES is ordered base first)
        if name in REQUIRES and not features[REQUIRES[name]]:
            features[name] = False
    onednn_bf16 = (features["avx512"] or features["avx_ne_convert"]) and onednn_agrees
    native_bf16 = (features["avx512_bf16"] or features["amx"]) and onednn_bf16
    removed = tuple(name for name in FEATURES if hardware.get(name) and not features[name])
    return CpuCapability(model=model, **features, onednn_bf16=onednn_bf16, native_bf16=native_bf16,
                         torch_kernels=level, override=(override or "").strip(), removed=removed,
                         native_kernels=native_kernels)


def _cpuinfo_text() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _model_name(cpuinfo: str, fallback: str) -> str:
    for line in cpuinfo.splitlines():
        if line.startswith("model name") and ":" in line:
            return line.split(":", 1)[1].strip()
    return fallback or platform.processor() or platform.machine() or "unknown"


def hardware_features() -> tuple[dict[str, bool], str]:
    """(FEATURES -> bool, model name) as the hardware reports them, before any limit."""
    cpuinfo = _cpuinfo_text()
    import torch

    probe = getattr(getattr(torch._C, "_cpu", None), "_get_cpu_capability", None)
    if probe is not None:  # torch's cpuinfo: cpuid, the same source torch's own dispatch uses
        info = probe()
        features = {
            "avx2": info.get("avx2", False),
            "avx512": all(info.get(f"avx512_{x}", False) for x in ("f", "bw", "vl", "dq")),
            "avx512_bf16": info.get("avx512_bf16", False),
            "avx512_vnni": info.get("avx512_vnni", False),
            "amx": info.get("amx_tile", False) and info.get("amx_bf16", False),
            "avx_ne_convert": info.get("avx_ne_convert", False),
        }
        return {k: bool(v) for k, v in features.items()}, _model_name(cpuinfo, str(info.get("cpu_name", "")))
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and ":" in line:
            flags = set(line.split(":", 1)[1].split())
            break
    features = {
        "avx2": "avx2" in flags,
        "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "avx512_vnni": "avx512_vnni" in flags,
        "amx": {"amx_tile", "amx_bf16"} <= flags,
        "avx_ne_convert": "avx_ne_convert" in flags,
    }
    return features, _model_name(cpuinfo, "")


def _onednn_bf16_supported() -> bool:
    import torch

    if not torch.backends.mkldnn.is_available():
        return False
    try:  # oneDNN's own check, the one _reorder_linear_weight makes (ONEDNN_MAX_CPU_ISA lowers it)
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True  # this build cannot say: the features decide


NATIVE_KERNELS_FIX = ('pip install libggml-python==0.20.2.post1 (a dependency of specswap on Linux x86-64), then '
                      'reinstall specswap so its build compiles the kernels')


def _native_kernels_parts() -> tuple[bool, bool]:
    """(the extension was compiled with the native kernels, ggml's CPU library is installed)."""
    import importlib.util

    installed = importlib.util.find_spec("libggml") is not None
    try:
        from specswap import _core
    except ImportError:
        return False, installed
    return bool(getattr(_core._C, "with_ggml", False)), installed


def native_kernels_available() -> bool:
    """Whether GGUF block weights run natively here: the extension was compiled with the native kernels (its
    build found libggml-python's headers) and ggml's CPU library is installed (loaded on first use)."""
    return all(_native_kernels_parts())


def native_kernels_problem() -> str | None:
    """Why the native kernels are missing, with the fix; None when they are here."""
    built, installed = _native_kernels_parts()
    if not built:
        return ("this specswap build has no native GGUF kernels (it was compiled without libggml-python); "
                + NATIVE_KERNELS_FIX)
    if not installed:
        return "ggml's CPU library is not installed: pip install libggml-python==0.20.2.post1"
    return None


@functools.lru_cache(maxsize=1)
def cpu_capability() -> CpuCapability:
    """This CPU's capability under the limits, read once per process (``cpu_capability.cache_clear()`` re-reads
    the environment). Raises ValueError for a malformed ``SPECSWAP_CPU_CAPS``."""
    import torch

    hardware, model = hardware_features()
    return capability_from(hardware, os.environ.get(OVERRIDE_ENV), model=model,
                           torch_kernels=torch.backends.cpu.get_cpu_capability(),
                           onednn_agrees=_onednn_bf16_supported(), native_kernels=native_kernels_available())
