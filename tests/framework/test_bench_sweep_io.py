"""The sweep's results log and summaries (ddtree_jax/bench/sweep_io.py): a torn or damaged line is
kept and reported, never truncated; the summary table and the plot."""

import json
import sys

import pytest

from ddtree_jax.bench import sweep_io


def _rec(i, **kw):
    p = dict(pair="p", method="ddtree", budget=2 ** i, streams=1, temperature=0.0)
    return dict(p, key=sweep_io.point_key(p), tau=1.5, tokens_per_second=10.0 * i, speedup=None,
                steps=3, stage_times={"step": 1e-3, "verify": 5e-4}, **kw)


def test_stage_columns_are_the_engines_named_scopes():
    from ddtree_jax.bench import timing
    assert sweep_io.STAGES is timing.STAGES == ("draft", "tree", "verify", "accept")


def test_results_log_survives_a_torn_line(tmp_path):
    path = str(tmp_path / "r.jsonl")
    log = sweep_io.ResultsLog(path)
    log.append(_rec(1))
    log.append(_rec(2))
    with pytest.raises(ValueError):
        log.append(_rec(1))
    with open(path, "a") as f:
        f.write('{"key": "half a record')                 # killed mid-write
    before = open(path, "rb").read()
    with pytest.warns(UserWarning, match=r"r.jsonl: .*line 3: torn"):
        again = sweep_io.ResultsLog(path)
    assert open(path, "rb").read() == before               # reading never modifies the file
    assert list(again.records) == [_rec(1)["key"], _rec(2)["key"]] and again.damaged[0][0] == 3
    again.append(_rec(3))
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[2] == '{"key": "half a record' and [json.loads(lines[i])["budget"] for i in (0, 1, 3)] == [2, 4, 8]
    with pytest.warns(UserWarning, match="line 3"):
        assert list(sweep_io.ResultsLog(path).records) == [_rec(i)["key"] for i in (1, 2, 3)]


@pytest.mark.parametrize("bad", ['not json at all', '{"budget": 4}', '[1, 2]', '{"key": 7}'])
def test_a_damaged_middle_line_is_reported_and_the_records_around_it_kept(tmp_path, bad):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([json.dumps(_rec(1)), bad, json.dumps(_rec(2))]) + "\n")
    before = path.read_bytes()
    with pytest.warns(UserWarning, match=r"r.jsonl: skipped damaged line\(s\) line 2: not a record"):
        log = sweep_io.ResultsLog(str(path))
    assert list(log.records) == [_rec(1)["key"], _rec(2)["key"]] and log.damaged[0][0] == 2
    assert path.read_bytes() == before
    with pytest.warns(UserWarning, match="line 2"):
        assert len(sweep_io.read_results(str(path))) == 2


def _measured(i, **kw):
    """A record as the sweep writes it now: device, dtype, the timing range and the metrics."""
    return dict(_rec(i, device_kind="cpu", dtype="float32", matmul_precision="highest",
                     tokens_per_second_range=[9.0 * i, 11.0 * i],
                     metrics=dict(acceptance_rate_by_depth=[0.5, 0.25, None],
                                  acceptance_histogram=[0, 2, 1, 1], ttft_seconds=dict(p50=0.012),
                                  tpot_seconds=dict(p50=0.0034))), speedup=2.0 * i, **kw)


def test_summary_and_plot(tmp_path, monkeypatch, capsys):
    recs = [_rec(1), _rec(2), dict(_rec(3), method="ar", budget=None, speedup=1.0)]
    table = sweep_io.summary_table(recs)
    assert table.count("\n") == 4 and "| ar |" in table.splitlines()[2]
    assert "requests" not in table
    png = tmp_path / "p.png"
    sweep_io.plot_sweep(recs, str(png), 0.0)            # older records: the cells and panels they lack stay empty
    assert png.stat().st_size > 1000
    new = [_measured(1), _measured(2), dict(_measured(3), method="ar", budget=None, speedup=1.0)]
    row = sweep_io.summary_table(new).splitlines()[3]
    assert "| 10.0 | 9-11 | 2.00x |" in row and "| 0.50 / 0.25 /  | 12.0 | 3.4 |" in row
    fig = sweep_io.plot_sweep(new, None, 0.0)
    tau, tps, speed, hist = fig.axes
    assert fig._suptitle.get_text() == "cpu, p, float32 (matmul highest), temperature 0"
    assert all(ax.get_xlabel() and ax.get_ylabel() for ax in fig.axes)
    assert "speedup over ar" in speed.get_ylabel() and "accept length" in hist.get_xlabel()
    assert hist.get_lines() and len(tps.containers) == 1     # the timing range as error bars
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # no [plots] extra: a note, no error
    sweep_io.plot_sweep(recs, str(tmp_path / "q.png"), 0.0)
    assert "q.png not written" in capsys.readouterr().out and not (tmp_path / "q.png").exists()
    served = sweep_io.summary_table(recs[:2] + [dict(_rec(4), requests=8, request_p50_s=0.25,
                                                     request_tokens_per_second=12.5, device_steps=4)])
    lines = served.splitlines()
    assert lines[0].endswith("| requests | request p50 s | request tok/s |")
    assert lines[-1].endswith("| 3 | 4 | 8 | 0.250 | 12.5 |")
    assert lines[2].endswith("| 3 |  |  |  |  |")
    assert all(line.count("|") == lines[0].count("|") for line in lines)
