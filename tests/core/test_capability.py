"""specswap.capability: the override syntax, "less never more", dependency removal, the describe() line, and
agreement with what torch and oneDNN report on this machine."""

import itertools
import json

import pytest
import torch

from specswap import capability
from specswap.capability import FEATURES, OVERRIDE_NAMES, capability_from, cpu_capability, parse_override

pytestmark = pytest.mark.capability

SAPPHIRE_RAPIDS = dict.fromkeys(FEATURES, True) | {"avx_ne_convert": False}
ZEN4 = dict.fromkeys(FEATURES, True) | {"amx": False, "avx_ne_convert": False}
AVX2_ONLY = dict.fromkeys(FEATURES, False) | {"avx2": True}
OVERRIDES = ["", "-avx512", "-bf16", "-avx2", "-amx", "-avx512_bf16,-avx512_vnni", "avx2", "avx512", "avx512_bf16",
             "amx", "bf16", "avx_ne_convert", "none", " -avx512 , -bf16 "]


@pytest.fixture
def fresh_capability():
    cpu_capability.cache_clear()
    yield
    cpu_capability.cache_clear()  # the next test sees the process environment again


def test_parse_override_kinds():
    assert parse_override(None) == ("none", frozenset())
    assert parse_override("  ") == ("none", frozenset())
    assert parse_override("-avx512, -amx") == ("remove", frozenset({"avx512", "amx"}))
    assert parse_override("avx2") == ("keep", frozenset({"avx2"}))
    assert parse_override("none") == ("keep", frozenset())
    assert parse_override("-bf16") == ("remove", frozenset({"avx512_bf16", "amx", "avx_ne_convert"}))


@pytest.mark.parametrize("text", ["-avx512,-sse4", "avx1024", "-", "none,avx2", "AVX2"])
def test_unknown_names_are_rejected_with_the_valid_ones(text):
    with pytest.raises(ValueError, match="SPECSWAP_CPU_CAPS") as error:
        parse_override(text)
    assert all(name in str(error.value) for name in OVERRIDE_NAMES)


def test_mixing_removals_and_keeps_is_rejected():
    with pytest.raises(ValueError, match="mixes removals"):
        parse_override("-avx512,avx2")


@pytest.mark.parametrize("override", OVERRIDES)
def test_never_more_than_the_hardware(override):
    for bits in itertools.product([False, True], repeat=len(FEATURES)):
        hardware = dict(zip(FEATURES, bits))
        for level, agrees in (("AVX512", True), ("AVX2", True), ("DEFAULT", True), ("AVX512", False)):
            cap = capability_from(hardware, override, torch_kernels=level, onednn_agrees=agrees)
            for name in FEATURES:
                assert not getattr(cap, name) or hardware[name], (hardware, override, level, name)
            assert not cap.native_bf16 or (hardware["avx512_bf16"] or hardware["amx"])
            assert not cap.onednn_bf16 or (agrees and (hardware["avx512"] or hardware["avx_ne_convert"]))
            assert set(cap.removed) == {n for n in FEATURES if hardware[n] and not getattr(cap, n)}


def test_an_avx2_cpu_gains_nothing_by_naming_more():
    for override in ("avx512", "avx512_bf16", "amx", "bf16"):
        cap = capability_from(AVX2_ONLY, override)
        assert cap.avx2 and not (cap.avx512 or cap.avx512_bf16 or cap.amx or cap.native_bf16 or cap.onednn_bf16)


def test_removing_avx512_removes_what_builds_on_it():
    cap = capability_from(SAPPHIRE_RAPIDS, "-avx512")
    assert cap.avx2
    assert not (cap.avx512 or cap.avx512_bf16 or cap.avx512_vnni or cap.amx or cap.native_bf16 or cap.onednn_bf16)
    assert cap.removed == ("avx512", "avx512_bf16", "avx512_vnni", "amx")
    nothing = capability_from(SAPPHIRE_RAPIDS, "-avx2")
    assert not any(getattr(nothing, name) for name in (*FEATURES, "native_bf16", "onednn_bf16"))


def test_removing_bf16_keeps_avx512_and_onednn_bf16():
    cap = capability_from(ZEN4, "-bf16")
    assert cap.avx512 and cap.avx512_vnni and cap.onednn_bf16  # oneDNN still runs bf16 on AVX-512, emulated
    assert not (cap.avx512_bf16 or cap.native_bf16)


def test_keeping_a_feature_keeps_what_it_builds_on():
    cap = capability_from(ZEN4, "avx512_bf16")
    assert cap.avx2 and cap.avx512 and cap.avx512_bf16 and cap.native_bf16 and not cap.avx512_vnni
    only_avx2 = capability_from(ZEN4, "avx2")
    assert only_avx2.avx2 and not (only_avx2.avx512 or only_avx2.native_bf16)
    assert not capability_from(ZEN4, "none").avx2


def test_torch_limits_take_features_away():
    assert not capability_from(ZEN4, torch_kernels="AVX2").avx512
    assert capability_from(ZEN4, torch_kernels="AVX2").avx2
    assert not capability_from(ZEN4, torch_kernels="DEFAULT").avx2
    refused = capability_from(ZEN4, onednn_agrees=False)  # ONEDNN_MAX_CPU_ISA below avx512_core
    assert refused.avx512_bf16 and not refused.onednn_bf16 and not refused.native_bf16
    # an AVX2 CPU with AVX-NE-CONVERT runs oneDNN's bf16 path without native bf16 dot products
    ne_convert = capability_from(AVX2_ONLY | {"avx_ne_convert": True})
    assert ne_convert.onednn_bf16 and not ne_convert.native_bf16


