"""Test set-up. Without a GPU, Triton kernels run under the interpreter: TRITON_INTERPRET must be set
before triton decorates any kernel, i.e. before attntune.kernels is imported — hence here, first."""

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
# Wide, plain rich output so CLI assertions don't depend on line wrapping.
os.environ.setdefault("COLUMNS", "250")
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    import interp_fp8  # noqa: E402 — tests/ is on sys.path (helpers.py is imported the same way)

    interp_fp8.install()  # float -> FP8 casts as the GPUs round them (see the module)


_VARIANT_METHODS = ("run", "bind", "supports", "space", "forward_saving", "backward_saved", "reuse_reasons")


@pytest.fixture(autouse=True)
def _no_instance_methods_left_behind(monkeypatch):
    """Fails the test that leaves a method as an instance attribute of a registered variant: monkeypatch.setattr
    on an instance restores the bound method *as an instance attribute*, which then hides every later
    class-level patch of that method (a later test counted no calls and failed only in the full suite). Patch
    instances with ``monkeypatch.setitem(vars(instance), name, ...)``, whose undo removes the key. The check
    runs after the test's patches are undone (undo is idempotent: monkeypatch's own teardown then has
    nothing left to do)."""
    yield
    monkeypatch.undo()
    from attntune.kernels import registry

    left = [(v, m) for v in registry.all_variants() for m in _VARIANT_METHODS if m in vars(v)]
    for v, m in left:  # removed, so that only the test that left them fails
        delattr(v, m)
    assert not left, f"instance attributes left on registered variants: {[f'{v.name}.{m}' for v, m in left]}"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own user cache and no shipped cache, unless it sets one itself."""
    monkeypatch.setenv("ATTNTUNE_CACHE", str(tmp_path / "user-cache.db"))
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", "")
    yield


@pytest.fixture(autouse=True)
def _no_run_queue_figures(monkeypatch):
    """The CPU timer's run-queue figures (attntune.autotune.cpuwait) unknown, so every call counts, as on
    a kernel without schedstat: whether other processes keep this machine busy must not change the winner
    a test sees. Tests of the busy-CPU rules inject their own figures (tests/test_busy_cpu.py)."""
    from attntune.autotune import cpuwait

    monkeypatch.setattr(cpuwait, "_TASKS", "/nonexistent/attntune-tests")


@pytest.fixture
def hf_registered():
    """The Hugging Face backend registered and a fresh runtime (tests/test_hf*.py use it for every test)."""
    import attntune
    import attntune.hf

    attntune.hf.register()
    attntune.reset()
    yield
    attntune.reset()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """With ``ATTNTUNE_TEST_TIMES=path``, append each test phase's duration as it finishes (under xdist the
    controller gets every worker's reports): a run killed by its time cap still says which tests were
    slow, where ``--durations`` prints only at the end."""
    path = os.environ.get("ATTNTUNE_TEST_TIMES")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller writes every worker's reports once
    if path and report.when in ("setup", "call"):
        with open(path, "a") as f:
            f.write(f"{report.duration:.2f} {report.when} {report.outcome} {report.nodeid}\n")
