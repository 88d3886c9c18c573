"""scripts/perf_report.py: the generator on a constructed bench file, and docs/performance.md against its files."""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "perf_report.py"

pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="needs the repository's scripts/")


def load_script():
    spec = importlib.util.spec_from_file_location("perf_report", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench_file(rows, commit="0123456789abcdef0123456789abcdef01234567", date="2026-01-02T03:04:05+00:00"):
    return {
        "qhead": {"version": "9.8.7", "commit": commit},
        "device": {"name": "Test GPU", "gpus": 2},
        "command": "qhead bench --device cuda --shape 1000x64 --json",
        "date": date,
        "rows": rows,
    }


def row(path, us, m=1, shape="1000x64", scheme="w4g64", **extra):
    r = {"shape": shape, "scheme": scheme, "m": m, "path": path, "us_median": us, "gbps": 1.0,
         "bw_fraction": 0.5, "speedup_vs_dense": 1.0, "note": "the note as the bench wrote it"}
    r.update(extra)
    return r


CUDA_ROWS = [
    {"shape": "", "scheme": "", "m": 0, "path": "ceiling", "us_median": 10.0, "gbps": 4000.0, "bw_fraction": 1.0,
     "speedup_vs_dense": 0.0, "note": "copy"},
    row("read_ceiling", 8.0, m=0),
    row("dense", 30.0),
    row("fallback", 60.0),
    row("fused", 10.0, read_ceiling_fraction=0.8, host_us=4.25),
    row("fused_v7", 12.5),
    row("logits_then_topk", 20.0),
    row("fused_topk", 25.0),
    row("auto_topk", 18.0),
    row("dense", 90.0, m=16),
    row("fused", 15.0, m=16, read_ceiling_fraction=0.5333),
    {"shape": "1000x64", "scheme": "w4g64", "m": 1, "path": "verdict", "line": "ignored"},
]

EXPECTED_CUDA = """\
| shape | scheme | act | M | read ceiling µs | cuBLAS dense µs | fallback µs | fused µs | fused / read ceiling | fused vs cuBLAS | fused host µs | logits + selection µs | fused top-k µs | default top-k µs | default top-k / fused | run |
|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
| 1000x64 | w4g64 | f16 | 1 | 8.0 | 30.0 | 60.0 | 10.0 | 0.80 | 3.00× | 4.2 | 20.0 | 25.0 | 18.0 | 1.80 | 1 |
| 1000x64 | w4g64 | f16 | 16 | 8.0 | 90.0 | — | 15.0 | 0.53 | 6.00× | — | — | — | — | — | 1 |

- run 1: `docs/bench/test/run.json` — qhead 9.8.7 at 0123456, 2026-01-02, Test GPU; `qhead bench --device cuda --shape 1000x64 --json`"""


def make_tree(tmp_path, files, page):
    for name, content in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(content), encoding="utf-8")
    (tmp_path / "page.md").write_text(page, encoding="utf-8")
    return tmp_path / "page.md"


def test_cuda_table_is_the_known_text(tmp_path):
    pr = load_script()
    page = make_tree(tmp_path, {"docs/bench/test/run.json": bench_file(CUDA_ROWS)},
                     "# t\n\n<!-- perf_report:begin cuda docs/bench/test/*.json -->\nstale\n"
                     "<!-- perf_report:end cuda -->\ntail\n")
    out = pr.render(page.read_text(encoding="utf-8"), str(tmp_path))
    want = ("# t\n\n<!-- perf_report:begin cuda docs/bench/test/*.json -->\n\n" + EXPECTED_CUDA +
            "\n\n<!-- perf_report:end cuda -->\ntail\n")
    assert out == want
    # The generated page is a fixed point, and --check tells a stale page from a current one.
    assert pr.render(out, str(tmp_path)) == out
    assert pr.main(["--check", "--page", str(page), "--root", str(tmp_path)]) == 1
    assert pr.main(["--page", str(page), "--root", str(tmp_path)]) == 0
    assert page.read_text(encoding="utf-8") == want
    assert pr.main(["--check", "--page", str(page), "--root", str(tmp_path)]) == 0


