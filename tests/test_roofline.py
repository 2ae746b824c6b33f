"""benchmarks/roofline.py on a tiny hand-made trace, on the CPU: each kernel is put in its class through the
operation that launched it, and each floor is the class's work at the rate measured in the same process."""
import gzip
import json
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import roofline  # noqa: E402


def op(name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def launch(ts, corr, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2, "tid": tid,
            "args": {"correlation": corr}}


def kernel(name, ts, dur, corr):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": 7, "args": {"correlation": corr}}


def tiny_trace():
    """One step: a block GEMM (its kernel launched inside aten::mm, itself inside a Python-level record), a
    head GEMM on another thread (the backward's), a Triton kernel with Inductor's byte count, attention forward
    and backward, an AdamW call over two tensors, a memset, and the FP8 head's softmax pass in our kernels (one
    op, two kernels)."""
    f32 = "float"
    return [
        op("## forward ##", 0, 1000, kind="user"),
        op("aten::mm", 10, 100, **{"Input Dims": [[64, 32], [32, 48]], "Input Strides": [[32, 1], [1, 32]],
                                   "Input type": [f32, f32], "Concrete Inputs": ["", ""]}),
        launch(20, 1),
        kernel("nvjet_sm90_tst_gemm", 30, 400, 1),
        op("triton_poi_fused_gelu_5", 200, 50, kernel_num_gb=0.004, **{"Input Dims": [[64, 48], [64, 48]],
                                                                        "Input type": [f32, f32]}),
        launch(210, 2),
        kernel("triton_poi_fused_gelu_5", 500, 100, 2),
        op("flash_attn_3::fwd", 300, 50),
        launch(310, 3),
        kernel("void flash::FlashAttnFwdSm90<...>", 600, 80, 3),
        op("aten::mm", 2000, 100, tid=2, **{"Input Dims": [[64, 32], [32, 128]], "Input Strides": [[32, 1], [128, 1]],
                                            "Input type": [f32, f32]}),
        launch(2010, 4, tid=2),
        kernel("nvjet_sm90_tst_gemm", 2030, 300, 4),
        op("flash_attn_3::bwd", 2200, 50, tid=2),
        launch(2210, 5, tid=2),
        kernel("void flash::FlashAttnBwdSm90<...>", 2400, 160, 5),
        op("aten::_fused_adamw_", 3000, 100, **{"Input Dims": [[[32, 48], [48]], [[32, 48], [48]]],
                                                 "Input type": ["TensorList", "TensorList"]}),
        launch(3010, 6),
        kernel("void multi_tensor_apply_kernel<...>", 3100, 40, 6),
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 3200, "dur": 10, "tid": 7,
         "args": {"bytes": 4096}},
        op("speedgpt::softmax_grad_fp8", 3300, 100, **{
            "Input Dims": [[64, 128], [64], [], []], "Input type": ["c10::BFloat16", "long int", "Scalar", "Scalar"]}),
        launch(3310, 7),
        kernel("row_stats", 3400, 20, 7),
        launch(3320, 8),
        kernel("grad_fp8", 3420, 30, 8),
    ]


def fp8_trace():
    """The FP8 path's kernels: a float8 GEMM (torch._scaled_mm, tensorwise scales, bf16 out), a Triton cast
    (bf16 and its scale in, float8 out), a Triton float8 -> float8 transpose, and ATen's copy of bf16 into float8."""
    e4m3, bf16 = "c10::Float8_e4m3fn", "c10::BFloat16"
    return [
        op("aten::_scaled_mm", 4000, 100, **{
            "Input Dims": [[64, 32], [32, 48], [], [], [], [], [], []],
            "Input Strides": [[32, 1], [1, 32], [], [], [], [], [], []],
            "Input type": [e4m3, e4m3, "float", "float", "", "", "Scalar", "Scalar"],
            "Concrete Inputs": ["", "", "", "", "", "", "15", "True"]}),
        launch(4010, 9),
        kernel("nvjet_sm90_qqtst_128x128_e4m3", 4030, 200, 9),
        op("triton_poi_fused__to_copy_clamp_mul_3", 4300, 50, kernel_num_gb=0.003,
           **{"Input Dims": [[64, 32], [], [64, 32], []], "Input type": [bf16, "float", e4m3, "Scalar"]}),
        launch(4310, 10),
        kernel("triton_poi_fused__to_copy_clamp_mul_3", 4400, 30, 10),
        op("triton_poi_fused_clone_4", 4500, 50, kernel_num_gb=0.002,
           **{"Input Dims": [[64, 32], [32, 64], []], "Input type": [e4m3, e4m3, "Scalar"]}),
        launch(4510, 11),
        kernel("triton_poi_fused_clone_4", 4600, 20, 11),
        op("aten::copy_", 4700, 50, **{"Input Dims": [[48, 32], [48, 32], []],
                                       "Input type": [e4m3, bf16, "Scalar"]}),
        launch(4710, 12),
        kernel("void at::native::unrolled_elementwise_kernel<...>", 4800, 10, 12),
    ]


