"""data/paper/: the paper's Tables 3-9 as transcribed, checked for shape, against cells read off the
paper by eye, and (where the paper's text is beside the checkout) re-parsed cell by cell."""
import math
import os

import pandas as pd
import pytest

from leetrepro._paths import ROOT
from leetrepro.reproduce import paper

PAPER_TXT = os.path.join(ROOT, os.pardir, "shared", "papers", "leetdecoding.txt")
#: the paper text's table lines (the lines parse_paper reads), shipped with the tests
TABLES_TXT = os.path.join(os.path.dirname(__file__), "fixtures", "leetdecoding_tables.txt")


@pytest.mark.parametrize("t", [3, 4, 5, 6])
def test_latency_tables_have_nine_methods_by_seven_lengths(t):
    df = paper.load(t)
    assert len(df) == 63 and set(df.N) == set(paper.SEQLENS)
    assert set(df.method) == {"Vanilla", "Bb", "Cdotp", "Cdotp_torch", "FA", "FA_torch", "LA",
                              "LA_torch", "Recur"}
    assert (df.batch == paper.LATENCY[t][0]).all() and (df.decay == paper.LATENCY[t][1]).all()
    assert (df.cell == "OOM").sum() == df.mean_s.isna().sum()


@pytest.mark.parametrize("t,method,n,mean,std", [
    (3, "LA", 100000, 4.31e-2, 3.2e-3), (3, "Vanilla", 128, 9.56e-5, 3.7e-7),
    (4, "Recur", 25600, 3.41e2, 1.5e2), (5, "LA_torch", 2048, 3.9e-2, 4.3e-5),
    (6, "FA_torch", 25600, 2.165e1, 1.1e-4),
])
def test_cells_as_printed(t, method, n, mean, std):
    row = paper.load(t).set_index(["method", "N"]).loc[(method, n)]
    assert row.mean_s == pytest.approx(mean) and row.std_s == pytest.approx(std)


def test_oom_cells_and_table9_and_llm_tables():
    t4 = paper.load(4).set_index(["method", "N"])
    assert t4.loc[("Recur", 100000), "cell"] == "OOM" and t4.loc[("Vanilla", 12800), "cell"] == "OOM"
    t9 = paper.load(9)
    assert len(t9) == 56 and set(t9.method) == {"FA", "FA_modify"}
    assert t9.set_index(["method", "batch", "decay", "N"]).loc[("FA_modify", 1, True, 100000), "mean_s"] \
        == pytest.approx(6.65e-1)
    assert (t9[(t9.batch == 16) & (t9.N == 100000)].cell == "OOM").all()
    t7, t8 = paper.load(7), paper.load(8)
    assert len(t7) == len(t8) == 20
    v = t7.set_index(["method", "batch"])
    assert v.loc[("Vanilla", 2), "cell"] == "OOM" and v.loc[("Cdotp", 2), "mean_s"] == 58.9
    assert t8.set_index(["method", "batch"]).loc[("Recur", 1), "mean_s"] == 895.0


def test_the_one_typo_is_recorded():
    notes = paper.load(5).note.dropna()
    assert len(notes) == 1 and "3.9 - 2" in notes.iloc[0]


def test_csvs_equal_a_fresh_parse_of_the_paper():
    """data/paper/ is what parsing the paper's table lines gives (the lines ship with the tests;
    where the whole paper is beside the checkout, its parse is the same)."""
    parsed = paper.parse_paper(open(TABLES_TXT, encoding="utf-8").read())
    if os.path.exists(PAPER_TXT):
        whole = paper.parse_paper(open(PAPER_TXT, encoding="utf-8").read())
        assert {t: pd.DataFrame(r).astype(str).values.tolist() for t, r in whole.items()} == \
            {t: pd.DataFrame(r).astype(str).values.tolist() for t, r in parsed.items()}
    for t, rows in parsed.items():
        fresh = pd.DataFrame(rows)
        saved = paper.load(t)
        assert len(fresh) == len(saved), t
        for col in ("method", "cell"):
            assert list(fresh[col].astype(str)) == list(saved[col].astype(str)), (t, col)
        for a, b in zip(fresh.mean_s, saved.mean_s):
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b), t
