"""CPU matmuls as oneDNN linears (EMBER_CPU_GEMM): what runs, and that training and
inference still match eager under the accuracy rule."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch

from ember.graphpasses import LinearCase, linear_op
from ember.runtime import compile_cache, config, cpu_gemm
from ember.runtime.accuracy import compare_outputs
from ember.runtime.compiler import compile_records
from ember.runtime.models import MLP, TransformerBlock

pytestmark = pytest.mark.skipif(linear_op() is None, reason="torch built without oneDNN")


def _wrapper_text(first: int) -> str:
    paths = [r.wrapper_path for r in compile_records[first:] if r.wrapper_path is not None]
    assert paths
    return "\n".join(p.read_text() for p in paths)


@pytest.mark.parametrize("setting", ["onednn", "aten"])
def test_mlp_inference_matches_eager(setting: str) -> None:
    model = MLP(64, 96, 24).eval()
    x = torch.randn(16, 64)
    first = len(compile_records)
    # matmul kernels off: under "aten" the linears stay ATen's addmm
    with config.scope(cpu_gemm=setting, matmul_templates="off"), torch.no_grad():
        actual = torch.compile(model, backend="ember")(x)
        expected = model(x)
        reference = model.double()(x.double())
    assert compare_outputs(actual, expected, reference=reference) is None
    text = _wrapper_text(first)
    if setting == "onednn":
        assert "mkldnn._linear_pointwise" in text and "'swish'" in text
        assert "aten.addmm" not in text
    else:
        assert "mkldnn" not in text and "aten.addmm" in text


def test_training_step_matches_eager() -> None:
    eager = TransformerBlock(32, 4, 64)
    model = copy.deepcopy(eager)
    x = torch.randn(2, 8, 32)
    first = len(compile_records)
    with config.scope(cpu_gemm="onednn"):
        compiled = torch.compile(model, backend="ember")
        out = compiled(x)
        out.square().mean().backward()
    ref = eager(x)
    ref.square().mean().backward()
    assert compare_outputs(out, ref) is None
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        assert compare_outputs(p.grad, q.grad) is None
    assert "mkldnn._linear_pointwise" in _wrapper_text(first)


def _case(m: int, k: int, n: int, kind: str, bias: bool = False, post: str = "none") -> LinearCase:
    """A case with the operand layout `kind` ("nt", "nn", "tn", "tt") as the pass sees it."""
    x = (k, 1) if kind[0] == "n" else (1, m)
    w = (k, 1) if kind[1] == "t" else (1, n)  # the weight as oneDNN takes it, N x K
    return LinearCase(m, k, n, x, w, bias, post)


# (case, the rule's verdict at 2 threads): the demo's shapes and the rule's edges
RULE_TABLE = [
    (_case(64, 256, 512, "nt", True, "swish"), True),  # the MLP's first layer
    (_case(64, 512, 512, "nt", True, "swish"), True),
    (_case(64, 512, 64, "nt", True), False),  # 2^21 multiply-adds: unsure, ATen
    (_case(256, 64, 256, "nt", True, "gelu"), True),  # the transformer's MLP, 2^22
    (_case(256, 64, 64, "nt", True), False),
    (_case(1, 4096, 4096, "nt", True), True),  # a batch of one
    (_case(1, 4096, 4096, "nn"), False),  # M = 1, weight read transposed: unsure
    (_case(512, 1024, 1024, "nn"), True),  # an input gradient
    (_case(2048, 64, 64, "nn"), False),  # a weight of 64 x 64
    (_case(1024, 2048, 256, "tn"), True),  # a weight gradient
    (_case(2048, 4096, 64, "tn"), False),  # N = 64 read transposed
    (_case(512, 512, 512, "tt"), False),  # never measured
    (LinearCase(512, 512, 512, (1024, 2), (512, 1), False), False),  # no unit stride
]


@pytest.mark.parametrize(("case", "expected"), RULE_TABLE)
def test_rule_table(case: LinearCase, expected: bool) -> None:
    assert cpu_gemm.rule(case, threads=2) is expected
    assert cpu_gemm.rule(case, threads=1) is expected  # one threshold up to 2 threads


def test_layouts_from_strides() -> None:
    assert [cpu_gemm.layout(_case(8, 16, 32, k)) for k in ("nt", "nn", "tn", "tt")] == [
        "nt",
        "nn",
        "tn",
        "tt",
    ]
    assert cpu_gemm.layout(LinearCase(8, 16, 32, (16, 1), (1, 0), False)) is None  # expanded


def test_threshold_grows_with_threads_above_two() -> None:
    case = _case(256, 128, 128, "nt")  # 2^22 multiply-adds
    assert cpu_gemm.threshold(1) == cpu_gemm.threshold(2) == cpu_gemm.THRESHOLD_MACS
    assert cpu_gemm.rule(case, threads=2) and not cpu_gemm.rule(case, threads=4)
    assert cpu_gemm.rule(_case(512, 128, 128, "nt"), threads=4)


def test_choices_ignore_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine under load makes any timing come out either way: the rule reads no
    clock, so a clock returning noise changes no choice."""
    import time

    expected = [cpu_gemm.rule(case) for case, _ in RULE_TABLE]
    for seed in range(3):
        noise = random.Random(seed)
        monkeypatch.setattr(time, "perf_counter", lambda n=noise: n.uniform(0, 1e3))
        monkeypatch.setattr(time, "perf_counter_ns", lambda n=noise: n.randrange(10**12))
        monkeypatch.setattr(cpu_gemm, "measured", lambda: True)
        prefer = cpu_gemm.prefer_for("auto")
        assert prefer is not None
        assert [prefer(case) for case, _ in RULE_TABLE] == expected