def write_run(folder, events):
    with gzip.open(folder / "profile_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    (folder / "config.json").write_text(json.dumps(
        {"batch_size": 2, "block_size": 16, "n_layer": 1, "n_embd": 32, "total_batch_size": 64,
         "data_dir": str(folder / "no-data")}))
    return folder


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path, tiny_trace())


def test_kernels_are_classed_by_the_operation_that_launched_them():
    classes = roofline.classify(tiny_trace(), vocab=128)
    names = set(classes)
    assert "block GEMM 64x32 @ 32x48 float32" in names
    assert "head GEMM 64x32 @ 32x128 float32" in names                  # the vocabulary (128) is in its shape
    assert {"attention forward", "attention backward", "optimizer (AdamW)"} <= names
    gelu = classes["Triton fused elementwise: triton_poi_fused_gelu"]
    assert gelu["bytes"] == pytest.approx(4e6) and gelu["ms"] == pytest.approx(0.1)
    assert classes["block GEMM 64x32 @ 32x48 float32"]["flops"] == 2 * 64 * 32 * 48
    assert classes["optimizer (AdamW)"]["bytes"] == (2 + 1) * (32 * 48 + 48) * 4   # params read + written, grads read
    assert classes["other: Memset (Device)"]["bytes"] == 4096
    softmax = classes[roofline.SOFTMAX_PASS]             # head_kernel: both kernels, 4 bytes per logit once
    assert softmax["calls"] == 2 and softmax["ms"] == pytest.approx(0.05) and softmax["bytes"] == 4 * 64 * 128


def test_the_table_puts_each_class_against_its_measured_floor(run_dir, capsys):
    rows = roofline.main([str(run_dir), "--no-measure", "--copy-mb", "8", "--matmul-n", "64",
                          "--json", str(run_dir / "rows.json")])
    saved = json.loads((run_dir / "rows.json").read_text())
    bandwidth = saved["copy_bytes_per_s"]
    assert saved["micro_batches"] == 2 and bandwidth > 0
    by_name = {r["name"]: r for r in rows}
    gelu = by_name["Triton fused elementwise: triton_poi_fused_gelu"]
    assert gelu["floor_ms"] == pytest.approx(4e6 / bandwidth * 1e3)
    assert gelu["ratio"] == pytest.approx(0.1 / gelu["floor_ms"])
    fwd, bwd = roofline.attention_flops({"block_size": 16, "n_embd": 32, "n_layer": 1, "batch_size": 2}, 2)
    assert bwd == 2.5 * fwd == 2.5 * 2 * 16 ** 2 * 32 * 2 * 2
    assert by_name["attention backward"]["floor_ms"] == pytest.approx(
        2.5 * by_name["attention forward"]["floor_ms"])
    gemm = by_name["block GEMM 64x32 @ 32x48 float32"]
    assert 0 < gemm["floor_ms"] < float("inf")
    assert [r["above_ms"] for r in rows] == sorted((r["above_ms"] for r in rows), reverse=True)
    out = capsys.readouterr().out
    assert "| class | calls | ms |" in out and "| all |" in out
    attention = sum(r["ms"] for r in rows if r["kind"] == "attention")
    best = sum(min(r["ms"], r["floor_ms"]) if r["floor_ms"] is not None else r["ms"] for r in rows
               if r["kind"] != "attention")
    assert roofline.at_floors(rows, kept=("attention",)) == pytest.approx(best + attention)
    assert roofline.at_floors(rows) < roofline.at_floors(rows, kept=("attention",)) <= sum(r["ms"] for r in rows)
    assert f"every class but attention, attention as it ran: {best + attention:.2f} ms" in out


def test_a_folder_without_a_trace_is_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit, match="profile_trace.json.gz is missing: run train.py with --profile=True"):
        roofline.main([str(tmp_path), "--no-measure"])


