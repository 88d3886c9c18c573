"""qhead.generate (python -m qhead.generate, qhead generate): argument errors, the report, a real
run on SmolLM2-135M-Instruct (skipped when the model is missing) and the C++ CLI's wrapper
(skipped unless QHEAD_CLI names the built qhead program)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import requires_cuda

import qhead
from qhead import generate as qg

os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ---- argument errors: exit status 2, one line naming the flag, before anything is loaded ----

@pytest.mark.parametrize("argv, flag, words", [
    (["--model", "no-such-model"], "--model", "expected one of smollm2"),
    (["--model", "{tmp}/missing.gguf"], "--model", "is not there"),
    (["--model", "smollm2", "--head", "w4g63"], "--head", "group size must be"),
    (["--model", "smollm2", "--head", "int4"], "--head", "not a qhead scheme"),
    (["--model", "smollm2", "--embedding", "bogus"], "--embedding", "not a qhead scheme"),
    (["--model", "smollm2", "--head", "dense"], "--head", "nothing to quantize"),
    (["--model", "smollm2", "--rescore", "-1"], "--rescore", ">= 0"),
    (["--model", "smollm2", "--rescore", "eight"], "--rescore", "invalid int value"),
    (["--model", "smollm2", "--new-tokens", "0"], "--new-tokens", ">= 1"),
    (["--model", "smollm2", "--threads", "-2"], "--threads", ">= 0"),
    (["--model", "smollm2", "--device", "tpu"], "--device", "expected cpu or cuda"),
    (["--model", "smollm2", "--rescore", "8", "--dense-rows", "{tmp}/rows.safetensors"], "--dense-rows",
     "expected cpu, device or a safetensors file"),
    (["--model", "smollm2", "--quantizer", "awq"], "--quantizer", "one of rtn, mse, gptq, gptq-mse"),
    (["--model", "smollm2", "--quantizer", "gptq"], "--calibration", "needs the head's inputs"),
    (["--model", "smollm2", "--quantizer", "gptq", "--calibration", "{tmp}/none.safetensors"], "--calibration",
     "no such file"),
    (["--model", "smollm2", "--head", "dense", "--embedding", "w8", "--untie"], "--untie", "--head SCHEME"),
    (["--head", "w8"], "--model", "required"),
    (["--model", "smollm2", "--temperature", "0.7"], "--temperature", "unrecognized"),
])
def test_argument_errors(argv, flag, words, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as e:
        qg.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("qhead generate: error: "), err
    assert flag in err and words in err, err


def test_run_raises_argument_error_naming_the_parameter():
    with pytest.raises(qg.ArgumentError) as e:
        qg.run("smollm2", head="w4g64", rescore=-3)
    assert e.value.param == "rescore" and isinstance(e.value, qhead.InvalidArgumentError)
    with pytest.raises(qg.ArgumentError) as e:
        qg.run("smollm2", head=None, embedding="none")
    assert e.value.param == "head"


# ---- the report --------------------------------------------------------------------------------

def _pass(tps, share, head_ms, read, table):
    return {"tokens_per_s": tps, "step_ms": 1e3 / tps, "head_share": share, "head_step_ms": head_ms,
            "head_read_bytes": read, "head_gb_per_s": read / (head_ms * 1e-3) / 1e9, "table_bytes": table,
            "roles": {"embedding": "w4g64", "head": "w4g64"}}


def test_format_report_on_a_hand_made_result():
    mib = 2**20
    result = {
        "model": {"name": "toy", "vocab": 1000, "hidden": 64, "tied": True},
        "new_tokens": 4, "batch": 1, "device": "cpu: Toy CPU", "threads": {"torch": 1, "qhead": 1},
        "head": "w4g64", "embedding": None, "rescore": 0,
        "prompts": [
            {"id": "p0", "text": "The capital of France is", "first_diff": None,
             "dense": {"text": " Paris."}, "quantized": {"text": " Paris."}},
            {"id": "p1", "text": "Two\nlines", "first_diff": 3,
             "dense": {"text": " one two three"}, "quantized": {"text": " one two four"}},
        ],
        "identical": 1,
        "dense": _pass(20.0, 0.25, 12.5, 108 * mib, 108 * mib),
        "quantized": _pass(25.0, 0.0625, 2.5, 15 * mib, 15 * mib),
    }
    text = qg.format_report(result)
    assert "[p0] identical" in text
    assert "[p1] first differing new token: 3" in text
    assert "The capital of France is" in text and " Paris." in text
    assert "      Two\n      lines" in text  # a multi-line prompt, indented
    assert " one two four" in text and " one two three" in text
    assert "prompts identical: 1/2" in text
    for needle in ("20.00", "25.00", "25.0%", "6.2%", "12.500", "2.500", "108.0 MiB", "15.0 MiB", "5.00x faster",
                   "7.20x fewer bytes", "tied (one table for both roles)"):
        assert needle in text, (needle, text)


# ---- a tiny random model: the whole command, on the CPU and on CUDA ---------------------------

def _tiny_model_dir(path):
    """A tied 256 x 64 Llama with random weights and a word-level tokenizer, saved as a transformers
    model directory."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"] + [f"w{i}" for i in range(252)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]",
                               eos_token="[EOS]").save_pretrained(path)
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         pad_token_id=0, bos_token_id=2, eos_token_id=3)
    tf.LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_tiny_model_command(device, tmp_path, capsys, keep_threads):
    d = _tiny_model_dir(tmp_path / "tiny")
    out = tmp_path / "out.json"
    argv = ["--model", d, "--head", "w8", "--rescore", "8", "--prompt", "w1 w2 w3", "--prompt", "w7",
            "--new-tokens", "4", "--device", device, "--threads", "1", "--json", str(out)]
    assert qg.main(argv) == 0
    text = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert text.strip() == qg.format_report(r).strip()
    assert r["device"].startswith(f"{device}: ") and r["device_kind"] == device
    assert r["model"] == {**r["model"], "kind": "hf", "vocab": 256, "hidden": 64, "tied": True, "sha256": None}
    assert r["command"].endswith(" -m qhead.generate " + " ".join(
        f"'{a}'" if " " in a else a for a in argv))
    # Rescoring the top 8 from the f32 rows (and the embedding gathering them): the dense tokens.
    assert r["identical"] == 2, [(p["dense"]["ids"], p["quantized"]["ids"]) for p in r["prompts"]]
    for name in ("dense", "quantized"):
        assert 0 < r[name]["head_share"] < 1 and r[name]["head_calls"] == 2 * 4
    assert r["dense"]["table_bytes"] == 256 * 64 * 4
    assert r["quantized"]["table_bytes"] == 256 * 64 + 256 * 4 + 256 * 64 * 4
    assert r["quantized"]["roles"]["head"].startswith("w8 + rescore 8")


