"""The plots of a run: both panels start at round 0 and the image lands at the path given."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from gossip.plot import plot_runs  # noqa: E402


def _records(rounds: int, bits_per_round: float) -> list[dict]:
    return [{"type": "round", "round": t, "bits_per_node": t * bits_per_round,
             "consensus_error": 2.0 ** -t} for t in range(rounds + 1)]


def _drawn(monkeypatch, runs, path) -> list[list[tuple[float, float]]]:
    """The (x, y) points of the first curve of each panel, captured as the figure is saved."""
    seen: list[list[tuple[float, float]]] = []
    save = Figure.savefig

    def capture(fig, *args, **kwargs):
        seen.extend([list(zip(*ax.get_lines()[0].get_data())) for ax in fig.axes if ax.get_lines()])
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", capture)
    plot_runs(runs, path)
    return seen


def test_the_bits_panel_starts_at_round_0(tmp_path, monkeypatch):
    rounds, bits = _drawn(monkeypatch, {"run": _records(100, 64.0)}, tmp_path / "p.png")
    assert rounds[0] == (0, 1.0) and bits[0] == (0.0, 1.0)  # round 0: no bits sent yet
    assert len(bits) == len(rounds) == 101


def test_a_path_without_suffix_is_written_as_png_at_that_path(tmp_path):
    out = plot_runs({"run": _records(3, 8.0)}, tmp_path / "plot")
    assert out == tmp_path / "plot" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plot"]


def _bits_axis(monkeypatch, runs, path, x_keys=("round", "bits_per_node")):
    """(x scale, x limits, first drawn point) of the bits panel, read as the figure is saved."""
    seen = []
    save = Figure.savefig

    def capture(fig, *args, **kwargs):
        ax = fig.axes[1]
        seen.append((ax.get_xscale(), ax.get_xlim(), tuple(ax.get_lines()[0].get_xydata()[0])))
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", capture)
    plot_runs(runs, path, x_keys=x_keys)
    return seen[0]


def test_round_0_lies_inside_the_bits_panel(tmp_path, monkeypatch):
    """Round 0 (0 bits) is inside the drawn x range, on a symlog axis over several decades and
    on a linear one within a decade (a log axis would clip it)."""
    for rounds, scale in ((1000, "symlog"), (5, "linear")):
        got, (left, right), first = _bits_axis(monkeypatch, {"run": _records(rounds, 64.0)},
                                               tmp_path / f"b{rounds}.png")
        monkeypatch.undo()
        assert got == scale and first == (0.0, 1.0)
        assert left <= 0.0 < right, (scale, left, right)


def test_any_bits_key_gets_the_same_axis(tmp_path, monkeypatch):
    """federated_digits.py's bits_exchanged panel: symlog from 0, as bits_per_node."""
    recs = [r | {"bits_exchanged": 2 * r["bits_per_node"]} for r in _records(1000, 64.0)]
    scale, (left, _), first = _bits_axis(monkeypatch, {"run": recs}, tmp_path / "x.png",
                                         x_keys=("round", "bits_exchanged"))
    assert scale == "symlog" and left <= 0.0 and first == (0.0, 1.0)


def test_a_free_run_gets_a_wall_time_panel(tmp_path, monkeypatch):
    """A free run's round records (the snapshots at wall instants) are drawn against wall_s;
    its node records are not drawn."""
    recs = [r | {"wall_s": 0.01 * r["round"]} for r in _records(10, 8.0)]
    recs.insert(1, {"type": "node", "node": 0, "round": 1, "wall_s": 0.0101})
    panels = _drawn(monkeypatch, {"run": recs}, tmp_path / "p.png")
    assert len(panels) == 3
    assert panels[2][:2] == [(0.0, 1.0), (0.01, 0.5)] and len(panels[2]) == 11