@pytest.mark.parametrize("argv, message", [
    (["--copy-mb", "-1"], r"argument --copy-mb: -1: a positive integer"),
    (["--matmul-n", "0"], r"argument --matmul-n: 0: a positive integer"),
    (["--top", "x"], r"argument --top: x: a positive integer"),
])
def test_bad_sizes_are_refused_before_any_work(run_dir, argv, message, capsys):
    with pytest.raises(SystemExit):
        roofline.main([str(run_dir), "--no-measure", *argv])
    assert re.search(message, capsys.readouterr().err)


def test_a_missing_folder_or_json_folder_is_refused_in_one_line_before_any_work(run_dir, tmp_path):
    with pytest.raises(SystemExit, match=f"^error: no folder: {tmp_path / 'none'}: give the out_dir of a train.py run"):
        roofline.main([str(tmp_path / "none"), "--no-measure"])
    with pytest.raises(SystemExit, match="^error: a file, not a folder: .*config.json: give the out_dir of a train"):
        roofline.main([str(run_dir / "config.json"), "--no-measure"])
    with pytest.raises(SystemExit, match=r"^error: --json .*/nodir/x.json: its folder does not exist; give a file"):
        roofline.main([str(run_dir), "--no-measure", "--json", str(tmp_path / "nodir" / "x.json")])
    with pytest.raises(SystemExit, match=rf"^error: --json {tmp_path}: a folder, not a file; give a file name"):
        roofline.main([str(run_dir), "--no-measure", "--json", str(tmp_path)])


def test_no_measure_takes_small_sizes_unless_given(run_dir, capsys):
    roofline.main([str(run_dir), "--no-measure"])             # the GPU's 8192^3 and 2 GB would take minutes here
    assert "(64^3)" in capsys.readouterr().out
    roofline.main([str(run_dir), "--no-measure", "--matmul-n", "32"])
    assert "(32^3)" in capsys.readouterr().out


@pytest.mark.parametrize("content", [b"garbage", gzip.compress(b"{}"), gzip.compress(b'{"traceEvents": 3}')])
def test_a_file_that_is_no_trace_is_refused_in_one_line(run_dir, content):
    (run_dir / "profile_trace.json.gz").write_bytes(content)
    with pytest.raises(SystemExit, match=r"profile_trace.json.gz is not a torch.profiler trace .*: profile again"):
        roofline.main([str(run_dir), "--no-measure"])


def test_fp8_casts_and_transposes_are_rows_of_their_own():
    classes = roofline.classify(tiny_trace() + fp8_trace(), vocab=128)
    cast = classes["FP8 cast: triton_poi_fused__to_copy_clamp_mul"]          # bf16 in, float8 out
    assert cast["kind"] == "FP8 cast" and cast["bytes"] == pytest.approx(3e6) and cast["ms"] == pytest.approx(0.03)
    transpose = classes["FP8 transpose: triton_poi_fused_clone"]               # float8 in and out
    assert transpose["kind"] == "FP8 transpose" and transpose["bytes"] == pytest.approx(2e6)
    aten = classes["FP8 cast: aten::copy_"]                                    # read bf16, write float8
    assert aten["kind"] == "FP8 cast" and aten["bytes"] == 48 * 32 * (1 + 2)
    gemm = classes["block GEMM 64x32 @ 32x48 float8_e4m3fn (_scaled_mm)"]
    assert gemm["kind"] == "GEMM" and gemm["flops"] == 2 * 64 * 32 * 48
    assert classes["Triton fused elementwise: triton_poi_fused_gelu"]["kind"] == "Triton"    # no float8: as before
    assert not [n for n in classes if n.startswith("other") and "copy" in n]