def test_unmeasured_cpus_keep_aten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_gemm, "cpu_family", lambda: ("GenuineIntel", "AVX2"))
    assert cpu_gemm.prefer_for("auto") is None
    assert "not measured" in cpu_gemm.rule_key("auto")
    always = cpu_gemm.prefer_for("onednn")
    assert always is not None and always(_case(1, 1, 1, "nt"))


def test_settings_pick_prefer(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cpu_gemm.prefer_for("aten") is None
    monkeypatch.setattr(cpu_gemm, "cpu_family", lambda: ("AuthenticAMD", "AVX512"))
    assert cpu_gemm.prefer_for("auto") is cpu_gemm.rule
    assert cpu_gemm.rule_key("auto").startswith(f"auto: rule {cpu_gemm.RULE_VERSION}")


def test_artifact_and_cache_key_hold_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_gemm, "cpu_family", lambda: ("AuthenticAMD", "AVX512"))
    model = MLP(256, 512, 64).eval()  # the demo's MLP: two linears over the threshold
    x = torch.randn(64, 256)
    first = len(compile_records)
    with config.scope(cpu_gemm="auto", compile_cache=False), torch.no_grad():
        actual = torch.compile(model, backend="ember")(x)
        expected = model(x)
    assert compare_outputs(actual, expected) is None
    artifact = compile_records[first].artifact
    assert artifact is not None
    listed = artifact.extra["cpu_gemm"]
    assert listed["rule"] == cpu_gemm.rule_key("auto")
    assert listed["choices"] == {
        "64x256x512 nt+bias swish": "oneDNN",
        "64x512x512 nt+bias swish": "oneDNN",
        "64x512x64 nt+bias none": "ATen",
    }
    manifest = json.loads(artifact.files()["manifest.json"])
    assert manifest["cpu_gemm"] == listed

    gm = torch.fx.symbolic_trace(model)
    key = compile_cache.graph_key(gm, [], {torch.device("cpu")})
    assert compile_cache.graph_key(gm, [], {torch.device("cpu")}) == key
    monkeypatch.setattr(cpu_gemm, "RULE_VERSION", cpu_gemm.RULE_VERSION + 1)
    assert compile_cache.graph_key(gm, [], {torch.device("cpu")}) != key
