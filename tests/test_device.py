"""Device and software fingerprints, with the CUDA and ROCm device queries faked."""

from attntune import device as dev
from attntune.device import SoftwareFingerprint, fingerprint_from_cpu_info, fingerprint_from_gpu_props


def test_cuda_fingerprint():
    fp = fingerprint_from_gpu_props({"name": "NVIDIA H200", "major": 9, "minor": 0, "multi_processor_count": 132,
                                     "gcnArchName": "", "hip": None})
    assert (fp.backend, fp.arch, fp.units, fp.device_type) == ("cuda", "sm_90", 132, "cuda")


def test_rocm_fingerprint():
    fp = fingerprint_from_gpu_props({"name": "AMD Instinct MI300X", "major": 9, "minor": 4,
                                     "multi_processor_count": 304, "gcnArchName": "gfx942:sramecc+:xnack-",
                                     "hip": "6.2.41133"})
    assert (fp.backend, fp.arch, fp.units, fp.device_type) == ("rocm", "gfx942", 304, "cuda")


def test_cpu_fingerprint():
    fp = fingerprint_from_cpu_info({"capability": "AVX512", "name": "Some CPU", "threads": 2})
    assert (fp.backend, fp.arch, fp.units, fp.device_type) == ("cpu", "cpu-avx512", 2, "cpu")


def test_device_fingerprint_uses_query(monkeypatch):
    monkeypatch.setattr(dev, "_query_cpu", lambda: {"capability": "AVX2", "name": "fake", "threads": 3})
    dev._device_fingerprint_cached.cache_clear()
    try:
        assert dev.device_fingerprint("cpu").arch == "cpu-avx2"
    finally:
        dev._device_fingerprint_cached.cache_clear()


def test_gpu_query_faked(monkeypatch):
    monkeypatch.setattr(dev, "_query_gpu", lambda i: {"name": "AMD Instinct MI250X", "major": 9, "minor": 0,
                                                      "multi_processor_count": 110, "gcnArchName": "gfx90a:sramecc+:xnack-",
                                                      "hip": "6.0"})
    dev._device_fingerprint_cached.cache_clear()
    try:
        assert dev._device_fingerprint_cached("cuda", 0).arch == "gfx90a"
    finally:
        dev._device_fingerprint_cached.cache_clear()


def test_software_staleness():
    a = SoftwareFingerprint(torch="2.11.0", triton="3.6.0", cuda="13.0", variant_hash="abc")
    assert a.stale_reasons(a.model_copy(update={"torch": "2.11.1", "attntune": "9.9"})) == []
    assert "torch 2.11.0 != 2.12.0" in a.stale_reasons(a.model_copy(update={"torch": "2.12.0"}))
    assert a.stale_reasons(a.model_copy(update={"variant_hash": "def"})) == ["variant source changed"]
    assert any("cuda" in r for r in a.stale_reasons(a.model_copy(update={"cuda": "12.4"})))


def test_software_fingerprint_cpu_omits_gpu_runtimes():
    sw = dev.software_fingerprint("h", "cpu")
    assert sw.cuda is None and sw.hip is None and sw.triton is None and sw.variant_hash == "h"
