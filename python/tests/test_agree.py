"""qhead.agree end to end on the real SmolLM2-135M-Instruct, at a CI size (about 200 states).

Asserted, whatever the true rates are: w8 agrees at least as often as w4g64; agreement never
falls as K grows; K = V rescoring is the dense head (100%, KL ~ 0); the records carry the
fields the JSON promises; the states file round-trips; the CLI's errors exit 2 naming the
flag. The full 10,000-state runs are commands (docs/accuracy.md).
"""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from qhead import agree  # noqa: E402
from qhead import models as qmodels  # noqa: E402

FIELDS = ("states", "ties", "top1_agreement", "wilson_lo", "wilson_hi", "flips_outside_ties", "flips_per_1k",
          "kl_mean", "kl_p99", "kl_median", "kl_p999", "top5_overlap", "top10_overlap", "same_top_p_pct",
          "dp_top_mean_pct", "displaced", "ppl", "ppl_dense", "dppl_pct", "by_source")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    why = qmodels.unavailable(qmodels.resolve("smollm2"))
    if why:
        pytest.skip(f"SmolLM2-135M-Instruct: {why}")
    import qhead
    import transformers

    transformers.logging.set_verbosity_error()
    d = tmp_path_factory.mktemp("states")
    threads = (torch.get_num_threads(), qhead.num_threads())
    torch.set_num_threads(1)
    qhead.set_num_threads(1)
    path = str(d / "smollm2.safetensors")
    try:
        r = agree.run(["smollm2"], states=path, n=200, schemes=["w8", "w4g64"], rescore=[1, 2, 8, 49152],
                      new_tokens=16, log=lambda m: None)
    finally:
        torch.set_num_threads(threads[0])
        qhead.set_num_threads(threads[1])
    return r, path


def _rec(r, scheme, k):
    return next(x for x in r["records"] if x["scheme"] == scheme and x["rescore"] == k and x["embedding"] == "dense")


def test_records_hold_every_field(result):
    r, _ = result
    assert len(r["records"]) == 2 * 5
    for x in r["records"]:
        for f in FIELDS:
            assert f in x, f
        assert 150 <= x["states"] <= 210
        assert 0.0 <= x["wilson_lo"] <= x["top1_agreement"] <= x["wilson_hi"] <= 1.0
        assert x["flips_outside_ties"] <= x["flips"] <= x["states"]
        assert x["kl_median"] <= x["kl_p99"] <= x["kl_p999"] <= x["kl_max"]
        assert set(x["by_source"]) >= {"corpus", "greedy", "sampled"}
    m = r["models"]["smollm2"]
    assert m["model_sha256"] == qmodels.file_sha256(qmodels.resolve("smollm2").path)
    assert m["vocab"] == 49152 and m["hidden"] == 576 and m["tied"]
    json.dumps(r)  # JSON-able as it stands


def test_w8_agrees_at_least_as_often_as_w4g64(result):
    r, _ = result
    for k in (0, 1, 2, 8):
        assert _rec(r, "w8", k)["top1_agreement"] >= _rec(r, "w4g64", k)["top1_agreement"], k
    assert _rec(r, "w8", 0)["kl_mean"] < _rec(r, "w4g64", 0)["kl_mean"]


def test_rescoring_never_lowers_agreement_and_k_v_is_exact(result):
    r, _ = result
    for s in ("w8", "w4g64"):
        a = [_rec(r, s, k)["top1_agreement"] for k in (0, 1, 2, 8, 49152)]
        assert a == sorted(a), (s, a)
        full = _rec(r, s, 49152)
        assert full["top1_agreement"] == 1.0 and full["flips"] == 0
        assert full["kl_max"] < 1e-4 and abs(full["dppl_pct"]) < 0.01


def test_states_file_round_trips(result):
    r, path = result
    st = agree.load_states(path)
    assert st.meta["model"] == "smollm2" and st.meta["format"] == agree.STATES_FORMAT
    assert st.hidden.shape[1] == 576 and st.table.shape == (49152, 576)
    assert len(st) >= 200
    assert set(st.source.tolist()) == {0, 1, 2}
    # The dense table's greedy choice on the greedy generation states is the token generated.
    g = st.source == agree.SOURCES.index("greedy")
    top = (st.hidden[g] @ st.table.T).argmax(1)
    assert float((top == st.target[g]).float().mean()) >= 0.95


def test_not_a_states_file(tmp_path):
    from safetensors.torch import save_file

    p = str(tmp_path / "x.safetensors")
    save_file({"a": torch.zeros(2)}, p)
    with pytest.raises(ValueError, match="not a qhead states file"):
        agree.load_states(p)


def test_format_table_and_plot(result, tmp_path):
    r, _ = result
    t = agree.format_table(r)
    assert t.count("\n") == len(r["records"]) + 1
    pytest.importorskip("matplotlib")
    png = tmp_path / "agree.png"
    agree.plot(r, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,needle", [
    (["--model", "smollm2", "--schemes", "w5g7"], "w5g7"),
    (["--model", "smollm2", "--n", "0"], "--n"),
    (["--model", "nosuchmodel"], "nosuchmodel"),
    (["--model", "smollm2", "--rescore", "8,x"], "--rescore"),
    (["--model", "smollm2", "--text", "/nonexistent/file.txt"], "--text"),
    (["--model", "smollm2", "--quantizer", "rtn,awq"], "awq"),
])
def test_cli_errors_exit_2(args, needle):
    p = subprocess.run([sys.executable, "-m", "qhead.agree", *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr


def test_int8_activations_are_measured_beside_exact(result):
    """--cpu-activations exact,int8: every fused table twice, the int8 records labelled, their
    logits those of the int8 mode (not the exact ones: KL and agreement differ somewhere), and the
    mode back to exact afterwards."""
    import qhead

    _, path = result
    r = agree.run(["smollm2"], states=path, n=200, schemes=["w4g64"], rescore=[8], cpu_activations=["exact", "int8"],
                  log=lambda m: None)
    exact = [x for x in r["records"] if x.get("activations") == "exact"]
    int8 = [x for x in r["records"] if x.get("activations") == "int8"]
    assert len(exact) == len(int8) == 2  # K = 0 and 8
    e0 = next(x for x in exact if x["rescore"] == 0)
    i0 = next(x for x in int8 if x["rescore"] == 0)
    assert e0["kl_mean"] != i0["kl_mean"]
    assert qhead.cpu_activations() == "exact"
    assert "(int8 x)" in agree.format_table(r)
    with pytest.raises(ValueError, match="cpu-activations"):
        agree.run(["smollm2"], states=path, n=10, schemes=["w4g64"], rescore=[8], cpu_activations=["fp8"],
                  log=lambda m: None)