def test_other_ops_count_what_they_write_where_their_inputs_tell():
    """The floor of an "other" row is its bytes at the copy rate: our GELU pass (speedgpt::cast_amax) reads x (and
    h, backward) and writes two float8 copies of x, which its recorded inputs do not show; an in-place add_ reads
    and writes its first input; copy_ only writes its first. Counting inputs alone made the GELU pass's floor 0.6
    of its bytes (2.56x its floor at 124M instead of about 1.5x)."""
    bf16, f32 = "c10::BFloat16", "float"
    events = [
        op("speedgpt::cast_amax", 5000, 50, **{"Input Dims": [[64, 48], [], [16, 1], [], [], [], [64, 48]],
                                               "Input type": [bf16, f32, f32, "Scalar", "Scalar", "Scalar", bf16]}),
        launch(5010, 20), kernel("cast_amax_kernel", 5100, 30, 20),
        op("aten::add_", 5200, 50, **{"Input Dims": [[64, 48], [64, 48], []], "Input type": [f32, f32, "Scalar"]}),
        launch(5210, 21), kernel("void at::native::vectorized_elementwise_kernel<add>", 5300, 10, 21),
        op("aten::copy_", 5400, 50, **{"Input Dims": [[64, 48], [64, 48], []], "Input type": [f32, f32, "Scalar"]}),
        launch(5410, 22), kernel("void at::native::vectorized_elementwise_kernel<copy>", 5500, 10, 22)]
    classes = roofline.classify(events)
    n = 64 * 48
    assert classes["other: speedgpt::cast_amax"]["bytes"] == 2 * n + 16 * 4 + 2 * n + 2 * n    # x, amax, h, copies
    assert classes["other: aten::add_"]["bytes"] == 3 * 4 * n
    assert classes["other: aten::copy_"]["bytes"] == 2 * 4 * n
    f32 = {"Input Dims": [[64, 48]], "Input type": ["float"]}
    for name in ("aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_"):      # written only
        assert roofline.op_bytes({"name": name, "args": f32}) == 4 * n, name
    index_put = {"Input Dims": [[64, 48], [[8]], [8, 48]], "Input type": ["float", "TensorList", "float"]}
    for name in ("aten::index_put_", "aten::_index_put_impl_", "aten::scatter_add_"):    # not the whole of self twice
        assert roofline.op_bytes({"name": name, "args": index_put}) == 4 * n + 4 * 8 + 4 * 8 * 48, name
    norm = {"Input Dims": [[64, 48], [48], [48]], "Input type": ["float", "float", "float"]}
    assert roofline.op_bytes({"name": "speedgpt::norm_cast_amax", "args": norm}) == 4 * n + 2 * 4 * 48 + 2 * n + 8 * 64


def test_a_config_that_is_not_train_pys_is_refused_in_one_line(run_dir):
    sized = '"block_size": 256, "n_layer": 4'
    for content, why in (("garbage", "JSONDecodeError"), ('{"batch_size": 2}', "no block_size, n_layer, n_embd"),
                         ('{"batch_size": "x", %s, "n_embd": null}' % sized,
                          "batch_size='x', n_embd=None, not a positive integer"),
                         ('{"batch_size": 2, %s, "n_embd": 128, "total_batch_size": 1.5}' % sized,
                          "total_batch_size=1.5, not a positive integer")):
        (run_dir / "config.json").write_text(content)
        with pytest.raises(SystemExit, match=rf"config.json is not a train.py config \({why}.*: profile again"):
            roofline.main([str(run_dir), "--no-measure"])


def test_float8_gemms_get_a_second_floor_at_fp8s_own_peak(tmp_path, capsys):
    write_run(tmp_path, tiny_trace() + fp8_trace())
    rows = roofline.main([str(tmp_path), "--no-measure", "--copy-mb", "8", "--matmul-n", "64",
                          "--json", str(tmp_path / "rows.json")])
    saved = json.loads((tmp_path / "rows.json").read_text())
    fp8_rate, rate = saved["fp8_matmul_flop_per_s"], saved["matmul_flop_per_s"]
    assert fp8_rate > 0 and fp8_rate != rate
    by_name = {r["name"]: r for r in rows}
    fp8 = by_name["block GEMM 64x32 @ 32x48 float8_e4m3fn (_scaled_mm)"]
    assert fp8["peak_floor_ms"] == pytest.approx(2 * 64 * 32 * 48 / fp8_rate * 1e3)
    assert fp8["peak_ratio"] == pytest.approx(0.2 / fp8["peak_floor_ms"])
    assert 0 < fp8["floor_ms"] < float("inf")                                  # the shape alone, as before
    bf = by_name["block GEMM 64x32 @ 32x48 float32"]                           # other dtypes: their own matmul rate
    assert bf["peak_floor_ms"] == pytest.approx(2 * 64 * 32 * 48 / rate * 1e3)
    assert by_name["FP8 transpose: triton_poi_fused_clone"]["floor_ms"] == pytest.approx(
        2e6 / saved["copy_bytes_per_s"] * 1e3)
    out = capsys.readouterr().out
    assert "| peak floor ms | time / peak floor |" in out and "e4m3 _scaled_mm" in out
    assert "\n| FP8 cast |" in out and "\n| FP8 transpose |" in out                 # kinds of their own in the totals
