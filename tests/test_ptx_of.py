"""benchmarks/ptx_of.py: what a call launches, compiled for sm_90 on a machine without that GPU."""
from __future__ import annotations

import pytest
from helpers import bench_module, doctest_results

ptx_of = bench_module("ptx_of")


def test_count_doctest():
    assert doctest_results(ptx_of.count) and all(f == 0 for _, f in doctest_results(ptx_of.count))


def test_a_decode_launch_compiles_for_sm90_with_the_runtimes_specialisation(capsys):
    """The launch is recorded in a child under the interpreter (nothing runs) and compiled here for sm_90:
    a 16-bit decode tile reaches its dots through ``mma.sync`` (M = 16 rows), its K/V by 16-byte ``cp.async``
    (the pointers and strides specialised as aligned / divisible by 16, as a GPU launch would)."""
    pytest.importorskip("triton")
    ptx_of.main(["decode", "--b", "2", "--hq", "8", "--hkv", "2", "--s", "256", "--d", "64", "--dtype", "float16",
                 "--config", '{"BLOCK_N": 64, "num_splits": 1, "num_warps": 4, "num_stages": 2}'])
    out = capsys.readouterr().out
    assert "sm_90: 1 launch(es)" in out and "decode_split_kernel warps=4 stages=2" in out, out
    regs = int(out.split(" regs=", 1)[1].split()[0])  # ptxas -v's count: a 4-warp tile takes 32..255
    assert 32 <= regs <= 255, out
    counts = __import__("json").loads(out.strip().splitlines()[-1].split(" B: ", 1)[1])
    assert counts.get("mma.sync", 0) > 0 and counts.get("cp.async.cg", 0) > 0, counts


def test_a_descriptor_launch_compiles_with_tma_loads(capsys):
    """A flash launch with descriptor loads (LOADS=1) passes host TensorDescriptors: they are specialised as
    ``tensordesc<dtype[block]>`` (as Triton's launcher names them) and reach the kernel as TMA loads
    (``cp.async.bulk.tensor``), not as a constexpr string."""
    pytest.importorskip("triton")
    ptx_of.main(["flash", "--b", "1", "--hq", "2", "--hkv", "2", "--s", "128", "--d", "64", "--dtype", "float16",
                 "--config", '{"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "LOADS": 1}'])
    out = capsys.readouterr().out
    counts = __import__("json").loads(out.strip().splitlines()[-1].split(" B: ", 1)[1])
    assert counts.get("cp.async.bulk.tensor", 0) > 0 and counts.get("wgmma.mma_async", 0) > 0, counts


def test_a_training_launch_reports_registers_and_spills(capsys):
    """--train records the backward's launches too; each line carries ptxas's registers and spill bytes (a
    16-row fp16 tile at D=32 fits without spilling)."""
    pytest.importorskip("triton")
    ptx_of.main(["flash", "--b", "1", "--hq", "2", "--hkv", "1", "--s", "64", "--d", "32", "--dtype", "float16",
                 "--causal", "--window", "15", "0", "--train", "--config",
                 '{"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2, "BWD_BLOCK_M": 16, '
                 '"BWD_BLOCK_N": 64, "BWD_WARPS": 4, "BWD_STAGES": 2}'])
    out = capsys.readouterr().out
    names = [ln.split()[0] for ln in out.strip().splitlines()[1:]]
    assert names == ["flash_fwd_kernel", "bwd_preprocess_kernel", "bwd_dkdv_kernel", "bwd_dq_kernel"], out
    assert all(" spills=0/0 " in ln and " regs=" in ln for ln in out.strip().splitlines()[1:]), out