def test_tiny_model_gptq_untied(tmp_path, capsys, keep_threads):
    """--quantizer gptq-mse --calibration FILE --untie --embedding w8: the head GPTQ-quantized on the
    file's states, the embedding its own w8 table, both in the record."""
    import torch
    from safetensors.torch import save_file

    d = _tiny_model_dir(tmp_path / "tiny")
    calib = tmp_path / "states.safetensors"
    g = torch.Generator().manual_seed(3)
    save_file({"hidden": torch.randn(200, 64, generator=g)}, str(calib))
    out = tmp_path / "out.json"
    argv = ["--model", d, "--head", "w4g64", "--embedding", "w8", "--untie", "--quantizer", "gptq-mse",
            "--calibration", str(calib), "--prompt", "w1 w2 w3", "--new-tokens", "3", "--threads", "1",
            "--json", str(out)]
    assert qg.main(argv) == 0
    capsys.readouterr()
    r = json.loads(out.read_text())
    assert r["quantizer"] == "gptq-mse" and r["calibration"] == "states.safetensors" and r["untie"] is True
    assert r["quantized"]["roles"]["head"].startswith("w4g64") and r["quantized"]["roles"]["embedding"].startswith("w8")
    # Two packed tables: w4g64 (with its scales) and w8 (per-row scales), f32 scales.
    assert r["quantized"]["table_bytes"] == (256 * 64 // 2 + 256 * 4) + (256 * 64 + 256 * 4)


# ---- a real run ---------------------------------------------------------------------------------

PROMPTS = ["The capital of France is", "def fibonacci(n):\n"]


def test_smollm2_w8_rescore_identical(monkeypatch, keep_threads):
    from qhead import models as qm

    why = qm.unavailable(qm.resolve("smollm2"))
    if why:
        pytest.skip(f"SmolLM2-135M-Instruct: {why}")
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch
    import transformers

    import qhead.hf as qh

    transformers.logging.set_verbosity_error()
    said = []  # what token_table_bytes returned, in call order: dense, then quantized
    real = qh.token_table_bytes

    def spy(model):
        said.append(real(model))
        return said[-1]

    monkeypatch.setattr(qh, "token_table_bytes", spy)
    r = qg.run("smollm2", head="w8", rescore=8, prompts=PROMPTS, new_tokens=8, threads=1)
    print("\n" + qg.format_report(r))
    for key in ("qhead_version", "torch_version", "transformers_version", "model", "device", "threads", "command",
                "date", "prompts", "identical", "dense", "quantized", "head", "rescore", "new_tokens"):
        assert key in r, key
    assert r["qhead_version"] == qhead.__version__ and r["torch_version"] == torch.__version__
    assert len(r["model"]["sha256"]) == 64 and r["model"]["tied"] is True
    assert r["device"].startswith("cpu: ") and r["threads"] == {"torch": 1, "qhead": 1}
    assert r["date"].endswith("Z") and r["head"] == "w8" and r["rescore"] == 8
    assert r["identical"] == 2
    for p, text in zip(r["prompts"], PROMPTS):
        assert p["text"] == text and p["first_diff"] is None
        assert len(p["dense"]["ids"]) == 8 and p["dense"]["ids"] == p["quantized"]["ids"]
        assert p["dense"]["text"] == p["quantized"]["text"] and p["dense"]["text"]
    v, h = r["model"]["vocab"], r["model"]["hidden"]
    assert (v, h) == (49152, 576)
    for name in ("dense", "quantized"):
        x = r[name]
        assert 0 < x["head_share"] < 1, (name, x["head_share"])
        assert x["head_calls"] == 2 * 8 and x["new_tokens"] == 2 * 8
        assert x["tokens_per_s"] > 0 and x["head_step_ms"] > 0
    # token_table_bytes's own numbers, and what they are: the f32 table; then the int8 table
    # (one f32 scale per row) plus the f32 rows kept for rescoring.
    assert said == [r["dense"]["table_bytes"], r["quantized"]["table_bytes"]]
    assert r["dense"]["table_bytes"] == v * h * 4
    assert r["quantized"]["table_bytes"] == v * h + v * 4 + v * h * 4
    assert r["dense"]["head_read_bytes"] == v * h * 4
    assert r["quantized"]["head_read_bytes"] == v * h + v * 4 + 8 * h * 4
    json.dumps(r)  # every value is JSON


# ---- the C++ CLI's wrapper ----------------------------------------------------------------------

CLI = os.environ.get("QHEAD_CLI")
needs_cli = pytest.mark.skipif(not CLI, reason="QHEAD_CLI (the built qhead program) is not set")


def _cli(args, python=None, cwd=None, **env):
    e = dict(os.environ)
    # The child Python imports the qhead this test imports.
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(qhead.__file__)))
    e["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in [e.get("PYTHONPATH")] if p])
    e["QHEAD_PYTHON"] = python or sys.executable
    e.update(env)
    return subprocess.run([CLI, *args], env=e, capture_output=True, text=True, timeout=60, cwd=cwd)


@needs_cli
def test_cli_generate_help_is_the_python_help():
    p = _cli(["generate", "--help"])
    assert p.returncode == 0, p.stderr
    assert "usage: qhead generate" in p.stdout and "--new-tokens" in p.stdout and "--dense-rows" in p.stdout


@needs_cli
def test_cli_generate_passes_the_exit_status_back():
    p = _cli(["generate", "--model", "smollm2", "--rescore", "-1"])
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "--rescore" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    p = _cli(["generate", "--model", "smollm2", "--no-such-flag"])
    assert p.returncode == 2 and "--no-such-flag" in p.stderr, p.stderr


@needs_cli
def test_cli_lists_the_python_commands():
    p = _cli(["--help"])
    assert p.returncode == 0
    lines = p.stdout.splitlines()
    for name in ("generate", "agree"):
        assert any(line.strip().startswith(name + " ") for line in lines), p.stdout


@needs_cli
def test_cli_without_qhead_in_the_python(tmp_path):
    # A Python that cannot import qhead: this one without its site-packages (-S).
    py = tmp_path / "python-without-site"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    py.chmod(0o755)
    p = _cli(["generate", "--help"], python=str(py), cwd=str(tmp_path), PYTHONPATH="")
    assert p.returncode == 1
    assert "No module named 'qhead'" in p.stderr, p.stderr
    assert "qhead generate runs the Python package: install it (pip install .) into the Python named by " \
           "QHEAD_PYTHON" in p.stderr
    p = _cli(["generate", "--help"], python=str(tmp_path / "no-such-python"))
    assert p.returncode == 1
    assert "cannot run" in p.stderr and "No such file or directory" in p.stderr, p.stderr