def test_describe_line():
    assert capability_from(ZEN4, model="AMD EPYC 9454").describe() == (
        "cpu: AMD EPYC 9454; avx2 avx512 avx512_bf16 vnni; amx no; native bf16 yes; onednn bf16 yes; "
        "torch kernels AVX512; native kernels yes")
    assert capability_from(ZEN4, model="m", native_kernels=False).describe().endswith(
        "torch kernels AVX512; native kernels no")
    assert capability_from(SAPPHIRE_RAPIDS, "-avx512", model="Intel Xeon").describe() == (
        "cpu: Intel Xeon; avx2; amx no; native bf16 no; onednn bf16 no; torch kernels AVX512; native kernels yes; "
        "override: -avx512 (removed avx512 avx512_bf16 vnni amx)")
    assert capability_from(ZEN4, model="x", torch_kernels="AVX2").describe().endswith(
        "torch kernels AVX2; native kernels yes; limited (removed avx512 avx512_bf16 vnni)")
    assert capability_from(AVX2_ONLY, "none", model="m").describe().startswith("cpu: m; no avx2; amx no;")
    record = capability_from(ZEN4, "-bf16", model="m").as_dict()
    assert json.loads(json.dumps(record)) == record
    assert record["line"].endswith("override: -bf16 (removed avx512_bf16)") and record["native_bf16"] is False


def test_cpu_capability_reads_the_override_once(monkeypatch, fresh_capability):
    monkeypatch.setenv("SPECSWAP_CPU_CAPS", "-avx512,-bf16")
    cap = cpu_capability()
    assert not (cap.avx512 or cap.native_bf16 or cap.onednn_bf16) and cap.override == "-avx512,-bf16"
    monkeypatch.setenv("SPECSWAP_CPU_CAPS", "")
    assert cpu_capability() is cap  # cached: one answer per process
    cpu_capability.cache_clear()
    monkeypatch.setenv("SPECSWAP_CPU_CAPS", "-avx513")
    with pytest.raises(ValueError, match="unknown capability 'avx513'"):
        cpu_capability()


def test_the_hardware_reading_matches_torch():
    hardware, model = capability.hardware_features()
    assert model and model != "unknown"
    assert hardware["avx2"] == torch.cpu._is_avx2_supported()
    assert hardware["avx512"] == torch.cpu._is_avx512_supported()
    assert hardware["avx512_bf16"] == torch.cpu._is_avx512_bf16_supported()
    assert hardware["avx512_vnni"] == torch.cpu._is_vnni_supported() or not hardware["avx512"]
    cap = cpu_capability()
    assert not cap.amx or torch.cpu._is_amx_tile_supported()


def test_proc_cpuinfo_fallback(monkeypatch):
    from_torch = capability.hardware_features()
    monkeypatch.delattr(torch._C._cpu, "_get_cpu_capability")
    assert capability.hardware_features()[0] == from_torch[0]  # /proc/cpuinfo says the same here
    amd_avx2 = ("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n"
                "flags\t\t: fpu sse sse2 avx avx2 fma f16c avx512f\n")  # avx512f alone is not AVX-512 F+BW+VL+DQ
    monkeypatch.setattr(capability, "_cpuinfo_text", lambda: amd_avx2)
    features, model = capability.hardware_features()
    assert model == "AMD EPYC 7B13" and features == AVX2_ONLY


@torch.inference_mode()
def test_onednn_bf16_agrees_with_the_weight_reorder():
    """What the packed-linear guard relies on: onednn_bf16 true => the reorder works; oneDNN refusing (CI's
    override run holds it to AVX2) => onednn_bf16 false, and the reorder raises the error the guard avoids."""
    weight = torch.randn(64, 32).bfloat16()
    cap = cpu_capability()
    if cap.onednn_bf16:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        x = torch.randn(3, 32).bfloat16()
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        torch.testing.assert_close(out, x @ weight.t())
    elif not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        with pytest.raises(RuntimeError, match="bf16 path needs"):
            torch.ops.mkldnn._reorder_linear_weight(weight, None)
    else:
        assert cap.override or cap.removed, "oneDNN runs bf16 yet the capability says no without a limit"


def test_ggml_fast_kernels_follow_the_capability():
    """The AVX2 multi-row ggml kernels are chosen by the capability when ggml loads (once per process)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from components import require_native_kernels
    require_native_kernels()
    probe = ("from specswap import _core; from specswap.capability import cpu_capability; "
             "from specswap.models.quantized import load_ggml; load_ggml(); "
             "print(_core._C.ggml_set_fast_kernels(True), cpu_capability().avx2, _core._C.ggml_fast_kernels_available())")
    package_root = str(Path(capability.__file__).parents[1])  # the specswap under test
    answers = {}
    for override in ("", "-avx2"):
        env = {**os.environ, "SPECSWAP_CPU_CAPS": override, "PYTHONPATH": package_root}
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        answers[override] = out.stdout.split()
    # on where the capability reports AVX2 (and the cpuid check agrees); off under -avx2 whatever the hardware
    setting, reported, _ = answers[""]
    assert setting == str(reported == "True"), answers
    assert answers["-avx2"][:2] == ["False", "False"], answers
