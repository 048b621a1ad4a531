"""Text tables of string and integer cells are laid out without tabulate, character for
character as tabulate's ``simple`` format lays them out; anything else still goes to
tabulate."""

from __future__ import annotations

import tabulate as tabulate_module
from hypothesis import given, settings
from hypothesis import strategies as st
from tabulate import tabulate

from cpkv.runs.report import table

WORDS = ["True", "False", "None", "inf", "nan", "1e5", "-", "1,000", " 12 ", "", "a b", "3.14"]
cells = st.one_of(
    st.sampled_from(WORDS), st.text(alphabet="ab c-=.,:/_1 ", max_size=12),
    st.integers(-(10**12), 10**12),
)  # fmt: skip
headers = st.text(alphabet="ab c_", min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(st.lists(headers, min_size=1, max_size=5).flatmap(
    lambda cols: st.tuples(st.just(cols), st.lists(
        st.lists(cells, min_size=len(cols), max_size=len(cols)), max_size=6))
))  # fmt: skip
def test_string_tables_are_tabulates(table_and_rows) -> None:
    columns, body = table_and_rows
    rows = [dict(zip(columns, cells, strict=False)) for cells in body]
    expected_body = [[row.get(c) for c in columns] for row in rows]
    expected = tabulate(expected_body, headers=columns, tablefmt="simple", disable_numparse=True)
    assert table(rows, columns) == expected


def test_other_tables_go_to_tabulate(monkeypatch) -> None:
    calls = []
    real = tabulate_module.tabulate

    def spy(*args, **kwargs):
        calls.append(kwargs["tablefmt"])
        return real(*args, **kwargs)

    monkeypatch.setattr(tabulate_module, "tabulate", spy)
    table([{"a": "x"}], ["a"])
    table([{"a": 1.5}], ["a"])  # cell() writes a float as text
    table([{"a": 3}, {"a": -12}], ["a"])  # integers: their text, as tabulate lays them out
    assert calls == []  # string and integer cells: laid out here
    table([{"a": object()}], ["a"])  # anything else is tabulate's
    table([{"a": "é"}], ["a"])  # not ASCII: widths are tabulate's business
    table([{"a": "x\ny"}], ["a"])  # several lines
    table([{"a": "x"}], ["a"], "markdown")
    assert calls == ["simple", "simple", "simple", "github"]