def test_several_runs_of_one_case_stand_together_in_date_order(tmp_path):
    pr = load_script()
    later = bench_file([row("read_ceiling", 8.0, m=0), row("fused", 11.0), row("fused_v7", 13.0)], commit="f" * 40,
                       date="2026-02-01T00:00:00+00:00")
    earlier = bench_file([row("read_ceiling", 8.0, m=0), row("fused", 10.0), row("fused_v7", 12.0),
                          row("fused", 99.0, shape="50x64")])
    page = make_tree(tmp_path, {"b/a_later.json": later, "b/z_earlier.json": earlier},
                     "<!-- perf_report:begin cuda-kernels b/*.json -->\n<!-- perf_report:end cuda-kernels -->")
    lines = pr.render(page.read_text(encoding="utf-8"), str(tmp_path)).split("\n")
    body = [l for l in lines if l.startswith("| 1000x64")]
    # The earlier file is run 1 whatever its name; the smaller table (50x64) has no kernel rows.
    assert body == ["| 1000x64 | w4g64 | f16 | 1 | 10.0 | — | 12.0 | 1 |", "| 1000x64 | w4g64 | f16 | 1 | 11.0 | — | 13.0 | 2 |"]
    assert "register-ring GEMV µs" in lines[2]
    assert not any(l.startswith("| 50x64") for l in lines)
    assert any(l.startswith("- run 2: `b/a_later.json` — qhead 9.8.7 at fffffff") for l in lines)


def test_the_selected_kernel_fills_its_own_column(tmp_path):
    # The bench does not force the kernel the plan picked: its "fused" row (kernel named) fills that column.
    pr = load_script()
    staged = dict(row("fused", 10.0), kernel="gemv_staged")
    f = bench_file([row("read_ceiling", 8.0, m=0), staged, row("fused_gemv_regring", 15.0),
                    dict(row("fused", 40.0, m=32), kernel="gemm_mma_sync"), row("fused_gemv_regring", 50.0, m=32),
                    row("fused_gemv_staged", 0.0, m=64, shape="1x1")])
    page = make_tree(tmp_path, {"b/run.json": f},
                     "<!-- perf_report:begin cuda-kernels b/*.json -->\n<!-- perf_report:end cuda-kernels -->")
    lines = pr.render(page.read_text(encoding="utf-8"), str(tmp_path)).split("\n")
    header = next(l for l in lines if l.startswith("| shape"))
    assert header.split(" | ")[5:9] == ["selected", "register-ring GEMV µs", "staged GEMV µs", "mma.sync GEMM µs"]
    body = [l for l in lines if l.startswith("| 1000x64")]
    assert body == ["| 1000x64 | w4g64 | f16 | 1 | 10.0 | gemv_staged | 15.0 | 10.0 | — | 1 |",
                    "| 1000x64 | w4g64 | f16 | 32 | 40.0 | gemm_mma_sync | 50.0 | — | 40.0 | 1 |"]


def test_a_file_without_provenance_is_refused(tmp_path):
    pr = load_script()
    bad = bench_file(CUDA_ROWS)
    del bad["command"]
    page = make_tree(tmp_path, {"b/x.json": bad}, "<!-- perf_report:begin cuda b/*.json -->\n<!-- perf_report:end cuda -->")
    with pytest.raises(pr.ReportError, match="needs 'command'"):
        pr.render(page.read_text(encoding="utf-8"), str(tmp_path))


def test_wrap_lifts_the_rows_provenance(tmp_path):
    pr = load_script()
    raw = [dict(r, version="1.2.3", commit="a" * 40, device="cuda: Test GPU", command="qhead bench --json",
                date="2026-03-04T05:06:07Z") for r in CUDA_ROWS[:5]]
    (tmp_path / "raw.json").write_text(json.dumps(raw), encoding="utf-8")
    out = tmp_path / "docs" / "bench" / "test" / "w.json"
    assert pr.main(["wrap", str(tmp_path / "raw.json"), "-o", str(out), "--fact", "driver=1.2"]) == 0
    d = json.loads(out.read_text(encoding="utf-8"))
    assert d["qhead"] == {"version": "1.2.3", "commit": "a" * 40}
    assert d["device"] == {"name": "cuda: Test GPU", "driver": "1.2"}
    assert d["command"] == "qhead bench --json" and d["date"] == "2026-03-04T05:06:07Z"
    assert d["rows"] == raw  # unchanged


def test_performance_md_is_what_its_bench_files_generate():
    r = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
