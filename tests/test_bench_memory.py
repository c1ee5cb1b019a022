"""The memory benchmark counts what a table takes on the nodes: its records, parity and window, wherever they live."""
import pytest

from bench.memory import measure


@pytest.mark.parametrize("code,k,r,nodes,optimizer,dim", [("xor", 4, 1, 5, "rowwise_adagrad", 16), ("rs", 4, 2, 6, "sgd", 8)])
def test_a_tables_memory_is_its_records_and_window_and_its_parity_is_r_over_k_of_them(code, k, r, nodes, optimizer, dim):
    m = measure(40_000, dim, optimizer, code, k, r, nodes)
    data = (m["total"] - m["parity"]) / m["rows"]
    raw = m["raw"] / m["rows"]
    # a record, its flag byte in the window, and 8 bytes a parity row for the degraded writes it holds (r/k of a row)
    assert raw + 1 + 8 * r / k <= data < raw + 1 + 8 * r / k + 2
    assert m["parity"] == pytest.approx(m["raw"] * r / k, rel=0.01)
